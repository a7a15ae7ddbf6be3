"""Serving the gateway's app with uvicorn: the listening socket, limits for slow and idle clients, start and stop.

Why a header timeout of our own: uvicorn closes idle keep-alive connections (--keep-alive-secs) but
waits for ever for the headers of a request that has begun, so a client that sends half its
headers and stalls (or connects and says nothing) would hold its connection, and with it a share
of --max-connections, until it goes. The protocol below closes such a connection after
--header-timeout-secs; a body that comes too slowly is the app's (app.read_body, 408). Beyond
--max-connections uvicorn answers 503 at once, so memory stays bounded by the connections times
--max-body-bytes. The listening socket is bound here (port 0: any free port), so the ready file
names the real address, and the catalog is loaded before it is written.
"""

import asyncio
import contextlib
import logging
import socket

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from zmqflow.common.bind import BindError

log = logging.getLogger(__name__)


def listening_socket(host, port, backlog=1024):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and without it Nagle
    # held every answer after the first on a keep-alive connection for the client's delayed ACK (44 ms)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise BindError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(backlog)
    return sock


def url_of(sock):
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def header_timeout_protocol(timeout_s):
    """uvicorn's httptools protocol that closes a connection whose request headers take over `timeout_s`."""

    class HeaderTimeoutProtocol(HttpToolsProtocol):
        _header_timer = None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self):
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self):
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

        def _arm(self):
            self._disarm()
            self._header_timer = self.loop.call_later(timeout_s, self._headers_too_slow)

        def _disarm(self):
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self):
            self._header_timer = None
            log.info("closing a connection from %s: no complete request headers within %g s", self.client, timeout_s)
            self.transport.close()

    return HeaderTimeoutProtocol


def discovery_lifespan(discovery, upstreams, on_ready, beside=()):
    """The app's lifespan: load the catalog, keep it fresh in the background, run the `beside` services (async
    context managers: the gRPC server) on the same loop, close them and then the sockets at the end."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await discovery.refresh()
        refresher = asyncio.get_running_loop().create_task(discovery.run())
        try:
            async with contextlib.AsyncExitStack() as stack:
                for service in beside:
                    await stack.enter_async_context(service)
                on_ready()
                yield
        finally:
            refresher.cancel()
            upstreams.close()
    return lifespan


class StopOnSignalServer(uvicorn.Server):
    """uvicorn raises the SIGTERM or SIGINT it caught once more after its graceful shutdown, so the process
    died of it (exit -15) after stopping cleanly; like every zmqflow service, the gateway exits 0 instead
    (`zmqflow up`, Compose and Kubernetes read a non-zero exit as a failure)."""

    def handle_exit(self, sig, frame):
        super().handle_exit(sig, frame)
        self._captured_signals.clear()


def serve(app, sock, header_timeout_s=10.0, keep_alive_s=5, max_connections=1000):
    """Serve `app` on the listening `sock` until SIGINT/SIGTERM (then stop within 2 s). The loop is uvloop where
    it is installed (the http extra's; gRPC's aio server runs on it too), else asyncio: 7-15 % less of the
    gateway's CPU a request here (docs/performance.md, Serving)."""
    config = uvicorn.Config(app, http=header_timeout_protocol(header_timeout_s), loop="auto", lifespan="on",
                            ws="none",   # no WebSocket route: skips loading wsproto, ~0.07 s of start-up
                            timeout_keep_alive=keep_alive_s, limit_concurrency=max_connections,
                            timeout_graceful_shutdown=2, access_log=False, log_config=None, server_header=False)
    StopOnSignalServer(config).run(sockets=[sock])
