"""Issue: NaN/Inf gradients were accepted and the model became NaN. A real ps process gets pushes
holding NaN and Inf from a real client: skipped and counted (or refused by policy), the variables
stay finite, training goes on."""

import json

import numpy as np
import pytest

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.cluster.placement import place
from zmqflow.common.clients.ps import PsClient
from zmqflow.models.registry import load_model, model_variables
from zmqflow.models.spec import MNIST_MLP

pytestmark = pytest.mark.faults


def ps_client(processes, *extra):
    proc = processes.service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP), "--optimizer",
                                                    '{"kind": "adam", "learning_rate": 0.01}', *extra])
    client = PsClient([proc.endpoint], place(model_variables(MNIST_MLP), 1))
    client.initialize(load_model(MNIST_MLP).initial_values(1))
    return client


def gradients(value=None, seed=0):
    rng = np.random.default_rng(seed)
    grads = {v.name: rng.standard_normal(v.shape).astype(np.float32) * 0.01 for v in model_variables(MNIST_MLP)}
    if value is not None:
        grads["hidden/weights"][3, 7] = value
    return grads


def test_a_ps_skips_nan_and_inf_pushes_counts_them_and_stays_finite(processes):
    client = ps_client(processes)
    try:
        for step, bad in enumerate([None, np.nan, None, np.inf, -np.inf, None]):
            client.push(gradients(bad, seed=step))
        params = client.pull()
        assert all(np.isfinite(v).all() for v in params.values())
        stats = client.stats()[0]
        assert stats["version"] == 3 and stats["dropped"] == {"nonfinite": 3}
    finally:
        client.close()


def test_with_nonfinite_refuse_the_push_fails_naming_the_variable(processes):
    client = ps_client(processes, "--nonfinite", "refuse")
    try:
        with pytest.raises(InvalidArgumentError, match="gradient of 'hidden/weights' holds NaN or Inf: refused"):
            client.push(gradients(np.nan))
        client.push(gradients())
        assert client.stats()[0]["version"] == 1 and all(np.isfinite(v).all() for v in client.pull().values())
    finally:
        client.close()
