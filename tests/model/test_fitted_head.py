"""What the train split gives a model (issue 24's defaults that failed quietly): a regression's target
standardised and answered back in its own units, output biases from the class priors or the target's
mean, mlp and cnn fitted to any task, the task passed to a model file's build, `module:build` and a
"did you mean" for a misspelt model; and what a small split gets to train well by default: Keras' Dense
initialisation, a batch of at most a tenth of its rows, a learning rate that decays over the job's steps
(tests/integration/test_train_on_data.py trains with them)."""

import numpy as np
import pytest

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.inputs.data_spec import DataSpec, Table, fit, model_for_data
from zmqflow.models.registry import load_model
from zmqflow.inputs.data_spec import is_mnist_sample, load_spec
from zmqflow.jobs.spec import ClusterConfig, JobSpec, TrainConfig, batch_size_for, decayed_optimizer
from zmqflow.models.spec import DATA_MLP, MNIST_MLP, read_spec, resolve_model, with_options

pytestmark = pytest.mark.unit


def fitted(rows, task="regression", normalize=True, label_columns=("y",)):
    """A DataSpec over `rows` ({column: values}) of two numeric features, fitted on them."""
    spec = DataSpec({"files": "unused.csv", "features": {"a": "numeric", "b": "numeric"}, "normalize": normalize,
                     "label": {"columns": list(label_columns), "task": task}})
    n = len(next(iter(rows.values())))
    table = Table({k: np.asarray(v) for k, v in rows.items()}, ["unused.csv"], np.zeros((n, 2), np.int64))
    fit(spec, table)
    return spec


def regression(n=200, seed=0):
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=n), rng.normal(size=n)
    return {"a": a, "b": b, "y": 500.0 + 80.0 * a - 30.0 * b}


def test_a_regression_target_is_standardised_and_answered_in_its_own_units():
    data = fitted(regression())
    mean, std = data.stats["target"]
    assert mean == pytest.approx(500, abs=15) and std == pytest.approx(85, rel=0.15)
    spec = model_for_data(data, resolve_model("mlp"))       # the MNIST MLP, fitted: a regressor now
    assert spec["layers"] == [2, 100, 1] and spec["loss"] == "mse"
    assert spec["target_scale"] == {"mean": [mean], "std": [std]} and "output_bias" not in spec
    model = load_model(spec)
    params = model.initial_values()
    x = np.zeros((4, 2), np.float32)
    raw = params["output/biases"] + np.zeros(4)           # the network's output at x = 0, weights aside
    hidden = 1 / (1 + np.exp(-params["hidden/biases"]))
    raw = raw + hidden @ params["output/weights"][:, 0]
    np.testing.assert_allclose(model.predict(params, x)[:, 0], raw * std + mean, rtol=1e-5)
    y = np.full(4, mean + 2 * std, np.float32)            # two deviations above the mean: 2 after standardising
    loss, _, _ = model.step(params, (x, y))
    assert loss == pytest.approx(np.mean((raw - 2) ** 2), rel=1e-4)


def test_standardised_training_reaches_the_least_squares_fit():
    data = fitted(regression())
    model = load_model(model_for_data(data, {"type": "linear"}))
    rows = regression()
    x = np.stack([(rows[c] - data.stats["numeric"][c][0]) / data.stats["numeric"][c][1] for c in "ab"], 1)
    x, y = x.astype(np.float32), rows["y"].astype(np.float32)
    params = model.initial_values()
    for _ in range(300):
        _, grads, _ = model.step(params, (x, y))
        for name, g in grads.items():
            params[name] -= 0.3 * g                        # plain SGD at a rate that suits a unit-scale target
    rmse = float(np.sqrt(np.mean((model.predict(params, x)[:, 0] - y) ** 2)))
    assert rmse < 0.01, rmse                              # the data is exactly linear


