"""Worker device placement: listing, defaults, explicit devices, placement functions, soft
placement and its errors, logging, the GPU memory fraction, and placed models whose numbers
equal the unplaced MLP's (mixed CPU/GPU placements run on the stub GPU of tests/worker)."""

import json
import logging
import os
import subprocess
import sys
import types

import numpy as np
import pytest
from click.testing import CliRunner

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.spec import MNIST_MLP
from zmqflow.models.registry import load_model
from zmqflow.cli.main import main
from zmqflow.services.worker import devices as D
from zmqflow.models.kernels import gpu_count
from tests.model.test_kernels import batch, random_params
from tests.worker import FakeStagingGpuKernels, fake_gpu_options

pytestmark = pytest.mark.unit

CPU0 = "/job:worker/replica:0/task:0/device:CPU:0"
GPU0 = "/job:worker/replica:0/task:0/device:GPU:0"


def spec(activation="sigmoid", layers=(784, 100, 10), dtype="float32"):
    return {"type": "mlp", "layers": list(layers), "activation": activation,
            "init": {"kind": "truncated_normal", "stddev": 0.1}, "seed": 1, "dtype": dtype}


def assert_same_as_mlp(model, model_spec, n=50, tol=dict(rtol=2e-4, atol=2e-6)):
    reference = load_model(model_spec, backend="numpy")
    params = random_params(reference)
    x, y = batch(n, model_spec["layers"][0], model_spec["layers"][-1], seed=n)
    want_loss, want, _ = reference.step(params, (x, y))
    for _ in range(2):
        loss, grads, _ = model.step(params, (x, y))
        np.testing.assert_allclose(loss, want_loss, **tol)
        assert list(grads) == list(want)
        for name in want:
            assert type(grads[name]) is np.ndarray and grads[name].dtype == want[name].dtype, name
            np.testing.assert_allclose(grads[name], want[name], err_msg=name, **tol)
    probs = model.predict(params, x)
    assert type(probs) is np.ndarray
    np.testing.assert_allclose(probs, reference.predict(params, x), **tol)


def placed(model_spec=MNIST_MLP, **fields):
    return D.place_model(model_spec, D.DeviceOptions(**fields))


# ------------------------------------------------------------------ listing and defaults

def test_list_devices_reports_the_cpu_with_memory_and_cores():
    found = D.list_devices()
    cpu = found[0]
    assert cpu["name"] == "/cpu:0" and cpu["device_type"] == "CPU"
    assert cpu["memory_total"] >= cpu["memory_free"] > 0 and cpu["cores"] >= 1
    assert len([d for d in found if d["device_type"] == "GPU"]) == D.visible_gpu_count()


@pytest.mark.parametrize("value", ["", "-1"])
def test_cuda_visible_devices_empty_or_minus_one_hides_every_gpu(monkeypatch, value):
    monkeypatch.setattr(D, "gpu_count", lambda: 2)
    assert D.visible_gpu_count() == 2 and D.default_device() == "/gpu:0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert D.visible_gpu_count() == 0 and D.default_device() == "/cpu:0"
    assert [d["name"] for d in D.list_devices()] == ["/cpu:0"]


def fake_cupy(limits):
    """Just what list_devices and set_gpu_memory_fraction call: two 16 GiB GPUs."""
    class Device:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            limits["current"] = self.index

        def __exit__(self, *exc):
            limits["current"] = None

    class Pool:
        def set_limit(self, fraction):
            limits[limits["current"]] = fraction

    runtime = types.SimpleNamespace(
        getDeviceProperties=lambda i: {"name": b"Fake GPU", "major": 9, "minor": 0, "multiProcessorCount": 132},
        memGetInfo=lambda: (15 << 30, 16 << 30))
    return types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime, Device=Device),
                                 get_default_memory_pool=Pool)


