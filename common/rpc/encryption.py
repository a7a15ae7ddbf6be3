"""ZeroMQ CURVE for every service and client: keys, socket setup, the authenticator (ZAP).

One directory (made by `zmqflow keys generate DIR`) holds everything:
server.key / server.key_secret (the pair every service uses), one pair per client key
(client.key / client.key_secret by default; a client takes the pair ZMQFLOW_CURVE_KEY names),
and authorized/ (the public keys of the clients a service accepts; delete one there to revoke it).
Each client key is granted roles (common/wire/protocol.py's client, member, admin), recorded in its
certificate's metadata (`roles = "member+client"`): the deployments make one key per role
(`member` for a job's ps, workers and readers, `admin` for the chief and the operator, `serving` for
the gateway and load tests), so a gateway's key cannot do what the chief's does. The authenticator
names an accepted client `NAME:ROLES` in ZAP's User-Id, which libzmq puts on every message of the
connection; `Service._authorize` reads it (`roles_of`).

Every server socket also gets a ZAP domain (`guard_server`), with or without CURVE: libzmq then refuses
pre-ZMTP-3 peers (an HTTP POST from a web page or curl reads as ZMTP 1.0) before any frame reaches
Python; `RefusedPeers` logs the first such peer once and counts them.

With a key directory, a service encrypts (curve_server) and a ZAP
authenticator refuses any client whose key is not in authorized/; a client
checks the service's public key, so it cannot talk to an impostor. Clients
take the directory from ZMQFLOW_CURVE_DIR by default, so child processes
(workers, readers) inherit it from the service command that set it.
A refused client gets no answer at all (ZeroMQ drops the handshake): its
heartbeats make that an UnavailableError, bounded.
"""

import functools
import ipaddress
import logging
import os

import re

import zmq
from zmq.utils import z85

from zmqflow.common.errors import InvalidArgumentError, PermissionDeniedError
from zmqflow.common.wire.protocol import ADMIN, CLIENT as CLIENT_ROLE, MEMBER, ROLES

ENV = "ZMQFLOW_CURVE_DIR"
KEY_ENV = "ZMQFLOW_CURVE_KEY"
"""The client pair (its name in the key directory) this process's clients use; default `client`."""
INSECURE_ENV = "ZMQFLOW_INSECURE"
"""Set (by --insecure) to let a service listen beyond loopback without CURVE."""
SERVER, CLIENT, AUTHORIZED = "server", "client", "authorized"
ZAP_DOMAIN = "zmqflow"
"""The ZAP domain of every service socket (ZMTP 1.0/2.0 peers are refused where one is set)."""
STAGE_DOMAIN = "zmqflow-stage"
"""The ZAP domain of a pipeline stage's link: only a member's key (CURVE) or the job token (PLAIN)."""
DEFAULT_ROLES = {CLIENT: ROLES, "admin": ROLES, "member": (MEMBER, CLIENT_ROLE), "serving": (CLIENT_ROLE,)}
"""The roles of a client key by its name when `generate` is not told (NAME:ROLE+ROLE): `client` (the one
key of a single-user setup) and any other name may do everything, as every key could before roles."""

log = logging.getLogger(__name__)
_authenticators = {}  # id(context) -> ThreadAuthenticator: one ZAP handler per context


def curve_dir_from_env():
    return os.environ.get(ENV) or None


# ------------------------------------------------ keys on disk


def client_roles(spec):
    """(name, roles) of a client key spec: 'NAME' (its DEFAULT_ROLES, else every role) or 'NAME:ROLE+ROLE'."""
    name, _, roles = spec.partition(":")
    roles = tuple(r for r in roles.split("+") if r) if roles else DEFAULT_ROLES.get(name, ROLES)
    if not name or os.sep in name or name in (SERVER, AUTHORIZED) or name.startswith("."):
        raise InvalidArgumentError(f"bad client name {name!r}: a plain file name other than "
                                   f"{SERVER!r} and {AUTHORIZED!r}")
    if not roles or set(roles) - set(ROLES):
        raise InvalidArgumentError(f"client key {spec!r}: roles must be some of {'+'.join(ROLES)}")
    return name, roles


