"""One sweep end to end: split the data, train every run the feed gives, rank, keep the best k, write, plot."""

import os
import time

from tqdm import tqdm

from zmqflow.jobs.sweep import leaderboard
from zmqflow.jobs.sweep.data import sweep_split
from zmqflow.jobs.sweep.plot import plot
from zmqflow.jobs.sweep.runner import SweepRunner
from zmqflow.jobs.sweep.study import FIXED, PointFeed, StudyFeed, optuna_installed


def run_sweep(points, out_dir, parallel=1, keep_best=3, input="preloaded", backend="numba", run_timeout=300.0,
              validation_fraction=0.1, split_seed=0, progress=True, info=None, base_model=None, data=None,
              devices=None, sampler="grid", space=None, base=None, trials=None, pruner="none",
              pruner_startup_trials=5, validate_every_steps=None, seed=0, resume=False, settings=None):
    """Train `points` (from zmqflow.jobs.sweep.space; None for the tpe sampler, which asks Optuna for
    `trials` points of `space`) and write the results to out_dir; returns a summary. With Optuna
    installed the runs are an Optuna study in out_dir (resumable); a pruner or tpe needs it."""
    started = time.perf_counter()
    if data is None:
        train, validation = sweep_split(validation_fraction, split_seed)
    else:
        from zmqflow.jobs.sweep.data import data_spec_split
        train, validation = data_spec_split(data, validation_fraction, split_seed)
    batch_size = (base or {}).get("batch_size") or (points[0]["batch_size"] if points else 100)
    every_steps = validate_every_steps or max(1, len(train[1]) // batch_size)   # one epoch at --batch-size
    task = data.label.task if data is not None else "multiclass"
    if sampler not in FIXED or pruner not in (None, "none") or resume or optuna_installed():
        feed = StudyFeed(out_dir, settings or {}, space, base, sampler=sampler, points=points, trials=trials,
                         pruner=pruner, every_steps=every_steps, startup_trials=pruner_startup_trials,
                         direction="maximize" if leaderboard.higher_is_better(_metric(task)) else "minimize",
                         seed=seed, resume=resume)
    else:
        feed = PointFeed(points)
    runner = SweepRunner(out_dir, train, validation, parallel=parallel, input=input, backend=backend,
                         timeout=run_timeout, base_model=base_model, data=data, devices=devices,
                         every_steps=every_steps, resume=resume)
    earlier = feed.entries([]) if resume else []
    bar = tqdm(total=feed.total, initial=len(earlier), desc="sweep", unit="run", disable=not progress)
    best, counts = [None], {"failed": 0, "pruned": 0}
    for entry in earlier:
        _count(entry, best, counts)

    def on_done(entry):
        _count(entry, best, counts)
        metric, value, _ = leaderboard.score(best[0]) if best[0] else (None, None, None)
        bar.set_postfix_str((f"best {best[0]['run_id']} {metric} {value:.4f}" if best[0] else "no run done yet") +
                            "".join(f", {n} {what}" for what, n in counts.items() if n))
        bar.update(1)

    try:
        session = runner.run(feed, on_done)
    finally:
        bar.close()
    ranked = leaderboard.rank(feed.entries(session))
    kept = leaderboard.keep_best(ranked, keep_best)
    sweep_info = {**(info or {}), "runs": len(ranked), "parallel": runner.parallel, "input": input,
                  "backend": backend, "keep_best": keep_best, "validation_rows": len(validation[1]),
                  "train_rows": len(train[1]), "validation_fraction": validation_fraction, "split_seed": split_seed,
                  "devices": [d["name"] for d in runner.devices], "sampler": sampler, "pruner": pruner or "none",
                  "validate_every_steps": every_steps if feed.pruning else None,
                  "study": getattr(feed, "path", None), "resumed": bool(resume), "pruned": counts["pruned"],
                  "seconds": round(time.perf_counter() - started, 2)}
    json_path, csv_path = leaderboard.write(out_dir, ranked, sweep_info)
    png = plot(out_dir, ranked)
    return {"leaderboard_json": json_path, "leaderboard_csv": csv_path, "plot": png, "ranked": ranked,
            "kept": kept, "failed": counts["failed"], "pruned": counts["pruned"], "seconds": sweep_info["seconds"],
            "out_dir": os.path.abspath(out_dir)}


def _metric(task):
    from zmqflow.inputs.metrics import PRIMARY
    return PRIMARY[task][0]


def _count(entry, best, counts):
    if entry["status"] in counts:
        counts[entry["status"]] += 1
    elif best[0] is None or leaderboard.better(entry, best[0]):
        best[0] = entry
