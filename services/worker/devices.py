"""Where a worker's layers run: the devices it has, per-layer placement as `tf.device` does it,
and soft placement. Every model of zmqflow's layers (the built-in MLP among them) computes each
layer on the ops backend of its device (LayerModel.place); other models place themselves.

Placement of one layer, as TensorFlow 1.x places an op:
- scopes, outermost first: a tower's device (towers.py), `--device` (a DeviceSpec string,
  partial allowed), the `--placement-function module:function`, then the layer's own device
  (its type and index: a job and task there name a pipeline stage, models/stages.py). The
  function is called per layer with a `LayerOp` (.name, .type, .ops, .dtype, .shape, .device:
  the layer's own) and returns a device string, DeviceSpec or None; zmqflow.common.cluster.device merges
  them as tf.device nests: the innermost speaks first and each outer scope fills in the fields still unset;
- unset fields come from the default device: /gpu:0 when a GPU is visible, else /cpu:0;
- a job, replica or task in the result must be this task's (a worker computes only its own layers);
- the device must exist and have kernels at the model's dtype (`KERNELS`). If not: with soft
  placement, or when no device type was asked for, the layer runs on /cpu:0; else
  InvalidArgumentError in TensorFlow's words, naming layer, op, dtype, device.

CUDA_VISIBLE_DEVICES: CuPy (the CUDA runtime) sees only the listed GPUs, renumbered from 0, so
"/gpu:0" is the first one listed. "" or "-1" hide every GPU; that is checked before importing
CuPy, so a CPU-only worker never initialises CUDA.
"""

import dataclasses
import importlib
import logging
import os

from zmqflow.common.cluster.device import DeviceSpec, DeviceStack
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.registry import load_model
from zmqflow.models.kernels import get_backend, gpu_count

log = logging.getLogger("devices")

# Which dtypes each device type has kernels for. The CuPy backend is built and tested for float32
# (float16 also compiles); float64 and bfloat16 get no GPU kernel here, as many of TensorFlow's
# GPU kernels had no DT_DOUBLE. The CPU backends (numba, numpy) take the model dtypes.
KERNELS = {"CPU": frozenset({"float32", "float64"}), "GPU": frozenset({"float32", "float16"})}
LAYER_OPS = {"dense": ("MatMul", "BiasAdd"), "conv2d": ("Conv2D", "BiasAdd"), "max_pooling2d": ("MaxPool",),
             "average_pooling2d": ("AvgPool",), "flatten": ("Reshape",), "reshape": ("Reshape",),
             "embedding": ("GatherV2",), "concatenate": ("ConcatV2",), "layer_normalization": ("LayerNorm",),
             "batch_normalization": ("FusedBatchNorm",)}
ACTIVATION_OPS = {"sigmoid": "Sigmoid", "relu": "Relu", "tanh": "Tanh", "gelu": "Gelu", "softmax": "Softmax"}
HEAD_OPS = {"softmax_cross_entropy": ("SparseSoftmaxCrossEntropyWithLogits", "Softmax"),
            "sigmoid_cross_entropy": ("SigmoidCrossEntropyWithLogits", "Sigmoid"), "mse": ("SquaredDifference",),
            "huber": ("HuberLoss",)}
"""TensorFlow's names of the ops of each layer kind, its activation, and the loss head (on the last layer)."""


def has_kernel(device_type, dtype):
    return str(dtype) in KERNELS.get(device_type, ())


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
    """The worker's device flags. `num_gpus` and `gpu_kernels` (index -> Kernels, the ops backend of
    a GPU) default to what CuPy offers; tests pass a stub GPU through them."""
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


def layer_ops(model):
    """One LayerOp per layer of a layer model, its ops named as TensorFlow's (the last one's with the head's)."""
    layers, dtype = model.network.layers, model.dtype.name
    found = []
    for i, layer in enumerate(layers):
        ops = LAYER_OPS.get(layer.kind, (type(layer).__name__,))
        if layer.kind in ("dense", "conv2d") and not layer.use_bias:
            ops = ops[:1]
        name = getattr(layer, "activation_name", None)
        ops += (ACTIVATION_OPS[name],) if name in ACTIVATION_OPS else ()
        ops += HEAD_OPS[model.loss_name] if i == len(layers) - 1 else ()
        own = DeviceSpec.from_string(layer.device) if layer.device else DeviceSpec()
        here = DeviceSpec(device_type=own.device_type, device_index=own.device_index).to_string()
        shape = layer.weights[0].shape if layer.weights else tuple(layer.output_shape)
        found.append(LayerOp(layer.name, ops[0], ops, dtype, shape, here))
    return found


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
    if not has_kernel(device.device_type, layer.dtype):
        supported = ", ".join(sorted(KERNELS.get(device.device_type, ())))
        return (f"Cannot assign a device for operation {op}: Could not satisfy explicit device specification "
                f"'{device}' because no supported kernel for {device.device_type} devices is available {what[:-1]}; "
                f"{device.device_type} kernels take {supported}). Pass --allow-soft-placement to run it on the CPU")
    return None


# ------------------------------------------------------------------ models on devices

def place_model(spec, options=None, outer=None, log_prefix=""):
    """The model of `spec` (on the CPU backend `options.cpu_backend`) with its layers placed;
    user models (`module:Class`) place themselves."""
    options = options or DeviceOptions()
    model = load_model(spec, backend=options.cpu_backend)
    if not hasattr(model, "place"):
        log.info("model %s computes where it chooses: device flags apply to zmqflow's layers", spec["type"])
        return model
    return place_layer_model(model, options, outer, log_prefix)


def place_layer_model(model, options, outer=None, log_prefix=""):
    """A layer model (models/layer_model.py) with each layer computing on the ops backend of its
    placement's device: the CPU's (the model's own), or a GPU's (one Kernels object per GPU)."""
    placements = place_layers(layer_ops(model), options, outer, log_prefix)
    kinds = {layer.name: layer.kind for layer in model.network.layers}
    shared = sorted({p.device.device_index for p in placements
                     if p.device.device_type == "GPU" and kinds[p.layer.name] != "dense"})
    if len(shared) > 1:
        raise InvalidArgumentError(f"the layers use GPUs {shared}: one worker runs a layer model on one GPU, but for "
                                   "Dense layers, which select their own (--towers splits batches over several)")
    gpus, kernels = {}, {}
    for p in placements:
        if p.device.device_type == "GPU":
            index = p.device.device_index
            if index not in gpus:
                gpus[index] = options.gpu_kernels(index) if options.gpu_kernels else get_backend("cupy", index)
            kernels[p.layer.name] = gpus[index]
    model.place(kernels, placements)
    return model


# ------------------------------------------------------------------ what the worker calls

def build_model(spec, *, backend="numba", device=None, placement_function=None, allow_soft_placement=False,
                log_device_placement=False, gpu_memory_fraction=None, towers=1, job="worker", task=0, **extra):
    """The worker's model from its flags: placed layers, in `towers` towers when more than one.
    `backend` picks the CPU ops backend; 'cupy' (the old way to ask for the GPU) means --device /gpu:0."""
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
