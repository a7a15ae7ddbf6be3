"""`zmqflow train`: a whole training job on this machine, as processes on loopback.

broker + n ps shards + m workers (worker 0 is the chief), fed by a reader
process: the 4,500-row training split is written (in a seeded random order) as
8 fixed-length record files, and the reader pushes them for the requested
epochs, each epoch's file order shuffled, into the instance queue, which it
closes at the end, so the workers end on OutOfRange. Training data never flows
through this process. `--input preloaded` instead enqueues the split from
memory in this process (TF's preloaded data; no parsing per epoch, the input
the benchmark's figures compare against); `--input ps` holds the split once
on ps 0 as non-trainable data that every worker slices by row. Readers feed a RandomShuffleQueue, as
tf.train.shuffle_batch did (a file's rows come in order); preloaded input a
FIFOQueue, since the feeder shuffles every epoch itself. A
progress bar follows the global step; at the end the chief's test accuracy and
the examples per second are printed, and every process is stopped by PID.
"""

import json
import os
import tempfile
import threading
import time

import numpy as np
from tqdm import tqdm

from zmqflow.inputs.datasets import mnist_split, write_record_shards
from zmqflow.models.spec import MNIST_MLP
from zmqflow.common.queues import FIFOQueue, RandomShuffleQueue
from zmqflow.common.errors import AbortedError, InvalidArgumentError, OpError
from zmqflow.common.processes import compute_thread_env
from zmqflow.common.ps_client import PsShardClient
from zmqflow.common.supervisor import Supervisor
from zmqflow.services.reader.cli import start_readers

INPUTS = ("readers", "preloaded", "ps")
DEFAULT_OPTIMIZER = {"kind": "adam", "learning_rate": 0.004}
"""Adam 0.004 reaches 0.918-0.926 test accuracy on the 4,500-row split in 10 epochs in every mode
(async with its staleness, sync with 2 replicas, ps-preloaded; 3 runs each). 0.002 left sync, which
makes half as many steps, at 0.898-0.912, too close to the 0.90 target; SGD 0.5 stays near 0.89."""


def feed(queue, x, y, epochs, seed, stop):
    """Preloaded input: enqueue `epochs` shuffled passes over in-memory (x, y), then close the queue."""
    feed_columns(queue, {"image": x, "label": y}, epochs, seed, stop)


def feed_columns(queue, columns, epochs, seed, stop):
    """`epochs` shuffled passes over in-memory {component: rows}, then close the queue."""
    rng = np.random.default_rng(seed)
    rows = len(next(iter(columns.values())))
    try:
        for _ in range(epochs):
            order = rng.permutation(rows)
            for start in range(0, len(order), 500):
                if stop.is_set():
                    return
                idx = order[start:start + 500]
                queue.enqueue_many({name: values[idx] for name, values in columns.items()}, timeout=600)
    finally:
        queue.close(cancel_pending_enqueues=stop.is_set())


