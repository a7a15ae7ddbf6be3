"""A layer model split into pipeline stages by its layers' worker tasks, a chain or a DAG (branches and
joins): the splits it refuses, and micro-batches run stage by stage giving the whole batch's loss and
gradients."""

import os

import numpy as np
import pytest

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.layer_model import LayerModel
from zmqflow.models.layers import Add, BatchNorm, Concatenate, Dense, Dropout, Input
from zmqflow.models.network import Network, Sequential
from zmqflow.models.registry import load_model
from zmqflow.models.stages import is_pipelined, split_stages, stage_count, stage_links, start_order

pytestmark = pytest.mark.unit

T0, T1, T2, T3 = (f"/job:worker/task:{k}" for k in range(4))
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")


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


def branching_model(dtype="float64", join="concatenate"):
    """An input stage (task 0) feeding two parallel branches (tasks 1 and 2) that a join stage (task 3)
    concatenates or adds; the input stage's output also goes straight to the join (a skip edge)."""
    x = Input((4,), name="x")
    trunk = Dense(6, activation="tanh", device=T0)(x)
    left = Dense(5, activation="relu", device=T1)(trunk)
    left = Dense(5, activation="tanh")(left)                    # follows the layer it reads: task 1
    right = Dense(5, activation="gelu", device=T2)(trunk)
    joined = (Concatenate if join == "concatenate" else Add)(device=T3)([left, right])
    out = Dense(3)(Concatenate()([joined, trunk]))              # both on task 3
    return LayerModel(Network(x, out), dtype=dtype, seed=5)


def test_a_branching_model_splits_into_a_dag_of_stages():
    stages = split_stages(branching_model())
    assert [[layer.name for layer in s.layers] for s in stages] == [
        ["dense"], ["dense_1", "dense_2"], ["dense_3"], ["concatenate", "concatenate_1", "dense_4"]]
    assert [s.downstream for s in stages] == [[1, 2, 3], [3], [3], []]
    assert [s.upstream for s in stages] == [[], [0], [0], [0, 1, 2]]
    assert stages[0].output_names(1) == ["dense"] and stages[3].input_names(1) == ["dense_2"]
    assert [s.last for s in stages] == [False, False, False, True]
    assert [s.parent for s in stages] == [None, 0, 0, 0] and stages[0].children == [1, 2, 3]
    assert start_order({s.index: s.downstream for s in stages}) == [3, 1, 2, 0]
    assert stage_links(branching_model()) == {0: [1, 2, 3], 1: [3], 2: [3], 3: []}


def test_a_model_specs_pipeline_field_splits_a_model_built_without_device_strings():
    spec = {"type": "mlp", "layers": [4, 8, 6, 3], "dtype": "float64"}
    model = load_model({**spec, "pipeline": {"hidden2": 1, "softmax": 2}})
    assert [[layer.name for layer in s.layers] for s in split_stages(model)] == [["hidden1"], ["hidden2"], ["softmax"]]
    assert [v.device for v in model.variables()] == [None, None, T1, T1, T2, T2]
    plain = load_model(spec)                                     # the same model, on one worker
    x, y = np.random.default_rng(2).standard_normal((5, 4)), np.array([0, 1, 2, 1, 0])
    loss, grads, _ = run_stages(split_stages(model), plain.initial_values(), x, y, 2)
    want_loss, want, _ = plain.step(plain.initial_values(), (x, y))
    assert loss == pytest.approx(want_loss, rel=1e-10) and set(grads) == set(want)
    branches = load_model({"type": f"{EXAMPLES}/branching_model.py:build", "width": 8, "branch": 4, "pipelined": False,
                           "pipeline": {"dense_1": 1, "dense_2": 2, "concatenate": 3}})   # a file's functional model
    assert stage_links(branches) == {0: [1, 2], 1: [3], 2: [3], 3: []}


class NoLayers:
    """A model of the protocol without zmqflow's layers (as a JAX or PyTorch model is)."""

    def __init__(self, spec):
        pass

    def variables(self):
        return []

    def initial_values(self, seed=None):
        return {}

    def step(self, params, batch):
        return 0.0, {}, {}

    def predict(self, params, x):
        return x


@pytest.mark.parametrize("spec, message", [
    ({"type": "mlp", "layers": [4, 3], "pipeline": {"nope": 1}}, r"no layers \['nope'\] in the model \(its layers: "
                                                                 r"softmax\)"),
    ({"type": "mlp", "layers": [4, 3], "pipeline": [1]}, r"field 'pipeline' maps layer names to worker tasks"),
    ({"type": "mlp", "layers": [4, 5, 3], "pipeline": {"softmax": -1}}, r"maps layer names to worker tasks"),
    ({"type": "mlp", "layers": [4, 5, 3], "pipeline": {"softmax": 2}}, r"worker tasks \[0, 2\]: they must be 0, 1"),
    ({"type": "tests.model.test_pipeline_stages:NoLayers", "pipeline": {"a": 1}}, "a NoLayers has no layers to split"),
])
def test_a_bad_pipeline_field_is_named(spec, message):
    with pytest.raises(InvalidArgumentError, match=message):
        load_model(spec)


