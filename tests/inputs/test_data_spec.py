"""Data specs: a CSV or .npz described in YAML becomes splits, model inputs and labels; every bad input
is an error naming the file, line and column (or a counted skip when the spec asks for it)."""

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from zmqflow.cli.main import main
from zmqflow.common.errors import InvalidArgumentError, NotFoundError
from zmqflow.inputs.data_spec import (fit, from_config, input_signature, inspect, load_spec, load_tables, prepare,
                                       to_config)

pytestmark = pytest.mark.unit

HEADER = "petal_len,petal_wid,colour,species\n"
ROWS = ["1.0,0.2,red,setosa", "4.5,1.4,blue,versicolor", "6.0,2.1,white,virginica", "1.2,0.3,red,setosa",
        "4.1,1.2,red,versicolor", "5.8,2.2,blue,virginica", "1.4,0.1,white,setosa", "4.7,1.5,blue,versicolor",
        "6.3,2.4,red,virginica", "1.1,0.2,blue,setosa"]
FEATURES = {"petal_len": "numeric", "petal_wid": {"type": "numeric"},
            "colour": {"type": "categorical", "vocabulary": ["red", "blue"]}}


def spec_for(tmp_path, rows=ROWS, header=HEADER, **fields):
    (tmp_path / "flowers.csv").write_text(header + "".join(r + "\n" for r in rows))
    raw = {"files": "flowers.csv", "features": FEATURES, "label": {"column": "species"}, **fields}
    (tmp_path / "flowers.yaml").write_text(json.dumps(raw))
    return load_spec(str(tmp_path / "flowers.yaml"))


def test_a_csv_with_a_header_becomes_normalised_inputs_one_hot_categories_and_class_ids(tmp_path):
    spec = spec_for(tmp_path, split={"test": 0.2, "seed": 1})
    tables = load_tables(spec)
    assert {k: len(t) for k, t in tables.items()} == {"train": 8, "test": 2}
    stats = fit(spec, tables["train"])
    assert stats["classes"] == ["setosa", "versicolor", "virginica"]
    assert input_signature(spec) == {"input": ((5,), "float32")}       # 2 numeric + red, blue, unknown
    train = prepare(spec, tables["train"])
    assert train.x.shape == (8, 5) and train.x.dtype == np.float32
    np.testing.assert_allclose(train.x[:, 0].mean(), 0, atol=1e-6)      # standardised on the train split
    np.testing.assert_allclose(train.x[:, 0].std(), 1, atol=1e-5)
    white = [i for i, row in enumerate(tables["train"].columns["colour"]) if row == b"white"]
    assert train.x[white, 2:].tolist() == [[0, 0, 1]] * len(white)      # out of the vocabulary: its own slot
    test = prepare(spec, tables["test"])
    assert set(test.y) <= {0, 1, 2} and len(test.y) == 2


def test_ids_for_an_embedding_regression_and_multi_label_tasks(tmp_path):
    (tmp_path / "houses.csv").write_text("size,town,price,garden,pool\n" + "".join(
        f"{50 + i},t{i % 3},{100 + 2 * i},{i % 2},{(i // 2) % 2}\n" for i in range(12)))
    spec = load_spec({"files": str(tmp_path / "houses.csv"), "features": {
        "size": "numeric", "town": {"type": "categorical", "hash_buckets": 5, "encode": "ids"}},
        "label": {"column": "price", "task": "regression"}})
    tables = load_tables(spec)
    fit(spec, tables["train"])
    prepared = prepare(spec, tables["train"])
    assert input_signature(spec) == {"input": ((1,), "float32"), "town": ((1,), "int64")}
    assert prepared.x["town"].dtype == np.int64 and prepared.x["town"].max() < 5
    assert prepared.y.dtype == np.float32 and prepared.y[3] == 106
    multi = load_spec({"files": str(tmp_path / "houses.csv"), "features": {"size": "numeric"},
                       "label": {"columns": ["garden", "pool"], "task": "multi_label"}})
    fit(multi, load_tables(multi)["train"])
    assert prepare(multi, load_tables(multi)["train"]).y.shape == (12, 2)


