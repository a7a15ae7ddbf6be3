"""SummaryHook: a worker's step, loss and examples/s as JSON lines and/or TensorBoard scalars (TF's
SummarySaverHook), with what other hooks report (validation) added as records.

The JSON lines are what a running job's metrics are read from (jobs/job_metrics.py); the TensorBoard
events are services/worker/tensorboard.py's.
"""

import json
import threading
import time

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.services.worker.hooks import Hook
from zmqflow.services.worker.tensorboard import TensorBoardHook


class SummaryHook(Hook):
    """Every N steps the step, loss and examples/s, as one JSON line into `path` and/or as TensorBoard
    scalars into `output_dir` (TF's SummarySaverHook); `record()` adds other results (validation).
    The JSON lines are what a running job's metrics are read from (jobs/job.py)."""

    def __init__(self, path=None, every_n_steps=50, output_dir=None):
        if path is None and output_dir is None:
            raise InvalidArgumentError("SummaryHook needs a path (JSON lines) or an output_dir (TensorBoard)")
        self.path, self.every = path, max(1, int(every_n_steps))
        self.tensorboard = None
        if output_dir is not None:
            self.tensorboard = TensorBoardHook(output_dir, every_n_steps)
        self._file = None
        self._lock = threading.Lock()   # validation records come from a thread of their own

    def begin(self, trainer):
        if self.path:
            self._file = open(self.path, "a")
        if self.tensorboard:
            self.tensorboard.begin(trainer)

    def after_step(self, ctx):
        if ctx.step % self.every == 0:
            rate = ctx.examples / ctx.elapsed if ctx.elapsed else 0.0
            self._write({"step": ctx.global_step, "loss": ctx.loss, "examples_per_s": rate, "time": time.time()})
        if self.tensorboard:
            self.tensorboard.after_step(ctx)
        return False

    def record(self, record):
        """One more result, e.g. {"step": 200, "validation": {"accuracy": 0.93}}: a JSON line, and each
        number nested in it a TensorBoard scalar ("validation/accuracy"); also after the end."""
        self._write({**record, "time": time.time()})
        if self.tensorboard:
            for tag, value in _scalars(record):
                self.tensorboard.add_scalar(tag, value, record.get("step", 0))

    def _write(self, record):
        if not self.path:
            return
        with self._lock:
            if self._file is None:
                with open(self.path, "a") as f:
                    f.write(json.dumps(record) + "\n")
            else:
                self._file.write(json.dumps(record) + "\n")
                self._file.flush()

    def end(self, trainer):
        if self.tensorboard:
            self.tensorboard.end(trainer)
        with self._lock:
            if self._file:
                self._file.close()
                self._file = None

    def close(self):
        """Every TensorBoard event on disk (its writer queues them): once no hook adds more."""
        if self.tensorboard:
            self.tensorboard.close()


def _scalars(record, prefix=""):
    """(tag, number) of every number nested in a record, but its step and time."""
    for key, value in record.items():
        if isinstance(value, dict):
            yield from _scalars(value, f"{prefix}{key}/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("step", "time"):
            yield prefix + key, value
