"""`zmqflow train --data SPEC`: a CSV described by a data spec trains on real ps shards and workers,
and the final checkpoint is scored on the spec's test split; bad data or a model that cannot take it
fails before any process starts."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.inputs.test_data_spec import write_wide

pytestmark = pytest.mark.integration

SPEC = """
name: flowers
files: flowers.csv
split: {validation: 0.1, test: 0.2, seed: 0}
features:
  petal_len: numeric
  petal_wid: numeric
  colour: {type: categorical, vocabulary: [red, blue, white]}
label: {column: kind, task: multiclass}
"""


def write_flowers(directory, rows=900, seed=0):
    """Three kinds told apart by two measurements; the colour is noise. The label is the last column."""
    rng = np.random.default_rng(seed)
    lines = ["petal_len,petal_wid,colour,kind"]
    for _ in range(rows):
        kind = int(rng.integers(0, 3))
        lines.append(f"{1 + 1.5 * kind + rng.normal(0, 0.3):.3f},{0.3 + 0.7 * kind + rng.normal(0, 0.2):.3f},"
                     f"{['red', 'blue', 'white'][rng.integers(0, 3)]},{['setosa', 'versicolor', 'virginica'][kind]}")
    (directory / "flowers.csv").write_text("\n".join(lines) + "\n")
    (directory / "flowers.yaml").write_text(SPEC)
    return str(directory / "flowers.yaml")


def train(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "zmqflow", "train", "--json", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("model", ["mlp", "logistic"])
def test_a_csv_trains_and_is_scored_on_its_test_split(tmp_path, model):
    spec, checkpoint = write_flowers(tmp_path), str(tmp_path / "ckpt")
    done = train("--data", spec, "--model", model, "--epochs", "20", "--learning-rate", "0.02",
                 "--checkpoint-dir", checkpoint)        # 126 steps: 8 epochs (51 steps) once ended at 0.85
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["worker_exit_codes"] == [0, 0] and summary["test_split"] == "test"
    assert summary["test_metrics"]["accuracy"] > 0.9, summary          # the classes are well apart
    assert summary["examples"] == 20 * 630                              # 70 % of 900 rows, 20 epochs
    scored = subprocess.run([sys.executable, "-m", "zmqflow", "evaluate", "--checkpoint", checkpoint, "--data", spec,
                             "--json"], capture_output=True, text=True, timeout=120)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert json.loads(scored.stdout)["metrics"] == pytest.approx(summary["test_metrics"])


def test_bad_data_or_a_model_that_cannot_take_it_fails_before_anything_starts(tmp_path):
    spec = write_flowers(tmp_path)
    (tmp_path / "flowers.csv").write_text((tmp_path / "flowers.csv").read_text() + "1.0,0.2,red\n")
    done = train("--data", spec, timeout=60)
    assert done.returncode == 2 and "flowers.csv:902: malformed CSV line: expected 4 fields, got 3" in done.stderr
    write_flowers(tmp_path)
    done = train("--data", spec, "--model", "linear", timeout=60)
    assert done.returncode == 2 and "a multiclass label needs a model of your own or mlp, logistic, cnn" in done.stderr


def test_predict_writes_each_rows_class_and_probabilities_from_a_file_without_labels(tmp_path):
    spec, checkpoint = write_flowers(tmp_path), str(tmp_path / "ckpt")
    done = train("--data", spec, "--epochs", "20", "--learning-rate", "0.02", "--checkpoint-dir", checkpoint)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (tmp_path / "flowers.csv").read_text().splitlines()
    (tmp_path / "new.csv").write_text("\n".join(",".join(line.split(",")[:3]) for line in lines) + "\n")
    out = tmp_path / "predictions.csv"
    predicted = subprocess.run([sys.executable, "-m", "zmqflow", "predict", "--checkpoint", checkpoint, "--input",
                                str(tmp_path / "new.csv"), "--out", str(out)], capture_output=True, text=True,
                               timeout=120)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    rows = out.read_text().splitlines()
    assert rows[0] == "class,p_setosa,p_versicolor,p_virginica" and len(rows) == len(lines)
    truth = [line.split(",")[3] for line in lines[1:]]
    assert np.mean([r.split(",")[0] == t for r, t in zip(rows[1:], truth)]) > 0.9
    assert all(abs(sum(map(float, r.split(",")[1:])) - 1) < 1e-4 for r in rows[1:])
    mnist_checkpoint = str(tmp_path / "mnist")
    assert train("--epochs", "1", "--checkpoint-dir", mnist_checkpoint).returncode == 0
    refused = subprocess.run([sys.executable, "-m", "zmqflow", "predict", "--checkpoint", mnist_checkpoint, "--input",
                              str(tmp_path / "new.csv")], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "records no data spec (it was not trained with --data)" in refused.stderr


def test_a_spec_that_names_only_its_label_trains_on_a_64_column_csv_and_predicts_by_column_name(tmp_path):
    """Every column by name: 62 features typed from the train split (60 numbers, a text, digits taken as
    categories), the label's classes written `[no, yes]` in YAML; the checkpoint records the features, so
    predict reads a file without the label by column name."""
    spec, checkpoint = write_wide(tmp_path, rows=400), str(tmp_path / "ckpt")
    (tmp_path / "wide.yaml").write_text((tmp_path / "wide.yaml").read_text().replace(
        "label: answer", "label: {column: answer, task: binary, classes: [no, yes]}"))
    done = train("--data", spec, "--model", "logistic", "--epochs", "30", "--learning-rate", "0.05",
                 "--checkpoint-dir", checkpoint)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["test_metrics"]["accuracy"] > 0.8, summary
    lines = (tmp_path / "wide.csv").read_text().splitlines()
    (tmp_path / "new.csv").write_text("\n".join(",".join(line.split(",")[:-1]) for line in lines) + "\n")
    predicted = subprocess.run([sys.executable, "-m", "zmqflow", "predict", "--checkpoint", checkpoint, "--input",
                                str(tmp_path / "new.csv"), "--out", str(tmp_path / "predictions.csv")],
                               capture_output=True, text=True, timeout=120)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    rows = (tmp_path / "predictions.csv").read_text().splitlines()
    assert rows[0] == "class,p_no,p_yes" and len(rows) == len(lines)
    truth = [line.split(",")[-1] for line in lines[1:]]
    assert np.mean([r.split(",")[0] == t for r, t in zip(rows[1:], truth)]) > 0.8


def test_validation_while_training_keeps_the_best_checkpoint_and_writes_the_summary(tmp_path):
    write_flowers(tmp_path, rows=20000)
    checkpoint, summary_file = tmp_path / "ckpt", tmp_path / "summary.json"
    done = train("--data", str(tmp_path / "flowers.yaml"), "--epochs", "12", "--learning-rate", "0.01",
                 "--checkpoint-dir", str(checkpoint), "--validate-every-steps", "100", "--json-out", str(summary_file))
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(summary_file.read_text())
    assert summary["validation_metric"] == "accuracy" and summary["best_validation"]["accuracy"] > 0.9
    assert summary["validation"]["step"] == summary["global_step"]           # the final parameters, validated
    assert set(summary["test_metrics"]) == {"accuracy", "log_loss", "macro_f1"}
    assert {"examples_per_s", "wall_seconds", "global_step"} <= set(summary)
    assert any(p.name.startswith("ckpt-") for p in (checkpoint / "best").iterdir())
    scored = subprocess.run([sys.executable, "-m", "zmqflow", "evaluate", "--checkpoint", str(checkpoint / "best"),
                             "--data", str(tmp_path / "flowers.yaml"), "--split", "validation", "--json"],
                            capture_output=True, text=True, timeout=120)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert json.loads(scored.stdout)["metrics"]["accuracy"] == pytest.approx(summary["best_validation"]["accuracy"])


EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")


@pytest.mark.parametrize("example, expected", [
    ("tabular_csv.py", "two new wines graded ['high', 'low']"),   # local_cluster, validation, zmqflow.serve
    ("regression_csv.py", "regression_csv: test RMSE"),      # a model file fitted to the data, a regression
    ("multi_label.py", "multi_label: per-tag test accuracy"),  # sigmoid cross-entropy over label columns
])
def test_the_data_examples_run_from_python(example, expected):
    done = subprocess.run([sys.executable, os.path.join(EXAMPLES, example)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and expected in done.stdout, done.stdout + done.stderr[-3000:]


def test_early_stopping_ends_every_worker_once_validation_stops_improving(tmp_path):
    write_flowers(tmp_path, rows=20000)
    summary_file = tmp_path / "summary.json"
    done = train("--data", str(tmp_path / "flowers.yaml"), "--epochs", "60", "--learning-rate", "0.01",
                 "--checkpoint-dir", str(tmp_path / "ckpt"), "--validate-every-steps", "50",
                 "--early-stop-patience", "3", "--json-out", str(summary_file))
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(summary_file.read_text())
    assert summary["stopped_early_at"] is not None and summary["worker_exit_codes"] == [0, 0]
    assert summary["global_step"] < 60 * 140 / 2              # far short of the 8,400 steps of 60 epochs
    assert summary["best_validation"]["accuracy"] > 0.9 and summary["test_metrics"]["accuracy"] > 0.9


@pytest.mark.parametrize("input_kind", ["readers", "ps"])
def test_every_input_mode_trains_a_csv_data_spec(tmp_path, input_kind):
    """No MNIST path: reader processes stream the CSV, or ps 0 holds its prepared rows; each task started
    with the --config its launcher rendered from the job's spec."""
    spec = write_flowers(tmp_path)
    done = train("--data", spec, "--input", input_kind, "--epochs", "20", "--learning-rate", "0.02",
                 "--backend", "numpy")   # as above: 10 epochs (63 steps) once ended at 0.65 with readers' order
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["worker_exit_codes"] == [0, 0] and summary["examples"] == 20 * 630
    assert summary["test_split"] == "test" and summary["test_metrics"]["accuracy"] > 0.9, summary
    logs = summary["log_dir"]
    chief = json.loads(open(os.path.join(logs, "worker0.json")).read())   # batch: a tenth of the 630 train rows
    assert chief["data-config"] == os.path.join(logs, "prepared", "data-config.json") and chief["batch-size"] == 63
    assert ("preloaded" in chief) == (input_kind == "ps") and os.path.exists(os.path.join(logs, "reader0.json")) == (
        input_kind == "readers")


