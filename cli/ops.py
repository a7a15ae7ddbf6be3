"""Operator commands: ask a running service whether it is up and what it holds."""

import json
import sys

import click

from zmqflow.common.cli_support import curve_option
from zmqflow.common.errors import OpError
from zmqflow.common.rpc_client import RpcClient
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
    address = _endpoint(address)
    with RpcClient(address, heartbeat_interval=timeout, heartbeat_liveness=1) as client:
        try:
            rtt = client.ping(timeout=timeout)
            info, _ = client.call("info", timeout=timeout)
        except OpError as exc:
            click.echo(f"{address}: {type(exc).__name__}: {exc}", err=True)
            sys.exit(1)
    if as_json:
        click.echo(json.dumps({"address": address, "rtt_ms": round(rtt * 1000, 3), **info}))
    else:
        click.echo(f"{address}: {info.get('service')} up {info.get('uptime_s')} s, pid {info.get('pid')}, "
                   f"round trip {rtt * 1000:.2f} ms")


@click.command()
@click.argument("address")
@curve_option()
@click.option("--timeout", default=2.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def queues(address, timeout, as_json):
    """List the queues of the broker at ADDRESS: kind, size, capacity, closed, waiting requests."""
    address = _endpoint(address)
    with RpcClient(address, heartbeat_interval=timeout, heartbeat_liveness=1) as client:
        try:
            result, _ = client.call("list_queues", timeout=timeout)
        except OpError as exc:
            click.echo(f"{address}: {type(exc).__name__}: {exc}", err=True)
            sys.exit(1)
    rows = result["queues"]
    click.echo(json.dumps(rows) if as_json else queue_table(rows))


def _endpoint(address):
    return address if "://" in address else f"tcp://{address}"
