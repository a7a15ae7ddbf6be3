"""One sweep end to end: split the data, train every point, rank, keep the best k, write, plot."""

import os
import time

from tqdm import tqdm

from zmqflow.jobs.sweep import leaderboard
from zmqflow.jobs.sweep.data import sweep_split
from zmqflow.jobs.sweep.plot import plot
from zmqflow.jobs.sweep.runner import SweepRunner


def run_sweep(points, out_dir, parallel=1, keep_best=3, input="preloaded", backend="numba", run_timeout=300.0,
              validation_fraction=0.1, split_seed=0, progress=True, info=None, base_model=None, data=None):
    """Train `points` (from zmqflow.jobs.sweep.space) and write the results to out_dir; returns a summary."""
    started = time.perf_counter()
    if data is None:
        train, validation = sweep_split(validation_fraction, split_seed)
    else:
        from zmqflow.jobs.sweep.data import data_spec_split
        train, validation = data_spec_split(data, validation_fraction, split_seed)
    runner = SweepRunner(out_dir, train, validation, parallel=parallel, input=input, backend=backend,
                         timeout=run_timeout, base_model=base_model, data=data)
    bar = tqdm(total=len(points), desc="sweep", unit="run", disable=not progress)
    best, failed = [None], [0]

    def on_done(entry):
        if entry["status"] != "ok":
            failed[0] += 1
        elif best[0] is None or leaderboard.better(entry, best[0]):
            best[0] = entry
        metric, value, _ = leaderboard.score(best[0]) if best[0] else (None, None, None)
        bar.set_postfix_str((f"best {best[0]['run_id']} {metric} {value:.4f}" if best[0] else
                             "no run done yet") + (f", {failed[0]} failed" if failed[0] else ""))
        bar.update(1)

    try:
        entries = runner.run(points, on_done)
    finally:
        bar.close()
    ranked = leaderboard.rank(entries)
    kept = leaderboard.keep_best(ranked, keep_best)
    sweep_info = {**(info or {}), "runs": len(points), "parallel": runner.parallel, "input": input,
                  "backend": backend, "keep_best": keep_best, "validation_rows": len(validation[1]),
                  "train_rows": len(train[1]), "validation_fraction": validation_fraction, "split_seed": split_seed,
                  "seconds": round(time.perf_counter() - started, 2)}
    json_path, csv_path = leaderboard.write(out_dir, ranked, sweep_info)
    png = plot(out_dir, ranked)
    return {"leaderboard_json": json_path, "leaderboard_csv": csv_path, "plot": png, "ranked": ranked,
            "kept": kept, "failed": failed[0], "seconds": sweep_info["seconds"], "out_dir": os.path.abspath(out_dir)}
