"""Admin tokens: the credential for a service's administrative ops (shutdown, init, restore, reset) without CURVE.

Why: without CURVE any local process could otherwise stop a broker or re-initialise a ps. As
Jupyter does, a service takes its token from ZMQFLOW_ADMIN_TOKEN or a file (ZMQFLOW_ADMIN_TOKEN_FILE,
`--admin-token-file`); with neither it makes a random one and writes it, readable only by its user
(0600), to the runtime directory (ZMQFLOW_RUNTIME_DIR, else $XDG_RUNTIME_DIR/zmqflow, else
~/.zmqflow/runtime) in a file named after its port, where clients of the same user on this
machine find it. Launchers of a whole job make one token per job and hand it to every child in
the environment (`for_job`, `remember`). A client sends the token in the request header of admin
ops only. With CURVE the handshake is the credential (only authorized client keys get through),
so a CURVE service asks for no token.
"""

import hmac
import logging
import os
import re
import secrets

from zmqflow.common.errors import InvalidArgumentError, PermissionDeniedError, UnauthenticatedError

ENV = "ZMQFLOW_ADMIN_TOKEN"
FILE_ENV = "ZMQFLOW_ADMIN_TOKEN_FILE"
RUNTIME_ENV = "ZMQFLOW_RUNTIME_DIR"
HEADER = "token"
"""The request header field that carries the token (common/wire/frames.py)."""

log = logging.getLogger(__name__)
_known = {}  # endpoint key -> token of a service this process started with a job's token


def new_token():
    return secrets.token_urlsafe(32)


def runtime_dir():
    """Where services write the tokens they made: per user, never shared."""
    if os.environ.get(RUNTIME_ENV):
        return os.environ[RUNTIME_ENV]
    if os.environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(os.environ["XDG_RUNTIME_DIR"], "zmqflow")
    return os.path.join(os.path.expanduser("~"), ".zmqflow", "runtime")


def endpoint_key(address):
    """'tcp-5555' for tcp://127.0.0.1:5555, tcp://0.0.0.0:5555 or tcp://localhost:5555: a port names
    one service on this machine, whichever address a client dials it by."""
    scheme, _, rest = address.partition("://")
    if scheme == "tcp" and rest.rsplit(":", 1)[-1].isdigit():
        return f"tcp-{rest.rsplit(':', 1)[-1]}"
    return f"{scheme or 'addr'}-" + re.sub(r"[^A-Za-z0-9_.-]", "_", rest).strip("_")[:120]


def token_file(address):
    """The runtime file a service at `address` writes its generated token to."""
    return os.path.join(runtime_dir(), f"admin-token-{endpoint_key(address)}")


def read_token_file(path):
    """The token in `path` (surrounding whitespace dropped); InvalidArgumentError naming the file otherwise."""
    try:
        with open(path) as f:
            token = f.read().strip()
    except OSError as exc:
        raise InvalidArgumentError(f"admin token file {path}: {exc.strerror}") from None
    if not token:
        raise InvalidArgumentError(f"admin token file {path} is empty")
    return token


def from_environment():
    """ZMQFLOW_ADMIN_TOKEN, else the file ZMQFLOW_ADMIN_TOKEN_FILE names, else None."""
    if os.environ.get(ENV):
        return os.environ[ENV]
    if os.environ.get(FILE_ENV):
        return read_token_file(os.environ[FILE_ENV])
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


def for_service(endpoint, ops=("shutdown", "init", "restore", "reset")):
    """(token, file written or None) of a service bound at `endpoint`: from the environment, else a new
    one written to the runtime directory (remove it with `forget_file` when the service stops)."""
    token = from_environment()
    if token:
        return token, None
    token = new_token()
    path = write_private(token_file(endpoint), token)
    log.info("admin token for this service's %s written to %s (readable by this user only); set %s to choose it",
             "/".join(ops), path, ENV)
    return token, path


def forget_file(path, token):
    """Remove a service's token file, unless another service on the same port has replaced it since."""
    try:
        if read_token_file(path) == token:
            os.unlink(path)
    except (InvalidArgumentError, OSError):
        pass


def check(expected, presented, op, service, endpoint):
    """Raise unless `presented` is `expected`: none is UNAUTHENTICATED, a wrong one PERMISSION_DENIED."""
    if presented is None or presented == "":
        raise UnauthenticatedError(
            f"{op} on the {service} at {endpoint} is an admin op: it needs the admin token (set {ENV}, or "
            f"{FILE_ENV} / --admin-token-file; a service that made its own wrote it to {token_file(endpoint)}) "
            f"or a CURVE client key")
    if not isinstance(presented, str) or not hmac.compare_digest(presented.encode(), expected.encode()):
        raise PermissionDeniedError(f"{op} on the {service} at {endpoint}: wrong admin token")


# ------------------------------------------------ clients and launchers


def for_client(address):
    """The token a client sends with admin ops to `address`: the environment's, else the one a launcher in
    this process started the service with, else the file the service wrote on this machine, else None."""
    token = from_environment()
    if token:
        return token
    key = endpoint_key(address)
    if key in _known:
        return _known[key]
    path = token_file(address)
    return read_token_file(path) if os.path.exists(path) else None


def for_job():
    """One token for every process of a job: the environment's when set (so the user's own clients
    keep working), else a new one."""
    return from_environment() or new_token()


def remember(address, token):
    """A launcher started the service at `address` with `token`: this process's clients use it."""
    _known[endpoint_key(address)] = token


def forget(address, token):
    """The service at `address` that a launcher started with `token` has stopped: its port may be reused."""
    if _known.get(endpoint_key(address)) == token:
        del _known[endpoint_key(address)]


def child_env(token, env=None):
    """The environment of a job's child: `env` (default: this process's) with the job's token."""
    return {**(os.environ if env is None else env), ENV: token}
