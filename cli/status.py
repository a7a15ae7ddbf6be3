"""`zmqflow status`: the cluster's tasks, queues, ps steps and workers, redrawn every second until Ctrl-C."""

import json
import sys
import time

import click

from zmqflow.common.bind import LOOPBACK
from zmqflow.common.processes.service_cli import BIND_HELP, BindAddress, curve_option, deprecated_option, option
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
              help="A worker's --metrics-bind endpoint, in worker order (repeat): examples/s, steps.")
@click.option("--aggregator", multiple=True, metavar="HOST:PORT", help="Aggregators (member health).")
@click.option("--serve", multiple=True, metavar="HOST:PORT[,...]", help="Model servers.")
@option("--interval-secs", "interval", old_names=["--interval"],
        default=1.0, type=click.FloatRange(min=0.1), help="Seconds between refreshes.")
@option("--timeout-secs", "timeout", old_names=["--timeout"],
        default=1.0, type=click.FloatRange(min=0.05), help="Seconds each task may take to answer.")
@click.option("--once", is_flag=True, help="Print one snapshot and exit (exit 1 if a task is down).")
@click.option("--json", "as_json", is_flag=True, help="Print snapshots as JSON (one object per line).")
@click.option("--web", is_flag=True, help="Serve the view as a web page instead (tables and training curves, "
              "refreshed every --interval-secs; needs pip install 'zmqflow[http]').")
@option("--web-bind", "web_port", old_names=["--web-port"], default="8088", metavar="[HOST:]PORT",
        type=BindAddress(zmq=False),
        help=f"With --web: where the page listens, {BIND_HELP} (its URL is printed).")
@deprecated_option("--web-host", use="--web-bind HOST:PORT", default=None)
@click.option("--history", "history_points", default=600, type=click.IntRange(min=2),
              help="With --web: snapshots the curves keep (the oldest are dropped).")
def command(cluster_file, broker, ps, worker, worker_metrics, aggregator, serve, interval, timeout, once, as_json,
            web, web_host, web_port, history_points):
    """A live view of a running cluster: each task up or down, the broker's queues, ps versions and
    steps/s, the workers ps 0 has heard from, model servers and aggregator members.

    The cluster comes from --cluster, the --broker/--ps/... flags, or TF_CONFIG. With --web the
    same view, plus loss, validation and rate curves, is a web page at http://127.0.0.1:8088.
    """
    if web and (once or as_json):
        raise click.UsageError("--web serves a page: it does not go with --once or --json")
    if web:
        _check_http_extra()
        web_host, web_port = web_port.socket_address(web_host or LOOPBACK)   # a HOST there wins over --web-host
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
    if web:
        _serve_web(spec, metrics, interval, timeout, web_host, web_port, history_points)
        return
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


HTTP_EXTRA_HINT = "--web needs the http extra: pip install 'zmqflow[http]' (Starlette, uvicorn)"


def _check_http_extra():
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise click.UsageError(f"{HTTP_EXTRA_HINT}; {exc}") from None


def _serve_web(spec, metrics, interval, timeout, host, port, history_points):
    from zmqflow.jobs.status.history import History
    from zmqflow.jobs.status.poller import Poller
    from zmqflow.jobs.status.web import serve_web
    poller = Poller(spec, metrics, interval=interval, timeout=timeout, history=History(history_points))
    try:
        serve_web(poller, host, port, on_listening=lambda url: click.echo(f"zmqflow status: web view on {url}/"))
    except InvalidArgumentError as exc:
        raise click.UsageError(str(exc)) from None
