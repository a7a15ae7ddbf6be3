"""Update rules of the parameter servers and of all-reduce workers: TensorFlow 1.x's optimizers, applied in place.

Here, in common/, because both the ps (services/ps/store.py) and a worker of an all-reduce job
(services/worker/allreduce.py) apply them, and the services may not import each other.

Each rule is a numba kernel over the flat variable (and its slots) and follows the
formula of TF's training op of the same name (ApplyGradientDescent, ApplyMomentum,
ApplyAdam, ApplyAdagrad), scalars cast to the variable's dtype first as TF does.

An optimizer declares its slots (`slot_specs`), so a ps shard can create and checkpoint
them beside each variable. `step` is the global step before the update, as
`apply_gradients` reads it: it picks the learning rate from the schedule, and Adam's bias
correction uses t = step + 1, which is TF's beta1_power/beta2_power whenever the global
step is incremented with every update (as `minimize(global_step=...)` does); so the
shards need no extra state. Sparse updates take (indices, rows) as TF's IndexedSlices:
duplicate indices are summed first, as TF's optimizers do.
"""

import dataclasses
import math
import threading

import numpy as np

from zmqflow.common.errors import InvalidArgumentError


DEFAULT_OPTIMIZER = {"kind": "adam", "learning_rate": 0.004}
"""The one default optimizer: a ps started without --optimizer, an all-reduce worker, `zmqflow train`, sweeps,
zmqflow.Job and zmqflow.Server. Adam 0.004 reaches 0.918-0.926 test accuracy on the 4,500-row MNIST split in 10
epochs in every mode (async with its staleness, sync with 2 replicas, ps-preloaded; 3 runs each). 0.002 left sync,
which makes half as many steps, at 0.898-0.912, too close to the 0.90 target; SGD 0.5 (the ps's default before)
stays near 0.89: `zmqflow train --epochs 10` (async, 1 ps, 2 workers) scored the same accuracy with both, 0.894,
with a test log loss of 0.336 for Adam 0.004 against 0.359 for SGD 0.5 (0.606 and 0.706 after 2 epochs)."""


# --- kernels: flat (dense) and row (sparse) updates, in place -------------------------

class _Kernel:
    """A kernel compiled with numba on the first call of any kernel, not at import: importing numba costs ~1 s
    (bench startup), and `zmqflow train`, a job spec (jobs/spec.py), `zmqflow ps --help` only read
    DEFAULT_OPTIMIZER. The first call puts every compiled kernel in this module's globals (the sparse kernels
    call the dense ones by name), so later calls go straight to numba; cache=True: a later process loads them
    compiled. A ps still compiles them before it serves (services/ps/store.py, _warm_up).
    error_model "numpy": a float division by zero gives inf or nan (as TF's kernels do) instead of raising, so
    LLVM vectorizes the loops that divide (Adam, Adagrad): Adam over the MNIST MLP's 318 KB took 221 -> 69 us of
    CPU, over a 13 MB CNN 7.97 -> 1.96 ms, bit for bit the same (numpy's in-place ufuncs took 121 us and 9.3 ms)."""

    def __init__(self, function):
        self.function = function

    def __call__(self, *args):
        _compile_kernels()
        return globals()[self.function.__name__](*args)


_COMPILING = threading.Lock()


def _compile_kernels():
    from zmqflow.common.jit import load_numba
    njit = load_numba().njit
    with _COMPILING:   # two threads' first calls: one set of dispatchers
        for name, kernel in list(globals().items()):
            if isinstance(kernel, _Kernel):
                globals()[name] = njit(cache=True, error_model="numpy")(kernel.function)


@_Kernel
def _sgd(var, grad, lr):
    for i in range(var.size):
        var[i] -= lr * grad[i]


@_Kernel
def _momentum(var, accum, grad, lr, momentum, nesterov):
    for i in range(var.size):
        accum[i] = accum[i] * momentum + grad[i]
        if nesterov:
            var[i] -= grad[i] * lr + accum[i] * momentum * lr
        else:
            var[i] -= lr * accum[i]


@_Kernel
def _adam(var, m, v, grad, lr_t, beta1, beta2, epsilon, nesterov):
    one = var.dtype.type(1)
    for i in range(var.size):
        g = grad[i]
        m[i] += (g - m[i]) * (one - beta1)
        v[i] += (g * g - v[i]) * (one - beta2)
        if nesterov:
            var[i] -= lr_t * (m[i] * beta1 + (one - beta1) * g) / (np.sqrt(v[i]) + epsilon)
        else:
            var[i] -= lr_t * m[i] / (np.sqrt(v[i]) + epsilon)


