"""Run a sweep's trainings: one shared broker, and per run its own ps task and worker.

Runs never mix: each has its own ps process (its variables, optimizer slots and, with
`input="ps"`, its copy of the data), and its broker queues live in its own resource
container (`run-003`), freed when the run ends. Up to `parallel` runs train at once, each
worker with cores/parallel compute threads. A run that fails (exit code, timeout, no
checkpoint) becomes a failed entry with its error; the others go on.
"""

import json
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from zmqflow.common.clients import queues
from zmqflow.inputs.metrics import PRIMARY
from zmqflow.common.rpc import admin_token
from zmqflow.common.processes.children import start_service
from zmqflow.common.processes.supervisor import Supervisor
from zmqflow.common.rpc.client import default_pool
from zmqflow.jobs.sweep.learning_curve import CURVE_ENV, HOOK, read_curve
from zmqflow.jobs.sweep.space import model_options
from zmqflow.jobs.evaluate import evaluate_checkpoint
from zmqflow.jobs.local_cluster import LocalCluster
from zmqflow.jobs.spec import (DATA_CONFIG, CheckpointConfig, ClusterConfig, InputConfig, JobSpec, Placement,
                               TrainConfig, optimizer_config)

INPUTS = ("preloaded", "ps")


def model_spec(point, seed=1, base=None):
    """The model of a point: `base` (a spec, --model and its --model-opt) with the point's model.<option>
    values; without a base or for the MLP, 784, the point's hidden widths, 10 (the seeds' MNIST network)."""
    if base is None or base.get("type") == "mlp":
        inputs, classes = (base["layers"][0], base["layers"][-1]) if base and "layers" in base else (784, 10)
        spec = {**(base or {}), "type": "mlp", "layers": [inputs, *point["hidden"], classes],
                "activation": point["activation"], "init": {"kind": "truncated_normal", "stddev": 0.1}, "seed": seed}
    else:
        spec = dict(base)
    return {**spec, **model_options(point)}


def run_id(index):
    return f"run-{index + 1:03d}"


