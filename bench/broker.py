"""Queue-broker benchmark: the broker against its baselines, measured in the same run, round by round.

Phases (each in fresh processes, the broker started by PID like a user would):
  small   `clients` (50) unpipelined clients enqueue, then dequeue, single int32 elements: ops/s against
          redis-benchmark's LPUSH/RPOP with as many clients on a redis-server this bench starts on
          127.0.0.1 (skipped, saying why, when it is not installed); the CPU seconds per request of the
          broker process (and of redis-server) from /proc.
  batch   enqueue_many / dequeue_many of 100 x (784 float32 + 1 int32), 313 KB, producer -> consumer
          processes through the broker, against the same bytes through producer -> forwarding process ->
          consumer with no logic (PUSH/PULL): the ceiling of this topology.
  latency one client dequeues available elements one at a time: p50 / p99.
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


def _open(endpoint, name):
    from zmqflow.common.memory import keep_freed_memory
    from zmqflow.common.clients.queues import FIFOQueue
    keep_freed_memory()
    # room for 64 batches, as the raw relay's high-water marks of 64 messages (64 rows split every batch in two)
    return FIFOQueue(64 * BATCH, ["float32", "int32"], shapes=[[ROW], []], shared_name=name, broker=endpoint)


def _producer(endpoint, name, total, window, ready, go, out):
    q = _open(endpoint, name)
    payload = _batch()
    ready.set()
    go.wait()
    start = time.perf_counter()
    _pipelined(lambda: q.enqueue_many_async(payload), total, window)
    out.put(("producer", time.perf_counter() - start))


def _consumer(endpoint, name, total, window, ready, go, out):
    q = _open(endpoint, name)
    ready.set()
    go.wait()
    start = time.perf_counter()
    _pipelined(lambda: q.dequeue_many_async(BATCH), total, window)
    out.put(("consumer", time.perf_counter() - start))


def _run_pair(endpoint, name, total, window):
    """Seconds for a producer and a consumer process to move `total` batches through the broker."""
    ctx = mp.get_context("spawn")
    out, go = ctx.Queue(), ctx.Event()
    readies = [ctx.Event(), ctx.Event()]
    procs = [ctx.Process(target=fn, args=(endpoint, name, total, window, r, go, out))
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


def _calibrate(endpoint, window, seconds):
    """How many batches fill about `seconds` (a short trial run)."""
    trial = 50
    elapsed, _ = _run_pair(endpoint, "cal-batch", trial, window)
    return max(20, int(trial * seconds / max(elapsed, 1e-3)))


def _latency(endpoint, name, samples=2000):
    """p50 and p99 (us) of one client's dequeues of elements already there, through the broker client."""
    from zmqflow.common.clients.queues import FIFOQueue
    q = FIFOQueue(-1, ["int32"], shapes=[[]], shared_name=name, broker=endpoint)
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


def _raw_producer(front, total, ready, go):
    import zmq
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.sndhwm = 64
    push.connect(front)
    images, labels = _batch()
    ready.set()
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
    producer_ready = ctx.Event()
    producer = ctx.Process(target=_raw_producer, args=(front, total, producer_ready, go))
    producer.start()
    pull = zmq.Context.instance().socket(zmq.PULL)
    pull.rcvhwm = 64
    pull.connect(back)
    if not producer_ready.wait(60):
        raise RuntimeError("the raw relay's producer did not start")
    time.sleep(0.2)  # its connection and the consumer's made
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


# ------------------------------------------------ small ops: 50 unpipelined clients, as redis-benchmark's


def _small_client(endpoint, clients, commands, results):
    """`clients` DEALER sockets with one request in flight each (redis-benchmark's -c, unpipelined); each
    command (request, total) runs until `total` are answered, every answer's code checked, and puts (seconds,
    errors). The request is encoded once, by the broker client's own encoder (common/rpc/calls.py, with the
    job token), and sent again as each answer comes: like redis-benchmark, this client costs little next to
    the server it measures. One process for the whole run (a spawn costs seconds)."""
    import msgpack
    import zmq
    from zmqflow.common.rpc.calls import Calls
    encoder = Calls(endpoint)
    ctx = zmq.Context()
    socks, poller = [], zmq.Poller()
    for _ in range(clients):
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(endpoint)
        poller.register(sock, zmq.POLLIN)
        socks.append(sock)
    results.put("ready")
    for request, total in iter(commands.get, None):
        frames = encoder.encode(request, None, [np.int32(7)] if request.OP == "enqueue" else [], None)[1]
        frames = [bytes(f) for f in frames]
        start = time.perf_counter()
        sent = done = errors = 0
        for sock in socks[:total]:
            sock.send_multipart(frames)
            sent += 1
        while done < total:
            for sock, _ in poller.poll(30_000) or _timeout("the broker stopped answering"):
                while True:
                    try:
                        reply = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    done += 1
                    errors += msgpack.unpackb(reply[0])["code"] != 0
                    if sent < total:
                        sock.send_multipart(frames)
                        sent += 1
        results.put((time.perf_counter() - start, errors))
    for sock in socks:
        sock.close()


