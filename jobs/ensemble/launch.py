"""Start model servers over a sweep's kept checkpoints (or any checkpoints) and an aggregator over them.

`Ensemble` owns the processes (stopped by PID on exit, also when something fails): one
`zmqflow.services.serve` per member, then one `zmqflow.services.aggregator` that fans out to all of them.
"""

import json
import os

from zmqflow.common.errors import NotFoundError
from zmqflow.common.processes.children import compute_thread_env
from zmqflow.common.processes.supervisor import Supervisor


def best_runs(leaderboard, top):
    """The `top` best kept runs of a sweep's leaderboard.json (a file or the sweep's out dir)."""
    path = os.path.join(leaderboard, "leaderboard.json") if os.path.isdir(leaderboard) else leaderboard
    if not os.path.exists(path):
        raise NotFoundError(f"no leaderboard at {path!r}: run `zmqflow sweep --out DIR` first")
    with open(path) as f:
        best = json.load(f).get("best", [])
    if not best:
        raise NotFoundError(f"{path} keeps no checkpoint (did every run fail, or was --keep-best 0?)")
    return best[:top]


def checkpoint_members(directories, taken=()):
    """Members from checkpoint directories, each served with the model its checkpoint records; named
    by the directory (made unique against `taken` and each other)."""
    from zmqflow.common.checkpoints.checkpoint import latest_checkpoint
    members, names = [], set(taken)
    for directory in directories:
        if not latest_checkpoint(directory):
            raise NotFoundError(f"no checkpoint in {directory!r}: train with --checkpoint-dir first")
        name = base = os.path.basename(os.path.normpath(directory)) or "member"
        k = 1
        while name in names:
            k += 1
            name = f"{base}-{k}"
        names.add(name)
        members.append({"run_id": name, "checkpoint": directory, "model_file": None})
    return members


class Ensemble:
    """Model servers for `runs` (entries of the leaderboard's `best`) and an aggregator over them."""

    def __init__(self, runs, log_dir=None, deadline_ms=1000, min_members=1, combine="mean", serve_args=(),
                 aggregator_args=()):
        self.runs, self.log_dir = runs, log_dir
        self.options = (deadline_ms, min_members, combine, tuple(serve_args), tuple(aggregator_args))
        self.members, self.aggregator = [], None
        self.supervisor = Supervisor(log_dir=log_dir)

    def start(self):
        deadline_ms, min_members, combine, serve_args, aggregator_args = self.options
        share = compute_thread_env(max(1, (os.cpu_count() or 1) // max(1, len(self.runs))))  # servers side by side
        try:
            for run in self.runs:
                self.members.append(self.supervisor.start_service(
                    "zmqflow.services.serve", ["--checkpoint", run["checkpoint"], "--model-name", run["run_id"],
                                               *(["--model", run["model_file"]] if run.get("model_file") else []),
                                               *serve_args], name=run["run_id"], env=share))
            member_args = [arg for m in self.members for arg in ("--member", m.endpoint)]
            self.aggregator = self.supervisor.start_service(
                "zmqflow.services.aggregator", [*member_args, "--deadline-ms", str(deadline_ms), "--min-members",
                                                str(min_members), "--combine", combine, *aggregator_args],
                name="aggregator")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        self.supervisor.stop_all()   # the aggregator (started last) first

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
