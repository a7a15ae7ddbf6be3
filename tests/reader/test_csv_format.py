"""CSV format: the shipped MNIST file, TF's record_defaults rules, malformed lines, gzip, flat memory."""

import gzip
import pathlib

import numpy as np
import pytest

from zmqflow.common.errors import InvalidArgumentError, NotFoundError
from zmqflow.inputs.formats import CsvFormat, open_format
from tests.reader import data_path, mnist_csv, peak_bytes_while_reading, read_all

pytestmark = pytest.mark.unit

MNIST_DEFAULTS = [[0.0]] * 784 + [[0]]
MY_TEST_CSV = str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "data" / "my_test.csv")
MNIST_COLUMNS = {"image": range(784), "label": 784}


def write(tmp_path, text, name="t.csv"):
    path = tmp_path / name
    data = text.encode() if isinstance(text, str) else text
    if name.endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return str(path)


def test_mnist_csv_gives_every_row_with_its_label():
    pixels, labels = mnist_csv()
    fmt = open_format("csv", record_defaults=MNIST_DEFAULTS, columns=MNIST_COLUMNS, chunk_size=1000)
    assert fmt.spec == {"image": ("float32", (784,)), "label": ("int32", ())}
    features, counts = read_all(fmt, data_path("mnist_5k.csv.gz"))
    assert counts == [1000] * 5
    assert features["image"].dtype == np.float32 and features["label"].dtype == np.int32
    np.testing.assert_array_equal(features["image"], pixels)
    np.testing.assert_array_equal(features["label"], labels)
    assert fmt.counters.records_read == 5000 and fmt.counters.malformed_skipped == 0
    assert fmt.counters.bytes_read == len(gzip.open(data_path("mnist_5k.csv.gz")).read())


def test_scale_makes_a_float32_feature():
    fmt = CsvFormat([[0]] * 3, columns={"x": [0, 1], "y": 2}, scale={"x": 0.5})
    assert fmt.spec["x"] == ("float32", (2,))


def test_header_skip_types_and_chunks(tmp_path):
    path = write(tmp_path, "a;b;c\n" + "".join(f"{i};{i / 2};s{i}\r\n" for i in range(10)))
    fmt = CsvFormat([[0], [0.0], [""]], field_delim=";", skip_header_lines=1, chunk_size=4)
    chunks = list(fmt.read(path))
    assert [(c.count, c.start) for c in chunks] == [(4, 0), (4, 4), (2, 8)]
    features, _ = read_all(fmt, path)
    np.testing.assert_array_equal(features["col0"], np.arange(10, dtype=np.int32))
    np.testing.assert_allclose(features["col1"], np.arange(10) / 2)
    assert features["col2"].dtype == object and list(features["col2"]) == [f"s{i}".encode() for i in range(10)]


def test_empty_fields_take_their_defaults(tmp_path):
    path = write(tmp_path, "1,,x\n,2.5,\n3,4.5,z\n")
    fmt = CsvFormat([[-1], [-1.0], ["none"]])
    features, _ = read_all(fmt, path)
    np.testing.assert_array_equal(features["col0"], [1, -1, 3])
    np.testing.assert_array_equal(features["col1"], np.array([-1.0, 2.5, 4.5], np.float32))
    assert list(features["col2"]) == [b"x", b"none", b"z"]


def test_fast_and_split_paths_agree(tmp_path):
    """Chunk 1 is clean (numpy.loadtxt), chunk 2 has an empty field (split path)."""
    path = write(tmp_path, "1,2.5,9000000000\n2,3.5,-7\n3,,8\n4,5.5,\n")
    fmt = CsvFormat([[0.0], [-1.0], [np.int64(0)]], columns={"v": [1, 0], "big": 2}, chunk_size=2)
    features, _ = read_all(fmt, path)
    np.testing.assert_array_equal(features["v"], [[2.5, 1], [3.5, 2], [-1, 3], [5.5, 4]])
    np.testing.assert_array_equal(features["big"], [9000000000, -7, 8, 0])
    assert features["big"].dtype == np.int64


def test_quoted_fields(tmp_path):
    path = write(tmp_path, '"a,b",1\n"say ""hi""",2\n')
    features, _ = read_all(CsvFormat([[""], [0]]), path)
    assert list(features["col0"]) == [b"a,b", b'say "hi"']


def test_required_empty_field_is_an_error_naming_file_and_line(tmp_path):
    path = write(tmp_path, "h\n1,2\n3,\n")
    with pytest.raises(InvalidArgumentError, match=rf"{path}:3: .*column 1 is empty and has no default"):
        list(CsvFormat(["int32", "float32"], skip_header_lines=1).read(path))


def test_wrong_field_count_names_file_and_line(tmp_path):
    path = write(tmp_path, "1,2,3\n4,5\n")
    with pytest.raises(InvalidArgumentError, match=rf"{path}:2: .*expected 3 fields, got 2"):
        list(CsvFormat([[0]] * 3).read(path))


