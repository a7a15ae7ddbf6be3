"""Data spec sources: npz, npy, TFRecord, fixed-length records and Parquet give the same model inputs and labels
as the same rows in a CSV; every bad file is an error naming the file, the record or row, and the column."""

import gzip
import json
import os
import re
import sys

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from zmqflow.cli.main import main
from zmqflow.common.errors import DataLossError, InvalidArgumentError
from zmqflow.common.spec_files import parse_yaml
from zmqflow.inputs.data_spec import DataSpec, fit, load_spec, load_tables, prepare, read_features
from zmqflow.inputs.datasets import DATA_DIR
from zmqflow.inputs.formats import iter_records, write_tfrecord

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS = 24
RNG = np.random.default_rng(3)
DATA = {"x1": np.round(RNG.normal(5, 2, ROWS), 3).astype(np.float32),
        "x2": np.round(RNG.normal(0, 1, ROWS), 3).astype(np.float32),
        "zone": RNG.integers(1, 4, ROWS).astype(np.int64),                  # 3 is outside the vocabulary
        "town": RNG.integers(0, 50, ROWS).astype(np.int64),
        "colour": np.array(["red", "blue", "white"])[RNG.integers(0, 3, ROWS)],
        "label": np.arange(ROWS) % 3}
NUMERIC = {"x1": "numeric", "x2": {"type": "numeric"}, "zone": {"type": "categorical", "vocabulary": [1, 2]},
           "town": {"type": "categorical", "hash_buckets": 7, "encode": "ids"}}
TEXT = {**NUMERIC, "colour": {"type": "categorical", "vocabulary": ["red", "blue"]}}
TF_FEATURES = {"x1": {"dtype": "float32"}, "x2": {"dtype": "float32", "shape": [1]}, "zone": {"dtype": "int64"},
               "town": {"dtype": "int64"}, "colour": {"dtype": "string"}, "label": {"dtype": "int64"}}
LAYOUT = [["x1", "<f4", 0], ["x2", "<f4", 4], ["zone", "uint8", 8], ["town", "uint8", 9], ["label", "uint8", 10]]


def spec(tmp_path, files, read=TEXT, **source):
    """A spec of `files` in tmp_path whose features are `read` and whose source is `source`."""
    return load_spec({"files": str(tmp_path / files), "source": source or {"format": "csv"}, "features": read,
                      "label": {"column": "label"}})


def prepared(data_spec):
    tables = load_tables(data_spec)
    fit(data_spec, tables["train"])
    return prepare(data_spec, tables["train"])


def write_csv(tmp_path, name="rows.csv"):
    lines = [",".join(DATA)] + [",".join(str(DATA[c][i]) for c in DATA) for i in range(ROWS)]
    (tmp_path / name).write_text("\n".join(lines) + "\n")


def write_fixed(path, data=DATA, header=b"HDR", footer=b"FT"):
    records = np.zeros(len(data["x1"]), dtype=[("x1", "<f4"), ("x2", "<f4"), ("zone", "u1"), ("town", "u1"),
                                              ("label", "u1")])
    for name in records.dtype.names:
        records[name] = data[name]
    path.write_bytes(header + records.tobytes() + footer)


def write_parquet(path, data=DATA):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({c: list(v) if isinstance(v, list) else v for c, v in data.items()}), path)


def tf_examples(data=DATA):
    return [{c: [data[c][i].item()] if c != "colour" else str(data[c][i]) for c in data}
            for i in range(len(data["x1"]))]


