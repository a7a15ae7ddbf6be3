"""Validation reported while a sweep's run trains, so that its pruner can stop a bad run early.

The run's chief validates every N global steps on the sweep's validation split (the rows that rank the
runs at the end) and reports the task's metric; the sweep (jobs/sweep/study.py) hands it to the run's
Optuna trial, asks the pruner, and answers. The report waits for that answer, as Ray Tune's and
Optuna's own `report` are synchronous: a run cannot train past the step its pruner stopped it at.
A pruned run's cluster is then stopped by the sweep, every process by PID (LocalCluster.stop).

Both sides talk through two JSON-lines files in the run's directory, named in the run's trial file
(ZMQFLOW_SWEEP_TRIAL): the chief appends {"step", "metrics"} to `reports`, the sweep appends
{"step", "prune"} to `decisions`. Worker hooks are built with no arguments (`--hook module:Class`),
hence the environment variable.
"""

import json
import logging
import os
import threading
import time

import numpy as np

from zmqflow.jobs.job_metrics import JsonLinesTail
from zmqflow.services.worker.hooks import Hook

log = logging.getLogger("worker")

TRIAL_ENV = "ZMQFLOW_SWEEP_TRIAL"
HOOK = "zmqflow.jobs.sweep.pruning:ReportHook"
DECISION_TIMEOUT = 120.0
"""Seconds a report waits for the sweep's answer; past it (a sweep that died) the run trains on."""


def write_validation(path, validation):
    """The sweep's validation split as an .npz a run's chief loads: `y`, and `x` or `x.NAME` per input."""
    x, y = validation
    arrays = {f"x.{k}": v for k, v in x.items()} if isinstance(x, dict) else {"x": x}
    np.savez(path, y=y, **arrays)


def read_validation(path):
    with np.load(path, allow_pickle=False) as f:
        x = f["x"] if "x" in f.files else {k[2:]: f[k] for k in f.files if k.startswith("x.")}
        return x, f["y"]


def write_trial_file(run_dir, validation_file, every_steps, task):
    """The run's trial file (what ReportHook reads) and the paths of its reports and decisions files."""
    trial = {"validation": validation_file, "every_steps": every_steps, "task": task,
             "reports": os.path.join(run_dir, "reports.jsonl"), "decisions": os.path.join(run_dir, "decisions.jsonl")}
    path = os.path.join(run_dir, "trial.json")
    with open(path, "w") as f:
        json.dump(trial, f)
    return path, trial


class ReportHook(Hook):
    """On the run's chief: every `every_steps` global steps, validate the parameters on the ps, report the
    metrics, and wait for the sweep's answer; after a prune answer it trains no more: the sweep stops the
    job's processes."""

    def __init__(self):
        path = os.environ.get(TRIAL_ENV)
        self.trial = None
        if path:
            with open(path) as f:
                self.trial = json.load(f)

    def begin(self, trainer):
        if not self.trial:
            return
        from zmqflow.common.clients.ps import PsClient
        self.x, self.y = read_validation(self.trial["validation"])
        self.every = int(self.trial["every_steps"])
        self._next = self.every
        self._ps = PsClient(trainer.ps.endpoints, trainer.ps.placement, name="sweep-validation")
        self._reports = open(self.trial["reports"], "a")
        self._decisions = JsonLinesTail(self.trial["decisions"])

    def after_step(self, ctx):
        if not self.trial or ctx.global_step < self._next:
            return False
        from zmqflow.inputs.metrics import metrics
        from zmqflow.services.worker.validation import predict_in_batches
        step = self._next                       # the scheduled step: every run reports at the same ones
        self._next = (ctx.global_step // self.every + 1) * self.every
        result = metrics(predict_in_batches(ctx.trainer.model, self._ps.pull(), self.x), self.y, self.trial["task"])
        self._reports.write(json.dumps({"step": step, "global_step": ctx.global_step,
                                        "metrics": {k: float(v) for k, v in result.items()}}) + "\n")
        self._reports.flush()
        if not self._decision(step):
            return False
        log.info("the sweep pruned this run at step %d; it stops this job's processes", step)
        time.sleep(DECISION_TIMEOUT)       # stopped meanwhile, by PID; past it (no sweep left) the loop ends
        return True

    def _decision(self, step):
        deadline = time.monotonic() + DECISION_TIMEOUT
        while time.monotonic() < deadline:
            for record in self._decisions.new_records():
                if record.get("step") == step:
                    return bool(record.get("prune"))
            time.sleep(0.01)
        log.warning("no answer from the sweep for the report at step %d in %g s: training on", step, DECISION_TIMEOUT)
        return False

    def end(self, trainer):
        if self.trial:
            self._reports.close()
            self._ps.close()


class ReportFollower:
    """The sweep's side of one run: reads its reports as they come, asks `decide(step, metrics)` (True:
    prune) and answers each one; on a prune, or when `stop` is set, sets `interrupt` (the run's cluster
    wait ends and stops every process)."""

    def __init__(self, trial, decide, interrupt, stop):
        self.trial, self.decide, self.interrupt, self.stop = trial, decide, interrupt, stop
        self.reports, self.pruned_at = [], None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="sweep-reports", daemon=True)

    def start(self):
        self._thread.start()

    def close(self):
        self._done.set()
        self._thread.join(timeout=30)

    def _follow(self):
        tail = JsonLinesTail(self.trial["reports"])
        with open(self.trial["decisions"], "a") as decisions:
            while not self._done.is_set():
                if self.stop.is_set():
                    self.interrupt.set()
                for record in tail.new_records():
                    self.reports.append(record)
                    prune = self.pruned_at is None and self._decide(record)
                    decisions.write(json.dumps({"step": record["step"], "prune": prune}) + "\n")
                    decisions.flush()
                    if prune:
                        self.pruned_at = record["step"]
                        self.interrupt.set()
                time.sleep(0.02)

    def _decide(self, record):
        try:
            return bool(self.decide(record["step"], record["metrics"]))
        except Exception as exc:   # the study's storage failing: the run trains on, the error is logged
            log.warning("the report at step %s could not be decided: %s: %s", record.get("step"),
                        type(exc).__name__, exc)
            return False