def test_a_later_stage_may_not_read_the_models_input():
    a, b = Input((2,), name="a"), Input((3,), name="b")
    joined = Dense(2, device=T1)(Concatenate()([Dense(4, device=T0)(a), b]))
    split_stages(LayerModel(Network([a, b], joined)))            # the concatenate follows dense: task 0
    late = Dense(2)(Concatenate(device=T1)([Dense(4, device=T0)(a), b]))
    with pytest.raises(InvalidArgumentError, match="layer concatenate on /job:worker/task:1 reads the model's "
                                                   "input 'b': only the input stage, task 0, reads inputs"):
        split_stages(LayerModel(Network([a, b], late)))


def test_branches_that_feed_each_other_back_are_a_cycle_naming_the_layer():
    x = Input((4,), name="x")
    first = Dense(4, device=T0)(x)
    there = Dense(4, device=T1)(first)
    back = Dense(4, device=T0)(there)                           # stage 1 -> stage 0, after 0 -> 1
    with pytest.raises(InvalidArgumentError, match="layer dense_2 goes back to /job:worker/task:0: stage 0 already "
                                                   "feeds stage 1"):
        split_stages(LayerModel(Network(x, Dense(2, device=T2)(Add()([back, there])))))


def test_a_tensor_sent_with_the_wrong_shape_names_the_stage():
    model = branching_model()
    stage = split_stages(model)[1]
    with pytest.raises(InvalidArgumentError, match=r"stage 1: tensor 'dense' from stage 0 has per-example shape "
                                                   r"\[7\], layer dense makes \[6\]"):
        stage.forward(model.initial_values(), {"dense": np.zeros((2, 7))})


def run_stages(stages, params, x, y, micro_batches):
    """Every stage in-process, micro-batch by micro-batch, as the workers do: forward in start order's
    reverse, backward with each stage's answers summed per tensor. Returns (loss, grads, updates)."""
    grads, loss, updates = {}, 0.0, {}
    order = list(reversed(start_order({s.index: s.downstream for s in stages})))
    for rows in np.array_split(np.arange(len(y)), micro_batches):
        tapes, inbox = {}, {s.index: {} for s in stages}
        for k in order:                                       # forward, each stage once its inputs are in
            out, tapes[k] = stages[k].forward(params, x[rows] if k == 0 else inbox[k])
            updates.update(tapes[k].updates)
            for target in stages[k].downstream:
                inbox[target].update({n: out[n] for n in stages[k].output_names(target)})
        answers = {s.index: {} for s in stages}
        for k in reversed(order):                             # backward, from the output stage
            if stages[k].last:
                loss += stages[k].loss(tapes[k], y[rows], len(rows) / len(y))
            else:
                stages[k].backward(tapes[k], answers[k])
            own, upstream = stages[k].gradients(tapes[k])
            for name, g in own.items():
                grads[name] = grads.get(name, 0) + g
            for source in stages[k].upstream:
                for n in stages[k].input_names(source):
                    answers[source][n] = answers[source].get(n, 0) + upstream[n]
    return loss, grads, updates


@pytest.mark.parametrize("join", ["concatenate", "add"])
def test_micro_batches_through_a_dag_of_stages_give_the_whole_batchs_loss_and_gradients(join):
    model = branching_model(join=join)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((7, 4)), rng.integers(0, 3, 7)
    params = model.initial_values()
    want_loss, want, _ = model.step(params, (x, y))
    loss, grads, _ = run_stages(split_stages(model), params, x, y, 2)
    assert loss == pytest.approx(want_loss, rel=1e-10)
    assert set(grads) == set(want)
    for name, g in want.items():
        np.testing.assert_allclose(grads[name], g, rtol=1e-8, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("micro_batches, batch_norm", [(1, True), (3, False)])
def test_micro_batches_through_the_stages_give_the_whole_batchs_loss_and_gradients(micro_batches, batch_norm):
    """Exactly, but for BatchNorm, which normalises each micro-batch by its own statistics (as in GPipe)."""
    model = three_stage_model(batch_norm=batch_norm)
    stages = split_stages(model)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((9, 4)), rng.integers(0, 3, 9)
    params = model.initial_values()
    want_loss, want, metrics = model.step(params, (x, y))
    loss, grads, updates = run_stages(stages, params, x, y, micro_batches)
    assert loss == pytest.approx(want_loss, rel=1e-10)
    assert set(grads) == set(want)
    for name, g in want.items():
        np.testing.assert_allclose(grads[name], g, rtol=1e-8, atol=1e-12, err_msg=name)
    assert set(updates) == set(metrics.get("updates", {}))


def test_dropout_in_a_stage_is_seeded_per_micro_batch():
    model = LayerModel(Sequential([Dense(16), Dropout(0.5, device=T1), Dense(2)], input_shape=(3,)), seed=1)
    stage = split_stages(model)[1]
    x, params = np.ones((4, 16), np.float32), model.initial_values()
    first = stage.forward(params, {"dense": x}, seed=(1, 1, 0, 1))[1].outputs["dense_1"].value
    again = stage.forward(params, {"dense": x}, seed=(1, 1, 0, 1))[1].outputs["dense_1"].value
    other = stage.forward(params, {"dense": x}, seed=(1, 1, 1, 1))[1].outputs["dense_1"].value
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