def write_diabetes_like(directory, rows=442, seed=0, interaction=6):
    """The shape of issue 24's public regression set: 10 features on their own scales, a target of
    about 150 +- 50 that a model must not be left to find from zero; mostly linear, with noise, and an
    interaction of two features (`interaction`: its scale) that no linear model can fit."""
    rng = np.random.default_rng(seed)
    scales, centres = np.array([13, .5, 4.4, 14, 35, 30, 13, 1.3, .5, 11]), np.array([48, 1.5, 26, 95, 189, 115, 50,
                                                                                        4, 4.6, 91])
    z = rng.standard_normal((rows, 10))
    y = 152 + z @ np.array([2, -11, 25, 15, -10, 5, -8, 7, 22, 3]) + \
        interaction * np.sin(1.5 * z[:, 2]) * z[:, 8] + rng.normal(0, 30, rows)
    lines = [",".join(f"f{i}" for i in range(10)) + ",target"]
    lines += [",".join(f"{v:.4f}" for v in row) + f",{t:.2f}" for row, t in zip(centres + scales * z, y)]
    (directory / "reg.csv").write_text("\n".join(lines) + "\n")
    (directory / "reg.yaml").write_text("files: reg.csv\nsplit: {test: 0.2, seed: 0}\nfeatures:\n" +
                                        "".join(f"  f{i}: numeric\n" for i in range(10)) +
                                        "label: {column: target, task: regression}\n")
    return str(directory / "reg.yaml")