def generate(directory, clients=(CLIENT,), force=False, keep=False):
    """Make the server pair, one pair per client ('NAME' or 'NAME:ROLE+ROLE', `client_roles`), and authorize
    every client with its roles recorded; returns the names. `keep`: keep the pairs that exist, add the others."""
    specs = dict(client_roles(spec) for spec in [CLIENT, *clients])  # the default client pair always exists
    exists = os.path.exists(os.path.join(directory, f"{SERVER}.key"))
    if exists and not (force or keep):
        raise InvalidArgumentError(f"{directory} already holds keys; pass --force to replace them")
    authorized = os.path.join(directory, AUTHORIZED)
    os.makedirs(authorized, exist_ok=True)
    for name, roles in [(SERVER, None), *specs.items()]:
        if keep and not force and os.path.exists(os.path.join(directory, f"{name}.key_secret")):
            continue
        public, secret = _zmq_auth().create_certificates(directory, name)
        os.chmod(secret, 0o600)
        if roles is not None:   # the roles go in the certificate's metadata, where ZAP reads them
            with open(public) as f:
                text = f.read().replace("metadata\n", f'metadata\n    roles = "{"+".join(roles)}"\n', 1)
            for path in (public, os.path.join(authorized, f"{name}.key")):
                with open(path, "w") as f:
                    f.write(text)
    return list(specs)


def recorded_roles(path):
    """The roles a client certificate records (its `roles` metadata), or every role for one made before
    keys had roles (they could do everything then)."""
    with open(path) as f:
        found = re.search(r'^\s+roles\s*=\s*"([^"]*)"', f.read(), re.M)
    return tuple(r for r in found.group(1).split("+") if r in ROLES) if found else ROLES


def _load(path, secret):
    if not os.path.isfile(path):
        raise InvalidArgumentError(f"CURVE key file {path} is missing (make keys with `zmqflow keys generate DIR`)")
    try:
        public, secret_key = _zmq_auth().load_certificate(path)
    except Exception as exc:  # a damaged or foreign file: say which
        raise InvalidArgumentError(f"CURVE key file {path} is not a ZeroMQ certificate: {exc}") from None
    if secret and not secret_key:
        raise InvalidArgumentError(f"CURVE key file {path} holds no secret key")
    return public, secret_key


class ServerKeys:
    """The service's pair and the directory of allowed client keys."""

    def __init__(self, directory):
        self.directory = directory
        self.public, self.secret = _load(os.path.join(directory, f"{SERVER}.key_secret"), True)
        self.authorized = os.path.join(directory, AUTHORIZED)
        if not os.path.isdir(self.authorized):
            raise InvalidArgumentError(f"{self.authorized} is missing: no client could ever be accepted")


class ClientKeys:
    """A client's own pair (`name`, default: ZMQFLOW_CURVE_KEY, else `client`) and the service key it expects."""

    def __init__(self, directory, name=None):
        self.directory = directory
        name = name or os.environ.get(KEY_ENV) or CLIENT
        self.public, self.secret = _load(os.path.join(directory, f"{name}.key_secret"), True)
        self.server_public, _ = _load(os.path.join(directory, f"{SERVER}.key"), False)


def check_dir(directory):
    """Raise InvalidArgumentError unless `directory` holds a usable server and client setup."""
    ServerKeys(directory)
    ClientKeys(directory)


# ------------------------------------------------ sockets


