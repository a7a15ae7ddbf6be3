"""All-reduce benchmark: zmqflow's ring over ZeroMQ against PyTorch's gloo all-reduce of the same bytes.

N processes on this machine (loopback) sum one float32 buffer: the MNIST MLP's gradient (318 KB, what an
all-reduce job reduces every step) and a 64 MB one (bandwidth). Each side runs `warm_up` untimed
reductions, then `rounds` timed ones; the figure is rank 0's mean milliseconds per all-reduce and the
algorithm bandwidth (buffer bytes / time), the same definition for both. The ring is services/worker's
RingLink (the job-token handshake, heartbeats and all, as a job runs it); gloo's is
`torch.distributed.all_reduce` (its ring on TCP). Without torch the gloo rows say why they were skipped.
"""

import multiprocessing
import os
import queue
import tempfile
import time

import numpy as np

from zmqflow.common.rpc import admin_token

SIZES = {"318kb": 318_040 // 4, "64mb": 16 * 1024 * 1024}
"""Elements of float32 per case: the MNIST MLP's gradient (784-100-10), and 64 MB."""


def _zmq_rank(rank, ranks, elements, warm_up, rounds, chief_box, token, results):
    from zmqflow.services.worker.ring_link import RingLink
    link = RingLink(rank, ranks, "tcp://127.0.0.1:*", chief=None if rank == 0 else chief_box.get(timeout=60),
                    lost_after=30.0, job_token=token, join_timeout=60.0)
    try:
        if rank == 0:
            for _ in range(ranks - 1):
                chief_box.put(link.endpoint)
            link.join(lambda: (0, {}))
        else:
            link.join()
        # two buffers in turn: the ring sends chunks without a copy, so a buffer is rewritten only after the next
        # round (which the peers start once they received this one) has ended
        buffers = [np.ones(elements, np.float32), np.ones(elements, np.float32)]
        for step in range(warm_up + rounds):
            if step == warm_up:
                started = time.perf_counter()
            buffer = buffers[step % 2]
            buffer[:] = 1.0
            link.all_reduce(buffer, step)
        elapsed = time.perf_counter() - started
        if buffer[0] != ranks:
            raise AssertionError(f"ring all-reduce summed {buffer[0]}, expected {ranks}")
        results.put((rank, elapsed / rounds))
    finally:
        link.close()


def _gloo_rank(rank, ranks, elements, warm_up, rounds, store, results):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=ranks)
    try:
        tensor = torch.ones(elements, dtype=torch.float32)
        for _ in range(warm_up):
            dist.all_reduce(tensor)
        dist.barrier()
        started = time.perf_counter()
        for _ in range(rounds):
            tensor.fill_(1.0)
            dist.all_reduce(tensor)
        elapsed = time.perf_counter() - started
        if float(tensor[0]) != ranks:
            raise AssertionError(f"gloo all-reduce summed {float(tensor[0])}, expected {ranks}")
        results.put((rank, elapsed / rounds))
    finally:
        dist.destroy_process_group()


def _run_ranks(target, ranks, args, timeout=300.0):
    """Start `ranks` spawned processes of target(rank, ranks, *args, results); rank 0's seconds per round."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(rank, ranks, *args, results), daemon=True) for rank in range(ranks)]
    for proc in procs:
        proc.start()
    try:
        times, deadline = {}, time.monotonic() + timeout
        while len(times) < ranks:
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                raise RuntimeError(f"{target.__name__}: a rank " + (f"exited with {failed[0]}" if failed else
                                                                    f"did not finish within {timeout:g} s"))
            try:
                rank, seconds = results.get(timeout=0.2)
                times[rank] = seconds
            except queue.Empty:
                pass
        for proc in procs:
            proc.join(timeout)
        return times[0]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def zmq_seconds(ranks, elements, warm_up, rounds):
    """Seconds per all-reduce of `elements` float32 over zmqflow's ring of `ranks` processes."""
    ctx = multiprocessing.get_context("spawn")
    return _run_ranks(_zmq_rank, ranks, (elements, warm_up, rounds, ctx.Queue(), admin_token.new_token()))


def gloo_seconds(ranks, elements, warm_up, rounds):
    """Seconds per all-reduce of the same bytes with torch.distributed's gloo backend; None without torch."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_available() or not dist.is_gloo_available():
        return None
    with tempfile.TemporaryDirectory(prefix="gloo-") as directory:
        return _run_ranks(_gloo_rank, ranks, (elements, warm_up, rounds, os.path.join(directory, "store")))


def run(ranks=2, rounds=None, warm_up=3, progress=None, sizes=None):
    """{allreduce_<ranks>r_<size>_{zmq,gloo}_ms: ..., ..._mb_per_s: ..., ..._zmq_vs_gloo: ...}; the gloo rows are
    replaced by allreduce_gloo_skipped (the reason) when torch is missing."""
    say = progress or (lambda *_: None)
    result = {"allreduce_ranks": ranks}
    for name, elements in (sizes or SIZES).items():
        n = rounds or (50 if elements < 1_000_000 else 5)
        key, nbytes = f"allreduce_{ranks}r_{name}", elements * 4
        zmq_s = zmq_seconds(ranks, elements, warm_up, n)
        result[f"{key}_zmq_ms"] = round(zmq_s * 1000, 3)
        result[f"{key}_zmq_mb_per_s"] = round(nbytes / zmq_s / 1e6, 1)
        gloo_s = gloo_seconds(ranks, elements, warm_up, n)
        if gloo_s is None:
            result["allreduce_gloo_skipped"] = ("torch.distributed with gloo is not installed: "
                                                "pip install 'zmqflow[torch]' to compare")
            say(f"{key}: zmq ring {zmq_s * 1000:.2f} ms; gloo skipped (no torch)")
            continue
        result[f"{key}_gloo_ms"] = round(gloo_s * 1000, 3)
        result[f"{key}_gloo_mb_per_s"] = round(nbytes / gloo_s / 1e6, 1)
        result[f"{key}_zmq_vs_gloo"] = round(gloo_s / zmq_s, 3)
        say(f"{key}: zmq ring {zmq_s * 1000:.2f} ms, gloo {gloo_s * 1000:.2f} ms per all-reduce "
            f"({nbytes / 1e6:.1f} MB, {ranks} processes)")
    return result
