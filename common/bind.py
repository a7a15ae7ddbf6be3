"""Where a service listens: every `--bind` (and `--grpc-bind`, `--metrics-bind`, `--web-bind`) read one way (V5,
docs/cli.md), so the same text means the same place for the ZeroMQ services and the HTTP/gRPC listeners.

    5555                    port 5555 on 127.0.0.1: nothing beyond this machine reaches it
    0.0.0.0:5555, *:5555    every interface (a ZeroMQ service then needs CURVE or --insecure: docs/security.md)
    10.0.0.7:5555           one interface; also a host name, `[::1]:5555` for IPv6
    tcp://HOST:PORT         a ZeroMQ URL (ipc://PATH and inproc://NAME too, for a ZeroMQ service only)
    http://HOST:PORT        the same as HOST:PORT, for an HTTP listener

Port 0 (or ZeroMQ's `*`) picks a free port: the ready file and the log name the one taken. An empty host
(`:5555`) is refused rather than guessed: Go reads it as every interface, the loopback default as this
machine only, and the two differ in who can reach the service.
"""

import dataclasses
import re

from zmqflow.common.errors import InvalidArgumentError

LOOPBACK = "127.0.0.1"
EVERY_INTERFACE = "0.0.0.0"
FORMS = "[HOST:]PORT or a URL such as tcp://0.0.0.0:5555 (PORT 0..65535, 0: any free port)"
"""The forms, as an error or a --help names them."""

_ZMQ_ONLY = ("ipc", "inproc")
_HOST_PORT = ("tcp", "http")


class BindError(InvalidArgumentError):
    """A listener that could not bind its address (in use, no such interface): a bad --bind, exit 2."""


@dataclasses.dataclass(frozen=True)
class Bind:
    """A parsed bind address: `host` None when the text named none (a bare PORT); `url` the text itself when it
    was a ZeroMQ URL (passed to ZeroMQ as written: `tcp://eth0:5555`, `ipc:///tmp/s`)."""

    host: str | None
    port: int | None
    url: str | None = None

    def zmq_endpoint(self, default_host=LOOPBACK):
        """The ZeroMQ endpoint to bind (`tcp://127.0.0.1:*` for port 0)."""
        if self.url and self.port != 0:   # ipc://, inproc://, tcp:// as written (port 0: ZeroMQ says *)
            return self.url
        host = self.host or default_host
        return f"tcp://{f'[{host}]' if ':' in host else host}:{self.port or '*'}"

    def socket_address(self, default_host=LOOPBACK):
        """(host, port) for a TCP listener of our own (HTTP, gRPC, metrics); `*` is every interface."""
        host = self.host or default_host
        return (EVERY_INTERFACE if host == "*" else host), self.port


def parse_bind(text, option=None, zmq=True):
    """`text` -> Bind, or InvalidArgumentError saying what was wrong and the forms that work (naming `option`,
    when given: click names it itself).
    `zmq`: the listener is a ZeroMQ socket (ipc:// and inproc:// allowed), else a TCP socket of our own."""
    raw = str(text).strip()
    where = f"{option + ' ' if option else ''}{raw!r:.80}"
    scheme, sep, rest = raw.partition("://")
    if not sep:
        scheme, rest = None, raw
    elif scheme in _ZMQ_ONLY:
        if not zmq:
            raise InvalidArgumentError(f"{where}: {scheme}:// is for a ZeroMQ service; this listener takes {FORMS}")
        if not rest:
            raise InvalidArgumentError(f"{where}: {scheme}:// needs a {'path' if scheme == 'ipc' else 'name'}")
        return Bind(None, None, raw)
    elif scheme == "http" and zmq:
        raise InvalidArgumentError(f"{where}: a ZeroMQ service listens on tcp://, not http://; expected {FORMS}")
    elif scheme not in _HOST_PORT:
        raise InvalidArgumentError(f"{where}: unknown scheme {scheme}://; expected {FORMS}")
    rest = rest.rstrip("/") if scheme == "http" else rest
    host, colon, port = rest.rpartition(":")
    if not colon:
        host, port = None, rest
    elif not host:
        raise InvalidArgumentError(f"{where}: no host before the colon; write {port} for this machine only "
                                   f"(127.0.0.1) or 0.0.0.0:{port} for every interface")
    elif host.startswith("[") != host.endswith("]") or (":" in host and not host.startswith("[")):
        raise InvalidArgumentError(f"{where}: write an IPv6 host in brackets, [::1]:PORT")
    if scheme and host is None:
        raise InvalidArgumentError(f"{where}: a URL names its host and port ({scheme}://HOST:PORT)")
    if port == "*" and zmq:
        port = "0"
    if not re.fullmatch(r"\d{1,5}", port) or int(port) > 65535:
        raise InvalidArgumentError(f"{where}: {port!r} is no port; expected {FORMS}")
    host = host.strip("[]") if host else None
    if host is not None and not re.fullmatch(r"[\w.\-:*%]+", host):
        raise InvalidArgumentError(f"{where}: {host!r} is no host name or address; expected {FORMS}")
    return Bind(host, int(port), raw if scheme == "tcp" else None)
