"""`zmqflow train`, `zmqflow.Job`: a whole training job on this machine, as processes on loopback.

The job is a JobSpec (jobs/spec.py) and its processes are the tasks `tasks(spec, placement)` renders,
each started with `--config TASK.json`: broker + n ps shards + m workers (worker 0 is the chief). The
launcher does what a deployment's one-shot `data` task does: it fits the data spec (default: the shipped
MNIST sample) on its train split and writes the model fitted to it and the data config into
LOG_DIR/prepared. Every input mode takes any data spec: `readers` (reader processes stream the prepared
train split, written as record shards, for the requested epochs, each epoch's file order shuffled, into a
RandomShuffleQueue, as tf.train.shuffle_batch did; they close it at the end, so the workers end on
OutOfRange), `preloaded` (a thread here enqueues the split from memory into a FIFOQueue, shuffled every
epoch: TF's preloaded data), `ps` (the split held once on ps 0 as non-trainable data that every worker
slices by row). A progress bar follows the global step; at the end the final checkpoint is scored on the
data's test split, and every process is stopped by PID.
"""

import dataclasses
import os
import tempfile
import threading
import time

import numpy as np
from tqdm import tqdm

from zmqflow.common.errors import AbortedError, InvalidArgumentError, OpError
from zmqflow.common.processes.children import compute_thread_env, start_process
from zmqflow.common.clients.ps import PsShardClient
from zmqflow.common.clients.queues import FIFOQueue, RandomShuffleQueue
from zmqflow.common.rpc.client import default_pool
from zmqflow.common.processes.supervisor import Supervisor
from zmqflow.jobs import job_metrics
from zmqflow.jobs.spec import Placement, TaskSpec, batch_size_for, decayed_optimizer, job_spec, tasks


def start_feeder(columns, epochs, stop, broker, queue, capacity, min_after_dequeue=None, seed=0, container=""):
    """Preloaded input: declare the queue of in-memory {component: rows} (a RandomShuffleQueue with
    `min_after_dequeue`, else a FIFOQueue) and start a thread that enqueues `epochs` passes over the rows,
    shuffled every epoch, then closes it (cancelling pending enqueues when `stop` is set)."""
    declaration = dict(names=list(columns), dtypes=[str(v.dtype) for v in columns.values()],
                       shapes=[list(v.shape[1:]) for v in columns.values()], shared_name=queue, container=container,
                       broker=broker)
    queue = (RandomShuffleQueue(capacity, min_after_dequeue, seed=seed, **declaration)
             if min_after_dequeue is not None else FIFOQueue(capacity, **declaration))
    rng, rows = np.random.default_rng(seed), len(next(iter(columns.values())))

    def feed():
        try:
            for _ in range(epochs):
                order = rng.permutation(rows)
                for start in range(0, len(order), 500):
                    if stop.is_set():
                        break
                    idx = order[start:start + 500]
                    queue.enqueue_many({name: values[idx] for name, values in columns.items()}, timeout=600)
            queue.close(cancel_pending_enqueues=stop.is_set())
        except OpError:
            pass   # the queue was closed or reset under it: an early stop, or the job's (or run's) end
        finally:
            default_pool.close_thread()

    threading.Thread(target=feed, daemon=True, name=f"feed-{container or declaration['shared_name']}").start()


def start_readers(broker, processes=1, log_dir=None, env=None, stats_dir=None, **options):
    """Start `processes` reader processes on one pipeline, each with a `--config` of `options` by the reader's
    option or parameter names (queue="train", num_epochs=2, shuffle_files=False, format_options=JSON text,
    cast=["label=int32"], ...); returns their ServiceProcess handles, to be stopped by PID (`stop()` sends
    SIGTERM). With `stats_dir`, reader i writes its summary to stats_dir/reader-i.json."""
    configs, procs = tempfile.mkdtemp(prefix="readers-", dir=log_dir), []
    try:
        for i in range(processes):
            stats = {"json-out": os.path.join(stats_dir, f"reader-{i}.json")} if stats_dir else {}
            task = TaskSpec("reader", i, ["reader"], {"broker": broker, **options, **stats})
            procs.append(start_process("zmqflow.services.reader", task.config_args(configs), env=env, log_dir=log_dir,
                                       name=task.name))
    except BaseException:
        for proc in procs:
            proc.stop()
        raise
    return procs


