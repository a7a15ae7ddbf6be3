"""Training benchmark: whole jobs on loopback against their ceilings, measured in the same run.

- examples/s of 1 ps + 1 worker async, 1 ps + 2 workers async (with test accuracy
  after 10 epochs), 1 ps + 2 workers sync, all through real processes with preloaded
  input (TF's example fed from memory too), and 1 ps + 2 workers fed by a reader process
  that parses record files every epoch; in-graph replication, sync and async, of 2 replicas
  (one client driving the two workers) beside them; the test accuracy of each run;
- the same model and kernels in one process with no services (the ceiling; the ratios' baseline runs with one
  compute thread as each worker does, before and after the cluster runs);
- one forward+backward step on the numba vs the numpy backend;
- pulls/pushes of the MLP's variables against a plain pyzmq round trip of the same bytes, alternated;
- the issue's ratios against those baselines (`targets`): 1 ps + 2 workers async / one process (>= 1.0),
  sync / async (>= 0.95), pull / raw echo (>= 0.9), and the async run's test accuracy (>= 0.90); TensorFlow's
  anchors only where TensorFlow is installed (`tensorflow` says why not);
- pull + push of 16 M float32 through a ps against a plain pyzmq round trip of 64 MB;
- 2 workers in all-reduce mode (no ps), and the all-reduce alone against PyTorch's gloo of the same
  bytes (bench/allreduce.py; its gloo rows skipped, saying why, without torch).
"""

import functools
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from statistics import median

import numpy as np
import zmq

from zmqflow.inputs.datasets import mnist_split
from zmqflow.common.memory import keep_freed_memory
from zmqflow.models.spec import MNIST_MLP
from zmqflow.models.registry import load_model, model_variables
from zmqflow.common.cluster.placement import place
from zmqflow.common.processes.children import compute_thread_env, start_service
from zmqflow.common.clients.ps import PsClient, PsShardClient
from zmqflow.common.errors import OpError
from zmqflow.jobs.local_cluster import LocalCluster, run_training
from zmqflow.bench import allreduce as allreduce_bench

BATCH = 100


def mlp_on(backend):
    """The MNIST MLP as a worker builds it: 'cupy' puts its layers on GPU 0 (services/worker/devices.py)."""
    if backend == "cupy":
        from zmqflow.services.worker.devices import build_model
        return build_model(MNIST_MLP, device="/gpu:0")
    return load_model(MNIST_MLP, backend)


def kernel_steps_per_s(backend, x, y, seconds=1.0):
    model = mlp_on(backend)
    params = model.initial_values(1)
    model.step(params, (x[:BATCH], y[:BATCH]))  # compile / warm up
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        model.step(params, (x[:BATCH], y[:BATCH]))
        steps += 1
    return steps / (time.perf_counter() - start)


