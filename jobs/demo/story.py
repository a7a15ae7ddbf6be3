"""The whole story of `make demo`, on this machine, in a few minutes on 2 cores.

1. train the 784-100-10 MLP on MNIST with a broker, reader processes, 2 ps shards and 2
   workers (a progress bar), checkpointing as it goes;
2. sweep a few hyperparameter settings, one small run per worker slot, each in its own
   container, and keep the best three checkpoints;
3. serve them as an ensemble: three model servers behind an aggregator, and score each
   member and the ensemble on the test split;
4. run an open-loop load test against the aggregator and kill one member half-way;
5. print a summary: test accuracy of each model and of the ensemble, examples/s, QPS,
   latency percentiles and timeouts.
"""

import os
import tempfile

import click

from zmqflow.common.clients.aggregator import AggregatorClient
from zmqflow.inputs.datasets import mnist_split
from zmqflow.loadtest.aggregator import MemberFault, load_test, print_table
from zmqflow.jobs.ensemble.score import print_report, score
from zmqflow.jobs.ensemble.launch import Ensemble, best_runs
from zmqflow.jobs.sweep.space import grid, parse_grid
from zmqflow.jobs.sweep.sweep import run_sweep
from zmqflow.jobs.local_cluster import run_training

SWEEP_GRID = "lr=0.002,0.01;hidden=64,128"


def heading(text):
    click.echo(click.style(f"\n== {text}", bold=True))


def run_story(work_dir=None, epochs=10, sweep_epochs=3, load_rate=300.0, load_seconds=4.0, deadline_ms=50):
    work_dir = work_dir or tempfile.mkdtemp(prefix="zmqflow-demo-")
    click.echo(f"working directory: {work_dir}")
    summary = {}

    heading(f"1. distributed training: broker + reader + 2 ps shards + 2 workers, {epochs} epochs")
    ckpt, logs = os.path.join(work_dir, "train-ckpt"), os.path.join(work_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    trained = run_training(progress=True, num_ps=2, num_workers=2, epochs=epochs, checkpoint_dir=ckpt,
                           checkpoint_every_steps=150, log_dir=logs)
    click.echo(f"test accuracy {trained['test_accuracy']:.4f}, {trained['examples_per_s']:,} examples/s, global step "
               f"{trained['global_step']}, checkpoints in {ckpt}, worker exit codes {trained['worker_exit_codes']}")
    summary["training"] = {"test_accuracy": trained["test_accuracy"], "examples_per_s": trained["examples_per_s"]}

    heading(f"2. sweep: {SWEEP_GRID} ({sweep_epochs} epochs each, one run per worker slot)")
    points = grid(parse_grid(SWEEP_GRID), {"epochs": sweep_epochs, "batch_size": 100})
    swept = run_sweep(points, os.path.join(work_dir, "sweep"), parallel=max(1, os.cpu_count() or 1), keep_best=3)
    for e in swept["ranked"]:
        status = f"val {e['validation_accuracy']:.4f}" if e["status"] == "ok" else f"failed: {e.get('error')}"
        click.echo(f"  {e['rank'] or '-'}  {e['run_id']}  {status}  {e['hyperparameters']}")
    click.echo(f"leaderboard {swept['leaderboard_json']}" + (f", plot {swept['plot']}" if swept["plot"] else ""))

    heading("3. an ensemble of the best three: 3 model servers behind an aggregator")
    _, (x, y) = mnist_split()
    with Ensemble(best_runs(swept["out_dir"], 3), log_dir=logs) as ensemble:
        report = score(ensemble, x, y, deadline_ms=2000)
        print_report(report)

        heading(f"4. load test: {load_rate:.0f} requests/s open loop for {load_seconds:.0f} s, deadline "
                f"{deadline_ms} ms, one member killed half-way")
        fault = MemberFault(ensemble.members[-1].endpoint, "kill", load_seconds / 2)
        load = load_test(ensemble.aggregator.endpoint, load_rate, load_seconds, deadline_ms, fault=fault)
        print_table(load)
        with AggregatorClient(ensemble.aggregator.endpoint) as client:
            aggregator_stats = client.stats()

    heading("5. summary")
    rows = [(m["run_id"], m["test_accuracy"]) for m in report["members"]]
    rows += [(f"ensemble ({combine})", acc) for combine, acc in report["ensemble"].items()]
    rows.insert(0, ("trained (2 ps, 2 workers)", trained["test_accuracy"]))
    for name, acc in rows:
        click.echo(f"  {name:<28} test accuracy {acc:.4f}")
    overall = load["overall"]
    click.echo(f"  training: {trained['examples_per_s']:,} examples/s; sweep: {len(points)} runs in "
               f"{swept['seconds']:.1f} s")
    click.echo(f"  serving: {overall['qps']:.0f} QPS answered, p50 {overall['p50_ms']} ms, p99 {overall['p99_ms']} ms, "
               f"p99.9 {overall['p999_ms']} ms, {overall['failed']} failed of {overall['requests']}, "
               f"{load['partial_answers']} answered without every member")
    click.echo(f"  members at the aggregator: {_member_states(aggregator_stats)}")
    click.echo(f"  {report['verdict']}")
    return {**summary, "ensemble": report, "load": load, "aggregator_stats": aggregator_stats}


def _member_states(stats):
    """Each member's health (and why it was lost) with its timeouts and errors."""
    states = []
    for m in stats["members"]:
        health = "healthy" if m["healthy"] else f"unhealthy ({m['last_failure']})"
        states.append(f"{m['address']} {health}, {m['timeouts']} timeouts, {m['errors']} errors")
    return "; ".join(states)
