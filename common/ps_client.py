"""Talk to all ps shards at once: one pull and one push per shard per step, in flight together.

The client knows the placement (computed from the same variable list as the
shards, no coordination), so it splits gradients into the shards' pieces and
assembles partitioned variables back from their row blocks. Each shard keeps
its own version; the global step is ps 0's.
"""

import ml_dtypes
import numpy as np

from common.rpc_client import RpcClient

BF16 = np.dtype(ml_dtypes.bfloat16)


class PsClient:
    def __init__(self, endpoints, placement, bf16=False, timeout=30.0, name="worker"):
        self.endpoints = list(endpoints)
        self.placement = placement
        self.bf16 = bf16
        self.timeout = timeout
        self.clients = [RpcClient(e, default_timeout=timeout, name=f"{name}-ps{i}") for i, e in enumerate(self.endpoints)]
        self.shard_keys = [[p.key for p in placement.for_shard(i)] for i in range(len(self.endpoints))]
        self.versions = [0] * len(self.endpoints)

    # ------------------------------------------------ start-up

    def initialize(self, values, step=0):
        """Chief: send every shard the initial values of its pieces."""
        pieces = self._split(values)
        calls = [c.submit("init", {"step": step, "names": keys}, [pieces[k] for k in keys])
                 for c, keys in zip(self.clients, self.shard_keys)]
        return [call.result()[0]["version"] for call in calls]

    def restore(self, directory):
        """Chief: every shard loads its rows of the latest checkpoint in `directory`."""
        calls = [c.submit("restore", {"dir": str(directory)}) for c in self.clients]
        return [call.result()[0] for call in calls]

    def wait_ready(self, timeout=60.0):
        calls = [c.submit("wait_ready", timeout=timeout) for c in self.clients]
        return [call.result()[0]["version"] for call in calls]

    # ------------------------------------------------ the step

    def pull_async(self, min_version=None, timeout=None):
        """`min_version`: an int for every shard or a list, one per shard (sync: wait for the step)."""
        if min_version is not None and not isinstance(min_version, (list, tuple)):
            min_version = [min_version] * len(self.clients)
        calls = []
        for i, client in enumerate(self.clients):
            args = {"bf16": self.bf16}
            if min_version is not None:
                args["min_version"] = min_version[i]
            calls.append(client.submit("pull", args, timeout=timeout or self.timeout))
        return _Gathered(calls, self._assemble_pull)

    def pull(self, min_version=None, timeout=None):
        """{variable: value} of the whole model; sets `versions`."""
        return self.pull_async(min_version, timeout).result()

    def push_async(self, grads, replica=0):
        pieces = self._split(grads)
        calls = []
        for i, (client, keys) in enumerate(zip(self.clients, self.shard_keys)):
            tensors = [pieces[k] for k in keys]
            if self.bf16:
                tensors = [t.astype(BF16) for t in tensors]
            calls.append(client.submit("push", {"version": self.versions[i], "replica": replica, "names": keys,
                                                "bf16": self.bf16}, tensors))
        return _Gathered(calls, lambda replies: [r[0] for r in replies])

    def push(self, grads, replica=0):
        """Push gradients tagged with the versions of the last pull; one result per shard."""
        return self.push_async(grads, replica).result()

    # ------------------------------------------------ checkpoints and the end

    def save(self, directory, keep=5, config=None):
        """Every shard writes its pieces, then the checkpoint is committed (atomic, `latest` updated)."""
        from services.ps import checkpoint
        step = self.clients[0].call("stats")[0]["version"]  # the global step lives on ps 0
        calls = [c.submit("save", {"dir": str(directory), "step": step}) for c in self.clients]
        for call in calls:
            call.result()
        return checkpoint.commit(str(directory), step, len(self.clients), config or {}, keep=keep)

    def stats(self):
        return [c.call("stats", timeout=5.0)[0] for c in self.clients]

    def worker_done(self, replica):
        for call in [c.submit("worker_done", {"replica": replica}) for c in self.clients]:
            call.result()

    def shutdown(self):
        for call in [c.submit("shutdown", timeout=5.0) for c in self.clients]:
            call.result()

    def close(self):
        for c in self.clients:
            c.close()

    # ------------------------------------------------ pieces <-> variables

    def _split(self, values):
        pieces = {}
        for name, value in values.items():
            pieces.update(self.placement.split(name, value))
        return pieces

    def _assemble_pull(self, replies):
        parts = {}
        for i, (result, tensors) in enumerate(replies):
            self.versions[i] = result["version"]
            for key, t in zip(result.get("names", []), tensors):
                parts[key] = t.astype(np.float32) if t.dtype == BF16 else t
        return {v: self.placement.assemble(v, parts) for v in self.placement.variables()}


class _Gathered:
    """Requests to every shard, in flight together; `result()` waits for all."""

    def __init__(self, calls, combine):
        self.calls, self.combine = calls, combine

    def result(self):
        return self.combine([c.result() for c in self.calls])