@_Kernel
def _adagrad(var, accum, grad, lr):
    for i in range(var.size):
        g = grad[i]
        accum[i] += g * g
        var[i] -= lr * g / np.sqrt(accum[i])


@_Kernel
def _sparse_sgd(var, indices, rows, lr):
    for k in range(indices.size):
        _sgd(var[indices[k]], rows[k], lr)


@_Kernel
def _sparse_momentum(var, accum, indices, rows, lr, momentum, nesterov):
    for k in range(indices.size):
        r = indices[k]
        _momentum(var[r], accum[r], rows[k], lr, momentum, nesterov)


@_Kernel
def _sparse_adam(var, m, v, indices, rows, lr_t, beta1, beta2, epsilon, nesterov):
    for k in range(indices.size):
        r = indices[k]
        _adam(var[r], m[r], v[r], rows[k], lr_t, beta1, beta2, epsilon, nesterov)


@_Kernel
def _sparse_adagrad(var, accum, indices, rows, lr):
    for k in range(indices.size):
        r = indices[k]
        _adagrad(var[r], accum[r], rows[k], lr)


# --- learning-rate schedules (tf.train.*_decay), by global step ------------------------

@dataclasses.dataclass(frozen=True)
class Constant:
    learning_rate: float

    def __call__(self, step):
        return self.learning_rate


@dataclasses.dataclass(frozen=True)
class ExponentialDecay:
    """lr * decay_rate ** (step / decay_steps), the exponent floored when staircase."""

    learning_rate: float
    decay_steps: int
    decay_rate: float
    staircase: bool = False

    def __post_init__(self):
        _check_positive("exponential_decay decay_steps", self.decay_steps)

    def __call__(self, step):
        p = step / self.decay_steps
        return self.learning_rate * self.decay_rate ** (math.floor(p) if self.staircase else p)


@dataclasses.dataclass(frozen=True)
class PiecewiseConstant:
    """values[0] while step <= boundaries[0], values[1] while step <= boundaries[1], ..., values[-1] after."""

    boundaries: tuple
    values: tuple

    def __post_init__(self):
        if len(self.values) != len(self.boundaries) + 1:
            raise InvalidArgumentError("piecewise_constant needs len(values) == len(boundaries) + 1")
        if list(self.boundaries) != sorted(self.boundaries):
            raise InvalidArgumentError("piecewise_constant boundaries must be increasing")

    def __call__(self, step):
        for boundary, value in zip(self.boundaries, self.values):
            if step <= boundary:
                return value
        return self.values[-1]


@dataclasses.dataclass(frozen=True)
class PolynomialDecay:
    """(lr - end) * (1 - step / decay_steps) ** power + end; with cycle, decay_steps grows to
    the next multiple of itself above step, else step stops at decay_steps."""

    learning_rate: float
    decay_steps: int
    end_learning_rate: float = 0.0001
    power: float = 1.0
    cycle: bool = False

    def __post_init__(self):
        _check_positive("polynomial_decay decay_steps", self.decay_steps)

    def __call__(self, step):
        decay_steps = self.decay_steps
        if self.cycle:
            decay_steps *= 1 if step == 0 else math.ceil(step / decay_steps)
        else:
            step = min(step, decay_steps)
        fraction = (1 - step / decay_steps) ** self.power
        return (self.learning_rate - self.end_learning_rate) * fraction + self.end_learning_rate


SCHEDULES = {"constant": Constant, "exponential_decay": ExponentialDecay,
             "piecewise_constant": PiecewiseConstant, "polynomial_decay": PolynomialDecay}


def make_schedule(config):
    """A schedule from a number (constant) or {"kind": "exponential_decay", "learning_rate": ..., ...}."""
    if isinstance(config, (int, float)) and not isinstance(config, bool):
        return Constant(float(config))
    if callable(config):
        return config
    if not isinstance(config, dict) or config.get("kind") not in SCHEDULES:
        raise InvalidArgumentError(
            f"learning_rate must be a number or a schedule with kind in {', '.join(SCHEDULES)}, got {config!r}")
    return from_config(SCHEDULES, config, "schedule")


def from_config(kinds, config, what):
    """`kinds[config["kind"]](**the other fields)`: a schedule or an optimizer from its JSON; InvalidArgumentError
    naming the kind, or the field that is unknown or missing."""
    if not isinstance(config, dict) or config.get("kind") not in kinds:
        raise InvalidArgumentError(f"{what} needs a kind in {', '.join(kinds)}, got {config!r}")
    try:
        return kinds[config["kind"]](**{k: v for k, v in config.items() if k != "kind"})
    except TypeError as exc:   # an unknown field, or a missing one: Python's message names it
        raise InvalidArgumentError(f"{what} {config['kind']!r}: {exc}") from exc