def test_npz_npy_and_tfrecord_give_the_inputs_and_labels_of_the_same_csv(tmp_path):
    write_csv(tmp_path)
    csv = spec(tmp_path, "rows.csv")
    expected = prepared(csv)
    assert expected.x["input"].shape == (ROWS, 2 + 3 + 3) and sorted(expected.x) == ["input", "town"]
    np.savez(tmp_path / "rows.npz", **DATA)
    structured = np.zeros(ROWS, dtype=[(c, DATA[c].dtype) for c in DATA])
    for c in DATA:
        structured[c] = DATA[c]
    np.save(tmp_path / "rows.npy", structured)
    write_tfrecord(str(tmp_path / "rows-1.tfrecord"), tf_examples()[:10])
    write_tfrecord(str(tmp_path / "rows-2.tfrecord.gz"), tf_examples()[10:], gzip=True)
    for source in (spec(tmp_path, "rows.npz", format="npz"), spec(tmp_path, "rows.npy", format="npy"),
                   spec(tmp_path, "rows*.tfrecord*", format="tfrecord", features=TF_FEATURES)):
        got = prepared(source)
        np.testing.assert_allclose(got.x["input"], expected.x["input"], rtol=1e-6, err_msg=source.format)
        assert got.x["town"].tolist() == expected.x["town"].tolist() and got.y.tolist() == expected.y.tolist()
        assert source.stats == csv.stats          # the same means, deviations and classes


def test_a_two_d_npy_and_fixed_length_records_give_the_inputs_of_the_same_csv(tmp_path):
    write_csv(tmp_path)
    expected = prepared(spec(tmp_path, "rows.csv", NUMERIC))
    np.save(tmp_path / "plain.npy", np.stack([DATA[c] for c in ("x1", "x2", "zone", "town", "label")], axis=1))
    write_fixed(tmp_path / "rows.bin")
    gz = tmp_path / "rows.bin.gz"
    gz.write_bytes(gzip.compress((tmp_path / "rows.bin").read_bytes()))
    for source in (spec(tmp_path, "plain.npy", NUMERIC, format="npy", columns=["x1", "x2", "zone", "town", "label"]),
                   spec(tmp_path, "rows.bin", NUMERIC, format="fixed_length", record_bytes=11, header_bytes=3,
                        footer_bytes=2, fields=LAYOUT),
                   spec(tmp_path, "rows.bin.gz", NUMERIC, format="fixed_length", record_bytes=11, header_bytes=3,
                        footer_bytes=2, fields=LAYOUT, compression="GZIP")):
        got = prepared(source)
        np.testing.assert_allclose(got.x["input"], expected.x["input"], rtol=1e-6, err_msg=source.format)
        assert got.x["town"].tolist() == expected.x["town"].tolist() and got.y.tolist() == expected.y.tolist()


def test_parquet_gives_the_inputs_of_the_same_csv_and_takes_defaults_and_list_columns(tmp_path):
    pytest.importorskip("pyarrow", reason="Parquet needs pyarrow (the parquet extra; in the test lock)")
    write_csv(tmp_path)
    expected = prepared(spec(tmp_path, "rows.csv"))
    write_parquet(tmp_path / "rows.parquet")
    got = prepared(spec(tmp_path, "rows.parquet", format="parquet"))
    np.testing.assert_allclose(got.x["input"], expected.x["input"], rtol=1e-6)
    assert got.x["town"].tolist() == expected.x["town"].tolist() and got.y.tolist() == expected.y.tolist()
    holes = {"x1": [1.5, None, 2.5], "pixels": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], "label": ["a", "b", "a"]}
    write_parquet(tmp_path / "holes.parquet", holes)
    table = load_tables(spec(tmp_path, "holes.parquet", {"x1": {"type": "numeric", "default": 7},
                                                         "pixels": {"type": "image", "shape": [2, 1]}},
                             format="parquet"))["train"]
    assert table.columns["x1"].tolist() == [1.5, 7, 2.5] and table.columns["pixels"].shape == (3, 2)


