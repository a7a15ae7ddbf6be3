"""In-graph replication: N towers over slices of a batch give the loss and gradients of the whole
batch, on CPU threads, on stub GPUs, and on real GPUs when there are some."""

import logging
import threading

import numpy as np
import pytest

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.spec import MNIST_MLP
from zmqflow.models.registry import load_model
from zmqflow.services.worker import devices as D
from zmqflow.models.kernels import gpu_count
from zmqflow.services.worker.towers import TowerModel, split_sizes, tower_devices
from tests.worker import fake_gpu_options
from tests.model.test_kernels import batch, random_params
from tests.worker.test_devices import assert_same_as_mlp, spec

pytestmark = pytest.mark.unit


def test_tower_devices_one_per_gpu_round_robin_or_cpu_threads():
    assert tower_devices(3, 0) == ["/cpu:0"] * 3
    assert tower_devices(2, 4) == ["/gpu:0", "/gpu:1"]
    assert tower_devices(3, 2) == ["/gpu:0", "/gpu:1", "/gpu:0"]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidArgumentError, match="towers"):
            tower_devices(bad, 0)


def test_split_sizes_are_contiguous_and_uneven_like_array_split():
    assert split_sizes(100, 3) == [34, 33, 33] == [len(p) for p in np.array_split(np.arange(100), 3)]
    assert split_sizes(7, 7) == [1] * 7


@pytest.mark.parametrize("towers", [1, 2, 3])
@pytest.mark.parametrize("n", [100, 10, 2])
def test_towers_equal_the_plain_model_on_the_whole_batch(towers, n):
    model = TowerModel(lambda device: load_model(MNIST_MLP, backend="numba"), tower_devices(towers, num_gpus=0))
    assert model.devices == ["/cpu:0"] * towers and len({id(t) for t in model.towers}) == towers
    assert_same_as_mlp(model, MNIST_MLP, n=n)
    model.close()


def test_towers_run_on_threads_and_get_contiguous_slices():
    seen, lock = [], threading.Lock()

    class Recording:
        def __init__(self, device):
            self.mlp = load_model(MNIST_MLP)

        def step(self, params, batch):
            x, _ = batch
            with lock:
                seen.append((threading.current_thread().name, x[0, 0], len(x)))
            return self.mlp.step(params, batch)

    model = TowerModel(Recording, ["/cpu:0"] * 3)
    x, y = batch(10)
    model.step(random_params(model.towers[0].mlp), (x, y))
    assert sorted((first, size) for _, first, size in seen) == sorted([(x[0, 0], 4), (x[4, 0], 3), (x[7, 0], 3)])
    assert all(name.startswith("tower") for name, _, _ in seen)
    model.close()


def test_a_towers_error_reaches_the_caller():
    model = TowerModel(lambda device: load_model(MNIST_MLP), ["/cpu:0", "/cpu:0"])
    x, y = batch(6)
    with pytest.raises(InvalidArgumentError, match="outside the valid range"):
        model.step(random_params(model.towers[0]), (x, np.array([0, 1, 2, 3, 4, 10])))
    with pytest.raises(InvalidArgumentError, match="holds no examples"):
        model.step(random_params(model.towers[0]), (x[:0], y[:0]))


def test_build_model_with_towers_on_two_stub_gpus(caplog):
    with caplog.at_level(logging.INFO, logger="devices"):
        model = D.build_model(MNIST_MLP, towers=2, log_device_placement=True, **fake_gpu_options(2))
    assert model.devices == ["/gpu:0", "/gpu:1"]
    assert [t.devices["hidden"][-5:] for t in model.towers] == ["GPU:0", "GPU:1"]
    assert "tower_1/hidden/MatMul: (MatMul): /job:worker/replica:0/task:0/device:GPU:1" in caplog.text
    assert_same_as_mlp(model, MNIST_MLP)


def test_build_model_with_towers_and_an_explicit_device_or_mixed_layers():
    model = D.build_model(MNIST_MLP, towers=3, device="/cpu:0", **fake_gpu_options(2))
    assert [t.devices["softmax"][-5:] for t in model.towers] == ["CPU:0"] * 3
    model = D.build_model(spec("relu"), towers=2, **fake_gpu_options(
        2, placement_function=lambda op: "/cpu:0" if op.name == "softmax" else None))
    assert [list(t.devices.values()) for t in model.towers] == [
        ["/job:worker/replica:0/task:0/device:GPU:0", "/job:worker/replica:0/task:0/device:CPU:0"],
        ["/job:worker/replica:0/task:0/device:GPU:1", "/job:worker/replica:0/task:0/device:CPU:0"]]
    assert_same_as_mlp(model, spec("relu"), n=31)


@pytest.mark.gpu
def test_real_gpu_towers_equal_the_plain_model():
    pytest.importorskip("cupy")
    if gpu_count() == 0:
        pytest.skip("no CUDA device")
    model = D.build_model(MNIST_MLP, towers=max(2, gpu_count()))
    assert all(d.startswith("/gpu:") for d in model.devices)
    assert_same_as_mlp(model, MNIST_MLP, n=100)
