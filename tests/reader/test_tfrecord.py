"""TFRecord: the files TensorFlow wrote, CRC checks, truncation, Example specs, writing, flat memory."""

import gzip

import numpy as np
import pytest

from zmqflow.common.errors import DataLossError, InvalidArgumentError
from zmqflow.inputs.formats import (FixedLenFeature, TFRecordFormat, VarLenFeature, iter_records, make_example,
                                     open_format, write_tfrecord)
from zmqflow.inputs.formats.tfrecord import Example, masked_crc32c
from tests.reader import data_path, mnist_csv, peak_bytes_while_reading, read_all

pytestmark = pytest.mark.unit

SHARDS = [("mnist_sample-00000-of-00002.tfrecord", 0), ("mnist_sample-00001-of-00002.tfrecord.gz", 50)]
MNIST_SPEC = {"image": FixedLenFeature([784], "float32"), "image_raw": FixedLenFeature([], "string"),
              "label": FixedLenFeature([], "int64")}
RECORD_SIZE = 3997  # every record of shard 0: 16 bytes of framing + a 3981-byte Example


@pytest.mark.parametrize("name, first_row", SHARDS)
def test_tensorflow_files_equal_the_csv_rows(name, first_row):
    pixels, labels = mnist_csv()
    rows = slice(first_row, first_row + 50)
    fmt = open_format("tfrecord", features=MNIST_SPEC, chunk_size=16)
    assert fmt.spec == {"image": ("float32", (784,)), "image_raw": ("string", ()), "label": ("int64", ())}
    features, counts = read_all(fmt, data_path(name))
    assert counts == [16, 16, 16, 2]
    np.testing.assert_allclose(features["image"], pixels[rows] / 255, rtol=0, atol=1e-6)
    assert [np.frombuffer(raw, np.uint8).tolist() for raw in features["image_raw"]] == pixels[rows].tolist()
    np.testing.assert_array_equal(features["label"], labels[rows])
    assert fmt.counters.records_read == 50


def test_raw_records_without_a_spec():
    fmt = TFRecordFormat()
    features, _ = read_all(fmt, data_path(SHARDS[0][0]))
    assert features["record"].shape == (50,) and len(features["record"][0]) == RECORD_SIZE - 16
    assert fmt.counters.bytes_read == RECORD_SIZE * 50
    records = list(iter_records(data_path(SHARDS[1][0])))
    labels = [Example.FromString(data).features.feature["label"].int64_list.value[0] for data in records]
    assert labels == mnist_csv()[1][50:100].tolist()


def test_masked_crc32c_matches_the_standard_check_value():
    crc = 0xE3069283  # CRC-32C of b"123456789"
    assert masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@pytest.mark.parametrize("flip_at, what", [(3 * RECORD_SIZE + 12 + 100, "data"), (2 * RECORD_SIZE + 3, "length")])
def test_flipped_byte_is_data_loss_naming_the_record_offset(tmp_path, flip_at, what):
    data = bytearray(open(data_path(SHARDS[0][0]), "rb").read())
    data[flip_at] ^= 0x40
    path = tmp_path / "bad.tfrecord"
    path.write_bytes(bytes(data))
    offset = flip_at // RECORD_SIZE * RECORD_SIZE
    with pytest.raises(DataLossError, match=rf"{path}: corrupted record at offset {offset}: {what} checksum"):
        list(TFRecordFormat(MNIST_SPEC).read(path))


@pytest.mark.parametrize("keep", [5 * RECORD_SIZE + 100, 5 * RECORD_SIZE + 7, 6 * RECORD_SIZE - 1])
def test_truncated_file_is_data_loss_naming_the_offset(tmp_path, keep):
    path = tmp_path / "cut.tfrecord"
    path.write_bytes(open(data_path(SHARDS[0][0]), "rb").read()[:keep])
    fmt = TFRecordFormat(MNIST_SPEC, chunk_size=2)
    chunks = fmt.read(path)
    assert sum(next(chunks).count for _ in range(2)) == 4
    with pytest.raises(DataLossError, match=rf"{path}: truncated record at offset {5 * RECORD_SIZE}"):
        next(chunks)


def test_truncated_gzip_is_data_loss(tmp_path):
    path = tmp_path / "cut.tfrecord.gz"
    path.write_bytes(open(data_path(SHARDS[1][0]), "rb").read()[:-20])
    with pytest.raises(DataLossError, match=str(path)):
        list(TFRecordFormat().read(path))


def test_empty_file_gives_no_records(tmp_path):
    (tmp_path / "e.tfrecord").write_bytes(b"")
    assert list(TFRecordFormat(MNIST_SPEC).read(tmp_path / "e.tfrecord")) == []
    write_tfrecord(tmp_path / "e.tfrecord.gz", [], gzip=True)
    assert list(TFRecordFormat(MNIST_SPEC).read(tmp_path / "e.tfrecord.gz")) == []


