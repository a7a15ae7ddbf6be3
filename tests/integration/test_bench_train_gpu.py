"""`zmqflow bench train --backend cupy`: CuPy workers against numba workers and one process on the GPU."""

import json
import subprocess
import sys

import pytest

from zmqflow.models.kernels import gpu_count

pytestmark = pytest.mark.integration


def test_bench_train_on_the_gpu_says_why_it_skips_without_one():
    if gpu_count() > 0:
        pytest.skip("a GPU is visible: the gpu tier runs the benchmark")
    done = subprocess.run([sys.executable, "-m", "zmqflow", "bench", "train", "--backend", "cupy", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["backend"] == "cupy" and result["skipped"].startswith("no GPU: ")


@pytest.mark.gpu
@pytest.mark.slow
def test_bench_train_with_cupy_workers():
    pytest.importorskip("cupy", reason="CuPy is not installed (pip install 'zmqflow[gpu]')")
    if gpu_count() == 0:
        pytest.skip("no GPU is visible")
    done = subprocess.run([sys.executable, "-m", "zmqflow", "bench", "train", "--backend", "cupy", "--epochs", "1",
                           "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("kernel_steps_per_s_cupy", "single_process_examples_per_s_cupy", "examples_per_s_1ps_2w_async_cupy",
                "examples_per_s_1ps_2w_sync_cupy", "examples_per_s_1ps_2w_async_numba"):
        assert result[key] > 0, key
    assert result["test_accuracy_1ps_2w_async_cupy"] > 0.5   # one epoch of 45 steps per worker learns something
