"""Where a worker's layers run: the devices it has, per-layer placement as `tf.device` does it,
soft placement, and a model that runs each layer on the kernels of its device.

Placement of one layer, as TensorFlow 1.x places an op:
- scopes, outermost first: a tower's device (towers.py), `--device` (a DeviceSpec string,
  partial allowed), then the `--placement-function module:function`, called per layer with a
  `LayerOp` (.name, .type, .ops, .dtype, .shape; .device is "" as nothing is inside it) and
  returning a device string, DeviceSpec or None; zmqflow.common.device merges them as tf.device nests:
  the function speaks first and each outer scope fills in the fields still unset;
- unset fields come from the default device: /gpu:0 when a GPU is visible, else /cpu:0;
- a job, replica or task in the result must be this task's (a worker computes only its own layers);
- the device must exist and have a kernel for every op of the layer at the model's dtype
  (`KERNELS`). If not: with soft placement, or when no device type was asked for, the layer
  runs on /cpu:0; else InvalidArgumentError in TensorFlow's words, naming layer, op, dtype, device.

CUDA_VISIBLE_DEVICES: CuPy (the CUDA runtime) sees only the listed GPUs, renumbered from 0, so
"/gpu:0" is the first one listed. "" or "-1" hide every GPU; that is checked before importing
CuPy, so a CPU-only worker never initialises CUDA.
"""

import contextlib
import dataclasses
import importlib
import logging
import os

import numpy as np

from zmqflow.common.device import DeviceSpec, DeviceStack
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.spec import layer_names, mlp_initial_values, mlp_variables, validate_spec
from zmqflow.models.registry import load_model
from zmqflow.models.kernels import get_backend, gpu_count
from zmqflow.models.kernels.numpy_kernels import check_labels
from zmqflow.models.mlp import MLP
from zmqflow.models.protocol import checked_param

log = logging.getLogger("devices")

# Which dtypes each device type has kernels for, per op. The CuPy kernels are built and tested
# for float32 (float16 also compiles); float64 and bfloat16 get no GPU kernel here, as many of
# TensorFlow's GPU kernels had no DT_DOUBLE. The CPU kernels (numba, numpy) take the model dtypes.
LAYER_OPS = ("MatMul", "BiasAdd", "Sigmoid", "Relu", "Tanh", "Softmax", "SparseSoftmaxCrossEntropyWithLogits")
KERNELS = {
    "CPU": {op: frozenset({"float32", "float64"}) for op in LAYER_OPS},
    "GPU": {op: frozenset({"float32", "float16"}) for op in LAYER_OPS},
}
ACTIVATION_OPS = {"sigmoid": ("Sigmoid",), "relu": ("Relu",), "tanh": ("Tanh",), "none": ()}
HEAD_OPS = ("MatMul", "BiasAdd", "SparseSoftmaxCrossEntropyWithLogits", "Softmax")


def has_kernel(device_type, op, dtype):
    return str(dtype) in KERNELS.get(device_type, {}).get(op, ())


# ------------------------------------------------------------------ the machine's devices

def visible_gpu_count():
    """GPUs CuPy sees after CUDA_VISIBLE_DEVICES; 0 without CuPy, a driver, or when it is "" or "-1"."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return 0
    return gpu_count()


def default_device():
    """TensorFlow's default: the first GPU if there is one, else the CPU."""
    return "/gpu:0" if visible_gpu_count() else "/cpu:0"


def _meminfo():
    """(total, available) RAM in bytes from /proc/meminfo, else sysconf (no psutil needed)."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return (int(fields["MemTotal"].split()[0]) * 1024,
                int(fields.get("MemAvailable", fields["MemFree"]).split()[0]) * 1024)
    except (OSError, KeyError, ValueError):
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page


def list_devices():
    """The CPU and each visible GPU as dicts: name, device_type, index, memory_total/free (bytes)..."""
    total, free = _meminfo()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    devices = [{"name": "/cpu:0", "device_type": "CPU", "index": 0, "memory_total": total, "memory_free": free,
                "cores": os.cpu_count(), "usable_cores": usable, "description": "host"}]
    count = visible_gpu_count()
    if count:
        import cupy
        for i in range(count):
            props = cupy.cuda.runtime.getDeviceProperties(i)
            with cupy.cuda.Device(i):
                gpu_free, gpu_total = cupy.cuda.runtime.memGetInfo()
            name = props["name"]
            devices.append({"name": f"/gpu:{i}", "device_type": "GPU", "index": i, "memory_total": int(gpu_total),
                            "memory_free": int(gpu_free), "cores": props.get("multiProcessorCount"),
                            "description": name.decode() if isinstance(name, bytes) else str(name),
                            "compute_capability": f"{props.get('major')}.{props.get('minor')}"})
    return devices


def set_gpu_memory_fraction(fraction):
    """Cap CuPy's memory pool on every visible GPU at `fraction` of its memory (TF's
    per_process_gpu_memory_fraction). Returns whether a GPU was limited; a no-op without one."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise InvalidArgumentError(f"gpu memory fraction must be in (0, 1], got {fraction!r}")
    count = visible_gpu_count()
    if not count:
        log.info("gpu memory fraction %g: no GPU is visible, nothing to limit", fraction)
        return False
    import cupy
    for i in range(count):
        with cupy.cuda.Device(i):
            cupy.get_default_memory_pool().set_limit(fraction=fraction)
    log.info("CuPy memory pool limited to %g of each of %d GPUs", fraction, count)
    return True


