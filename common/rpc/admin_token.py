"""Tokens: the credentials of a service's admin ops and of its job's member ops when CURVE is off.

Why: without CURVE any local process (or a web page's POST, or any peer of a port opened beyond
loopback with --insecure) could otherwise stop a broker, re-initialise a ps, push NaN gradients,
steal a queue's elements or write files where a ps may write. Two tokens, one per guarded role of
common/wire/protocol.py: the admin token (shutdown, init, restore, reset, add/remove_member) and the
job token (the member ops: push, pull, assign, save, preload, worker_done, enqueue, dequeue, close...).
As Jupyter does, a service takes each from its environment variable (ZMQFLOW_ADMIN_TOKEN,
ZMQFLOW_JOB_TOKEN) or a file (ZMQFLOW_ADMIN_TOKEN_FILE / --admin-token-file, ZMQFLOW_JOB_TOKEN_FILE /
--job-token-file); with neither it makes a random one and writes it, readable only by its user (0600),
to the runtime directory (ZMQFLOW_RUNTIME_DIR, else $XDG_RUNTIME_DIR/zmqflow, else ~/.zmqflow/runtime)
in a file named after its host and port, where clients of the same user on this machine find it: a
client dialling another host never reads a local service's file, so never sends its token there.
Launchers of a whole job make one of each per job and hand them to every child in the environment
(`for_job`, `remember`). A client sends an op's token (in the request header field `token`) with that
op only; a token is never logged. With CURVE the handshake is the credential (a client key and the
roles it was granted: common/rpc/encryption.py), so a CURVE service asks for no token.
"""

import dataclasses
import hmac
import ipaddress
import logging
import os
import re
import secrets

from zmqflow.common.errors import InvalidArgumentError, PermissionDeniedError, UnauthenticatedError
from zmqflow.common.wire.protocol import ADMIN, MEMBER


@dataclasses.dataclass(frozen=True)
class Kind:
    """One token: the role of the ops it grants, its name, where it is read from."""
    role: str
    name: str
    env: str
    file_env: str
    option: str


ADMIN_TOKEN = Kind(ADMIN, "admin", "ZMQFLOW_ADMIN_TOKEN", "ZMQFLOW_ADMIN_TOKEN_FILE", "--admin-token-file")
JOB_TOKEN = Kind(MEMBER, "job", "ZMQFLOW_JOB_TOKEN", "ZMQFLOW_JOB_TOKEN_FILE", "--job-token-file")
FOR_ROLE = {ADMIN: ADMIN_TOKEN, MEMBER: JOB_TOKEN}
"""The token each guarded role's ops need (client ops need none)."""
ENV, FILE_ENV = ADMIN_TOKEN.env, ADMIN_TOKEN.file_env
RUNTIME_ENV = "ZMQFLOW_RUNTIME_DIR"
HEADER = "token"
"""The request header field that carries the token (common/wire/frames.py)."""

log = logging.getLogger(__name__)
_known = {}  # (kind name, endpoint key) -> token of a service this process started with a job's token


def new_token():
    return secrets.token_urlsafe(32)


def runtime_dir():
    """Where services write the tokens they made: per user, never shared."""
    if os.environ.get(RUNTIME_ENV):
        return os.environ[RUNTIME_ENV]
    if os.environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(os.environ["XDG_RUNTIME_DIR"], "zmqflow")
    return os.path.join(os.path.expanduser("~"), ".zmqflow", "runtime")


_THIS_MACHINE = ("localhost", "*", "")


def endpoint_key(address):
    """'tcp-localhost-5555' for tcp://127.0.0.1:5555, tcp://0.0.0.0:5555 or tcp://localhost:5555 (a service
    on this machine, whichever local address dials it), 'tcp-10.0.0.7-5555' for another host: the host is
    part of the key, so a client dialling another machine never takes a local service's token there."""
    scheme, _, rest = address.partition("://")
    host, _, port = rest.rpartition(":")
    if scheme == "tcp" and port.isdigit():
        host = host.strip("[]").lower()
        try:
            local = host in _THIS_MACHINE or ipaddress.ip_address(host).is_loopback \
                or ipaddress.ip_address(host).is_unspecified
        except ValueError:
            local = False
        host = "localhost" if local else re.sub(r"[^A-Za-z0-9_.-]", "_", host)[:100]
        return f"tcp-{host}-{port}"
    return f"{scheme or 'addr'}-" + re.sub(r"[^A-Za-z0-9_.-]", "_", rest).strip("_")[:120]