# --- optimizers --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SlotSpec:
    """One slot of a variable: its name ('momentum', 'm'), shape and initial value."""

    name: str
    shape: tuple
    initial_value: float = 0.0


class Optimizer:
    """Base of the update rules. Subclasses set `kind`, `slot_names` and the two _apply methods."""

    kind = ""
    slot_names = ()
    slot_initial_value = 0.0

    def __init__(self, learning_rate):
        self.schedule = make_schedule(learning_rate)

    def learning_rate(self, step):
        return float(self.schedule(step))

    def slot_specs(self, shape):
        """The slots a variable of `shape` needs, to create and checkpoint beside it."""
        return [SlotSpec(name, tuple(shape), self.slot_initial_value) for name in self.slot_names]

    def create_slots(self, var):
        return {s.name: np.full(s.shape, s.initial_value, dtype=var.dtype) for s in self.slot_specs(var.shape)}

    def warm_up(self, dtypes):
        """Compile (or load from numba's cache) the dense update for each of `dtypes` now, on a 1-element
        variable: not in the first update (0.38 s in a ps's first push)."""
        for dtype in set(dtypes):
            var = np.zeros(1, dtype)
            self.apply_dense(var, np.zeros(1, dtype), self.create_slots(var), 0)

    def apply_dense(self, var, grad, slots, step):
        """var (and slots) -= the update for `grad`, in place."""
        flat = _flat(var, "variable")
        grad = np.asarray(grad)
        if grad.dtype != var.dtype or grad.size != var.size:
            raise InvalidArgumentError(f"gradient of {grad.dtype} {list(grad.shape)} does not match "
                                       f"variable of {var.dtype} {list(var.shape)}")
        flat_slots = [_flat(slots[name], f"slot {name!r}") for name in self.slot_names]
        self._apply_dense(flat, grad.reshape(-1), flat_slots, self.learning_rate(step), step)

    def apply_sparse(self, var, indices, rows, slots, step):
        """Update only the rows `indices` of var ([n, ...]) with gradient `rows` ([len(indices), ...])."""
        _flat(var, "variable")
        indices, rows = np.asarray(indices).reshape(-1), np.asarray(rows)
        if indices.dtype.kind not in "iu" or rows.dtype != var.dtype or rows.shape != indices.shape + var.shape[1:]:
            raise InvalidArgumentError(f"sparse gradient needs integer indices and rows of shape "
                                       f"[{indices.size}, {', '.join(map(str, var.shape[1:]))}] and dtype {var.dtype}")
        if indices.size and (indices.min() < 0 or indices.max() >= var.shape[0]):
            bad = int(np.flatnonzero((indices < 0) | (indices >= var.shape[0]))[0])
            raise InvalidArgumentError(f"indices[{bad}] = {indices[bad]} is not in [0, {var.shape[0]})")
        width = var.size // max(var.shape[0], 1)
        var2, rows2 = var.reshape(var.shape[0], width), rows.reshape(indices.size, width)
        slots2 = [_flat(slots[name], f"slot {name!r}").reshape(var2.shape) for name in self.slot_names]
        self._apply_sparse(var2, indices, rows2, slots2, self.learning_rate(step), step)

    def _apply_sparse(self, var, indices, rows, slots, lr, step):
        """Default: the dense rule on the densified gradient (what TF1's Adam does, too)."""
        dense = np.zeros_like(var)
        np.add.at(dense, indices, rows)
        self._apply_dense(var.reshape(-1), dense.reshape(-1), [s.reshape(-1) for s in slots], lr, step)

    def get_config(self):
        """The resolved settings, for logs and checkpoints."""
        config = {"kind": self.kind, **{k: v for k, v in vars(self).items() if k != "schedule"}}
        schedule = self.schedule
        config["learning_rate"] = ({"kind": _schedule_kind(schedule), **dataclasses.asdict(schedule)}
                                   if dataclasses.is_dataclass(schedule) else repr(schedule))
        return config


class GradientDescent(Optimizer):
    """var -= lr * grad (tf.train.GradientDescentOptimizer)."""

    kind = "sgd"

    def _apply_dense(self, var, grad, slots, lr, step):
        _sgd(var, grad, var.dtype.type(lr))

    def _apply_sparse(self, var, indices, rows, slots, lr, step):
        _sparse_sgd(var, indices, rows, var.dtype.type(lr))  # linear: duplicates just add up


