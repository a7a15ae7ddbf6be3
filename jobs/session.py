"""TensorFlow 1.x's between-graph API over zmqflow's services: `Server` and `MonitoredTrainingSession`.

    cluster = zmqflow.ClusterSpec({"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223", "127.0.0.1:2224"]})
    server = zmqflow.Server(cluster, job_name, task_index, model="mlp")
    if job_name == "ps":
        server.join()                                  # serves its shard until the chief says the end
    else:
        with zmqflow.MonitoredTrainingSession(server, is_chief=task_index == 0,
                                              hooks=[zmqflow.StopAtStepHook(last_step=1000)]) as sess:
            while not sess.should_stop():
                sess.run(*my_next_batch())             # one step: gradients pushed, parameters pulled

Unlike TensorFlow, the model is named up front (every task derives the same variables and
placement from it, so the ps knows its shard without a graph); the optimizer and the update mode
are the ps tasks' (`Server(..., optimizer=, mode=)`). The chief initializes or restores the
variables, checkpoints with `checkpoint_dir`, and at the end waits for the other workers and,
with `shutdown_ps` (default), tells the ps tasks to exit so their `join()` returns.

Shared variables, as the seeds' simple_client.py uses them: any client makes a `Session` on the cluster
and reaches the same variable by name, in the enclosing `zmqflow.container(...)`; `zmqflow.reset(target,
containers)` (TF's Session.reset) frees a container's:

    sess = zmqflow.Session("127.0.0.1:2222")                  # a ps address, a Server or a ClusterSpec
    with zmqflow.container("experiment0"):
        var = sess.variable("var", initial_value=0.0)          # created once; another client gets the same
    var.assign_add(1.0)                                        # atomic on its ps task
    zmqflow.reset("127.0.0.1:2222", ["experiment0"])          # var.read_value() is NotFoundError now
"""

import threading

from zmqflow.common.cluster.spec import CHIEF_JOBS, ClusterSpec
from zmqflow.common.rpc.probe import endpoint_of
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.cluster.replica_device_setter import active_setter, replica_device_setter
from zmqflow.common.clients.ps import PsClient, SharedVariables
from zmqflow.models.registry import load_model, model_variables
from zmqflow.jobs.spec import DEFAULT_OPTIMIZER
from zmqflow.models.spec import resolve_model
from zmqflow.services.worker import hooks as H
from zmqflow.services.worker.trainer import Trainer


