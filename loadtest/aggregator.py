"""Load test of a running aggregator: open-loop predicts at a target rate, optionally killing or
pausing one member half-way, then a table (and JSON) of failures and latency percentiles.
With --http URL the same load goes through the HTTP gateway instead (http_target.py).

    python -m zmqflow.loadtest.aggregator --address tcp://127.0.0.1:5800 --rate 500 --duration-secs 10 \\
        --kill-member 1 --at 0.5 --json-out load.json

Killing or pausing a member sends it a signal by the PID its `info` op reports, so it works
when the member runs on this host (as under `zmqflow up` or the demo).

Requests carry rows of a data file (`--data SPEC --split test`: the split's rows made into the
model's inputs as in training) or, by default, random rows in the input signature the first
member reports (its model_info schema), so any model can be load-tested.
"""

import json
import os
import signal
import sys
import time

import click
import numpy as np

from zmqflow.common.clients.aggregator import AggregatorClient
from zmqflow.common.processes.service_cli import curve_option, option
from zmqflow.common.errors import OpError
from zmqflow.common.rpc.probe import probe
from zmqflow.common.clients.serve import ModelClient
from zmqflow.loadtest import http_target
from zmqflow.loadtest.open_loop import run_open_loop


class MemberFault:
    """Kill (SIGKILL) or pause (SIGSTOP, SIGCONT after `pause_s`) one member at `at_s` seconds."""

    def __init__(self, address, action, at_s, pause_s=0.0):
        self.address, self.action, self.at_s, self.pause_s = address, action, at_s, pause_s
        with ModelClient(address, timeout=5.0, name="loadtest-fault") as client:
            self.pid = client.info()["pid"]
        self.state = "waiting"

    def __call__(self, elapsed, run):
        if self.state == "waiting" and elapsed >= self.at_s:
            os.kill(self.pid, signal.SIGKILL if self.action == "kill" else signal.SIGSTOP)
            self.state = "done" if self.action == "kill" else "paused"
            run.events.append((round(elapsed, 3), f"{self.action} member {self.address} (pid {self.pid})"))
        elif self.state == "paused" and elapsed >= self.at_s + self.pause_s:
            self.resume()
            run.events.append((round(elapsed, 3), f"resume member {self.address} (pid {self.pid})"))

    def resume(self):
        if self.state == "paused":
            os.kill(self.pid, signal.SIGCONT)
            self.state = "done"


class DataRequests:
    """Consecutive blocks of `rows` rows of a data spec's split, made into the model's inputs (cycling)."""

    def __init__(self, spec, split, rows):
        from zmqflow.inputs.data_spec import fit, load_spec, load_tables, model_inputs
        spec = load_spec(spec)
        tables = load_tables(spec)
        if split not in tables:
            raise click.BadParameter(f"the data spec has no {split!r} split (it has {', '.join(tables)})")
        fit(spec, tables["train"])
        self.x, self.total, self.rows, self.at = model_inputs(spec, tables[split]), len(tables[split]), rows, 0
        self.source = f"{split} split of {spec.name} ({self.total} rows)"

    def __call__(self):
        index = (self.at + np.arange(self.rows)) % self.total
        self.at = (self.at + self.rows) % self.total
        return {k: v[index] for k, v in self.x.items()} if isinstance(self.x, dict) else self.x[index]


class RandomRequests:
    """The same `rows` random rows every time, in the input signature of the aggregator's first member
    (784 floats, the shipped MNIST's, when no member says: none answers yet, or none is listed)."""

    def __init__(self, address, rows, seed=0):
        inputs = _member_inputs(address) or [{"name": "input", "shape": [784], "dtype": "float32"}]
        rng = np.random.default_rng(seed)
        arrays = {i["name"]: (rng.random((rows, *i["shape"]), dtype=np.float32) if i["dtype"].startswith("float")
                              else np.zeros((rows, *i["shape"]), dtype=i["dtype"])) for i in inputs}
        self.x = next(iter(arrays.values())) if len(arrays) == 1 else arrays
        self.source = "random rows of " + ", ".join(f"{i['name']} {i['shape']} {i['dtype']}" for i in inputs)

    def __call__(self):
        return self.x


