"""A data spec streamed chunk by chunk gives exactly what load_tables + prepare give for the split."""

import glob

import numpy as np
import pytest

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.inputs.data_spec import fit, load_spec, load_tables, model_inputs, labels, to_config
from zmqflow.inputs.spec_stream import SpecStream, queue_components, split_files, split_rows

pytestmark = pytest.mark.unit

CITIES = ["paris", "rome", "oslo"]


def write_parts(directory, parts=3, rows=40, seed=0, bad=None):
    """`parts` CSV files of `rows` rows: a serial, a numeric with empty fields, a city, a label."""
    rng = np.random.default_rng(seed)
    serial = 0
    for p in range(parts):
        lines = ["serial,size,city,kind"]
        for r in range(rows):
            size = "" if r % 7 == 0 else f"{rng.normal(3, 2):.3f}"
            lines.append(f"{serial},{size},{CITIES[rng.integers(0, 3)] if r % 11 else 'lima'},k{serial % 3}")
            serial += 1
        if bad is not None and p == bad[0]:
            lines[bad[1]] = bad[2]
        (directory / f"part-{p}.csv").write_text("\n".join(lines) + "\n")


def spec_dict(directory, **extra):
    return {"files": str(directory / "part-*.csv"),
            "features": {"serial": "numeric", "size": {"type": "numeric", "default": -1.5},
                         "city": {"type": "categorical", "vocabulary": CITIES}},
            "label": {"column": "kind", "task": "multiclass"}, **extra}


def streamed(config, split="train", chunk_size=16):
    spec = load_spec(config["spec"])
    stream = SpecStream(config, split, split_rows(spec, split), chunk_size=chunk_size)
    chunks = [c for path in sorted(glob.glob(split_files(spec, split)[0])) for c in stream.read(path)]
    assert all(c.count <= chunk_size for c in chunks)
    return {name: np.concatenate([c.features[name] for c in chunks]) for name in stream.spec}, stream


@pytest.mark.parametrize("fractions", [None, {"validation": 0.25, "test": 0.1, "seed": 3}])
def test_streamed_splits_equal_the_prepared_ones(tmp_path, fractions):
    write_parts(tmp_path)
    spec = load_spec(spec_dict(tmp_path, **({"split": fractions} if fractions else {})))
    tables = load_tables(spec)
    fit(spec, tables["train"])
    config = to_config(spec)
    for split, table in tables.items():
        got, stream = streamed(config, split)
        np.testing.assert_array_equal(got["input"], model_inputs(spec, table))
        np.testing.assert_array_equal(got["label"], labels(spec, table))
        assert stream.counters.records_read == 120
    assert queue_components(spec) == [("input", "float32", [6]), ("label", "int32", [])]
    assert stream.spec == {"input": ("float32", (6,)), "label": ("int32", ())}


def test_ids_and_regression_components(tmp_path):
    write_parts(tmp_path, parts=1)
    raw = spec_dict(tmp_path)
    raw["features"]["city"] = {"type": "categorical", "hash_buckets": 5, "encode": "ids"}
    raw["features"].pop("serial")
    raw["label"] = {"column": "serial", "task": "regression"}
    spec = load_spec(raw)
    table = load_tables(spec)["train"]
    fit(spec, table)
    assert queue_components(spec) == [("input", "float32", [1]), ("city", "int64", [1]), ("label", "float32", [])]
    got, _ = streamed(to_config(spec))
    inputs = model_inputs(spec, table)
    for name in ("input", "city"):
        np.testing.assert_array_equal(got[name], inputs[name])
    np.testing.assert_array_equal(got["label"], np.arange(40, dtype=np.float32))


def test_bad_rows_name_file_line_and_column_or_are_counted(tmp_path):
    write_parts(tmp_path, parts=2, bad=(1, 5, "4,big,rome,k1"))
    spec = load_spec(spec_dict(tmp_path))
    with pytest.raises(InvalidArgumentError, match=r"part-1\.csv:6: .*column 2 \(size\)"):
        load_tables(spec)
    write_parts(tmp_path, parts=2)
    fit(spec, load_tables(spec)["train"])
    config = to_config(spec)
    write_parts(tmp_path, parts=2, bad=(1, 5, "4,big,rome,k1"))
    with pytest.raises(InvalidArgumentError, match=r"part-1\.csv:6: .*column 2 \(size\)"):
        streamed(config)
    config["spec"]["skip_bad_rows"] = True
    got, stream = streamed(config)
    assert len(got["label"]) == 79 and stream.counters.malformed_skipped == 1


def test_a_label_outside_the_classes_names_its_line(tmp_path):
    write_parts(tmp_path, parts=1)
    spec = load_spec(spec_dict(tmp_path))
    fit(spec, load_tables(spec)["train"])
    config = to_config(spec)
    write_parts(tmp_path, parts=1, bad=(0, 30, "29,1.0,rome,k9"))
    with pytest.raises(InvalidArgumentError, match=r"part-0\.csv:31: label 'k9'"):
        streamed(config, chunk_size=8)


def test_npz_specs_are_not_streamed(tmp_path):
    np.savez(tmp_path / "d.npz", a=np.arange(4.0), y=np.array([0, 1, 0, 1]))
    spec = load_spec({"files": str(tmp_path / "d.npz"), "source": {"format": "npz"}, "features": {"a": "numeric"},
                      "label": "y"})
    fit(spec, load_tables(spec)["train"])
    with pytest.raises(InvalidArgumentError, match="fed from memory"):
        SpecStream(to_config(spec))
