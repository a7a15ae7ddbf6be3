"""Optimizers against straightforward numpy versions of TensorFlow's formulas; sparse updates; schedules."""

import math

import numpy as np
import pytest

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.optimizers import (Adagrad, Adam, GradientDescent, Momentum, SlotSpec, make_optimizer, make_schedule,
                                    sum_duplicates)

pytestmark = pytest.mark.unit

SHAPE = (6, 4)


def grads(steps, shape=SHAPE, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(steps)]


def start(shape=SHAPE, dtype=np.float32):
    return np.random.default_rng(9).standard_normal(shape).astype(dtype)


# float64 checks the formulas tightly; float32 (what ps shards hold) within its rounding.
TOLERANCE = {np.float32: dict(rtol=1e-5, atol=1e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}


def lr_at(step):
    return 0.1 * 0.5 ** (step // 2)  # the exponential_decay schedule used below, staircase


SCHEDULE = {"kind": "exponential_decay", "learning_rate": 0.1, "decay_steps": 2, "decay_rate": 0.5, "staircase": True}


def reference_sgd(var, g, slots, step):
    var -= lr_at(step) * g


def reference_momentum(nesterov):
    def update(var, g, slots, step):
        slots["momentum"][:] = slots["momentum"] * 0.9 + g
        if nesterov:
            var -= g * lr_at(step) + slots["momentum"] * 0.9 * lr_at(step)
        else:
            var -= lr_at(step) * slots["momentum"]
    return update


def reference_adam(nesterov):
    def update(var, g, slots, step):
        b1, b2, eps, t = 0.9, 0.999, 1e-8, step + 1
        lr_t = lr_at(step) * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        m, v = slots["m"], slots["v"]
        m += (g - m) * (1 - b1)
        v += (g * g - v) * (1 - b2)
        var -= lr_t * ((m * b1 + (1 - b1) * g) if nesterov else m) / (np.sqrt(v) + eps)
    return update


def reference_adagrad(var, g, slots, step):
    slots["accumulator"] += g * g
    var -= lr_at(step) * g / np.sqrt(slots["accumulator"])


CASES = {
    "sgd": (GradientDescent(SCHEDULE), reference_sgd, {}),
    "momentum": (Momentum(SCHEDULE, 0.9), reference_momentum(False), {"momentum": 0.0}),
    "nesterov": (Momentum(SCHEDULE, 0.9, use_nesterov=True), reference_momentum(True), {"momentum": 0.0}),
    "adam": (Adam(SCHEDULE), reference_adam(False), {"m": 0.0, "v": 0.0}),
    "adam_nesterov": (Adam(SCHEDULE, use_nesterov=True), reference_adam(True), {"m": 0.0, "v": 0.0}),
    "adagrad": (Adagrad(SCHEDULE), reference_adagrad, {"accumulator": 0.1}),
    "lazy_adam": (Adam(SCHEDULE, lazy=True), reference_adam(False), {"m": 0.0, "v": 0.0}),
}
DENSE_SPARSE_RULE = ("adam", "adam_nesterov")   # TF1's Adam decays every row's moments on a sparse update


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES)
def test_dense_updates_match_tensorflow_formulas(case, dtype):
    optimizer, reference, slot_values = CASES[case]
    assert optimizer.slot_specs(SHAPE) == [SlotSpec(name, SHAPE, value) for name, value in slot_values.items()]
    var, want = start(dtype=dtype), start(dtype=np.float64)
    slots = optimizer.create_slots(var)
    want_slots = {name: np.full(SHAPE, value) for name, value in slot_values.items()}
    for step, g in enumerate(grads(5)):
        optimizer.apply_dense(var, g.astype(dtype), slots, step)
        reference(want, g.astype(np.float64), want_slots, step)
    np.testing.assert_allclose(var, want, **TOLERANCE[dtype])
    for name in want_slots:
        assert slots[name].dtype == dtype
        np.testing.assert_allclose(slots[name], want_slots[name], **TOLERANCE[dtype])


@pytest.mark.parametrize("case", CASES)
def test_sparse_updates_match_dense_on_summed_rows(case):
    """A sparse update equals the reference on the touched rows (duplicates summed); other rows keep
    their values, except under Adam, whose TF1 sparse rule decays every row's moments (lazy Adam,
    as LazyAdamOptimizer, touches only the rows)."""
    optimizer, reference, slot_values = CASES[case]
    indices = np.array([4, 1, 4, 0])
    var, want = start(), start().astype(np.float64)
    slots = optimizer.create_slots(var)
    want_slots = {name: np.full(SHAPE, value) for name, value in slot_values.items()}
    for step, rows in enumerate(grads(3, (4, SHAPE[1]))):
        optimizer.apply_sparse(var, indices, rows, slots, step)
        touched, summed = sum_duplicates(indices, rows)
        if case in DENSE_SPARSE_RULE:
            dense = np.zeros(SHAPE)
            dense[touched] = summed
            reference(want, dense, want_slots, step)
        else:
            sub_slots = {name: value[touched] for name, value in want_slots.items()}
            sub = want[touched]
            reference(sub, summed.astype(np.float64), sub_slots, step)
            want[touched] = sub
            for name in want_slots:
                want_slots[name][touched] = sub_slots[name]
    np.testing.assert_allclose(var, want, **TOLERANCE[np.float32])
    for name in want_slots:
        np.testing.assert_allclose(slots[name], want_slots[name], **TOLERANCE[np.float32])
    if case not in DENSE_SPARSE_RULE:
        untouched = [2, 3, 5]
        np.testing.assert_array_equal(var[untouched], start()[untouched])


def test_sparse_rows_of_a_1d_variable_and_duplicates():
    var = np.zeros(5, np.float32)
    GradientDescent(1.0).apply_sparse(var, [3, 3, 0], np.array([1, 2, 4], np.float32), {}, 0)
    np.testing.assert_array_equal(var, [-4, 0, 0, -3, 0])
    unique, summed = sum_duplicates(np.array([3, 3, 0]), np.array([[1.0], [2.0], [4.0]]))
    assert unique.tolist() == [0, 3] and summed.tolist() == [[4.0], [3.0]]


def test_bad_updates_are_invalid_argument():
    sgd, var = GradientDescent(0.1), np.zeros(SHAPE, np.float32)
    with pytest.raises(InvalidArgumentError, match=r"indices\[1\] = 6 is not in \[0, 6\)"):
        sgd.apply_sparse(var, [0, 6], np.zeros((2, 4), np.float32), {}, 0)
    with pytest.raises(InvalidArgumentError, match="rows"):
        sgd.apply_sparse(var, [0, 1], np.zeros((2, 3), np.float32), {}, 0)
    with pytest.raises(InvalidArgumentError, match="gradient"):
        sgd.apply_dense(var, np.zeros(SHAPE, np.float64), {}, 0)
    with pytest.raises(InvalidArgumentError, match="C-contiguous"):
        sgd.apply_dense(np.zeros((4, 6), np.float32).T, np.zeros(SHAPE, np.float32), {}, 0)
    readonly = np.zeros(SHAPE, np.float32)
    readonly.flags.writeable = False
    with pytest.raises(InvalidArgumentError, match="writable"):
        sgd.apply_dense(readonly, np.zeros(SHAPE, np.float32), {}, 0)


@pytest.mark.parametrize("config, expected", [
    (0.5, {0: 0.5, 1000: 0.5}),
    ({"kind": "exponential_decay", "learning_rate": 0.1, "decay_steps": 100, "decay_rate": 0.96},
     {0: 0.1, 50: 0.1 * 0.96 ** 0.5, 250: 0.1 * 0.96 ** 2.5}),
    ({"kind": "exponential_decay", "learning_rate": 0.1, "decay_steps": 100, "decay_rate": 0.96, "staircase": True},
     {99: 0.1, 100: 0.096, 250: 0.1 * 0.96 ** 2}),
    ({"kind": "piecewise_constant", "boundaries": [100, 200], "values": [1.0, 0.5, 0.1]},
     {0: 1.0, 100: 1.0, 101: 0.5, 200: 0.5, 201: 0.1}),
    ({"kind": "polynomial_decay", "learning_rate": 0.1, "decay_steps": 100, "end_learning_rate": 0.01, "power": 2.0},
     {0: 0.1, 50: 0.09 * 0.25 + 0.01, 100: 0.01, 500: 0.01}),
    ({"kind": "polynomial_decay", "learning_rate": 0.1, "decay_steps": 100, "end_learning_rate": 0.0, "cycle": True},
     {0: 0.1, 100: 0.0, 150: 0.1 * 0.25, 200: 0.0}),
])
def test_schedules_follow_tensorflow(config, expected):
    schedule = make_schedule(config)
    for step, value in expected.items():
        assert schedule(step) == pytest.approx(value, rel=1e-12), step


@pytest.mark.parametrize("config, message", [
    ({"kind": "cosine"}, "kind"),
    ({"kind": "exponential_decay", "learning_rate": 0.1, "decay_steps": 0, "decay_rate": 0.5}, "decay_steps"),
    ({"kind": "exponential_decay", "learning_rate": 0.1, "decay_steps": 10, "decay_rate": 0.5, "warmup": 3}, "warmup"),
    ({"kind": "piecewise_constant", "boundaries": [10], "values": [1.0]}, "len"),
    ("fast", "learning_rate"),
])
def test_bad_schedules(config, message):
    with pytest.raises(InvalidArgumentError, match=message):
        make_schedule(config)


def test_make_optimizer_and_config():
    optimizer = make_optimizer({"kind": "momentum", "learning_rate": 0.01, "momentum": 0.9, "use_nesterov": True})
    assert isinstance(optimizer, Momentum) and optimizer.use_nesterov
    assert optimizer.get_config() == {"kind": "momentum", "momentum": 0.9, "use_nesterov": True,
                                      "learning_rate": {"kind": "constant", "learning_rate": 0.01}}
    assert make_optimizer({"kind": "adagrad", "learning_rate": 0.1}).slot_specs((3,)) == [
        SlotSpec("accumulator", (3,), 0.1)]
    with pytest.raises(InvalidArgumentError, match="momentum"):
        make_optimizer({"kind": "momentum", "learning_rate": 0.01})
    with pytest.raises(InvalidArgumentError, match="beta3"):
        make_optimizer({"kind": "adam", "beta3": 0.5})
    with pytest.raises(InvalidArgumentError, match="kind"):
        make_optimizer({"kind": "rmsprop"})
