"""The update rules over a VariableStore: optimizers against numpy references, sync aggregation against one big batch,
async exactly-once, staleness, warm-up, spare and duplicate replicas, validation, snapshots."""

import json

import numpy as np
import pytest

from zmqflow.common.errors import AlreadyExistsError, FailedPreconditionError, InvalidArgumentError, NotFoundError
from zmqflow.services.ps.rules import update_rule
from zmqflow.services.ps.store import VariableStore
from zmqflow.models.registry import load_model

pytestmark = pytest.mark.unit

PIECES = {"layer/weights": ((3, 4), "float64"), "layer/biases": ((4,), "float64")}


def values(seed=0, pieces=PIECES):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(shape).astype(dtype) for n, (shape, dtype) in pieces.items()}


def shard(optimizer=None, pieces=PIECES, init=True, **options):
    state = update_rule(VariableStore(pieces, optimizer or {"kind": "sgd", "learning_rate": 0.1}), **options)
    if init:
        state.store.initialize(values(0, pieces))
    return state


def current(state):
    return {n: v.copy() for n, v in state.store.pull()[1].items()}


# --- update rules ------------------------------------------------------------------------

def sgd_ref(var, g, s, t, lr=0.1):
    var -= lr * g


def momentum_ref(var, g, s, t, lr=0.1, mu=0.9):
    s["momentum"] = mu * s.get("momentum", 0) + g
    var -= lr * s["momentum"]


def adam_ref(var, g, s, t, lr=0.01, b1=0.9, b2=0.999, eps=1e-8):
    s["m"] = b1 * s.get("m", 0) + (1 - b1) * g
    s["v"] = b2 * s.get("v", 0) + (1 - b2) * g * g
    var -= lr * np.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1)) * s["m"] / (np.sqrt(s["v"]) + eps)


def adagrad_ref(var, g, s, t, lr=0.1):
    s["acc"] = s.get("acc", 0.1) + g * g
    var -= lr * g / np.sqrt(s["acc"])


@pytest.mark.parametrize("optimizer, reference", [
    ({"kind": "sgd", "learning_rate": 0.1}, sgd_ref),
    ({"kind": "momentum", "learning_rate": 0.1, "momentum": 0.9}, momentum_ref),
    ({"kind": "adam", "learning_rate": 0.01}, adam_ref),
    ({"kind": "adagrad", "learning_rate": 0.1}, adagrad_ref),
])
def test_async_updates_follow_the_optimizer(optimizer, reference):
    state = shard(optimizer)
    expected, slots = values(0), {n: {} for n in PIECES}
    for step in range(5):
        grads = values(step + 1)
        result = state.push(grads, version=step, replica=0)
        assert (result.applied, result.dropped, result.version) == (True, False, step + 1)
        for name in PIECES:
            reference(expected[name], grads[name], slots[name], step)
    for name, value in state.store.pull()[1].items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-12)


# --- sync: N replicas == one replica with N times the batch --------------------------------

@pytest.mark.parametrize("optimizer", [{"kind": "sgd", "learning_rate": 0.5},
                                       {"kind": "momentum", "learning_rate": 0.1, "momentum": 0.9}])
def test_sync_replicas_equal_one_big_batch(optimizer):
    model = load_model({"type": "mlp", "layers": [784, 100, 10], "init": {"kind": "truncated_normal", "stddev": 0.1},
                 "seed": 1, "dtype": "float64"})
    pieces = {v.name: (v.shape, v.dtype) for v in model.variables()}
    replicas = 3
    many = shard(optimizer, pieces, init=False, mode="sync", replicas_to_aggregate=replicas)
    one = shard(optimizer, pieces, init=False, mode="sync", replicas_to_aggregate=1)
    many.store.initialize(model.initial_values())
    one.store.initialize(model.initial_values())
    rng = np.random.default_rng(0)
    for step in range(3):
        x, y = rng.random((24, 784)), rng.integers(0, 10, 24)
        params = many.store.pull()[1]
        for r, (xs, ys) in enumerate(zip(np.split(x, replicas), np.split(y, replicas))):
            result = many.push(model.step(params, (xs, ys))[1], version=step, replica=r)
            assert result.applied == (r == replicas - 1) and not result.dropped
        one.push(model.step(one.store.pull()[1], (x, y))[1], version=step, replica=0)
        assert many.store.version == one.store.version == step + 1
    for name, value in many.store.pull()[1].items():
        np.testing.assert_allclose(value, one.store.pull()[1][name], rtol=1e-10, atol=1e-12)
    assert many.stats()["pushes_applied"] == 9 and many.stats()["updates"] == 3


