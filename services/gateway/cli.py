"""`zmqflow gateway` / `zmqflow-gateway`: the Open Inference Protocol over HTTP in front of an aggregator or a model server."""

import contextlib
import logging
import os

import click

from zmqflow.common.processes.service_cli import (BIND_HELP, BindAddress, curve_option, ops_options, option,
                                                  serve_metrics, service_main, setup_logging, write_ready_file)
from zmqflow.common.rpc.probe import endpoint_of
from zmqflow.services.gateway.limits import JSON_COST, RAW_COST, RECEIVE_COST

HTTP_EXTRA_HINT = "the gateway needs the http extra: pip install 'zmqflow[http]' (Starlette, uvicorn, httptools, orjson)"
GRPC_EXTRA_HINT = "--grpc-bind needs the grpc extra: pip install 'zmqflow[http,grpc]' (grpcio)"


@click.command(name="gateway", context_settings={"show_default": True})
@click.option("--aggregator", default=None, metavar="ENDPOINT",
              help="The aggregator to front: its ensemble is one model (--model-name), each member a model of its own.")
@option("--serve", "server", old_names=["--server"],
        default=None, metavar="ENDPOINT", help="A single model server to front instead.")
@click.option("--bind", default="127.0.0.1:8000", type=BindAddress(zmq=False), metavar="[HOST:]PORT",
              help=f"Where the HTTP side listens: {BIND_HELP}, named by the ready file and the log.")
@click.option("--grpc-bind", default=None, type=BindAddress(zmq=False), metavar="[HOST:]PORT",
              help="Also serve the protocol over gRPC (inference.GRPCInferenceService, as Triton and KServe do; "
                   "their port is 8001; with the health service grpc.health.v1.Health, which Kubernetes' gRPC "
                   "probes ask) with the same models, limits and metrics, listening here, read as --bind "
                   "is. Needs the grpc extra.")
@option("--model-name", "ensemble_name", old_names=["--name"],
        default="ensemble", help="Model name of the aggregator's ensemble.")
@click.option("--ready-file", type=click.Path(dir_okay=False), default=None,
              help="Write the gateway's URL to this file once it serves (for scripts and tests).")
@option("--timeout-secs", "timeout_s", old_names=["--timeout-s"], default=10.0, type=click.FloatRange(min=0.001),
        help="Deadline of an infer request that names none (the aggregator's own --deadline-ms still "
             "applies to the ensemble); a request sets its own with the X-Zmqflow-Deadline-Ms header or "
             "the `timeout` parameter (microseconds, as Triton's clients send it).")
@click.option("--max-body-bytes", default=8 * 1024 * 1024, type=click.IntRange(min=1),
              help="Largest request body; a larger one is answered 413 without being read.")
@click.option("--max-inflight-bytes", default=256 * 1024 * 1024, type=click.IntRange(min=1),
              help="Memory the requests in flight may hold together, estimated from their bodies: "
                   f"{JSON_COST}x their JSON (what parsing it costs at worst), {RAW_COST}x their binary tensor data; "
                   "a request that would go over is answered 503 (Retry-After) before its body is read. "
                   f"gRPC draws on the same: a call reserves {RECEIVE_COST}x --max-body-bytes before its message "
                   "is read (RESOURCE_EXHAUSTED when they are not left), then its own cost. "
                   f"At least {JSON_COST}x --max-body-bytes, so that the largest body fits.")
@option("--body-timeout-secs", "body_timeout_s", old_names=["--body-timeout-s"],
        default=30.0, type=click.FloatRange(min=0.001),
        help="Time a client has to send a request's body (a gRPC call its message); a slower one is answered 408 "
             "(DEADLINE_EXCEEDED).")
@option("--header-timeout-secs", "header_timeout_s", old_names=["--header-timeout-s"],
        default=10.0, type=click.FloatRange(min=0.001),
        help="Time a client has to send a request's headers; a slower connection is closed.")
@option("--keep-alive-secs", "keep_alive_s", old_names=["--keep-alive-s"], default=5.0,
        type=click.FloatRange(min=0.1),
        help="How long an idle keep-alive connection stays open.")
@click.option("--max-connections", default=1000, type=click.IntRange(min=1),
              help="Connections and requests at once; more are answered 503 at once (uvicorn's limit_concurrency).")
@option("--refresh-secs", "refresh_s", old_names=["--refresh-s"], default=5.0, type=click.FloatRange(min=0.05),
        help="How often the models (the aggregator's members and their metadata) are asked for again.")
