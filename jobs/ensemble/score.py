"""An ensemble scored on a test split: each member asked directly, the aggregator with each combine
that suits the task (mean and vote for classifiers, mean and median for a regression)."""

import click

from zmqflow.common.clients.aggregator import AggregatorClient
from zmqflow.common.clients.serve import ModelClient
from zmqflow.inputs.metrics import PRIMARY, metrics
from zmqflow.jobs.evaluate import outputs_of

COMBINES = {"multiclass": ("mean", "vote"), "binary": ("mean", "vote"), "multi_label": ("mean",),
            "regression": ("mean", "median")}


def score(ensemble, x, y, deadline_ms, task="multiclass"):
    """Each member's test metrics (asked directly) and the ensemble's (through the aggregator) for
    `task`; `test_accuracy` and `ensemble` {combine: accuracy} for classifiers, as before."""
    metric, better = PRIMARY[task]
    members = []
    for run, proc in zip(ensemble.runs, ensemble.members):
        with ModelClient(proc.endpoint, timeout=30.0) as client:
            result = metrics(outputs_of(lambda b: client.predict(b)[0], x), y, task)
            members.append({"run_id": run["run_id"], "rank": run.get("rank"), "endpoint": proc.endpoint,
                            "model": client.model_info()["spec"]["type"],
                            "validation_accuracy": run.get("validation_accuracy"), "test_metrics": result,
                            "test_score": result[metric],
                            **({"test_accuracy": result["accuracy"]} if "accuracy" in result else {})})
    combined, combined_metrics = {}, {}
    with AggregatorClient(ensemble.aggregator.endpoint) as client:
        for combine in COMBINES[task]:
            outputs = outputs_of(lambda b: client.predict(b, deadline_ms=deadline_ms, min_members=len(members),
                                                          combine=combine)[0], x)
            combined_metrics[combine] = metrics(outputs, y, task)
            combined[combine] = combined_metrics[combine][metric]
    return {"task": task, "metric": metric, "members": members, "ensemble": combined,
            "ensemble_metrics": combined_metrics, "aggregator": ensemble.aggregator.endpoint,
            "verdict": verdict(combined["mean"], [m["test_score"] for m in members], metric, better is max)}


def verdict(ensemble_value, member_values, metric="accuracy", higher_is_better=True):
    """One line answering the seeds' exercise: does the ensemble beat its members (on `metric`)?"""
    best = max(member_values) if higher_is_better else min(member_values)
    gain = ensemble_value - best if higher_is_better else best - ensemble_value
    scale, unit = (100, " points") if metric == "accuracy" else (1, "")
    if gain > 0:
        return f"the ensemble beats its best member by {scale * gain:.{2 if scale == 100 else 4}f}{unit} of {metric}"
    if gain == 0:
        return "the ensemble ties its best member"
    return f"the ensemble trails its best member by {-scale * gain:.{2 if scale == 100 else 4}f}{unit} of {metric}"


def print_report(report):
    metric = report.get("metric", "accuracy")
    click.echo(f"{'member':<14} {'rank':>4} {'val acc':>8} {'test ' + metric:>13}  model")
    for m in report["members"]:
        rank = "-" if m["rank"] is None else m["rank"]
        val = "-" if m["validation_accuracy"] is None else f"{m['validation_accuracy']:.4f}"
        click.echo(f"{m['run_id']:<14} {rank:>4} {val:>8} {m['test_score']:>13.4f}  {m['model']}")
    for combine, value in report["ensemble"].items():
        click.echo(f"{'ensemble/' + combine:<14} {'':>4} {'':>8} {value:>13.4f}")
    click.echo(report["verdict"])