def _timeout(why):
    raise RuntimeError(why)


def _cpu_seconds(pid):
    """User + system CPU seconds of process `pid` so far (/proc/PID/stat)."""
    import os
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class SmallOps:
    """The small-ops load (`_small_client`) in one process, against `broker` (a started service)."""

    def __init__(self, broker, clients):
        from zmqflow.common.clients.queues import FIFOQueue
        self.broker = broker
        self.handle = FIFOQueue(-1, ["int32"], shapes=[[]], shared_name="small", broker=broker.endpoint).handle
        ctx = mp.get_context("spawn")
        self.commands, self.results = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_small_client, args=(broker.endpoint, clients, self.commands, self.results))
        self.proc.start()
        if self.results.get(timeout=60) != "ready":
            raise RuntimeError("the small-ops client did not start")

    def run(self, n):
        """(enqueues/s, dequeues/s, ops/s both, CPU s per request of the broker) for n enqueues then n dequeues."""
        from zmqflow.common.wire.protocol import BrokerOps
        rates, cpu = [], 0.0
        for request in (BrokerOps.Enqueue(self.handle), BrokerOps.Dequeue(self.handle)):
            before = _cpu_seconds(self.broker.pid)
            self.commands.put((request, n))
            elapsed, errors = self.results.get(timeout=300)
            cpu += _cpu_seconds(self.broker.pid) - before
            if errors:
                raise RuntimeError(f"{errors} of {n} {request.OP} requests failed")
            rates.append(n / elapsed)
        return rates[0], rates[1], 2 * n / (n / rates[0] + n / rates[1]), cpu / (2 * n)

    def close(self):
        self.commands.put(None)
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()