def test_npz_arrays_and_images(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "digits.npz", pixels=rng.random((20, 64)).astype(np.float32), digit=rng.integers(0, 4, 20))
    spec = load_spec({"source": {"format": "npz"}, "files": str(tmp_path / "digits.npz"),
                      "features": {"pixels": {"type": "image", "shape": [8, 8, 1]}}, "label": "digit"})
    tables = load_tables(spec)
    fit(spec, tables["train"])
    assert input_signature(spec) == {"input": ((8, 8, 1), "float32")}
    assert prepare(spec, tables["train"]).x.shape == (20, 8, 8, 1)


def test_the_built_in_mnist_spec_is_the_shipped_split():
    spec = load_spec("mnist")
    tables = load_tables(spec)
    fit(spec, tables["train"])
    assert {k: len(t) for k, t in tables.items()} == {"train": 4500, "test": 500}
    assert input_signature(spec) == {"input": ((784,), "float32")} and prepare(spec, tables["test"]).y[-1] == 9


@pytest.mark.parametrize("rows, header, fields, error, message", [
    (ROWS, HEADER, {"files": "nothing*.csv"}, NotFoundError, r"files.train: 'nothing\*.csv' matches no file"),
    (ROWS, "petal_len,petal_wid,color,species\n", {}, InvalidArgumentError,
     r"column\(s\) \['colour'\] named in the data spec are not in the file \(its columns: petal_len, petal_wid, color"),
    (ROWS[:3] + ["1.3,0.2,red,rose"], HEADER, {}, InvalidArgumentError, None),
    (ROWS[:2] + ["1.3,0.2,red"], HEADER, {}, InvalidArgumentError,
     r"flowers.csv:4: malformed CSV line: expected 4 fields, got 3"),
    (ROWS[:4] + ["tall,0.2,red,setosa"], HEADER, {}, InvalidArgumentError,
     r"flowers.csv:6: malformed CSV line: column 1 \(petal_len\): cannot parse 'tall' as float32"),
    ([], "", {}, InvalidArgumentError, r"flowers.csv is empty"),
    ([], HEADER, {}, InvalidArgumentError, r"flowers.csv has no rows after its header"),
    (ROWS[:5], HEADER, {"split": {"validation": 0.05}}, InvalidArgumentError,
     r"split.validation = 0.05 of 5 rows leaves no validation rows"),
])
def test_bad_input_names_the_file_line_and_column(tmp_path, rows, header, fields, error, message):
    if message is None:     # a label outside the declared classes
        fields = {"label": {"column": "species", "classes": ["setosa", "versicolor", "virginica"]}}
        message = r"flowers.csv:5: label 'rose' in column 'species' is not one of the classes"
    with pytest.raises(error, match=message):
        spec = spec_for(tmp_path, rows, header, **fields)
        inspect(spec)


