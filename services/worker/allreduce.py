"""Synchronous all-reduce training without a ps (`--mode allreduce`): what Horovod and PyTorch DDP do.

Every worker holds a whole replica of the variables and of the optimizer's slots. Each step it computes
its gradient, the ring (ring_link.py) sums every worker's gradient weighted by its batch's rows, and every
worker applies the same mean with the same update rule (common/optimizers.py, the ps's own), so the
replicas stay bit-identical: they start from the chief's bytes and add the same bytes each step. One
reduction is one update, the global step. The reduction also carries each worker's rows and a stop vote:
a worker whose input ended sends zeros with rows 0 until every input ended (the step with no rows ends
training on every worker at once), and a hook that stops (StopAtStepHook, on the same global step
everywhere) makes the next step the last, unapplied. The chief restores or initialises the variables,
writes the checkpoints (of its replica: `evaluate` and `serve` read them like any checkpoint) and
evaluates; a lost worker is the ring's business (ring_link.py: abort naming it, or go on without it).
"""

import hashlib
import logging
import time

import numpy as np

from zmqflow.common.checkpoints import checkpoint
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.optimizers import make_optimizer
from zmqflow.models.protocol import every_gradient
from zmqflow.services.worker import ring
from zmqflow.services.worker.ring_link import RingReformed
from zmqflow.services.worker.trainer import StepResult, Trainer

log = logging.getLogger("worker")

SLOT = "/slot/"
"""A slot's name in the state the chief sends: `<variable>/slot/<slot>`, as checkpoints name them."""