def test_the_shipped_tfrecord_and_fixed_length_files_hold_the_csvs_first_hundred_digits():
    image = {"image": {"type": "image", "shape": [28, 28, 1], "scale": 1 / 255}}
    common = {"label": {"column": "label", "classes": list(range(10))}, "normalize": False}
    csv = load_spec({"source": {"format": "csv", "header": False}, "files": os.path.join(DATA_DIR, "mnist_5k.csv.gz"),
                     "features": {"image": {**image["image"], "columns": list(range(784))}},
                     **{**common, "label": {**common["label"], "column": 784}}})
    tables = load_tables(csv)
    fit(csv, tables["train"])
    expected = prepare(csv, tables["train"].take(np.arange(100)))
    records = load_spec({"source": {"format": "tfrecord", "features": {"image": {"dtype": "float32", "shape": [784]},
                                                                       "label": {"dtype": "int64"}}},
                         "files": os.path.join(DATA_DIR, "mnist_sample-*.tfrecord*"),
                         "features": {"image": {**image["image"], "scale": 1}}, **common})
    fixed = load_spec({"source": {"format": "fixed_length", "record_bytes": 785, "header_bytes": 4, "footer_bytes": 2,
                                  "fields": [["label", "uint8", 0], ["image", "uint8", 1, [784]]]},
                       "files": os.path.join(DATA_DIR, "mnist_sample.bin"), "features": image, **common})
    for source in (records, fixed):
        got = prepared(source)
        assert got.x.shape == (100, 28, 28, 1) and got.y.tolist() == expected.y.tolist()
        np.testing.assert_allclose(got.x, expected.x, atol=1e-6)


def test_read_features_of_tfrecords_without_the_label(tmp_path):
    write_tfrecord(str(tmp_path / "new.tfrecord"), [{k: v for k, v in e.items() if k != "label"}
                                                    for e in tf_examples()[:5]])
    source = spec(tmp_path, "new.tfrecord", format="tfrecord", features=TF_FEATURES)
    table = read_features(source, str(tmp_path / "new.tfrecord"))
    assert len(table) == 5 and "label" not in table.columns and table.columns["colour"][0] == DATA["colour"][0].encode()


def test_rows_to_predict_for_the_built_in_mnist_spec_come_from_a_csv_or_an_npz(tmp_path):
    pixels = np.arange(2 * 784).reshape(2, 784) % 256 / 255
    (tmp_path / "new.csv").write_text(",".join(f"p{i}" for i in range(784)) + "\n" + "\n".join(
        ",".join(map(str, row)) for row in pixels) + "\n")
    np.savez(tmp_path / "new.npz", **{f"p{i}": pixels[:, i] for i in range(784)})
    for name in ("new.csv", "new.npz"):
        table = read_features(load_spec("mnist"), str(tmp_path / name))
        np.testing.assert_allclose(np.stack([table.columns[f"p{i}"] for i in range(784)], axis=1), pixels, rtol=1e-6)


def test_inspect_reads_a_tfrecord_spec_and_names_a_bad_record(tmp_path):
    raw = {"name": "digits", "files": os.path.join(DATA_DIR, "mnist_sample-*.tfrecord*"),
           "source": {"format": "tfrecord", "features": {"image": {"dtype": "float32", "shape": [784]},
                                                         "label": {"dtype": "int64"}}},
           "features": {"image": {"type": "image", "shape": [28, 28, 1]}}, "split": {"test": 0.2},
           "label": {"column": "label", "classes": list(range(10))}}   # the files' 100 rows are all zeros
    (tmp_path / "digits.yaml").write_text(yaml.safe_dump(raw))
    done = CliRunner().invoke(main, ["data", "inspect", str(tmp_path / "digits.yaml")])
    assert done.exit_code == 0, done.output
    assert "digits: tfrecord data" in done.output and "train            80 rows from 2 file(s)" in done.output
    assert "model inputs: input [28, 28, 1] float32; outputs: 10" in done.output
    raw["source"]["features"]["image"]["shape"] = [783]
    (tmp_path / "digits.yaml").write_text(yaml.safe_dump(raw))
    bad = CliRunner().invoke(main, ["data", "inspect", str(tmp_path / "digits.yaml")])
    assert bad.exit_code == 2 and ("mnist_sample-00000-of-00002.tfrecord: record 0 (offset 0): "
                                   "feature 'image' has 784 values, expected 783") in bad.output