def test_without_normalize_the_output_bias_starts_at_the_target_mean():
    data = fitted(regression(), normalize=False)
    spec = model_for_data(data, {"type": "linear"})
    assert "target_scale" not in spec and spec["output_bias"] == [pytest.approx(data.stats["target"][0])]
    model = load_model(spec)
    np.testing.assert_allclose(model.initial_values()["dense/bias"], [data.stats["target"][0]], rtol=1e-6)
    assert model.target_scale is None


def test_a_classifier_starts_at_its_class_priors():
    labels = np.array(["a"] * 80 + ["b"] * 15 + ["c"] * 5)
    data = fitted({"a": np.arange(100.0), "b": np.ones(100), "y": labels}, task="multiclass")
    assert data.stats["priors"] == [0.8, 0.15, 0.05]
    model = load_model(model_for_data(data, resolve_model("mlp")))
    bias = model.initial_values()["softmax/biases"]
    logits = bias - bias.max()
    np.testing.assert_allclose(np.exp(logits) / np.exp(logits).sum(), [0.8, 0.15, 0.05], rtol=1e-5)


def test_mlp_and_cnn_fit_a_regression_and_logistic_still_refuses_it():
    data = fitted(regression())
    cnn = model_for_data(data, {"type": "cnn", "image": [2, 1, 1], "filters": [2], "kernel_size": 1, "dense": 4})
    assert cnn["outputs"] == 1 and cnn["loss"] == "mse"
    assert load_model(cnn).output_shape() == (1,)
    with pytest.raises(InvalidArgumentError, match="a regression label needs a model of your own or mlp, cnn, "
                                                   "linear; logistic classifies"):
        model_for_data(data, {"type": "logistic"})
    with pytest.raises(InvalidArgumentError, match="loss=softmax_cross_entropy does not fit a regression label"):
        model_for_data(data, {**resolve_model("mlp"), "loss": "softmax_cross_entropy"})


def test_a_model_file_gets_the_task_when_its_build_declares_it(tmp_path):
    (tmp_path / "new.py").write_text(
        "from zmqflow.models.layer_model import LayerModel\n"
        "from zmqflow.models.layers import Dense\n"
        "from zmqflow.models.network import Sequential\n"
        "seen = {}\n"
        "def build(input_signature, outputs, task='multiclass', width=4):\n"
        "    seen.update(outputs=outputs, task=task)\n"
        "    (shape, _), = input_signature.values()\n"
        "    loss = 'mse' if task == 'regression' else 'softmax_cross_entropy'\n"
        "    return LayerModel(Sequential([Dense(width, 'relu'), Dense(outputs)], input_shape=shape), loss=loss)\n"
        "def old(input_signature, width=4):\n"
        "    return build(input_signature, 7, width=width)\n")
    data = fitted(regression())
    spec = model_for_data(data, {"type": f"{tmp_path}/new.py:build", "width": 3})
    assert spec["outputs"] == 1 and spec["task"] == "regression" and spec["target_scale"]
    model = load_model(spec)
    assert model.output_shape() == (1,) and model.target_scale is not None
    old = load_model(model_for_data(data, {"type": f"{tmp_path}/new.py:old"}))   # a one-argument build, as before
    assert old.output_shape() == (7,)


def test_a_module_function_is_a_model(tmp_path, monkeypatch):
    (tmp_path / "my_shop_model.py").write_text(
        "from zmqflow.models.layer_model import LayerModel\n"
        "from zmqflow.models.layers import Dense\n"
        "from zmqflow.models.network import Sequential\n"
        "def build(input_signature, outputs=10):\n"
        "    (shape, _), = input_signature.values()\n"
        "    return LayerModel(Sequential([Dense(outputs)], input_shape=shape))\n")
    monkeypatch.chdir(tmp_path)                   # found in the current directory, as `zmqflow train` looks
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    assert read_spec("my_shop_model:build") == {"type": "my_shop_model:build"}
    model = load_model({"type": "my_shop_model:build", "input_signature": {"input": [[5], "float32"]},
                        "outputs": 3})
    assert model.output_shape() == (3,)
    with pytest.raises(InvalidArgumentError, match="module 'no_such_shop' cannot be imported .* current directory"):
        load_model({"type": "no_such_shop:build"})
    with pytest.raises(InvalidArgumentError, match="has no 'bild'"):
        load_model({"type": "my_shop_model:bild"})


