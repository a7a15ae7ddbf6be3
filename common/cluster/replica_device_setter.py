"""`replica_device_setter`: TensorFlow's device function that puts each variable on a ps task.

    setter = replica_device_setter(cluster=cluster, ps_strategy="greedy")
    with device_scope(setter):                 # zmqflow.device(setter), as `with tf.device(setter):`
        server = Server(cluster, "worker", 0, model="mlp")   # the model's variables are created here

The variables a task creates inside the scope (a `Server` and its `MonitoredTrainingSession` load the
model there) are placed by the setter; ps tasks and workers open the same scope, so they agree on
every variable's shard without talking. Called as a device function on an op, the setter returns
"/job:ps/task:K" for a variable op and the worker device ("/job:worker" by default) for any other, each
merged as TensorFlow merges them: fields the inner scopes set win, so under
`replica_device_setter(ps_tasks=2, worker_device="/job:worker/task:0")` an op inside `device("/gpu:1")` is
on "/job:worker/task:0/device:GPU:1". The i-th variable it sees gets the shard `placement()` gives the i-th
variable of a list: one rule, common/cluster/placement.py's.
"""

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.cluster.device import DeviceSpec
from zmqflow.common.cluster.placement import STRATEGIES, place, row_blocks
from zmqflow.common.wire.dtypes import as_numpy

VARIABLE_OPS = frozenset({"Variable", "VariableV2", "VarHandleOp", "VariableSpec"})
"""Op types the setter puts on a ps task (TF's STANDARD_PS_OPS, less the hash tables zmqflow has not)."""


class ReplicaDeviceSetter:
    """A device function and the placement of a model's variables over `num_ps` ps tasks."""

    def __init__(self, num_ps, strategy="round_robin", max_shard_bytes=None, ps_device="/job:ps",
                 worker_device="/job:worker", merge_devices=True):
        place([], num_ps, strategy, max_shard_bytes)      # the same checks as a placement's
        self.num_ps, self.strategy, self.max_shard_bytes = num_ps, strategy, max_shard_bytes
        # parsed now, so a bad string is named when the setter is made, not at the first op
        self.ps_device = DeviceSpec.from_string(ps_device or "").to_string()
        self.worker_device = DeviceSpec.from_string(worker_device or "").to_string()
        self.merge_devices = merge_devices
        self._loads, self._count = [0] * num_ps, 0

    def placement(self, variables):
        """The Placement of `variables` (VariableSpec list, in creation order): which shard holds each."""
        return place(list(variables), self.num_ps, self.strategy, self.max_shard_bytes)

    def __call__(self, op):
        """TF's _ReplicaDeviceChooser.device_function. The op's device as the inner scopes set it wins, field by
        field: a variable op gets ps_device (its task from the strategy, in the order variables come, unless the
        inner scopes name another job) under it, any other op worker_device under it."""
        device = getattr(op, "device", "") or ""
        if not self.merge_devices and device:
            return device
        current = DeviceSpec.from_string(device)
        kind = getattr(op, "type", None) or type(getattr(op, "_op", op)).__name__   # a VariableSpec has no type
        if self.ps_device and kind in VARIABLE_OPS:
            ps = DeviceSpec.from_string(self.ps_device)
            if ps.job and (not current.job or current.job == ps.job):
                ps = ps.replace(task=self._next_shard(op))
            return ps.make_merged_spec(current).to_string()
        return DeviceSpec.from_string(self.worker_device).make_merged_spec(current).to_string()

    def _next_shard(self, op):
        """The ps task of the next variable: placement()'s rule, so the device function and the placement agree."""
        shards = []
        for start, end in _blocks(op, self.max_shard_bytes):
            if self.strategy == "round_robin":
                shard = self._count % self.num_ps
            else:
                shard = self._loads.index(min(self._loads))
            self._loads[shard] += _block_bytes(op, start, end)
            self._count += 1
            shards.append(shard)
        return shards[0]

    def __repr__(self):
        return (f"replica_device_setter(ps_tasks={self.num_ps}, ps_device={self.ps_device!r}, "
                f"worker_device={self.worker_device!r}, ps_strategy={self.strategy!r})")


def replica_device_setter(ps_tasks=0, ps_device="/job:ps", worker_device="/job:worker", merge_devices=True,
                          cluster=None, ps_strategy="round_robin", max_shard_bytes=None):
    """tf.train.replica_device_setter: `ps_tasks` (or the ps job of `cluster`) shards, `ps_strategy`
    "round_robin" (TF's default) or "greedy" (TF's GreedyLoadBalancingStrategy by byte size), and
    `max_shard_bytes` to split a large variable into row blocks (as a fixed-size partitioner).
    Devices merge as TensorFlow's: what the inner scopes set wins, `worker_device` (default "/job:worker")
    and `ps_device` fill in the rest; `merge_devices=False` keeps an op's inner device as it is.
    Where TensorFlow returns no setter for ps_tasks=0, this is an error: zmqflow always has a ps."""
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
    return ReplicaDeviceSetter(ps_tasks, ps_strategy, max_shard_bytes, ps_device, worker_device, merge_devices)


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
