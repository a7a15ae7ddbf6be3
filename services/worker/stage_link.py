"""Pipeline parallelism over ZeroMQ: a model's stages (models/stages.py) on consecutive workers.

Worker 0 runs the training loop (`PipelineModel.step`, called by the Trainer like any model's
step); workers 1..S-1 serve their stage (`serve_stage`). Each batch is cut into micro-batches
(GPipe): stage 0 sends every micro-batch's activations forward as soon as it has them, the last
stage computes the loss and sends the gradient of its input back, and every stage runs its
backward pass as that gradient arrives, so the stages work on different micro-batches at once.
At the end of a batch the later stages send their variables' summed gradients back up the chain
and worker 0 makes the step's one push, so the ps sees one replica and sync, async, staleness
and checkpoints work as for any model. Each stage pulls its own variables itself, at least at
the versions stage 0 trained the batch with.

Links are PAIR sockets (one per neighbour: a stage binds for the stage before it and connects
to the one after it); messages are the wire format's request frames (op = message kind). A PAIR
takes one peer, so the bound side lets only the stage before it in (common/rpc/encryption.py's
`guard_stage_link`): with CURVE (ZMQFLOW_CURVE_DIR) a client key granted the member role, without it
the job's token (ZMQFLOW_JOB_TOKEN, else the one the ps gave this worker) over ZAP PLAIN; a stranger,
or an HTTP POST, is refused in the handshake and never takes the stage's place. Messages are held to
the services' size limit (common/wire/limits.py). Every
wait is bounded; a stage that fails sends `failed` with its error up and down the chain, and a
lost stage is AbortedError (the worker's peer-lost exit code, 3), never a ps outage to wait out.
"""

import logging

import numpy as np
import zmq

from zmqflow.common.rpc import admin_token, encryption as curve
from zmqflow.common.wire import frames as wire
from zmqflow.common.wire.limits import DEFAULT_LIMITS
from zmqflow.common.errors import AbortedError, DeadlineExceededError, InvalidArgumentError

log = logging.getLogger("pipeline")

FORWARD, BACKWARD, GRADIENTS, END, FAILED = "forward", "backward", "gradients", "end", "failed"


def peer_socket(context, kind, timeout, limits=DEFAULT_LIMITS):
    """A socket of a worker-to-worker link (a pipeline's stages, an all-reduce ring): queued messages get a
    second to leave at close, a send waits at most `timeout` s, frames are held to the services' size limit."""
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.setsockopt(zmq.SNDTIMEO, int(timeout * 1000))   # a PAIR send waits while no peer is there
    sock.setsockopt(zmq.MAXMSGSIZE, limits.socket_max_frame_bytes)
    return sock


def bind_peer(sock, bind, curve_dir=None, job_token=None):
    """Bind the listening side of a worker-to-worker link so that only the job's workers get in (a member's
    CURVE key, else the job token over ZAP PLAIN); returns the endpoint bound. `job_token`: default
    ZMQFLOW_JOB_TOKEN; `curve_dir`: default ZMQFLOW_CURVE_DIR."""
    curve_dir = curve_dir or curve.curve_dir_from_env()
    job_token = job_token or admin_token.from_environment(admin_token.JOB_TOKEN)
    curve.guard_stage_link(sock, bind, curve.ServerKeys(curve_dir) if curve_dir else None, job_token)
    sock.bind(bind)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def connect_peer(sock, endpoint, curve_dir=None, job_token=None):
    """Connect the dialling side of a worker-to-worker link: a CURVE client, else PLAIN with the job token."""
    curve_dir = curve_dir or curve.curve_dir_from_env()
    job_token = job_token or admin_token.from_environment(admin_token.JOB_TOKEN)
    curve.stage_client(sock, curve.ClientKeys(curve_dir) if curve_dir else None, job_token)
    sock.connect(endpoint)