# --- async -----------------------------------------------------------------------------

def test_async_applies_every_push_exactly_once():
    state, expected = shard(), values(0)
    versions = [0, 0, 1, 0, 3, 2, 6]  # late pushes included: no bound, so all are applied
    for i, version in enumerate(versions):
        grads = values(10 + i)
        assert state.push(grads, version, replica=i % 3).staleness == i - version
        for name in PIECES:
            sgd_ref(expected[name], grads[name], None, i)
    assert state.store.version == len(versions)
    for name, value in state.store.pull()[1].items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-12)
    stats = state.stats()
    assert stats["pushes_received"] == stats["pushes_applied"] == len(versions)
    assert stats["staleness"] == {0: 2, 1: 3, 3: 2} and stats["dropped"] == {}


def test_staleness_bound_drops_and_counts():
    state = shard(staleness_bound=1)
    for _ in range(3):
        state.push(values(1), state.store.version, 0)
    before = current(state)
    result = state.push(values(2), version=1, replica=1)
    assert (result.applied, result.dropped, result.reason, result.staleness, result.version) == \
        (False, True, "stale", 2, 3)
    assert state.push(values(2), version=2, replica=1).applied  # staleness 1 is within the bound
    assert state.stats()["dropped"] == {"stale": 1}
    assert not np.allclose(current(state)["layer/biases"], before["layer/biases"])


def test_staleness_scaling_divides_by_one_plus_staleness():
    state = shard(staleness_scaling=True)
    state.push(values(1), 0, 0)
    state.push(values(1), 1, 0)
    before, grads = current(state), values(2)
    state.push(grads, version=0, replica=1)  # staleness 2: gradient / 3
    for name, value in current(state).items():
        np.testing.assert_allclose(value, before[name] - 0.1 * grads[name] / 3, rtol=1e-12)


def test_warmup_accepts_only_the_warmup_replica():
    state = shard(warmup_steps=2, warmup_replica=1)
    assert state.push(values(1), 0, replica=0).reason == "warmup"
    assert state.push(values(1), 0, replica=1).applied
    assert state.push(values(1), 1, replica=2).reason == "warmup"
    assert state.push(values(1), 1, replica=1).applied
    assert state.push(values(1), 2, replica=0).applied  # warm-up over: everyone joins
    assert state.store.version == 3 and state.stats()["dropped"] == {"warmup": 2}


# --- sync --------------------------------------------------------------------------------

def test_sync_drops_stale_and_duplicate_pushes():
    state = shard(mode="sync", replicas_to_aggregate=2)
    assert not state.push(values(1), 0, replica=0).applied
    dup = state.push(values(2), 0, replica=0)
    assert (dup.dropped, dup.reason) == (True, "duplicate")
    assert state.push(values(1), 0, replica=1).applied and state.store.version == 1
    stale = state.push(values(3), 0, replica=0)
    assert (stale.dropped, stale.reason, stale.staleness) == (True, "stale", 1)
    stats = state.stats()
    assert stats["dropped"] == {"duplicate": 1, "stale": 1} and stats["pushes_applied"] == 2
    # the duplicate was not summed: the update is the mean of values(1) twice
    expected = values(0)
    for name, value in current(state).items():
        np.testing.assert_allclose(value, expected[name] - 0.1 * values(1)[name], rtol=1e-12)


