"""`zmqflow bench kernels --json`: it runs, measures every phase and reports the ratios to JAX."""

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_bench_kernels_reports_steps_and_ratios_to_jax():
    pytest.importorskip("jax", reason="JAX is not installed: the benchmark has no baseline")
    done = subprocess.run([sys.executable, "-m", "zmqflow", "bench", "kernels", "--json", "--duration-secs", "0.3"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("mlp_numba_steps_per_s", "mlp_layers_steps_per_s", "cnn_layers_steps_per_s", "mlp_jax_steps_per_s",
                "cnn_jax_steps_per_s"):
        assert result[key] > 0, key
    assert result["mlp_vs_jax"] == pytest.approx(result["mlp_numba_steps_per_s"] / result["mlp_jax_steps_per_s"],
                                                  rel=0.01, abs=0.0005)   # the ratio is rounded to 3 places
    assert result["cnn_vs_jax"] == pytest.approx(result["cnn_layers_steps_per_s"] / result["cnn_jax_steps_per_s"],
                                                  rel=0.02, abs=0.0005)


def test_bench_kernels_on_the_gpu_says_why_it_skips_without_one():
    from zmqflow.bench import kernels
    from zmqflow.models.kernels import gpu_count
    if gpu_count() > 0:
        pytest.skip("a GPU is visible: the gpu tier measures it (test_bench_kernels_on_the_gpu_against_pytorch)")
    result = kernels.run(seconds=0.1, backend="cupy")
    assert result["backend"] == "cupy" and result["skipped"].startswith("no GPU: ")
    assert "mlp_cupy_steps_per_s" not in result


@pytest.mark.torch
def test_the_pytorch_baseline_steps_train_the_same_shapes():
    """The baseline's networks, run on the CPU here: the copied step returns a finite loss and one gradient per
    parameter, shaped as zmqflow's MLP's and CNN's variables are (transposed where PyTorch stores them so)."""
    torch = pytest.importorskip("torch")
    import numpy as np
    from zmqflow.bench.kernels import _torch_cuda_steps
    from zmqflow.models.registry import load_model
    from zmqflow.models.spec import MNIST_MLP
    rng = np.random.default_rng(0)
    x, y = rng.random((100, 784), dtype=np.float32), rng.integers(0, 10, 100)
    steps = _torch_cuda_steps(x, y, device="cpu")
    assert steps["version"] == torch.__version__
    for name, spec in (("mlp", MNIST_MLP), ("cnn", {"type": "cnn"})):
        resident, copied = steps[name]
        resident()
        loss, grads = copied()
        assert np.isfinite(loss) and all(np.isfinite(g).all() for g in grads)
        ours = sorted(int(np.prod(v.shape)) for v in load_model(spec).variables())
        assert sorted(g.size for g in grads) == ours


@pytest.mark.gpu
def test_bench_kernels_on_the_gpu_against_pytorch():
    pytest.importorskip("cupy", reason="CuPy is not installed (pip install 'zmqflow[gpu]')")
    pytest.importorskip("torch", reason="PyTorch is not installed: the GPU benchmark has no baseline")
    done = subprocess.run([sys.executable, "-m", "zmqflow", "bench", "kernels", "--backend", "cupy", "--json",
                           "--duration-secs", "0.3"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("mlp", "cnn"):
        for key in (f"{name}_cupy_steps_per_s", f"{name}_cupy_pageable_steps_per_s", f"{name}_torch_cuda_steps_per_s",
                    f"{name}_torch_cuda_resident_steps_per_s"):
            assert result[key] > 0, key
        assert result[f"{name}_pinned_vs_pageable"] == pytest.approx(
            result[f"{name}_cupy_steps_per_s"] / result[f"{name}_cupy_pageable_steps_per_s"], rel=0.01, abs=0.0005)
        assert result["targets"][f"{name}_vs_torch_cuda"]["value"] == result[f"{name}_vs_torch_cuda"]
