"""A layer model split into pipeline stages by its layers' worker tasks: the splits it refuses, and
micro-batches run stage by stage giving the whole batch's loss and gradients."""

import numpy as np
import pytest

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.layer_model import LayerModel
from zmqflow.models.layers import BatchNorm, Concatenate, Dense, Dropout, Input
from zmqflow.models.network import Network, Sequential
from zmqflow.models.stages import is_pipelined, split_stages, stage_count

pytestmark = pytest.mark.unit

T0, T1, T2 = "/job:worker/task:0", "/job:worker/task:1", "/job:worker/task:2"


def three_stage_model(dtype="float64", batch_norm=True):
    layers = [Dense(8, activation="tanh"), Dense(6, activation="gelu", device=T1)] + ([BatchNorm()] if batch_norm else [])
    layers += [Dense(5, activation="relu", device=T2), Dense(3)]
    return LayerModel(Sequential(layers, input_shape=(4,)), dtype=dtype, seed=3)


def test_layers_without_a_task_follow_the_layer_before_them():
    model = three_stage_model()
    stages = split_stages(model)
    assert [[layer.name for layer in s.layers] for s in stages] == [
        ["dense"], ["dense_1", "batch_normalization"], ["dense_2", "dense_3"]]
    assert stages[1].variable_names == ["dense_1/kernel", "dense_1/bias", "batch_normalization/gamma", "batch_normalization/beta",
                                        "batch_normalization/moving_mean", "batch_normalization/moving_variance"]
    assert [s.last for s in stages] == [False, False, True] and stage_count(model) == 3
    plain = LayerModel(Sequential([Dense(3, device="/cpu:0")], input_shape=(4,)))
    assert not is_pipelined(plain) and stage_count(plain) == 1


@pytest.mark.parametrize("devices, message", [
    ([T1, T0, T1], "dense_2 goes back to /job:worker/task:1"),
    ([T0, T2, None], r"worker tasks \[0, 2\]: they must be 0, 1"),
    (["/job:ps/task:0", T1, None], "names job 'ps'"),
])
def test_splits_that_cannot_run_as_a_pipeline_name_the_layer(devices, message):
    layers = [Dense(4, device=d) for d in devices]
    with pytest.raises(InvalidArgumentError, match=message):
        split_stages(LayerModel(Sequential(layers, input_shape=(4,))))


def test_a_network_that_is_not_a_chain_is_refused():
    a, b = Input((2,), name="a"), Input((3,), name="b")
    joined = Dense(2, device=T1)(Concatenate()([Dense(4, device=T0)(a), b]))
    with pytest.raises(InvalidArgumentError, match="must be a chain of layers"):
        split_stages(LayerModel(Network([a, b], joined)))


@pytest.mark.parametrize("micro_batches, batch_norm", [(1, True), (3, False)])
def test_micro_batches_through_the_stages_give_the_whole_batchs_loss_and_gradients(micro_batches, batch_norm):
    """Exactly, but for BatchNorm, which normalises each micro-batch by its own statistics (as in GPipe)."""
    model = three_stage_model(batch_norm=batch_norm)
    stages = split_stages(model)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((9, 4)), rng.integers(0, 3, 9)
    params = model.initial_values()
    want_loss, want, metrics = model.step(params, (x, y))
    grads, loss, updates = {}, 0.0, {}
    for rows in np.array_split(np.arange(9), micro_batches):
        a, tapes = x[rows], []
        for stage in stages:                                  # forward, stage by stage
            a, tape = stage.forward(params, a)
            tapes.append(tape)
            updates.update(tape.updates)
        loss += stages[-1].loss(tapes[-1], y[rows], len(rows) / 9)
        for k in reversed(range(len(stages))):                # backward, from the last stage
            own, upstream = stages[k].gradients(tapes[k])
            for name, g in own.items():
                grads[name] = grads.get(name, 0) + g
            if k:
                stages[k - 1].backward(tapes[k - 1], upstream)
    assert loss == pytest.approx(want_loss, rel=1e-10)
    assert set(grads) == set(want)
    for name, g in want.items():
        np.testing.assert_allclose(grads[name], g, rtol=1e-8, atol=1e-12, err_msg=name)
    assert set(updates) == set(metrics.get("updates", {}))


def test_dropout_in_a_stage_is_seeded_per_micro_batch():
    model = LayerModel(Sequential([Dense(16), Dropout(0.5, device=T1), Dense(2)], input_shape=(3,)), seed=1)
    stage = split_stages(model)[1]
    x, params = np.ones((4, 16), np.float32), model.initial_values()
    first, _ = stage.forward(params, x, seed=(1, 1, 0, 1))
    again, _ = stage.forward(params, x, seed=(1, 1, 0, 1))
    other, _ = stage.forward(params, x, seed=(1, 1, 1, 1))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
