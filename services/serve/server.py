"""`ModelServer`: answers `predict` from a checkpoint (or the live ps shards), running concurrent calls as one batch.

Why a parked call per request: the service loop is single-threaded, so a predict call is
parked in the batcher and answered when its batch runs, either when `max_batch` rows are
queued or when the oldest has waited `max_delay`. The wake-up for that timer rides on the
service's deadline heap (`wake_at`); `_expire` is extended to run the due batches. A request whose
deadline passes before its batch runs is withdrawn with DEADLINE_EXCEEDED, as any parked call.
What a request may send (tensors by the model's input signature, or raw records when the
checkpoint records a data spec) is the request schema's (schema.py), reported by model_info.
"""

import logging
import os
import time

import numpy as np

from zmqflow.common.checkpoints.checkpoint import Checkpoint, find_checkpoint
from zmqflow.common.errors import DeadlineExceededError, InvalidArgumentError
from zmqflow.models.protocol import zero_inputs
from zmqflow.models.registry import load_model, model_variables
from zmqflow.models.saved import read_params, recorded_data
from zmqflow.common.rpc.service import PARKED, Service
from zmqflow.services.serve.batcher import Batcher, rows_of
from zmqflow.services.serve.schema import RequestSchema
from zmqflow.common.wire.protocol import ServeOps

log = logging.getLogger(__name__)


class Hosted:
    """One model a server answers from: its checkpoint directory (or the live ps shards), its model, the
    parameters and their version. A model server hosts one; an ensemble server (ensemble.py) several."""

    def __init__(self, model, name, checkpoint_dir=None, ps=None):
        self.model, self.name, self.checkpoint_dir, self.ps = model, name, checkpoint_dir, ps
        self.params, self.version, self.source, self.reloads = None, None, None, 0

    def reload(self, force=False):
        """Load the newest parameters; keep the current ones (and say why) if that fails after start."""
        try:
            if self.ps is not None:
                params = self.ps.pull(timeout=30.0) if force else self.ps.pull_if_newer(timeout=5.0)
                if params is not None:
                    self.params, self.version, self.source = params, self.ps.versions[0], "ps"
                    self.reloads += 1
                return
            path = find_checkpoint(self.checkpoint_dir)
            if path == self.source and not force:
                return
            ckpt = Checkpoint(path)
            self.params = read_params(self.model, ckpt)
            self.version, self.source = ckpt.step, path
            self.reloads += 1
            log.info("serving %s step %d from %s", self.name, self.version, path)
        except Exception as exc:
            if force:
                raise
            log.warning("refresh of %s failed, still serving version %s: %s", self.name, self.version, exc)

    def predict(self, inputs):
        return np.asarray(self.model.predict(self.params, inputs), np.float32)

    def close(self):
        if self.ps is not None:
            self.ps.close()


class BatchingServer(Service):
    """What a model server and an ensemble server share: requests parked in a batcher until their batch runs
    (`_answer_batch`, the subclass's), withdrawn at their deadline or cancel, and the hosted models reloaded
    every `refresh_secs`."""

    def _start(self, hosted, max_batch, max_delay_ms, refresh_secs):
        self.hosted = list(hosted)
        self.batcher = Batcher(max_batch, max_delay_ms / 1000.0)
        self.refresh_secs = refresh_secs
        self.stats.update(predictions=0, batches=0, batched_rows=0, largest_batch=0, reloads=0)
        for model in self.hosted:
            model.reload(force=True)
        self.stats["reloads"] = sum(model.reloads for model in self.hosted)
        self._next_refresh = time.monotonic() + refresh_secs if refresh_secs else None
        self._timer_at = None

    def _park(self, call, inputs):
        now = time.monotonic()
        if call.deadline is not None and call.deadline <= now:
            raise DeadlineExceededError("the request's deadline passed before it could be batched")
        if self.batcher.runs_alone_now(inputs, call.received, now):
            # its batch would be itself, run now: answered at once, never parked (the park, the deadline timer,
            # the batcher's queue and the split cost ~20 us a request of a model server's loop, issue 26)
            self._answer_batch([call], [rows_of(inputs)], inputs)
            return PARKED   # answered already
        self.park(call)
        self.batcher.add(call, inputs, call.received)
        self._run_due(now)
        return PARKED

    def _count_batch(self, items, sizes):
        self.stats["predictions"] += len(items)
        self.stats["batches"] += 1
        self.stats["batched_rows"] += sum(sizes)
        self.stats["largest_batch"] = max(self.stats["largest_batch"], sum(sizes))

    def _run_batch(self):
        self._answer_batch(*self.batcher.take())

    def _run_due(self, now):
        while self.batcher.ready(now):
            self._run_batch()
            now = time.monotonic()
        due = self.batcher.due()
        if due is not None and (self._timer_at is None or due < self._timer_at or self._timer_at <= now):
            self._timer_at = due
            self.wake_at(due)

    def _expire(self, now):
        super()._expire(now)  # requests past their deadline leave the batcher first (on_deadline)
        self._run_due(time.monotonic())
        if self._next_refresh is not None and now >= self._next_refresh:
            for model in self.hosted:
                model.reload()
            self.stats["reloads"] = sum(model.reloads for model in self.hosted)
            self._next_refresh = time.monotonic() + self.refresh_secs

    def metric_families(self):
        """The server's counters for Prometheus, read at scrape time (common/processes/metrics.py); the version
        of each hosted model under its name."""
        from zmqflow.common.processes.metrics import counter_family, gauge_family
        model, stats = (self.model_name,), self.stats
        yield gauge_family("zmqflow_serve_model_version", "Version (step) of the parameters served.",
                           {(hosted.name,): hosted.version for hosted in self.hosted}, ["model"])
        yield gauge_family("zmqflow_serve_queued_rows", "Requests waiting to join a batch.",
                           {model: len(self.batcher)}, ["model"])
        for key, doc in (("predictions", "Requests answered by predict."), ("batches", "Batches run."),
                         ("batched_rows", "Rows run in batches."), ("reloads", "Parameter reloads.")):
            yield counter_family(f"zmqflow_serve_{key}", doc, {model: stats[key]}, ["model"])

    def on_deadline(self, call):
        self.batcher.remove(call)
        self.fail(call, DeadlineExceededError(f"predict request {call.id}: its batch could not run before the deadline"))

    def on_cancel(self, call, error):
        self.batcher.remove(call)
        self.fail(call, error)

    def close(self):
        for model in getattr(self, "hosted", ()):
            model.close()
        super().close()


