"""One job description: a `JobSpec` of small typed groups, and `tasks(spec, placement)`, the job's tasks.

    spec = JobSpec(cluster=ClusterConfig(ps=2, workers=2), data="flowers.yaml", model="mlp",
                   training=TrainConfig(epochs=8))
    for task in tasks(spec, deployment(spec)):     # [TaskSpec(role, index, options, env, ports)]
        print(task.name, task.argv())              # zmqflow ps --model /data/prepared/model.json ...

Every launcher renders the same tasks: local processes (`zmqflow train`, `zmqflow.Job`, jobs/local_cluster.py)
write each task's options to a `--config TASK.json`; the sweep runs one spec per point; `zmqflow compose
render` (docker-compose.yml) and `zmqflow k8s render` write each task's argv. What differs between them is
the `Placement`: where the tasks run, how they find each other and the files they share. A deployment's
ps and workers find their cluster in TF_CONFIG, as TensorFlow's tasks do, and every worker gets the chief's
options (a StatefulSet's pods share one command; TF_CONFIG says which is the chief); local processes get
the addresses of the processes already started as flags. The defaults are the dataclasses' (and the
shipped deployment is `DEPLOYMENT`); the scaling, run and failure groups follow Ray Train's configs.
"""

import dataclasses
import json
import os
from dataclasses import dataclass, field

from zmqflow.common.processes.service_cli import METRICS_BIND_ENV, to_flags
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.rpc.encryption import KEY_ENV
from zmqflow.models.kernels import DEFAULT_BACKEND
from zmqflow.models.spec import with_options
from zmqflow.common.optimizers import DEFAULT_OPTIMIZER   # the one default (common/optimizers.py says why)

INPUTS = ("readers", "preloaded", "ps")
MODES = ("async", "sync", "allreduce")
LOST_POLICIES = ("continue", "abort")
REPLICATIONS = ("between-graph", "in-graph")
"""between-graph: every worker runs its own loop (the default); in-graph: one client drives the workers as
replicas (services/worker/in_graph.py)."""


def optimizer_config(kind, learning_rate):
    """The optimizer a launcher's --optimizer and --learning-rate name (momentum: 0.9, as TF's examples)."""
    return {"kind": kind, "learning_rate": learning_rate, **({"momentum": 0.9} if kind == "momentum" else {})}


DEFAULT_BATCH_SIZE = 100


