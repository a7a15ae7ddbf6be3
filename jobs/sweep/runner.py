"""Run a sweep's trainings: one shared broker, and per run its own ps task and worker.

Runs never mix: each has its own ps process (its variables, optimizer slots and, with
`input="ps"`, its copy of the data), and its broker queues live in its own resource
container (`run-003`), freed when the run ends. Runs train one per device slot at a time
(`devices`: `--parallel` slots on the default device, or `--devices cpu,cpu,0,1`), each
worker with the machine's cores shared out. A run that fails (exit code, timeout, no
checkpoint) becomes a failed entry with its error; the others go on. With a pruner, the
run's chief reports its validation every N steps (jobs/sweep/pruning.py) and a pruned
run's processes are stopped by PID.
"""

import json
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from zmqflow.common.clients import queues
from zmqflow.common.errors import AbortedError
from zmqflow.inputs.metrics import PRIMARY
from zmqflow.common.rpc import admin_token
from zmqflow.common.processes.children import start_service
from zmqflow.common.processes.supervisor import Supervisor
from zmqflow.common.rpc.client import default_pool
from zmqflow.jobs.sweep import pruning
from zmqflow.jobs.sweep.learning_curve import CURVE_ENV, HOOK, read_curve
from zmqflow.jobs.sweep.space import model_options
from zmqflow.jobs.sweep.leaderboard import higher_is_better
from zmqflow.jobs.evaluate import evaluate_checkpoint
from zmqflow.jobs.local_cluster import LocalCluster
from zmqflow.jobs.spec import (DATA_CONFIG, CheckpointConfig, ClusterConfig, InputConfig, JobSpec, Placement,
                               TrainConfig, optimizer_config)

INPUTS = ("preloaded", "ps")
DEVICE_FORMS = "cpu, a GPU index (0), gpu:0 or /gpu:0"


def model_spec(point, seed=1, base=None):
    """The model of a point: `base` (a spec, --model and its --model-opt) with the point's model.<option>
    values; without a base or for the MLP, 784, the point's hidden widths, 10 (the seeds' MNIST network), with
    the base's initialisation (a data spec's DATA_MLP: glorot_uniform) or the seeds' truncated normal."""
    if base is None or base.get("type") == "mlp":
        inputs, classes = (base["layers"][0], base["layers"][-1]) if base and "layers" in base else (784, 10)
        spec = {**(base or {}), "type": "mlp", "layers": [inputs, *point["hidden"], classes],
                "activation": point["activation"], "seed": seed,
                "init": (base or {}).get("init", {"kind": "truncated_normal", "stddev": 0.1})}
    else:
        spec = dict(base)
    return {**spec, **model_options(point)}


def default_slots(parallel):
    """`parallel` slots on the workers' default device (the first GPU if one is visible, else the CPU)."""
    return [{"name": "default", "env": {}, "cpu": True} for _ in range(max(1, parallel))]


def device_slots(text):
    """'cpu,cpu' or '0,1' (GPU indices as `zmqflow devices` lists them) -> one slot per item, each with the
    environment its workers get: a CPU slot hides the GPUs, a GPU slot shows its GPU alone (as /gpu:0).
    ValueError naming the item for anything else, or a GPU this machine does not show."""
    from zmqflow.common.cluster.device import DeviceSpec
    from zmqflow.common.errors import InvalidArgumentError
    items = [item.strip() for item in (text or "").split(",")]
    if not any(items) or not all(items):
        raise ValueError(f"--devices {text!r}: expected a comma-separated list of {DEVICE_FORMS}, e.g. cpu,cpu or 0,1")
    slots = []
    for item in items:
        try:
            spec = DeviceSpec.from_string(f"/gpu:{item}" if item.isdigit() else
                                          item if item.startswith("/") else f"/{item}")
        except InvalidArgumentError:
            spec = None
        if spec is None or spec.device_type not in ("CPU", "GPU") or spec.job or spec.task is not None:
            raise ValueError(f"--devices: {item!r} is not a device; each is {DEVICE_FORMS}")
        if spec.device_type == "CPU":
            slots.append({"name": "/cpu:0", "env": {"CUDA_VISIBLE_DEVICES": ""}, "cpu": True})
        else:
            slots.append({"name": f"/gpu:{spec.device_index or 0}", "env": _gpu_env(item, spec.device_index or 0),
                          "cpu": False})
    return slots