def test_spare_replica_never_blocks_a_step():
    state = shard(mode="sync", replicas_to_aggregate=2, total_num_replicas=3)
    assert state.waiting_for() == {"mode": "sync", "step": 0, "needed": 2, "lost": [], "contributed": [], "partial": [],
                                   "missing": [0, 1, 2]}
    state.push(values(1), 0, replica=2)
    assert state.waiting_for()["contributed"] == [2] and state.waiting_for()["missing"] == [0, 1]
    assert state.push(values(2), 0, replica=0).applied and state.store.version == 1
    late = state.push(values(3), 0, replica=1)
    assert (late.dropped, late.reason) == (True, "stale") and state.store.version == 1
    assert state.waiting_for()["step"] == 1 and state.waiting_for()["contributed"] == []
    expected = values(0)
    for name, value in current(state).items():
        np.testing.assert_allclose(value, expected[name] - 0.1 * (values(1)[name] + values(2)[name]) / 2)


def test_empty_shard_keeps_the_step():
    state = shard(pieces={}, init=False, mode="sync", replicas_to_aggregate=2)
    state.store.initialize({})
    assert not state.push({}, 0, 0).applied and state.push({}, 0, 1).applied
    assert state.store.version == 1 and state.store.pull() == (1, {})


# --- sparse --------------------------------------------------------------------------------

def test_sparse_push_updates_only_its_rows():
    state, weights = shard({"kind": "adagrad", "learning_rate": 0.1}), values(0)["layer/weights"]
    rows = np.ones((2, 4))
    result = state.push_sparse("layer/weights", np.array([2, 0]), rows, 0, 0)
    assert result.applied and state.store.version == 1
    np.testing.assert_array_equal(state.store.pull_rows("layer/weights", np.array([1])), weights[[1]])
    np.testing.assert_allclose(state.store.pull_rows("layer/weights", np.array([2, 0])),
                               weights[[2, 0]] - 0.1 * rows / np.sqrt(0.1 + rows ** 2), rtol=1e-12)
    with pytest.raises(InvalidArgumentError, match="indices"):
        state.push_sparse("layer/weights", np.array([3]), np.ones((1, 4)), 1, 0)
    with pytest.raises(InvalidArgumentError, match="rows"):
        state.push_sparse("layer/weights", np.array([0]), np.ones((2, 4)), 1, 0)
    with pytest.raises(NotFoundError):
        state.store.pull_rows("nope", np.array([0]))
    assert state.store.version == 1


def test_sync_sparse_rows_are_averaged_with_dense_gradients():
    state = shard(mode="sync", replicas_to_aggregate=2)
    state.push_sparse("layer/weights", np.array([1, 1]), np.ones((2, 4)), 0, replica=0)
    assert state.waiting_for()["partial"] == [0] and state.waiting_for()["contributed"] == []
    assert state.push(values(1), 0, replica=0).reason == "duplicate"  # replica 0 already sent weights
    assert not state.push(values(1), 0, replica=1).applied
    assert state.push_sparse("layer/biases", np.array([0]), np.array([3.0]), 0, replica=0).applied
    grads, expected = values(1), values(0)
    grads["layer/weights"][1] += 2.0  # the duplicate index 1 is summed
    grads["layer/biases"][0] += 3.0
    for name, value in current(state).items():
        np.testing.assert_allclose(value, expected[name] - 0.1 * grads[name] / 2, rtol=1e-12)
    assert state.store.version == 1 and state.stats()["pushes_applied"] == 3


def densified(indices, rows, shape):
    dense = np.zeros(shape)
    np.add.at(dense, indices, rows)
    return dense


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_push_with_sparse_rows_is_one_update_equal_to_its_dense_form(mode):
    """An embedding table's touched rows inside a dense push: one version step, and with SGD the same
    values as pushing the densified gradient."""
    options = {"mode": "sync", "replicas_to_aggregate": 1} if mode == "sync" else {}
    sparse_state, dense_state = shard(**options), shard(**options)
    indices, rows = np.array([2, 0, 2]), np.arange(12, dtype=np.float64).reshape(3, 4)
    biases = values(3)["layer/biases"]
    result = sparse_state.push({"layer/biases": biases}, 0, 0, sparse={"layer/weights": (indices, rows)})
    assert result.applied and sparse_state.store.version == 1 and sparse_state.stats()["updates"] == 1
    dense_state.push({"layer/biases": biases, "layer/weights": densified(indices, rows, (3, 4))}, 0, 0)
    for name, value in current(sparse_state).items():
        np.testing.assert_allclose(value, current(dense_state)[name], rtol=1e-12)
    np.testing.assert_array_equal(current(sparse_state)["layer/weights"][1], values(0)["layer/weights"][1])


