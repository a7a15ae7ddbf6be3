"""Operator commands: ask a running service whether it is up and what it holds."""

import json
import sys

import click

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