def test_unparsable_number_names_line_and_column(tmp_path):
    path = write(tmp_path, "1,2\n3,4\n5,x\n")
    with pytest.raises(InvalidArgumentError, match=rf"{path}:3: .*column 1: cannot parse 'x' as float32"):
        list(CsvFormat([[0], [0.0]]).read(path))
    with pytest.raises(InvalidArgumentError, match=r":1: .*column 0: cannot parse '1.5' as int32"):
        list(CsvFormat([[0], [0.0]]).read(write(tmp_path, "1.5,2\n", "b.csv")))


def test_skip_bad_rows_counts_and_keeps_order(tmp_path):
    path = write(tmp_path, "1,1\n2\n3,3\nx,4\n5,5\n6,\n7,7,7\n8,8\n")
    fmt = CsvFormat(["int32", "int32"], skip_bad_rows=True, chunk_size=3)
    features, counts = read_all(fmt, path)
    np.testing.assert_array_equal(features["col0"], [1, 3, 5, 8])
    assert fmt.counters.malformed_skipped == 4 and fmt.counters.records_read == 4 and sum(counts) == 4


def test_gzip_by_suffix_or_option(tmp_path):
    text = "1,2\n3,4\n"
    by_suffix, _ = read_all(CsvFormat([[0], [0]]), write(tmp_path, text, "a.csv.gz"))
    (tmp_path / "b.data").write_bytes(gzip.compress(text.encode()))
    by_option, _ = read_all(CsvFormat([[0], [0]], compression="GZIP"), str(tmp_path / "b.data"))
    np.testing.assert_array_equal(by_suffix["col1"], [2, 4])
    np.testing.assert_array_equal(by_option["col1"], [2, 4])


def test_empty_files_give_no_records(tmp_path):
    for name, skip in (("e.csv", 0), ("h.csv", 2), ("e.csv.gz", 0)):
        fmt = CsvFormat([[0]], skip_header_lines=skip)
        assert list(fmt.read(write(tmp_path, "", name))) == []


def test_bad_options_and_missing_file(tmp_path):
    with pytest.raises(InvalidArgumentError, match="different types"):
        CsvFormat([[0], [0.0]], columns={"x": [0, 1]})
    with pytest.raises(InvalidArgumentError, match="unsupported type"):
        CsvFormat(["float8"])
    with pytest.raises(InvalidArgumentError, match="within"):
        CsvFormat([[0]], columns={"x": 3})
    with pytest.raises(InvalidArgumentError, match="unexpected keyword"):
        open_format("csv", record_defaults=[[0]], nonsense=1)
    with pytest.raises(NotFoundError, match="nope.csv"):
        list(CsvFormat([[0]]).read(tmp_path / "nope.csv"))


def test_memory_stays_flat_on_a_large_file(tmp_path):
    block = "".join(",".join(f"{(i * 31 + j) % 1000 / 7:.4f}" for j in range(20)) + f",{i % 10}\n"
                    for i in range(1000))
    path = tmp_path / "big.csv"
    with open(path, "w") as f:
        for _ in range(40):
            f.write(block)
    size = path.stat().st_size
    assert size > 5_000_000
    fmt = CsvFormat([[0.0]] * 20 + [[0]], columns={"x": range(20), "y": 20}, chunk_size=256)
    peak = peak_bytes_while_reading(fmt, path)
    assert fmt.counters.records_read == 40_000
    assert peak < size / 10, (peak, size)


def test_the_chapters_my_test_csv_reads_as_tensorflow_reads_it():
    """Hands-On ML ch. 12: my_test.csv with skip_header_lines=1, record_defaults=[[-1.], [-1.], [-1]]. TensorFlow's
    answers, written literally: x1=[1, 4, 7], x2=[-1, 5, -1], target=[0, 1, 0]. A field of spaces is empty."""
    fmt = CsvFormat([[-1.], [-1.], [-1]], columns={"x1": 0, "x2": 1, "target": 2}, skip_header_lines=1)
    features, _ = read_all(fmt, MY_TEST_CSV)
    assert features["x1"].tolist() == [1., 4., 7.] and features["x1"].dtype == np.float32
    assert features["x2"].tolist() == [-1., 5., -1.] and features["x2"].dtype == np.float32
    assert features["target"].tolist() == [0, 1, 0] and features["target"].dtype == np.int32


def test_a_field_of_spaces_without_a_default_is_required_but_missing(tmp_path):
    """TF: record_defaults entry [] -> 'Field 1 is required but missing'; here the file, line and column."""
    path = write(tmp_path, "x1, x2, target\n1. , 2. , 0\n4. ,  , 1\n")
    with pytest.raises(InvalidArgumentError, match=rf"{path}:3: .*column 1 is empty and has no default"):
        list(CsvFormat([[-1.], "float32", [-1]], skip_header_lines=1).read(path))
    strings, _ = read_all(CsvFormat([["none"], [" kept "]]), write(tmp_path, "  , a b \n", "s.csv"))
    assert list(strings["col0"]) == [b"none"] and list(strings["col1"]) == [b" a b "]  # text is kept as written
