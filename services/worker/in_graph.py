"""In-graph replication's client: one process that owns the training and drives N replicas, each a worker
task on its own device (services/worker/replica.py), as TensorFlow's in-graph client builds one graph
with a tower per `/job:worker/task:i` (or `/gpu:k`) and runs it from one session.

The client is the chief (a Trainer: it initializes or restores the ps, runs the hooks, checkpoints and
ends the job); the replicas compute, each on its own share of the input, so no data goes through the
client. Two modes, as TensorFlow's texts set them side by side:

- sync: every step asks each replica for the gradients of its next batch at the step's parameters
  (the replicas pull them from the ps), averages them weighted by rows (the towers' average,
  towers.py) and makes one push: one update, one global step per step, whatever N is. The ps runs
  its async rule with this one pusher.
- async: each replica runs steps of its own (pull, compute, push) one after the other, as the client
  asks; each replica's push is one update. The client sees every replica step as one of its steps.

A replica whose input has ended leaves the step (the last sync steps average the replicas that still
had a batch); training ends when none is left or a hook stops it. A lost replica (its process gone or
silent for 3 s, or a step past `step_timeout`) ends the client with AbortedError naming the replica.
"""

import logging
import time

import zmq

from zmqflow.common.errors import AbortedError, InvalidArgumentError, OpError, OutOfRangeError
from zmqflow.services.worker.towers import weighted_average
from zmqflow.services.worker.trainer import StepResult, Trainer

log = logging.getLogger("worker")


class InGraphTrainer(Trainer):
    """The Trainer of the in-graph client: `fit(None, hooks)` drives `replicas` (ReplicaClients)."""

    def __init__(self, model, ps, replicas, mode="sync", step_timeout=60.0, **options):
        super().__init__(model, ps, replica=0, num_workers=1, is_chief=True, mode=mode, **options)
        if self._not_pulled:
            raise InvalidArgumentError(f"in-graph replication averages dense gradients: this model reads rows of "
                                       f"{self._not_pulled} or is split over workers; train it between-graph")
        self.replicas, self.step_timeout = list(replicas), step_timeout
        self.active = list(self.replicas)   # the replicas whose input has not ended
        self._running = {}                  # async: replica -> its step in flight
        self._pumped = {}                   # async: replica -> when its client last read its socket
        self.replica_summaries = []

    def resolved_config(self):
        return {**super().resolved_config(), "replication": "in-graph", "num_replicas": len(self.replicas)}

    def _warm_up(self):
        """The client computes nothing: its replicas compile their own kernels. The shards must apply every
        push on arrival: the client (sync) or each replica (async) is the pusher, never a sync aggregate."""
        synced = [s["shard"] for s in self.ps.stats() if s.get("mode") == "sync"]
        if synced:
            raise InvalidArgumentError(f"ps shards {synced} run the sync rule (SyncReplicasOptimizer), which waits for "
                                       "several workers' pushes; in-graph replication averages in its client (sync) "
                                       "or lets each replica push (async): start the shards with --mode async")

    def fit(self, input=None, hooks=()):
        """Drive the replicas until their input ends or a hook stops; the summary, with each replica's."""
        self.begin(hooks)
        try:
            while (result := self.step()) is not None:
                if self.after_step(result):
                    break
            self._finish_replicas()
        except BaseException:
            for replica in self.replicas:
                replica.close()
            raise
        return {**self.end(), "replication": "in-graph", "replicas": self.replica_summaries}

    def step(self, batch=None):
        """One step: sync, the replicas' averaged gradients pushed once; async, the next replica step that
        finished. None when every replica's input has ended."""
        started = time.perf_counter()
        result = self._sync_step() if self.mode == "sync" else self._async_step()
        if result is None:
            return None
        self.leases.step_took(time.perf_counter() - started)
        self.steps += 1
        self.examples += result.batch_size
        self.losses.append(result.loss)
        return result

    def _sync_step(self):
        asked = [(r, r.compute_gradients_async(self.ps.versions, timeout=self.step_timeout)) for r in self.active]
        answers = []
        for replica, call in asked:
            answer = self._answer(replica, call)
            if answer is not None:
                result, tensors = answer
                answers.append((result, dict(zip(result["names"], tensors))))
        if not answers:
            return None
        rows = [result["rows"] for result, _ in answers]
        weights = [n / sum(rows) for n in rows]
        grads = weighted_average([g for _, g in answers], weights)
        loss = weighted_average([result["loss"] for result, _ in answers], weights)
        self.ps.versions = list(answers[0][0]["versions"])   # the parameters the gradients were computed at
        self.ps.versions = [pushed["version"] for pushed in self.ps.push(grads, self.replica)]
        self.global_step = self.ps.versions[0]
        return StepResult(float(loss), sum(rows), self.global_step)

    def _async_step(self):
        while True:
            for replica in self.active:
                if replica not in self._running:
                    self._running[replica] = replica.run_step_async(timeout=self.step_timeout)
            if not self._running:
                return None
            replica = _first_done(self._running, self._pumped)
            answer = self._answer(replica, self._running.pop(replica))
            if answer is not None:
                result, _ = answer
                self.global_step = max(self.global_step, result["global_step"])
                return StepResult(float(result["loss"]), result["rows"], result["global_step"])

    def _answer(self, replica, call):
        """The replica's answer, or None when its input has ended (it leaves the steps); a lost replica is
        AbortedError naming it."""
        try:
            return call.result()
        except OutOfRangeError:
            self.active.remove(replica)
            log.info("%s: its input has ended (%d replicas left)", replica.name, len(self.active))
            return None
        except OpError as exc:
            raise AbortedError(f"in-graph replica {replica.name} at {replica.address} was lost: "
                               f"{type(exc).__name__}: {exc.message}") from None

    def _finish_replicas(self):
        """Every replica settles its last push and says it is done (a step still in flight is answered first:
        each replica takes its requests in order)."""
        for replica in self.replicas:
            try:
                self.replica_summaries.append({"replica": replica.name, **replica.finish(timeout=self.step_timeout)})
            except OpError as exc:
                raise AbortedError(f"in-graph replica {replica.name} at {replica.address} was lost at the end: "
                                   f"{type(exc).__name__}: {exc.message}") from None
            replica.close()
        self._running = {}


def _first_done(running, pumped):
    """The replica whose call in `running` ({replica: pending call}) is answered first. A client whose socket
    has something is read at once; every other one waits a moment at least every 100 ms (`pumped`: replica ->
    when it last did), so its heartbeats go out and a lost replica is noticed while another answers step
    after step."""
    while True:
        for replica, call in running.items():
            if call.done:
                return replica
        poller = zmq.Poller()
        for replica in running:
            poller.register(replica.rpc.socket, zmq.POLLIN)
        ready = {socket for socket, _ in poller.poll(50)}
        now = time.monotonic()
        for replica, call in running.items():
            if replica.rpc.socket in ready or now - pumped.get(replica, 0.0) >= 0.1:
                pumped[replica] = now
                call.wait(0.001)
