"""A CNN trained for a few SGD steps in this process, and its checkpoint: shared by the export tests."""

import numpy as np
import pytest

from zmqflow.common.checkpoints.checkpoint import save_params
from zmqflow.models.registry import load_model

CNN_SPEC = {"type": "cnn", "filters": [4, 8], "dense": 32}
STEPS = 30


def sgd_trained(model, x, y, steps, lr=0.1, batch=32):
    """(params, losses): plain SGD as the ps applies it, non-trainable updates assigned as workers do."""
    params = model.initial_values()
    losses = []
    for i in range(steps):
        start = i * batch % (len(y) - batch)
        loss, grads, metrics = model.step(params, (x[start:start + batch], y[start:start + batch]))
        params = {name: value - np.float32(lr) * grads[name] if name in grads else value
                  for name, value in params.items()}
        params.update(metrics.get("updates", {}))
        losses.append(loss)
    return params, losses


@pytest.fixture(scope="session")
def trained_cnn(tmp_path_factory):
    """{"model", "params", "losses", "test_x", "checkpoint_dir"}: the CNN, trained on 1,024 MNIST rows and
    saved at step STEPS as the model server would find it."""
    from zmqflow.inputs.datasets import mnist_split
    (train_x, train_y), (test_x, _) = mnist_split()
    order = np.random.default_rng(0).permutation(len(train_y))[:1024]
    model = load_model(CNN_SPEC)
    params, losses = sgd_trained(model, train_x[order], train_y[order], STEPS)
    directory = tmp_path_factory.mktemp("export") / "mnist-cnn"
    save_params(str(directory), STEPS, params, {"model": CNN_SPEC})
    return {"model": model, "params": params, "losses": losses, "test_x": test_x[:64], "checkpoint_dir": directory}