def test_gpus_are_listed_with_memory_and_limited_by_the_memory_fraction(monkeypatch):
    limits = {"current": None}
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(limits))
    monkeypatch.setattr(D, "gpu_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = [d for d in D.list_devices() if d["device_type"] == "GPU"]
    assert [(g["name"], g["memory_total"], g["memory_free"]) for g in gpus] == [
        ("/gpu:0", 16 << 30, 15 << 30), ("/gpu:1", 16 << 30, 15 << 30)]
    assert gpus[0]["description"] == "Fake GPU" and gpus[0]["compute_capability"] == "9.0"
    assert D.set_gpu_memory_fraction(0.25) is True
    assert limits[0] == limits[1] == 0.25


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5, True, "half"])
def test_gpu_memory_fraction_must_be_in_0_1(fraction):
    with pytest.raises(InvalidArgumentError, match="gpu memory fraction"):
        D.set_gpu_memory_fraction(fraction)


def test_gpu_memory_fraction_without_a_gpu_is_a_logged_no_op(monkeypatch, caplog):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with caplog.at_level(logging.INFO, logger="devices"):
        assert D.set_gpu_memory_fraction(0.5) is False
    assert "no GPU is visible" in caplog.text


# ------------------------------------------------------------------ placement

def devices_of(model):
    return model.devices


def test_default_is_cpu_without_a_gpu_and_gpu0_with_one():
    assert devices_of(placed(num_gpus=0)) == {"hidden": CPU0, "softmax": CPU0}
    assert devices_of(placed(**fake_gpu_options())) == {"hidden": GPU0, "softmax": GPU0}


def test_partial_device_strings_fill_in_from_the_task_and_the_default():
    assert devices_of(placed(device="/cpu:0", **fake_gpu_options()))["hidden"] == CPU0
    assert devices_of(placed(device="/device:GPU", **fake_gpu_options()))["hidden"] == GPU0
    assert devices_of(placed(device="/job:worker/task:2", task=2, num_gpus=0))["hidden"] == \
        "/job:worker/replica:0/task:2/device:CPU:0"
    assert devices_of(placed(device="/job:worker/task:1/gpu:1", task=1, **fake_gpu_options(2)))["softmax"] == \
        "/job:worker/replica:0/task:1/device:GPU:1"


@pytest.mark.parametrize("device, named", [("/job:worker/task:1/gpu:0", "task 1"), ("/job:ps/cpu:0", "job 'ps'"),
                                           ("/replica:2/cpu:0", "replica 2")])
def test_another_tasks_device_is_invalid_argument_naming_it(device, named):
    with pytest.raises(InvalidArgumentError, match=named) as info:
        placed(device=device, allow_soft_placement=True, num_gpus=0)
    assert "hidden" in str(info.value) and "/job:worker/replica:0/task:0" in str(info.value)


def test_bad_device_string_is_invalid_argument():
    with pytest.raises(InvalidArgumentError, match="tpu:0"):
        placed(device="/tpu:0", num_gpus=0)


def test_gpu_without_a_gpu_is_invalid_argument_naming_layer_op_dtype_and_device():
    with pytest.raises(InvalidArgumentError) as info:
        placed(device="/gpu:0", num_gpus=0)
    message = str(info.value)
    assert message.startswith("Cannot assign a device for operation hidden/MatMul: Could not satisfy explicit")
    assert "'hidden'" in message and "float32" in message and "device:GPU:0" in message


def test_gpu_index_beyond_the_visible_gpus_and_cpu_1_are_invalid_argument():
    with pytest.raises(InvalidArgumentError, match="GPU:1"):
        placed(device="/gpu:1", **fake_gpu_options(1))
    with pytest.raises(InvalidArgumentError, match="CPU:1"):
        placed(device="/cpu:1", num_gpus=0)


