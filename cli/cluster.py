"""`zmqflow cluster`: operator commands on a cluster spec (the logic is in jobs/cluster_check.py)."""

import json
import sys

import click

from zmqflow.common.processes.service_cli import curve_option, option
from zmqflow.common.errors import OpError
from zmqflow.jobs.cluster_check import check as check_cluster, healthy, spec_from_options, table

INVALID, DOWN = 2, 1


@click.group(name="cluster")
def cluster():
    """Cluster specs: check one before (or while) a job runs."""


@cluster.command(name="check", context_settings={"show_default": True})
@curve_option()
@click.option("--cluster", "cluster_file", default=None, type=click.Path(dir_okay=False),
              help="A YAML/JSON cluster spec (or a TF_CONFIG-shaped document).")
@click.option("--job", "job_flags", multiple=True, metavar="NAME=HOST:PORT[,...]", help="A job's tasks (repeat).")
@click.option("--ps", multiple=True, metavar="HOST:PORT[,...]", help="ps tasks, in order (repeat or comma-separated).")
@click.option("--worker", multiple=True, metavar="HOST:PORT[,...]", help="worker tasks.")
@click.option("--chief", multiple=True, metavar="HOST:PORT", help="The chief task.")
@click.option("--broker", multiple=True, metavar="HOST:PORT", help="The broker.")
@option("--timeout-secs", "timeout", old_names=["--timeout"],
        default=2.0, help="Seconds each ping may take (they run in parallel).")
@click.option("--ping-all", is_flag=True, help="Also ping worker/chief/reader tasks (they serve nothing here).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def check(cluster_file, job_flags, ps, worker, chief, broker, timeout, ping_all, as_json):
    """Validate a cluster spec (names, ports, duplicates) and ping every server in it.

    The spec comes from --cluster, from --job/--ps/--worker/--chief/--broker, or
    else from TF_CONFIG. Prints job, task, address, up/down and the round trip.
    Exit codes: 0 valid and every server answered; 1 a server is down; 2 the
    spec is invalid or missing.
    """
    shortcuts = {"ps": ps, "worker": worker, "chief": chief, "broker": broker}
    try:
        spec = spec_from_options(cluster_file, job_flags, shortcuts)
        if spec is None:
            raise click.UsageError("no cluster: give --cluster FILE, --job/--ps/--worker flags, or set TF_CONFIG")
        spec.validate(require_dense=True)
    except OpError as exc:
        _fail(as_json, f"{type(exc).__name__}: {exc}")
    rows = check_cluster(spec, timeout, ping_all)
    ok = healthy(rows)
    if as_json:
        click.echo(json.dumps({"valid": True, "healthy": ok, "tasks": rows}))
    else:
        click.echo(table(rows))
    sys.exit(0 if ok else DOWN)


def _fail(as_json, message):
    if as_json:
        click.echo(json.dumps({"valid": False, "healthy": False, "error": message, "tasks": []}))
    else:
        click.echo(f"invalid cluster spec: {message}", err=True)
    sys.exit(INVALID)
