"""The PyTorch adapter: an nn.Module as a zmqflow model, checked against zmqflow's own layers and on the cluster."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from zmqflow.models.layer_model import LayerModel
from zmqflow.models.layers import Dense
from zmqflow.models.network import Sequential
from zmqflow.models.protocol import Model, input_signature

torch = pytest.importorskip("torch", reason="PyTorch is not installed (make test-torch installs it)")
from zmqflow.adapters.torch import TorchModel  # noqa: E402  (after the skip: PyTorch is optional)

pytestmark = [pytest.mark.unit, pytest.mark.torch]


def twins():
    """The same 4-5-3 tanh network as zmqflow layers and as a torch module, with the same weights."""
    ours = LayerModel(Sequential([Dense(5, activation="tanh"), Dense(3)], input_shape=(4,)), seed=2)
    values = ours.initial_values()
    net = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    with torch.no_grad():
        net[0].weight.copy_(torch.from_numpy(values["dense/kernel"].T.copy()))
        net[0].bias.copy_(torch.from_numpy(values["dense/bias"]))
        net[2].weight.copy_(torch.from_numpy(values["dense_1/kernel"].T.copy()))
        net[2].bias.copy_(torch.from_numpy(values["dense_1/bias"]))
    return ours, values, TorchModel(net, input_shape=(4,))


def test_the_output_width_comes_from_the_module_not_its_last_buffer():
    """A BatchNorm's running statistics are the last variables of this net (128 wide): the width check before
    training asked them and refused the shipped examples/torch_model.py ("output is 128 wide")."""
    from zmqflow.models.protocol import output_width
    net = torch.nn.Sequential(torch.nn.Linear(6, 128), torch.nn.BatchNorm1d(128), torch.nn.ReLU(),
                              torch.nn.Linear(128, 10))
    model = TorchModel(net, input_shape=(6,))
    assert model.variables()[-1].shape == (128,) and output_width(model) == 10
    assert net.training   # asked in eval mode, given back as it was


def test_named_parameters_become_variables_and_match_zmqflows_layers():
    ours, values, theirs = twins()
    assert isinstance(theirs, Model)
    assert [v.name for v in theirs.variables()] == ["0/weight", "0/bias", "2/weight", "2/bias"]
    assert input_signature(theirs) == {"input": ((4,), "float32")}
    params = theirs.initial_values()
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((6, 4)).astype(np.float32), rng.integers(0, 3, 6)
    loss_ours, grads_ours, _ = ours.step(values, (x, y))
    loss_theirs, grads_theirs, metrics = theirs.step(params, (x, y))
    assert loss_ours == pytest.approx(loss_theirs, rel=1e-5) and metrics["loss"] == loss_theirs
    np.testing.assert_allclose(grads_theirs["0/weight"], grads_ours["dense/kernel"].T, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grads_theirs["2/bias"], grads_ours["dense_1/bias"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(theirs.predict(params, x), ours.predict(values, x), rtol=1e-5, atol=1e-6)


def test_batch_norm_buffers_are_non_trainable_variables_with_updates():
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4, momentum=0.5), torch.nn.Linear(4, 2))
    model = TorchModel(net, input_shape=(3,))
    flags = {v.name: v.trainable for v in model.variables()}
    assert flags["1/running_mean"] is False and flags["1/weight"] is True
    assert "1/num_batches_tracked" not in flags            # an integer counter stays local
    params = model.initial_values()
    _, grads, metrics = model.step(params, (np.random.default_rng(0).standard_normal((8, 3)), [0, 1] * 4))
    assert "1/running_mean" not in grads and set(metrics["updates"]) == {"1/running_mean", "1/running_var"}
    assert np.abs(metrics["updates"]["1/running_mean"]).max() > 0
    with pytest.raises(Exception, match="parameter '0/weight' has shape"):
        model.predict({**params, "0/weight": np.zeros((2, 2), np.float32)}, np.zeros((1, 3)))


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCH_MODEL = os.path.join(ROOT, "examples", "torch_model.py")   # the example a user runs


@pytest.mark.integration
def test_a_torch_module_trains_and_serves_on_the_cluster(tmp_path, processes):
    from zmqflow.common.clients.serve import ModelClient
    from zmqflow.inputs.datasets import mnist_split
    done = subprocess.run([sys.executable, "-m", "zmqflow", "train", "--json", "--model", f"{TORCH_MODEL}:build",
                           "--epochs", "3", "--checkpoint-dir", str(tmp_path / "ckpt")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["worker_exit_codes"] == [0, 0] and summary["test_accuracy"] > 0.75, summary
    server = processes.service("zmqflow.services.serve", ["--checkpoint", str(tmp_path / "ckpt"), "--backend", "numpy",
                                                          "--model", f"{TORCH_MODEL}:build"])   # its code: named here
    _, (x, y) = mnist_split()
    with ModelClient(server.endpoint) as client:
        probabilities, _ = client.predict(x[:200])
    assert np.mean(np.argmax(probabilities, axis=1) == y[:200]) > 0.75


@pytest.mark.integration
def test_the_torch_example_runs():
    done = subprocess.run([sys.executable, TORCH_MODEL], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "torch_model: test accuracy" in done.stdout, done.stdout + done.stderr[-3000:]