def splits(spec):
    """(train, test) of a data spec, prepared with its train split's statistics as training prepares them."""
    from zmqflow.inputs.data_spec import fit, load_spec, load_tables, prepare
    data = load_spec(spec)
    tables = load_tables(data)
    fit(data, tables["train"])
    return prepare(data, tables["train"]), prepare(data, tables["test"])


def least_squares_rmse(spec):
    """(scikit-learn's LinearRegression's test RMSE, the train mean's) on the spec's split."""
    from sklearn.linear_model import LinearRegression
    train_split, test_split = splits(spec)
    least_squares = LinearRegression().fit(train_split.x, train_split.y)
    return (float(np.sqrt(np.mean((least_squares.predict(test_split.x) - test_split.y) ** 2))),
            float(np.sqrt(np.mean((train_split.y.mean() - test_split.y) ** 2))))


def test_a_regression_trains_as_well_as_least_squares_with_the_defaults(tmp_path):
    """Issue 24: `--model linear --epochs 100` scored RMSE 167 where the mean scores 72 and least squares
    58.5. The target is standardised on the train split and answered back in its units (mlp regressing:
    tests/model/test_fitted_head.py)."""
    spec, checkpoint = write_diabetes_like(tmp_path), str(tmp_path / "ckpt")
    baseline, mean_only = least_squares_rmse(spec)
    done = train("--data", spec, "--model", "linear", "--epochs", "300", "--checkpoint-dir", checkpoint)
    assert done.returncode == 0, done.stderr[-3000:]
    rmse = json.loads(done.stdout.strip().splitlines()[-1])["test_metrics"]["rmse"]
    assert rmse <= baseline * 1.005, (rmse, baseline)          # least squares' fit, by the defaults' Adam
    (tmp_path / "new.csv").write_text("\n".join(",".join(line.split(",")[:10]) for line in
                                                (tmp_path / "reg.csv").read_text().splitlines()) + "\n")
    out = tmp_path / "predictions.csv"
    predicted = subprocess.run([sys.executable, "-m", "zmqflow", "predict", "--checkpoint", checkpoint, "--input",
                                str(tmp_path / "new.csv"), "--out", str(out)], capture_output=True, text=True,
                               timeout=120)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    values = np.array([float(r) for r in out.read_text().splitlines()[1:]])
    truth = np.array([float(line.rsplit(",", 1)[1]) for line in (tmp_path / "reg.csv").read_text().splitlines()[1:]])
    assert np.sqrt(np.mean((values - truth) ** 2)) < min(baseline * 1.1, mean_only)   # in the target's units