# ------------------------------------------------------------------ placement

@dataclasses.dataclass(frozen=True)
class LayerOp:
    """What a placement function sees for one layer, like a tf.Operation: `type` is the layer's
    first op ("MatMul"), `ops` all of them, `shape` the weights' shape, `device` as inner scopes set it."""
    name: str
    type: str
    ops: tuple
    dtype: str
    shape: tuple
    device: str = ""


@dataclasses.dataclass(frozen=True)
class Placement:
    layer: LayerOp
    device: DeviceSpec  # full: /job:worker/replica:0/task:N/device:TYPE:I
    soft: bool = False  # fell back to the CPU (soft placement, or a default device without the kernel)

    def log_lines(self, prefix=""):
        """TF's log_device_placement lines: "hidden/MatMul: (MatMul): /job:.../device:GPU:0"."""
        return [f"{prefix}{self.layer.name}/{op}: ({op}): {self.device}" for op in self.layer.ops]


@dataclasses.dataclass
class DeviceOptions:
    """The worker's device flags. `num_gpus` and `gpu_kernels` (index -> Kernels) default to what
    CuPy offers; tests pass a stub GPU through them."""
    device: object = None
    placement_function: object = None
    allow_soft_placement: bool = False
    log_device_placement: bool = False
    job: str = "worker"
    task: int = 0
    cpu_backend: str = "numba"
    num_gpus: int = None
    gpu_kernels: object = None

    def gpus(self):
        return visible_gpu_count() if self.num_gpus is None else self.num_gpus


def mlp_layers(spec):
    """One LayerOp per dense layer of a validated MLP spec."""
    sizes, dtype = spec["layers"], spec["dtype"]
    names = layer_names(len(sizes) - 1)
    layers = []
    for i, (name, n_in, n_out) in enumerate(zip(names, sizes[:-1], sizes[1:])):
        ops = HEAD_OPS if i == len(names) - 1 else ("MatMul", "BiasAdd") + ACTIVATION_OPS[spec["activation"]]
        layers.append(LayerOp(name, "MatMul", ops, dtype, (n_in, n_out)))
    return layers


def load_placement_function(function):
    """A callable from "module:function" (or a callable, or None)."""
    if function is None or callable(function):
        return function
    module_name, _, name = str(function).partition(":")
    try:
        found = getattr(importlib.import_module(module_name), name) if module_name and name else None
    except (ImportError, AttributeError) as exc:
        raise InvalidArgumentError(f"placement function {function!r} cannot be loaded: {exc}") from None
    if not callable(found):
        raise InvalidArgumentError(f"placement function {function!r} is not a callable 'module:function'")
    return found


def place_layers(layers, options, outer=None, log_prefix=""):
    """A Placement per layer (see the module docstring); `outer` is an enclosing scope (a tower's)."""
    gpus = options.gpus()
    stack = DeviceStack()
    for scope in (outer, options.device, load_placement_function(options.placement_function)):
        if scope not in (None, ""):
            stack.push(scope)
    default = DeviceSpec.from_string("/gpu:0" if gpus else "/cpu:0")
    placements = []
    for layer in layers:
        requested = stack.resolve(layer)
        _check_task(layer, requested, options)
        wanted = default.make_merged_spec(requested)
        device = DeviceSpec(options.job, 0, options.task, wanted.device_type, wanted.device_index)
        why_not = _why_not(layer, device, gpus)
        soft = why_not is not None
        if soft and requested.device_type is not None and not options.allow_soft_placement:
            raise InvalidArgumentError(why_not)
        if soft:
            cpu = device.replace(device_type="CPU", device_index=0)
            if requested.device_type is not None:
                log.info("soft placement: %s runs on %s instead of %s", layer.name, cpu, device)
            device = cpu
        placements.append(Placement(layer, device, soft))
    if options.log_device_placement:
        for placement in placements:
            for line in placement.log_lines(log_prefix):
                log.info("%s", line)
    return placements