def secure_server(socket, bind, keys, domain=ZAP_DOMAIN):
    """Make `socket` (not yet bound) a CURVE server that only accepts authorized clients, in ZAP `domain`
    either way (pre-ZMTP-3 peers refused). Without keys, a bind beyond loopback is refused (PermissionDenied)
    unless ZMQFLOW_INSECURE (--insecure) is set, then warned about, as Redis's protected mode does."""
    socket.zap_domain = domain.encode()
    if keys is None:
        warning = exposure_warning(bind)
        if warning and not os.environ.get(INSECURE_ENV):
            raise PermissionDeniedError(f"refusing to listen on {bind} without CURVE (protected mode): {warning}; "
                                        f"or pass --insecure (set {INSECURE_ENV}=1) to accept anyone who reaches it")
        if warning:
            log.warning(warning)
        return
    _authenticator(socket.context).authorize(keys.authorized, domain, MEMBER if domain == STAGE_DOMAIN else None)
    socket.curve_secretkey = keys.secret
    socket.curve_publickey = keys.public
    socket.curve_server = True


def secure_client(socket, keys):
    """Make `socket` (not yet connected) a CURVE client that only talks to the keys' service."""
    if keys is not None:
        socket.curve_secretkey = keys.secret
        socket.curve_publickey = keys.public
        socket.curve_serverkey = keys.server_public


def _zmq_auth():
    """pyzmq's zmq.auth, imported when keys are made or read: it and its ZAP thread (asyncio) cost a service
    ~0.1 s of start-up without CURVE (bench startup)."""
    import zmq.auth
    return zmq.auth


@functools.lru_cache(maxsize=None)
def _role_authenticator_class():
    """_RoleAuthenticator, defined on first use (its base class is pyzmq's ThreadAuthenticator: see _zmq_auth)."""
    from zmq.auth.thread import ThreadAuthenticator

    class _RoleAuthenticator(ThreadAuthenticator):
        """ZAP with roles: a CURVE client is accepted when authorized/ holds its key (and, in a domain that
        requires one, the key has that role); its User-Id is `NAME:ROLE+ROLE`."""

        def __init__(self, context):
            super().__init__(context, log=_DenialLog())
            self.users = {}      # z85 public key -> 'NAME:ROLE+ROLE'
            self.required = {}   # domain -> the role its clients' keys need (None: any authorized key)

        def authorize(self, authorized, domain, role=None):
            for path in sorted(os.listdir(authorized)):
                if path.endswith(".key"):
                    public, _ = _zmq_auth().load_certificate(os.path.join(authorized, path))
                    roles = recorded_roles(os.path.join(authorized, path))
                    self.users[public] = f"{path[:-len('.key')]}:{'+'.join(roles)}"
            self.required[domain] = role
            self.configure_curve_callback(domain, self)

        def callback(self, domain, key):
            user = self.users.get(key)
            return user is not None and (self.required.get(domain) is None or
                                         self.required[domain] in roles_of(user))

        def curve_user_id(self, client_public_key):
            return self.users.get(z85.encode(client_public_key), "anonymous")

    return _RoleAuthenticator


def _authenticator(context):
    """The context's ZAP handler (one per context: libzmq asks inproc://zeromq.zap.01 of the context)."""
    auth = _authenticators.get(id(context))
    if auth is None or auth.context is not context:  # an id reused by a new context
        auth = _role_authenticator_class()(context)
        auth.start()
        _authenticators[id(context)] = auth
    return auth


_roles_of_user = {}


def roles_of(user_id):
    """The roles in a User-Id `NAME:ROLE+ROLE` (none for any other)."""
    roles = _roles_of_user.get(user_id)
    if roles is None:
        roles = _roles_of_user[user_id] = frozenset(user_id.partition(":")[2].split("+")) & set(ROLES)
    return roles


def check_role(user_id, role, op, service, endpoint):
    """Raise PermissionDenied unless the CURVE client named `user_id` (ZAP's User-Id) was granted `role`."""
    if role not in roles_of(user_id or ""):
        name = (user_id or "anonymous").partition(":")[0]
        raise PermissionDeniedError(f"{op} on the {service} at {endpoint} is {'an' if role == ADMIN else 'a'} "
                                    f"{role} op: the CURVE client key {name!r} is not granted the {role} role")


