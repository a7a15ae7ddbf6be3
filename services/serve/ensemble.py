"""`EnsembleServer`: one model server hosting K checkpoints, each on its own device, combining in process.

Why: the chapter's exercise builds the ensemble in one graph, each network on its own device, where an
aggregator in front of K model servers costs K + 1 processes and two network hops a request. Here a batch
of requests runs on every checkpoint at once, one thread per device (a GPU, or a CPU slot: numpy's BLAS
releases the GIL, so K models overlap on K cores), and each request's rows are combined with the
aggregator's own functions (models/combine.py). The answer is the aggregator's: outputs [n, outputs], the
members that answered and those missing with why, the combine and mode, and for a records request the
predicted classes by the task. A request may name its combine, min_members, deadline_ms and mode as it
would to an aggregator (`replica`: one checkpoint, in turn); it is batched and withdrawn at its deadline as a
model server's.

Each checkpoint makes its records into inputs with the statistics it records, as it would behind an
aggregator; they must take the same inputs and give outputs of one width and task, checked at start.
"""

import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from zmqflow.common.checkpoints.checkpoint import Checkpoint, find_checkpoint
from zmqflow.common.cluster.device import DeviceSpec
from zmqflow.common.errors import InvalidArgumentError, OpError, error_from_code
from zmqflow.common.wire.protocol import EnsembleServeOps
from zmqflow.inputs.predictions import predicted
from zmqflow.models.combine import COMBINERS, CustomCombine, check_combine, combine_answers
from zmqflow.models.kernels import get_backend, gpu_count
from zmqflow.models.protocol import zero_inputs
from zmqflow.models.registry import load_model
from zmqflow.models.saved import recorded_data
from zmqflow.services.serve.schema import RequestSchema
from zmqflow.services.serve.server import BatchingServer, Hosted, public_spec

log = logging.getLogger(__name__)

CPU = "/device:CPU:0"


def default_devices(count):
    """Every checkpoint on the CPU, each in its own slot (thread): GPUs are named with --devices."""
    return [CPU] * count


def place_on_device(model, device, where):
    """`model` computing on `device` ("/cpu:0", or "/gpu:N" for a model of zmqflow's layers); the device's
    canonical name. `where` names the checkpoint in errors."""
    spec = DeviceSpec.from_string(device)
    if spec.job is not None or spec.replica is not None or spec.task is not None:
        raise InvalidArgumentError(f"{where}: device {device!r} names a job or task; a model server places its "
                                   "checkpoints on its own devices: /cpu:0 or /gpu:N")
    if spec.device_type in (None, "CPU"):
        if spec.device_index not in (None, 0):
            raise InvalidArgumentError(f"{where}: device {device!r}: the host is /cpu:0 (several checkpoints "
                                       "may share it, each in its own thread)")
        return model, CPU
    index = spec.device_index or 0
    if index >= gpu_count():
        raise InvalidArgumentError(f"{where}: device {device!r}: this host has {gpu_count()} GPU(s) CuPy can use; "
                                   "give /cpu:0 or a GPU that is there")
    if not hasattr(model, "place"):
        raise InvalidArgumentError(f"{where}: device {device!r}: this model places itself (not zmqflow's layers); "
                                   "serve it on /cpu:0")
    kernels = get_backend("cupy", index)
    model.place({layer.name: kernels for layer in model.network.layers})
    return model, f"/device:GPU:{index}"


class Member(Hosted):
    """A checkpoint of the ensemble: its model on its device, its request schema, its weight."""

    def __init__(self, spec, checkpoint_dir, name, device, weight, backend, data_config=None):
        where = f"checkpoint {checkpoint_dir}"
        model, self.device = place_on_device(load_model(spec, backend=backend), device, where)
        super().__init__(model, name, checkpoint_dir)
        self.spec, self.weight = spec, float(weight)
        self.schema = RequestSchema(model, data_config or recorded_data(Checkpoint(find_checkpoint(checkpoint_dir))))
        self.answers = self.errors = 0

    def describe(self):
        return {"name": self.name, "device": self.device, "weight": self.weight, "version": self.version,
                "source": os.path.basename(self.source or ""), "spec": public_spec(self.spec), "healthy": True,
                "answers": self.answers, "errors": self.errors}