class ModelServer(BatchingServer):
    name = "serve"
    protocol = ServeOps

    def __init__(self, bind, spec, backend="numpy", max_batch=256, max_delay_ms=2.0, model_name="model",
                 checkpoint_dir=None, ps_endpoints=(), placement_strategy="round_robin", max_shard_bytes=None,
                 refresh_secs=None, data_config=None, **service_options):
        super().__init__(bind, **service_options)
        self.hosted = []
        if not checkpoint_dir and not ps_endpoints:
            raise InvalidArgumentError("a model server needs a checkpoint directory or ps endpoints to follow")
        self.spec, self.backend, self.model_name = spec, backend, model_name
        model = load_model(spec, backend=backend)
        recorded = recorded_data(Checkpoint(find_checkpoint(checkpoint_dir))) if checkpoint_dir else None
        self.schema = RequestSchema(model, data_config or recorded)
        ps = None
        if ps_endpoints:
            from zmqflow.common.cluster.placement import place
            from zmqflow.common.clients.ps import PsClient
            placement = place(model_variables(spec), len(ps_endpoints), placement_strategy, max_shard_bytes)
            ps = PsClient(list(ps_endpoints), placement, name="serve")
        self._start([Hosted(model, model_name, checkpoint_dir, ps)], max_batch, max_delay_ms, refresh_secs)
        self.model = model
        model.predict(self.hosted[0].params, zero_inputs(model, 1))  # compile kernels before serving
        self.serve({ServeOps.Predict: self._predict, ServeOps.ModelInfo: self._model_info})

    @property
    def version(self):
        return self.hosted[0].version

    # ------------------------------------------------ ops

    def _predict(self, call):
        return self._park(call, self.schema.inputs(call.tensors, call.args))

    def _model_info(self, call):
        first_shape = self.schema.describe()["inputs"][0]["shape"]
        return {"model": self.model_name, "version": self.version, "spec": public_spec(self.spec),
                "inputs": int(np.prod(first_shape)), "classes": self.schema.width, "schema": self.schema.describe(),
                "backend": self.backend, "source": os.path.basename(self.hosted[0].source or ""),
                "max_batch": self.batcher.max_batch, "max_delay_ms": self.batcher.max_delay * 1000.0,
                "stats": dict(self.stats)}

    def describe(self):
        return {"model": self.model_name, "version": self.version, "queued": len(self.batcher)}

    # ------------------------------------------------ batches

    def _answer_batch(self, items, sizes, inputs):
        """Run the requests `items` ([n_i, ...] rows each, `sizes`) as one batch of `inputs` and answer each."""
        try:
            output = self.hosted[0].predict(self.schema.model_input(inputs))
            parts = Batcher.split(output, sizes)
        except Exception as exc:  # a model error fails this batch, not the server
            log.exception("predict failed on a batch of %d rows", sum(sizes))
            error = exc if hasattr(exc, "code") else InvalidArgumentError(f"predict failed: {exc!r}")
            for call in items:
                self.fail(call, error)
            return
        result = {"model": self.model_name, "version": self.version, "batch_rows": sum(sizes)}
        for call, rows in zip(items, parts):
            answer = {**result, **self.schema.answer(rows)} if call.args.records else result
            self.reply(call, answer, [rows])
        self._count_batch(items, sizes)


def default_model_name(checkpoint_dir, ps_endpoints):
    if checkpoint_dir:
        return os.path.basename(os.path.normpath(checkpoint_dir)) or "model"
    return "ps-model"


def public_spec(spec):
    """The model spec as any client may see it (model_info is a client op): a model file's reference
    without its directories, so the answer names no path of the server's host (docs/security.md)."""
    kind = spec.get("type") if isinstance(spec, dict) else None
    if isinstance(kind, str) and ".py:" in kind:
        return {**spec, "type": os.path.basename(kind)}
    return spec