@pytest.mark.parametrize("fields, message", [
    ({"features": {"a": "text"}}, "flowers.yaml: features.a.type: 'text' is not one of numeric, categorical, image"),
    ({"features": {"a": {"type": "numerc"}}}, "features.a.type: 'numerc' is not one of numeric, categorical, image, "
                                              "did you mean 'numeric'?"),
    ({"features": {"a": {"type": "categorical"}}},
     "flowers.yaml: features.a: a categorical feature needs a vocabulary or hash_buckets"),
    ({"features": {"species": "numeric"}}, "flowers.yaml: column(s) ['species'] are both a feature and the label"),
    ({"label": {"column": "species", "task": "ranking"}}, "flowers.yaml: label.task: 'ranking' is not one of"),
    ({"split": {"validation": 0.5, "test": 0.5}}, "flowers.yaml: split: validation and test together leave no "
                                                  "training rows"),
    ({"shuffle": True}, "flowers.yaml: unknown key 'shuffle' (a data spec takes name, source, files, split, "
                        "features, label, normalize, skip_bad_rows, drop, categorical)"),
    ({"split": {"tset": 0.2}}, "flowers.yaml: split: unknown key 'tset', did you mean 'test'? (split takes "
                               "validation, test, seed)"),
    ({"features": {"age": {"defualt": 0}}}, "flowers.yaml: features.age: unknown key 'defualt', did you mean "
                                            "'default'? (a feature takes type, column, columns, default, vocabulary, "
                                            "hash_buckets, encode, shape, scale)"),
    ({"label": {"column": "species", "clases": ["a", "b"]}}, "label: unknown key 'clases', did you mean 'classes'?"),
    ({"files": {"trian": "flowers.csv"}}, "files: unknown key 'trian', did you mean 'train'?"),
    ({"features": {"p": {"type": "image", "columns": "p0..p9", "shape": [3, 3]}}},
     "features.p: shape [3, 3] holds 9 values, the feature has 10"),
    ({"features": {"c": {"type": "categorical", "hash_buckets": 0}}},
     "features.c.hash_buckets: hash_buckets takes positive integers, got 0"),
    ({"split": {"test": "a fifth"}}, "split.test: a fraction in [0, 1), got 'a fifth'"),
    ({"drop": ["colour"]}, "drop picks among the columns a spec without `features` takes; this spec lists its features"),
])
def test_bad_specs_name_the_file_and_the_key_path(tmp_path, fields, message):
    """One line naming the file, the key path and what is wrong; an unknown key at any level gets a
    "did you mean" and the keys that level takes."""
    with pytest.raises(InvalidArgumentError, match=re.escape(message)) as error:
        spec_for(tmp_path, **fields)
    assert "\n" not in str(error.value) and str(error.value).startswith(f"data spec {tmp_path / 'flowers.yaml'}: ")


def test_bad_rows_are_skipped_and_counted_when_the_spec_asks(tmp_path):
    spec = spec_for(tmp_path, ROWS[:4] + ["oops", "tall,0.2,red,setosa"] + ROWS[4:], skip_bad_rows=True)
    assert inspect(spec)["splits"]["train"] == {"rows": 10, "files": 1, "skipped_bad_rows": 2}


def test_inspect_command_prints_the_splits_and_names_bad_input(tmp_path):
    spec_for(tmp_path, split={"test": 0.3})
    done = CliRunner().invoke(main, ["data", "inspect", str(tmp_path / "flowers.yaml")])
    assert done.exit_code == 0, done.output
    assert "train             7 rows" in done.output and "model inputs: input [5] float32; outputs: 3" in done.output
    (tmp_path / "flowers.csv").write_text(HEADER + "1.0,0.2,red\n")
    bad = CliRunner().invoke(main, ["data", "inspect", str(tmp_path / "flowers.yaml")])
    assert bad.exit_code == 2 and "flowers.csv:2: malformed CSV line: expected 4 fields, got 3" in bad.output


def test_yaml_keeps_no_and_yes_and_inspect_names_unknown_categories(tmp_path):
    """YAML 1.2: `classes: [no, yes]` and `vocabulary: [no, se]` are the strings written (YAML 1.1 made them
    booleans: 'not one of the classes' and every `no` sent to the unknown slot)."""
    rows = ["no,yes", "se,no", "dk,yes", "no,no", "se,yes", "dk,no", "no,yes", "fi,no"]
    (tmp_path / "votes.csv").write_text("country,answer\n" + "".join(r + "\n" for r in rows))
    (tmp_path / "votes.yaml").write_text("files: votes.csv\nfeatures:\n  country: {type: categorical, "
                                         "vocabulary: [no, se]}\nlabel: {column: answer, task: binary, "
                                         "classes: [no, yes]}\n")
    spec = load_spec(str(tmp_path / "votes.yaml"))
    report = inspect(spec)
    assert report["label"]["classes"] == ["no", "yes"] and report["label"]["per_split"]["train"] == {"no": 4, "yes": 4}
    [country] = report["features"]
    assert country["unknown"] == {"train": {"rows": 3, "values": ["dk", "fi"]}}        # `no` is known
    train = prepare(spec, load_tables(spec)["train"])
    assert train.x[0].tolist() == [1, 0, 0] and train.y.tolist() == [1, 0, 1, 0, 1, 0, 1, 0]
    done = CliRunner().invoke(main, ["data", "inspect", str(tmp_path / "votes.yaml")])
    assert "unknown in train: 3 row(s) hold values outside the vocabulary ('dk', 'fi')" in done.output, done.output


