"""Operator commands: ask a running service whether it is up and what it holds."""

import json
import sys

import click

from zmqflow.common import health
from zmqflow.common.cli_support import curve_option
from zmqflow.common.errors import OpError
from zmqflow.common.broker_client import BrokerClient
from zmqflow.common.probe import endpoint_of, probe
from zmqflow.jobs.status.render import queue_table


@click.command()
@click.argument("address")
@curve_option()
@click.option("--timeout", default=2.0, show_default=True, help="Seconds to wait for the answer.")
@click.option("--json", "as_json", is_flag=True, help="Print the service's info as JSON.")
def ping(address, timeout, as_json):
    """Check that the service at ADDRESS answers; exit 1 if it does not.

    ADDRESS is a ZeroMQ endpoint (tcp://host:port) or host:port.
    """
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
@click.argument("address")
@curve_option()
@click.option("--timeout", default=2.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def queues(address, timeout, as_json):
    """List the queues of the broker at ADDRESS: kind, size, capacity, closed, waiting requests."""
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
@click.option("--timeout", default=2.0, show_default=True, help="Seconds to wait for the answer.")
def healthcheck(health_file, timeout):
    """The image's HEALTHCHECK: exit 0 when this container's zmqflow task is healthy.

    A service (broker, ps, serve, aggregator) is healthy when the endpoint it
    announced answers a ping; a task that only dials out (worker, reader) once
    it has started. Exit 1 otherwise, with the reason.
    """
    endpoint = health.announced(health_file)
    if endpoint is None:
        click.echo(f"no zmqflow task has announced an endpoint in {health_file or 'the file named by $' + health.ENV} yet",
                   err=True)
        sys.exit(1)
    if endpoint == health.CLIENT:
        click.echo("a client task (it only dials out) is running")
        return
    answer = probe(health.local_endpoint(endpoint), timeout)
    if not answer.up:
        click.echo(f"{answer.address}: {answer.error}", err=True)
        sys.exit(1)
    click.echo(f"{answer.address}: {answer.info.get('service')} up, round trip {answer.rtt_s * 1000:.2f} ms")