@pytest.mark.parametrize("compress", [False, True])
def test_write_tfrecord_round_trip(tmp_path, compress):
    path = tmp_path / ("w.tfrecord.gz" if compress else "w.tfrecord")
    examples = [{"x": np.arange(3, dtype=np.float32) + i, "id": i, "name": f"n{i}", "raw": bytes([i, 0])}
                for i in range(5)]
    examples.append(make_example({"x": [9.0, 9.5, 10.0], "id": [99], "name": b"m", "raw": [b"\x00"]}))
    examples.append(make_example({"x": [0.0, 0.0, 0.0], "id": 7, "name": "s", "raw": b""}).SerializeToString())
    assert write_tfrecord(path, examples, gzip=compress) == 7
    if compress:
        assert gzip.open(path).read(8)  # a real gzip stream
    spec = {"x": FixedLenFeature([3], "float32"), "id": FixedLenFeature([], "int64"),
            "name": FixedLenFeature([], "string"), "raw": FixedLenFeature([1], "string")}
    features, _ = read_all(TFRecordFormat(spec), path)
    np.testing.assert_array_equal(features["x"][4], [4, 5, 6])
    np.testing.assert_array_equal(features["id"], [0, 1, 2, 3, 4, 99, 7])
    assert list(features["name"]) == [b"n0", b"n1", b"n2", b"n3", b"n4", b"m", b"s"]
    assert features["raw"][:, 0].tolist() == [bytes([i, 0]) for i in range(5)] + [b"\x00", b""]


def test_varlen_and_defaults(tmp_path):
    path = tmp_path / "v.tfrecord"
    write_tfrecord(path, [{"tags": [b"a", b"b"], "ids": [1, 2, 3]}, {"ids": [4]}, {"tags": ["c"], "w": 0.5}])
    spec = {"tags": VarLenFeature("string"), "ids": VarLenFeature("int64"),
            "w": FixedLenFeature([], "float32", default_value=-1.0),
            "v": FixedLenFeature([2], "int32", default_value=[7, 8])}
    fmt = TFRecordFormat(spec)
    assert fmt.spec["tags"] == ("string", (None,)) and fmt.spec["v"] == ("int32", (2,))
    features, _ = read_all(fmt, path)
    assert [list(t) for t in features["tags"]] == [[b"a", b"b"], [], [b"c"]]
    assert [i.tolist() for i in features["ids"]] == [[1, 2, 3], [4], []]
    assert features["ids"][0].dtype == np.int64
    np.testing.assert_array_equal(features["w"], [-1.0, -1.0, 0.5])
    np.testing.assert_array_equal(features["v"], [[7, 8]] * 3)


def test_specs_from_a_config_file_and_casts(tmp_path):
    path = tmp_path / "c.tfrecord"
    write_tfrecord(path, [{"n": [1, 2], "t": ["x"]}, {"n": [3, 300], "t": []}])
    fmt = TFRecordFormat({"n": {"shape": [2], "dtype": "int32"}, "t": {"dtype": "string"}})
    assert fmt.spec == {"n": ("int32", (2,)), "t": ("string", (None,))}
    np.testing.assert_array_equal(read_all(fmt, path)[0]["n"], [[1, 2], [3, 300]])
    with pytest.raises(InvalidArgumentError, match=r"offset \d+: .*out of the range of uint8"):
        list(TFRecordFormat({"n": FixedLenFeature([2], "uint8")}).read(path))
    with pytest.raises(InvalidArgumentError, match="fully defined shape"):
        TFRecordFormat({"n": FixedLenFeature([-1], "int64")})


@pytest.mark.parametrize("spec, message", [
    ({"missing": FixedLenFeature([], "int64")}, "required feature 'missing' is missing"),
    ({"label": FixedLenFeature([2], "int64")}, "'label' has 1 values, expected 2"),
    ({"label": FixedLenFeature([], "float32")}, "'label' is a int64_list, expected a float_list"),
])
def test_example_not_matching_the_spec_is_invalid_argument(spec, message):
    with pytest.raises(InvalidArgumentError, match=rf"tfrecord: record at offset 0: .*{message}"):
        list(TFRecordFormat(spec).read(data_path(SHARDS[0][0])))


def test_record_that_is_not_an_example(tmp_path):
    path = tmp_path / "junk.tfrecord"
    write_tfrecord(path, [make_example({"a": 1}).SerializeToString(), b"\xff\xff\xff"])
    with pytest.raises(InvalidArgumentError, match=f"offset {16 + 14}: not a tf.train.Example"):
        list(TFRecordFormat({"a": FixedLenFeature([], "int64")}).read(path))


def test_memory_stays_flat_on_a_large_file(tmp_path):
    record = make_example({"image": np.linspace(0, 1, 784, dtype=np.float32), "label": 3}).SerializeToString()
    path = tmp_path / "big.tfrecord"
    write_tfrecord(path, [record] * 1600)
    assert path.stat().st_size > 5_000_000
    fmt = TFRecordFormat({"image": FixedLenFeature([784], "float32"), "label": FixedLenFeature([], "int64")},
                         chunk_size=32)
    peak = peak_bytes_while_reading(fmt, path)
    assert fmt.counters.records_read == 1600
    assert peak < path.stat().st_size / 10, peak
