"""A JAX model trained by zmqflow's ps shards and workers: the parameters live on the ps as named
variables (hidden/w, hidden/b, out/w, out/b), the workers compute jax.value_and_grad.

    python examples/jax_model.py                       # needs `pip install 'zmqflow[jax]'`
    zmqflow train --model examples/jax_model.py:build  # the same from the command line
"""

import os

import jax
import jax.numpy as jnp

from zmqflow.adapters.jax import JaxModel


def init(key):
    k1, k2 = jax.random.split(key)
    return {"hidden": {"w": jax.random.normal(k1, (784, 128)) * 0.05, "b": jnp.zeros(128)},
            "out": {"w": jax.random.normal(k2, (128, 10)) * 0.05, "b": jnp.zeros(10)}}


def apply(params, x):
    h = jax.nn.gelu(x @ params["hidden"]["w"] + params["hidden"]["b"])
    return h @ params["out"]["w"] + params["out"]["b"]


def build(input_signature):
    """What `--model examples/jax_model.py:build` calls on every task."""
    (shape, _), = input_signature.values()
    return JaxModel(apply, init, input_shape=shape)


def main():
    from zmqflow.jobs.local_cluster import run_training
    summary = run_training(progress=False, model={"type": f"{os.path.abspath(__file__)}:build"}, epochs=5)
    print(f"jax_model: test accuracy {summary['test_accuracy']:.4f} after 5 epochs "
          f"({summary['examples_per_s']:,} examples/s)")
    return 0 if summary["test_accuracy"] >= 0.85 else 1


if __name__ == "__main__":
    raise SystemExit(main())
