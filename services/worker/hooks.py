"""Training hooks, as TF's SessionRunHooks: called around the loop, each with one job.

A hook sees a `StepContext` after every step and may ask the loop to stop.
Users add their own with `--hook module:Class` (constructed with no arguments).
"""

import importlib
import logging
import time

from zmqflow.common.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError

log = logging.getLogger("worker")


class StepContext:
    """What a hook can see after a step."""

    __slots__ = ("trainer", "step", "global_step", "loss", "examples", "epoch", "batch_size", "elapsed")

    def __init__(self, trainer, step, global_step, loss, examples, epoch, batch_size, elapsed):
        self.trainer, self.step, self.global_step, self.loss = trainer, step, global_step, loss
        self.examples, self.epoch, self.batch_size, self.elapsed = examples, epoch, batch_size, elapsed


class Hook:
    def begin(self, trainer):
        pass

    def after_step(self, ctx):
        """Return True to stop training."""
        return False

    def end(self, trainer):
        pass


class StopAtStepHook(Hook):
    """Stop once the global step reaches `last_step`."""

    def __init__(self, last_step):
        self.last_step = last_step

    def after_step(self, ctx):
        return ctx.global_step >= self.last_step


class LoggingHook(Hook):
    """The seeds' log line: step, epoch, batch, cost, average time per step."""

    def __init__(self, every_n_steps=100):
        self.every = every_n_steps
        self._last = time.perf_counter()

    def after_step(self, ctx):
        if ctx.step % self.every == 0:
            now = time.perf_counter()
            log.info("Step: %d, Epoch: %d, Batch: %d, Cost: %.4f, AvgTime: %.2fms", ctx.global_step, ctx.epoch,
                     ctx.step, ctx.loss, (now - self._last) * 1000 / self.every)
            self._last = now
        return False


class CheckpointHook(Hook):
    """Chief only: a checkpoint every N steps and/or every N seconds, and a final one."""

    def __init__(self, directory, every_steps=None, every_secs=None, keep=5):
        self.directory, self.every_steps, self.every_secs, self.keep = directory, every_steps, every_secs, keep
        self._last_time = time.monotonic()
        self._last_step = 0

    def after_step(self, ctx):
        due_steps = self.every_steps and ctx.global_step - self._last_step >= self.every_steps
        due_secs = self.every_secs and time.monotonic() - self._last_time >= self.every_secs
        if due_steps or due_secs:
            self.save(ctx.trainer)
        return False

    def save(self, trainer):
        """Save now; a shard that is away (restarting) skips this checkpoint, not the training."""
        self._last_time, self._last_step = time.monotonic(), trainer.global_step
        try:
            path = trainer.save_checkpoint(self.directory, keep=self.keep)
        except (UnavailableError, FailedPreconditionError) as exc:
            log.warning("checkpoint at step %d skipped: %s", trainer.global_step, exc)
            return None
        log.info("checkpoint saved: %s", path)
        return path

    def end(self, trainer):
        self.save(trainer)


def load_hook(path):
    """A user hook from 'module:Class'."""
    module_name, _, class_name = path.partition(":")
    try:
        hook = getattr(importlib.import_module(module_name), class_name)()
    except (ImportError, AttributeError, TypeError) as exc:
        raise InvalidArgumentError(f"cannot load hook {path!r}: {exc}") from None
    if not isinstance(hook, Hook) and not hasattr(hook, "after_step"):
        raise InvalidArgumentError(f"hook {path!r} has no after_step(ctx) method")
    return hook