def _gpu_env(item, index):
    """CUDA_VISIBLE_DEVICES that shows the workers GPU `index` (as this process sees them) alone."""
    from zmqflow.services.worker.devices import visible_gpu_count
    count = visible_gpu_count()
    if index >= count:
        raise ValueError(f"--devices: {item!r} names GPU {index}, but this machine shows "
                         f"{count or 'no'} GPU{'' if count == 1 else 's'} (zmqflow devices lists them)")
    shown = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    physical = shown.split(",")[index].strip() if shown else str(index)
    return {"CUDA_VISIBLE_DEVICES": physical}


class SweepRunner:
    def __init__(self, out_dir, train, validation, parallel=1, input="preloaded", backend="numba", timeout=300.0,
                 model_seed=1, base_model=None, data=None, devices=None, every_steps=None, resume=False):
        if input not in INPUTS:
            raise ValueError(f"input must be one of {', '.join(INPUTS)}, got {input!r}")
        self.out_dir, self.train, self.validation = out_dir, train, validation
        self.devices = devices or default_slots(parallel)
        self.parallel, self.input, self.backend, self.timeout = len(self.devices), input, backend, timeout
        self.model_seed, self.base_model = model_seed, base_model
        self.data = data        # a data spec: its inputs are named as the model's, not MNIST's `image`
        self.every_steps = every_steps or max(1, len(train[1]) // 100)   # reports to a pruner, in global steps
        self.resume = resume
        self.threads = max(1, (os.cpu_count() or 1) // max(1, sum(1 for d in self.devices if d["cpu"])))
        self._stop = threading.Event()
        self.broker = None
        self.admin_token = admin_token.for_job()   # one for the sweep: its broker and every run's tasks
        self.job_token = admin_token.for_job(admin_token.JOB_TOKEN)

    def run(self, feed, on_done=None):
        """Train every run `feed` (jobs/sweep/study.py) gives, one per device slot at a time; returns this
        session's entries in the order they finished. `on_done(entry)` after each run."""
        if not self.resume:
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
        self.validation_file = None
        if feed.pruning:            # what each run's chief validates on, the rows that rank the runs
            self.validation_file = os.path.join(self.out_dir, "validation.npz")
            pruning.write_validation(self.validation_file, self.validation)
        self.broker = start_service("zmqflow.services.broker", log_dir=log_dir,
                                    env={admin_token.ENV: self.admin_token, admin_token.JOB_TOKEN.env: self.job_token})
        admin_token.remember(self.broker.endpoint, self.admin_token)
        admin_token.remember(self.broker.endpoint, self.job_token, admin_token.JOB_TOKEN)
        entries, lock = [], threading.Lock()

        def done(entry):
            with lock:
                entries.append(entry)
                if on_done:
                    on_done(entry)

        try:
            with ThreadPoolExecutor(self.parallel, thread_name_prefix="sweep") as pool:
                futures = [pool.submit(self._slot, device, feed, done) for device in self.devices]
                try:
                    for future in as_completed(futures):
                        future.result()
                except BaseException:  # Ctrl-C: let the running trainings stop, start no more
                    self._stop.set()
                    raise
        finally:
            self.broker.stop()
        return entries

    def _slot(self, device, feed, done):
        """One device's runs, one after the other, until the feed has no more (or the sweep stops)."""
        while not self._stop.is_set():
            run = feed.next()
            if run is None:
                return
            entry = self._run_safely(run, device)
            if entry is not None:
                done(entry)

    def _run_safely(self, run, device):
        """The run's entry (ok, pruned or failed), handed to its trial; None when the sweep stopped meanwhile."""
        point = run.point
        entry = {"run_id": run.run_id, "status": "failed", "hyperparameters": point,
                 "model": model_spec(point, self.model_seed, self.base_model),
                 "optimizer": optimizer_config(point["optimizer"], point["learning_rate"]),
                 "device": device["name"], "started_at": round(time.time(), 3)}
        started = time.perf_counter()
        try:
            entry.update(self._run(entry, run, device))
        except Exception as exc:  # one failed run is a row in the leaderboard, not the end of the sweep
            entry["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            entry["seconds"] = round(time.perf_counter() - started, 2)
            entry["ended_at"] = round(time.time(), 3)
            default_pool.close_thread()
        if entry["status"] != "ok":
            shutil.rmtree(os.path.join(self.out_dir, "checkpoints", entry["run_id"]), ignore_errors=True)
            entry["checkpoint"] = entry["model_file"] = None
        if entry["status"] == "failed" and self._stop.is_set():
            run.interrupt()           # stopped by the sweep, not failed: it trains again on resume
            return None
        run.finish(entry)
        return entry

    def _run(self, entry, run, device):
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
        worker_env, hooks = {CURVE_ENV: curve_file, **device["env"]}, (HOOK,)
        trial = None
        if run.pruning:
            trial_file, trial = pruning.write_trial_file(run_dir, self.validation_file, self.every_steps, self.task)
            worker_env[pruning.TRIAL_ENV], hooks = trial_file, (HOOK, pruning.HOOK)
        placement = Placement(self.broker.endpoint, prepared=ckpt_dir, log_dir=run_dir, train_rows=len(self.train[1]),
                              container=name if self.input == "preloaded" else None, hooks=hooks,
                              evaluate=self.data is None)
        x, y = self.train
        columns = {**(dict(x) if isinstance(x, dict) else {"image" if self.data is None else "input": x}), "label": y}
        supervisor = Supervisor(log_dir=log_dir, admin_token_value=self.admin_token,   # this run's ps and worker
                                job_token_value=self.job_token)
        cluster = LocalCluster(spec, run_dir, threads_per_worker=self.threads, supervisor=supervisor)
        metric = PRIMARY[self.task][0]
        interrupt = threading.Event() if trial else self._stop
        follower = pruning.ReportFollower(trial, lambda step, metrics: run.report(step, metrics[metric]), interrupt,
                                          self._stop) if trial else None
        try:
            if follower:
                follower.start()
            cluster.launch(placement, columns, worker_env=worker_env)
            cluster.wait(timeout=self.timeout, interrupt=interrupt)
        except AbortedError:
            if follower is None or follower.pruned_at is None:
                raise
        finally:
            cluster.stop()           # every process of the run, by PID
            if follower:
                follower.close()
            self._free_container(name)
        curve = {"curve_file": curve_file, "curve_points": len(read_curve(curve_file))}
        reports = [(r["step"], round(r["metrics"][metric], 4)) for r in follower.reports] if follower else []
        if follower and follower.pruned_at is not None:
            return {"status": "pruned", "pruned_at_step": follower.pruned_at, "validation_metric": metric,
                    "global_step": follower.reports[-1]["global_step"], "validation_curve": reports,
                    **_best_report(reports, metric), **curve}
        result_file = os.path.join(run_dir, "result.json")   # the run's directory: result.json, curve.jsonl, logs
        os.replace(cluster.result_files[0], result_file)
        with open(result_file) as f:
            result = json.load(f)
        validation = self.validate(ckpt_dir, entry["model"])
        score = round(validation[metric], 4)
        if run.pruning:        # the final value too, at the last step: what later runs are compared with
            run.report(result["global_step"], validation[metric])
            reports.append((result["global_step"], score))
        return {"status": "ok", "validation_metric": metric, "validation_score": score,
                "validation_metrics": {k: round(v, 4) for k, v in validation.items()},
                "validation_accuracy": round(validation["accuracy"], 4) if "accuracy" in validation else None,
                "test_accuracy": result.get("test_accuracy"), "final_loss": result.get("final_loss"),
                "examples_per_s": round(result["examples_per_s"]), "global_step": result["global_step"],
                "checkpoint": ckpt_dir, "model_file": model_file, **curve,
                **({"validation_curve": reports, **_best_report(reports, metric)} if run.pruning else {})}

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



def _best_report(reports, metric):
    """{best_step, best_value}: the best validation a run reported while it trained."""
    if not reports:
        return {"best_step": None, "best_value": None}
    step, value = (max if higher_is_better(metric) else min)(reports, key=lambda r: r[1])
    return {"best_step": step, "best_value": value}
