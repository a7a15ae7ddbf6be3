"""A worker as one replica of in-graph replication (`zmqflow worker --in-graph`): TensorFlow's tower on
`/job:worker/task:i`, driven by one client (services/worker/in_graph.py) instead of a loop of its own.

The replica keeps a worker's Trainer (its model on its device, its ps client, its own share of the
input: a broker queue or its slice of data preloaded on the ps) and serves three ops (ReplicaOps):
`compute_gradients` (sync: pull the parameters of the step, compute the gradients of its next batch,
answer them; the client averages the replicas' and makes the one push), `run_step` (async: the
Trainer's own step, its push included) and `finish`. The data never goes through the client.

The service loop answers pings while a step computes on a thread of its own (a client takes a service
silent for 3 s for lost): the loop parks the request, the compute thread runs it with the Trainer, and
an inproc socket wakes the loop to answer. The Trainer and its clients live on that thread only.
A client that goes away before `finish` ends the replica with the peer-lost exit code.
"""

import collections
import logging
import queue
import threading

import zmq

from zmqflow.common.errors import (InternalError, InvalidArgumentError, OpError, OutOfRangeError,
                                   UnavailableError)
from zmqflow.common.rpc.service import Service
from zmqflow.common.wire.protocol import ReplicaOps

log = logging.getLogger("worker")


class ReplicaService(Service):
    name = "replica"
    protocol = ReplicaOps

    def __init__(self, bind, replica_name, num_shards, start, **service_options):
        """`start()`, on the compute thread: (trainer, input) begun and ready to step."""
        super().__init__(bind, **service_options)
        self.replica_name, self.num_shards = replica_name, num_shards
        self.client_lost = False     # its client went away before `finish` (build.py exits PEER_LOST)
        self.summary = None
        self._driver = None            # the identity of the client that drives this replica
        self._finished = False
        self._work = queue.Queue()
        self._answers = collections.deque()
        self._wake = self.context.socket(zmq.PAIR)
        self._wake.bind(f"inproc://replica-{id(self)}")
        self._waker = self.context.socket(zmq.PAIR)
        self._waker.connect(f"inproc://replica-{id(self)}")
        self.add_socket(self._wake, self._answer)
        self.serve({ReplicaOps.ComputeGradients: self._compute_gradients, ReplicaOps.RunStep: self._run_step,
                    ReplicaOps.Finish: self._finish})
        self._thread = threading.Thread(target=self._compute, args=(start,), name="replica-compute", daemon=True)
        self._thread.start()

    def describe(self):
        return {"replica": self.replica_name}

    # ------------------------------------------------ the ops: parked, run on the compute thread

    def _compute_gradients(self, call):
        min_version = call.args.min_version
        if min_version is not None and len(min_version) != self.num_shards:
            raise InvalidArgumentError(f"compute_gradients' min_version must hold one version per ps shard "
                                       f"({self.num_shards}), got {len(min_version)}")
        return self._queue(call, lambda trainer, input: self._gradients(trainer, input, min_version))

    def _run_step(self, call):
        return self._queue(call, self._step)

    def _finish(self, call):
        return self._queue(call, self._end)

    def _queue(self, call, work):
        if self._driver is None:
            self._driver = call.identity
        self._work.put((call, work))
        return self.park(call)

    def _gradients(self, trainer, input, min_version):
        batch = self._next(trainer, input)
        loss, rows, grads = trainer.gradients(batch, min_version)
        names = list(grads)
        return ({"loss": loss, "rows": rows, "versions": list(trainer.ps.versions), "names": names},
                [grads[n] for n in names])

    def _step(self, trainer, input):
        result = trainer.step(self._next(trainer, input))
        return {"loss": result.loss, "rows": result.batch_size, "global_step": result.global_step}, ()

    def _next(self, trainer, input):
        batch = input.next(before_waiting=trainer.settle)
        if batch is None:
            raise OutOfRangeError(f"{self.replica_name}: its input has ended")
        return batch

    def _end(self, trainer, input):
        input.cancel()
        self.summary = trainer.end()
        trainer.ps.close()
        return {k: self.summary[k] for k in ("steps", "examples", "seconds")}, ()

    # ------------------------------------------------ the compute thread and the answers

    def _compute(self, start):
        try:
            trainer, input = start()
        except BaseException as exc:     # every request then fails with why it could not start (a lost peer's
            log.exception("%s could not start", self.replica_name)    # exit is a SystemExit: its log says why)
            error = exc if isinstance(exc, OpError) else UnavailableError(
                f"{self.replica_name} could not start: {type(exc).__name__} {exc} (its log says more)")
            trainer = input = None
        while True:
            call, work = self._work.get()
            if work is None:
                return
            if trainer is None:
                answer = error
            else:
                try:
                    answer = work(trainer, input)
                except OpError as exc:
                    answer = exc
                except Exception as exc:   # a bug: logged here, the client told it is internal
                    log.exception("%s failed in %s", self.replica_name, call.op)
                    answer = InternalError(f"{self.replica_name} failed in {call.op}: {type(exc).__name__}: {exc}")
            self._answers.append((call, answer))
            self._waker.send(b"")

    def _answer(self):
        while self._wake.poll(0):
            self._wake.recv()
        while self._answers:
            call, answer = self._answers.popleft()
            if isinstance(answer, OpError):
                self.fail(call, answer)
            else:
                self.reply(call, *answer)
            if call.op == ReplicaOps.Finish.OP:
                self._finished = True
                log.info("%s finished: %s", self.replica_name, self.summary)
                self.stop()

    def on_client_gone(self, identity, error):
        super().on_client_gone(identity, error)
        if identity == self._driver and not self._finished:
            log.error("%s: its in-graph client went away before the end (%s): the replica stops",
                      self.replica_name, error.message)
            self.client_lost = True
            self.stop()

    def close(self):
        self._work.put((None, None))
        self._thread.join(timeout=10.0)
        self.remove_socket(self._wake)
        self._wake.close(0)
        self._waker.close(0)
        super().close()