def offsets(path):
    """The byte offset of each record of a TFRecord file."""
    sizes = [16 + len(r) for r in iter_records(path)]
    return np.cumsum([0] + sizes[:-1]).tolist()


def test_bad_tfrecords_name_the_file_the_record_and_the_feature(tmp_path):
    path = str(tmp_path / "rows.tfrecord")
    examples = tf_examples()[:6]
    del examples[2]["x1"]
    examples[4]["label"] = [7]
    write_tfrecord(path, examples)
    at = offsets(path)
    source = spec(tmp_path, "rows.tfrecord", format="tfrecord", features=TF_FEATURES)
    with pytest.raises(InvalidArgumentError, match=re.escape(
            f"{path}: record 2 (offset {at[2]}): required feature 'x1' is missing")):
        load_tables(source)
    defaulted = spec(tmp_path, "rows.tfrecord", {**TEXT, "x1": {"type": "numeric", "default": -1}},
                     format="tfrecord", features=TF_FEATURES)
    assert load_tables(defaulted)["train"].columns["x1"][2] == -1
    with pytest.raises(InvalidArgumentError, match=re.escape(
            f"{path}: record 4: label '7' in column 'label' is not one of the classes ['0', '1', '2']")):
        prepared(load_spec({**defaulted.raw, "label": {"column": "label", "classes": [0, 1, 2]}}))
    examples[1]["x2"] = [1.0, 2.0]
    write_tfrecord(path, examples)
    with pytest.raises(InvalidArgumentError, match=re.escape(
            f"{path}: record 1 (offset {offsets(path)[1]}): feature 'x2' has 2 values, expected 1")):
        load_tables(defaulted)
    write_tfrecord(path, tf_examples()[:3])
    last, whole = offsets(path)[2], open(path, "rb").read()
    open(path, "wb").write(whole[:-5])
    with pytest.raises(DataLossError, match=re.escape(
            f"{path}: truncated record 2 (offset {last}): {len(whole) - last - 12 - 5} of {len(whole) - last - 12} "
            "bytes after the header")):
        load_tables(defaulted)


def test_record_sources_name_empty_files_truncated_records_and_undeclared_columns(tmp_path):
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    with pytest.raises(InvalidArgumentError, match=re.escape(f"{tmp_path / 'empty.tfrecord'} is empty")):
        load_tables(spec(tmp_path, "empty.tfrecord", format="tfrecord", features=TF_FEATURES))
    (tmp_path / "empty.tfrecord.gz").write_bytes(gzip.compress(b""))
    with pytest.raises(InvalidArgumentError, match=re.escape(f"{tmp_path / 'empty.tfrecord.gz'} has no records")):
        load_tables(spec(tmp_path, "empty.tfrecord.gz", format="tfrecord", features=TF_FEATURES))
    with pytest.raises(InvalidArgumentError, match=re.escape(
            "data spec: column(s) ['colour'] are not in source.features (it has x1, x2, zone, town, label)")):
        load_tables(spec(tmp_path, "empty.tfrecord", format="tfrecord",
                         features={k: v for k, v in TF_FEATURES.items() if k != "colour"}))
    write_fixed(tmp_path / "rows.bin", footer=b"")
    (tmp_path / "rows.bin").write_bytes((tmp_path / "rows.bin").read_bytes()[:-8])
    fixed = dict(format="fixed_length", record_bytes=11, header_bytes=3, fields=LAYOUT)
    with pytest.raises(DataLossError, match=re.escape(
            f"{tmp_path / 'rows.bin'}: truncated record {ROWS - 1} (offset {3 + 11 * (ROWS - 1)}): 3 of 11 bytes")):
        load_tables(spec(tmp_path, "rows.bin", NUMERIC, **fixed))
    with pytest.raises(InvalidArgumentError, match=re.escape(
            "data spec: column(s) ['colour'] are not in source.fields (it has x1, x2, zone, town, label)")):
        load_tables(spec(tmp_path, "rows.bin", TEXT, **fixed))


