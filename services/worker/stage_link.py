"""Pipeline parallelism over ZeroMQ: a model's stages (models/stages.py) on workers, a chain or a DAG.

Worker 0 of a pipeline runs the training loop (`PipelineModel.step`, called by the Trainer like any
model's step); the workers of the other stages serve their stage (`serve_stage`). Each batch is cut
into micro-batches (GPipe): stage 0 sends every micro-batch's activations to the stages it feeds as
soon as it has them; a stage computes a micro-batch once every stage it reads from has sent its part
(a join), sends its outputs on along every edge, and the output stage computes the loss and sends the
gradients of what it read back along every edge. A stage runs its backward pass once every stage it
fed has answered, their gradients of a tensor that went to several stages summed. At the end of a
batch each stage sends its variables' summed gradients to its first upstream stage (a tree to stage
0), and stage 0 makes the step's one push, so the ps sees one replica per pipeline and sync, async,
staleness and checkpoints work as for any model. Several copies of a pipeline on more workers are
data-parallel replicas: each reads its own batches and pushes as one worker. Each stage pulls its own
variables itself, at least at the versions stage 0 trained the batch with.

Links: a stage after the first binds one ROUTER for every stage that sends to it; a stage connects one
DEALER (named `stage-N`) to each stage it sends to, and the answers come back on it. Messages are
the wire format's request frames (op = message kind). The bound side lets only the job's stages in
(common/rpc/encryption.py's `guard_stage_link`): with CURVE (ZMQFLOW_CURVE_DIR) a client key granted
the member role, without it the job's token (ZMQFLOW_JOB_TOKEN, else the one the ps gave this worker)
over ZAP PLAIN; a stranger, or an HTTP POST, is refused in the handshake. Messages are held to the
services' size limit (common/wire/limits.py). Every wait is bounded; a stage that fails sends `failed`
with its error to every neighbour (who pass it on), and a lost stage is AbortedError (the worker's
peer-lost exit code, 3), never a ps outage to wait out.
"""

import logging
import time

import numpy as np
import zmq

from zmqflow.common.rpc import admin_token, encryption as curve
from zmqflow.common.wire import frames as wire
from zmqflow.common.wire.limits import DEFAULT_LIMITS
from zmqflow.common.errors import AbortedError, DeadlineExceededError, InvalidArgumentError

log = logging.getLogger("pipeline")

FORWARD, BACKWARD, GRADIENTS, END, FAILED = "forward", "backward", "gradients", "end", "failed"


def _identity(stage):
    return f"stage-{stage}".encode()