class Redis:
    """A redis-server of the distribution's packages on 127.0.0.1, an ephemeral port, nothing saved."""

    def __init__(self):
        import shutil
        self.server, self.benchmark = shutil.which("redis-server"), shutil.which("redis-benchmark")
        self.skipped = None if self.server and self.benchmark else \
            "redis-server or redis-benchmark is not installed (Debian/Ubuntu: apt-get install redis-server redis-tools)"
        self.proc = self.port = None

    def start(self):
        import socket
        import subprocess
        with socket.socket() as s:  # a free port, taken by redis-server at once
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen([self.server, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                                      "--appendonly", "no", "--protected-mode", "yes"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not start on 127.0.0.1:{self.port}")
            time.sleep(0.05)

    def lpush_rpop(self, clients, n):
        """(LPUSH/s, RPOP/s, ops/s both, CPU s per request of redis-server): redis-benchmark, unpipelined."""
        import csv
        import subprocess
        before = _cpu_seconds(self.proc.pid)
        out = subprocess.run([self.benchmark, "-h", "127.0.0.1", "-p", str(self.port), "-c", str(clients),
                              "-n", str(n), "-t", "lpush,rpop", "--csv"],
                             capture_output=True, text=True, timeout=600, check=True).stdout
        cpu = _cpu_seconds(self.proc.pid) - before
        rps = {row["test"]: float(row["rps"]) for row in csv.DictReader(out.splitlines())}
        push, pop = rps["LPUSH"], rps["RPOP"]
        return push, pop, 2 * n / (n / push + n / pop), cpu / (2 * n)

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except Exception:
                self.proc.kill()
            self.proc = None


# ------------------------------------------------ the run


def _median(values):
    return float(np.median(values))


def run(seconds=3.0, window=8, clients=50, rounds=3, memory_phase=True, progress=None):
    """Each round measures the broker and its baseline back to back (the machine's speed drifts): small ops
    by `clients` unpipelined clients against redis-benchmark's LPUSH/RPOP, batches of 313 KB producer ->
    consumer (`window` in flight) against a raw ZeroMQ relay, one client's dequeue latency. Medians of the
    rounds; each ratio is the median of the rounds' ratios."""
    say = progress or (lambda *_: None)
    batch_bytes = BATCH * (ROW * 4 + 4)
    result = {"benchmark": "broker", "rounds": rounds, "clients": clients, "window": window,
              "batch_bytes": batch_bytes}
    redis = Redis()
    if redis.skipped is None:
        redis.start()
        say(f"redis-server on 127.0.0.1:{redis.port}")
    else:
        result["redis_skipped"] = redis.skipped
        say(f"redis skipped: {redis.skipped}")
    broker = start_service("zmqflow.services.broker")
    got, small = {}, None
    try:
        say(f"broker at {broker.endpoint} (pid {broker.pid})")
        small = SmallOps(broker, clients)
        _, _, ops, _ = small.run(1000)  # a trial: how many fill `seconds`
        n_small = max(200, int(ops * seconds / 2))
        n_batch = _calibrate(broker.endpoint, window, seconds)
        for r in range(rounds):
            enq, deq, ops, cpu = small.run(n_small)
            got.setdefault("small_enqueue_per_s", []).append(enq)
            got.setdefault("small_dequeue_per_s", []).append(deq)
            got.setdefault("small_ops_per_s", []).append(ops)
            got.setdefault("broker_cpu_us_per_request", []).append(cpu * 1e6)
            say(f"round {r + 1}: broker {enq:.0f} enqueues/s, {deq:.0f} dequeues/s, {cpu * 1e6:.1f} us CPU/request")
            if redis.skipped is None:
                push, pop, rops, rcpu = redis.lpush_rpop(clients, n_small)
                got.setdefault("redis_lpush_per_s", []).append(push)
                got.setdefault("redis_rpop_per_s", []).append(pop)
                got.setdefault("redis_ops_per_s", []).append(rops)
                got.setdefault("redis_cpu_us_per_request", []).append(rcpu * 1e6)
                got.setdefault("small_vs_redis", []).append(ops / rops)
                say(f"round {r + 1}: redis {push:.0f} LPUSH/s, {pop:.0f} RPOP/s, {rcpu * 1e6:.1f} us CPU/request: "
                    f"broker/redis {ops / rops:.2f}")
            before = _cpu_seconds(broker.pid)
            elapsed, _ = _run_pair(broker.endpoint, f"batch{r}", n_batch, window)
            got.setdefault("broker_cpu_us_per_batch", []).append((_cpu_seconds(broker.pid) - before) / n_batch * 1e6)
            mb = n_batch * batch_bytes / elapsed / 1e6
            received, raw_elapsed = _raw(n_batch)
            raw_mb = received * batch_bytes / raw_elapsed / 1e6
            got.setdefault("batch_mb_per_s", []).append(mb)
            got.setdefault("raw_relay_mb_per_s", []).append(raw_mb)
            got.setdefault("batch_vs_raw", []).append(mb / raw_mb)
            say(f"round {r + 1}: batches {mb:.0f} MB/s ({got['broker_cpu_us_per_batch'][-1]:.0f} us broker CPU a batch "
                f"in and out), raw relay {raw_mb:.0f} MB/s: {mb / raw_mb:.2f}")
            p50, p99 = _latency(broker.endpoint, f"latency{r}")
            got.setdefault("p50_us", []).append(p50)
            got.setdefault("p99_us", []).append(p99)
            say(f"round {r + 1}: one client's dequeue p50 {p50:.0f} us, p99 {p99:.0f} us")
    finally:
        if small is not None:
            small.close()
        broker.stop()
        redis.stop()
    for key, values in got.items():
        result[key] = round(_median(values), 3 if "_vs_" in key else 1)
    result["batch_items_per_s"] = round(result["batch_mb_per_s"] * 1e6 / batch_bytes)
    result["targets"] = {"batch_vs_raw": ">= 0.9", "small_vs_redis": ">= 1.0", "p99_us": "<= 300"}
    for kind in ("RandomShuffleQueue", "FIFOQueue") if memory_phase else ():
        held = memory(kind)
        result[f"memory_{kind}"] = held
        say(f"{kind} of 20,000 rows kept full: {held['held_bytes'] / 2**20:.0f} MB held, broker RSS "
            f"{held['peak_rss_bytes'] / 2**20:.0f} MB at most (idle {held['idle_rss_bytes'] / 2**20:.0f} MB): "
            f"{held['rss_over_held']}x the bytes held above idle")
    return result