def test_dtype_without_a_gpu_kernel_is_invalid_argument_in_tf_words():
    with pytest.raises(InvalidArgumentError) as info:
        placed(spec(dtype="float64"), device="/gpu:0", **fake_gpu_options())
    message = str(info.value)
    assert "Cannot assign a device for operation hidden/MatMul" in message
    assert "no supported kernel for GPU devices is available" in message
    assert "float64" in message and "device:GPU:0" in message and "--allow-soft-placement" in message


def test_soft_placement_falls_back_to_the_cpu(caplog):
    with caplog.at_level(logging.INFO, logger="devices"):
        model = placed(spec(dtype="float64"), device="/gpu:0", allow_soft_placement=True, **fake_gpu_options())
    assert devices_of(model) == {"hidden": CPU0, "softmax": CPU0}
    assert all(p.soft for p in model.placements) and "soft placement" in caplog.text
    assert devices_of(placed(device="/gpu:0", allow_soft_placement=True, num_gpus=0))["hidden"] == CPU0
    assert_same_as_mlp(model, spec(dtype="float64"), tol=dict(rtol=1e-10, atol=1e-12))


def test_default_device_without_a_kernel_goes_to_the_cpu_silently():
    assert devices_of(placed(spec(dtype="float64"), **fake_gpu_options())) == {"hidden": CPU0, "softmax": CPU0}


def test_kernel_registry():
    assert D.has_kernel("GPU", "float32") and D.has_kernel("GPU", "float16")
    assert not D.has_kernel("GPU", "float64") and not D.has_kernel("GPU", "bfloat16")
    assert D.has_kernel("CPU", "float64")


SEEN = []


def softmax_on_cpu(op):
    """A placement function as tf.device(fn) takes: the head on the CPU, the rest left as it is."""
    SEEN.append((op.name, op.type, op.ops, op.dtype, op.shape, op.device))
    return "/cpu:0" if op.name == "softmax" else None


def test_placement_function_by_module_name_is_called_per_layer():
    SEEN.clear()
    model = placed(placement_function=f"{__name__}:softmax_on_cpu", device="/gpu:0", **fake_gpu_options())
    assert devices_of(model) == {"hidden": GPU0, "softmax": CPU0}
    assert SEEN == [("hidden", "MatMul", ("MatMul", "BiasAdd", "Sigmoid"), "float32", (784, 100), ""),
                    ("softmax", "MatMul", ("MatMul", "BiasAdd", "SparseSoftmaxCrossEntropyWithLogits", "Softmax"),
                     "float32", (100, 10), "")]  # innermost scope: the function speaks first, --device fills in


def test_placement_function_returning_a_devicespec_and_bad_names():
    from zmqflow.common.cluster.device import DeviceSpec
    model = placed(placement_function=lambda op: DeviceSpec(device_type="GPU", device_index=0), **fake_gpu_options())
    assert devices_of(model)["hidden"] == GPU0
    with pytest.raises(InvalidArgumentError, match="cannot be loaded"):
        placed(placement_function="no_such_module_xyz:fn", num_gpus=0)
    with pytest.raises(InvalidArgumentError, match="not a callable"):
        placed(placement_function=f"{__name__}:SEEN", num_gpus=0)


def test_log_device_placement_in_tf_format(caplog):
    with caplog.at_level(logging.INFO, logger="devices"):
        placed(placement_function=softmax_on_cpu, log_device_placement=True, **fake_gpu_options())
    assert f"hidden/MatMul: (MatMul): {GPU0}" in caplog.text
    assert f"hidden/Sigmoid: (Sigmoid): {GPU0}" in caplog.text
    assert f"softmax/SparseSoftmaxCrossEntropyWithLogits: (SparseSoftmaxCrossEntropyWithLogits): {CPU0}" \
        in caplog.text


# ------------------------------------------------------------------ placed models compute as the MLP

@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_one_device_computes_on_the_cpu_backend(backend):
    model = placed(cpu_backend=backend, num_gpus=0)
    assert model.kernels.name == backend and set(devices_of(model).values()) == {CPU0}
    assert_same_as_mlp(model, MNIST_MLP)