def member_names(checkpoint_dirs):
    """Each checkpoint's directory name, numbered where two share one."""
    names = [os.path.basename(os.path.normpath(d)) or "model" for d in checkpoint_dirs]
    return [f"{n}#{i}" if names.count(n) > 1 else n for i, n in enumerate(names)]


class EnsembleServer(BatchingServer):
    name = "serve"
    protocol = EnsembleServeOps

    def __init__(self, bind, members, backend="numpy", max_batch=256, max_delay_ms=2.0, model_name="ensemble",
                 combine="mean", min_members=1, refresh_secs=None, data_config=None, **service_options):
        """`members`: (model spec, checkpoint directory, device, weight) per checkpoint, two or more."""
        super().__init__(bind, **service_options)
        self.hosted = []
        if len(members) < 2:
            raise InvalidArgumentError(f"an ensemble server hosts two checkpoints or more, got {len(members)}")
        self.custom = CustomCombine(combine) if combine not in COMBINERS else None
        self.combine = check_combine(combine, self.custom)
        self.min_members = min_members
        self.model_name, self.backend = model_name, backend
        names = member_names([m[1] for m in members])
        hosted = [Member(spec, ckpt, name, device, weight, backend, data_config)
                  for (spec, ckpt, device, weight), name in zip(members, names)]
        _check_alike(hosted)
        self.schema = hosted[0].schema
        # members whose records become the same inputs (the same data config) make them once a request
        self._groups = {}
        for index, member in enumerate(hosted):
            key = json.dumps(member.schema.data_config, sort_keys=True, default=str)
            self._groups.setdefault(key, []).append(index)
        self._groups = list(self._groups.values())
        self._pool = ThreadPoolExecutor(len(hosted), "member")
        self._turn = 0   # the next member a replica request goes to
        self._start(hosted, max_batch, max_delay_ms, refresh_secs)
        for member in hosted:   # compile kernels before serving
            member.model.predict(member.params, zero_inputs(member.model, 1))
        self.serve({EnsembleServeOps.Predict: self._predict, EnsembleServeOps.ModelInfo: self._model_info,
                    EnsembleServeOps.Members: self._members})

    # ------------------------------------------------ ops

    def _predict(self, call):
        args = call.args
        check_combine(args.combine or self.combine, self.custom)
        if args.deadline_ms is not None:
            deadline = call.received + args.deadline_ms / 1000.0
            call.deadline = deadline if call.deadline is None else min(deadline, call.deadline)
        if (args.min_members or self.min_members) > len(self.hosted):
            raise InvalidArgumentError(f"min_members {args.min_members or self.min_members}: this ensemble hosts "
                                       f"{len(self.hosted)} checkpoints")
        inputs = []   # one flat list of arrays of n rows: each group's inputs in turn (the batcher joins them)
        for group in self._groups:
            inputs += self.hosted[group[0]].schema.inputs(call.tensors, args)
        return self._park(call, inputs)

    def _model_info(self, call):
        first_shape = self.schema.describe()["inputs"][0]["shape"]
        return {"model": self.model_name, "version": None, "inputs": int(np.prod(first_shape)),
                "classes": self.schema.width, "schema": self.schema.describe(), "backend": self.backend,
                "combine": self.combine, "min_members": self.min_members,
                "members": [m.describe() for m in self.hosted],
                "max_batch": self.batcher.max_batch, "max_delay_ms": self.batcher.max_delay * 1000.0,
                "stats": dict(self.stats)}

    def _members(self, call):
        return {"members": [m.describe() for m in self.hosted]}

    def describe(self):
        return {"model": self.model_name, "members": len(self.hosted), "queued": len(self.batcher)}

    # ------------------------------------------------ batches

    def _answer_batch(self, items, sizes, joined):
        """The batch's requests answered (every request's inputs are a list: `joined` is one too)."""
        asked = self._asked(items)
        outputs, failures = self._run_members(sorted(set().union(*asked)), joined)
        bounds = np.cumsum([0] + sizes)
        for call, members, start, end in zip(items, asked, bounds[:-1], bounds[1:]):
            try:
                rows, info = self._answer(call, members, outputs, failures, slice(start, end))
            except OpError as exc:
                self.fail(call, exc)
                continue
            info["latency_ms"] = round((time.monotonic() - call.received) * 1000.0, 3)
            self.reply(call, info, [rows])
        self._count_batch(items, sizes)

    def _asked(self, items):
        """The members each request asks: every one (ensemble), or the next in turn (replica)."""
        asked = []
        for call in items:
            if call.args.mode == "replica":
                asked.append({self._turn})
                self._turn = (self._turn + 1) % len(self.hosted)
            else:
                asked.append(set(range(len(self.hosted))))
        return asked

    def _run_members(self, indices, joined):
        """Every asked member on the whole batch at once, each in its own thread: ({index: outputs},
        {index: (code, reason)} of those that failed)."""
        def run(index):
            member = self.hosted[index]
            group = next(n for n, g in enumerate(self._groups) if index in g)
            offset = sum(len(self.hosted[g[0]].schema.names) for g in self._groups[:group])
            arrays = joined[offset:offset + len(member.schema.names)]
            return member.predict(member.schema.model_input(arrays))

        futures = {index: self._pool.submit(run, index) for index in indices}
        outputs, failures = {}, {}
        for index, future in futures.items():
            member = self.hosted[index]
            try:
                outputs[index] = future.result()
                member.answers += 1
            except Exception as exc:  # a model error costs this member's answer, not the server
                log.exception("member %s failed on a batch", member.name)
                member.errors += 1
                code = getattr(exc, "code", InvalidArgumentError.code)
                failures[index] = (code, f"error: {type(exc).__name__}: {exc}")
        return outputs, failures

    def _answer(self, call, members, outputs, failures, rows):
        """(combined rows, info) of one request, as the aggregator answers it."""
        combine = call.args.combine or self.combine
        min_members = 1 if call.args.mode == "replica" else call.args.min_members or self.min_members
        answers = {self.hosted[i].name: outputs[i][rows] for i in sorted(members) if i in outputs}
        missing = {self.hosted[i].name: failures[i][1] for i in sorted(members) if i in failures}
        info = {"mode": call.args.mode or "ensemble", "combine": combine, "answered": list(answers),
                "missing": missing, "min_members": min_members, "model": self.model_name}
        if len(answers) < min_members:
            codes = {failures[i][0] for i in members if i in failures}
            text = (f"{len(answers)} of {min_members} needed members answered (answered: "
                    f"{', '.join(answers) or 'none'}; missing: {'; '.join(f'{k}: {v}' for k, v in missing.items())})")
            raise error_from_code(codes.pop() if len(codes) == 1 else InvalidArgumentError.code, text)
        weights = {m.name: m.weight for m in self.hosted}
        combined = combine_answers(combine, answers, weights, self.custom)
        if call.args.records:
            labels = self.schema.labels
            info["predicted"] = predicted(combined, labels["task"], labels["classes"], labels["columns"])
        return combined, info

    def close(self):
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown()
        super().close()


def _check_alike(members):
    """Every member takes the first one's inputs and answers with its width, task and classes."""
    first = members[0]
    want = (first.schema.describe()["inputs"], first.schema.width, first.schema.task, first.schema.classes)
    for member in members[1:]:
        got = (member.schema.describe()["inputs"], member.schema.width, member.schema.task, member.schema.classes)
        if got != want:
            raise InvalidArgumentError(
                f"checkpoint {member.checkpoint_dir} cannot answer with {first.checkpoint_dir}: it takes "
                f"{member.schema.shape_text()} and answers {got[1]} outputs (task {got[2]}, classes {got[3]}); "
                f"{first.checkpoint_dir} takes {first.schema.shape_text()} and answers {want[1]} (task {want[2]}, "
                f"classes {want[3]}). An ensemble's checkpoints take the same inputs and answer the same task")