class AllReduceTrainer(Trainer):
    """A Trainer whose variables are its own: `link` is its RingLink, `optimizer` a config or an Optimizer."""

    def __init__(self, model, link, optimizer, **options):
        super().__init__(model, None, mode="allreduce", **options)
        if self._row_tables or self._not_pulled:
            raise InvalidArgumentError("--mode allreduce trains a model whose variables every worker holds whole: "
                                       "not one read by rows (sparse embeddings) nor one split into pipeline stages")
        self.link = link
        self.optimizer = make_optimizer(optimizer) if isinstance(optimizer, dict) else optimizer
        self.config = {**self.config, "optimizer": self.optimizer.get_config()}
        specs = model.variables()
        self.names = sorted(v.name for v in specs)
        self.shapes = {v.name: tuple(v.shape) for v in specs}
        self.dtypes = {v.name: np.dtype(v.dtype) for v in specs}
        self.reduce_dtype = np.result_type(*self.dtypes.values()) if self.dtypes else np.float32
        self.slots = {}
        self.reformed = 0     # how often the ring went on without a lost worker

    def _warm_up(self):
        """The update kernels too, in the warm-up rather than in the first step's update (as a ps's store does)."""
        self.optimizer.warm_up(self.dtypes.values())
        super()._warm_up()

    def resolved_config(self):
        return {**super().resolved_config(), "num_workers": len(self.link.members) or self.num_workers}

    # ------------------------------------------------ state

    def state(self):
        """(global step, {variable or variable/slot/name: array}): what the chief sends a new ring."""
        values = dict(self.params)
        for name, slots in self.slots.items():
            values.update({f"{name}{SLOT}{slot}": value for slot, value in slots.items()})
        return self.global_step, values

    def _adopt(self, state):
        step, values = state
        self.global_step = step
        self.params = {n: np.ascontiguousarray(values[n]) for n in self.names}
        self.slots = {n: {k.split(SLOT, 1)[1]: np.ascontiguousarray(v) for k, v in values.items()
                          if k.startswith(n + SLOT)} for n in self.names}

    def _initial_state(self):
        """Chief: the latest checkpoint of --checkpoint-dir (variables, slots, step), else fresh variables."""
        latest = checkpoint.latest_checkpoint(self.checkpoint_dir) if self.checkpoint_dir else None
        if latest:
            saved = checkpoint.Checkpoint(latest)
            self.params, self.slots = {}, {}
            for name in self.names:
                value, slots = saved.read(name)
                self.params[name] = np.ascontiguousarray(value, self.dtypes[name])
                self.slots[name] = slots
            self.global_step = saved.step
            log.info("chief restored %s (step %d)", latest, saved.step)
        else:
            self.params = self.model.initial_values(self.seed)
            self.global_step = 0
        for name in self.names:
            fresh = self.optimizer.create_slots(self.params[name])
            self.slots[name] = {k: np.ascontiguousarray(self.slots.get(name, {}).get(k, v), v.dtype)
                                for k, v in fresh.items()}

    # ------------------------------------------------ the loop

    def begin(self, hooks=()):
        """Compile on zeros, then form the ring: the chief's state becomes every worker's."""
        self._warm_up()
        if self.is_chief:
            self._initial_state()
            self.link.join(self.state)
        else:
            self._adopt(self.link.join())
        self.hooks = list(hooks)
        for hook in self.hooks:
            hook.begin(self)
        self._started = time.perf_counter()

    def fit(self, input, hooks=()):
        """Train until every worker's input ended or a hook stopped; returns the summary."""
        self.input, self.leases = input, input.leases
        self.begin(hooks)
        ended = stopping = False
        while True:
            batch = None if ended or stopping else input.next()
            ended = ended or batch is None
            try:
                loss, rows, total, stop = self._step(batch, stopping)
            except RingReformed as exc:
                self.reformed += 1
                self.leases.give_back()    # at least once: the dropped step's batch goes back to the queue
                if exc.state is not None:
                    self._adopt(exc.state)
                log.warning("worker %d: the ring goes on without workers %s from global step %d; this step's batch "
                            "is dropped (given back to the queue with --at-least-once)", self.replica, exc.lost,
                            self.global_step)
                continue
            if total == 0 or stop:
                break
            if rows and self.after_step(StepResult(float(loss), rows, self.global_step)):
                stopping = True
                input.cancel()
        return {**self.end(), **input.summary()}

    def step(self, batch):
        """One step on `batch` (None: this worker's input ended): its gradient reduced over the ring and the
        mean applied. Returns a StepResult, or None when every worker's input ended."""
        loss, rows, total, _ = self._step(batch, False)
        return StepResult(float(loss), rows, self.global_step) if total else None

    def _step(self, batch, stop):
        """(loss, this worker's rows, every worker's rows, a stop voted)."""
        started = time.perf_counter()
        if batch is None:
            loss, rows, grads = 0.0, 0, {n: np.zeros(self.shapes[n], self.dtypes[n]) for n in self.names}
        else:
            x, y = self._batch(batch)
            loss, grads = self._compute(self.params, x, y)
            rows = len(y)
        buffer = ring.pack(self.names, grads, rows, stop, self.reduce_dtype)
        self.link.all_reduce(buffer, self.global_step)
        mean, total, stop = ring.unpack(buffer, self.names, self.shapes, self.dtypes)
        if total == 0 or stop:
            return loss, rows, total, stop
        for name in self.names:
            self.optimizer.apply_dense(self.params[name], mean[name], self.slots[name], self.global_step)
        self.global_step += 1
        if rows:
            self.leases.step_took(time.perf_counter() - started)
            self.leases.received()
            self.steps += 1
            self.examples += rows
            self.losses.append(loss)
        return loss, rows, total, stop

    def _compute(self, params, x, y):
        loss, grads, metrics = self.model.step(params, (x, y))
        self._check_loss(loss, x)
        if metrics.get("updates"):
            raise InvalidArgumentError("--mode allreduce does not train models with non-trainable updates "
                                       "(BatchNorm's moving statistics) yet: train them with a ps (--mode sync)")
        return loss, every_gradient(self.model, grads)

    # ------------------------------------------------ what hooks and the end ask for

    def current_params(self):
        return self.params

    def save_checkpoint(self, directory, keep=5):
        """The chief's replica (variables and slots) as a one-shard checkpoint of the global step."""
        return checkpoint.save_params(directory, self.global_step, self.params, self.resolved_config(), keep=keep,
                                      slots=self.slots)

    def settle(self):
        pass

    def end(self):
        """After the last step: the hooks' end, the summary."""
        self.elapsed = time.perf_counter() - self._started
        return {**self._summary(), "ring_reformed": self.reformed, "lost_workers": list(self.link.lost),
                "variables_sha256": self.variables_sha256()}

    def variables_sha256(self):
        """One digest of every variable's bytes, in name order: equal on every replica (what tests compare)."""
        digest = hashlib.sha256()
        for name in self.names:
            digest.update(name.encode() + b"\0" + np.ascontiguousarray(self.params[name]).tobytes())
        return digest.hexdigest()

    def evaluate(self, x, y):
        probabilities = self.model.predict(self.params, x)
        return float(np.mean(np.argmax(probabilities, axis=1) == y))
