"""The chief's TensorBoard event files: loss, examples/s, steps/s, staleness and accuracy.

Written with tensorboardX (event files TensorBoard reads: TFRecord-framed Event
protobufs) every `every_n_steps` local steps and at the end, tagged with the global
step. Staleness is the mean staleness of the pushes ps shard 0 received since the
last write (from its `stats`), so it costs one small RPC per write, not per step.
`add_scalar` lets the chief add what it learns after training (test accuracy).
"""

import logging
import time

from zmqflow.common.errors import OpError
from zmqflow.services.worker.hooks import Hook

log = logging.getLogger("worker")


class TensorBoardHook(Hook):
    def __init__(self, logdir, every_n_steps=50):
        from tensorboardX import SummaryWriter   # here, before the chief readies the ps: importing takes ~1 s,
        self._writer_class = SummaryWriter        # which the other workers' clocks would count as training
        self.logdir, self.every = logdir, max(1, int(every_n_steps))
        self.writer = None
        self._last = None  # (time, examples, global step) at the last write
        self._staleness = None  # (sum, count) of ps 0's staleness counter at the last write

    def begin(self, trainer):
        self.writer = self._writer_class(self.logdir, flush_secs=5)
        self._last = (time.perf_counter(), trainer.examples, trainer.global_step)
        self._staleness = self._staleness_totals(trainer)
        log.info("TensorBoard summaries in %s", self.logdir)

    def after_step(self, ctx):
        if ctx.step % self.every == 0:
            self.write(ctx.trainer, ctx.global_step, ctx.loss)
        return False

    def write(self, trainer, step, loss):
        now = time.perf_counter()
        then, examples, global_step = self._last
        elapsed = max(now - then, 1e-9)
        self.writer.add_scalar("loss", loss, step)
        self.writer.add_scalar("examples_per_sec", (trainer.examples - examples) / elapsed, step)
        self.writer.add_scalar("global_step_per_sec", (step - global_step) / elapsed, step)
        totals = self._staleness_totals(trainer)
        if totals is not None and self._staleness is not None and totals[1] > self._staleness[1]:
            self.writer.add_scalar("staleness", (totals[0] - self._staleness[0]) / (totals[1] - self._staleness[1]),
                                   step)
        self._staleness = totals or self._staleness
        self._last = (now, trainer.examples, step)

    def add_scalar(self, tag, value, step):
        if self.writer is not None:
            self.writer.add_scalar(tag, value, step)
            self.writer.flush()

    def end(self, trainer):
        if trainer.losses:
            self.write(trainer, trainer.global_step, float(trainer.losses[-1]))
        self.writer.flush()

    def close(self):
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    @staticmethod
    def _staleness_totals(trainer):
        """(sum of staleness, pushes) received by ps shard 0, or None when it does not answer (or there is no ps:
        an all-reduce job's steps are never stale)."""
        if trainer.ps is None:
            return None
        try:
            counts = trainer.ps.stats()[0].get("staleness", {})
        except OpError as exc:
            log.warning("TensorBoard: no staleness from the ps: %s", exc)
            return None
        return (sum(int(s) * n for s, n in counts.items()), sum(counts.values()))