class Server:
    """One task of a cluster (tf.train.Server). A ps task builds its shard's service, bound to its
    address in the cluster; `join()` serves until shut down. A worker (or chief) task keeps the cluster
    for its session. The placement of the model's variables is the `device_setter`'s (or that of the
    `replica_device_setter` whose device scope encloses the constructor; else round-robin). A ps task
    writes the chief's checkpoints only under `checkpoint_root` (default: the current directory;
    docs/security.md)."""

    def __init__(self, cluster, job_name, task_index=0, model=None, optimizer=None, mode="async",
                 device_setter=None, checkpoint_root=None):
        self.cluster = ClusterSpec(cluster)
        self.cluster.validate()
        self.cluster.validate_task(job_name, task_index)
        chiefs = [job for job in CHIEF_JOBS if job in self.cluster.jobs]
        if "ps" not in self.cluster.jobs or not ("worker" in self.cluster.jobs or chiefs):
            raise InvalidArgumentError("the cluster needs a ps job and a worker job")
        if job_name not in ("ps", "worker", *chiefs):
            raise InvalidArgumentError(f"job {job_name!r} has no part in training: a task is ps, worker or chief")
        self.job_name, self.task_index, self.mode = job_name, int(task_index), mode
        self.model_spec = resolve_model(model)
        self.num_ps = self.cluster.num_tasks("ps")
        self._chiefs = self.cluster.num_tasks(chiefs[0]) if chiefs else 0
        self.num_workers = self._chiefs + (self.cluster.num_tasks("worker") if "worker" in self.cluster.jobs else 0)
        self.device_setter = device_setter or active_setter() or replica_device_setter(self.num_ps)
        if self.device_setter.num_ps != self.num_ps:
            raise InvalidArgumentError(f"the device setter places variables on {self.device_setter.num_ps} ps tasks; "
                                       f"the cluster has {self.num_ps}")
        self.service = None
        if job_name == "ps":
            from zmqflow.services.ps.server import PsService
            variables = model_variables(self.model_spec)
            pieces = {p.key: p for p in self.placement(variables).for_shard(self.task_index)}
            options = {"optimizer": optimizer or dict(DEFAULT_OPTIMIZER), "mode": mode}
            if mode == "sync":
                options["replicas_to_aggregate"] = self.num_workers
            self.service = PsService(f"tcp://{self.cluster.task_address('ps', self.task_index)}", self.task_index,
                                     pieces, options, trainable={v.name for v in variables if v.trainable},
                                     checkpoint_root=checkpoint_root, num_shards=self.num_ps)

    @classmethod
    def from_tf_config(cls, model=None, optimizer=None, mode="async", device_setter=None, env=None):
        """The task the TF_CONFIG environment variable names (as Kubeflow's TFJob sets it):
        {"cluster": {"ps": [...], "worker": [...], "chief": [...]}, "task": {"type": "worker", "index": 0}}."""
        task = ClusterSpec.from_tf_config(env)
        if task is None:
            raise InvalidArgumentError('TF_CONFIG is not set (or is "{}"): it names the cluster and this task, e.g. '
                                       '{"cluster": {"ps": ["host:2222"], "worker": ["host:2223"]}, '
                                       '"task": {"type": "worker", "index": 0}}')
        if task.task_type is None:
            raise InvalidArgumentError("TF_CONFIG has a cluster but no task type: set \"task\": "
                                       "{\"type\": \"worker\", \"index\": 0}")
        try:
            return cls(task.cluster, task.task_type, task.task_index, model=model, optimizer=optimizer, mode=mode,
                       device_setter=device_setter)
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"TF_CONFIG: {e}") from None

    def placement(self, variables):
        """Which ps task holds each of `variables` (every task computes the same)."""
        return self.device_setter.placement(variables)

    @property
    def replica(self):
        """This worker's replica index: the chief job's tasks first, then the worker job's."""
        if self.job_name == "ps":
            raise InvalidArgumentError(f"a ps task is no replica (/job:ps/task:{self.task_index})")
        return self.task_index + (self._chiefs if self.job_name == "worker" else 0)

    @property
    def is_chief(self):
        return self.job_name != "ps" and self.replica == 0

    @property
    def ps_endpoints(self):
        return [self.cluster.endpoint("ps", i) for i in self.cluster.task_indices("ps")]

    def join(self):
        """A ps task: serve until the chief shuts the ps down (or SIGTERM/SIGINT in the main thread)."""
        if self.service is None:
            raise InvalidArgumentError(f"join() serves a ps task; this is /job:{self.job_name}/task:{self.task_index}")
        self.service.run(install_signals=threading.current_thread() is threading.main_thread())


class MonitoredTrainingSession:
    """A worker's training session (tf.train.MonitoredTrainingSession): `run(x, y)` makes one step of
    between-graph replication, hooks see every step, `should_stop()` says when to end."""

    def __init__(self, server, is_chief=None, hooks=(), checkpoint_dir=None, save_checkpoint_steps=None,
                 seed=0, shutdown_ps=True, backend="numba"):
        if server.job_name == "ps":
            raise InvalidArgumentError("a training session runs on a worker task, not on a ps task")
        self.server, self.shutdown_ps = server, shutdown_ps
        self.model = load_model(server.model_spec, backend=backend)
        self.ps = PsClient(server.ps_endpoints, server.placement(self.model.variables()),
                           name=f"worker{server.replica}")
        is_chief = server.is_chief if is_chief is None else is_chief
        hooks = list(hooks)
        if is_chief and checkpoint_dir:
            hooks.append(H.CheckpointHook(checkpoint_dir, every_steps=save_checkpoint_steps))
        self.hooks = hooks
        self.trainer = Trainer(self.model, self.ps, replica=server.replica, num_workers=server.num_workers,
                               is_chief=is_chief, mode=server.mode, seed=seed, checkpoint_dir=checkpoint_dir,
                               config={"model": server.model_spec})
        self._stop = False

    def __enter__(self):
        self.trainer.begin(self.hooks)
        return self

    def run(self, x, y):
        """One training step on the batch (x, y); returns its loss."""
        result = self.trainer.step((x, y))
        if self.trainer.after_step(result):
            self._stop = True
        return result.loss

    def should_stop(self):
        return self._stop

    @property
    def global_step(self):
        return self.trainer.global_step

    def evaluate(self, x, y):
        """Accuracy of the current parameters on (x, y)."""
        return self.trainer.evaluate(x, y)

    def __exit__(self, *exc):
        trainer = self.trainer
        try:
            if exc[0] is None:
                self.summary = trainer.end()
                if trainer.is_chief and self.shutdown_ps:
                    self.ps.shutdown()
        finally:
            for hook in self.hooks:        # after every hook's end: one may still report to another
                if callable(getattr(hook, "close", None)):
                    hook.close()
            self.ps.close()