@pytest.mark.parametrize("activation", ["sigmoid", "relu", "tanh", "none"])
def test_mixed_gpu_cpu_placement_equals_the_mlp(activation):
    options = fake_gpu_options(placement_function=softmax_on_cpu, cpu_backend="numba")
    model = D.place_model(spec(activation), D.DeviceOptions(**options))
    assert devices_of(model) == {"hidden": GPU0, "softmax": CPU0}
    assert_same_as_mlp(model, spec(activation))
    gpu = options["gpu_kernels"].made[0]
    assert gpu.to_device_calls > 0 and gpu.to_host_calls > 0


def test_three_layers_alternating_over_two_gpus_and_the_cpu():
    layout = {"hidden1": "/gpu:1", "hidden2": "/cpu:0", "softmax": "/gpu:0"}
    model_spec = spec("tanh", layers=(20, 16, 12, 5))
    model = D.place_model(model_spec, D.DeviceOptions(
        placement_function=lambda op: layout[op.name], **fake_gpu_options(2)))
    assert [d[-5:] for d in devices_of(model).values()] == ["GPU:1", "CPU:0", "GPU:0"]
    assert_same_as_mlp(model, model_spec, n=7)
    model = D.place_model(model_spec, D.DeviceOptions(
        placement_function=lambda op: "/gpu:1" if op.name == "softmax" else "/gpu:0", **fake_gpu_options(2)))
    assert_same_as_mlp(model, model_spec, n=7)  # GPU to GPU goes through the host


def test_mixed_placement_checks_its_inputs():
    model = placed(placement_function=softmax_on_cpu, **fake_gpu_options())
    params = random_params(model)
    x, y = batch(8)
    with pytest.raises(InvalidArgumentError, match="outside the valid range"):
        model.step(params, (x, np.full(8, 10)))
    with pytest.raises(InvalidArgumentError, match="missing"):
        model.step({}, (x, y))
    with pytest.raises(InvalidArgumentError, match=r"per-example shape \[5\], the model expects \[784\]"):
        model.step(params, (x[:, :5], y))


def test_build_model_flags():
    model = D.build_model(MNIST_MLP, backend="numpy", device="/cpu:0")
    assert devices_of(model) == {"hidden": CPU0, "softmax": CPU0} and model.kernels.name == "numpy"
    with pytest.raises(InvalidArgumentError, match="GPU:0"):  # --backend cupy asks for /gpu:0
        D.build_model(MNIST_MLP, backend="cupy", num_gpus=0)
    assert devices_of(D.build_model(MNIST_MLP, backend="cupy", **fake_gpu_options()))["hidden"] == GPU0
    with pytest.raises(InvalidArgumentError, match="gpu memory fraction"):
        D.build_model(MNIST_MLP, gpu_memory_fraction=2.0)


class UserModel:
    """A `module:Class` model: it computes where it chooses."""

    def __init__(self, spec):
        self.mlp = load_model(MNIST_MLP)

    def variables(self):
        return self.mlp.variables()

    def initial_values(self, seed=None):
        return self.mlp.initial_values(seed)

    def step(self, params, batch):
        return self.mlp.step(params, batch)

    def predict(self, params, x):
        return self.mlp.predict(params, x)


def test_user_models_place_themselves():
    model = D.place_model({"type": f"{__name__}:UserModel"}, D.DeviceOptions(device="/gpu:0"))
    assert type(model) is UserModel


# ------------------------------------------------------------------ command lines

def test_zmqflow_devices_lists_the_cpu():
    result = CliRunner().invoke(main, ["devices"])
    assert result.exit_code == 0, result.output
    assert "/cpu:0" in result.output and "GiB" in result.output and "default device:" in result.output
    listed = json.loads(CliRunner().invoke(main, ["devices", "--json"]).output)
    assert listed["devices"][0]["name"] == "/cpu:0" and listed["default_device"] == D.default_device()