def test_array_files_name_the_column_and_row(tmp_path):
    np.savez(tmp_path / "rows.npz", **{**DATA, "x2": np.ones((ROWS, 3))})
    with pytest.raises(InvalidArgumentError, match=re.escape(
            f"{tmp_path / 'rows.npz'}: column 'x2' holds 3 values per row; a feature or label reads one")):
        load_tables(spec(tmp_path, "rows.npz", format="npz"))
    np.savez(tmp_path / "rows.npz", **{k: v for k, v in DATA.items() if k != "zone"})
    with pytest.raises(InvalidArgumentError, match=re.escape(
            f"{tmp_path / 'rows.npz'}: array(s) ['zone'] named in the data spec are not in the file "
            "(it holds colour, label, town, x1, x2)")):
        load_tables(spec(tmp_path, "rows.npz", format="npz"))
    np.save(tmp_path / "flat.npy", DATA["x1"])
    with pytest.raises(InvalidArgumentError, match=re.escape(
            f"{tmp_path / 'flat.npy'}: an .npy source is a structured array or a 2-D array [rows, columns], "
            f"got shape [{ROWS}]")):
        load_tables(spec(tmp_path, "flat.npy", NUMERIC, format="npy"))
    np.savez(tmp_path / "img.npz", pixels=np.ones((4, 10)), label=np.arange(4))
    with pytest.raises(InvalidArgumentError, match=re.escape(
            f"{tmp_path / 'img.npz'}: column 'pixels' holds 10 values per row; image feature 'pixels' has shape "
            "[3, 3]")):
        load_tables(spec(tmp_path, "img.npz", {"pixels": {"type": "image", "shape": [3, 3]}}, format="npz"))


