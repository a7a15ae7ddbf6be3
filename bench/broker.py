"""Queue-broker benchmark: the broker against a plain pyzmq relay in the same run.

Phases (each in fresh processes, the broker started by PID like a user would):
  small   a producer process enqueues single elements and a consumer process
          dequeues them, `window` requests in flight each: ops/s counts both.
  latency one client dequeues available elements one at a time: p50 / p99.
  batch   enqueue_many / dequeue_many of 100 x (784 float32 + 1 int32).
  raw     the same batch bytes through producer -> forwarding process -> consumer
          with no logic (PUSH/PULL), the ceiling of this topology.
  memory  a fresh broker's RSS against the bytes its queue holds: a shuffle queue (and a FIFO one) of
          20,000 MNIST rows kept full while rows go through it, readers' 256-row enqueue_many's in and
          workers' 100-row batches out (issue 27: at most 2x the bytes held plus the idle broker's RSS).
"""

import multiprocessing as mp
import time

import numpy as np

from zmqflow.common.processes.children import start_service

BATCH = 100
ROW = 784


def _batch():
    rng = np.random.default_rng(0)
    return [rng.random((BATCH, ROW), dtype=np.float32), np.arange(BATCH, dtype=np.int32)]


def _pipelined(start_op, total, window):
    """Keep `window` requests in flight until `total` completed."""
    inflight, done, sent = [], 0, 0
    while done < total:
        while sent < total and len(inflight) < window:
            inflight.append(start_op())
            sent += 1
        inflight.pop(0).result()
        done += 1


# ------------------------------------------------ broker roles (child processes)


def _open(endpoint, kind, name):
    from zmqflow.common.memory import keep_freed_memory
    from zmqflow.common.clients.queues import FIFOQueue
    keep_freed_memory()
    if kind == "small":
        return FIFOQueue(-1, ["int32"], shapes=[[]], shared_name=name, broker=endpoint)
    return FIFOQueue(64, ["float32", "int32"], shapes=[[ROW], []], shared_name=name, broker=endpoint)


def _producer(endpoint, kind, name, total, window, ready, go, out):
    q = _open(endpoint, kind, name)
    payload = _batch() if kind == "batch" else np.int32(7)
    ready.set()
    go.wait()
    start = time.perf_counter()
    op = (lambda: q.enqueue_many_async(payload)) if kind == "batch" else (lambda: q.enqueue_async(payload))
    _pipelined(op, total, window)
    out.put(("producer", time.perf_counter() - start))


def _consumer(endpoint, kind, name, total, window, ready, go, out):
    q = _open(endpoint, kind, name)
    ready.set()
    go.wait()
    start = time.perf_counter()
    op = (lambda: q.dequeue_many_async(BATCH)) if kind == "batch" else q.dequeue_async
    _pipelined(op, total, window)
    out.put(("consumer", time.perf_counter() - start))


def _run_pair(endpoint, kind, name, total, window):
    ctx = mp.get_context("spawn")
    out, go = ctx.Queue(), ctx.Event()
    readies = [ctx.Event(), ctx.Event()]
    procs = [ctx.Process(target=fn, args=(endpoint, kind, name, total, window, r, go, out))
             for fn, r in ((_producer, readies[0]), (_consumer, readies[1]))]
    for p in procs:
        p.start()
    try:
        for r in readies:
            if not r.wait(60):
                raise RuntimeError("benchmark client did not start")
        start = time.perf_counter()
        go.set()
        results = dict(out.get(timeout=300) for _ in procs)
        elapsed = time.perf_counter() - start
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    return elapsed, results


def _calibrate(endpoint, kind, window, seconds):
    """How many operations fill about `seconds` (a short trial run)."""
    trial = 2000 if kind == "small" else 200
    elapsed, _ = _run_pair(endpoint, kind, f"cal-{kind}", trial, window)
    return max(trial, int(trial * seconds / max(elapsed, 1e-3)))