def _check_task(layer, requested, options):
    for field, mine in (("job", options.job), ("replica", 0), ("task", options.task)):
        value = getattr(requested, field)
        if value is not None and value != mine:
            raise InvalidArgumentError(
                f"layer {layer.name!r} is placed on {requested} ({field} {value!r}), but this process is "
                f"/job:{options.job}/replica:0/task:{options.task}: a worker computes only its own layers, "
                "so leave the job and task out of the device or name this task")


def _why_not(layer, device, gpus):
    """None if the layer can run on `device`, else TensorFlow's error for its first op that cannot."""
    op = f"{layer.name}/{layer.type}"
    what = f"(layer {layer.name!r}, op {layer.type}, dtype {layer.dtype}, device {device})"
    if device.device_index >= (gpus if device.device_type == "GPU" else 1):
        available = ", ".join([str(device.replace(device_type="CPU", device_index=0))]
                              + [str(device.replace(device_type="GPU", device_index=i)) for i in range(gpus)])
        hint = "" if gpus else "; no GPU is visible (CuPy missing, no CUDA device, or CUDA_VISIBLE_DEVICES hides them)"
        return (f"Cannot assign a device for operation {op}: Could not satisfy explicit device specification "
                f"'{device}' because no devices matching that specification are registered in this process; "
                f"available devices: {available} {what}{hint}. Pass --allow-soft-placement to run it on the CPU")
    for name in layer.ops:
        if not has_kernel(device.device_type, name, layer.dtype):
            supported = ", ".join(sorted(KERNELS.get(device.device_type, {}).get(name, ())))
            return (f"Cannot assign a device for operation {layer.name}/{name}: Could not satisfy explicit device "
                    f"specification '{device}' because no supported kernel for {device.device_type} devices is "
                    f"available (layer {layer.name!r}, op {name}, dtype {layer.dtype}, device {device}; "
                    f"{device.device_type} kernels of {name}: {supported}). Pass --allow-soft-placement to run it "
                    "on the CPU")
    return None


# ------------------------------------------------------------------ models on devices

@dataclasses.dataclass
class _Runtime:
    """One device: its kernels and how to make it current (CuPy: `cupy.cuda.Device(i)`)."""
    kernels: object
    is_gpu: bool
    enter: object = contextlib.nullcontext


def _runtime(device, options):
    if device.device_type == "CPU":
        return _Runtime(get_backend(options.cpu_backend), False)
    index = device.device_index
    if options.gpu_kernels is not None:
        kernels = options.gpu_kernels(index)
    else:
        import cupy
        with cupy.cuda.Device(index):
            kernels = get_backend("cupy")
    if getattr(kernels, "name", "") == "cupy":
        return _Runtime(kernels, True, lambda: kernels.xp.cuda.Device(index))
    return _Runtime(kernels, True)


def place_model(spec, options=None, outer=None, log_prefix=""):
    """The model of `spec` with its layers placed, a PlacedModel (which is the MLP on one device's
    kernels when every layer shares a device). User models (`module:Class`) place themselves."""
    options = options or DeviceOptions()
    spec = validate_spec(spec)
    if spec["type"] != "mlp":
        model = load_model(spec, backend=options.cpu_backend)
        if hasattr(model, "use_gpu"):
            tower = DeviceSpec.from_string(str(outer)) if outer else DeviceSpec()
            if tower.device_type == "GPU":
                raise InvalidArgumentError("towers on GPUs take the built-in MLP; a layer model runs on one GPU "
                                           "per worker (towers of it run on CPU threads)")
            return place_layer_model(model, options)
        log.info("model %s computes where it chooses: device flags apply to zmqflow's layers", spec["type"])
        return model
    return PlacedModel(spec, place_layers(mlp_layers(spec), options, outer, log_prefix), options)