def test_bad_parquet_files_name_the_row_and_column_and_a_missing_pyarrow_names_the_extra(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow", reason="Parquet needs pyarrow (the parquet extra; in the test lock)")
    write_parquet(tmp_path / "holes.parquet", {"x1": [1.5, 2.0, None], "label": ["a", "b", "a"]})
    path = tmp_path / "holes.parquet"
    with pytest.raises(InvalidArgumentError, match=re.escape(
            f"{path}: row 2: column 'x1' is empty (give its feature a default)")):
        load_tables(spec(tmp_path, "holes.parquet", {"x1": "numeric"}, format="parquet"))
    with pytest.raises(InvalidArgumentError, match=re.escape(
            f"{path}: column(s) ['x2'] named in the data spec are not in the file (it holds x1, label)")):
        load_tables(spec(tmp_path, "holes.parquet", {"x2": "numeric"}, format="parquet"))
    write_parquet(tmp_path / "ragged.parquet", {"p": [[1.0, 2.0], [1.0, 2.0], [3.0]], "label": ["a", "b", "a"]})
    with pytest.raises(InvalidArgumentError, match=re.escape(
            f"{tmp_path / 'ragged.parquet'}: row 2: column 'p' holds 1 values; row 0 holds 2")):
        load_tables(spec(tmp_path, "ragged.parquet", {"p": {"type": "image", "shape": [2]}}, format="parquet"))
    (tmp_path / "text.parquet").write_text("not parquet\n")
    with pytest.raises(InvalidArgumentError, match=re.escape(f"{tmp_path / 'text.parquet'} is not a readable Parquet")):
        load_tables(spec(tmp_path, "text.parquet", {"x1": "numeric"}, format="parquet"))
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(InvalidArgumentError, match=re.escape(
            f"{path}: reading Parquet needs pyarrow: pip install 'zmqflow[parquet]'")):
        load_tables(spec(tmp_path, "holes.parquet", {"x1": "numeric"}, format="parquet"))


@pytest.mark.parametrize("source, message", [
    ({"format": "orc"}, "data spec: source.format 'orc' is not one of csv, npz, npy, tfrecord, fixed_length, parquet, mnist"),
    ({"format": "tfrecord"}, "source: format tfrecord needs features"),
    ({"format": "npz", "header": True}, "source: unknown key 'header' for format npz; it takes no options"),
    ({"format": "csv", "delimeter": ";"}, "source: unknown key 'delimeter' for format csv, did you mean 'delimiter'?"),
    ({"format": "tfrecord", "features": {"a": {"dtype": "complex64"}}}, "feature 'a': unsupported dtype 'complex64'"),
    ({"format": "tfrecord", "features": {"a": {"shape": [2]}}}, "source.features.a: {dtype:"),
    ({"format": "tfrecord", "features": {"a": "float32"}, "compression": "ZLIB"}, "unsupported compression 'ZLIB'"),
    ({"format": "fixed_length", "record_bytes": 4}, "format fixed_length needs fields"),
    ({"format": "fixed_length", "record_bytes": 4, "fields": [["a", "<f4", 2]]},
     "field 'a' ends at byte 6, past the 4-byte record"),
])
def test_bad_sources_name_the_option(source, message):
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        DataSpec({"files": "x", "source": source, "features": {"a": "numeric"}, "label": "y"})


def test_every_source_example_in_the_docs_is_a_valid_spec():
    with open(os.path.join(ROOT, "docs", "data.md")) as f:
        blocks = [parse_yaml(b, "docs/data.md") for b in re.findall(r"```yaml\n(.*?)```", f.read(), re.S)]
    formats = {DataSpec(b).format for b in blocks if "source" in b}
    assert formats == {"csv", "npz", "npy", "tfrecord", "fixed_length", "parquet"}, json.dumps(blocks)[:500]


def test_an_integer_default_keeps_a_numeric_column_float(tmp_path):
    from zmqflow.inputs.data_spec import load_spec, load_tables
    (tmp_path / "d.csv").write_text("age,kind\n3.25,a\n,b\n7,a\n")
    spec = load_spec({"files": str(tmp_path / "d.csv"), "features": {"age": {"type": "numeric", "default": 0}},
                      "label": "kind"})
    assert load_tables(spec)["train"].columns["age"].tolist() == [3.25, 0.0, 7.0]


def test_the_mnist_sample_parses_as_numpys_general_parser_reads_it_and_other_text_falls_back_to_it(tmp_path):
    from zmqflow.inputs.datasets import MNIST_CSV, load_mnist, small_integer_table
    with gzip.open(MNIST_CSV, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    x, y = load_mnist()
    assert x.dtype == np.float32 and y.dtype == np.int32 and x.shape == (5000, 784)
    assert np.array_equal(x, table[:, :-1] / np.float32(255.0)) and np.array_equal(y, table[:, -1].astype(np.int32))
    assert small_integer_table(b"12,345,0\n6,78,999").tolist() == [[12, 345, 0], [6, 78, 999]]
    for other in (b"", b"\n", b"1,,2\n", b",1\n", b"1,2\n\n", b"1000,1\n", b"-1,2\n", b"1.5,2\n", b"1, 2\n",
                  b"1,2\r\n", b"a,b\n1,2\n", b"1,2\n3\n", b"1,2\n3,4,5\n"):
        assert small_integer_table(other) is None, other
    path = tmp_path / "decimals.csv"        # what the fast path refuses, np.loadtxt still reads
    path.write_text("0.5,255,1\n-51,0,2\n")
    x, y = load_mnist(str(path))
    assert np.allclose(x, [[0.5 / 255, 1.0], [-51 / 255, 0.0]]) and y.tolist() == [1, 2]