class LocalCluster:
    """broker + ps shards + workers + the input (a reader process, or a feeder thread for preloaded
    data) on this machine; `with` stops every process by PID."""

    def __init__(self, num_ps=1, num_workers=2, mode="async", epochs=10, batch_size=100, optimizer=None,
                 backend="numba", replicas_to_aggregate=None, spare_replicas=0, shuffle_queue=None,
                 checkpoint_dir=None, checkpoint_every_steps=None, bf16=False, log_dir=None, seed=0, model=None,
                 input="readers", threads_per_worker=None, data=None, validate_every_steps=100,
                 early_stop_patience=None, summary_every_steps=10, validate_every_secs=None, early_stop_metric=None,
                 at_least_once=False):
        self.num_ps, self.num_workers, self.mode, self.epochs = num_ps, num_workers, mode, epochs
        self.batch_size, self.backend, self.bf16, self.seed = batch_size, backend, bf16, seed
        self.optimizer = optimizer or dict(DEFAULT_OPTIMIZER)
        self.replicas_to_aggregate, self.spare_replicas = replicas_to_aggregate, spare_replicas
        self.shuffle_queue, self.checkpoint_dir = shuffle_queue, checkpoint_dir
        self.checkpoint_every_steps = checkpoint_every_steps
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="zmqflow-train-")
        self.model = model or MNIST_MLP
        self.total_workers = num_workers + spare_replicas
        self.result_files = [os.path.join(self.log_dir, f"worker{i}-result.json") for i in range(self.total_workers)]
        if input not in INPUTS:
            raise InvalidArgumentError(f"input must be one of {', '.join(INPUTS)}, got {input!r}")
        self.input = input
        if at_least_once and input == "ps":
            raise InvalidArgumentError("at-least-once input leases batches of the broker's queue; input 'ps' is "
                                       "sliced by row on ps 0 (nothing to lease): use input 'readers' or 'preloaded'")
        self.at_least_once = at_least_once   # workers and readers take their input with leases
        self.threads_per_worker = threads_per_worker   # default: the machine's cores shared out
        self.data = data      # a DataSpec (inputs/data_spec.py): its train split fed, its test split scored
        self.validate_every_steps = validate_every_steps   # with a validation split: the chief scores it
        self.early_stop_patience = early_stop_patience
        self.validate_every_secs, self.early_stop_metric = validate_every_secs, early_stop_metric
        # each worker's steps and losses, and the chief's validations, as JSON lines: what Job.metrics() streams
        self.summaries_files = [os.path.join(self.log_dir, f"worker{i}-summaries.jsonl")
                                for i in range(self.total_workers)]
        self.summary_every_steps = summary_every_steps
        if data is not None and input != "preloaded":
            raise InvalidArgumentError("a data spec is fed from memory (input 'preloaded'); readers and ps-preloaded "
                                       "input take the MNIST sample only")
        if data is not None and self.checkpoint_dir is None:
            self.checkpoint_dir = os.path.join(self.log_dir, "checkpoint")   # scored at the end
        if shuffle_queue is None:  # readers hand out whole files in order: mix them as shuffle_batch did
            self.shuffle_queue = input == "readers"
        self.supervisor = Supervisor(log_dir=self.log_dir)   # owns every process of the job
        self.stages = 1
        self.shards, self.workers = [], []
        self._stop = threading.Event()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        self.stages = self._pipeline_stages()   # a pipelined model is one replica over all the workers
        (train_x, train_y), _ = mnist_split()
        self.examples_per_epoch = len(train_y)
        self.broker = self.supervisor.start_service("zmqflow.services.broker", name="broker")
        if self.data is not None:
            self._start_data_feeder()
        elif self.input == "preloaded":
            self._start_feeder(train_x, train_y)
        elif self.input == "readers":
            self._start_readers(train_x, train_y)
        for i in range(self.num_ps):
            self.shards.append(self.start_ps(i))
        if self.input == "ps":  # the seeds' preloading: the split held once on ps 0, sliced by the workers
            with PsShardClient(self.shards[0].endpoint) as client:
                client.preload("train", {"image": train_x, "label": train_y}, timeout=30)
        threads = self.threads_per_worker or max(1, (os.cpu_count() or 2) // max(1, self.total_workers))
        if self.stages > 1:
            self._start_pipeline(threads)
            return self
        for i in range(self.total_workers):
            self.workers.append(self.supervisor.start_process("zmqflow.services.worker", self.worker_args(i),
                                                              env=compute_thread_env(threads), name=f"worker{i}"))
        return self

    def _pipeline_stages(self):
        """How many workers the model's layers name (1: no pipeline)."""
        from zmqflow.models.pipeline import stage_count
        from zmqflow.models.registry import load_model
        stages = stage_count(load_model(self.model))
        if stages > 1 and stages != self.total_workers:
            raise InvalidArgumentError(f"the model's layers run on {stages} workers (/job:worker/task:0..{stages - 1}); "
                                       f"train it with --num-workers {stages} (got {self.total_workers})")
        return stages

    def _start_pipeline(self, threads):
        """A pipelined model: the last stage first, each listening for the one before it."""
        workers, next_endpoint = [], None
        for i in reversed(range(self.total_workers)):
            args = self.worker_args(i) + (["--pipeline-next", next_endpoint] if next_endpoint else [])
            env = compute_thread_env(threads)
            if i:
                worker = self.supervisor.start_service("zmqflow.services.worker", args, env=env, name=f"worker{i}")
                next_endpoint = worker.endpoint
            else:
                worker = self.supervisor.start_process("zmqflow.services.worker", args, env=env, name="worker0")
            workers.insert(0, worker)
        self.workers = workers

    def _start_feeder(self, train_x, train_y):
        declaration = dict(dtypes=["float32", "int32"], shapes=[[784], []], names=["image", "label"],
                           shared_name="train", broker=self.broker.endpoint)
        queue = (RandomShuffleQueue(20_000, 2_000, seed=self.seed, **declaration) if self.shuffle_queue
                 else FIFOQueue(20_000, **declaration))
        threading.Thread(target=feed, args=(queue, train_x, train_y, self.epochs, self.seed, self._stop),
                         daemon=True).start()

    def _start_data_feeder(self):
        """The data spec's train split, prepared as the model's inputs, into the shuffle queue "train".

        A CSV spec whose prepared train split is larger than spec_stream.FEED_FROM_MEMORY_MAX_BYTES is
        streamed by reader processes (`zmqflow reader --data-config`, parsing every epoch); smaller ones
        (a thread was 1.4-2x faster on 60,000 rows) and other formats are fed from memory by a thread,
        as is any job that may stop early (the chief closes the queue with cancel, which readers take
        as a failure). The validation and test splits are prepared here either way: they are scored here."""
        from zmqflow.inputs import spec_stream
        from zmqflow.inputs.data_spec import fit, load_tables, prepare, to_config
        tables = load_tables(self.data)
        fit(self.data, tables["train"])
        self.prepared = {split: prepare(self.data, table) for split, table in tables.items()}
        train = self.prepared["train"]
        self.examples_per_epoch = train.rows
        self.data_config = os.path.join(self.log_dir, "data-config.json")
        with open(self.data_config, "w") as f:
            json.dump(to_config(self.data), f)
        columns = dict(train.x) if isinstance(train.x, dict) else {"input": train.x}
        columns["label"] = train.y
        min_after_dequeue = min(2_000, train.rows // 2)
        if (self.data.format in spec_stream.STREAMED_FORMATS and not self.early_stop_patience
                and sum(v.nbytes for v in columns.values()) > spec_stream.FEED_FROM_MEMORY_MAX_BYTES):
            self._start_data_readers(min(2, len(tables["train"].files)), min_after_dequeue)
            return
        components = spec_stream.queue_components(self.data)
        declaration = dict(names=[n for n, _, _ in components], dtypes=[d for _, d, _ in components],
                           shapes=[s for _, _, s in components], shared_name="train", broker=self.broker.endpoint)
        queue = RandomShuffleQueue(20_000, min_after_dequeue, seed=self.seed, **declaration)

        def feeder():
            try:
                feed_columns(queue, columns, self.epochs, self.seed, self._stop)
            except OpError:
                pass   # the queue was closed under it: an early stop, or the job's end

        threading.Thread(target=feeder, daemon=True, name="feeder").start()

    def _start_data_readers(self, processes, min_after_dequeue):
        """Reader processes streaming the spec's train split (its --data-config) into "train", adopted by
        the supervisor: a failing reader (a bad row) ends the job, naming it."""
        readers = start_readers(
            self.broker.endpoint, processes=processes, log_dir=self.log_dir, env=compute_thread_env(1),
            stats_dir=self.log_dir, data_config=self.data_config, split="train", queue="train", queue_kind="shuffle",
            capacity=20_000, min_after_dequeue=min_after_dequeue, num_epochs=self.epochs, shuffle_files=True,
            seed=self.seed, progress_every=0, at_least_once=self.at_least_once)
        for reader in readers:
            self.supervisor.adopt(reader)

    def _score_test_split(self, summary):
        """The final checkpoint on the data's test split (or its validation split when it has no test)."""
        from zmqflow.jobs.evaluate import evaluate_checkpoint
        split = "test" if "test" in self.prepared else "validation" if "validation" in self.prepared else None
        if split is None:
            return
        prepared = self.prepared[split]
        result = evaluate_checkpoint(self.checkpoint_dir, prepared.x, prepared.y, model_spec=self.model,
                                     task=self.data.label.task)
        summary.update(test_split=split, test_metrics=result["metrics"],
                       test_accuracy=result["metrics"].get("accuracy"))

    def _start_readers(self, train_x, train_y):
        shards = os.path.join(self.log_dir, "train-data")
        write_record_shards(train_x, train_y, shards, seed=self.seed)   # what `zmqflow data mnist-shards` writes
        readers = start_readers(
            self.broker.endpoint, processes=1, log_dir=self.log_dir, env=compute_thread_env(1),
            stats_dir=self.log_dir, files=[os.path.join(shards, "*.bin")], preset="mnist-shards", queue="train",
            queue_kind="shuffle" if self.shuffle_queue else "fifo", capacity=20_000, num_epochs=self.epochs,
            shuffle_files=True, seed=self.seed, progress_every=0,
            min_after_dequeue=2_000 if self.shuffle_queue else None, at_least_once=self.at_least_once)
        for reader in readers:
            self.supervisor.adopt(reader)

    def ps_args(self, index):
        args = ["--task-index", str(index), "--num-ps", str(self.num_ps), "--model", json.dumps(self.model),
                "--optimizer", json.dumps(self.optimizer), "--mode", self.mode]
        if self.mode == "sync":
            replicas = 1 if self.stages > 1 else self.total_workers
            args += ["--replicas-to-aggregate", str(self.replicas_to_aggregate or min(replicas, self.num_workers)),
                     "--total-num-replicas", str(replicas)]
        if self.checkpoint_dir:
            args += ["--restore-from", self.checkpoint_dir]
        return args

    def start_ps(self, index, bind="tcp://127.0.0.1:*"):
        """Start (or restart, on the same `bind`) ps shard `index`."""
        return self.supervisor.start_service("zmqflow.services.ps", self.ps_args(index), bind=bind,
                                             name=f"ps{index}")

    def worker_args(self, index):
        args = ["--task-index", str(index), "--broker", self.broker.endpoint, "--num-workers",
                str(self.total_workers), "--backend", self.backend, "--batch-size", str(self.batch_size),
                "--mode", self.mode, "--model", json.dumps(self.model), "--examples-per-epoch",
                str(self.examples_per_epoch), "--result-file", self.result_files[index]]
        for shard in self.shards:
            args += ["--ps", shard.endpoint]
        args += ["--summaries", self.summaries_files[index], "--summary-every-steps", str(self.summary_every_steps)]
        if self.bf16:
            args.append("--bf16")
        if self.at_least_once:
            args.append("--at-least-once")
        if self.input == "ps":
            args += ["--preloaded", "train", "--epochs", str(self.epochs)]
        if index == 0:
            args += ["--shutdown-ps"] + (["--evaluate"] if self.data is None else ["--data-config", self.data_config])
            if self.data is not None and "validation" in self.prepared and (self.validate_every_steps or
                                                                            self.validate_every_secs):
                for flag, value in (("--validate-every-steps", self.validate_every_steps),
                                    ("--validate-every-secs", self.validate_every_secs),
                                    ("--early-stop-patience", self.early_stop_patience),
                                    ("--early-stop-metric", self.early_stop_metric)):
                    if value:
                        args += [flag, str(value)]
            if self.checkpoint_dir:
                args += ["--checkpoint-dir", self.checkpoint_dir]
                if self.checkpoint_every_steps:
                    args += ["--checkpoint-every-steps", str(self.checkpoint_every_steps)]
        return args

    def ps_stats(self, index=0, timeout=2.0):
        with PsShardClient(self.shards[index].endpoint, heartbeat_interval=timeout) as client:
            return client.stats(timeout=timeout)

    def wait(self, progress=False, timeout=600):
        """Wait for every worker to exit; return the job's summary. When any task of the job fails (exits
        non-zero), every other one is stopped and AbortedError names it, its exit code and its last log lines."""
        started = time.perf_counter()
        try:
            _follow(self.shards[0].endpoint, self.workers, self.epochs * self.examples_per_epoch // self.batch_size,
                    progress, self._raise_on_failure, timeout)
            self._raise_on_failure()
        except AbortedError:
            self.stop()
            raise
        codes = [w.proc.wait(timeout=timeout) for w in self.workers]
        elapsed = time.perf_counter() - started
        if codes[0] != 0 or not os.path.exists(self.result_files[0]):
            raise AbortedError(f"the chief failed (exit {codes[0]}):\n{self.workers[0].log()[-3000:]}")
        results = [read_json(f) for f in self.result_files]
        done = [r for r in results if r]
        examples = sum(r["examples"] for r in done)
        training_seconds = max(r["seconds"] for r in done)
        summary = {"test_accuracy": results[0].get("test_accuracy"), "global_step": results[0]["global_step"],
                "examples": examples, "examples_per_s": round(examples / training_seconds),
                "training_seconds": round(training_seconds, 3), "wall_seconds": round(elapsed, 2),
                "worker_exit_codes": codes, "num_ps": self.num_ps, "num_workers": self.num_workers,
                "mode": self.mode, "optimizer": self.optimizer, "log_dir": self.log_dir}
        if self.at_least_once:   # rows acked once trained: a worker that died mid-job left none unacked
            summary["input_acked"] = sum(r.get("leased_acked", 0) for r in done)
        if self.data is not None:
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
        as the job has spare replicas."""
        self.supervisor.exits()
        latest = {child.name: child for child in self.supervisor.children}   # a restart replaces its task
        failed = [c for c in latest.values() if self.supervisor.codes.get(c)]
        spares_lost = [c for c in failed if c in self.workers[1:]][:self.spare_replicas]
        failed = [c for c in failed if c not in spares_lost]
        if not failed:
            return
        child, code = failed[0], self.supervisor.codes[failed[0]]
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        tail = "\n".join(child.log().splitlines()[-12:])
        raise AbortedError(f"task {child.name} {how}; the job stopped its other tasks. Its last log lines:\n{tail}")


def run_training(progress=True, **options):
    """Run a whole job (see LocalCluster for the options); returns its summary."""
    with LocalCluster(**options) as cluster:
        cluster.start()
        return cluster.wait(progress)


def read_json(path):
    """A JSON file's value, or None while it is missing or half written."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _follow(ps0, workers, total_steps, progress, check=lambda: None, timeout=600):
    """A progress bar on ps 0's version until every worker has exited; `check()` raises when a task failed."""
    bar = tqdm(total=total_steps, desc="training", unit="step", disable=not progress)
    deadline = time.monotonic() + timeout
    with PsShardClient(ps0, heartbeat_interval=2.0) as client:
        while any(w.alive() for w in workers):
            check()
            if time.monotonic() > deadline:
                bar.close()
                raise AbortedError(f"the job did not end within {timeout:.0f} s")
            try:
                stats = client.stats(timeout=2.0)
                bar.update(max(0, min(stats["version"], total_steps) - bar.n))
            except Exception:
                pass  # the ps exits at the end (the chief shuts it down)
            time.sleep(0.2)
    bar.close()