def guard_stage_link(socket, bind, keys, job_token):
    """A pipeline stage's bound link (not yet bound): only the stage before it may connect, by a member's
    CURVE key, or without CURVE by the job token (ZAP PLAIN), so no stranger takes the PAIR's one peer."""
    if keys is not None:
        return secure_server(socket, bind, keys, STAGE_DOMAIN)
    if not job_token:
        raise PermissionDeniedError("a pipeline stage link needs CURVE keys (--curve-dir) or the job token "
                                    "(ZMQFLOW_JOB_TOKEN) to know the stage before it")
    secure_server(socket, bind, None, STAGE_DOMAIN)
    _authenticator(socket.context).configure_plain(STAGE_DOMAIN, {"stage": job_token})
    socket.plain_server = True


def stage_client(socket, keys, job_token):
    """The connecting side of a stage link: a CURVE client with `keys`, else PLAIN with the job token."""
    if keys is not None:
        secure_client(socket, keys)
    elif job_token:
        socket.plain_username, socket.plain_password = b"stage", job_token.encode()


def stop_authenticator(context):
    """Stop the context's authenticator: context.term() would wait for its thread for ever."""
    auth = _authenticators.pop(id(context), None)
    if auth is not None and auth.context is context:
        auth.stop()


class _DenialLog(logging.LoggerAdapter):
    """The authenticator's log: a refused client key is a warning, once per key (it retries every 0.1 s)."""

    def __init__(self):
        super().__init__(logging.getLogger("zmqflow.curve"), {})
        self._denied = set()

    def debug(self, msg, *args, **kwargs):
        if (args and args[0] == "DENIED") or (isinstance(msg, str) and msg.startswith("DENIED")):
            key = args[-1] if args else msg
            if key not in self._denied:
                self._denied.add(key)
                self.logger.warning("refused a client: its CURVE key %s is not in authorized/",
                                    key.decode() if isinstance(key, bytes) else key)
            return
        self.logger.debug(msg, *args, **kwargs)


class RefusedPeers:
    """The peers libzmq refused before their handshake (an HTTP request is a ZMTP 1.0 peer, refused where a
    ZAP domain is set): counted in `stats["refused_peers"]`, the first one logged, never once per message.
    Fed a service socket's monitor events (`EVENTS`): a connection that closes with no handshake completed
    since it was accepted is taken as refused (while others handshake meanwhile, one may go uncounted)."""

    EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED

    def __init__(self, where, stats):
        self.where, self.stats = where, stats
        stats["refused_peers"] = 0
        self._handshakes = 0
        self._accepted = {}   # fd -> the handshakes counted when it was accepted

    def seen(self, event):
        kind = event["event"]
        if kind == zmq.EVENT_ACCEPTED:
            self._accepted[event["value"]] = self._handshakes
        elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._handshakes += 1
        elif kind == zmq.EVENT_DISCONNECTED and self._accepted.pop(event["value"], None) == self._handshakes:
            self.stats["refused_peers"] += 1
            if self.stats["refused_peers"] == 1:
                log.warning("%s refused a peer that is not a ZMTP 3 client (an HTTP request, a port scan?); "
                            "further ones are only counted (info: stats.refused_peers)", self.where)


# ------------------------------------------------ exposure


def is_loopback(bind):
    """True when a tcp:// bind address only listens on loopback (ipc:// and inproc:// are local too)."""
    if not bind.startswith("tcp://"):
        return True
    host = bind[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # '*', an interface name or a host name: reachable from elsewhere
        return False


def exposure_warning(bind):
    """The warning for a service that listens beyond loopback without CURVE, or None."""
    if is_loopback(bind):
        return None
    return (f"SECURITY: listening on {bind} without CURVE: anyone who can reach this address can read and send "
            f"tensors; make keys with `zmqflow keys generate DIR` and pass --curve-dir DIR (or set {ENV})")