def test_worker_help_lists_the_device_flags():
    result = CliRunner().invoke(main, ["worker", "--help"])
    assert result.exit_code == 0
    for flag in ("--device", "--placement-function", "--allow-soft-placement", "--log-device-placement",
                 "--gpu-memory-fraction", "--towers"):
        assert flag in result.output


@pytest.mark.service
def test_worker_rejects_another_tasks_device_before_connecting():
    out = subprocess.run([sys.executable, "-m", "zmqflow.services.worker", "--ps", "tcp://127.0.0.1:9", "--broker",
                          "tcp://127.0.0.1:9", "--device", "/job:worker/task:3/cpu:0"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "TF_CONFIG": ""})
    assert out.returncode == 2 and "InvalidArgumentError" in out.stderr and "task 3" in out.stderr


# ------------------------------------------------------------------ pinned staging (cupy_kernels.PinnedStaging)

def _staged_and_pageable(model_spec, build):
    """Two placed copies of a model: one moving its variables and gradients through pinned staging, one not."""
    pinned, pageable = build(model_spec), build(model_spec)
    pageable.stage_through_pinned = False
    return pinned, pageable


def _steps_agree(pinned, pageable, steps, tol=None):
    """`steps` steps of both on one batch, each with other parameters, every step's gradients kept (as a push
    in flight keeps them): the same answers, and the kept gradients still as they came out at the end (a
    staging buffer written again while a view of it is held would change them). `tol`: see _close."""
    x, y = batch(32, 784, 10, seed=3)
    kept = []
    for k in range(steps):
        params = pinned.initial_values(seed=k + 1)
        loss, grads, _ = pinned.step(params, (x, y))
        want_loss, want, _ = pageable.step(params, (x, y))
        assert set(grads) == set(want)
        assert loss == (want_loss if tol is None else pytest.approx(want_loss, rel=1e-4))
        for name, g in want.items():
            assert type(grads[name]) is np.ndarray and grads[name].dtype == g.dtype and grads[name].shape == g.shape
            _close(grads[name], g, tol, f"step {k}: {name}")
        kept.append((grads, {name: np.array(g) for name, g in want.items()}))
    for k, (grads, want) in enumerate(kept):
        for name, g in want.items():
            _close(grads[name], g, tol, f"the kept gradients of step {k}: {name}")


def _close(actual, want, tol, what):
    """Equal (tol None), or within `tol` but for at most 0.5% of the elements: on a GPU the two paths' arrays
    sit at other addresses, and a library may sum in another order there, which can flip a ReLU or a max
    pool's pick on a pre-activation within rounding of a tie. A wrong offset, a missed wait or a buffer
    written too early changes nearly every element (each step has other parameters)."""
    if tol is None:
        np.testing.assert_array_equal(actual, want, err_msg=what)
        return
    off = ~np.isclose(actual, want, **tol)
    assert off.mean() <= 0.005, (f"{what}: {int(off.sum())} of {off.size} elements differ, e.g. "
                                 f"{actual[off][:5]} vs {want[off][:5]}")


def _fake_staging_build(placement_function=None):
    made = []

    def gpu(index):
        made.append(FakeStagingGpuKernels(index))
        return made[-1]
    return lambda model_spec: D.place_model(model_spec, D.DeviceOptions(
        placement_function=placement_function, num_gpus=1, gpu_kernels=gpu))


def test_pinned_staging_gives_the_pageable_answers_and_leaves_held_gradients_alone():
    pinned, pageable = _staged_and_pageable(MNIST_MLP, _fake_staging_build())
    staging = pinned._staged()
    assert staging is not None and [v.name for v in staging.variables] == [v.name for v in pinned.variables()]
    _steps_agree(pinned, pageable, steps=5)
    # steps 1-3 each took a buffer of their own (the earlier ones were held), steps 4-5 found all three held and
    # copied the old way; the variables went in by one copy of the whole buffer a step
    assert len(staging.gradients._out) == staging.gradients.OUT_BUFFERS == 3
    gpu = pinned._placed["hidden"]
    h2d = [size for kind, size in gpu.xp.copies if kind == 1]
    assert h2d == [staging.variables_in.total * 4] * 5
    assert pageable._staged() is not None and pageable._placed["hidden"].xp.copies == []


