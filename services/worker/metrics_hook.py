"""A worker's Prometheus metrics (with --metrics-bind): steps, examples, global step, loss.

The trainer's own counters are read at scrape time and exported as counters, so
examples/s is PromQL's `rate(zmqflow_worker_examples_total[1m])` over any window
rather than a rate fixed here; the hook only keeps the last loss, so a step pays one store.
"""

from zmqflow.common.processes import metrics
from zmqflow.services.worker.hooks import Hook


class MetricsHook(Hook):
    def __init__(self, task):
        self.task, self.loss = task, None

    def begin(self, trainer):
        metrics.set_task(self.task, "worker")   # the `task` label of every zmqflow_* family of this process
        metrics.register(lambda: self.families(trainer))

    def after_step(self, ctx):
        self.loss = ctx.loss
        return False

    def families(self, trainer):
        yield metrics.counter_family("zmqflow_worker_steps", "Training steps this worker ran.", trainer.steps)
        yield metrics.counter_family("zmqflow_worker_examples", "Examples this worker trained on.", trainer.examples)
        yield metrics.gauge_family("zmqflow_worker_global_step", "The global step this worker last saw.",
                                   trainer.global_step)
        yield metrics.gauge_family("zmqflow_worker_loss", "Loss of the last step.", self.loss)