def place_layer_model(model, options):
    """A layer model (models/layer_model.py) with its layers on devices: each layer's device string
    over --device over the default (/gpu:0 when a GPU is visible). The job and task of a device
    string say which worker runs the layer (a pipeline stage), the device type and index where.
    A GPU that does not exist is an error naming the layer, or with --allow-soft-placement the
    CPU. The layers of one worker use at most one GPU."""
    gpus = options.gpus()
    outer = DeviceSpec.from_string(options.device) if isinstance(options.device, str) else DeviceSpec()
    default = DeviceSpec.from_string("/gpu:0" if gpus else "/cpu:0").make_merged_spec(outer)
    on_gpu, indices = [], set()
    for layer in model.network.layers:
        requested = DeviceSpec.from_string(layer.device) if layer.device else DeviceSpec()
        device = default.make_merged_spec(requested)
        index = device.device_index or 0
        if device.device_type == "GPU" and index >= gpus:
            asked = requested.device_type is not None or outer.device_type is not None
            if asked and not options.allow_soft_placement:
                raise InvalidArgumentError(
                    f"layer {layer.name} is on {device}, which does not exist: this worker sees {gpus} GPU(s)"
                    f"{'' if gpus else ' (CuPy missing, no CUDA device, or CUDA_VISIBLE_DEVICES hides them)'}. "
                    "Pass --allow-soft-placement to run it on the CPU")
            device = device.replace(device_type="CPU", device_index=0)
        if device.device_type == "GPU":
            on_gpu.append(layer.name)
            indices.add(index)
        if options.log_device_placement:
            log.info("%s (%s): %s", layer.name, layer.kind, device)
    if len(indices) > 1:
        raise InvalidArgumentError(f"the layers use GPUs {sorted(indices)}: one worker runs a layer model on one GPU "
                                   "(--towers splits batches over several)")
    if on_gpu:
        import cupy
        cupy.cuda.Device(indices.pop()).use()
        model.use_gpu(on_gpu)
    return model


