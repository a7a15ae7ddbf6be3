"""Operator commands: ask a running service whether it is up and what it holds."""

import json
import sys

import click

from zmqflow.common.rpc import health
from zmqflow.common.processes.service_cli import address_option, admin_token_option, curve_option, option
from zmqflow.common.errors import OpError
from zmqflow.common.clients.broker import BrokerClient
from zmqflow.common.clients.ps import PsShardClient
from zmqflow.common.rpc.probe import endpoint_of, probe
from zmqflow.jobs.status.render import queue_table


@click.command()
@address_option("The service to ask: HOST:PORT or a ZeroMQ URL (tcp://host:port).")
@curve_option()
@option("--timeout-secs", "timeout", old_names=["--timeout"],
        default=2.0, show_default=True, help="Seconds to wait for the answer.")
@click.option("--json", "as_json", is_flag=True, help="Print the service's info as JSON.")
def ping(address, timeout, as_json):
    """Check that the service at --address answers; exit 1 if it does not."""
    answer = probe(address, timeout)
    if not answer.up:
        click.echo(f"{answer.address}: {answer.error}", err=True)
        sys.exit(1)
    info = answer.info
    if as_json:
        click.echo(json.dumps({"address": answer.address, "rtt_ms": answer.rtt_ms, **info}))
    else:
        click.echo(f"{answer.address}: {info.get('service')} up {info.get('uptime_s')} s, pid {info.get('pid')}, "
                   f"round trip {answer.rtt_s * 1000:.2f} ms")


@click.command()
@address_option("The broker: HOST:PORT or a ZeroMQ URL (tcp://host:port).")
@curve_option()
@option("--timeout-secs", "timeout", old_names=["--timeout"], default=2.0, show_default=True,
        help="Seconds to wait for the answer.")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def queues(address, timeout, as_json):
    """List the queues of the broker at --address: kind, size, capacity, closed, waiting requests."""
    address = endpoint_of(address)
    with BrokerClient(address, heartbeat_interval=timeout, heartbeat_liveness=1) as client:
        try:
            rows = client.list_queues(timeout=timeout)
        except OpError as exc:
            click.echo(f"{address}: {type(exc).__name__}: {exc}", err=True)
            sys.exit(1)
    click.echo(json.dumps(rows) if as_json else queue_table(rows))


@click.command()
@curve_option()
@click.option("--file", "health_file", default=None, type=click.Path(dir_okay=False),
              help=f"Where the task announced its endpoint. Default: ${health.ENV} (the image sets it).")
@click.option("--http", "http_url", default=None, metavar="URL",
              help="Check this HTTP URL instead (healthy when a GET answers 2xx), e.g. the gateway's "
                   f"http://127.0.0.1:8000{health.HTTP_READY_PATH}.")
@option("--timeout-secs", "timeout", old_names=["--timeout"],
        default=2.0, show_default=True, help="Seconds to wait for the answer.")
def healthcheck(health_file, http_url, timeout):
    """The image's HEALTHCHECK: exit 0 when this container's zmqflow task is healthy.

    A service (broker, ps, serve, aggregator) is healthy when the endpoint it
    announced answers a ping; the HTTP gateway when its readiness route
    (/v2/health/ready) answers 200; a task that only dials out (worker, reader)
    once it has started. Exit 1 otherwise, with the reason.
    """
    if http_url is None:
        endpoint = health.announced(health_file)
        if endpoint is None:
            where = health_file or "the file named by $" + health.ENV
            click.echo(f"no zmqflow task has announced an endpoint in {where} yet", err=True)
            sys.exit(1)
        if endpoint == health.CLIENT:
            click.echo("a client task (it only dials out) is running")
            return
        if endpoint.startswith(("http://", "https://")):
            http_url = health.local_endpoint(endpoint) + health.HTTP_READY_PATH
    if http_url is not None:
        ok, detail = health.http_ready(http_url, timeout)
        click.echo(detail, err=not ok)
        if not ok:
            sys.exit(1)
        return
    answer = probe(health.local_endpoint(endpoint), timeout)
    if not answer.up:
        click.echo(f"{answer.address}: {answer.error}", err=True)
        sys.exit(1)
    click.echo(f"{answer.address}: {answer.info.get('service')} up, round trip {answer.rtt_s * 1000:.2f} ms")


SHUTDOWN_CLIENTS = {"queue-broker": BrokerClient, "ps-shard": PsShardClient}
"""The services with a shutdown op, by the `service` their info names; the others stop on SIGTERM."""


@click.command()
@address_option("The broker or ps shard: HOST:PORT or a ZeroMQ URL (tcp://host:port).")
@curve_option()
@admin_token_option()
@option("--timeout-secs", "timeout", old_names=["--timeout"],
        default=5.0, show_default=True, help="Seconds to wait for each answer.")
def shutdown(address, timeout):
    """Ask the broker or ps shard at --address to exit 0, as the chief does at the end of a job.

    Shutdown is an admin op: over CURVE the client key is the credential; without
    CURVE the admin token is sent ($ZMQFLOW_ADMIN_TOKEN, --admin-token-file, or the
    file the service wrote on this machine). Exit 1 when the service refuses or does
    not answer.
    """
    answer = probe(address, timeout)
    if not answer.up:
        click.echo(f"{answer.address}: {answer.error}", err=True)
        sys.exit(1)
    service = answer.info.get("service")
    client_class = SHUTDOWN_CLIENTS.get(service)
    if client_class is None:
        click.echo(f"{answer.address}: a {service} has no shutdown op; stop its process with SIGTERM", err=True)
        sys.exit(1)
    with client_class(answer.address, heartbeat_interval=timeout, heartbeat_liveness=1) as client:
        try:
            client.shutdown(timeout=timeout)
        except OpError as exc:
            click.echo(f"{answer.address}: {type(exc).__name__}: {exc}", err=True)
            sys.exit(1)
    click.echo(f"{answer.address}: {service} (pid {answer.info.get('pid')}) is shutting down")