def test_pinned_staging_reuses_a_gradient_buffer_once_its_views_are_gone():
    pinned, pageable = _staged_and_pageable(MNIST_MLP, _fake_staging_build())
    x, y = batch(16, 784, 10, seed=4)
    params = pinned.initial_values()
    _, first, _ = pinned.step(params, (x, y))
    held = first["hidden/weights"][:3].copy()
    out = pinned._staged().gradients
    del first
    for _ in range(4):
        loss, grads, _ = pinned.step(params, (x, y))
        del grads
    assert len(out._out) == 1           # the one buffer, written again each step: nothing held it
    _, grads, _ = pinned.step(params, (x, y))
    keep_one = grads["softmax/biases"]  # one view is enough to hold the whole buffer
    del grads
    _, again, _ = pinned.step(params, (x, y))
    assert len(out._out) == 2 and not np.shares_memory(keep_one, again["softmax/biases"])
    np.testing.assert_array_equal(again["hidden/weights"][:3], held)
    np.testing.assert_array_equal(keep_one, again["softmax/biases"])


def test_pinned_staging_of_a_mixed_placement_stages_the_gpu_layers_only():
    pinned, pageable = _staged_and_pageable(MNIST_MLP, _fake_staging_build(softmax_on_cpu))
    assert [v.name for v in pinned._staged().variables] == ["hidden/weights", "hidden/biases"]
    _steps_agree(pinned, pageable, steps=4)


def test_pinned_staging_lays_out_each_array_aligned():
    from zmqflow.models.kernels.cupy_kernels import _layout
    layout, total = _layout([(3, 5), (), (0,), (64,), (2, 2)], np.dtype(np.float32).itemsize)
    assert layout == [(0, 15, (3, 5)), (64, 1, ()), (128, 0, (0,)), (128, 64, (64,)), (192, 4, (2, 2))]
    assert total == 256


# ------------------------------------------------------------------ on a real GPU

@pytest.fixture
def real_gpu():
    pytest.importorskip("cupy")
    if gpu_count() == 0:
        pytest.skip("no CUDA device")


@pytest.mark.gpu
def test_real_gpu_mixed_placement_equals_the_mlp(real_gpu):
    model = D.place_model(MNIST_MLP, D.DeviceOptions(placement_function=softmax_on_cpu))
    assert devices_of(model) == {"hidden": GPU0, "softmax": CPU0}
    assert_same_as_mlp(model, MNIST_MLP)
    assert_same_as_mlp(D.place_model(MNIST_MLP, D.DeviceOptions(device="/gpu:0")), MNIST_MLP)


@pytest.mark.gpu
def test_real_gpu_listing_and_memory_fraction(real_gpu):
    gpus = [d for d in D.list_devices() if d["device_type"] == "GPU"]
    assert len(gpus) == gpu_count() and gpus[0]["memory_total"] > 0
    assert D.set_gpu_memory_fraction(0.5) is True
    import cupy
    assert cupy.get_default_memory_pool().get_limit() > 0
    cupy.get_default_memory_pool().set_limit(size=0)  # no limit again, for the other tests


# --- layer models (models/layer_model.py) on devices --------------------------------------

def _cnn(device=None):
    from zmqflow.models.layer_model import LayerModel
    from zmqflow.models.layers import Conv2D, Dense, Flatten, MaxPool2D, Reshape
    from zmqflow.models.network import Sequential
    layers = [Reshape((28, 28, 1)), Conv2D(4, 5, padding="same", activation="relu", device=device), MaxPool2D(),
              Flatten(), Dense(10)]
    return LayerModel(Sequential(layers, input_shape=(784,)), seed=0)