class PlacedModel:
    """The MLP (Model protocol) with each dense layer on its placement's device. On one device it
    is the MLP on that device's kernels. Across devices, activations move forward and gradients
    backward where consecutive layers differ, and each layer computes with its device's array
    module (numpy or CuPy) the numpy reference's arithmetic: the fused kernels span the whole
    network, and the copies between devices cost more than they would save there."""

    def __init__(self, spec, placements, options):
        self.spec, self.placements = validate_spec(spec), placements
        self.activation, self.dtype = self.spec["activation"], np.dtype(self.spec["dtype"])
        runtimes = {}
        for p in placements:
            if str(p.device) not in runtimes:
                runtimes[str(p.device)] = _runtime(p.device, options)
        self._layers = [runtimes[str(p.device)] for p in placements]
        self._variables = mlp_variables(self.spec)
        self._mlp = MLP(self.spec, backend=self._layers[0].kernels) if len(runtimes) == 1 else None

    @property
    def devices(self):
        """{layer name: device string}."""
        return {p.layer.name: str(p.device) for p in self.placements}

    def variables(self):
        return list(self._variables)

    def initial_values(self, seed=None):
        return mlp_initial_values(self.spec, seed)

    def loss_and_gradients(self, params, x, y, out=None):
        if self._mlp is not None:
            with self._layers[0].enter():
                return self._mlp.loss_and_gradients(params, x, y, out=out)
        weights, biases = self._params(params)
        x, y = self._check_batch(x, y)
        inputs, a = [], x
        for i, rt in enumerate(self._layers):  # forward: every layer's input on its own device
            a = self._move(a, self._layers[i - 1] if i else None, rt)
            inputs.append(a)
            if i < len(self._layers) - 1:
                with rt.enter():
                    a = _dense(rt.kernels.xp, a, weights[i], biases[i], self.activation)
        last = self._layers[-1]
        with last.enter():
            logits = _dense(last.kernels.xp, a, weights[-1], biases[-1], "none")
            loss, d = _softmax_xent(last.kernels.xp, logits, last.kernels.to_device(y, y.dtype))
        grads = {}
        for i in range(len(self._layers) - 1, -1, -1):  # backward, layer by layer, on each layer's device
            rt, w_name, b_name = self._layers[i], self._variables[2 * i].name, self._variables[2 * i + 1].name
            with rt.enter():
                xp = rt.kernels.xp
                grads[w_name], grads[b_name] = inputs[i].T @ d, d.sum(axis=0)
                if i:
                    d = (d @ weights[i].T) * _DERIVATIVE[self.activation](xp, inputs[i])
            if i:
                d = self._move(d, rt, self._layers[i - 1])
            for name in (w_name, b_name):
                grads[name] = self._to_host(grads[name], rt, None if out is None else out[name])
        return loss, {v.name: grads[v.name] for v in self._variables}

    def predict(self, params, x):
        if self._mlp is not None:
            with self._layers[0].enter():
                return self._mlp.predict(params, x)
        weights, biases = self._params(params)
        a, _ = self._check_batch(x, None)
        for i, rt in enumerate(self._layers):
            a = self._move(a, self._layers[i - 1] if i else None, rt)
            with rt.enter():
                a = _dense(rt.kernels.xp, a, weights[i], biases[i],
                           "none" if i == len(self._layers) - 1 else self.activation)
        last = self._layers[-1]
        with last.enter():
            xp = last.kernels.xp
            e = xp.exp(a - a.max(axis=1, keepdims=True))
            probs = e / e.sum(axis=1, keepdims=True)
        return self._to_host(probs, last, None)

    # -- checks and moves

    def _params(self, params):
        """[weights], [biases], each on its layer's device, after checking names and shapes."""
        weights, biases = [], []
        for i, var in enumerate(self._variables):
            value = checked_param(params, var)
            rt = self._layers[i // 2]
            with rt.enter():
                (biases if i % 2 else weights).append(rt.kernels.to_device(value, self.dtype))
        return weights, biases

    def _check_batch(self, x, y):
        n_in = self._variables[0].shape[0]
        if getattr(x, "ndim", None) != 2 or x.shape[1] != n_in or x.shape[0] == 0:
            raise InvalidArgumentError(f"inputs must have shape [batch >= 1, {n_in}], got {list(np.shape(x))}")
        x = np.ascontiguousarray(x, dtype=self.dtype) if isinstance(x, np.ndarray) else x
        if y is not None:
            y = np.asarray(y)
            if y.shape != (x.shape[0],) or y.dtype.kind not in "iu":
                raise InvalidArgumentError(
                    f"labels must be integers of shape [{x.shape[0]}], got {y.dtype} of shape {list(y.shape)}")
            check_labels(y, self._variables[-1].shape[0])
        return x, y

    def _move(self, array, src, dst):
        """`array` from runtime `src` (None: the host) onto `dst`; GPU to GPU goes through the host."""
        if src is dst:
            return array
        if src is not None and src.is_gpu:
            with src.enter():
                array = src.kernels.to_host(array)
        with dst.enter():
            return dst.kernels.to_device(array, array.dtype)

    def _to_host(self, array, rt, out):
        if rt.is_gpu:
            with rt.enter():
                array = rt.kernels.to_host(array)
        if out is not None:
            np.copyto(out, array)
            return out
        return array


def _dense(xp, a, w, b, activation):
    z = a @ w
    z += b
    return _ACTIVATION[activation](xp, z)


_ACTIVATION = {
    "sigmoid": lambda xp, z: 1 / (1 + xp.exp(-z)),
    "relu": lambda xp, z: xp.maximum(z, 0),
    "tanh": lambda xp, z: xp.tanh(z),
    "none": lambda xp, z: z,
}
_DERIVATIVE = {  # in terms of the output a = f(z)
    "sigmoid": lambda xp, a: a * (1 - a),
    "relu": lambda xp, a: (a > 0).astype(a.dtype),
    "tanh": lambda xp, a: 1 - a * a,
    "none": lambda xp, a: xp.ones_like(a),
}


def _softmax_xent(xp, logits, y):
    """Mean cross-entropy of labels `y` and its gradient with respect to the logits."""
    n = logits.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    e = xp.exp(shifted)
    total = e.sum(axis=1, keepdims=True)
    rows = xp.arange(n)
    loss = float(xp.mean(xp.log(total[:, 0]) - shifted[rows, y]))
    d = e / total
    d[rows, y] -= 1
    return loss, d / n


# ------------------------------------------------------------------ what the worker calls

def build_model(spec, *, backend="numba", device=None, placement_function=None, allow_soft_placement=False,
                log_device_placement=False, gpu_memory_fraction=None, towers=1, job="worker", task=0, **extra):
    """The worker's model from its flags: placed layers, in `towers` towers when more than one.
    `backend` picks the CPU kernels; 'cupy' (the old way to ask for the GPU) means --device /gpu:0."""
    if backend == "cupy":
        backend, device = "numba", device or "/gpu:0"
    options = DeviceOptions(device or None, placement_function or None, allow_soft_placement,
                            log_device_placement, job, task, backend, **extra)
    if gpu_memory_fraction is not None:
        set_gpu_memory_fraction(gpu_memory_fraction)
    if towers == 1:
        return place_model(spec, options)
    from zmqflow.services.worker.towers import TowerModel, tower_devices
    devices = tower_devices(towers, options.gpus())
    index = iter(range(towers))  # TowerModel builds its towers in order
    return TowerModel(lambda dev: place_model(spec, options, outer=dev, log_prefix=f"tower_{next(index)}/"), devices)
