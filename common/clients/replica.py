"""The in-graph client's link to one replica (services/worker/replica.py): its ops, each in flight at once.

`name` is how errors name the replica: its device string (`/job:worker/task:1`), so a lost one is
known by the place the user put it.
"""

from zmqflow.common.rpc.client import OpClient
from zmqflow.common.wire.protocol import ReplicaOps


class ReplicaClient(OpClient):
    def __init__(self, address, name, timeout=60.0, **rpc_options):
        super().__init__(address, timeout, name=f"client-to-{name}", **rpc_options)
        self.name = name

    def compute_gradients_async(self, min_version=None, timeout=None):
        """Sync: (loss, rows, versions, {variable: gradient}) of the replica's next batch, as a pending call."""
        return self.rpc.submit(ReplicaOps.ComputeGradients(None if min_version is None else list(min_version)),
                               timeout=timeout)

    def run_step_async(self, timeout=None):
        """Async: one step of the replica's own (its push included); answers loss, rows, global_step."""
        return self.rpc.submit(ReplicaOps.RunStep(), timeout=timeout)

    def finish(self, timeout=None):
        """The replica's end: its summary (steps, examples, seconds); it exits after answering."""
        return self.rpc.call(ReplicaOps.Finish(), timeout=timeout)[0]