def _member_inputs(address):
    """The input signature the aggregator's members report (asked through the aggregator, so the members' own
    addresses need not be reachable from here), or None (said on stderr) if none does."""
    try:
        with AggregatorClient(address, timeout=5.0, name="loadtest-schema") as agg:
            return agg.model_info()["schema"]["inputs"]
    except (OpError, KeyError) as exc:
        click.echo(f"loadtest: no member told its inputs ({exc}); sending rows of 784 floats", err=True)
        return None


def load_test(address, rate, duration, deadline_ms, min_members=None, rows=1, fault=None, seed=0, requests=None):
    """Run the load; returns the report dict (overall, and before / after the fault). `requests()` gives
    each request's inputs (default: RandomRequests in the first member's input signature)."""
    requests = requests or RandomRequests(address, rows, seed)
    client = AggregatorClient(address, name="loadtest")
    try:
        run = run_open_loop(lambda: client.predict_async(requests(), deadline_ms=deadline_ms, min_members=min_members),
                            client.rpc.poll, rate, duration, on_tick=fault)
    finally:
        if fault is not None:
            fault.resume()
        client.close()
    report = {"address": address, "rate": rate, "duration_s": duration, "deadline_ms": deadline_ms,
              "rows_per_request": rows, "requests_from": requests.source, "overall": run.summary(), "events": run.events,
              "partial_answers": sum(1 for o in run.outcomes if o.info and o.info.get("missing"))}
    if fault is not None:
        report["before_fault"] = run.summary(0.0, fault.at_s)
        report["after_fault"] = run.summary(fault.at_s, duration)
    return report


def print_table(report):
    phases = [p for p in ("before_fault", "after_fault", "overall") if p in report]
    click.echo(f"{'phase':<13} {'requests':>8} {'failed':>7} {'fail %':>7} {'shed':>6} {'qps':>7} {'p50 ms':>8} "
               f"{'p99 ms':>8} {'p99.9 ms':>9}")
    for phase in phases:
        s = report[phase]
        click.echo(f"{phase:<13} {s['requests']:>8} {s['failed']:>7} {100 * s['failed_share']:>6.2f}% {s['shed']:>6} "
                   f"{s['qps']:>7} {_ms(s['p50_ms']):>8} {_ms(s['p99_ms']):>8} {_ms(s['p999_ms']):>9}")
    for at, what in report["events"]:
        click.echo(f"  at {at:.2f} s: {what}")
    click.echo(f"answers without every member: {report['partial_answers']}; requests: {report['requests_from']}")
    if report["overall"]["shed"]:
        click.echo(f"shed (RESOURCE_EXHAUSTED: the aggregator was over capacity, not counted as failed): "
                   f"{report['overall']['shed']}")


def _ms(value):
    return "-" if value is None else f"{value:.2f}"


@click.command("loadtest")
@curve_option()
@click.option("--address", default=None, help="The aggregator's endpoint, e.g. tcp://127.0.0.1:5800.")
@click.option("--http", "http_url", default=None, metavar="URL",
              help="Drive the HTTP gateway at URL instead (e.g. http://127.0.0.1:8000): Open Inference Protocol infers "
                   "of --model with JSON tensors, random rows in the model's input signature (or --data's rows as "
                   "raw columns).")
@option("--model-name", "model", old_names=["--model"], default="ensemble", show_default=True,
        help="With --http: the model to load (the ensemble, or one member by its name).")
@click.option("--connections", default=16, show_default=True, type=click.IntRange(1),
              help="With --http: keep-alive connections (requests in flight at most; later ones queue, and their "
                   "latency counts from when they were due).")
@click.option("--rate", default=500.0, show_default=True, type=click.FloatRange(min=1),
              help="Requests per second, sent on schedule (open loop).")
@option("--duration-secs", "duration", old_names=["--duration"],
        default=10.0, show_default=True, type=click.FloatRange(min=0.1), help="Seconds of load.")
@click.option("--deadline-ms", default=50, show_default=True, type=click.IntRange(1), help="Deadline of each request.")
@click.option("--min-members", type=click.IntRange(1), default=None, help="Answers each request needs (default: the aggregator's).")
@click.option("--rows", default=1, show_default=True, type=click.IntRange(1), help="Input rows per request.")
@click.option("--kill-member", default=None,
              help="Kill this member (its address, or its index in the aggregator's member list) at --at.")