class SweepRunner:
    def __init__(self, out_dir, train, validation, parallel=1, input="preloaded", backend="numba", timeout=300.0,
                 model_seed=1, base_model=None, data=None):
        if input not in INPUTS:
            raise ValueError(f"input must be one of {', '.join(INPUTS)}, got {input!r}")
        self.out_dir, self.train, self.validation = out_dir, train, validation
        self.parallel, self.input, self.backend, self.timeout = max(1, parallel), input, backend, timeout
        self.model_seed, self.base_model = model_seed, base_model
        self.data = data        # a data spec: its inputs are named as the model's, not MNIST's `image`
        self.threads = max(1, (os.cpu_count() or 1) // self.parallel)
        self._stop = threading.Event()
        self.broker = None
        self.admin_token = admin_token.for_job()   # one for the sweep: its broker and every run's tasks
        self.job_token = admin_token.for_job(admin_token.JOB_TOKEN)

    def run(self, points, on_done=None):
        """Train every point; returns the entries in run order. `on_done(entry)` after each run."""
        for owned in ("runs", "checkpoints"):  # a previous sweep's runs would mix with this one's
            shutil.rmtree(os.path.join(self.out_dir, owned), ignore_errors=True)
        os.makedirs(self.out_dir, exist_ok=True)
        log_dir = os.path.join(self.out_dir, "logs")
        os.makedirs(log_dir, exist_ok=True)
        self.data_config = None
        if self.data is not None:   # every checkpoint records the data, so serve, predict and ensemble read it
            from zmqflow.inputs.data_spec import to_config
            self.data_config = os.path.join(self.out_dir, "data-config.json")
            with open(self.data_config, "w") as f:
                json.dump(to_config(self.data), f)
        self.broker = start_service("zmqflow.services.broker", log_dir=log_dir,
                                    env={admin_token.ENV: self.admin_token, admin_token.JOB_TOKEN.env: self.job_token})
        admin_token.remember(self.broker.endpoint, self.admin_token)
        admin_token.remember(self.broker.endpoint, self.job_token, admin_token.JOB_TOKEN)
        entries = [None] * len(points)
        try:
            with ThreadPoolExecutor(self.parallel, thread_name_prefix="sweep") as pool:
                futures = {pool.submit(self._run_safely, i, p): i for i, p in enumerate(points)}
                try:
                    for future in as_completed(futures):
                        entries[futures[future]] = entry = future.result()
                        if on_done:
                            on_done(entry)
                except BaseException:  # Ctrl-C: let the running trainings stop, start no more
                    self._stop.set()
                    for f in futures:
                        f.cancel()
                    raise
        finally:
            self.broker.stop()
        return entries

    def _run_safely(self, index, point):
        entry = {"run_id": run_id(index), "status": "failed", "hyperparameters": point,
                 "model": model_spec(point, self.model_seed, self.base_model),
                 "optimizer": optimizer_config(point["optimizer"], point["learning_rate"])}
        started = time.perf_counter()
        try:
            entry.update(self._run(entry))
            entry["status"] = "ok"
        except Exception as exc:  # one failed run is a row in the leaderboard, not the end of the sweep
            entry["error"] = f"{type(exc).__name__}: {exc}"
            shutil.rmtree(os.path.join(self.out_dir, "checkpoints", entry["run_id"]), ignore_errors=True)
        finally:
            entry["seconds"] = round(time.perf_counter() - started, 2)
            default_pool.close_thread()
        return entry

    def _run(self, entry):
        name = entry["run_id"]
        run_dir = os.path.join(self.out_dir, "runs", name)
        # named by the run, so a model server on it answers with the run id as its model name
        ckpt_dir, log_dir = os.path.join(self.out_dir, "checkpoints", name), os.path.join(run_dir, "logs")
        for stale in (run_dir, ckpt_dir):  # a stale checkpoint would be restored, not trained
            shutil.rmtree(stale, ignore_errors=True)
        os.makedirs(ckpt_dir)
        os.makedirs(log_dir)
        model_file = os.path.join(ckpt_dir, "model.json")
        with open(model_file, "w") as f:
            json.dump(entry["model"], f, indent=1)
        curve_file = os.path.join(run_dir, "curve.jsonl")
        point = entry["hyperparameters"]
        spec = JobSpec(ClusterConfig(ps=1, workers=1), model=entry["model"], data=self.data,
                       input=InputConfig(self.input, capacity=5_000),
                       training=TrainConfig(epochs=point["epochs"], batch_size=point["batch_size"],
                                            optimizer=entry["optimizer"], backend=self.backend, log_every=1000),
                       checkpoint=CheckpointConfig(dir=ckpt_dir, keep=1))
        if self.data_config:     # beside model.json: the run's tasks read both from its checkpoint directory
            shutil.copy(self.data_config, os.path.join(ckpt_dir, DATA_CONFIG))
        placement = Placement(self.broker.endpoint, prepared=ckpt_dir, log_dir=run_dir, train_rows=len(self.train[1]),
                              container=name if self.input == "preloaded" else None, hooks=(HOOK,),
                              evaluate=self.data is None)
        x, y = self.train
        columns = {**(dict(x) if isinstance(x, dict) else {"image" if self.data is None else "input": x}), "label": y}
        supervisor = Supervisor(log_dir=log_dir, admin_token_value=self.admin_token,   # this run's ps and worker
                                job_token_value=self.job_token)
        cluster = LocalCluster(spec, run_dir, threads_per_worker=self.threads, supervisor=supervisor)
        try:
            cluster.launch(placement, columns, worker_env={CURVE_ENV: curve_file})
            cluster.wait(timeout=self.timeout, interrupt=self._stop)
        finally:
            cluster.stop()
            self._free_container(name)
        result_file = os.path.join(run_dir, "result.json")   # the run's directory: result.json, curve.jsonl, logs
        os.replace(cluster.result_files[0], result_file)
        with open(result_file) as f:
            result = json.load(f)
        validation = self.validate(ckpt_dir, entry["model"])
        metric = PRIMARY[self.task][0]
        return {"validation_metric": metric, "validation_score": round(validation[metric], 4),
                "validation_metrics": {k: round(v, 4) for k, v in validation.items()},
                "validation_accuracy": round(validation["accuracy"], 4) if "accuracy" in validation else None,
                "test_accuracy": result.get("test_accuracy"), "final_loss": result.get("final_loss"),
                "examples_per_s": round(result["examples_per_s"]), "global_step": result["global_step"],
                "checkpoint": ckpt_dir, "model_file": model_file, "curve_file": curve_file,
                "curve_points": len(read_curve(curve_file))}

    def _free_container(self, container):
        if self.input != "preloaded":
            return
        try:
            queues.reset(container, broker=self.broker.endpoint)
        except Exception:
            pass  # the broker is gone: nothing left to free

    @property
    def task(self):
        return self.data.label.task if self.data is not None else "multiclass"

    def validate(self, ckpt_dir, spec):
        """The task's metrics on the validation split, from the run's last checkpoint (what a server would load)."""
        x, y = self.validation
        return evaluate_checkpoint(ckpt_dir, x, y, model_spec=spec, task=self.task)["metrics"]