def single_process_examples_per_s(x, y, epochs=2, backend="numba"):
    """Plain SGD on the same kernels in one process: the ceiling of any cluster."""
    model = mlp_on(backend)
    params = model.initial_values(1)
    start = time.perf_counter()
    for _ in range(epochs):
        for i in range(0, len(y) - BATCH + 1, BATCH):
            _, grads, _ = model.step(params, (x[i:i + BATCH], y[i:i + BATCH]))
            for name, g in grads.items():
                params[name] -= 0.5 * g
    return epochs * (len(y) // BATCH) * BATCH / (time.perf_counter() - start)


def single_process_one_thread(epochs=2):
    """single_process_examples_per_s in a fresh process with one compute thread, as every worker runs
    (common/processes/children.py's compute_thread_env): on a busy 2-core machine this process's own BLAS
    threads collapse (the same loop ran at 1,575 examples/s here while the workers made 25,000)."""
    code = ("import json; from zmqflow.bench.train import kernel_steps_per_s, single_process_examples_per_s; "
            "from zmqflow.inputs.datasets import mnist_split; (x, y), _ = mnist_split(); "
            "kernel_steps_per_s('numba', x, y, 0.2); "
            f"print(json.dumps(single_process_examples_per_s(x, y, {int(epochs)})))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **compute_thread_env(1)}, check=True,
                         capture_output=True, text=True, timeout=600)
    return float(out.stdout.strip().splitlines()[-1])


def _echo_thread(ctx):
    """A plain pyzmq ROUTER in a thread of this process that sends back what comes: (endpoint, stop())."""
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stopping = threading.Event()

    def echo():
        while not stopping.is_set():
            if router.poll(100):
                router.send_multipart(router.recv_multipart(copy=False), copy=False)

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()

    def stop():
        stopping.set()
        thread.join(2)
        router.close(0)
    return f"tcp://127.0.0.1:{port}", stop


_ECHO_PROCESS = """import zmq
router = zmq.Context.instance().socket(zmq.ROUTER)
print(router.bind_to_random_port("tcp://127.0.0.1"), flush=True)
while True:
    router.send_multipart(router.recv_multipart(copy=False), copy=False)
"""
"""The same echo in a process of its own, as a ps shard is (ps_rates); ended by its PID."""


def _echo_round_trip(dealer, payload):
    dealer.send(payload, copy=False)
    np.frombuffer(dealer.recv(copy=False).buffer, np.float32)


def _raw_echo_rate(payload_bytes, seconds=1.0, rounds=None, warm_up=3):
    """Round trips/s and MB/s of a plain DEALER -> ROUTER echo of `payload_bytes` (a thread echoes)."""
    ctx = zmq.Context.instance()
    endpoint, stop = _echo_thread(ctx)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    payload = np.ones(payload_bytes // 4, np.float32)
    for _ in range(warm_up):
        _echo_round_trip(dealer, payload)
    n, start = 0, time.perf_counter()
    while (rounds is None and time.perf_counter() - start < seconds) or (rounds is not None and n < rounds):
        _echo_round_trip(dealer, payload)
        n += 1
    elapsed = time.perf_counter() - start
    stop()
    dealer.close(0)
    return n / elapsed, n * payload_bytes * 2 / elapsed / 1e6


def ps_rates(seconds=1.0, rounds=3):
    """Pulls of the MLP's variables (318 KB, one request at a time) from one shard process against raw
    DEALER -> ROUTER echoes of the same bytes (sent both ways), taken in turn one operation at a time for
    `seconds` a round: each figure is the median of its operations' times, each ratio the median of the rounds'.

    The baseline (`raw`) echoes from a process of its own, as the ps answers from one: both cross the same
    threads (this one, its I/O thread, the server's I/O thread, the server's thread, and back). The former
    baseline, the echo in a thread of this process (`raw_inprocess`), is reported beside it: one I/O thread
    serves both its ends, two thread hand-offs fewer than any pull can have. Operations in turn, not 1 s rounds
    in turn: this machine's speed drifts within a second (rounds of 1 s spread 0.16-1.12 at load 20)."""
    shard = start_service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP)])
    ctx = zmq.Context.instance()
    echo = subprocess.Popen([sys.executable, "-c", _ECHO_PROCESS], stdout=subprocess.PIPE, text=True)
    inprocess, stop_inprocess = _echo_thread(ctx)
    dealers = []
    try:
        placement = place(model_variables(MNIST_MLP), 1)
        ps = PsClient([shard.endpoint], placement)
        params = load_model(MNIST_MLP, "numpy").initial_values(1)
        ps.initialize(params)
        grads = {k: np.zeros_like(v) for k, v in params.items()}
        payload = np.ones(sum(v.nbytes for v in params.values()) // 4, np.float32)
        ops = {"pull": ps.pull}
        for key, endpoint in (("raw", f"tcp://127.0.0.1:{int(echo.stdout.readline())}"), ("raw_inprocess", inprocess)):
            dealers.append(ctx.socket(zmq.DEALER))
            dealers[-1].connect(endpoint)
            ops[key] = functools.partial(_echo_round_trip, dealers[-1], payload)
        clock = time.perf_counter_ns
        per_round = []   # {op: median ns} a round
        for _ in range(rounds):
            times = {key: [] for key in ops}
            for op in ops.values():
                op()
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                for key, op in ops.items():
                    began = clock()
                    op()
                    times[key].append(clock() - began)
            per_round.append({key: median(ns) for key, ns in times.items()})

        def rate(op):
            op()
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                op()
                n += 1
            return n / (time.perf_counter() - start)

        pushes = rate(lambda: ps.push(grads))
        ps.close()
    finally:
        for dealer in dealers:
            dealer.close(0)
        stop_inprocess()
        echo.terminate()
        echo.wait(10)
        shard.stop()
    per_s = {key: round(1e9 / median(r[key] for r in per_round)) for key in ops}
    ratios = {key: [round(r[key] / r["pull"], 3) for r in per_round] for key in ("raw", "raw_inprocess")}
    return {"ps_pulls_per_s_mlp": per_s["pull"], "ps_pushes_per_s_mlp": round(pushes),
            "raw_roundtrips_per_s_318kb": per_s["raw"], "raw_inprocess_roundtrips_per_s_318kb": per_s["raw_inprocess"],
            "pull_vs_raw": median(ratios["raw"]), "pull_vs_raw_rounds": ratios["raw"],
            "pull_vs_raw_inprocess": median(ratios["raw_inprocess"]), "pull_vs_raw_inprocess_rounds": ratios["raw_inprocess"]}


def tensorflow_anchor():
    """TensorFlow's own figures for the same model (the issue's anchors) need TensorFlow: without it, why not."""
    if importlib.util.find_spec("tensorflow") is None:
        return {"skipped": "tensorflow is not installed in this environment, so TF's single-process and "
                           "distributed (1 ps + 2 workers over gRPC) MNIST MLP anchors cannot be measured in "
                           "this run; the ratios above are against zmqflow's own single-process training"}
    return {"skipped": "tensorflow is installed, but this benchmark does not run TF training itself; "
                       "compare with docs/performance.md's TF rows, measured on the same machine"}


def ps_big_roundtrip_mb_per_s(rounds=8, warm_up=3):
    """pull + push of one 16 M float32 variable (64 MB) through a ps shard, after `warm_up`
    rounds (the first buffers of each side pay their page faults: ~300 ms per 64 MB here)."""
    spec = {"type": "mlp", "layers": [4096, 4096], "activation": "none"}
    shard = start_service("zmqflow.services.ps", ["--model", json.dumps(spec), "--max-message-bytes", str(1 << 30)])
    try:
        placement = place(model_variables(spec), 1)
        ps = PsClient([shard.endpoint], placement, timeout=120)
        params = load_model(spec, "numpy").initial_values(1)
        ps.initialize(params)
        grads = {k: np.zeros_like(v) for k, v in params.items()}
        for _ in range(warm_up):
            ps.pull()
            ps.push(grads)
        start = time.perf_counter()
        for _ in range(rounds):
            ps.pull()
            ps.push(grads)
        elapsed = time.perf_counter() - start
        nbytes = sum(v.nbytes for v in params.values())
        ps.close()
        return rounds * 2 * nbytes / elapsed / 1e6
    finally:
        shard.stop()


def _cpu_seconds(pid):
    """CPU seconds (user + system, every thread) of process `pid` so far, from /proc; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def profiled_training(**options):
    """run_training's summary of a job, with `cpu_us_per_step`: the CPU of each role's processes (ps, workers,
    broker, and this launcher, whose feeder thread enqueues preloaded input) per global step, between 10 % and 90 %
    of the steps (the ps's version sampled beside /proc every 20 ms), so start-up and the end are left out: what
    a step costs in all, against what it costs in one process."""
    samples, stop = [], threading.Event()
    with LocalCluster(**options) as cluster:
        cluster.start()
        roles = {"ps": [s.proc.pid for s in cluster.shards], "workers": [w.proc.pid for w in cluster.workers],
                 "broker": [cluster.broker.proc.pid]}

        def sample():
            with PsShardClient(cluster.shards[0].endpoint, heartbeat_interval=5.0) as client:
                while not stop.is_set():
                    try:
                        version = client.stats(timeout=5.0)["version"]
                    except OpError:
                        break
                    cpu = {role: [_cpu_seconds(pid) for pid in pids] for role, pids in roles.items()}
                    cpu["launcher"] = [time.process_time()]
                    samples.append((version, cpu))
                    time.sleep(0.02)
        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            summary = cluster.wait(False)
        finally:
            stop.set()
            thread.join(10)
    steps = summary["global_step"]
    window = [(v, cpu) for v, cpu in samples if 0.1 * steps <= v <= 0.9 * steps
              and all(c is not None for cs in cpu.values() for c in cs)]
    if len(window) >= 2 and window[-1][0] > window[0][0]:
        (v0, first), (v1, last) = window[0], window[-1]
        summary["cpu_us_per_step"] = {role: round(1e6 * (sum(last[role]) - sum(first[role])) / (v1 - v0))
                                      for role in first}
        summary["cpu_us_per_step"]["all"] = sum(summary["cpu_us_per_step"].values())
    return summary


def run(epochs=10, progress=None, backend="numba"):
    if backend == "cupy":
        return run_gpu(epochs, progress)
    keep_freed_memory()  # like every zmqflow process: large frames reuse freed memory
    say = progress or (lambda *_: None)
    (x, y), _ = mnist_split()
    result = {"benchmark": "train", "batch_size": BATCH}
    result["kernel_steps_per_s_numpy"] = round(kernel_steps_per_s("numpy", x, y))
    result["kernel_steps_per_s_numba"] = round(kernel_steps_per_s("numba", x, y))
    say(f"kernels: numpy {result['kernel_steps_per_s_numpy']} steps/s, numba {result['kernel_steps_per_s_numba']}")
    result["single_process_examples_per_s_bench_threads"] = round(single_process_examples_per_s(x, y))
    single = [single_process_one_thread()]   # again after the cluster runs: the baseline is their mean
    say(f"single process: {single[0]:.0f} examples/s with one compute thread, "
        f"{result['single_process_examples_per_s_bench_threads']} with this process's threads")
    result.update(ps_rates())
    say(f"ps: {result['ps_pulls_per_s_mlp']} pulls/s, {result['ps_pushes_per_s_mlp']} pushes/s; raw 318 KB round "
        f"trips {result['raw_roundtrips_per_s_318kb']}/s: {result['pull_vs_raw']} (rounds {result['pull_vs_raw_rounds']}); "
        f"echoed in this process {result['raw_inprocess_roundtrips_per_s_318kb']}/s: {result['pull_vs_raw_inprocess']}")
    result["ps_roundtrip_mb_per_s_64mb"] = round(ps_big_roundtrip_mb_per_s(), 1)
    _, raw_mb = _raw_echo_rate(64 * 1024 * 1024, rounds=8)
    result["raw_roundtrip_mb_per_s_64mb"] = round(raw_mb, 1)
    result["big_vs_raw"] = round(result["ps_roundtrip_mb_per_s_64mb"] / raw_mb, 3)
    say(f"64 MB: ps {result['ps_roundtrip_mb_per_s_64mb']} MB/s, raw {result['raw_roundtrip_mb_per_s_64mb']} MB/s")
    runs = {"1ps_1w_async": (1, 1, "async", 3, "preloaded"), "1ps_2w_async": (1, 2, "async", epochs, "preloaded"),
            "1ps_2w_sync": (1, 2, "sync", epochs, "preloaded"), "1ps_2w_async_readers": (1, 2, "async", 3, "readers"),
            "1ps_2w_in_graph_sync": (1, 2, "in-graph sync", 3, "preloaded"),
            "1ps_2w_in_graph_async": (1, 2, "in-graph async", 3, "preloaded"),
            "0ps_2w_allreduce": (0, 2, "allreduce", 3, "preloaded")}
    for key, (ps, workers, mode, ep, feed) in runs.items():
        *replication, mode = mode.split()   # "in-graph sync": one client drives the workers as replicas
        launch = profiled_training if key == "1ps_2w_async" else functools.partial(run_training, progress=False)
        summary = launch(num_ps=ps, num_workers=workers, mode=mode, epochs=ep, input=feed,
                         replication=replication[0] if replication else None)
        result[f"examples_per_s_{key}"] = summary["examples_per_s"]
        result[f"test_accuracy_{key}"] = summary["test_accuracy"]
        if key == "1ps_2w_async":
            result["test_accuracy"] = summary["test_accuracy"]
            result["cpu_us_per_step_1ps_2w_async"] = summary.get("cpu_us_per_step")
            say(f"CPU per step: {summary.get('cpu_us_per_step')} us")
        say(f"{key}: {summary['examples_per_s']} examples/s, test accuracy {summary['test_accuracy']}")
        if key == "1ps_2w_sync":   # the baseline once more, right after the async and sync runs
            single.append(single_process_one_thread())
            say(f"single process again: {single[1]:.0f} examples/s")
    result["single_process_examples_per_s"] = round(sum(single) / len(single))
    result["single_process_examples_per_s_runs"] = [round(s) for s in single]
    result.update(allreduce_bench.run(ranks=2, progress=say))   # the ring alone vs gloo's, same bytes
    result.update(targets(result))
    result["tensorflow"] = tensorflow_anchor()
    return result


def run_gpu(epochs=10, progress=None):
    """CuPy workers: 1 ps + 2 workers async and sync with their kernels on the GPU, against the same job on
    numba workers and the MLP in one process on the GPU, in this run (examples/s and test accuracy)."""
    from zmqflow.models.kernels import gpu_count
    from zmqflow.models.kernels.cupy_kernels import why_no_gpu
    keep_freed_memory()
    say = progress or (lambda *_: None)
    result = {"benchmark": "train", "backend": "cupy", "batch_size": BATCH}
    if gpu_count() == 0:
        result["skipped"] = f"no GPU: {why_no_gpu()}"
        return result
    (x, y), _ = mnist_split()
    for backend in ("numba", "cupy"):
        result[f"kernel_steps_per_s_{backend}"] = round(kernel_steps_per_s(backend, x, y))
        result[f"single_process_examples_per_s_{backend}"] = round(single_process_examples_per_s(x, y,
                                                                                                 backend=backend))
    say(f"kernels: numba {result['kernel_steps_per_s_numba']} steps/s, cupy {result['kernel_steps_per_s_cupy']}; "
        f"one process: numba {result['single_process_examples_per_s_numba']} examples/s, "
        f"cupy {result['single_process_examples_per_s_cupy']}")
    for backend, mode in (("numba", "async"), ("cupy", "async"), ("cupy", "sync")):
        key = f"1ps_2w_{mode}_{backend}"
        summary = run_training(num_ps=1, num_workers=2, mode=mode, epochs=epochs, input="preloaded",
                               backend=backend, progress=False)
        result[f"examples_per_s_{key}"] = summary["examples_per_s"]
        result[f"test_accuracy_{key}"] = summary["test_accuracy"]
        say(f"{key}: {summary['examples_per_s']} examples/s, test accuracy {summary['test_accuracy']}")
    cupy_async = result["examples_per_s_1ps_2w_async_cupy"]
    result["cupy_vs_numba_workers"] = round(cupy_async / result["examples_per_s_1ps_2w_async_numba"], 3)
    result["cupy_workers_vs_single_process_cupy"] = round(cupy_async / result["single_process_examples_per_s_cupy"], 3)
    result["sync_vs_async_cupy"] = round(result["examples_per_s_1ps_2w_sync_cupy"] / cupy_async, 3)
    return result


def targets(result):
    """The issue's training ratios, each against its baseline measured in this run: {ratio: value} and
    `targets`: {ratio: {value, target, met}}."""
    asynchronous = result["examples_per_s_1ps_2w_async"]
    ratios = {"distributed_vs_single_process": round(asynchronous / result["single_process_examples_per_s"], 3),
              "sync_vs_async": round(result["examples_per_s_1ps_2w_sync"] / asynchronous, 3),
              "pull_vs_raw": result["pull_vs_raw"]}
    wanted = {"distributed_vs_single_process": 1.0, "sync_vs_async": 0.95, "pull_vs_raw": 0.9}
    checks = {name: {"value": value, "target": wanted[name], "met": value >= wanted[name]}
              for name, value in ratios.items()}
    accuracy = result["test_accuracy"]
    checks["test_accuracy_1ps_2w_async"] = {"value": accuracy, "target": 0.9,
                                            "met": accuracy is not None and accuracy >= 0.9}
    return {**ratios, "targets": checks}
