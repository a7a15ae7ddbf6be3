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
            members.append({"run_id": run["run_id"], "rank": run.get("rank"), "endpoint": proc.endpoint,
                            "model": client.model_info()["spec"]["type"],
                            "validation_accuracy": run.get("validation_accuracy"),
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
    click.echo(f"{'member':<14} {'rank':>4} {'val acc':>8} {'test acc':>9}  model")
    for m in report["members"]:
        rank = "-" if m["rank"] is None else m["rank"]
        val = "-" if m["validation_accuracy"] is None else f"{m['validation_accuracy']:.4f}"
        click.echo(f"{m['run_id']:<14} {rank:>4} {val:>8} {m['test_accuracy']:>9.4f}  {m['model']}")
    for combine, acc in report["ensemble"].items():
        click.echo(f"{'ensemble/' + combine:<14} {'':>4} {'':>8} {acc:>9.4f}")
    click.echo(report["verdict"])
