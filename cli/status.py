"""`zmqflow status`: the cluster's tasks, queues, ps steps and workers, redrawn every second until Ctrl-C."""

import json
import sys
import time

import click

from zmqflow.common.cli_support import curve_option
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.jobs.cluster_check import spec_from_options
from zmqflow.jobs.status.probe import add_rates, snapshot
from zmqflow.jobs.status.render import render


@click.command(name="status", context_settings={"show_default": True})
@curve_option()
@click.option("--cluster", "cluster_file", default=None, type=click.Path(dir_okay=False),
              help="A YAML/JSON cluster spec (or a TF_CONFIG-shaped document).")
@click.option("--broker", multiple=True, metavar="HOST:PORT", help="The broker.")
@click.option("--ps", multiple=True, metavar="HOST:PORT[,...]", help="ps shards, in order (repeat or comma-separated).")
@click.option("--worker", multiple=True, metavar="HOST:PORT[,...]", help="Worker tasks (listed; their state "
              "comes from ps 0).")
@click.option("--worker-metrics", multiple=True, metavar="HOST:PORT|URL",
              help="A worker's --metrics-port endpoint, in worker order (repeat): examples/s, steps.")
@click.option("--aggregator", multiple=True, metavar="HOST:PORT", help="Aggregators (member health).")
@click.option("--serve", multiple=True, metavar="HOST:PORT[,...]", help="Model servers.")
@click.option("--interval", default=1.0, type=click.FloatRange(min=0.1), help="Seconds between refreshes.")
@click.option("--timeout", default=1.0, type=click.FloatRange(min=0.05), help="Seconds each task may take to answer.")
@click.option("--once", is_flag=True, help="Print one snapshot and exit (exit 1 if a task is down).")
@click.option("--json", "as_json", is_flag=True, help="Print snapshots as JSON (one object per line).")
def command(cluster_file, broker, ps, worker, worker_metrics, aggregator, serve, interval, timeout, once, as_json):
    """A live view of a running cluster: each task up or down, the broker's queues, ps versions and
    steps/s, the workers ps 0 has heard from, model servers and aggregator members.

    The cluster comes from --cluster, the --broker/--ps/... flags, or TF_CONFIG.
    """
    shortcuts = {"broker": broker, "ps": ps, "worker": worker, "aggregator": aggregator, "serve": serve}
    try:
        spec = spec_from_options(cluster_file, (), shortcuts)
    except InvalidArgumentError as exc:
        raise click.UsageError(str(exc)) from None
    if spec is None:
        raise click.UsageError("no cluster: give --cluster FILE, --broker/--ps/... flags, or set TF_CONFIG")
    metrics = [a.strip() for item in worker_metrics for a in item.split(",") if a.strip()]
    if once:
        snap = snapshot(spec, metrics, timeout)
        click.echo(json.dumps(snap) if as_json else render(snap))
        sys.exit(1 if any(t["status"] == "down" for t in snap["tasks"]) else 0)
    previous = None
    try:
        while True:
            started = time.monotonic()
            snap = add_rates(snapshot(spec, metrics, timeout), previous)
            if as_json:
                click.echo(json.dumps(snap))
            else:
                click.echo(("\x1b[H\x1b[2J" if sys.stdout.isatty() else "\n") + time.strftime("%H:%M:%S ") + "zmqflow status (Ctrl-C to stop)\n\n"
                           + render(snap))
            previous = snap
            time.sleep(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        pass
