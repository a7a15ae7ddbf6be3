"""An ensemble scored on the test split: each member asked directly, the aggregator with each combine."""

import click

from zmqflow.common.aggregator_client import AggregatorClient
from zmqflow.common.serve_client import ModelClient
from zmqflow.jobs.ensemble.evaluate import accuracy, verdict


COMBINES = ("mean", "vote")


def score(ensemble, x, y, deadline_ms):
    """Test accuracy of each member (asked directly) and of the ensemble (through the aggregator)."""
    members = []
    for run, proc in zip(ensemble.runs, ensemble.members):
        with ModelClient(proc.endpoint, timeout=30.0) as client:
            members.append({"run_id": run["run_id"], "rank": run["rank"], "endpoint": proc.endpoint,
                            "validation_accuracy": run["validation_accuracy"],
                            "test_accuracy": accuracy(lambda b: client.predict(b)[0], x, y)})
    combined = {}
    with AggregatorClient(ensemble.aggregator.endpoint) as client:
        for combine in COMBINES:
            combined[combine] = accuracy(
                lambda b: client.predict(b, deadline_ms=deadline_ms, min_members=len(members), combine=combine)[0],
                x, y)
    return {"members": members, "ensemble": combined, "aggregator": ensemble.aggregator.endpoint,
            "verdict": verdict(combined["mean"], [m["test_accuracy"] for m in members])}


def print_report(report):
    click.echo(f"{'model':<14} {'rank':>4} {'val acc':>8} {'test acc':>9}")
    for m in report["members"]:
        click.echo(f"{m['run_id']:<14} {m['rank']:>4} {m['validation_accuracy']:>8.4f} {m['test_accuracy']:>9.4f}")
    for combine, acc in report["ensemble"].items():
        click.echo(f"{'ensemble/' + combine:<14} {'':>4} {'':>8} {acc:>9.4f}")
    click.echo(report["verdict"])
