"""`replica_device_setter`: TensorFlow's device function that puts each variable on a ps task.

    setter = replica_device_setter(cluster=cluster, ps_strategy="greedy")
    with device_scope(setter):                 # zmqflow.device(setter), as `with tf.device(setter):`
        server = Server(cluster, "worker", 0, model="mlp")   # the model's variables are created here

The variables a task creates inside the scope (a `Server` and its `MonitoredTrainingSession` load the
model there) are placed by the setter; ps tasks and workers open the same scope, so they agree on
every variable's shard without talking. Called as a device function on an op, the setter returns
"/job:ps/task:K" for a variable op and the worker device for any other, giving the i-th variable it
sees the shard `placement()` gives the i-th variable of a list: one rule, common/cluster/placement.py's.
"""

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.cluster.placement import STRATEGIES, place, row_blocks
from zmqflow.common.wire.dtypes import as_numpy

VARIABLE_OPS = frozenset({"Variable", "VariableV2", "VarHandleOp", "VariableSpec"})
"""Op types the setter puts on a ps task (TF's STANDARD_PS_OPS, less the hash tables zmqflow has not)."""


class ReplicaDeviceSetter:
    """A device function and the placement of a model's variables over `num_ps` ps tasks."""

    def __init__(self, num_ps, strategy="round_robin", max_shard_bytes=None, ps_device="/job:ps",
                 worker_device=None):
        place([], num_ps, strategy, max_shard_bytes)      # the same checks as a placement's
        self.num_ps, self.strategy, self.max_shard_bytes = num_ps, strategy, max_shard_bytes
        self.ps_device, self.worker_device = ps_device.rstrip("/"), worker_device
        self._loads, self._count = [0] * num_ps, 0

    def placement(self, variables):
        """The Placement of `variables` (VariableSpec list, in creation order): which shard holds each."""
        return place(list(variables), self.num_ps, self.strategy, self.max_shard_bytes)

    def __call__(self, op):
        """TF's device function: a ps task for a variable op (in the order they come), else the worker's."""
        kind = getattr(op, "type", None) or type(getattr(op, "_op", op)).__name__   # a VariableSpec has no type
        if kind not in VARIABLE_OPS:
            return self.worker_device or getattr(op, "device", "") or ""
        shards = []
        for start, end in _blocks(op, self.max_shard_bytes):
            if self.strategy == "round_robin":
                shard = self._count % self.num_ps
            else:
                shard = self._loads.index(min(self._loads))
            self._loads[shard] += _block_bytes(op, start, end)
            self._count += 1
            shards.append(shard)
        return f"{self.ps_device}/task:{shards[0]}"

    def __repr__(self):
        return f"replica_device_setter(ps_tasks={self.num_ps}, ps_strategy={self.strategy!r})"


def replica_device_setter(ps_tasks=0, ps_device="/job:ps", worker_device=None, cluster=None,
                          ps_strategy="round_robin", max_shard_bytes=None):
    """tf.train.replica_device_setter: `ps_tasks` (or the ps job of `cluster`) shards, `ps_strategy`
    "round_robin" (TF's default) or "greedy" (TF's GreedyLoadBalancingStrategy by byte size), and
    `max_shard_bytes` to split a large variable into row blocks (as a fixed-size partitioner)."""
    if cluster is not None:
        from zmqflow.common.cluster.spec import ClusterSpec
        cluster = ClusterSpec(cluster)
        if "ps" not in cluster.jobs:
            raise InvalidArgumentError(f"replica_device_setter: the cluster has no ps job (jobs: "
                                       f"{', '.join(cluster.jobs) or 'none'})")
        ps_tasks = cluster.num_tasks("ps")
    if type(ps_tasks) is not int or ps_tasks < 1:
        raise InvalidArgumentError(f"replica_device_setter needs ps_tasks >= 1 or a cluster with a ps job, "
                                   f"got ps_tasks={ps_tasks!r}")
    if ps_strategy not in STRATEGIES:
        raise InvalidArgumentError(f"ps_strategy {ps_strategy!r} is not known; expected one of {', '.join(STRATEGIES)}")
    return ReplicaDeviceSetter(ps_tasks, ps_strategy, max_shard_bytes, ps_device, worker_device)


def active_setter():
    """The innermost ReplicaDeviceSetter of the enclosing device scopes, or None."""
    from zmqflow.common.cluster.device import scope_entries
    for entry in reversed(scope_entries()):
        if isinstance(entry, ReplicaDeviceSetter):
            return entry
    return None


def _blocks(op, max_shard_bytes):
    """The row blocks of a variable op that has a shape (one block for one that has not)."""
    if getattr(op, "shape", None) is None:
        return [(0, 1)]
    return row_blocks(op, max_shard_bytes)


def _block_bytes(op, start, end):
    shape = getattr(op, "shape", None)
    if shape is None:
        return 0
    rows = int(shape[0]) if len(shape) else 1
    per_row = (op.size // rows if rows else 0) * as_numpy(getattr(op, "dtype", "float32")).itemsize
    return per_row * (end - start)