def _latency(endpoint, samples=2000):
    from zmqflow.common.clients.queues import FIFOQueue
    q = FIFOQueue(-1, ["int32"], shapes=[[]], shared_name="latency", broker=endpoint)
    q.enqueue_many(np.arange(samples, dtype=np.int32))
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        q.dequeue()
        times.append(time.perf_counter() - t)
    us = np.array(times) * 1e6
    return float(np.percentile(us, 50)), float(np.percentile(us, 99))


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def memory(kind="RandomShuffleQueue", capacity=20_000, turnovers=10, enqueue_rows=256):
    """A fresh broker's idle RSS, then its highest RSS while a full queue of `capacity` MNIST rows turns over
    `turnovers` times, and the bytes the queue held (the broker's own count)."""
    from zmqflow.common.clients.queues import FIFOQueue, RandomShuffleQueue
    from zmqflow.common.rpc.client import OpClient
    broker = start_service("zmqflow.services.broker")
    try:
        base = rss_bytes(broker.pid)
        args = dict(dtypes=["float32", "int32"], shapes=[[ROW], []], shared_name="memory", broker=broker.endpoint)
        queue = (RandomShuffleQueue(capacity, capacity // 10, **args) if kind == "RandomShuffleQueue"
                 else FIFOQueue(capacity, **args))
        rng = np.random.default_rng(0)
        rows = [rng.random((enqueue_rows, ROW), dtype=np.float32), np.arange(enqueue_rows, dtype=np.int32)]
        peak, held, through = 0, 0, 0
        with OpClient(broker.endpoint) as client:
            while through < turnovers * capacity:
                if queue.size() + enqueue_rows <= capacity:
                    queue.enqueue_many(rows, timeout=30)
                    continue
                for _ in range(enqueue_rows // BATCH + 1):
                    queue.dequeue_many(BATCH, timeout=30)
                    through += BATCH
                peak = max(peak, rss_bytes(broker.pid))
                held = max(held, client.info()["bytes"])
    finally:
        broker.stop()
    return {"queue": kind, "idle_rss_bytes": base, "held_bytes": held, "peak_rss_bytes": peak,
            "rss_over_held": round((peak - base) / held, 3)}


# ------------------------------------------------ raw relay baseline


def _raw_relay(front, back, ready):
    import zmq
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind(front)
    push.bind(back)
    ready.set()
    while True:
        frames = pull.recv_multipart(copy=False)
        if len(frames) == 1 and frames[0].bytes == b"stop":
            push.send(b"stop")
            return
        push.send_multipart(frames, copy=False)


def _raw_producer(front, total, go):
    import zmq
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.sndhwm = 64
    push.connect(front)
    images, labels = _batch()
    go.wait()
    for _ in range(total):
        push.send_multipart([images, labels], copy=False)
    push.send(b"stop")
    push.close(linger=-1)


def _raw(total):
    import zmq
    ctx = mp.get_context("spawn")
    ports = []
    for _ in range(2):
        s = zmq.Context.instance().socket(zmq.PULL)
        ports.append(s.bind_to_random_port("tcp://127.0.0.1"))
        s.close()
    front, back = (f"tcp://127.0.0.1:{p}" for p in ports)
    ready, go = ctx.Event(), ctx.Event()
    relay = ctx.Process(target=_raw_relay, args=(front, back, ready))
    relay.start()
    ready.wait(60)
    producer = ctx.Process(target=_raw_producer, args=(front, total, go))
    producer.start()
    pull = zmq.Context.instance().socket(zmq.PULL)
    pull.rcvhwm = 64
    pull.connect(back)
    time.sleep(0.2)
    start = time.perf_counter()
    go.set()
    received = 0
    while True:
        frames = pull.recv_multipart(copy=False)
        if len(frames) == 1:
            break
        np.frombuffer(frames[0].buffer, np.float32)
        received += 1
    elapsed = time.perf_counter() - start
    pull.close()
    for p in (producer, relay):
        p.join(10)
        if p.is_alive():
            p.kill()
    return received, elapsed


# ------------------------------------------------ the run


def run(seconds=3.0, window=64, progress=None):
    say = progress or (lambda *_: None)
    batch_bytes = BATCH * (ROW * 4 + 4)
    result = {"benchmark": "broker", "window": window, "batch_bytes": batch_bytes}
    broker = start_service("zmqflow.services.broker")
    try:
        say(f"broker at {broker.endpoint} (pid {broker.pid})")
        n = _calibrate(broker.endpoint, "small", window, seconds)
        elapsed, _ = _run_pair(broker.endpoint, "small", "small", n, window)
        result["small_ops_per_s"] = round(2 * n / elapsed)
        say(f"small ops: {result['small_ops_per_s']}/s ({2 * n} ops in {elapsed:.2f} s)")
        result["p50_us"], result["p99_us"] = (round(x, 1) for x in _latency(broker.endpoint))
        say(f"dequeue latency: p50 {result['p50_us']} us, p99 {result['p99_us']} us")
        n = _calibrate(broker.endpoint, "batch", 8, seconds)
        elapsed, _ = _run_pair(broker.endpoint, "batch", "batch", n, 8)
        result["batch_items_per_s"] = round(n * BATCH / elapsed)
        result["batch_mb_per_s"] = round(n * batch_bytes / elapsed / 1e6, 1)
        say(f"batches: {result['batch_items_per_s']} items/s, {result['batch_mb_per_s']} MB/s")
    finally:
        broker.stop()
    received, elapsed = _raw(max(n, 200))
    result["raw_relay_mb_per_s"] = round(received * batch_bytes / elapsed / 1e6, 1)
    result["batch_vs_raw"] = round(result["batch_mb_per_s"] / result["raw_relay_mb_per_s"], 3)
    say(f"raw relay: {result['raw_relay_mb_per_s']} MB/s; broker/raw = {result['batch_vs_raw']}")
    for kind in ("RandomShuffleQueue", "FIFOQueue"):
        held = memory(kind)
        result[f"memory_{kind}"] = held
        say(f"{kind} of 20,000 rows kept full: {held['held_bytes'] / 2**20:.0f} MB held, broker RSS "
            f"{held['peak_rss_bytes'] / 2**20:.0f} MB at most (idle {held['idle_rss_bytes'] / 2**20:.0f} MB): "
            f"{held['rss_over_held']}x the bytes held above idle")
    return result