def test_a_layer_on_a_gpu_that_does_not_exist_names_the_layer_or_runs_on_the_cpu_when_soft():
    with pytest.raises(InvalidArgumentError, match=r"operation conv2d/Conv2D: Could not satisfy explicit device "
                                                   r"specification '.*GPU:0' .*no GPU is visible.*--allow-soft-placement"):
        D.place_layer_model(_cnn("/gpu:0"), D.DeviceOptions(num_gpus=0))
    with pytest.raises(InvalidArgumentError, match=r"operation reshape/Reshape: .*'.*GPU:2' because no devices matching "
                                                   r"that specification are registered.*available devices: .*CPU:0, .*GPU:0 "):
        D.place_layer_model(_cnn(), D.DeviceOptions(device="/gpu:2", num_gpus=1))
    soft = D.place_layer_model(_cnn("/gpu:1"), D.DeviceOptions(num_gpus=0, allow_soft_placement=True))
    assert set(soft.devices.values()) == {CPU0}      # every layer on the CPU: it trains as before
    loss, grads, _ = soft.step(soft.initial_values(), (np.zeros((2, 784), np.float32), np.array([1, 2])))
    assert np.isfinite(loss) and set(grads) == {v.name for v in soft.variables()}


def test_the_layers_of_one_worker_use_one_gpu():
    with pytest.raises(InvalidArgumentError, match=r"the layers use GPUs \[0, 1\]: one worker runs a layer model on one"):
        D.place_layer_model(_cnn("/gpu:1"), D.DeviceOptions(num_gpus=2))


@pytest.mark.gpu
def test_a_layer_model_on_the_gpu_matches_the_cpu():
    pytest.importorskip("cupy", reason="CuPy is not installed (pip install 'zmqflow[gpu]')")
    if gpu_count() == 0:
        pytest.skip("no GPU is visible")
    cpu, gpu = _cnn(), D.place_layer_model(_cnn(), D.DeviceOptions())
    assert sorted(name for name, device in gpu.devices.items() if "GPU" in device) == [
        "conv2d", "dense", "flatten", "max_pooling2d", "reshape"]
    x, y = np.random.default_rng(0).standard_normal((8, 784)).astype(np.float32), np.arange(8)
    params = cpu.initial_values()
    want_loss, want, _ = cpu.step(params, (x, y))
    loss, grads, _ = gpu.step(params, (x, y))
    assert loss == pytest.approx(want_loss, rel=1e-4)
    for name, g in want.items():
        assert isinstance(grads[name], np.ndarray)
        np.testing.assert_allclose(grads[name], g, rtol=1e-3, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(gpu.predict(params, x), cpu.predict(params, x), rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("model_spec", [MNIST_MLP, {"type": "cnn"}], ids=["mlp", "cnn"])
def test_real_gpu_pinned_staging_gives_the_pageable_answers(real_gpu, model_spec):
    """The worker's GPU step through pinned buffers (one copy in, one wait out) against the same step with a
    pageable copy per array: the same gradients, step after step with new parameters, and the gradients of
    every step, all kept (as pushes in flight keep them; steps 4-5 find the three buffers held and copy the old
    way), unchanged at the end. A wrong offset, a missed wait or a buffer written again too early fails it."""
    pinned, pageable = _staged_and_pageable(model_spec, lambda s: D.build_model(s, device="/gpu:0"))
    staging = pinned._staged()
    assert staging is not None and len(staging.variables) == len(pinned.variables())
    _steps_agree(pinned, pageable, steps=5, tol=dict(rtol=1e-4, atol=1e-6))
    assert len(staging.gradients._out) == staging.gradients.OUT_BUFFERS
    import cupy
    assert all(isinstance(v, cupy.ndarray) for v in staging.variables_in.device_views)