def peer_socket(context, kind, timeout, limits=DEFAULT_LIMITS):
    """A socket of a worker-to-worker link (a pipeline's stages, an all-reduce ring): queued messages get a
    second to leave at close, a send waits at most `timeout` s, frames are held to the services' size limit."""
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.setsockopt(zmq.SNDTIMEO, int(timeout * 1000))   # a send waits while no peer is there
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
    """The sockets of stage `index`: `listen` (bound ROUTER, for the stages that send to it) and one DEALER
    per stage it sends to (`downstream` {stage: endpoint}; `next_endpoint`: a chain's next stage)."""

    def __init__(self, index=0, bind=None, downstream=None, next_endpoint=None, timeout=60.0, context=None,
                 job_token=None, curve_dir=None, limits=DEFAULT_LIMITS):
        """`job_token`: default ZMQFLOW_JOB_TOKEN; `curve_dir`: default ZMQFLOW_CURVE_DIR."""
        self.index = index
        self.context = context or zmq.Context()
        self.timeout, self.limits = timeout, limits
        downstream = dict(downstream or {})
        if next_endpoint:
            downstream[index + 1] = next_endpoint
        self.listen, self.endpoint, self.peers, self.upstream = None, None, {}, set()
        if bind:
            self.listen = peer_socket(self.context, zmq.ROUTER, timeout, limits)
            self.listen.setsockopt(zmq.ROUTER_MANDATORY, 1)     # an answer to a stage that is gone raises
            self.endpoint = bind_peer(self.listen, bind, curve_dir, job_token)
        for stage, endpoint in sorted(downstream.items()):
            sock = peer_socket(self.context, zmq.DEALER, timeout, limits)
            sock.setsockopt(zmq.ROUTING_ID, _identity(index))
            connect_peer(sock, endpoint, curve_dir, job_token)
            self.peers[stage] = sock
        self._stage_of = {sock: stage for stage, sock in self.peers.items()}
        self._poller = zmq.Poller()
        for sock in [self.listen, *self.peers.values()]:
            if sock is not None:
                self._poller.register(sock, zmq.POLLIN)

    def send(self, stage, kind, args=None, tensors=()):
        """Send to `stage`: one this stage sends to, or one that sent to it."""
        frames = wire.request_frames(kind, 0, args or {}, tensors)
        try:
            if stage in self.peers:
                wire.send_message(self.peers[stage], frames)
            elif self.listen is not None:
                wire.send_message(self.listen, frames, identity=_identity(stage))
            else:
                raise InvalidArgumentError(f"pipeline stage {self.index}: no link to stage {stage}")
        except zmq.ZMQError:
            raise AbortedError(f"pipeline: could not send {kind!r} to stage {stage} within {self.timeout:.0f} s: "
                               "it is gone or stuck") from None

    def readable(self):
        """True when a message waits on any link."""
        return any(wire.readable(sock) for sock in (self.listen, *self.peers.values()) if sock is not None)

    def recv(self, what):
        """(stage it came from, kind, args, tensors); bounded by `timeout`, naming what was awaited."""
        deadline = time.monotonic() + self.timeout
        while True:
            ready = dict(self._poller.poll(max(0.0, deadline - time.monotonic()) * 1000))
            if not ready:
                raise AbortedError(f"pipeline: no {what} within {self.timeout:.0f} s: the neighbouring stage "
                                   "is gone or stuck")
            sock = next((s for s in ready if s is not self.listen), self.listen)   # answers first
            identity, header, frames, error = wire.recv_message(sock, sock is self.listen, self.limits)
            if error is not None:
                raise error
            stage = self._stage_of.get(sock)
            if stage is None:
                name = bytes(identity)
                if not name.startswith(b"stage-") or not name[6:].isdigit():
                    log.warning("pipeline stage %d: a message from %r, not a stage: dropped", self.index, name)
                    continue
                stage = int(name[6:])
                self.upstream.add(stage)
            tensors = wire.decode_tensors(header.get("tensors"), frames, self.limits)
            kind, args = header.get("op"), header.get("args") or {}
            if kind == FAILED:
                raise AbortedError(f"pipeline stage {args.get('stage')} failed: {args.get('error')}")
            return stage, kind, args, tensors

    def fail(self, stage, error):
        """Tell every neighbour (without blocking) that stage `stage` failed; they pass it on."""
        frames = wire.request_frames(FAILED, 0, {"stage": stage, "error": str(error)})
        for sock in self.peers.values():
            try:
                sock.send_multipart(frames, zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        for upstream in self.upstream:
            try:
                self.listen.send_multipart([_identity(upstream), *frames], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def close(self):
        """Close the sockets (what is queued gets a second to leave), the link's ZAP handler and the context."""
        for sock in (self.listen, *self.peers.values()):
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
        """The other stages' variables: they pull these themselves, so worker 0 leaves them out."""
        return [name for stage in self.stages[1:] for name in stage.variable_names]

    def step(self, params, batch):
        x, y = batch
        y = np.asarray(y)
        self._steps += 1
        slices = micro_slices(len(y), self.micro_batches)
        work = _Batch(self.stage, self.link, len(slices))
        versions = self.versions()
        for m, s in enumerate(slices):
            out, tape = self.stage.forward(params, _rows(x, s), seed=(self.model.seed, self._steps, m, 0))
            work.forwarded(m, tape, out, {"micro": m, "micro_batches": len(slices), "rows": len(y),
                                          "versions": versions, "step": self._steps}, y[s])
            while not work.complete and self.link.readable():   # a gradient already back: its backward now
                self._receive(work)
        while not work.complete:
            self._receive(work)
        metrics = {"loss": work.loss}
        if work.updates:
            metrics["updates"] = work.updates
        return float(work.loss), work.grads, metrics

    def _receive(self, work):
        source, kind, args, tensors = self.link.recv(
            f"gradient from stage {', '.join(str(d) for d in self.stage.downstream)}" if work.done < work.micro_batches
            else f"gradients from stage {', '.join(str(c) for c in sorted(work.children))}")
        if kind == BACKWARD:
            work.answer(source, args, tensors)
        elif kind == GRADIENTS:
            work.gathered(source, args, tensors)
        else:
            raise InvalidArgumentError(f"pipeline: stage 0 expected gradients, got {kind!r} from stage {source}")

    def finish(self, error=None):
        """The end of training (or its failure): the other stages exit, the link closes."""
        if error is None:
            for target in self.stage.downstream:
                self.link.send(target, END)
        else:
            self.link.fail(0, error)
        self.link.close()


def _accumulate(total, grads):
    for name, g in grads.items():
        total[name] = g.copy() if name not in total else total[name] + g


class _Batch:
    """One batch's work at one stage: its micro-batches' tapes, the gradients the stages it fed send back
    (summed per tensor), its variables' gradients summed over micro-batches, and those of the stages
    below it in the gradient tree (models/stages.py: each stage reports to its first upstream stage)."""

    def __init__(self, stage, link, micro_batches):
        self.stage, self.link, self.micro_batches = stage, link, micro_batches
        self.tapes, self.answers, self.answered = {}, {}, {}
        self.grads, self.updates, self.loss = {}, {}, 0.0
        self.trainable = [v.name for v in stage.variables if v.trainable]   # this stage's, then its subtree's
        self.done, self.children = 0, set(stage.children)

    @property
    def complete(self):
        """Every micro-batch's backward pass done here and every stage below in the tree reported."""
        return self.done == self.micro_batches and not self.children

    def forwarded(self, m, tape, outputs, args, y):
        """Micro-batch m computed: its outputs go along every edge (with its labels, for the output stage)."""
        self.updates.update(tape.updates)
        self.tapes[m] = tape
        for target in self.stage.downstream:
            names = self.stage.output_names(target)
            self.link.send(target, FORWARD, {**args, "names": names}, [*(outputs[n] for n in names), y])

    def lost(self, m, tape, y, weight):
        """The output stage: micro-batch m's loss and backward pass."""
        self.updates.update(tape.updates)
        self.loss += self.stage.loss(tape, y, weight)
        self._backed(m, tape)

    def answer(self, source, args, tensors):
        """Gradients of micro-batch m's outputs from stage `source`: once every stage it fed answered, the
        backward pass."""
        m = args["micro"]
        got = self.answers.setdefault(m, {})
        for name, g in zip(args["names"], tensors):
            got[name] = g if name not in got else got[name] + g
        self.answered.setdefault(m, set()).add(source)
        if self.answered[m] == set(self.stage.downstream):
            del self.answered[m]
            tape = self.tapes.pop(m)
            self.stage.backward(tape, self.answers.pop(m))
            self._backed(m, tape)

    def _backed(self, m, tape):
        own, upstream = self.stage.gradients(tape)
        _accumulate(self.grads, own)
        for source in self.stage.upstream:
            names = self.stage.input_names(source)
            self.link.send(source, BACKWARD, {"micro": m, "names": names}, [upstream[n] for n in names])
        self.done += 1

    def gathered(self, source, args, tensors):
        """A stage below in the tree reported its (and its subtree's) gradients, updates and loss."""
        n = len(args["trainable"])
        self.grads.update(zip(args["names"][:n], tensors[:n]))
        self.trainable += args["names"][:n]
        self.updates.update(zip(args["names"][n:], tensors[n:]))
        self.loss += args["loss"]
        self.children.discard(source)

    def send_up(self):
        """The batch's gradients, updates and loss to the stage above in the tree."""
        names = [n for n in self.trainable if n in self.grads]
        self.link.send(self.stage.parent, GRADIENTS, {"names": names + list(self.updates), "trainable": names,
                                                      "loss": self.loss},
                       [*(self.grads[n] for n in names), *self.updates.values()])


def serve_stage(stage, ps, link, model, pull_timeout=30.0):
    """Stage k > 0: answer forward and backward messages until every stage before it says `end`.
    Returns {"batches": ..., "micro_batches": ...}; raises (after telling the neighbours) on failure."""
    others = [v.name for v in model.variables() if v.name not in set(stage.variable_names)]
    work, params, versions, inbox, arrived, ends = None, None, None, {}, {}, set()
    batches, micros = 0, 0
    prefetch = None   # the next batch's parameters, asked for as soon as this batch's gradients left
    try:
        while True:
            source, kind, args, tensors = link.recv("message from a neighbouring stage")
            if kind == END:
                ends.add(source)
                if ends >= set(stage.upstream):
                    for target in stage.downstream:
                        link.send(target, END)
                    return {"batches": batches, "micro_batches": micros}
                continue
            if kind == FORWARD:
                m = args["micro"]
                inbox.setdefault(m, {}).update(zip(args["names"], tensors[:-1]))
                arrived.setdefault(m, set()).add(source)
                if arrived[m] != set(stage.upstream):
                    continue                             # a join: wait for the other stages' parts
                del arrived[m]
                if work is None:
                    versions = args["versions"]
                    params = _parameters(ps, prefetch, versions, others, pull_timeout)
                    prefetch, work = None, _Batch(stage, link, args["micro_batches"])
                y = tensors[-1]
                out, tape = stage.forward(params, inbox.pop(m), seed=(model.seed, args["step"], m, stage.index))
                micros += 1
                if stage.last:
                    work.lost(m, tape, y, len(y) / args["rows"])
                else:
                    work.forwarded(m, tape, out, {k: v for k, v in args.items() if k != "names"}, y)
            elif kind == BACKWARD and work is not None:
                work.answer(source, args, tensors)
            elif kind == GRADIENTS and work is not None:
                work.gathered(source, args, tensors)
            else:
                raise InvalidArgumentError(f"pipeline stage {stage.index}: unexpected message {kind!r} from stage "
                                           f"{source}")
            if work.complete:
                work.send_up()
                batches, work = batches + 1, None
                prefetch = _prefetch(ps, versions, others, pull_timeout)
    except Exception as exc:
        link.fail(stage.index, f"{type(exc).__name__}: {exc}")
        raise


def _prefetch(ps, versions, others, timeout):
    """This stage's parameters once the step just sent up is applied (its push moves every shard at least
    one version on): they arrive while the stage waits for the next batch instead of after it."""
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