def prepare_data(spec, directory):
    """The job's data spec (default: the shipped MNIST sample) fitted on its train split, every split prepared
    as the model's inputs, and the input mode the job takes (`spec.input.kind`, else: readers for the shipped
    sample; a data spec from memory, unless it is a CSV whose prepared train split passes
    spec_stream.FEED_FROM_MEMORY_MAX_BYTES and nothing may stop the job early (readers take the chief's early
    close as a failure): then reader processes stream it), the batch size (default: jobs/spec.py's
    batch_size_for the train split) and the optimizer's learning rate decayed over the job's steps
    (decayed_optimizer). model.json (the model fitted
    to the data) and data-config.json are written to `directory`, as a deployment's `data prepare` writes them;
    for readers, a train split they cannot stream (not CSV) as record shards too.
    Returns (the spec with its input mode, DataSpec, {split: Prepared})."""
    from zmqflow.inputs import spec_stream
    from zmqflow.inputs.data_spec import fit, is_mnist_sample, load_spec, load_tables, prepare
    from zmqflow.inputs.prepared_shards import write_prepared
    from zmqflow.models.spec import resolve_model, with_options
    data = load_spec("mnist" if spec.data is None else spec.data)
    tables = load_tables(data)
    fit(data, tables["train"])
    prepared = {split: prepare(data, table) for split, table in tables.items()}
    kind = spec.input.kind
    if kind is None:
        size = sum(v.nbytes for v in columns_of(prepared["train"]).values())
        streamed = (data.format in spec_stream.STREAMED_FORMATS and not spec.validation.early_stop_patience
                    and size > spec_stream.FEED_FROM_MEMORY_MAX_BYTES)
        kind = "readers" if spec.data is None or streamed else "preloaded"
    shards = 8 if kind == "readers" and data.format not in spec_stream.STREAMED_FORMATS else 0
    model = with_options(resolve_model(spec.model, data_mlp=spec.data is not None and not is_mnist_sample(data)),
                         spec.model_options)
    write_prepared(data, prepared["train"], model, directory, shards=shards, seed=spec.training.seed)
    rows = prepared["train"].rows
    spec = job_spec(spec, input=kind, batch_size=spec.training.batch_size or batch_size_for(rows))
    return job_spec(spec, optimizer=decayed_optimizer(spec, rows)), data, prepared


def check_output_width(model, data=None):
    """InvalidArgument, before anything starts, when `model`'s output is not as wide as the label of `data`
    (a fitted DataSpec; None: the shipped MNIST sample) asks: its classes, its label columns, or one value
    for a regression."""
    from zmqflow.inputs.data_spec import MNIST, classes
    from zmqflow.models.protocol import output_width
    if data is None:
        want, task, columns, names = len(MNIST["label"]["classes"]), "multiclass", ["label"], MNIST["label"]["classes"]
    else:
        want, task, columns, names = classes(data), data.label.task, data.label.columns, data.stats["classes"]
    got = output_width(model)
    if got == want:
        return
    what = (f"{want} classes {names[:10]}" if task in ("multiclass", "binary") else
            f"{want} label columns" if task == "multi_label" else "one value")
    raise InvalidArgumentError(f"the model's output is {got} wide, but the data's {task} label "
                               f"({', '.join(map(str, columns))}) needs {want}: {what}. Give the output layer "
                               f"{want} units (a model file's build(input_signature, outputs, ...) gets the width "
                               "as `outputs`)")


def columns_of(prepared):
    """{component: rows} of a prepared split, named as the queue's components (the model's inputs, label)."""
    return {**(dict(prepared.x) if isinstance(prepared.x, dict) else {"input": prepared.x}), "label": prepared.y}