@click.option("--pause-member", default=None, help="Pause (SIGSTOP) this member at --at for --pause-secs, then resume it.")
@click.option("--at", "at_fraction", default=0.5, show_default=True, type=click.FloatRange(0, 1),
              help="When the fault happens, as a share of --duration-secs.")
@click.option("--pause-secs", default=2.0, show_default=True, type=click.FloatRange(min=0))
@click.option("--json-out", type=click.Path(dir_okay=False), default=None, help="Also write the report here as JSON.")
@click.option("--wait-secs", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="First wait up to this long for the aggregator to answer (e.g. while a deployment starts).")
@click.option("--max-failures", type=click.IntRange(0), default=None,
              help="Exit 1 when more requests than this failed (e.g. 0 in CI; shed requests are counted apart, "
                   "as shed). Default: always exit 0.")
@click.option("--data", "data_spec", default=None,
              help="Send the rows of this data spec's --split (made into the model's inputs as in training; with "
                   "--http, sent as the raw columns of a model trained on it) instead of random rows in the first "
                   "member's input signature.")
@click.option("--split", default="test", show_default=True, help="The split of --data whose rows are sent.")
def command(address, http_url, model, connections, rate, duration, deadline_ms, min_members, rows, kill_member,
            pause_member, at_fraction, pause_secs, json_out, wait_secs, max_failures, data_spec, split):
    """Open-loop load against a running aggregator (or, with --http, the HTTP gateway in front of one): failures,
    shed requests and latency p50/p99/p99.9."""
    if (address is None) == (http_url is None):
        raise click.UsageError("give one of --address ENDPOINT (the aggregator) or --http URL (the gateway)")
    if kill_member and pause_member:
        raise click.UsageError("--kill-member and --pause-member are exclusive")
    if http_url is not None:
        if kill_member or pause_member:
            raise click.UsageError("--kill-member and --pause-member go with --address only")
        report = _http_load(http_url, model, rate, duration, deadline_ms, min_members, rows, connections, wait_secs,
                            data_spec, split)
    else:
        if wait_secs:
            _wait_for(address, wait_secs)
        fault = None
        target = kill_member or pause_member
        if target is not None:
            fault = MemberFault(_member_address(address, target), "kill" if kill_member else "pause",
                                at_fraction * duration, pause_secs)
        requests = DataRequests(data_spec, split, rows) if data_spec else None
        report = load_test(address, rate, duration, deadline_ms, min_members, rows, fault, requests=requests)
    print_table(report)
    if json_out:
        with open(json_out, "w") as f:
            json.dump(report, f, indent=1)
        click.echo(f"report: {json_out}")
    failed = report["overall"]["failed"]
    if max_failures is not None and failed > max_failures:
        click.echo(f"loadtest: {failed} requests failed (at most {max_failures} allowed)", err=True)
        sys.exit(1)


def _http_load(url, model, rate, duration, deadline_ms, min_members, rows, connections, wait_secs, data_spec, split):
    """load_test_http's report; exit 1 with the reason when the gateway is not ready or cannot describe `model`,
    or when `model` takes no raw rows of `data_spec`."""
    if wait_secs:
        reason = http_target.wait_ready(url, wait_secs)
        if reason is not None:
            click.echo(f"loadtest: {url} was not ready within {wait_secs:g} s: {reason}", err=True)
            sys.exit(1)
    try:
        return http_target.load_test_http(url, model, rate, duration, deadline_ms, min_members, rows, connections,
                                          data_spec=data_spec, split=split)
    except OpError as exc:
        click.echo(f"loadtest: {url}: {exc}", err=True)
        sys.exit(1)


def _wait_for(address, limit):
    """Return once the aggregator answers a ping; exit 1 after `limit` seconds."""
    deadline = time.monotonic() + limit
    while True:
        answer = probe(address, timeout=min(2.0, max(0.1, deadline - time.monotonic())))
        if answer.up:
            return
        if time.monotonic() >= deadline:
            click.echo(f"loadtest: {address} did not answer within {limit:g} s: {answer.error}", err=True)
            sys.exit(1)
        time.sleep(0.5)


def _member_address(aggregator, target):
    if not target.isdigit():
        return target
    with AggregatorClient(aggregator, timeout=5.0) as client:
        members = client.members()
    index = int(target)
    if index >= len(members):
        raise click.BadParameter(f"the aggregator has {len(members)} members; no index {index}")
    return members[index]["address"]


def main():
    command()


if __name__ == "__main__":
    main()
