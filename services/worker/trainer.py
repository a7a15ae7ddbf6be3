"""The worker's training: `Trainer.step(batch)` makes one step of between-graph replication
(compute, then push with the next parameters in the push's answer: one round trip a step; a worker that
leaves variables out of its pulls prefetches the next pull while computing instead); `Trainer.fit(input,
hooks)` is the loop over a `TrainingInput` (training_input.py), restarted from fresh parameters when
the ps shards went away and came back, as Keras's `fit` over `train_step` and Horovod's elastic `run`
around a plain loop. jobs/session.py's MonitoredTrainingSession drives `step` itself.

Task 0 (or the `chief` job) is the chief: it initializes or restores the
variables (the others wait until the shards are ready), saves checkpoints,
waits for the other workers at the end, saves the final checkpoint and
evaluates on the held-out set. End of input is the queue's OutOfRange; a failed input (a reader
that died mid-file) is the error the broker answers the dequeue with (docs/queue-semantics.md §8).
"""

import dataclasses
import functools
import logging
import math
import signal
import threading
import time
from collections import deque

import numpy as np

from zmqflow.common.errors import DeadlineExceededError, InvalidArgumentError, UnavailableError
from zmqflow.models.protocol import every_gradient, input_signature, zero_inputs, zero_labels
from zmqflow.models.saved import with_model_sha256
from zmqflow.services.worker.hooks import StepContext
from zmqflow.services.worker.leased_batches import LeasedBatches

log = logging.getLogger("worker")


FINAL_LOSS_STEPS = 20
"""The summary's final_loss is the mean loss of this many last steps."""


class PsLostError(UnavailableError):
    """A ps shard stopped answering a step: what `fit` waits out, unlike an unavailable broker."""