def token_file(address, kind=ADMIN_TOKEN):
    """The runtime file a service at `address` writes its generated `kind` token to."""
    return os.path.join(runtime_dir(), f"{kind.name}-token-{endpoint_key(address)}")


def read_token_file(path, kind=ADMIN_TOKEN):
    """The token in `path` (surrounding whitespace dropped); InvalidArgumentError naming the file otherwise."""
    try:
        with open(path) as f:
            token = f.read().strip()
    except OSError as exc:
        raise InvalidArgumentError(f"{kind.name} token file {path}: {exc.strerror}") from None
    if not token:
        raise InvalidArgumentError(f"{kind.name} token file {path} is empty")
    return token


def from_environment(kind=ADMIN_TOKEN):
    """The `kind` token of the environment (its variable, else the file its _FILE variable names), else None."""
    if os.environ.get(kind.env):
        return os.environ[kind.env]
    if os.environ.get(kind.file_env):
        return read_token_file(os.environ[kind.file_env], kind)
    return None


def write_private(path, token):
    """Write `token` to `path` so that only this user can read it (directory 0700, file 0600)."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


# ------------------------------------------------ services


def for_service(endpoint, ops=("shutdown", "init", "restore", "reset"), kind=ADMIN_TOKEN):
    """(token, file written or None) of a service bound at `endpoint`: from the environment, else a new
    one written to the runtime directory (remove it with `forget_file` when the service stops)."""
    token = from_environment(kind)
    if token:
        return token, None
    token = new_token()
    path = write_private(token_file(endpoint, kind), token)
    log.info("%s token for this service's %s written to %s (readable by this user only); set %s to choose it",
             kind.name, "/".join(ops), path, kind.env)
    return token, path


def forget_file(path, token, kind=ADMIN_TOKEN):
    """Remove a service's token file, unless another service on the same port has replaced it since."""
    try:
        if read_token_file(path, kind) == token:
            os.unlink(path)
    except (InvalidArgumentError, OSError):
        pass


def check(expected, presented, op, service, endpoint, kind=ADMIN_TOKEN):
    """Raise unless `presented` is `expected`: none is UNAUTHENTICATED, a wrong one PERMISSION_DENIED.
    The messages name the op and where the token comes from, never a token."""
    if presented is None or presented == "":
        raise UnauthenticatedError(
            f"{op} on the {service} at {endpoint} is {'an' if kind.role == ADMIN else 'a'} {kind.role} op: "
            f"it needs the {kind.name} token (set "
            f"{kind.env}, or {kind.file_env} / {kind.option}; a service that made its own wrote it to "
            f"{token_file(endpoint, kind)}) or a CURVE client key granted the {kind.role} role")
    if not isinstance(presented, str) or not hmac.compare_digest(presented.encode(), expected.encode()):
        raise PermissionDeniedError(f"{op} on the {service} at {endpoint}: wrong {kind.name} token")


def without_token(header):
    """`header` as it may be logged: its token replaced (a handler's failure logs the request)."""
    if isinstance(header, dict) and HEADER in header:
        return {**header, HEADER: "<redacted>"}
    return header


# ------------------------------------------------ clients and launchers


def for_client(address, kind=ADMIN_TOKEN):
    """The `kind` token a client sends to `address`: the environment's, else the one a launcher in this
    process started the service with, else the file a service on this machine wrote for that host and
    port, else None."""
    token = from_environment(kind)
    if token:
        return token
    key = endpoint_key(address)
    if (kind.name, key) in _known:
        return _known[kind.name, key]
    path = token_file(address, kind)
    return read_token_file(path, kind) if os.path.exists(path) else None


def for_job(kind=ADMIN_TOKEN):
    """One token for every process of a job: the environment's when set (so the user's own clients
    keep working), else a new one."""
    return from_environment(kind) or new_token()


def remember(address, token, kind=ADMIN_TOKEN):
    """A launcher started the service at `address` with `token`: this process's clients use it."""
    _known[kind.name, endpoint_key(address)] = token


def forget(address, token, kind=ADMIN_TOKEN):
    """The service at `address` that a launcher started with `token` has stopped: its port may be reused."""
    if _known.get((kind.name, endpoint_key(address))) == token:
        del _known[kind.name, endpoint_key(address)]


def child_env(token, env=None, job_token=None):
    """The environment of a job's child: `env` (default: this process's) with the job's tokens."""
    extra = {ENV: token, **({JOB_TOKEN.env: job_token} if job_token else {})}
    return {**(os.environ if env is None else env), **extra}
