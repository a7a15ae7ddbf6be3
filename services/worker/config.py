"""WorkerConfig: a worker's flags as one value, with the task resolved from TF_CONFIG.

cli.py turns flags into a WorkerConfig; build.py turns a WorkerConfig into a running worker.
"""

import dataclasses
import os

from zmqflow.common.processes.task_options import task_from_tf_config


CONFIG_ONLY = ("container", "summaries", "validate_every_steps", "validate_every_secs", "early_stop_patience",
               "early_stop_metric", "examples_per_epoch", "micro_batches")
"""What launchers set and nobody types: taken from `--config TASK.json` only (no flag of their own)."""


class UsageError(ValueError):
    """The flags cannot make a worker (no ps shards, no input): the command says so and exits 2."""


@dataclasses.dataclass
class WorkerConfig:
    ps_endpoints: tuple = ()
    broker: str = None
    queue_name: str = "train"
    container: str = ""
    preloaded: str = None
    epochs: int = 1
    task_index: int = None
    num_workers: int = None
    model_spec: str = None
    placement_strategy: str = "round_robin"
    max_shard_bytes: int = None
    backend: str = "numba"
    batch_size: int = 100
    dequeue_timeout: float = 600.0
    at_least_once: bool = False     # leased dequeues, acked once the step's gradients are on the ps
    lease: float = None             # seconds a batch is leased for (default: from the step time)
    mode: str = "async"             # async, sync (both with ps shards) or allreduce (none)
    optimizer: str = None           # allreduce: the update rule every worker applies (JSON, as the ps's)
    chief: str = None               # allreduce: the chief's ring endpoint (workers 1..n-1)
    lost_after: float = 5.0         # allreduce: seconds of silence that make a worker lost
    lost_policy: str = "continue"   # allreduce: abort the job naming it, or go on without it
    bf16: bool = False
    max_steps: int = None
    log_every: int = 100
    checkpoint_dir: str = None
    checkpoint_every_steps: int = None
    checkpoint_every_secs: float = None
    keep_checkpoints: int = 5
    summaries: str = None
    summary_dir: str = None
    summary_every_steps: int = 50
    user_hooks: tuple = ()
    evaluate: bool = False
    shutdown_ps: bool = False
    shutdown_broker: bool = False
    result_file: str = None
    data_config: str = None
    validate_every_steps: int = None
    validate_every_secs: float = None
    early_stop_metric: str = None
    early_stop_patience: int = None
    examples_per_epoch: int = None
    log_level: str = "INFO"
    device: str = None
    placement_function: str = None
    allow_soft_placement: bool = False
    log_device_placement: bool = False
    gpu_memory_fraction: float = None
    towers: int = 1
    pipeline_next: tuple = ()       # a pipelined model: [STAGE=]ENDPOINT of each stage this one sends to
    micro_batches: int = 2
    pipeline_timeout: float = 120.0
    bind: str = None                # a later pipeline stage listens here (and a model server)
    ready_file: str = None
    in_graph: bool = False          # a replica of in-graph replication: computes when its client asks
    replicas: tuple = ()            # the in-graph client: the replicas it drives
    replica_timeout: float = 60.0   # the in-graph client: seconds for a replica's step before it is lost
    job: str = "worker"             # this task's job and index as device strings name them
    task: int = None

    @classmethod
    def from_options(cls, **options):
        """The config of these flags, its task completed from TF_CONFIG; UsageError without ps shards."""
        fields = {f.name for f in dataclasses.fields(cls)}
        config = cls(**{k: v for k, v in options.items() if k in fields})
        if config.mode == "allreduce" and config.ps_endpoints:
            raise UsageError("--mode allreduce trains without ps shards (the workers reduce their gradients among "
                             "themselves): drop --ps, or use --mode sync")
        config.resolve_task()
        if config.mode == "allreduce":
            config.ps_endpoints = ()
            if not config.is_chief and not config.chief:
                raise UsageError(f"worker {config.task_index} of an all-reduce job needs --chief, the endpoint the "
                                 "chief (worker 0) listens on (its --bind), or TF_CONFIG")
        elif not config.ps_endpoints:
            raise UsageError("no ps shards: pass --ps (one per shard) or set TF_CONFIG")
        return config

    def resolve_task(self):
        """Task index, worker count and ps shards from TF_CONFIG where the flags leave them open.
        The chief (or master) job comes first: its tasks are workers 0..k-1, the worker job's follow."""
        tf_task = task_from_tf_config(("worker", "chief", "master"))
        if tf_task is not None:
            cluster = tf_task.cluster
            if "ps" in cluster.jobs:   # an all-reduce cluster has none
                self.ps_endpoints = self.ps_endpoints or [cluster.endpoint("ps", i) for i in cluster.task_indices("ps")]
            chiefs = [j for j in ("chief", "master") if j in cluster.jobs]
            offset = cluster.num_tasks(chiefs[0]) if chiefs else 0
            if self.task_index is None:
                self.task_index = tf_task.task_index + (offset if tf_task.task_type == "worker" else 0)
            if self.num_workers is None:
                self.num_workers = offset + (cluster.num_tasks("worker") if "worker" in cluster.jobs else 0)
            self.job, self.task = tf_task.task_type, tf_task.task_index
            if self.mode == "allreduce":   # each task's address in the cluster is its ring endpoint
                self.chief = self.chief or (cluster.endpoint(chiefs[0], 0) if chiefs else cluster.endpoint("worker", 0))
                host, port = cluster.task_address(tf_task.task_type, tf_task.task_index).rsplit(":", 1)
                self.bind = f"tcp://{host if host in ('127.0.0.1', 'localhost') else '*'}:{port}"
        self.task_index, self.num_workers = self.task_index or 0, self.num_workers or 1
        if self.task is None:
            self.task = self.task_index

    @property
    def is_chief(self):
        return self.task_index == 0

    @property
    def name(self):
        return f"worker:{self.task_index}"

    @property
    def tensorboard_dir(self):
        """The chief's TensorBoard directory: --summary-dir, else CHECKPOINT_DIR/train; None for none."""
        directory = self.summary_dir or (os.path.join(self.checkpoint_dir, "train") if self.checkpoint_dir else None)
        return None if directory == "off" else directory
