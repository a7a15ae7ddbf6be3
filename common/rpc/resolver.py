"""Host names of ZeroMQ endpoints resolved in the background, so a slow lookup never holds up a socket.

Why: libzmq resolves a tcp:// host name inside its I/O thread, again on every reconnect. A name
whose lookup is slow (a container or pod gone from DNS while the resolver upstream is unreachable:
about 10 s per lookup) blocks that thread and every socket of its context, the ones serving
requests included. Owners of sockets ask here instead and connect to the address:

- `endpoint(e)` never blocks: the endpoint with its host replaced by an address, or None while the
  lookup runs or after it failed (a failed name is looked up again after a back-off of 0.25 s
  doubling to 4 s). IP literals, `localhost` and non-tcp endpoints (ipc://, inproc://) come back as
  they are, without a thread.
- `wait(e, timeout)` waits up to `timeout` for the lookup, in the caller's own thread only.
- `refresh(e)` forgets the address: the peer is being reconnected, and a restarted pod comes back
  under the same name with a new address. Addresses also expire after `ttl_s`; an expired one is
  still answered while a new lookup runs.

Lookups run one at a time per host in a daemon thread each; answers prefer IPv4, an IPv6-only
answer comes back in brackets (`tcp://[fd00::5]:5700`, see `is_ipv6`).
"""

import ipaddress
import re
import socket
import threading
import time

TTL_S = 30.0
RETRY_START_S, RETRY_MAX_S = 0.25, 4.0
_TCP = re.compile(r"tcp://(?P<host>[A-Za-z0-9_][A-Za-z0-9_.-]*):(?P<port>\d+)")
_PASS_THROUGH = {"localhost", "*"}


class _Entry:
    """What is known of one host name: its address, when that expires, the last error, the lookup running."""

    __slots__ = ("address", "expires_at", "error", "failures", "retry_at", "lookup")

    def __init__(self):
        self.address = self.error = self.lookup = None
        self.expires_at = self.retry_at = 0.0
        self.failures = 0


def split_tcp(endpoint):
    """(host, port) of a `tcp://name:port` endpoint whose host is a name to look up, else None."""
    match = _TCP.fullmatch(endpoint) if isinstance(endpoint, str) else None
    if match is None or match["host"] in _PASS_THROUGH:
        return None
    try:
        ipaddress.ip_address(match["host"])
        return None
    except ValueError:
        return match["host"], match["port"]


def is_ipv6(endpoint):
    """Whether the endpoint's host is a bracketed IPv6 address (the socket needs its ipv6 option)."""
    return isinstance(endpoint, str) and endpoint.startswith("tcp://[")


class Resolver:
    def __init__(self, ttl_s=TTL_S, retry_start_s=RETRY_START_S, retry_max_s=RETRY_MAX_S,
                 getaddrinfo=socket.getaddrinfo, clock=time.monotonic):
        self.ttl_s, self.retry_start_s, self.retry_max_s = ttl_s, retry_start_s, retry_max_s
        self._getaddrinfo, self._clock = getaddrinfo, clock
        self._lock = threading.Lock()
        self._entries = {}  # host -> _Entry

    def endpoint(self, endpoint):
        """`endpoint` with its host name replaced by its address, or None (looking it up, or it failed)."""
        parts = split_tcp(endpoint)
        if parts is None:
            return endpoint
        host, port = parts
        with self._lock:
            entry = self._entries.setdefault(host, _Entry())
            now = self._clock()
            if entry.lookup is None and now >= entry.retry_at and (entry.address is None or now >= entry.expires_at):
                self._start_lookup(host, entry)
            address = entry.address
        return None if address is None else _format(address, port)

    def wait(self, endpoint, timeout=None):
        """Like `endpoint`, but waits up to `timeout` s (None: the lookup's own time) for a lookup running.
        A name whose last lookup failed answers None at once until its back-off is over."""
        end = None if timeout is None else self._clock() + timeout
        resolved = self.endpoint(endpoint)
        if resolved is not None:
            return resolved
        with self._lock:
            lookup = self._entries[split_tcp(endpoint)[0]].lookup
        if lookup is not None:
            lookup.wait(None if end is None else max(0.0, end - self._clock()))
        return self.endpoint(endpoint)

    def refresh(self, endpoint):
        """Forget `endpoint`'s address and look it up again now (unless a lookup runs or it is backing off)."""
        parts = split_tcp(endpoint)
        if parts is None:
            return
        with self._lock:
            entry = self._entries.get(parts[0])
            if entry is not None:
                entry.address = None
        self.endpoint(endpoint)

    def error(self, endpoint):
        """Why the last lookup of `endpoint`'s host failed, or None."""
        parts = split_tcp(endpoint)
        with self._lock:
            entry = self._entries.get(parts[0]) if parts else None
            return entry.error if entry is not None else None

    def _start_lookup(self, host, entry):
        entry.lookup = threading.Event()
        threading.Thread(target=self._look_up, args=(host, entry), name=f"resolve-{host}", daemon=True).start()

    def _look_up(self, host, entry):
        try:
            address, error = _pick(self._getaddrinfo(host, None, type=socket.SOCK_STREAM)), None
        except (OSError, UnicodeError) as exc:
            address, error = None, f"{type(exc).__name__}: {exc}"
        with self._lock:
            now = self._clock()
            if address is not None:
                entry.address, entry.expires_at, entry.error, entry.failures = address, now + self.ttl_s, None, 0
            else:
                entry.error = error or f"no address for {host}"
                entry.failures += 1
                entry.retry_at = now + min(self.retry_start_s * 2 ** (entry.failures - 1), self.retry_max_s)
            done, entry.lookup = entry.lookup, None
        done.set()


def _pick(infos):
    """The first IPv4 address of getaddrinfo's answer, else the first IPv6 one, else None."""
    for family in (socket.AF_INET, socket.AF_INET6):
        for info in infos:
            if info[0] == family:
                return info[4][0]
    return None


def _format(address, port):
    return f"tcp://[{address}]:{port}" if ":" in address else f"tcp://{address}:{port}"


default_resolver = Resolver()
"""The process's resolver: every socket owner shares its answers."""
