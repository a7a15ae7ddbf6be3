"""Forward + backward steps/s of the MNIST MLP and the tutorial CNN, against JAX on the CPU.

Each phase runs a training step (loss and gradients) on one batch of 100 MNIST rows for a
fixed time after a warm-up (numba and XLA compile first). zmqflow's figures: the built-in
MLP on the engine's numba backend (what workers run) and on its numpy backend (the
reference), the CNN on the numpy backend. The baseline is the same network in
JAX, `jax.jit(jax.value_and_grad(loss))`, measured in the same run on the same
threads (both use every core: numpy's BLAS and XLA's thread pool).
"""

import os
import time

import numpy as np

from zmqflow.common.memory import keep_freed_memory
from zmqflow.inputs.datasets import load_mnist
from zmqflow.models.registry import load_model
from zmqflow.models.spec import MNIST_MLP

BATCH = 100


def steps_per_s(step, seconds):
    step()                                   # compile / warm caches
    step()
    count, start = 0, time.perf_counter()
    while True:
        step()
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return count / elapsed


def run(seconds=3.0, progress=None):
    # As in a worker: glibc's malloc otherwise mmaps the CNN's 10 MB activations and page-faults them anew
    # each step, or not, depending on what the earlier phases freed (147 vs 163 ms of CPU a step).
    keep_freed_memory()
    say = progress or (lambda _: None)
    x, y = load_mnist()
    x, y = x[:BATCH].astype(np.float32), y[:BATCH].astype(np.int64)
    result = {"batch": BATCH, "cpu_count": os.cpu_count(), "seconds_per_phase": seconds}

    mlp = load_model(MNIST_MLP, backend="numba")
    params = mlp.initial_values()
    result["mlp_numba_steps_per_s"] = round(steps_per_s(lambda: mlp.step(params, (x, y)), seconds), 1)
    say(f"MLP 784-100-10, numba backend: {result['mlp_numba_steps_per_s']} steps/s")

    reference = load_model(MNIST_MLP, backend="numpy")
    result["mlp_layers_steps_per_s"] = round(steps_per_s(lambda: reference.step(params, (x, y)), seconds), 1)
    say(f"MLP 784-100-10, numpy backend: {result['mlp_layers_steps_per_s']} steps/s")

    model = load_model({"type": "cnn"})
    cnn_params = model.initial_values()
    result["cnn_layers_steps_per_s"] = round(steps_per_s(lambda: model.step(cnn_params, (x, y)), seconds), 2)
    say(f"CNN conv5x5x32-pool-conv5x5x64-pool-dense1024-dense10, numpy backend: "
        f"{result['cnn_layers_steps_per_s']} steps/s")

    try:
        jax_mlp, jax_cnn = _jax_steps(params, cnn_params, x, y)
    except ImportError:
        result["jax"] = "not installed (pip install 'zmqflow[jax]'): no baseline"
        return result
    result["mlp_jax_steps_per_s"] = round(steps_per_s(jax_mlp, seconds), 1)
    result["cnn_jax_steps_per_s"] = round(steps_per_s(jax_cnn, seconds), 2)
    say(f"JAX (jit, CPU): MLP {result['mlp_jax_steps_per_s']} steps/s, CNN {result['cnn_jax_steps_per_s']} steps/s")
    result["mlp_vs_jax"] = round(result["mlp_numba_steps_per_s"] / result["mlp_jax_steps_per_s"], 3)
    result["mlp_layers_vs_jax"] = round(result["mlp_layers_steps_per_s"] / result["mlp_jax_steps_per_s"], 3)
    result["cnn_vs_jax"] = round(result["cnn_layers_steps_per_s"] / result["cnn_jax_steps_per_s"], 3)
    return result


def _jax_steps(mlp_params, cnn_params, x, y):
    """The same two networks in JAX: jitted loss-and-gradient closures that wait for their result."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def cross_entropy(logits):
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(BATCH), y])

    def mlp_loss(p):
        h = jax.nn.sigmoid(x @ p["hidden/weights"] + p["hidden/biases"])
        return cross_entropy(h @ p["softmax/weights"] + p["softmax/biases"])

    def cnn_loss(p):
        h = x.reshape(BATCH, 28, 28, 1)
        for conv in ("conv2d", "conv2d_1"):
            h = lax.conv_general_dilated(h, p[f"{conv}/kernel"], (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
            h = jax.nn.relu(h + p[f"{conv}/bias"])
            h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "SAME")
        h = jax.nn.relu(h.reshape(BATCH, -1) @ p["dense/kernel"] + p["dense/bias"])
        return cross_entropy(h @ p["dense_1/kernel"] + p["dense_1/bias"])

    mlp_step, cnn_step = jax.jit(jax.value_and_grad(mlp_loss)), jax.jit(jax.value_and_grad(cnn_loss))
    mlp_p = {k: jnp.asarray(v) for k, v in mlp_params.items()}
    cnn_p = {k: jnp.asarray(v) for k, v in cnn_params.items()}
    return (lambda: jax.block_until_ready(mlp_step(mlp_p)), lambda: jax.block_until_ready(cnn_step(cnn_p)))