def test_the_defaults_and_only_epochs_fit_a_regression_at_least_as_well_as_least_squares(tmp_path):
    """Issue 24's done-when: `zmqflow train --data SPEC --epochs N`, nothing else (the mlp fitted to the data, 1 ps
    and 2 async workers, Adam 0.004). The target is the diabetes-like one with an interaction of two features
    that least squares cannot fit. Measured, 20 epochs: RMSE 38.9-39.0 in 5 of 5 runs against least squares'
    43.1 (the margin asserted: 5 %); the defaults before (the seeds' sigmoid MLP from a truncated normal of
    stddev 0.1, batches of 100, a constant rate) 43.9-46.9, and 44-71 after 100 epochs."""
    spec = write_diabetes_like(tmp_path, interaction=40)
    baseline, _ = least_squares_rmse(spec)
    done = train("--data", spec, "--epochs", "20")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["test_metrics"]["rmse"] <= 0.95 * baseline, (summary["test_metrics"], baseline)
    logs = summary["log_dir"]
    model = json.loads(open(os.path.join(logs, "prepared", "model.json")).read())
    assert (model["activation"], model["init"], model["layers"]) == ("relu", "glorot_uniform", [10, 100, 1])
    assert json.loads(open(os.path.join(logs, "worker0.json")).read())["batch-size"] == 36     # 354 train rows
    assert summary["global_step"] == 197 and summary["optimizer"]["learning_rate"] == {       # 7,080 rows / 36
        "kind": "polynomial_decay", "learning_rate": 0.004, "decay_steps": 197, "end_learning_rate": 0.0001}