def test_sync_replicas_mixing_sparse_and_empty_rows_average_over_replicas():
    state = shard(mode="sync", replicas_to_aggregate=2)
    biases = values(4)["layer/biases"]
    first = state.push({"layer/biases": biases}, 0, 0, sparse={"layer/weights": (np.array([1]), np.ones((1, 4)))})
    assert not first.applied and state.waiting_for()["contributed"] == [0]
    empty = (np.zeros(0, np.int64), np.zeros((0, 4)))
    assert state.push({"layer/biases": biases}, 0, 1, sparse={"layer/weights": empty}).applied
    weights = current(state)["layer/weights"]
    np.testing.assert_allclose(weights[1], values(0)["layer/weights"][1] - 0.1 * 0.5, rtol=1e-12)
    np.testing.assert_array_equal(weights[[0, 2]], values(0)["layer/weights"][[0, 2]])
    np.testing.assert_allclose(current(state)["layer/biases"], values(0)["layer/biases"] - 0.1 * biases, rtol=1e-12)


@pytest.mark.parametrize("grads, sparse, message", [
    ({"layer/biases": np.zeros(4)}, {}, "'layer/weights' is missing"),
    ({"layer/biases": np.zeros(4)}, {"layer/weights": (np.array([3]), np.zeros((1, 4)))}, r"must be in \[0, 3\)"),
    ({"layer/biases": np.zeros(4)}, {"layer/weights": (np.array([0]), np.zeros((1, 5)))}, "rows of shape"),
    ({"layer/biases": np.zeros(4)}, {"layer/weights": np.zeros(3)}, r"must be \(indices, rows\)"),
    ({"layer/biases": np.zeros(4), "layer/weights": np.zeros((3, 4))},
     {"layer/weights": (np.array([0]), np.zeros((1, 4)))}, "not held by this shard"),
])
def test_bad_sparse_pushes_name_the_piece_and_change_nothing(grads, sparse, message):
    state = shard()
    with pytest.raises(InvalidArgumentError, match=message):
        state.push(grads, 0, 0, sparse=sparse)
    assert state.store.version == 0 and state.stats()["pushes_received"] == 0


# --- validation ----------------------------------------------------------------------------

@pytest.mark.parametrize("options, option", [
    ({"mode": "parallel"}, "mode"),
    ({"mode": "sync"}, "replicas_to_aggregate"),
    ({"mode": "sync", "replicas_to_aggregate": 0}, "replicas_to_aggregate"),
    ({"mode": "sync", "replicas_to_aggregate": 3, "total_num_replicas": 2}, "total_num_replicas"),
    ({"mode": "sync", "replicas_to_aggregate": 2, "staleness_bound": 1}, "staleness_bound"),
    ({"mode": "sync", "replicas_to_aggregate": 2, "warmup_steps": 5}, "warmup_steps"),
    ({"replicas_to_aggregate": 2}, "replicas_to_aggregate"),
    ({"staleness_bound": -1}, "staleness_bound"),
    ({"warmup_steps": 3, "warmup_replica": 4, "total_num_replicas": 2}, "warmup_replica"),
])
def test_bad_options_name_the_option(options, option):
    with pytest.raises(InvalidArgumentError, match=option):
        shard(init=False, **options)


def test_bad_gradients_are_never_partially_applied():
    state = shard()
    before = current(state)
    good = values(1)
    bad_pushes = [
        {"layer/weights": good["layer/weights"]},                                   # missing
        {**good, "other": good["layer/biases"]},                                    # unknown
        {**good, "layer/biases": np.ones(5)},                                       # shape
        {**good, "layer/biases": good["layer/biases"].astype(np.float32)},          # dtype
    ]
    for grads in bad_pushes:
        with pytest.raises(InvalidArgumentError):
            state.push(grads, 0, 0)
    with pytest.raises(InvalidArgumentError, match="version"):
        state.push(good, -1, 0)
    with pytest.raises(InvalidArgumentError, match="replica"):
        shard(mode="sync", replicas_to_aggregate=2).push(good, 0, 2)
    assert state.store.version == 0 and state.stats()["pushes_received"] == 0
    for name, value in current(state).items():
        np.testing.assert_array_equal(value, before[name])