@click.option("--log-level", default="INFO", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
@curve_option()
@ops_options
def command(aggregator, server, bind, grpc_bind, ensemble_name, ready_file, timeout_s, max_body_bytes, max_inflight_bytes,
            body_timeout_s, header_timeout_s, keep_alive_s, max_connections, refresh_s, log_level):
    """Serve the Open Inference Protocol (KServe v2 REST: health, model metadata, infer with JSON or binary
    tensors) over HTTP, and with --grpc-bind over gRPC too, forwarding each inference over ZeroMQ to an
    aggregator or a model server."""
    if (aggregator is None) == (server is None):
        raise click.UsageError("give one of --aggregator ENDPOINT or --serve ENDPOINT")
    if max_inflight_bytes < JSON_COST * max_body_bytes:
        raise click.BadParameter(f"{max_inflight_bytes} cannot hold one JSON body of --max-body-bytes {max_body_bytes} "
                                 f"while it is parsed: give at least {JSON_COST * max_body_bytes}",
                                 param_hint="--max-inflight-bytes")
    try:
        from zmqflow.services.gateway import server as http_server
        from zmqflow.services.gateway.app import GatewaySettings, build_app
    except ImportError as exc:
        click.echo(f"Error: {HTTP_EXTRA_HINT} ({exc})", err=True)
        raise SystemExit(2) from None
    if grpc_bind is not None:
        try:
            from zmqflow.services.gateway import grpc_service
        except ImportError as exc:
            click.echo(f"Error: {GRPC_EXTRA_HINT} ({exc})", err=True)
            raise SystemExit(2) from None
    from zmqflow.common.rpc import health
    from zmqflow.common.processes import metrics
    from zmqflow.common.errors import InvalidArgumentError
    from zmqflow.services.gateway.discovery import Discovery
    from zmqflow.services.gateway.request_stats import RequestStats
    from zmqflow.common.rpc.asyncio_client import AsyncClients

    setup_logging(log_level, "gateway")
    try:
        sock = http_server.listening_socket(*bind.socket_address())
    except InvalidArgumentError as exc:
        raise click.BadParameter(str(exc), param_hint="--bind") from None
    url = http_server.url_of(sock)
    if grpc_bind is not None:
        grpc_host, grpc_port = grpc_bind.socket_address()
        try:
            if grpc_port:   # in use or not an address here: said now, not once the HTTP side serves
                http_server.listening_socket(grpc_host, grpc_port).close()
        except InvalidArgumentError as exc:
            raise click.BadParameter(str(exc), param_hint="--grpc-bind") from None
    upstreams = AsyncClients(name="gateway")
    discovery = Discovery(upstreams, aggregator and endpoint_of(aggregator), server and endpoint_of(server),
                          ensemble_name, refresh_s)

    stats = RequestStats().export() if metrics.requested() else None
    if stats is not None:
        metrics.set_task("gateway", "gateway")   # the `task` label of its families and zmqflow_task_info, as every task
    if metrics.requested():
        serve_metrics()   # --metrics-bind: process metrics and the infer requests' (request_stats.py)

    grpc_address = []   # where the gRPC service listens, once it does

    def announce():
        also = f" and gRPC on {grpc_address[0]}" if grpc_address else ""
        logging.getLogger("gateway").info("gateway listening on %s%s (pid %d) for %s; models: %s", url, also,
                                          os.getpid(), aggregator or server, ", ".join(discovery.catalog.models) or
                                          f"none yet ({discovery.error})")
        health.announce(url)   # the image's HEALTHCHECK asks its /v2/health/ready
        if ready_file:
            write_ready_file(ready_file, url)

    settings = GatewaySettings(discovery, upstreams, max_body_bytes, body_timeout_s, timeout_s, stats, max_inflight_bytes)
    beside = []
    if grpc_bind is not None:
        @contextlib.asynccontextmanager
        async def grpc_beside():
            async with grpc_service.serving(settings, grpc_host, grpc_port, max_connections, keep_alive_s) as address:
                grpc_address.append(address)
                yield
        beside.append(grpc_beside())
    app = build_app(settings, http_server.discovery_lifespan(discovery, upstreams, announce, beside))
    http_server.serve(app, sock, header_timeout_s, keep_alive_s, max_connections)


def main():
    service_main(command)


if __name__ == "__main__":
    main()
