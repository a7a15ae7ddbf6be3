"""The chief's validation while training: every N steps, the current parameters on the data spec's
validation split, with the task's metrics logged (and to TensorBoard), and the best parameters
kept as a checkpoint in CHECKPOINT_DIR/best beside the latest ones.

The chief reads the validation split itself (from the data spec its --data-config records); a
thread of its own follows the global step on ps 0, pulls the parameters and predicts, so nobody
stops training for it, and validation keeps its schedule even when the chief gets few batches.
"""

import logging
import os
import threading
import time

import numpy as np

from zmqflow.common.errors import FailedPreconditionError
from zmqflow.inputs.data_spec import fit, from_config, load_spec, load_tables, prepare
from zmqflow.inputs.metrics import metrics, monitored
from zmqflow.services.worker.hooks import Hook

log = logging.getLogger("worker")


class ValidationHook(Hook):
    """`data`: a data spec with a validation split (a YAML path, a dict or a DataSpec, fitted on its train
    split here if it is not yet), or the config a job records (inputs/data_spec.py's to_config);
    `summaries`: a SummaryHook that gets each validation as a record."""

    def __init__(self, data, every_steps=100, checkpoint_dir=None, tensorboard=None, batch_size=1000,
                 early_stop_patience=None, summaries=None, every_secs=None, monitor=None):
        spec = _fitted_spec(data)
        tables = load_tables(spec)
        if "validation" not in tables:
            raise FailedPreconditionError("the data spec has no validation split: give files.validation or "
                                          "split.validation")
        self.validation = prepare(spec, tables["validation"])
        self.task = spec.label.task
        self.every_steps, self.every_secs = every_steps, every_secs   # whichever comes first (None: not by it)
        self.checkpoint_dir, self.tensorboard = checkpoint_dir, tensorboard
        self.summaries = summaries
        self.batch_size = batch_size
        self.metric, self.better = monitored(self.task, monitor)
        self.history, self.best = [], None
        self.patience, self.stopped_early = early_stop_patience, None
        self._last, self._last_at = 0, time.monotonic()

    def begin(self, trainer):
        """Follow the global step from a thread of its own, with its own ps client: validation runs on
        schedule whether or not the chief itself is training (other workers may take every batch)."""
        from zmqflow.common.processes import metrics as prometheus
        prometheus.register(self.families)          # served with --metrics-bind
        self._trainer, self._stop = trainer, threading.Event()
        self._thread = threading.Thread(target=self._follow, name="validation", daemon=True)
        self._thread.start()

    def _follow(self):
        from zmqflow.common.clients.ps import PsClient
        ps = PsClient(self._trainer.ps.endpoints, self._trainer.ps.placement, name="validation")   # this thread's
        try:
            while not self._stop.wait(0.2):
                try:
                    step = ps.stats()[0]["version"]
                    if self._due(step):
                        self.validate(ps, self._trainer.model, step)
                except Exception as exc:      # a shard restarting: try again at the next tick
                    log.warning("validation skipped: %s: %s", type(exc).__name__, exc)
            step = ps.stats()[0]["version"]
            if not self.history or step != self._last:
                self.validate(ps, self._trainer.model, step)     # the final parameters
        finally:
            ps.close()

    def _due(self, step):
        """A validation is due every `every_steps` global steps or `every_secs` seconds, whichever first
        (never twice at one step)."""
        if step == self._last:
            return False
        by_steps = self.every_steps is not None and step - self._last >= self.every_steps
        return by_steps or (self.every_secs is not None and time.monotonic() - self._last_at >= self.every_secs)

    def end(self, trainer):
        self._stop.set()
        self._thread.join(timeout=120)

    def validate(self, ps, model, step, trainer=None):
        self._last, self._last_at = step, time.monotonic()
        started = time.perf_counter()
        params = ps.pull()
        result = metrics(predict_in_batches(model, params, self.validation.x, self.batch_size), self.validation.y,
                         self.task)
        self.history.append({"step": step, **result})
        log.info("validation at step %d: %s (%.0f ms)", step, ", ".join(f"{k} {v:.4f}" for k, v in result.items()),
                 (time.perf_counter() - started) * 1000)
        if self.tensorboard is not None:
            for name, value in result.items():
                self.tensorboard.add_scalar(f"validation/{name}", value, step)
        if self.summaries is not None:
            self.summaries.record({"step": step, "validation": result})
        value = result[self.metric]
        if self.best is None or self.better(value, self.best[self.metric]) != self.best[self.metric]:
            self.best = {"step": step, **result}
            self._save_best(params, step)
        elif self.patience and self.stopped_early is None and len(
                [h for h in self.history if h["step"] > self.best["step"]]) >= self.patience:
            self._stop_early(step)

    def _stop_early(self, step):
        """No better validation for `patience` validations: end the job as TF's coordinator would, by
        closing the workers' input queue with cancel; every worker ends on OutOfRange and the chief
        saves and finishes as at the end of the input."""
        self.stopped_early = step
        log.info("early stop at step %d: %s has not improved on %.4f (step %d) for %d validations", step,
                 self.metric, self.best[self.metric], self.best["step"], self.patience)
        training_input = getattr(self._trainer, "input", None)
        if training_input is not None:
            training_input.end_for_every_worker()

    def _save_best(self, params, step):
        """The very parameters just validated (training went on meanwhile), as a one-shard checkpoint
        without optimizer slots: it serves, evaluates, and restores onto any number of shards."""
        if not self.checkpoint_dir:
            return
        from zmqflow.common.checkpoints import checkpoint
        directory = os.path.join(self.checkpoint_dir, "best")
        checkpoint.save_params(directory, step, params, self._trainer.resolved_config(), keep=1)

    def families(self):
        return validation_families(self.history)

    def summary(self):
        return {"validation": self.history[-1] if self.history else None, "best_validation": self.best,
                "validation_metric": self.metric, "stopped_early_at": self.stopped_early}


def predict_in_batches(model, params, x, batch_size=1000):
    """The model's outputs on every row of `x` (an array, or {input name: array}), `batch_size` rows at a time."""
    rows = len(next(iter(x.values()))) if isinstance(x, dict) else len(x)
    part = (lambda i: {k: v[i:i + batch_size] for k, v in x.items()}) if isinstance(x, dict) else (
        lambda i: x[i:i + batch_size])
    return np.concatenate([model.predict(params, part(i)) for i in range(0, rows, batch_size)])


def _fitted_spec(data):
    """A DataSpec with its train-split statistics, from a recorded config or any spec `load_spec` takes."""
    if isinstance(data, dict) and "spec" in data and "stats" in data:
        return from_config(data)
    spec = load_spec(data)
    if spec.stats is None:
        fit(spec, load_tables(spec)["train"])
    return spec


def validation_families(history):
    """Prometheus gauges of the last validation in `history`: each metric, and the global step it was
    taken at (the `task` label comes from common/processes/metrics.py)."""
    from zmqflow.common.processes import metrics as prometheus
    last = history[-1] if history else {}
    yield prometheus.gauge_family("zmqflow_validation_metric", "The last validation's metrics, by name.",
                                  {(k,): v for k, v in last.items() if k != "step"}, ["metric"])
    yield prometheus.gauge_family("zmqflow_validation_global_step", "Global step of the last validation.",
                                  last.get("step", 0))
