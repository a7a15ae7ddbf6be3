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