def batch_size_for(train_rows):
    """The default batch of a train split of `train_rows` rows: 100, or a tenth of a smaller split (rounded up), so
    an epoch is at least 10 steps, as Keras' 32 makes it on a few hundred rows. Why: 20 epochs of a 100-row CSV
    (70 train rows) are 14 steps of 100 rows and scored 0.7 test accuracy; of 7 rows, 200 steps, 1.0."""
    return max(1, min(DEFAULT_BATCH_SIZE, -(-int(train_rows) // 10)))


DECAY_END_LEARNING_RATE = 0.0001
"""tf.train.polynomial_decay's default end_learning_rate: where the decayed rate ends (or the rate, if lower)."""


def decayed_optimizer(spec, train_rows):
    """The job's optimizer with its constant learning rate falling linearly to DECAY_END_LEARNING_RATE over the
    job's global steps (tf.train.polynomial_decay with power 1), when `spec.training.learning_rate_decay`; a
    schedule of the user's own stays as it is. Why: two async workers compute on parameters a few updates old,
    and Adam's steps keep their size near the optimum, so a constant rate ends wherever the last steps left it:
    the defaults' MLP on a 442-row regression ended at test RMSE 36.0-40.7 after 20 epochs with Adam 0.004, and
    at 35.25-35.36 decayed (least squares: 34.3); on scikit-learn's diabetes set 53.1 decayed against 55.2-57.3
    (least squares: 53.3). MNIST's 10 epochs score the same (0.918-0.920 decayed, 0.912-0.924 constant)."""
    optimizer, training = spec.training.optimizer, spec.training
    rate = optimizer.get("learning_rate")
    if not training.learning_rate_decay or not isinstance(rate, (int, float)) or isinstance(rate, bool):
        return optimizer
    batches = -(-training.epochs * train_rows // (training.batch_size or batch_size_for(train_rows)))
    per_step = (spec.cluster.replicas_to_aggregate or spec.cluster.workers) if spec.cluster.mode == "sync" else 1
    return {**optimizer, "learning_rate": {"kind": "polynomial_decay", "learning_rate": rate,
                                           "decay_steps": max(1, batches // per_step),
                                           "end_learning_rate": min(rate, DECAY_END_LEARNING_RATE)}}


# A deployment's fixed ports (docker-compose.yml, deploy/k8s): every task serves Prometheus metrics on
# its ZeroMQ port + METRICS_OFFSET.
BROKER_PORT, PS_PORT, WORKER_PORT, SERVE_PORT, AGGREGATOR_PORT = 5555, 5600, 5610, 5700, 5800
READER_METRICS_PORT = 6620
GATEWAY_PORT = 8000            # HTTP (the Open Inference Protocol); its metrics on 9000
GATEWAY_GRPC_PORT = 8001       # the same protocol over gRPC (--grpc-bind), Triton's and KServe's port
METRICS_OFFSET = 1000
CHECKPOINTS = "/data/ckpt"     # the deployment's shared volume
PREPARED = "/data/prepared"    # what its one-shot `data` task writes: model.json, data-config.json, shards
MODEL_JSON, DATA_CONFIG = "model.json", "data-config.json"


@dataclass(frozen=True)
class ClusterConfig:
    """How many tasks of each kind, and how the ps shards apply the workers' gradients (allreduce: no ps
    shards, the workers reduce their gradients over a ring among themselves)."""
    ps: int = 1                         # 0 with mode allreduce (job_spec makes it so when not given)
    workers: int = 2
    spare_replicas: int = 0             # sync: workers beyond replicas_to_aggregate
    mode: str = "async"
    lost_policy: str = "continue"       # allreduce: a lost worker aborts the job, or the ring goes on without it
    lost_after_secs: float = 5.0        # allreduce: seconds of silence that make a worker lost
    replicas_to_aggregate: int | None = None   # sync: default every worker (spares apart)
    elastic: bool = False               # sync: workers join and leave while training (ps --elastic)
    readers: int = 1                    # reader processes (input "readers")
    max_shard_bytes: int | None = None  # variables larger than this split into row blocks over the ps shards
    replication: str = "between-graph"  # or in-graph: one client drives the workers as its replicas
    replica_devices: tuple = ()         # in-graph: worker i's device (/gpu:1, /job:worker/task:1/cpu:0)


@dataclass(frozen=True)
class InputConfig:
    """How the training rows reach the workers: reader processes streaming the prepared shards, a feeder
    in the launcher (preloaded), or held once on ps 0 and sliced by row (ps)."""
    kind: str | None = None             # None: the launcher's choice (jobs/local_cluster.py's prepare_data)
    shuffle_queue: bool | None = None   # default: shuffle for readers (a file's rows come in order), FIFO else
    at_least_once: bool = False         # leased batches and file names (docs/queues.md)
    queue: str = "train"
    capacity: int = 20_000
    min_after_dequeue: int = 2_000

    @property
    def shuffled(self):
        return self.kind != "preloaded" if self.shuffle_queue is None else self.shuffle_queue


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 10
    batch_size: int | None = None       # None: batch_size_for(the train split's rows); a deployment: 100
    optimizer: dict = field(default_factory=lambda: dict(DEFAULT_OPTIMIZER))
    learning_rate_decay: bool = True    # a local job: the rate falls over its steps (decayed_optimizer)
    backend: str = DEFAULT_BACKEND
    bf16: bool = False
    seed: int = 0
    summary_every_steps: int = 10
    log_every: int | None = None        # the worker's default


@dataclass(frozen=True)
class CheckpointConfig:
    dir: str | None = None              # local processes: LOG_DIR/checkpoint
    every_steps: int | None = None
    keep: int | None = None             # the worker's default


@dataclass(frozen=True)
class ValidationConfig:
    """The chief's validation (with a data spec that has a validation split) and early stopping."""
    every_steps: int | None = 100
    every_secs: float | None = None
    early_stop_patience: int | None = None
    early_stop_metric: str | None = None


@dataclass(frozen=True)
class ServingConfig:
    """Model servers on the chief's checkpoints behind an aggregator and the HTTP gateway (deployments)."""
    replicas: int = 0
    name: str = "model"
    refresh_secs: int = 5


@dataclass(frozen=True)
class JobSpec:
    """A whole job. `model`: a built-in name, `path.py:build`, or a spec dict; `data`: a data spec (a YAML
    path, a dict or a built-in name such as `mnist`), or None for the shipped MNIST sample, not recorded
    in the checkpoints."""
    cluster: ClusterConfig = ClusterConfig()
    model: object = None                # None: the MNIST MLP 784-100-10
    model_options: tuple = ()           # KEY=VALUE (`--model-opt`), for the deployment's `data prepare`
    data: object = None
    input: InputConfig = InputConfig()
    training: TrainConfig = TrainConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    validation: ValidationConfig = ValidationConfig()
    serving: ServingConfig = ServingConfig()

    def __post_init__(self):
        c = self.cluster
        if self.input.kind not in (None, *INPUTS):
            raise InvalidArgumentError(f"input must be one of {', '.join(INPUTS)}, got {self.input.kind!r}")
        if c.mode not in MODES:
            raise InvalidArgumentError(f"mode must be one of {', '.join(MODES)}, got {c.mode!r}")
        if c.lost_policy not in LOST_POLICIES:
            raise InvalidArgumentError(f"lost_policy must be one of {', '.join(LOST_POLICIES)}, got {c.lost_policy!r}")
        allreduce = c.mode == "allreduce"
        if allreduce and (c.ps or c.spare_replicas or self.input.kind == "ps"):
            raise InvalidArgumentError("mode allreduce runs without ps shards (num_ps 0), spare replicas or input "
                                       f"'ps' (held on a ps): got num_ps {c.ps}, spare_replicas {c.spare_replicas}, "
                                       f"input {self.input.kind!r}")
        if c.elastic and (c.mode != "sync" or c.replicas_to_aggregate is not None or c.spare_replicas):
            raise InvalidArgumentError("elastic applies to sync mode, where each step aggregates every worker that is "
                                       "a member then: no replicas_to_aggregate, no spare_replicas")
        if c.replication not in REPLICATIONS:
            raise InvalidArgumentError(f"replication must be between-graph or in-graph, got {c.replication!r}")
        if c.replication == "in-graph":
            if allreduce:
                raise InvalidArgumentError("in-graph replication pushes through ps shards; mode allreduce has none: "
                                           "use mode sync or async, or between-graph replication")
            _check_in_graph(self)
        for name, value, least in (("ps", c.ps, 0 if allreduce else 1), ("workers", c.workers, 1),
                                   ("spare_replicas", c.spare_replicas, 0), ("readers", c.readers, 1), ("epochs", self.training.epochs, 1),
                                   ("batch_size", self.training.batch_size, 1)):
            if name == "batch_size" and value is None:    # the launcher's choice (batch_size_for)
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise InvalidArgumentError(f"{name} must be an integer >= {least}, not {value!r}")
        for name, value in (("data", self.data), ("model", self.model), ("serving name", self.serving.name)):
            if isinstance(value, str) and not value.strip():
                raise InvalidArgumentError(f"{name} must be a non-empty string, not {value!r}")
        with_options({}, self.model_options)   # KEY=VALUE, the value YAML, as `data prepare --model-opt` reads it
        if self.input.at_least_once and self.input.kind == "ps":
            raise InvalidArgumentError("at-least-once input leases batches of the broker's queue; input 'ps' is "
                                       "sliced by row on ps 0 (nothing to lease): use input 'readers' or 'preloaded'")
        if self.input.kind == "readers" and self.validation.early_stop_patience:
            raise InvalidArgumentError("early stopping closes the input queue under the readers, which take it as a "
                                       "failure: feed the data with input 'preloaded' or 'ps'")

    @property
    def total_workers(self):
        return self.cluster.workers + self.cluster.spare_replicas


def _check_in_graph(spec):
    """What in-graph replication cannot be asked for, named; its replica devices each on its own worker task."""
    c = spec.cluster
    if c.spare_replicas:
        raise InvalidArgumentError("spare replicas are between-graph sync's (the ps drops the slowest); an in-graph "
                                   "client waits for every replica: drop spare_replicas or use between-graph")
    if spec.input.at_least_once:
        raise InvalidArgumentError("at-least-once input acks a batch once its worker's push is on the ps; in-graph "
                                   "replicas' gradients reach the ps through the client: use between-graph")
    if c.replica_devices and len(c.replica_devices) != c.workers:
        raise InvalidArgumentError(f"replica_devices names {len(c.replica_devices)} devices for {c.workers} "
                                   "workers: one device per replica")
    from zmqflow.common.cluster.device import DeviceSpec
    for i, device in enumerate(c.replica_devices):
        named = DeviceSpec.from_string(device)
        if named.job not in (None, "worker") or named.task not in (None, i):
            raise InvalidArgumentError(f"replica {i}'s device {device!r}: replica {i} runs as /job:worker/task:{i}; "
                                       f"name that task or none (/job:worker/task:{i}/gpu:0, /gpu:0)")


ALIASES = {"num_ps": ("cluster", "ps"), "num_workers": ("cluster", "workers"), "ps": ("cluster", "ps"),
           "workers": ("cluster", "workers"), "input": ("input", "kind"), "checkpoint_dir": ("checkpoint", "dir"),
           "checkpoint_every_steps": ("checkpoint", "every_steps"), "keep_checkpoints": ("checkpoint", "keep"),
           "validate_every_steps": ("validation", "every_steps"), "validate_every_secs": ("validation", "every_secs"),
           "devices": ("cluster", "replica_devices")}
"""The flat names of `zmqflow train`'s flags and of LocalCluster's keywords, where they are not a group's own."""


def job_spec(base=None, **options):
    """`base` (default JobSpec()) with `options` by flat name: a group's field (epochs, batch_size, optimizer,
    mode, at_least_once, ...), an alias (num_ps, num_workers, input="ps", checkpoint_dir, ...) or a JobSpec
    field (model, data, training=TrainConfig(...)). None leaves a field as it is."""
    spec = base or JobSpec()
    top = {f.name for f in dataclasses.fields(JobSpec)}
    owners = {name.name: (group, name.name) for group in top if dataclasses.is_dataclass(getattr(spec, group))
              for name in dataclasses.fields(getattr(spec, group))}
    direct, nested = {}, {}
    for key, value in options.items():
        if value is None:
            continue
        if key in top and not (key in ALIASES and not dataclasses.is_dataclass(value)):
            direct[key] = value
        elif key in ALIASES or key in owners:
            group, name = ALIASES.get(key) or owners[key]
            nested.setdefault(group, {})[name] = value
        else:
            raise TypeError(f"{key!r} is not an option of a job (a JobSpec field or one of its groups')")
    cluster = nested.get("cluster", {})
    if cluster.get("mode") == "allreduce" and "ps" not in cluster and "cluster" not in direct:
        cluster["ps"] = 0      # an all-reduce job has no ps: num_ps need not say so
    for group, values in nested.items():
        direct[group] = dataclasses.replace(direct.get(group, getattr(spec, group)), **values)
    return dataclasses.replace(spec, **direct)


DEPLOYMENT = JobSpec(cluster=ClusterConfig(ps=2, workers=2), model="mlp", data="mnist", input=InputConfig("readers"),
                     training=TrainConfig(epochs=5),
                     checkpoint=CheckpointConfig(dir=CHECKPOINTS, every_steps=50), serving=ServingConfig(replicas=3))
"""The shipped topology: docker-compose.yml and deploy/k8s render it."""


CURVE_KEYS = ("member", "serving", "admin")
"""A deployment's client keys, one per role (`zmqflow keys generate DIR --clients member,serving,admin`: their
roles are common/rpc/encryption.py's DEFAULT_ROLES); each task dials with `curve_key`'s."""


def curve_key(task):
    """The client key a deployment's task dials with (its ZMQFLOW_CURVE_KEY), the least its requests need: the
    chief `admin` (it initializes or restores the ps shards and shuts them and the broker down), the other
    workers and the readers `member` (pull, push, enqueue, dequeue; a model server following the ps too), every
    other task `serving`: client ops (the servers' own healthcheck pings, the aggregator's and the gateway's
    predicts). None for the keys and data tasks, which dial nothing."""
    if task.role == "worker":
        return "admin" if task.index == 0 else "member"
    if task.role == "reader" or (task.role == "serve" and task.options.get("ps")):
        return "member"
    return None if task.role in ("keys", "data") else "serving"


@dataclass(frozen=True)
class Placement:
    """Where a job's tasks run. `cluster`: TF_CONFIG's cluster for a deployment (fixed ports, metrics, and
    the one-shot keys and data tasks), None for local processes, which get `broker` and `ps` as flags.
    `prepared`: the directory of model.json and data-config.json; `log_dir`: where local workers and readers
    write their results; `splits`: the data's splits (validation runs with a validation split only);
    `train_rows`: the epoch's length when no data config is recorded."""
    broker: str
    ps: tuple = ()
    cluster: dict | None = None
    prepared: str = PREPARED
    log_dir: str | None = None
    splits: tuple = ()
    train_rows: int | None = None
    container: str | None = None       # a resource container of the broker's queues (a sweep's run)
    hooks: tuple = ()                  # the workers' user hooks (module:Class)
    evaluate: bool = False             # the chief scores the test split at the end (no launcher does)
    stages: int = 1                    # a model split over workers by its layers: each copy of its stages one replica


def deployment(spec, host=lambda role, index: f"{role}{index}", prepared=PREPARED):
    """The placement of a deployment: task i of a role on `host(role, i)` at its fixed port."""
    for name, count, base in (("ps", spec.cluster.ps, PS_PORT), ("workers", spec.total_workers, WORKER_PORT),
                              ("serving replicas", spec.serving.replicas, SERVE_PORT)):
        if base + count - 1 > 65535 - METRICS_OFFSET:
            raise InvalidArgumentError(f"{name}={count}: the ports {base}.. (and their metrics ports) would pass "
                                       f"65535; at most {65535 - METRICS_OFFSET - base + 1}")
    cluster = {"ps": [f"{host('ps', i)}:{PS_PORT + i}" for i in range(spec.cluster.ps)],
               "worker": [f"{host('worker', i)}:{WORKER_PORT + i}" for i in range(spec.total_workers)],
               "broker": [f"broker:{BROKER_PORT}"]}
    return Placement(f"tcp://broker:{BROKER_PORT}", cluster=cluster, prepared=prepared, evaluate=True)


@dataclass
class TaskSpec:
    """One task: `zmqflow COMMAND... --option value ...` (argv) or `--config` with `options` (a JSON object)."""
    role: str
    index: int
    command: list                      # the zmqflow subcommand and its arguments
    options: dict                      # {"option-name": value}: None left out (and False, in argv)
    env: dict = field(default_factory=dict)
    ports: dict = field(default_factory=dict)   # {"zmq" | "http" | "metrics": port} of a deployment

    @property
    def name(self):
        return f"{self.role}{self.index}" if self.role in ("ps", "worker", "serve", "reader") else self.role

    def argv(self):
        return ["zmqflow", *self.command, *to_flags(self.options)]

    def config(self):
        """The options as `--config TASK.json` holds them."""
        return {k: v for k, v in self.options.items() if v is not None}

    def config_args(self, directory):
        """["--config", DIRECTORY/NAME.json], the file written: how local processes get their options."""
        path = os.path.join(directory, f"{self.name}.json")
        with open(path, "w") as f:
            json.dump(self.config(), f, indent=1)
        return ["--config", path]


def tasks(spec, placement):
    """Every task of the job, in start order: [keys, broker, data] (a deployment), ps shards, readers, workers,
    [model servers, aggregator, gateway] (a deployment with serving)."""
    deployed = placement.cluster is not None
    out = []
    if deployed:
        out.append(TaskSpec("keys", 0, ["keys", "generate", "/keys"], {"clients": ",".join(CURVE_KEYS), "keep": True}))
        out.append(_server("broker", 0, ["broker"], BROKER_PORT, {}))
        model = spec.model if isinstance(spec.model, str) or spec.model is None else json.dumps(spec.model)
        out.append(TaskSpec("data", 0, ["data", "prepare"], {"data": spec.data or "mnist", "model": model,
                                                                   "model-opt": list(spec.model_options),
                                                                   "out": placement.prepared}))
    for i in range(spec.cluster.ps):
        out.append(_ps_task(spec, placement, i))
    if spec.input.kind == "readers":
        out += [_reader_task(spec, placement, i) for i in range(spec.cluster.readers)]
    if spec.cluster.replication == "in-graph":
        if deployed:
            raise InvalidArgumentError("in-graph replication runs as local processes (zmqflow train, "
                                       "zmqflow.replicate); a deployment's workers train between-graph")
        out += [_replica_task(spec, placement, i) for i in range(spec.cluster.workers)]
        out.append(_client_task(spec, placement))
    else:
        out += [_worker_task(spec, placement, i) for i in range(spec.total_workers)]
    if deployed and spec.serving.replicas:
        out += _serving_tasks(spec, placement)
    if deployed:
        for task in out:
            if curve_key(task):
                task.env[KEY_ENV] = curve_key(task)
    return out


def _metrics(port):
    return f"0.0.0.0:{port}"


def _server(role, index, command, port, options):
    """A deployment's server task: it listens on every interface at `port`, its metrics at port + 1000."""
    return TaskSpec(role, index, command, {"bind": f"0.0.0.0:{port}", **options,
                                           "metrics-bind": _metrics(port + METRICS_OFFSET)},
                    ports={"zmq": port, "metrics": port + METRICS_OFFSET})


def _tf_config(placement, role, index):
    return {"TF_CONFIG": json.dumps({"cluster": placement.cluster, "task": {"type": role, "index": index}})}


def _ps_task(spec, placement, index):
    sync = spec.cluster.mode == "sync" and spec.cluster.replication == "between-graph"   # in-graph: one pusher
    replicas = spec.total_workers // placement.stages     # a pipeline's copy of its stages pushes as one worker
    elastic = sync and spec.cluster.elastic
    options = {"model": f"{placement.prepared}/{MODEL_JSON}", "optimizer": json.dumps(spec.training.optimizer),
               "mode": "sync" if sync else None, "elastic": True if elastic else None,
               "replicas-to-aggregate": (spec.cluster.replicas_to_aggregate
                                         or min(replicas, max(1, spec.cluster.workers // placement.stages)))
               if sync and not elastic else None,
               "total-num-replicas": replicas if sync and not elastic else None,
               "restore-from": spec.checkpoint.dir, "max-shard-bytes": spec.cluster.max_shard_bytes}
    if placement.cluster is None:
        return TaskSpec("ps", index, ["ps"], {"task-index": index, "num-ps": spec.cluster.ps, **options})
    port = PS_PORT + index
    return TaskSpec("ps", index, ["ps"], {**options, "metrics-bind": _metrics(port + METRICS_OFFSET)},
                    env=_tf_config(placement, "ps", index), ports={"zmq": port, "metrics": port + METRICS_OFFSET})


def _reader_task(spec, placement, index):
    shuffled = spec.input.shuffled
    options = {"broker": placement.broker, "data-config": f"{placement.prepared}/{DATA_CONFIG}",
               "queue": spec.input.queue, "queue-kind": None if shuffled else "fifo",
               "num-epochs": spec.training.epochs, "capacity": spec.input.capacity,
               "min-after-dequeue": min(spec.input.min_after_dequeue, (placement.train_rows or 1 << 62) // 2)
               if shuffled else None, "seed": spec.training.seed,
               "at-least-once": spec.input.at_least_once}
    if placement.cluster is None:
        return TaskSpec("reader", index, ["reader"], {**options, "progress-every-secs": 0,
                                                      "json-out": f"{placement.log_dir}/reader-{index}.json"})
    return TaskSpec("reader", index, ["reader"], {**options, "metrics-bind": _metrics(READER_METRICS_PORT)},
                    ports={"metrics": READER_METRICS_PORT})


def _worker_task(spec, placement, index):
    deployed = placement.cluster is not None
    recorded = spec.data is not None
    options = {"broker": placement.broker if spec.input.kind != "ps" else None,
               "queue": spec.input.queue if spec.input.kind != "ps" else None,
               "preloaded": spec.input.queue if spec.input.kind == "ps" else None,
               "epochs": spec.training.epochs if spec.input.kind == "ps" else None,
               "container": placement.container, "model": f"{placement.prepared}/{MODEL_JSON}",
               "max-shard-bytes": spec.cluster.max_shard_bytes,
               "batch-size": spec.training.batch_size or DEFAULT_BATCH_SIZE, "backend": spec.training.backend,
               "log-every": spec.training.log_every,
               "mode": spec.cluster.mode if spec.cluster.mode != "async" else None,
               "bf16": spec.training.bf16, "at-least-once": spec.input.at_least_once,
               "hook": list(placement.hooks)}
    if not deployed:
        options = {"task-index": index, "num-workers": spec.total_workers, "ps": list(placement.ps), **options,
                   "json-out": f"{placement.log_dir}/worker{index}-result.json",
                   "summaries": f"{placement.log_dir}/worker{index}-summaries.jsonl",
                   "summary-every-steps": spec.training.summary_every_steps,
                   "examples-per-epoch": None if recorded else placement.train_rows}
    if spec.cluster.mode == "allreduce":   # no ps: each worker applies the optimizer; the ring finds lost ones
        options.update({"optimizer": json.dumps(spec.training.optimizer), "lost-policy": spec.cluster.lost_policy,
                        "lost-after-secs": spec.cluster.lost_after_secs,
                        "bind": None if deployed else "tcp://127.0.0.1:*"})   # deployed: TF_CONFIG's address
    if index == 0 or deployed:      # a deployment's pods share one command: TF_CONFIG makes one the chief
        options.update(_chief_options(spec, placement))
    if not deployed:
        return TaskSpec("worker", index, ["worker"], options)
    metrics = WORKER_PORT + index + METRICS_OFFSET    # from the environment: the workers share one command
    return TaskSpec("worker", index, ["worker"], options,
                    env={**_tf_config(placement, "worker", index), METRICS_BIND_ENV: _metrics(metrics)},
                    ports={"metrics": metrics})


def _chief_options(spec, placement):
    """What the chief (between-graph worker 0, or the in-graph client) does besides training: evaluate,
    validate, checkpoint, and end the job."""
    deployed, recorded, v = placement.cluster is not None, spec.data is not None, spec.validation
    options = {"evaluate": placement.evaluate,
               "data-config": f"{placement.prepared}/{DATA_CONFIG}" if recorded else None,
               "shutdown-ps": spec.cluster.ps > 0, "shutdown-broker": deployed,
               "checkpoint-dir": spec.checkpoint.dir, "checkpoint-every-steps": spec.checkpoint.every_steps,
               "keep-checkpoints": spec.checkpoint.keep}
    validate = "validation" in placement.splits and recorded and spec.cluster.mode != "allreduce"   # it reads the ps
    if validate and (v.every_steps or v.every_secs):
        options.update({"validate-every-steps": v.every_steps or None, "validate-every-secs": v.every_secs,
                        "early-stop-patience": v.early_stop_patience, "early-stop-metric": v.early_stop_metric})
    return options


def _replica_task(spec, placement, index):
    """In-graph: worker `index` as a replica, reading its own share of the input on its device; its client
    learns its endpoint once it listens."""
    options = _worker_task(spec, placement, index).options
    chief = _chief_options(spec, placement)
    for key in ("json-out", "summaries", "summary-every-steps", "mode", "hook", "log-every", *chief):
        options.pop(key, None)
    devices = spec.cluster.replica_devices
    return TaskSpec("worker", index, ["worker"], {**options, "in-graph": True,
                                                  "device": devices[index] if devices else None})


def _client_task(spec, placement):
    """In-graph: the client that drives the replicas (its --replica options are added once they listen)."""
    options = {"ps": list(placement.ps), "model": f"{placement.prepared}/{MODEL_JSON}",
               "max-shard-bytes": spec.cluster.max_shard_bytes, "batch-size": spec.training.batch_size,
               "backend": spec.training.backend, "log-every": spec.training.log_every, "mode": spec.cluster.mode,
               "bf16": spec.training.bf16, "hook": list(placement.hooks),
               "json-out": f"{placement.log_dir}/client-result.json",
               "summaries": f"{placement.log_dir}/client-summaries.jsonl",
               "summary-every-steps": spec.training.summary_every_steps,
               "examples-per-epoch": None if spec.data is not None else placement.train_rows,
               **_chief_options(spec, placement)}
    return TaskSpec("client", 0, ["worker"], options)


def _serving_tasks(spec, placement):
    serving, out = spec.serving, []
    for i in range(serving.replicas):
        # the job's model, as the ps and workers get it: a model that is code (a file, module:Class) is built
        # because the job names it, not because the checkpoint does (docs/security.md)
        out.append(_server("serve", i, ["serve"], SERVE_PORT + i,
                           {"checkpoint": spec.checkpoint.dir, "model": f"{placement.prepared}/{MODEL_JSON}",
                            "refresh-secs": serving.refresh_secs, "model-name": serving.name}))
    members = [f"tcp://serve{i}:{SERVE_PORT + i}" for i in range(serving.replicas)]
    out.append(_server("aggregator", 0, ["aggregator"], AGGREGATOR_PORT,
                       {"mode": "replica", "member": members, "deadline-ms": 1000, "min-members": 1}))
    gateway = TaskSpec("gateway", 0, ["gateway"], {"aggregator": f"tcp://aggregator:{AGGREGATOR_PORT}",
                                                   "bind": f"0.0.0.0:{GATEWAY_PORT}",
                                                   "grpc-bind": f"0.0.0.0:{GATEWAY_GRPC_PORT}",
                                                   "metrics-bind": _metrics(GATEWAY_PORT + METRICS_OFFSET)},
                       ports={"http": GATEWAY_PORT, "grpc": GATEWAY_GRPC_PORT,
                              "metrics": GATEWAY_PORT + METRICS_OFFSET})
    return out + [gateway]