class StageLink:
    """The sockets of one stage: `up` (bound, for the previous stage) and `down` (to the next)."""

    def __init__(self, bind=None, next_endpoint=None, timeout=60.0, context=None, job_token=None, curve_dir=None,
                 limits=DEFAULT_LIMITS):
        """`job_token`: default ZMQFLOW_JOB_TOKEN; `curve_dir`: default ZMQFLOW_CURVE_DIR."""
        self.context = context or zmq.Context()
        self.timeout, self.limits = timeout, limits
        self.up = self.down = None
        self.endpoint = None
        if bind:
            self.up = peer_socket(self.context, zmq.PAIR, timeout, limits)
            self.endpoint = bind_peer(self.up, bind, curve_dir, job_token)
        if next_endpoint:
            self.down = peer_socket(self.context, zmq.PAIR, timeout, limits)
            connect_peer(self.down, next_endpoint, curve_dir, job_token)
        self.next_endpoint = next_endpoint

    def send(self, sock, kind, args=None, tensors=()):
        try:
            wire.send_message(sock, wire.request_frames(kind, 0, args or {}, tensors))
        except zmq.Again:
            raise AbortedError(f"pipeline: could not send {kind!r} within {self.timeout:.0f} s: the neighbouring "
                               "stage is gone or stuck") from None

    def recv(self, what):
        """(socket it came on, kind, args, tensors); bounded by `timeout`, naming what was awaited."""
        poller = zmq.Poller()
        for sock in (self.up, self.down):
            if sock is not None:
                poller.register(sock, zmq.POLLIN)
        ready = dict(poller.poll(self.timeout * 1000))
        if not ready:
            raise AbortedError(f"pipeline: no {what} within {self.timeout:.0f} s: the neighbouring stage "
                               "is gone or stuck")
        sock = self.down if self.down is not None and self.down in ready else self.up
        _, header, frames, error = wire.recv_message(sock, False, self.limits)
        if error is not None:
            raise error
        tensors = wire.decode_tensors(header.get("tensors"), frames, self.limits)
        kind, args = header.get("op"), header.get("args") or {}
        if kind == FAILED:
            raise AbortedError(f"pipeline stage {args.get('stage')} failed: {args.get('error')}")
        return sock, kind, args, tensors

    def fail(self, stage, error):
        """Tell both neighbours (without blocking) that this stage failed."""
        for sock in (self.up, self.down):
            if sock is not None:
                try:
                    sock.send_multipart(wire.request_frames(FAILED, 0, {"stage": stage, "error": str(error)}),
                                        zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass

    def close(self):
        """Close the sockets (what is queued gets a second to leave), the link's ZAP handler and the context."""
        for sock in (self.up, self.down):
            if sock is not None:
                sock.close(linger=1000)
        curve.stop_authenticator(self.context)
        self.context.term()


def micro_slices(rows, micro_batches):
    """Row ranges of at most `micro_batches` near-equal micro-batches."""
    bounds = np.linspace(0, rows, min(micro_batches, rows) + 1).astype(int)
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def _rows(x, s):
    return {k: v[s] for k, v in x.items()} if isinstance(x, dict) else x[s]


class PipelineModel:
    """Stage 0's face of a pipelined model: the model protocol, whose `step` drives the pipeline.
    Everything else (variables, initial values, predict) is the whole model's."""

    def __init__(self, model, stages, link, micro_batches=4, versions=lambda: None):
        self.model, self.stages, self.link = model, stages, link
        self.stage = stages[0]
        self.micro_batches, self.versions = micro_batches, versions
        self._steps = 0

    def variables(self):
        return self.model.variables()

    def initial_values(self, seed=None):
        return self.model.initial_values(seed)

    def input_signature(self):
        return self.model.input_signature()

    def output_shape(self):
        return self.model.output_shape()

    def predict(self, params, x):
        return self.model.predict(params, x)

    def warm_up(self, params, batch):
        """The whole model's step in this process, nothing sent (the Trainer's warm-up compiles the kernels)."""
        return self.model.step(params, batch)

    def remote_variables(self):
        """The later stages' variables: they pull these themselves, so worker 0 leaves them out."""
        return [name for stage in self.stages[1:] for name in stage.variable_names]

    def step(self, params, batch):
        x, y = batch
        y = np.asarray(y)
        self._steps += 1
        slices = micro_slices(len(y), self.micro_batches)
        tapes, grads = {}, {}
        pending = set(range(len(slices)))
        versions = self.versions()
        for m, s in enumerate(slices):
            out, tapes[m] = self.stage.forward(params, _rows(x, s), seed=(self.model.seed, self._steps, m, 0))
            self.link.send(self.link.down, FORWARD, {"micro": m, "micro_batches": len(slices), "rows": len(y),
                                                     "versions": versions, "step": self._steps}, [out, y[s]])
            while pending and wire.readable(self.link.down):   # a gradient already back: its backward now
                self._backward(tapes, grads, pending)
        while pending:
            self._backward(tapes, grads, pending)
        _, kind, args, tensors = self.link.recv("gradients from the later stages")
        if kind != GRADIENTS:
            raise InvalidArgumentError(f"pipeline: expected the later stages' gradients, got {kind!r}")
        names = args["names"]
        for name, g in zip(names[:len(args["trainable"])], tensors):
            grads[name] = g
        metrics = {"loss": args["loss"]}
        updates = {**{n: v for n, v in zip(names[len(args["trainable"]):], tensors[len(args["trainable"]):])},
                   **{k: v for t in tapes.values() for k, v in t.updates.items()}}
        if updates:
            metrics["updates"] = updates
        return float(args["loss"]), grads, metrics

    def _backward(self, tapes, grads, pending):
        _, kind, args, tensors = self.link.recv("gradient from stage 1")
        if kind != BACKWARD:
            raise InvalidArgumentError(f"pipeline: expected a micro-batch's gradient, got {kind!r}")
        m = args["micro"]
        tape = tapes.pop(m)
        self.stage.backward(tape, tensors[0])
        _accumulate(grads, self.stage.gradients(tape)[0])
        pending.discard(m)

    def finish(self, error=None):
        """The end of training (or its failure): the later stages exit, the link closes."""
        if error is None:
            self.link.send(self.link.down, END)
        else:
            self.link.fail(0, error)
        self.link.close()


def _accumulate(total, grads):
    for name, g in grads.items():
        total[name] = g.copy() if name not in total else total[name] + g


def serve_stage(stage, ps, link, model, pull_timeout=30.0):
    """Stage k > 0: answer forward and backward messages until the stage before says `end`.
    Returns {"batches": ..., "micro_batches": ...}; raises (after telling the neighbours) on failure."""
    others = [v.name for v in model.variables() if v.name not in set(stage.variable_names)]
    tapes, grads, updates = {}, {}, {}
    params, loss, batches, micros = None, 0.0, 0, 0
    prefetch = None   # the next batch's parameters, asked for as soon as this batch's gradients left
    try:
        while True:
            sock, kind, args, tensors = link.recv("message from the stage before" if link.down is None
                                                  else "message from a neighbouring stage")
            if kind == END:
                if link.down is not None:
                    link.send(link.down, END)
                return {"batches": batches, "micro_batches": micros}
            if kind == FORWARD:
                m, last_versions = args["micro"], args["versions"]
                if m == 0:
                    params = _parameters(ps, prefetch, args["versions"], others, pull_timeout)
                    prefetch, tapes, grads, updates, loss = None, {}, {}, {}, 0.0
                activations, y = tensors
                out, tape = stage.forward(params, activations, seed=(model.seed, args["step"], m, stage.index))
                updates.update(tape.updates)
                micros += 1
                if not stage.last:
                    tapes[m] = tape
                    link.send(link.down, FORWARD, args, [out, y])
                    continue
                loss += stage.loss(tape, y, len(y) / args["rows"])
                own, upstream = stage.gradients(tape)
                _accumulate(grads, own)
                link.send(link.up, BACKWARD, {"micro": m}, [upstream])
                if m == args["micro_batches"] - 1:
                    batches += 1
                    _send_gradients(link, stage, grads, updates, loss)
                    prefetch = _prefetch(ps, args["versions"], others, pull_timeout)
            elif kind == BACKWARD:                       # a middle stage: from the stage after it
                tape = tapes.pop(args["micro"])
                stage.backward(tape, tensors[0])
                own, upstream = stage.gradients(tape)
                _accumulate(grads, own)
                link.send(link.up, BACKWARD, args, [upstream])
            elif kind == GRADIENTS:                      # a middle stage: the later stages' share
                batches += 1
                n = len(args["trainable"])
                later = dict(zip(args["names"], tensors))
                _send_gradients(link, stage, {**grads, **{k: later[k] for k in args["names"][:n]}},
                                {**updates, **{k: later[k] for k in args["names"][n:]}}, args["loss"],
                                trainable=[*stage.variable_names, *args["names"][:n]])
                prefetch = _prefetch(ps, last_versions, others, pull_timeout)
            else:
                raise InvalidArgumentError(f"pipeline stage {stage.index}: unexpected message {kind!r}")
    except Exception as exc:
        link.fail(stage.index, f"{type(exc).__name__}: {exc}")
        raise


def _prefetch(ps, versions, others, timeout):
    """This stage's parameters once the step just sent up is applied (the pipeline is the only
    replica, so every shard then stands one version higher): they arrive while the stage waits
    for the next batch instead of after it."""
    if versions is None:
        return None
    return versions, ps.pull_async(min_version=[v + 1 for v in versions], timeout=timeout, exclude=others)


def _parameters(ps, prefetch, versions, others, timeout):
    """The stage's parameters at `versions` or newer: the prefetched ones when new enough."""
    if prefetch is not None:
        try:
            params = prefetch[1].result()
            if versions is None or all(have >= need for have, need in zip(ps.versions, versions)):
                return params
        except DeadlineExceededError:
            pass    # the step was not applied (a dropped push): pull what there is
    return ps.pull(min_version=versions, timeout=timeout, exclude=others)


def _send_gradients(link, stage, grads, updates, loss, trainable=None):
    names = [n for n in (trainable or grads) if n in grads] + list(updates)
    link.send(link.up, GRADIENTS, {"names": names, "trainable": [n for n in names if n in grads],
                                   "loss": loss}, [grads[n] if n in grads else updates[n] for n in names])