def test_push_from_before_a_restore_is_dropped_as_future():
    state = shard()
    state.store.initialize(values(0))
    before = current(state)
    result = state.push(values(1), 5, 0)  # computed on a version this shard never reached
    assert result.dropped and result.reason == "future" and state.store.version == 0
    assert state.stats()["dropped"] == {"future": 1}
    for name, value in current(state).items():
        np.testing.assert_array_equal(value, before[name])


def test_initialize_once_and_checks_values():
    state = shard(init=False)
    with pytest.raises(FailedPreconditionError, match="not initialized"):
        state.store.pull()
    with pytest.raises(FailedPreconditionError):
        state.push(values(1), 0, 0)
    with pytest.raises(InvalidArgumentError, match="layer/biases.*expected float64 \\[4\\]"):
        state.store.initialize({**values(0), "layer/biases": np.zeros(3)})
    state.store.initialize(values(0), step=7)
    assert state.store.initialized and state.store.version == 7
    state.store.initialize(values(0), step=7)  # a retried request: no-op
    with pytest.raises(AlreadyExistsError):
        state.store.initialize(values(1), step=7)
    state.store.initialize(values(1), step=0, force=True)
    np.testing.assert_array_equal(state.store.pull()[1]["layer/biases"], values(1)["layer/biases"])


# --- pulls, checkpoints, reports -------------------------------------------------------------

def test_pull_is_a_read_only_snapshot():
    state = shard()
    version, snap = state.store.pull()
    kept = {n: v.copy() for n, v in snap.items()}
    state.push(values(1), 0, 0)
    for name, value in snap.items():
        np.testing.assert_array_equal(value, kept[name])
        assert not value.flags.writeable
    assert state.store.pull(newer_than=1) == (1, None)
    version, newer = state.store.pull(newer_than=0)
    assert version == 1 and not np.array_equal(newer["layer/biases"], kept["layer/biases"])
    one = state.store.pull(names=["layer/biases"])[1]
    assert list(one) == ["layer/biases"] and np.array_equal(one["layer/biases"], newer["layer/biases"])
    with pytest.raises(NotFoundError):
        state.store.pull(names=["nope"])


def test_checkpoint_round_trip_continues_identically():
    optimizer = {"kind": "adam", "learning_rate": 0.01}
    a = shard(optimizer)
    for step in range(3):
        a.push(values(step + 1), step, 0)
    step, vals, slots = a.store.snapshot_for_checkpoint()
    assert step == 3 and set(slots["layer/weights"]) == {"m", "v"}
    b = shard(optimizer, init=False)
    b.store.restore(vals, slots, step)
    with pytest.raises(InvalidArgumentError, match="slots"):
        b.store.restore(vals, {n: {} for n in PIECES}, step)
    for s in (a, b):
        s.push(values(9), 3, 0)
    for name, value in a.store.pull()[1].items():
        np.testing.assert_array_equal(value, b.store.pull()[1][name])


def test_config_and_stats_are_json():
    state = shard(mode="sync", replicas_to_aggregate=2, total_num_replicas=3)
    state.push(values(1), 0, 0)
    config = json.loads(json.dumps(state.config()))
    assert config["total_num_replicas"] == 3 and config["optimizer"]["kind"] == "sgd"
    assert config["pieces"]["layer/weights"] == {"shape": [3, 4], "dtype": "float64"}
    stats = json.loads(json.dumps(state.stats()))
    assert stats["pushes_received"] == 1 and stats["pushes_pending"] == 1 and stats["version"] == 0


# --- assign: non-trainable variables (BatchNorm's moving statistics) ---------------------