@pytest.mark.parametrize("text, message", [
    ("mlpp", "model 'mlpp' is not known: did you mean 'mlp'\\? A model is a built-in model \\(mlp, cnn, logistic, "
             "linear\\), a function in your file \\(path/model.py:build\\)"),
    ("CNN", "did you mean 'cnn'"),
    ("resnet", "model 'resnet' is not known: A model is a built-in model"),
    ("examples/my_model.py", "names a file but not its function: give path/model.py:build"),
    ("[1, 2]", "is not a model spec \\(it reads as a list\\)"),
])
def test_a_string_that_names_no_model_says_what_would(text, message):
    with pytest.raises(InvalidArgumentError, match=message):
        read_spec(text)


def test_mlp_fitted_to_your_data_starts_from_keras_dense_defaults_and_the_mnist_sample_keeps_the_seeds():
    for spec in (resolve_model("mlp", data_mlp=True), resolve_model(None, data_mlp=True)):
        assert spec == DATA_MLP and spec["activation"] == "relu" and spec["init"] == "glorot_uniform"
    assert resolve_model("mlp") == resolve_model(None) == MNIST_MLP            # the MNIST sample's documented MLP
    assert with_options(resolve_model("mlp", data_mlp=True), ["activation=sigmoid"])["activation"] == "sigmoid"
    assert resolve_model("linear", data_mlp=True) == {"type": "linear"}       # only mlp has a data preset
    assert is_mnist_sample(load_spec("mnist")) and not is_mnist_sample(fitted(regression()))
    values = load_model(model_for_data(fitted(regression()), resolve_model("mlp", data_mlp=True))).initial_values()
    limit = np.sqrt(6 / (2 + 100))                                            # glorot_uniform of a 2 -> 100 kernel
    kernel = values["hidden/weights"]
    assert np.abs(kernel).max() <= limit and kernel.std() == pytest.approx(limit / np.sqrt(3), rel=0.15)   # uniform
    assert not values["hidden/biases"].any()


def test_a_small_train_split_gets_ten_steps_an_epoch_and_mnist_keeps_batches_of_100():
    assert [batch_size_for(rows) for rows in (1, 70, 210, 354, 999, 1000, 4500, 60000)] == \
        [1, 7, 21, 36, 100, 100, 100, 100]


def test_the_learning_rate_decays_over_the_jobs_global_steps_unless_turned_off_or_a_schedule_of_your_own():
    spec = JobSpec(training=TrainConfig(epochs=20, batch_size=36))
    assert decayed_optimizer(spec, 354) == {"kind": "adam", "learning_rate": {         # 7,080 rows: 197 batches
        "kind": "polynomial_decay", "learning_rate": 0.004, "decay_steps": 197, "end_learning_rate": 0.0001}}
    sync = JobSpec(ClusterConfig(workers=2, mode="sync"), training=TrainConfig(epochs=20, batch_size=36))
    assert decayed_optimizer(sync, 354)["learning_rate"]["decay_steps"] == 98         # two batches a global step
    small = JobSpec(training=TrainConfig(optimizer={"kind": "sgd", "learning_rate": 0.00005}, batch_size=100))
    assert decayed_optimizer(small, 1000)["learning_rate"]["end_learning_rate"] == 0.00005   # never above the rate
    off = JobSpec(training=TrainConfig(learning_rate_decay=False))
    assert decayed_optimizer(off, 354) == {"kind": "adam", "learning_rate": 0.004}
    own = {"kind": "adam", "learning_rate": {"kind": "exponential_decay", "learning_rate": 0.01, "decay_steps": 10,
                                              "decay_rate": 0.5}}
    assert decayed_optimizer(JobSpec(training=TrainConfig(optimizer=own)), 354) == own
