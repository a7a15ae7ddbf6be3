"""What a container's HEALTHCHECK asks: the endpoint its zmqflow task announced.

One image runs every service, so its HEALTHCHECK cannot know a port in
advance. The image sets ZMQFLOW_HEALTH_FILE; a service writes the endpoint it
bound there once it listens, a task that only dials out (worker, reader)
writes `client`, and `zmqflow healthcheck` pings what it finds. Without the
variable (tests, a checkout, `zmqflow up`) nothing is written.
"""

import os

ENV = "ZMQFLOW_HEALTH_FILE"
CLIENT = "client"


def announce(endpoint):
    """Record `endpoint` (or CLIENT) for the healthcheck; a no-op unless ZMQFLOW_HEALTH_FILE is set."""
    path = os.environ.get(ENV)
    if not path:
        return
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(endpoint)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only filesystem must not stop the service; the healthcheck then says why


def announced(path=None):
    """The announced endpoint, CLIENT, or None when nothing was announced (yet)."""
    path = path or os.environ.get(ENV)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def local_endpoint(endpoint):
    """The address to ping from inside the container: a wildcard bind becomes 127.0.0.1."""
    scheme, _, rest = endpoint.partition("://")
    host, _, port = rest.rpartition(":")
    if host in ("0.0.0.0", "*", "[::]", "::"):
        host = "127.0.0.1"
    return f"{scheme}://{host}:{port}"