def _ps_lost(method):
    """`method` talks to the ps shards only: their UnavailableError is a PsLostError."""
    @functools.wraps(method)
    def calling(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except UnavailableError as exc:
            if isinstance(exc, PsLostError):
                raise
            raise PsLostError(exc.message, exc.details) from exc
    return calling


@dataclasses.dataclass(frozen=True)
class StepResult:
    """One step's outcome: its loss, the batch's rows, and the global step after it."""

    loss: float
    batch_size: int
    global_step: int


class Trainer:
    def __init__(self, model, ps, replica=0, num_workers=1, is_chief=True, batch_size=100, mode="async",
                 seed=None, checkpoint_dir=None, examples_per_epoch=None, sync_timeout=30.0, end_timeout=120.0,
                 config=None):
        self.model, self.ps = model, ps
        self.replica, self.num_workers, self.is_chief = replica, num_workers, is_chief
        self.batch_size, self.mode, self.seed = batch_size, mode, seed
        self.checkpoint_dir, self.examples_per_epoch = checkpoint_dir, examples_per_epoch
        self.sync_timeout, self.end_timeout = sync_timeout, end_timeout
        self.config = with_model_sha256(config or {})   # what its checkpoints record: a model file's sha256 too
        self.hooks = []
        self.global_step = 0
        self.examples = 0
        self.steps = 0
        # the last steps' losses (final_loss is their mean), not every step's: a list of them all grew by 32 bytes a
        # step, about 660 MB a day at 240 steps/s (issue 27)
        self.losses = deque(maxlen=FINAL_LOSS_STEPS)
        self.params = None                 # the parameters the next step computes with
        self._push = self._assign = None   # at most one push and one assign in flight
        # the batch in hand and the one whose push is in flight; at-least-once input's leases, acked once their
        # gradients are on the ps (fit uses its input's)
        self.leases = LeasedBatches()
        self.input = None   # the TrainingInput fit trains on (a hook that stops early ends it for every worker)
        self.elastic = False   # an elastic sync job: this worker joined at a step boundary and may leave
        self.leaving = False   # SIGTERM in an elastic job: leave after the step in hand
        self._sigterm = None   # the SIGTERM handler before ours (elastic, not the chief), put back at the end
        # tables read by rows (sparse embeddings): left out of pulls, their rows pulled per batch
        self._row_tables = (sorted(model.sparse_rows(zero_inputs(model, 1))) if hasattr(model, "sparse_rows")
                            else [])
        # left out of this worker's pulls: those tables, and a pipeline's later stages' variables
        self._not_pulled = self._row_tables + list(getattr(model, "remote_variables", list)())
        self._inputs = list(input_signature(model))    # the batch components a step reads, besides `label`

    def resolved_config(self):
        return {"mode": self.mode, "batch_size": self.batch_size, "num_workers": self.num_workers, **self.config}

    # ------------------------------------------------ begin

    def begin(self, hooks=()):
        """Before the first step. Chief: restore the latest checkpoint if any, else initialize. Others: wait
        until ready. Then the hooks' begin and the first pull. Every worker first runs one step on zeros,
        so kernel compilation is not counted as training."""
        from zmqflow.common.checkpoints.checkpoint import latest_checkpoint
        self._warm_up()
        if self.is_chief:
            states = self.ps.stats()
            kept = [s["version"] for s in states if s.get("initialized")]
            lost = [i for i, s in enumerate(states) if not s.get("initialized")]
            latest = latest_checkpoint(self.checkpoint_dir) if self.checkpoint_dir else None
            if kept and not lost:      # only the chief restarted: the shards' state is newer than any checkpoint
                log.info("chief: the %d ps shards kept their state (step %d): nothing to restore", len(kept), kept[0])
            elif latest:               # only the shards that lost theirs restore, in step with the others
                versions = [r["version"] for r in self.ps.restore(self.checkpoint_dir, shards=lost if kept else None,
                                                                  at_least=max(kept) if kept else None)]
                log.info("chief restored %s on ps shards %s (step %d)", latest, lost, versions[0])
            else:
                self.ps.initialize(self.model.initial_values(self.seed))
                log.info("chief initialized the variables on %d ps shards", len(self.ps.endpoints))
        else:
            self.ps.wait_ready(timeout=self.end_timeout)
            log.info("worker %d: the model is ready", self.replica)
        self.hooks = list(hooks)
        for hook in self.hooks:
            hook.begin(self)
        self._started = time.perf_counter()
        if self.mode == "sync":
            self._join()
        else:
            self.params = self.ps.pull(exclude=self._not_pulled)
        self.global_step = self.ps.versions[0]

    def _join(self):
        """Sync: become a member of the steps (elastic: from the next step boundary), then pull the parameters
        of the first step this worker's gradients count in. A step that does not come within the sync timeout
        (every member left before it) is asked for again: the shards then admit the worker at once."""
        deadline = time.monotonic() + self.end_timeout
        while True:
            answer = self.ps.join(self.replica)
            if answer["elastic"] and not self.elastic:
                self.elastic = True
                self._leave_on_sigterm()
            try:
                self.params = self.ps.pull(min_version=answer["step"] if self.elastic else None,
                                           timeout=self.sync_timeout, exclude=self._not_pulled)
                break
            except DeadlineExceededError as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("worker %d: %s; joining again", self.replica, exc)
        if self.elastic:
            log.info("worker %d: member of the sync steps from global step %d", self.replica, answer["step"])

    def _leave_on_sigterm(self):
        """Elastic, not the chief: SIGTERM (a scale-down, `kill`) makes the worker finish the step in hand, leave
        the job (the steps after it no longer wait for it) and exit 0; a second SIGTERM ends it at once."""
        if self.is_chief or threading.current_thread() is not threading.main_thread():
            return

        def leave(signum, frame):
            log.warning("worker %d: SIGTERM: leaving the job after this step", self.replica)
            self.leaving = True
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self._sigterm = signal.signal(signal.SIGTERM, leave)

    def _warm_up(self):
        """A step on zeros compiles the kernels; a pipelined model's `warm_up` sends nothing to its stages."""
        batch = zero_inputs(self.model, self.batch_size), zero_labels(self.model, self.batch_size)
        getattr(self.model, "warm_up", self.model.step)(self.model.initial_values(self.seed), batch)

    # ------------------------------------------------ the loop

    def fit(self, input, hooks=()):
        """Train on `input` (a TrainingInput) until it ends or a hook asks to stop; returns the summary.
        A ps shard lost mid-way is waited out: the loop runs again from fresh parameters."""
        self.input, self.leases = input, input.leases
        self.begin(hooks)
        while True:
            try:
                self._train(input)
                break
            except PsLostError as exc:
                self._recover(exc)
        return {**self.end(), **input.summary()}

    def _train(self, input):
        """The plain loop: a step per batch, hooks after each."""
        while (batch := input.next(before_waiting=self.settle)) is not None:
            if self.after_step(self.step(batch)) or self.leaving:
                input.cancel()
                return

    @_ps_lost
    def step(self, batch):
        """One step on `batch`, (x, y) or a dequeued element (see `_batch`): its gradients pushed, the
        parameters of the next step pulled. Counted in `steps`, `examples` and `losses`."""
        started = time.perf_counter()
        x, y = self._batch(batch)
        loss_step = None   # the global step the loss was computed at (the summaries' x axis), when not the pulled one
        if self.mode == "sync":
            loss, grads = self._compute(self.params, x, y)
            self.params = self._sync_exchange(grads)
        elif not self._not_pulled:
            # push, and the variables after it in the same answer: one round trip a step, not a push and a
            # pull (each costs the ps and this worker a message, a wake-up and the Python around them)
            loss_step = self.global_step   # not the version after this push, which its answer brings
            loss, grads = self._compute(self.params, x, y)
            self.settle()
            self._push = self.ps.push_async(grads, self.replica, pull=True)
            self.leases.pushed()
            self.params = self._push.result()[1]
            self.global_step = self.ps.versions[0]
        else:
            next_params = self.ps.pull_async(exclude=self._not_pulled)  # prefetch: arrives while we compute
            loss, grads = self._compute(self.params, x, y)
            self.settle()
            self._push = self.ps.push_async(grads, self.replica)
            self.leases.pushed()
            self.params = next_params.result()
            self.global_step = self.ps.versions[0]
        self.leases.step_took(time.perf_counter() - started)
        self.steps += 1
        self.examples += len(y)
        self.losses.append(loss)
        return StepResult(float(loss), len(y), self.global_step if loss_step is None else loss_step)

    @_ps_lost
    def gradients(self, batch, min_version=None):
        """(loss, rows, {variable: gradient}) of `batch` at the parameters of `min_version` (one per shard:
        pulled, waiting until the shards reach it), nothing pushed: an in-graph replica's part of a sync
        step, whose client averages the replicas' gradients into one push (services/worker/replica.py)."""
        x, y = self._batch(batch)
        self.params = self.ps.pull(min_version=min_version, timeout=self.sync_timeout, exclude=self._not_pulled)
        self.global_step = self.ps.versions[0]
        loss, grads = self._compute(self.params, x, y)
        self.steps += 1
        self.examples += len(y)
        self.losses.append(loss)
        return float(loss), len(y), grads

    def after_step(self, result):
        """Show the hooks a step; True when one asks to stop."""
        ctx = StepContext(self, self.steps, result.global_step, result.loss, self.examples, self._epoch(),
                          result.batch_size, time.perf_counter() - self._started)
        return any([hook.after_step(ctx) for hook in self.hooks])

    def _recover(self, error):
        """A ps shard went away: wait (bounded) until every shard serves again, then start over
        from fresh parameters. The step in hand is lost; a restarted shard restores its checkpoint."""
        log.warning("worker %d: %s; waiting for the ps shards to come back", self.replica, error)
        self._push = self._assign = None
        self.leases.give_back()   # their gradients may not have reached the ps: train them again
        deadline = time.monotonic() + self.end_timeout
        while True:
            try:
                self.ps.wait_ready(timeout=5.0)
                self.params = self.ps.pull(exclude=self._not_pulled)
                self.global_step = self.ps.versions[0]
                log.info("worker %d: ps shards back at global step %d", self.replica, self.global_step)
                return
            except (UnavailableError, DeadlineExceededError) as exc:
                if time.monotonic() > deadline:
                    raise UnavailableError(f"ps shards did not come back within {self.end_timeout:.0f} s: {exc}")

    def _compute(self, params, x, y):
        """(loss, a gradient for every variable). A model of the protocol's `step` may also compute
        new values of non-trainable variables (BatchNorm's moving statistics): they go to the ps
        as an assign, at most one in flight, and the ps checkpoints and serves them."""
        if self._row_tables:
            rows = self.model.sparse_rows(x)
            params = {**params, **{table: self.ps.pull_rows(table, ids) for table, ids in rows.items()}}
            loss, grads, metrics = self.model.step(params, (x, y), rows=rows)
        else:
            loss, grads, metrics = self.model.step(params, (x, y))
        self._check_loss(loss, x)
        updates = metrics.get("updates")
        if updates:
            if self._assign is not None:
                self._assign.result()
            self._assign = self.ps.assign_async(updates)
        return loss, every_gradient(self.model, grads)

    def _check_loss(self, loss, x):
        """A NaN or infinite loss ends this worker before its gradients reach the ps."""
        if not math.isfinite(loss):
            raise InvalidArgumentError(
                f"worker {self.replica}: the loss of step {self.steps + 1} (global step {self.global_step}) is "
                f"{loss} on a batch of {len(x)}; its gradients were not pushed. The model diverged: a lower "
                "learning rate, or inputs scaled to a small range, usually help")

    @_ps_lost
    def settle(self):
        """Collect the previous step's push and assign results (at most one of each in flight)."""
        if self._push is not None:
            self._push.result()
            self._push = None
            self.leases.push_settled()
        if self._assign is not None:
            self._assign.result()
            self._assign = None

    def _sync_exchange(self, grads):
        """Push this step's gradients, then wait until every shard applied the step. In one round trip (each
        shard answers the push once the step is applied), unless the push must be acknowledged before the
        wait: a leased batch is acked once the ps holds its gradients, and at the end of the input the other
        replicas may be waiting for that very batch; or unless some variables are read by rows, not pulled."""
        next_step = [v + 1 for v in self.ps.versions]
        params = None
        if self.leases.in_hand is None and not self._not_pulled:
            try:
                results, params = self.ps.push_async(grads, self.replica, pull=True, min_version=next_step,
                                                     timeout=self.sync_timeout).result()
            except DeadlineExceededError as exc:   # pushed, and the step did not come: go on from where it stands
                log.warning("worker %d: %s", self.replica, exc)
                results, params = (), self.ps.pull(exclude=self._not_pulled)
        else:
            results = self.ps.push(grads, self.replica)
            self.leases.received()   # the ps holds the gradient for the step: acked before the wait for the others
        if any(r.get("reason") == "not_member" for r in results):
            # elastic: found silent and left out of the steps (a long pause); this batch's gradients are
            # dropped, and the worker joins again at the next step boundary
            log.warning("worker %d: no member of step %s any more (found lost): joining again", self.replica,
                        next_step[0] - 1)
            self._join()
            self.global_step = self.ps.versions[0]
            return self.params
        if params is None:
            try:
                params = self.ps.pull(min_version=next_step, timeout=self.sync_timeout, exclude=self._not_pulled)
            except DeadlineExceededError as exc:
                log.warning("worker %d: %s", self.replica, exc)
                params = self.ps.pull(exclude=self._not_pulled)
        self.global_step = self.ps.versions[0]
        return params

    def _batch(self, value):
        """(x, y) of a dequeued batch: components named like the model's inputs (or `image` for a
        model of one input) and `label`; or a pair."""
        if not isinstance(value, dict):
            return value[0], value[1]
        signature = self._inputs
        names = [signature[0] if signature[0] in value else "image"] if len(signature) == 1 else signature
        missing = [n for n in names + ["label"] if n not in value]
        if missing:
            raise InvalidArgumentError(f"worker {self.replica}: the batch has components {sorted(value)}, the model "
                                       f"needs {names} and 'label' (missing {missing})")
        if len(signature) == 1:
            return value[names[0]], value["label"]
        return {name: value[name] for name in names}, value["label"]

    def _epoch(self):
        if not self.examples_per_epoch:
            return 0
        return self.global_step * self.batch_size // self.examples_per_epoch

    # ------------------------------------------------ the end

    def end(self):
        """After the last step: settle the push in flight, say done, and as the chief wait for the others;
        then the hooks' end. Returns the worker's summary.

        The global step is read from the ps (with prefetch, the last push is not in our pull): by a worker
        before it says done, since once every worker has, the chief may shut the ps down (a job's session
        does at its end); by the chief once the others are done."""
        self.settle()
        self.elapsed = time.perf_counter() - self._started
        if not self.is_chief:
            self.global_step = self.ps.stats()[0]["version"]
        self.ps.worker_done(self.replica)
        if self._sigterm is not None and not self.leaving:   # left: SIGTERM's own handler is back already
            signal.signal(signal.SIGTERM, self._sigterm)
        if self.is_chief:
            self._wait_for_workers()
            self.global_step = self.ps.stats()[0]["version"]
        return self._summary()

    def _summary(self):
        """The hooks' end, then the worker's summary (logged)."""
        for hook in self.hooks:
            hook.end(self)
        rate = self.examples / self.elapsed if self.elapsed else 0.0
        log.info("worker %d done: %d steps, %d examples, %.0f examples/s, global step %d", self.replica,
                 self.steps, self.examples, rate, self.global_step)
        return {"replica": self.replica, "steps": self.steps, "examples": self.examples, "seconds": self.elapsed,
                "examples_per_s": rate, "global_step": self.global_step,
                "final_loss": float(np.mean(self.losses)) if self.losses else None}

    def _wait_for_workers(self, silent_after=5.0, grace=2.0):
        """Until every worker said it is done. A worker silent for `silent_after` s (the ps's default
        --lost-after-secs: the chief is past its own input, so the others are near their end too) is
        counted as done on the shards (so a sync step the live ones wait for is released); if it
        stays silent `grace` s more, it is taken for dead. A SIGKILLed spare thus costs the job's
        end 7 s, not 15."""
        started = deadline = time.monotonic()
        deadline += self.end_timeout
        declared = {}  # replica -> when the chief counted it as done
        missing = []
        while time.monotonic() < deadline:
            now = time.monotonic()
            stats = self.ps.stats()[0]
            done, lost = set(stats["done_workers"]), set(stats.get("lost_workers", []))
            idle = {int(r): s for r, s in stats.get("replica_idle_s", {}).items()}
            silent = [r for r in self._replicas(stats)
                      if r not in done and idle.get(r, now - started) > silent_after]
            if silent:
                log.warning("chief: workers %s silent for %.0f s: counted as finished so no step waits for them",
                            silent, silent_after)
                for r in silent:
                    self.ps.worker_done(r, lost=True)
                    declared[r] = now
                continue
            missing = [r for r in self._replicas(stats) if r not in done]
            still_possible = [r for r in lost if now - declared.get(r, now) < grace or idle.get(r, grace) < grace]
            if not missing and not still_possible:
                if lost:
                    log.warning("chief: workers %s stopped without finishing", sorted(lost))
                return
            time.sleep(0.05)
        log.warning("chief: workers %s did not finish within %.0f s", missing, self.end_timeout)

    def _replicas(self, stats):
        """The workers the chief waits for: every task of the job, or in an elastic job its members now."""
        if not stats.get("elastic"):
            return range(self.num_workers)
        return sorted(set(stats["members"]) | {int(r) for r in stats["pending"]})

    def current_params(self):
        """The variables as they stand now (what the end's evaluation scores)."""
        return self.ps.pull()

    def save_checkpoint(self, directory, keep=5):
        """A checkpoint of the variables now (the ps shards write their shares); returns its path."""
        return self.ps.save(directory, keep=keep, config=self.resolved_config())

    def evaluate(self, x, y):
        """Accuracy of the current parameters on (x, y)."""
        params = self.ps.pull()
        probabilities = self.model.predict(params, x)
        return float(np.mean(np.argmax(probabilities, axis=1) == y))
