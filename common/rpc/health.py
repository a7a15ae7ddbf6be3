"""What a container's HEALTHCHECK asks: the endpoint its zmqflow task announced.

One image runs every service, so its HEALTHCHECK cannot know a port in
advance. The image sets ZMQFLOW_HEALTH_FILE; a service writes the endpoint it
bound there once it listens, a task that only dials out (worker, reader)
writes `client`, and `zmqflow healthcheck` pings what it finds. The HTTP
gateway announces its URL; the check then asks its readiness route. Without the
variable (tests, a checkout, `zmqflow up`) nothing is written.
"""

import os

ENV = "ZMQFLOW_HEALTH_FILE"
CLIENT = "client"
HTTP_READY_PATH = "/v2/health/ready"   # the Open Inference Protocol's readiness route (the gateway's)


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


def http_ready(url, timeout):
    """(ok, detail): ok when a GET of `url` answers 2xx within `timeout` s; detail says what answered or why not."""
    import urllib.error   # here: every service imports this module to announce itself; only a check asks HTTP
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return True, f"{url}: HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return False, f"{url}: HTTP {exc.code} {exc.read(300).decode('utf-8', 'replace').strip()}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, f"{url}: {getattr(exc, 'reason', exc)}"
