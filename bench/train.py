"""Training benchmark: whole jobs on loopback against their ceilings, measured in the same run.

- examples/s of 1 ps + 1 worker async, 1 ps + 2 workers async (with test accuracy
  after 10 epochs), 1 ps + 2 workers sync, all through real processes with preloaded
  input (TF's example fed from memory too), and 1 ps + 2 workers fed by a reader process
  that parses record files every epoch; in-graph replication, sync and async, of 2 replicas
  (one client driving the two workers) beside them; the test accuracy of each run;
- the same model and kernels in one process with no services (the ceiling);
- one forward+backward step on the numba vs the numpy backend;
- pulls/pushes of the MLP's variables against a plain pyzmq round trip of the same bytes;
- pull + push of 16 M float32 through a ps against a plain pyzmq round trip of 64 MB;
- 2 workers in all-reduce mode (no ps), and the all-reduce alone against PyTorch's gloo of the same
  bytes (bench/allreduce.py; its gloo rows skipped, saying why, without torch).
"""

import json
import time

import numpy as np
import zmq

from zmqflow.inputs.datasets import mnist_split
from zmqflow.common.memory import keep_freed_memory
from zmqflow.models.spec import MNIST_MLP
from zmqflow.models.registry import load_model, model_variables
from zmqflow.common.cluster.placement import place
from zmqflow.common.processes.children import start_service
from zmqflow.common.clients.ps import PsClient
from zmqflow.jobs.local_cluster import run_training
from zmqflow.bench import allreduce as allreduce_bench

BATCH = 100


def kernel_steps_per_s(backend, x, y, seconds=1.0):
    model = load_model(MNIST_MLP, backend)
    params = model.initial_values(1)
    model.step(params, (x[:BATCH], y[:BATCH]))  # compile / warm up
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        model.step(params, (x[:BATCH], y[:BATCH]))
        steps += 1
    return steps / (time.perf_counter() - start)


def single_process_examples_per_s(x, y, epochs=2):
    """Plain SGD on the same kernels in one process: the ceiling of any cluster."""
    model = load_model(MNIST_MLP, "numba")
    params = model.initial_values(1)
    start = time.perf_counter()
    for _ in range(epochs):
        for i in range(0, len(y) - BATCH + 1, BATCH):
            _, grads, _ = model.step(params, (x[i:i + BATCH], y[i:i + BATCH]))
            for name, g in grads.items():
                params[name] -= 0.5 * g
    return epochs * (len(y) // BATCH) * BATCH / (time.perf_counter() - start)


def _raw_echo_rate(payload_bytes, seconds=1.0, rounds=None, warm_up=3):
    """Round trips/s and MB/s of a plain DEALER -> ROUTER echo of `payload_bytes` (a thread echoes)."""
    import threading
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def echo():
        while not stop.is_set():
            if router.poll(100):
                router.send_multipart(router.recv_multipart(copy=False), copy=False)

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    payload = np.ones(payload_bytes // 4, np.float32)
    for _ in range(warm_up):
        dealer.send(payload, copy=False)
        dealer.recv(copy=False)
    n, start = 0, time.perf_counter()
    while (rounds is None and time.perf_counter() - start < seconds) or (rounds is not None and n < rounds):
        dealer.send(payload, copy=False)
        np.frombuffer(dealer.recv(copy=False).buffer, np.float32)
        n += 1
    elapsed = time.perf_counter() - start
    stop.set()
    thread.join(2)
    dealer.close(0)
    router.close(0)
    return n / elapsed, n * payload_bytes * 2 / elapsed / 1e6


def ps_rates(seconds=1.0):
    """Pulls/s and pushes/s of the MLP's variables, one request at a time, to one shard process."""
    shard = start_service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP)])
    try:
        placement = place(model_variables(MNIST_MLP), 1)
        ps = PsClient([shard.endpoint], placement)
        params = load_model(MNIST_MLP, "numpy").initial_values(1)
        ps.initialize(params)
        grads = {k: np.zeros_like(v) for k, v in params.items()}
        rates = []
        for op in (lambda: ps.pull(), lambda: ps.push(grads)):
            op()
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                op()
                n += 1
            rates.append(n / (time.perf_counter() - start))
        ps.close()
        return rates
    finally:
        shard.stop()


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


def run(epochs=10, progress=None):
    keep_freed_memory()  # like every zmqflow process: large frames reuse freed memory
    say = progress or (lambda *_: None)
    (x, y), _ = mnist_split()
    result = {"benchmark": "train", "batch_size": BATCH}
    result["kernel_steps_per_s_numpy"] = round(kernel_steps_per_s("numpy", x, y))
    result["kernel_steps_per_s_numba"] = round(kernel_steps_per_s("numba", x, y))
    say(f"kernels: numpy {result['kernel_steps_per_s_numpy']} steps/s, numba {result['kernel_steps_per_s_numba']}")
    result["single_process_examples_per_s"] = round(single_process_examples_per_s(x, y))
    say(f"single process: {result['single_process_examples_per_s']} examples/s")
    pulls, pushes = ps_rates()
    raw_rate, _ = _raw_echo_rate(318_040)
    result.update(ps_pulls_per_s_mlp=round(pulls), ps_pushes_per_s_mlp=round(pushes),
                  raw_roundtrips_per_s_318kb=round(raw_rate), pull_vs_raw=round(pulls / raw_rate, 3))
    say(f"ps: {pulls:.0f} pulls/s, {pushes:.0f} pushes/s; raw 318 KB round trips {raw_rate:.0f}/s")
    result["ps_roundtrip_mb_per_s_64mb"] = round(ps_big_roundtrip_mb_per_s(), 1)
    _, raw_mb = _raw_echo_rate(64 * 1024 * 1024, rounds=8)
    result["raw_roundtrip_mb_per_s_64mb"] = round(raw_mb, 1)
    result["big_vs_raw"] = round(result["ps_roundtrip_mb_per_s_64mb"] / raw_mb, 3)
    say(f"64 MB: ps {result['ps_roundtrip_mb_per_s_64mb']} MB/s, raw {result['raw_roundtrip_mb_per_s_64mb']} MB/s")
    runs = {"1ps_1w_async": (1, 1, "async", 3, "preloaded"), "1ps_2w_async": (1, 2, "async", epochs, "preloaded"),
            "1ps_2w_sync": (1, 2, "sync", 3, "preloaded"), "1ps_2w_async_readers": (1, 2, "async", 3, "readers"),
            "1ps_2w_in_graph_sync": (1, 2, "in-graph sync", 3, "preloaded"),
            "1ps_2w_in_graph_async": (1, 2, "in-graph async", 3, "preloaded"),
            "0ps_2w_allreduce": (0, 2, "allreduce", 3, "preloaded")}
    for key, (ps, workers, mode, ep, feed) in runs.items():
        *replication, mode = mode.split()   # "in-graph sync": one client drives the workers as replicas
        summary = run_training(progress=False, num_ps=ps, num_workers=workers, mode=mode, epochs=ep, input=feed,
                               replication=replication[0] if replication else None)
        result[f"examples_per_s_{key}"] = summary["examples_per_s"]
        result[f"test_accuracy_{key}"] = summary["test_accuracy"]
        if key == "1ps_2w_async":
            result["test_accuracy"] = summary["test_accuracy"]
        say(f"{key}: {summary['examples_per_s']} examples/s, test accuracy {summary['test_accuracy']}")
    result.update(allreduce_bench.run(ranks=2, progress=say))   # the ring alone vs gloo's, same bytes
    return result
