"""The sweep's leaderboard: rank the runs, keep the best k checkpoints, write JSON and CSV.

leaderboard.json is what `zmqflow ensemble` reads: its `best` list names the kept
checkpoint directories in rank order, each with the model spec a server needs
(also in DIR/model.json, so `zmqflow serve --checkpoint DIR --model DIR/model.json` works).
"""

import csv
import json
import os
import shutil

from zmqflow.inputs.metrics import PRIMARY
from zmqflow.jobs.sweep.space import DEFAULTS

CSV_COLUMNS = ["rank", "run_id", "status", *DEFAULTS, "validation_metric", "validation_score", "validation_accuracy",
               "test_accuracy", "final_loss", "examples_per_s", "seconds", "checkpoint", "error",
               "pruned_at_step", "best_step", "best_value", "device", "trial"]


def score(entry):
    """(metric, value, higher is better) a run is ranked by: its validation score (accuracy, or RMSE
    for a regression), or the validation accuracy of an entry that has no score."""
    metric = entry.get("validation_metric", "accuracy")
    value = entry.get("validation_score", entry.get("validation_accuracy"))
    return metric, value, higher_is_better(metric)


def higher_is_better(metric):
    return PRIMARY.get(_task_of(metric), ("accuracy", max))[1] is max


def better(a, b):
    """True when run `a` scores better than run `b` on validation."""
    _, value_a, higher = score(a)
    value_b = score(b)[1]
    return value_a > value_b if higher else value_a < value_b


def _task_of(metric):
    return next((task for task, (name, _) in PRIMARY.items() if name == metric), "multiclass")


def rank(entries):
    """Finished runs by validation score, best first (higher accuracy, lower RMSE; then lower final
    loss, then run id), numbered from 1; then the pruned runs without a rank (the later pruned first,
    then by the best validation they reported), then the failed ones."""
    def key(e):
        _, value, higher = score(e)
        return (-value if higher else value, _loss(e), e["run_id"])

    def pruned_key(e):
        best = e.get("best_value")
        best = float("inf") if best is None else -best if higher_is_better(e["validation_metric"]) else best
        return (-(e.get("pruned_at_step") or 0), best, e["run_id"])

    ok = sorted((e for e in entries if e["status"] == "ok"), key=key)
    pruned = sorted((e for e in entries if e["status"] == "pruned"), key=pruned_key)
    failed = sorted((e for e in entries if e["status"] not in ("ok", "pruned")), key=lambda e: e["run_id"])
    for i, entry in enumerate(ok):
        entry["rank"] = i + 1
    for entry in pruned + failed:
        entry["rank"] = None
    return ok + pruned + failed


def _loss(entry):
    loss = entry.get("final_loss")
    return float("inf") if loss is None else loss


def keep_best(ranked, k):
    """Delete the checkpoints of every finished run but the first k; returns the kept entries."""
    kept = []
    for entry in ranked:
        if entry["status"] != "ok":
            entry["kept"] = False
            continue
        entry["kept"] = len(kept) < k
        if entry["kept"]:
            kept.append(entry)
        else:
            shutil.rmtree(entry["checkpoint"], ignore_errors=True)
            entry["checkpoint"] = entry["model_file"] = None
    return kept


def write(out_dir, ranked, sweep_info):
    """leaderboard.json and leaderboard.csv in out_dir; returns their paths."""
    kept = [e for e in ranked if e.get("kept")]
    document = {"sweep": sweep_info, "runs": ranked,
                "best": [{"rank": e["rank"], "run_id": e["run_id"], "checkpoint": e["checkpoint"],
                          "model_file": e["model_file"], "model": e["model"],
                          "validation_accuracy": e["validation_accuracy"], "validation_metric": score(e)[0],
                          "validation_score": score(e)[1]} for e in kept]}
    json_path, csv_path = os.path.join(out_dir, "leaderboard.json"), os.path.join(out_dir, "leaderboard.csv")
    _atomic(json_path, json.dumps(document, indent=1))
    with open(csv_path + ".tmp", "w", newline="") as f:
        writer = csv.DictWriter(f, CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for entry in ranked:
            writer.writerow(_csv_row(entry))
    os.replace(csv_path + ".tmp", csv_path)
    return json_path, csv_path


def _csv_row(entry):
    row = {k: v for k, v in entry.items() if k in CSV_COLUMNS}
    for key, value in entry["hyperparameters"].items():
        row[key] = "x".join(map(str, value)) if key == "hidden" else value
    return {k: "" if v is None else v for k, v in row.items()}


def _atomic(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
