"""A worker's Prometheus metrics (with --metrics-port): steps, examples, examples/s, global step, loss.

The trainer's own counters are read at scrape time; the hook only keeps the rate
over the last second or more and the last loss, so a step pays two compares.
"""

import time

from zmqflow.common import metrics
from zmqflow.services.worker.hooks import Hook


class MetricsHook(Hook):
    def __init__(self, task, window_s=1.0):
        self.task, self.window = task, window_s
        self.rate, self.loss = 0.0, None
        self._mark = None

    def begin(self, trainer):
        self._mark = (time.perf_counter(), trainer.examples)
        metrics.register(lambda: self.families(trainer))

    def after_step(self, ctx):
        self.loss = ctx.loss
        now = time.perf_counter()
        if now - self._mark[0] >= self.window:
            self.rate = (ctx.examples - self._mark[1]) / (now - self._mark[0])
            self._mark = (now, ctx.examples)
        return False

    def families(self, trainer):
        yield metrics.counter_family("zmqflow_worker_steps", "Training steps this worker ran.",
                                     {(self.task,): trainer.steps}, ["task"])
        yield metrics.counter_family("zmqflow_worker_examples", "Examples this worker trained on.",
                                     {(self.task,): trainer.examples}, ["task"])
        yield metrics.gauge_family("zmqflow_worker_examples_per_second", "Examples/s over the last second or more.",
                                   {(self.task,): self.rate}, ["task"])
        yield metrics.gauge_family("zmqflow_worker_global_step", "The global step this worker last saw.",
                                   {(self.task,): trainer.global_step}, ["task"])
        yield metrics.gauge_family("zmqflow_worker_loss", "Loss of the last step.",
                                   {(self.task,): self.loss}, ["task"])