def write_wide(directory, rows=300, seed=0):
    """A 64-column CSV: 60 numbers (x7 with empty fields), a text column, a zip code of digits, an id and the
    label, which depends on x0, x1 and the text."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 60))
    town = rng.choice(["no", "se", "dk"], rows)
    answer = (x[:, 0] - x[:, 1] + (town == "dk") > 0.3)
    header = [f"x{i}" for i in range(60)] + ["town", "zip", "id", "answer"]
    lines = [",".join(header)]
    for r in range(rows):
        numbers = ["" if i == 7 and r % 5 == 0 else f"{v:.4f}" for i, v in enumerate(x[r])]
        lines.append(",".join(numbers + [town[r], f"{1000 + r % 4}", str(r), ["no", "yes"][int(answer[r])]]))
    (directory / "wide.csv").write_text("\n".join(lines) + "\n")
    (directory / "wide.yaml").write_text("files: wide.csv\nsplit: {test: 0.2, seed: 0}\nlabel: answer\n"
                                         "drop: id\ncategorical: [zip]\n")
    return str(directory / "wide.yaml")


def test_a_spec_that_names_only_its_label_takes_every_other_column_typed_from_the_train_split(tmp_path):
    path = write_wide(tmp_path)
    spec = load_spec(path)
    report = inspect(spec)
    assert report["features_from"] == "the data" and len(report["features"]) == 62      # 64 - label - id
    by_name = {f.name: f for f in spec.features}
    assert [f.name for f in spec.features][:3] == ["x0", "x1", "x2"] and "id" not in by_name
    assert {f.type for n, f in by_name.items() if n.startswith("x")} == {"numeric"}
    train_rows = load_tables(spec)["train"]
    x7 = train_rows.columns["x7"]             # empty fields took the default: the mean of the others, so of all
    assert by_name["x7"].default == pytest.approx(float(x7.mean()), rel=1e-4) and np.sum(x7 == x7[0]) < 5
    assert (by_name["town"].type, by_name["town"].vocabulary) == ("categorical", ["dk", "no", "se"])
    assert (by_name["zip"].type, by_name["zip"].vocabulary) == ("categorical", ["1000", "1001", "1002", "1003"])
    assert report["input_signature"] == {"input": [[60 + 4 + 5], "float32"]} and report["outputs"] == 2
    done = CliRunner().invoke(main, ["data", "inspect", path])
    assert done.exit_code == 0 and "features (every column but the label's, typed from the train split: 62)" in \
        done.output and "town             categorical  columns 1, encode one_hot, categories 4" in done.output
    recorded = json.loads(json.dumps(to_config(spec)))                 # what a checkpoint keeps
    (tmp_path / "wide.csv").unlink()
    again = from_config(recorded)                                     # serving reads no data to know the features
    assert input_signature(again) == input_signature(spec) and again.features == spec.features


@pytest.mark.parametrize("extra, message", [
    ("drop: idd\n", "data spec drop: column 'idd' is not in the data, did you mean 'id'?"),
    ("categorical: [tonw]\n", "data spec categorical: column 'tonw' is not in the data, did you mean 'town'?"),
])
def test_every_column_errors_name_the_column(tmp_path, extra, message):
    path = write_wide(tmp_path)
    (tmp_path / "wide.yaml").write_text("files: wide.csv\nlabel: answer\n" + extra)
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        inspect(load_spec(path))


def test_a_text_column_with_a_value_per_row_is_not_taken_as_a_category(tmp_path):
    (tmp_path / "notes.csv").write_text("size,note,kind\n" + "".join(f"{i},note {i},k{i % 2}\n" for i in range(1100)))
    spec = load_spec({"files": str(tmp_path / "notes.csv"), "label": "kind"})
    with pytest.raises(InvalidArgumentError, match=re.escape("column 'note' holds 1,100 distinct texts in the train "
                                                             "split, too many for a category (at most 1,000): drop it")):
        spec.features
