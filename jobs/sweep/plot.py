"""sweep.png: the validation score (accuracy, or RMSE) per run (bars, in rank order) beside the learning curves.

matplotlib is an optional extra (`pip install 'zmqflow[plot]'`): without it the sweep
still runs and `plot` returns None, so the caller can say the PNG was skipped.
"""

import os

from zmqflow.jobs.sweep.learning_curve import read_curve
from zmqflow.jobs.sweep.leaderboard import score


def plot(out_dir, ranked):
    """Write out_dir/sweep.png; returns its path, or None when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (bars, curves) = plt.subplots(1, 2, figsize=(12, 4.5))
    ok = [e for e in ranked if e["status"] == "ok"]
    colors = ["tab:green" if e.get("kept") else "tab:blue" for e in ok]
    metric = score(ok[0])[0] if ok else "accuracy"
    bars.bar([e["run_id"] for e in ok], [score(e)[1] for e in ok], color=colors)
    if ok and metric == "accuracy":
        low = min(score(e)[1] for e in ok)
        bars.set_ylim(max(0.0, low - 0.05), 1.0)
    bars.set_title(f"validation {metric} (green: checkpoint kept)")
    bars.tick_params(axis="x", labelrotation=60)
    for entry in ranked:
        points = read_curve(entry.get("curve_file") or "")
        if points:
            steps, losses = zip(*points)
            status = "" if entry["status"] == "ok" else f" ({entry['status']})"
            curves.plot(steps, losses, label=entry["run_id"] + status, linewidth=1)
    curves.set_xlabel("global step")
    curves.set_ylabel("training loss")
    curves.set_yscale("log")
    curves.set_title("learning curves")
    if curves.lines and len(curves.lines) <= 12:
        curves.legend(fontsize="small")
    fig.tight_layout()
    path = os.path.join(out_dir, "sweep.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