def test_the_readme_tour_trains_the_shipped_flowers_as_well_as_scikit_learn(tmp_path):
    """The README's first training, as it is written: `--model mlp --epochs 20` on examples/data/flowers.yaml
    (210 train rows, three kinds). It scored 0.28-0.62 test accuracy with the seeds' MLP in 42 steps of 100
    rows; now 1.0 in 200 steps of 21 (5 of 5 runs), as scikit-learn's LogisticRegression and MLPClassifier
    score on the same split."""
    from sklearn.linear_model import LogisticRegression
    spec = os.path.join(EXAMPLES, "data", "flowers.yaml")
    train_split, test_split = splits(spec)
    logistic = LogisticRegression(max_iter=1000).fit(train_split.x, train_split.y).score(test_split.x, test_split.y)
    done = train("--data", spec, "--model", "mlp", "--epochs", "20", "--checkpoint-dir", str(tmp_path / "ckpt"))
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["test_metrics"]["accuracy"] >= logistic - 0.05, (summary["test_metrics"], logistic)   # 3 of 60


def test_a_model_whose_output_disagrees_with_the_data_or_a_misspelt_model_is_refused(tmp_path):
    spec = write_flowers(tmp_path)
    (tmp_path / "ten.py").write_text(
        "from zmqflow.models.layer_model import LayerModel\n"
        "from zmqflow.models.layers import Dense\n"
        "from zmqflow.models.network import Sequential\n"
        "def build(input_signature):\n"
        "    (shape, _), = input_signature.values()\n"
        "    return LayerModel(Sequential([Dense(10)], input_shape=shape))\n")
    done = train("--data", spec, "--model", f"{tmp_path}/ten.py:build", timeout=60)
    assert done.returncode == 2, done.stderr[-3000:]
    assert ("the model's output is 10 wide, but the data's multiclass label (kind) needs 3: 3 classes "
            "['setosa', 'versicolor', 'virginica']") in done.stderr
    done = train("--data", spec, "--model", "mlpp", timeout=60)
    assert done.returncode == 2 and "model 'mlpp' is not known: did you mean 'mlp'?" in done.stderr, done.stderr


def test_a_module_in_the_current_directory_is_a_model_and_learns_the_classes(tmp_path):
    """`--model my_module:build`, as deploy/user/README.md writes it; build declares `outputs`."""
    spec = write_flowers(tmp_path)
    (tmp_path / "flower_model.py").write_text(
        "from zmqflow.models.layer_model import LayerModel\n"
        "from zmqflow.models.layers import Dense\n"
        "from zmqflow.models.network import Sequential\n"
        "def build(input_signature, outputs, hidden=16):\n"
        "    (shape, _), = input_signature.values()\n"
        "    return LayerModel(Sequential([Dense(hidden, 'relu'), Dense(outputs)], input_shape=shape))\n")
    done = subprocess.run([sys.executable, "-m", "zmqflow", "train", "--json", "--data", spec, "--model",
                           "flower_model:build", "--epochs", "10", "--learning-rate", "0.02"], capture_output=True,
                          text=True, timeout=240, cwd=tmp_path, env={**os.environ, "PYTHONSAFEPATH": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["test_metrics"]["accuracy"] > 0.9, summary


def test_a_job_runs_until_it_ends_unless_given_a_time_limit(tmp_path):
    import inspect

    from zmqflow.jobs.job import Job
    from zmqflow.jobs.local_cluster import LocalCluster
    assert all(inspect.signature(f).parameters["timeout"].default is None for f in (LocalCluster.wait, Job.wait,
                                                                                   Job.run))
    done = train("--data", write_flowers(tmp_path), "--epochs", "100000", "--timeout-secs", "2", timeout=120)
    assert done.returncode == 1 and "the job did not finish within 2 s, the time limit it was given" in done.stderr