def test_assign_sets_values_without_the_optimizer_or_a_new_version():
    state = shard({"kind": "adam", "learning_rate": 0.1})
    before = current(state)
    new_biases = np.arange(4, dtype=np.float64)
    assert state.store.assign({"layer/biases": new_biases}) == 1
    version, after = state.store.pull()
    assert version == 0
    np.testing.assert_array_equal(after["layer/biases"], new_biases)              # exactly the value, no Adam step
    np.testing.assert_array_equal(after["layer/weights"], before["layer/weights"])
    with pytest.raises(InvalidArgumentError, match="does not hold: \\['other'\\]"):
        state.store.assign({"other": new_biases})
    with pytest.raises(InvalidArgumentError, match="assigned values"):
        state.store.assign({"layer/biases": np.zeros(5)})
    with pytest.raises(FailedPreconditionError):
        shard(init=False).store.assign({"layer/biases": new_biases})


# --- non-finite gradients ----------------------------------------------------------------------

def poisoned(seed, value=np.nan):
    grads = values(seed)
    grads["layer/weights"][1, 2] = value
    return grads


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_async_skips_a_non_finite_push_and_counts_it(bad):
    state = shard()
    before = current(state)
    result = state.push(poisoned(1, bad), 0, replica=0)
    assert (result.applied, result.dropped, result.reason) == (False, True, "nonfinite") and state.store.version == 0
    for name, value in current(state).items():
        np.testing.assert_array_equal(value, before[name])          # untouched, and finite
    assert state.push(values(2), 0, replica=0).applied and all(np.isfinite(v).all() for v in current(state).values())
    assert state.stats()["dropped"] == {"nonfinite": 1}


def test_sync_step_completes_from_the_finite_pushes_only():
    state = shard(mode="sync", replicas_to_aggregate=2)
    assert not state.push(poisoned(1), 0, replica=0).applied
    assert state.push(values(2), 0, replica=1).applied and state.store.version == 1   # no wait for the skipped replica
    expected = values(0)
    for name, value in current(state).items():       # the mean of the one finite push: values(2) itself
        np.testing.assert_allclose(value, expected[name] - 0.1 * values(2)[name], rtol=1e-12)
    assert state.stats()["dropped"] == {"nonfinite": 1}
    everyone_bad = shard(mode="sync", replicas_to_aggregate=2)
    everyone_bad.push(poisoned(1), 0, replica=0)
    assert everyone_bad.push(poisoned(2, np.inf), 0, replica=1).applied and everyone_bad.store.version == 1
    np.testing.assert_array_equal(current(everyone_bad)["layer/weights"], values(0)["layer/weights"])


def test_refuse_policy_fails_the_push_naming_the_piece_and_sparse_rows_are_checked_too():
    state = shard(nonfinite="refuse")
    with pytest.raises(InvalidArgumentError, match="gradient of 'layer/weights' holds NaN or Inf: refused"):
        state.push(poisoned(1), 0, replica=0)
    assert state.store.version == 0 and state.stats()["dropped"] == {"nonfinite": 1}
    skipping = shard()
    rows = np.array([[0.1, np.nan, 0.0, 0.0]])
    assert skipping.push_sparse("layer/weights", np.array([1]), rows, 0, replica=0).reason == "nonfinite"
    assert np.isfinite(current(skipping)["layer/weights"]).all()
    big = np.full((3, 4), np.finfo(np.float64).max / 2)          # a sum would overflow: every value is finite
    assert shard().push({"layer/weights": big, "layer/biases": np.zeros(4)}, 0, replica=0).reason is None
    with pytest.raises(InvalidArgumentError, match="nonfinite must be one of skip, refuse"):
        shard(nonfinite="ignore")


def test_a_lost_replica_lets_the_step_go_on_with_fewer_and_rejoins_when_heard_from():
    state = shard(mode="sync", replicas_to_aggregate=2)
    assert not state.push(values(1), 0, replica=0).applied and state.needed() == 2
    assert state.lose_replica(1).applied and state.store.version == 1 and state.needed() == 1   # the waiting step is applied
    np.testing.assert_allclose(current(state)["layer/biases"], values(0)["layer/biases"] - 0.1 * values(1)["layer/biases"])
    assert state.push(values(2), 1, replica=0).applied and state.store.version == 2          # one replica per step now
    assert state.waiting_for()["lost"] == [1]
    state.heard_from(1, now=0.0)
    assert state.needed() == 2 and not state.push(values(3), 2, replica=0).applied