class LocalCluster:
    """The tasks of a JobSpec as processes on this machine, and the input they need; `with` stops every
    process by PID. `LocalCluster(spec, **options)`: options by flat name as jobs/spec.py's job_spec takes
    them (num_ps=2, epochs=3, input="ps", ...); `log_dir` (default: a new temporary directory) holds the
    logs, the prepared data, the task configs and, unless the spec names one, the checkpoints."""

    def __init__(self, spec=None, log_dir=None, threads_per_worker=None, supervisor=None, **options):
        self.spec = job_spec(spec, **options)
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="zmqflow-train-")
        if self.spec.checkpoint.dir is None:      # the final checkpoint is scored at the end
            self.spec = job_spec(self.spec, checkpoint_dir=os.path.join(self.log_dir, "checkpoint"))
        self.threads_per_worker = threads_per_worker   # default: the machine's cores shared out
        self.prepared_dir = os.path.join(self.log_dir, "prepared")
        # in-graph, the client is the one that trains (and the chief): its files are the job's
        trainers = ["client"] if self.in_graph else [f"worker{i}" for i in range(self.spec.total_workers)]
        self.result_files = [os.path.join(self.log_dir, f"{name}-result.json") for name in trainers]
        # each worker's steps and losses, and the chief's validations, as JSON lines: what Job.metrics() streams
        self.summaries_files = [os.path.join(self.log_dir, f"{name}-summaries.jsonl") for name in trainers]
        self.supervisor = supervisor or Supervisor(log_dir=self.log_dir)   # owns every process of the job
        self.prepared, self.shards, self.workers = {}, [], []
        self._stage_links = {}    # a pipelined model's {stage: the stages it sends to}
        self._stop = threading.Event()

    @property
    def in_graph(self):
        return self.spec.cluster.replication == "in-graph"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        self.spec, self.data, self.prepared = prepare_data(self.spec, self.prepared_dir)
        stages = self._check_model()   # a pipelined model: each copy of its stages is one replica
        self.broker = self.supervisor.start_service("zmqflow.services.broker", name="broker")
        return self.launch(Placement(self.broker.endpoint, prepared=self.prepared_dir, log_dir=self.log_dir,
                                     splits=tuple(self.prepared), train_rows=self.prepared["train"].rows,
                                     stages=stages), columns_of(self.prepared["train"]))

    def launch(self, placement, train, worker_env=None):
        """Start the job's ps shards, input and workers on `placement`, whose broker runs already (start()
        starts the job's own; a sweep's runs share one); `train`: the {component: rows} that preloaded and
        ps input feed. The workers get `worker_env` too."""
        spec, self.placement = self.spec, placement
        self.examples_per_epoch, self.stages = placement.train_rows, placement.stages
        planned = tasks(spec, placement)
        self._ps_tasks = {t.index: t for t in planned if t.role == "ps"}
        for i in range(spec.cluster.ps):
            self.shards.append(self.start_ps(i))
        if spec.input.kind == "ps":    # held once on ps 0, sliced by the workers
            with PsShardClient(self.shards[0].endpoint) as client:
                client.preload(spec.input.queue, train, timeout=30)
        elif spec.input.kind == "preloaded":   # a thread here enqueues shuffled epochs from memory
            start_feeder(train, spec.training.epochs, self._stop, placement.broker, spec.input.queue,
                         spec.input.capacity, min(spec.input.min_after_dequeue, len(train["label"]) // 2)
                         if spec.input.shuffled else None, spec.training.seed, placement.container or "")
        for task in planned:
            if task.role == "reader":
                self._start(task, env=compute_thread_env(1))
        self.placement = dataclasses.replace(self.placement, ps=tuple(shard.endpoint for shard in self.shards))
        planned = tasks(spec, self.placement)
        workers = [t for t in planned if t.role == "worker"]
        threads = self.threads_per_worker or max(1, (os.cpu_count() or 2) // max(1, spec.total_workers))
        env = {**compute_thread_env(threads), **(worker_env or {})}
        if self.in_graph:
            self._start_in_graph(workers, next(t for t in planned if t.role == "client"), env)
        elif self.stages > 1:
            self._start_pipeline(workers, env)
        elif spec.cluster.mode == "allreduce":
            self._start_ring(workers, env)
        else:
            self.workers = [self._start(task, env=env) for task in workers]
        return self

    def _start(self, task, service=False, **kwargs):
        """Start a task with its --config; a `service` is waited for until it listens (its endpoint known)."""
        start = self.supervisor.start_service if service else self.supervisor.start_process
        return start(f"zmqflow.services.{task.role}", task.config_args(self.log_dir), name=task.name, **kwargs)

    def _check_model(self):
        """How many workers the model's layers name (1: no pipeline), once its output is known to fit the data;
        the job's workers must be that many, or a multiple (data-parallel copies of the pipeline)."""
        from zmqflow.models.stages import stage_links
        from zmqflow.models.registry import load_model
        from zmqflow.models.spec import resolve_model
        model = load_model(resolve_model(os.path.join(self.prepared_dir, "model.json")))
        check_output_width(model, self.data)
        self._stage_links = stage_links(model)
        stages = max(1, len(self._stage_links))
        if stages > 1 and self.spec.total_workers % stages:
            raise InvalidArgumentError(f"the model's layers run on {stages} workers (/job:worker/task:0.."
                                       f"{stages - 1}); train it with --num-workers {stages} or a multiple of it "
                                       f"(got {self.spec.total_workers})")
        return stages

    def _start_in_graph(self, replicas, client, env):
        """In-graph: the replicas first, each listening; then the client that drives them (computing nothing,
        it gets one thread). `workers` is the client, then the replicas: the job ends when they have exited."""
        started = [self._start(task, service=True, env=env) for task in replicas]
        client.options["replica"] = [replica.endpoint for replica in started]
        self.workers = [self.supervisor.start_process("zmqflow.services.worker", client.config_args(self.log_dir),
                                                      name=client.name, env=compute_thread_env(1))] + started

    def _start_pipeline(self, workers, env):
        """A pipelined model, one copy per `stages` workers: in each copy, every stage after the stages it
        sends to, each listening for the stages that send to it."""
        from zmqflow.models.stages import start_order
        if not self._stage_links:     # launched without start(): a sweep's run
            self._check_model()
        stages = self.stages
        started = [None] * len(workers)
        for first in range(0, len(workers), stages):
            endpoints = {}
            for k in start_order(self._stage_links):
                task = workers[first + k]
                task.options["pipeline-next"] = [f"{d}={endpoints[d]}" for d in self._stage_links[k]] or None
                started[first + k] = self._start(task, service=k > 0, env=env)
                endpoints[k] = started[first + k].endpoint
        self.workers = started

    def _start_ring(self, workers, env):
        """An all-reduce job: the chief first (its ring endpoint known once it listens), then the others
        pointed at it; each binds an ephemeral port of its own."""
        chief = self._start(workers[0], service=True, env=env)
        for task in workers[1:]:
            task.options["chief"] = chief.endpoint
        self.workers = [chief] + [self._start(task, env=env) for task in workers[1:]]

    def _score_test_split(self, summary):
        """The final checkpoint on the data's test split (or its validation split when it has no test)."""
        from zmqflow.jobs.evaluate import evaluate_checkpoint
        split = "test" if "test" in self.prepared else "validation" if "validation" in self.prepared else None
        if split is None:
            return
        prepared = self.prepared[split]
        result = evaluate_checkpoint(self.spec.checkpoint.dir, prepared.x, prepared.y,
                                     model_spec=os.path.join(self.prepared_dir, "model.json"),
                                     task=self.data.label.task)
        summary.update(test_split=split, test_metrics=result["metrics"],
                       test_accuracy=result["metrics"].get("accuracy"))

    def start_ps(self, index, bind="tcp://127.0.0.1:*"):
        """Start (or restart, on the same `bind`) ps shard `index`."""
        return self._start(self._ps_tasks[index], service=True, bind=bind)

    def ps_stats(self, index=0, timeout=2.0):
        with PsShardClient(self.shards[index].endpoint, heartbeat_interval=timeout) as client:
            return client.stats(timeout=timeout)

    def wait(self, progress=False, timeout=None, interrupt=None):
        """Wait for every worker to exit; return the job's summary. A job runs until it ends unless `timeout`
        (seconds) is given. When any task of the job fails (exits non-zero), `interrupt` (an Event) is set or
        the timeout passes, every other one is stopped and AbortedError says why: the task, its exit code and
        its last log lines."""
        started, training = time.perf_counter(), self.spec.training
        steps = training.epochs * self.examples_per_epoch // training.batch_size
        if self.in_graph and self.spec.cluster.mode == "sync":   # a step takes a batch from every replica
            steps = -(-steps // self.spec.cluster.workers)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            with tqdm(total=steps, desc="training", unit="step", disable=not progress) as bar:
                for point in job_metrics.stream(self, 0.2, self._raise_on_failure):   # until every worker exits
                    bar.update(max(0, min(point["global_step"], steps) - bar.n))
                    if interrupt is not None and interrupt.is_set():
                        raise AbortedError("the job was interrupted")
                    if deadline is not None and time.monotonic() > deadline:
                        raise AbortedError(f"the job did not finish within {timeout:g} s, the time limit it was "
                                           "given (--timeout-secs, timeout= in Python): every task was stopped")
            self._raise_on_failure()
        except AbortedError:
            self.stop()
            raise
        codes = [w.proc.wait(timeout=timeout) for w in self.workers]
        elapsed = time.perf_counter() - started
        if codes[0] != 0 or not os.path.exists(self.result_files[0]):
            raise AbortedError(f"the chief failed (exit {codes[0]}):\n{self.workers[0].log()[-3000:]}")
        results = [job_metrics.read_json(f) for f in self.result_files]
        done = [r for r in results if r]
        examples = sum(r["examples"] for r in done)
        training_seconds = max(r["seconds"] for r in done)
        summary = {"test_accuracy": results[0].get("test_accuracy"), "global_step": results[0]["global_step"],
                "examples": examples, "examples_per_s": round(examples / training_seconds),
                "training_seconds": round(training_seconds, 3), "wall_seconds": round(elapsed, 2),
                "worker_exit_codes": codes, "num_ps": self.spec.cluster.ps, "num_workers": self.spec.cluster.workers,
                "mode": self.spec.cluster.mode, "optimizer": training.optimizer, "log_dir": self.log_dir}
        summary["replication"] = self.spec.cluster.replication
        if self.in_graph:   # the client's steps are the updates (sync) or every replica's step (async)
            summary.update(steps=results[0]["steps"], replicas=results[0]["replicas"])
        if self.spec.input.at_least_once:   # rows acked once trained: a worker that died mid-job left none unacked
            summary["input_acked"] = sum(r.get("leased_acked", 0) for r in done)
        summary.update({k: results[0][k] for k in ("validation", "best_validation", "validation_metric",
                                                   "stopped_early_at") if k in results[0]})
        self._score_test_split(summary)
        return summary

    def stop(self):
        self._stop.set()
        self.supervisor.stop_all()

    def _raise_on_failure(self):
        """AbortedError naming the first task of the job that failed (exited non-zero), if one did. A task
        restarted since (a ps shard brought back) does not count, nor do as many lost non-chief workers
        as the job has spare replicas (in an elastic job, every lost non-chief worker: the others go on; all of
        them in an all-reduce job with lost_policy continue)."""
        self.supervisor.exits()
        latest = {child.name: child for child in self.supervisor.children}   # a restart replaces its task
        failed = [c for c in latest.values() if self.supervisor.codes.get(c)]
        cluster = self.spec.cluster
        spares = (len(self.workers) if cluster.elastic or (cluster.mode == "allreduce" and cluster.lost_policy == "continue")
                  else cluster.spare_replicas)   # a ring that goes on without lost workers needs none of them
        spares_lost = [c for c in failed if c in self.workers[1:]][:spares]
        failed = [c for c in failed if c not in spares_lost]
        if not failed:
            return
        child, code = failed[0], self.supervisor.codes[failed[0]]
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        tail = "\n".join(child.log().splitlines()[-12:])
        raise AbortedError(f"task {child.name} {how}; the job stopped its other tasks. Its last log lines:\n{tail}")


def run_training(spec=None, progress=True, timeout=None, **options):
    """Run a whole job (a JobSpec and/or options, as LocalCluster takes them); returns its summary. It runs
    until it ends, or is stopped with AbortedError after `timeout` seconds when given."""
    with LocalCluster(spec, **options) as cluster:
        cluster.start()
        return cluster.wait(progress, timeout=timeout)
