"""The learning curve of a run: a worker hook writing (global step, loss) as JSON lines.

Worker hooks are built with no arguments (`--hook module:Class`), so the file comes from
the environment the sweep starts the worker with (ZMQFLOW_SWEEP_CURVE).
"""

import json
import os

from zmqflow.services.worker.hooks import Hook

CURVE_ENV = "ZMQFLOW_SWEEP_CURVE"
HOOK = "zmqflow.jobs.sweep.learning_curve:CurveHook"


class CurveHook(Hook):
    """Every step's loss, flushed every 20 steps and at the end (a failed run keeps its curve so far)."""

    def __init__(self):
        self.path = os.environ.get(CURVE_ENV)
        self._file = None

    def begin(self, trainer):
        if self.path:
            self._file = open(self.path, "w")

    def after_step(self, ctx):
        if self._file:
            self._file.write(json.dumps({"step": ctx.global_step, "loss": round(ctx.loss, 6)}) + "\n")
            if ctx.step % 20 == 0:
                self._file.flush()
        return False

    def end(self, trainer):
        if self._file:
            self._file.close()
            self._file = None


def read_curve(path):
    """[(step, loss), ...] from a curve file; [] if there is none."""
    points = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                    points.append((int(row["step"]), float(row["loss"])))
                except (ValueError, KeyError, TypeError):
                    break  # a torn last line of a killed worker
    except OSError:
        pass
    return points
