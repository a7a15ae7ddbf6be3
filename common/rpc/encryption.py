"""ZeroMQ CURVE for every service and client: keys, socket setup, the authenticator.

One directory (made by `zmqflow keys generate DIR`) holds everything:
server.key / server.key_secret (the pair every service uses), client.key /
client.key_secret (the pair every client uses), and authorized/ (the public
keys of the clients a service accepts; delete one there to revoke it).

With a key directory, a service encrypts (curve_server) and a ZAP
authenticator refuses any client whose key is not in authorized/; a client
checks the service's public key, so it cannot talk to an impostor. Clients
take the directory from ZMQFLOW_CURVE_DIR by default, so child processes
(workers, readers) inherit it from the service command that set it.
A refused client gets no answer at all (ZeroMQ drops the handshake): its
heartbeats make that an UnavailableError, bounded.
"""

import ipaddress
import logging
import os
import shutil

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from zmqflow.common.errors import InvalidArgumentError

ENV = "ZMQFLOW_CURVE_DIR"
SERVER, CLIENT, AUTHORIZED = "server", "client", "authorized"

log = logging.getLogger(__name__)
_authenticators = {}  # id(context) -> ThreadAuthenticator: one ZAP handler per context


def curve_dir_from_env():
    return os.environ.get(ENV) or None


# ------------------------------------------------ keys on disk


def generate(directory, clients=(CLIENT,), force=False):
    """Make the server pair, one pair per client name, and authorize every client; returns the names."""
    names = list(dict.fromkeys([CLIENT, *clients]))  # the default client pair always exists
    for name in names:
        if not name or os.sep in name or name in (SERVER, AUTHORIZED) or name.startswith("."):
            raise InvalidArgumentError(f"bad client name {name!r}: a plain file name other than "
                                       f"{SERVER!r} and {AUTHORIZED!r}")
    if os.path.exists(os.path.join(directory, f"{SERVER}.key")) and not force:
        raise InvalidArgumentError(f"{directory} already holds keys; pass --force to replace them")
    authorized = os.path.join(directory, AUTHORIZED)
    os.makedirs(authorized, exist_ok=True)
    for name in [SERVER, *names]:
        public, secret = zmq.auth.create_certificates(directory, name)
        os.chmod(secret, 0o600)
        if name != SERVER:
            shutil.copy(public, os.path.join(authorized, f"{name}.key"))
    return names


def _load(path, secret):
    if not os.path.isfile(path):
        raise InvalidArgumentError(f"CURVE key file {path} is missing (make keys with `zmqflow keys generate DIR`)")
    try:
        public, secret_key = zmq.auth.load_certificate(path)
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
    """A client's own pair and the service public key it expects."""

    def __init__(self, directory, name=CLIENT):
        self.directory = directory
        self.public, self.secret = _load(os.path.join(directory, f"{name}.key_secret"), True)
        self.server_public, _ = _load(os.path.join(directory, f"{SERVER}.key"), False)


def check_dir(directory):
    """Raise InvalidArgumentError unless `directory` holds a usable server and client setup."""
    ServerKeys(directory)
    ClientKeys(directory)


# ------------------------------------------------ sockets


def secure_server(socket, bind, keys):
    """Make `socket` (not yet bound) a CURVE server that only accepts authorized clients; or warn."""
    if keys is None:
        warning = exposure_warning(bind)
        if warning:
            log.warning(warning)
        return
    _authenticator(socket.context, keys.authorized)
    socket.curve_secretkey = keys.secret
    socket.curve_publickey = keys.public
    socket.curve_server = True


def secure_client(socket, keys):
    """Make `socket` (not yet connected) a CURVE client that only talks to the keys' service."""
    if keys is not None:
        socket.curve_secretkey = keys.secret
        socket.curve_publickey = keys.public
        socket.curve_serverkey = keys.server_public


def _authenticator(context, authorized):
    auth = _authenticators.get(id(context))
    if auth is None or auth.context is not context:  # an id reused by a new context
        auth = ThreadAuthenticator(context, log=_DenialLog())
        auth.start()
        _authenticators[id(context)] = auth
    auth.configure_curve(domain="*", location=authorized)
    return auth


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