class Session:
    """A client's session on a cluster (tf.Session(target)), for what its ps tasks hold beside the model:
    shared variables, by name, in resource containers.

    `target`: a `Server` (its cluster's ps tasks), a `ClusterSpec` (or its dict), one ps address
    ("host:port", "tcp://host:port" or TF's "grpc://host:port") or a list of them in task order. Every
    client that names the same ps tasks reaches the same variables: each lives on the task that
    `shared_variable_shard` computes from its container and name."""

    def __init__(self, target, timeout=30.0):
        self.target = target
        self.ps_endpoints = ps_endpoints(target)
        self._shared = SharedVariables(self.ps_endpoints, timeout)

    def variable(self, name, initial_value=None, dtype=None, container=None):
        """The shared variable `name` in `container` (default: the enclosing `zmqflow.container` scope's, else
        ""). With `initial_value` (and `dtype`; else TF's: Python ints int32, floats float32) it is created
        unless it exists, when it is used as it is (TF's initializer guarded by is_variable_initialized).
        Without, it must exist (NotFoundError). Its methods: read_value, assign, assign_add, scatter_add."""
        return self._shared.variable(name, initial_value, dtype, container)

    def list_variables(self, container=None):
        """Every shared variable on the ps tasks (of `container` when given): container, name, dtype, shape."""
        return self._shared.list(container)

    @staticmethod
    def reset(target, containers=None, broker=None):
        """TF's Session.reset: free every resource of `containers` (a name or a list; None: every container
        holding a shared variable) on the target's ps tasks, and the queues of those containers on `broker`
        when given. {container: resources freed}. The model's variables are in no container and stay."""
        freed = SharedVariables(ps_endpoints(target)).reset(containers)
        if broker is not None:
            from zmqflow.common.clients.queues import reset as reset_queues
            for answer in reset_queues(list(freed), broker):
                freed[answer["container"]] = freed.get(answer["container"], 0) + answer["freed"]
        return freed

    def close(self):
        """Nothing to free: the session's connections are this thread's, shared with the other clients."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def reset(target, containers=None, broker=None):
    """`zmqflow.reset(target, ["name"])`: Session.reset, for one who holds no session."""
    return Session.reset(target, containers, broker)


def ps_endpoints(target):
    """The ZeroMQ endpoints of the ps tasks a session's `target` names (see Session)."""
    if isinstance(target, Server):
        return target.ps_endpoints
    if isinstance(target, (ClusterSpec, dict)):
        cluster = ClusterSpec(target)
        if "ps" not in cluster.jobs:
            raise InvalidArgumentError(f"the session's cluster has no ps job (jobs: {', '.join(cluster.jobs)})")
        return [cluster.endpoint("ps", i) for i in cluster.task_indices("ps")]
    addresses = [target] if isinstance(target, str) else target
    if not isinstance(addresses, (list, tuple)) or not addresses or not all(
            isinstance(a, str) and a.strip() for a in addresses):
        raise InvalidArgumentError(f"a session's target is a ps address (host:port), a list of them, a Server or a "
                                   f"ClusterSpec, got {target!r:.80}")
    return [a.strip().replace("grpc://", "tcp://", 1) if a.strip().startswith("grpc://") else endpoint_of(a)
            for a in addresses]
