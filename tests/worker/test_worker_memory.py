"""Issue 27, found by the soak tier: a worker kept every step's loss (32 bytes a step, about 660 MB a day at 240 steps
a second) though its summary needs only the last 20. Its memory must not grow with the steps it takes."""

import numpy as np
import pytest

import zmqflow
from zmqflow.services.worker.trainer import FINAL_LOSS_STEPS
from tests.worker.test_session_hooks import logistic_ps

pytestmark = pytest.mark.service

STEPS = 300


def test_a_worker_keeps_only_the_losses_its_summary_needs(tmp_path):
    with logistic_ps(tmp_path) as (_, train, cluster, model):
        server = zmqflow.Server(cluster, "worker", 0, model=model)
        rng = np.random.default_rng(0)
        with zmqflow.MonitoredTrainingSession(server) as sess:
            losses = [sess.run(*train.batch(rng.integers(0, train.rows, 50))) for _ in range(STEPS)]
            kept = list(sess.trainer.losses)
    assert kept == losses[-FINAL_LOSS_STEPS:]


ARENAS = """
import ctypes, re, sys, tempfile, threading
from zmqflow.common.memory import one_arena
if sys.argv[1] == "one":
    assert one_arena()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.fdopen.restype = ctypes.c_void_p, ctypes.c_void_p
libc.free.argtypes = libc.fflush.argtypes = [ctypes.c_void_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
together = threading.Barrier(3)

def allocate():                     # as libzmq's I/O thread does for each frame it receives, three threads at once
    together.wait()
    for _ in range(2000):
        libc.free(libc.malloc(200_000))

threads = [threading.Thread(target=allocate) for _ in range(3)]
[t.start() for t in threads]
[t.join() for t in threads]
with tempfile.TemporaryFile("w+") as f:
    stream = libc.fdopen(f.fileno(), b"w")
    libc.malloc_info(0, stream)
    libc.fflush(stream)
    f.seek(0)
    print(len(re.findall(r"<heap nr=", f.read())))
"""


@pytest.mark.unit
@pytest.mark.parametrize("arenas", ["one", "default"])
def test_one_arena_serves_every_threads_malloc(arenas):
    """common/memory.py's one_arena: threads allocating at once share the main arena instead of each making one
    (glibc's malloc_info counts the heaps)."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", ARENAS, arenas], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    heaps = int(done.stdout.split()[-1])
    assert heaps == 1 if arenas == "one" else heaps > 1


@pytest.mark.unit
@pytest.mark.parametrize("towers, applied", [(1, True), (2, False)])
def test_a_worker_computing_on_one_thread_takes_one_arena(monkeypatch, towers, applied):
    """`zmqflow worker` asks for one arena when it computes on one thread, not with CPU towers (threads that
    would share its lock)."""
    from click.testing import CliRunner
    from zmqflow.services.worker import build, cli
    calls = []
    monkeypatch.setattr(cli, "one_arena", lambda: calls.append("one_arena"))
    monkeypatch.setattr(cli, "keep_freed_memory", lambda: None)
    monkeypatch.setattr(build, "run", lambda config: calls.append(("run", config.towers)))
    monkeypatch.delenv("TF_CONFIG", raising=False)
    result = CliRunner().invoke(cli.command, ["--ps", "tcp://127.0.0.1:1", "--broker", "tcp://127.0.0.1:2",
                                              "--towers", str(towers)])
    assert result.exit_code == 0, result.output
    assert calls == (["one_arena"] if applied else []) + [("run", towers)]
