"""`zmqflow ensemble`: the best k models of a sweep served behind an aggregator, scored on the test split."""

import json
import os
import tempfile
import time

import click

from zmqflow.common.processes.service_cli import launcher_curve_option
from zmqflow.common.processes.task_options import trust_checkpoint_code_option
from zmqflow.jobs.evaluate import labelled_split
from zmqflow.jobs.ensemble.score import print_report, score
from zmqflow.jobs.ensemble.launch import Ensemble, best_runs, checkpoint_members

@click.command("ensemble")
@launcher_curve_option()
@click.option("--sweep", "leaderboard", default=None,
              help="A sweep's --out directory (or its leaderboard.json). Default: sweep-out, unless --checkpoint "
                   "names the members.")
@click.option("--top", default=3, show_default=True, type=click.IntRange(1),
              help="Serve the best TOP kept checkpoints of the sweep.")
@click.option("--checkpoint", "checkpoints", multiple=True, type=click.Path(file_okay=False, exists=True),
              help="A checkpoint directory to serve as a member too (repeatable), with the model it records: an "
                   "MLP, a CNN and a JAX model may answer together.")
@click.option("--deadline-ms", default=2000, show_default=True, type=click.IntRange(1),
              help="Deadline of each scoring request through the aggregator.")
@click.option("--log-dir", type=click.Path(file_okay=False), default=None,
              help="Where the servers' and the aggregator's logs go (default: a temporary directory).")
@click.option("--keep-serving", is_flag=True,
              help="After scoring, keep the servers and the aggregator up until Ctrl-C.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option("--data", "data_spec", default=None, metavar="SPEC",
              help="Score on this data spec's test split (a YAML file or `mnist`). Default: the spec the first "
                   "member's checkpoint records (trained with --data), else the shipped MNIST sample.")
@click.option("--split", default="test", show_default=True, type=click.Choice(["test", "validation", "train"]),
              help="Which split of the data to score on.")
@trust_checkpoint_code_option
def command(leaderboard, top, checkpoints, deadline_ms, log_dir, keep_serving, as_json, data_spec, split,
            trust_checkpoint_code):
    """Start model servers for the best TOP runs of a sweep (and any --checkpoint) and an aggregator
    over them, then report each member's test metrics next to the ensemble's (mean of probabilities
    and majority vote for classifiers, mean and median for a regression): does the ensemble beat
    its members?"""
    runs = best_runs(leaderboard, top) if leaderboard or not checkpoints else []
    runs += checkpoint_members(checkpoints, taken={run["run_id"] for run in runs})
    data, prepared = labelled_split(data_spec, split, runs[0]["checkpoint"])
    log_dir = log_dir or tempfile.mkdtemp(prefix="zmqflow-ensemble-")
    os.makedirs(log_dir, exist_ok=True)
    serve_args = ["--trust-checkpoint-code"] if trust_checkpoint_code else []
    with Ensemble(runs, log_dir=log_dir, serve_args=serve_args) as ensemble:
        report = score(ensemble, prepared.x, prepared.y, deadline_ms, task=data.label.task)
        if as_json:
            click.echo(json.dumps(report))
        else:
            print_report(report)
        if keep_serving:
            click.echo(f"aggregator at {report['aggregator']}; members "
                       f"{', '.join(m['endpoint'] for m in report['members'])}; Ctrl-C stops them", err=True)
            try:
                while all(p.alive() for p in [ensemble.aggregator, *ensemble.members]):
                    time.sleep(0.5)
            except KeyboardInterrupt:
                pass


def main():
    command()