class Momentum(Optimizer):
    """accum = accum * momentum + grad; var -= lr * accum, or with Nesterov
    var -= lr * grad + lr * momentum * accum (tf.train.MomentumOptimizer)."""

    kind = "momentum"
    slot_names = ("momentum",)

    def __init__(self, learning_rate, momentum, use_nesterov=False):
        super().__init__(learning_rate)
        self.momentum, self.use_nesterov = float(momentum), bool(use_nesterov)

    def _apply_dense(self, var, grad, slots, lr, step):
        t = var.dtype.type
        _momentum(var, slots[0], grad, t(lr), t(self.momentum), self.use_nesterov)

    def _apply_sparse(self, var, indices, rows, slots, lr, step):
        indices, rows = sum_duplicates(indices, rows)
        t = var.dtype.type
        _sparse_momentum(var, slots[0], indices, rows, t(lr), t(self.momentum), self.use_nesterov)


class Adam(Optimizer):
    """m += (g - m)(1 - beta1); v += (g^2 - v)(1 - beta2); var -= lr_t * m / (sqrt(v) + epsilon)
    with lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t) (tf.train.AdamOptimizer).

    Sparse gradients (embedding rows): by default the dense rule on the densified gradient, as
    TF1's Adam (every row's m and v decay, so each push costs the whole table). `lazy=True`
    is tf.contrib.opt.LazyAdamOptimizer: only the touched rows and their slot rows move, so
    a push costs the rows it carries; the usual choice for large embedding tables."""

    kind = "adam"
    slot_names = ("m", "v")

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, use_nesterov=False, lazy=False):
        super().__init__(learning_rate)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)
        self.use_nesterov, self.lazy = bool(use_nesterov), bool(lazy)

    def _coefficients(self, var, lr, step):
        t_step = step + 1
        lr_t = lr * math.sqrt(1 - self.beta2 ** t_step) / (1 - self.beta1 ** t_step)
        t = var.dtype.type
        return t(lr_t), t(self.beta1), t(self.beta2), t(self.epsilon), self.use_nesterov

    def _apply_dense(self, var, grad, slots, lr, step):
        _adam(var, slots[0], slots[1], grad, *self._coefficients(var, lr, step))

    def _apply_sparse(self, var, indices, rows, slots, lr, step):
        if not self.lazy:
            return super()._apply_sparse(var, indices, rows, slots, lr, step)
        indices, rows = sum_duplicates(indices, rows)
        _sparse_adam(var, slots[0], slots[1], indices, rows, *self._coefficients(var, lr, step))


class Adagrad(Optimizer):
    """accum += grad^2; var -= lr * grad / sqrt(accum) (tf.train.AdagradOptimizer)."""

    kind = "adagrad"
    slot_names = ("accumulator",)

    def __init__(self, learning_rate, initial_accumulator_value=0.1):
        super().__init__(learning_rate)
        if not initial_accumulator_value > 0:
            raise InvalidArgumentError(f"initial_accumulator_value must be positive, got {initial_accumulator_value}")
        self.initial_accumulator_value = float(initial_accumulator_value)

    @property
    def slot_initial_value(self):
        return self.initial_accumulator_value

    def _apply_dense(self, var, grad, slots, lr, step):
        _adagrad(var, slots[0], grad, var.dtype.type(lr))

    def _apply_sparse(self, var, indices, rows, slots, lr, step):
        indices, rows = sum_duplicates(indices, rows)
        _sparse_adagrad(var, slots[0], indices, rows, var.dtype.type(lr))


OPTIMIZERS = {"sgd": GradientDescent, "momentum": Momentum, "adam": Adam, "adagrad": Adagrad}


def make_optimizer(config):
    """An optimizer from {"kind": "momentum", "learning_rate": 0.1 or a schedule, "momentum": 0.9, ...}."""
    return from_config(OPTIMIZERS, config, "optimizer")


def sum_duplicates(indices, rows):
    """(unique indices, summed rows) when an index repeats, else the inputs unchanged."""
    unique, inverse = np.unique(indices, return_inverse=True)
    if unique.size == indices.size:
        return indices, rows
    summed = np.zeros((unique.size,) + rows.shape[1:], dtype=rows.dtype)
    np.add.at(summed, inverse, rows)
    return unique, summed


def _flat(array, what):
    """A flat view of a writable C-contiguous float array (reshape of anything else would copy)."""
    if not isinstance(array, np.ndarray) or array.dtype.kind != "f" or not array.flags.c_contiguous \
            or not array.flags.writeable:
        raise InvalidArgumentError(f"{what} must be a writable C-contiguous float array")
    return array.reshape(-1)


def _check_positive(what, value):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise InvalidArgumentError(f"{what} must be a positive number, got {value!r}")


def _schedule_kind(schedule):
    return next((k for k, cls in SCHEDULES.items() if isinstance(schedule, cls)), type(schedule).__name__)
