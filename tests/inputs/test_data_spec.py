"""Data specs: a CSV or .npz described in YAML becomes splits, model inputs and labels; every bad input
is an error naming the file, line and column (or a counted skip when the spec asks for it)."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from zmqflow.cli.main import main
from zmqflow.common.errors import InvalidArgumentError, NotFoundError
from zmqflow.inputs.data_spec import fit, input_signature, inspect, load_spec, load_tables, prepare

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
     r"flowers.csv:6: malformed CSV line: column 0 \(petal_len\): cannot parse 'tall' as float32"),
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
    ({"features": {"a": "text"}}, "feature 'a': type 'text' is not one of numeric, categorical, image"),
    ({"features": {"a": {"type": "categorical"}}}, "needs a vocabulary or hash_buckets"),
    ({"features": {"species": "numeric"}}, r"column\(s\) \['species'\] are both a feature and the label"),
    ({"label": {"column": "species", "task": "ranking"}}, "label task 'ranking' is not one of"),
    ({"split": {"validation": 0.5, "test": 0.5}}, "leave no training rows"),
    ({"shuffle": True}, r"unknown field\(s\) \['shuffle'\]"),
    ({"features": {"p": {"type": "image", "columns": "p0..p9", "shape": [3, 3]}}}, "holds 9 values, the feature has 10"),
])
def test_bad_specs_name_the_field(tmp_path, fields, message):
    with pytest.raises(InvalidArgumentError, match=message):
        spec_for(tmp_path, **fields)


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
