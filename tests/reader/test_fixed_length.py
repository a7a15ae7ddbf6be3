"""Fixed-length records: the shipped MNIST file, decode specs, truncation, gzip, flat memory."""

import gzip

import numpy as np
import pytest

from zmqflow.common.errors import DataLossError, InvalidArgumentError
from zmqflow.inputs.formats import FixedLengthFormat, open_format
from tests.reader import data_path, mnist_csv, peak_bytes_while_reading, read_all

pytestmark = pytest.mark.unit

MNIST_FIELDS = [("label", "uint8", 0), ("image", "uint8", 1, (784,))]


def test_mnist_bin_equals_the_csv_rows():
    pixels, labels = mnist_csv()
    fmt = open_format("fixed_length", record_bytes=785, header_bytes=4, footer_bytes=2,
                      fields=MNIST_FIELDS, chunk_size=32)
    assert fmt.spec == {"label": ("uint8", ()), "image": ("uint8", (784,))}
    features, counts = read_all(fmt, data_path("mnist_sample.bin"))
    assert counts == [32, 32, 32, 4]
    np.testing.assert_array_equal(features["image"], pixels[:100])
    np.testing.assert_array_equal(features["label"], labels[:100])
    assert fmt.counters.records_read == 100 and fmt.counters.bytes_read == 4 + 100 * 785 + 2
    first = next(fmt.instances(data_path("mnist_sample.bin")))
    assert first["label"] == labels[0] and first["image"].shape == (784,)
    chunk = next(fmt.read(data_path("mnist_sample.bin")))
    assert [t.shape for t in chunk.tensors(["image", "label"])] == [(32, 784), (32,)]


def test_whole_record_by_default_and_scale():
    fmt = FixedLengthFormat(785, header_bytes=4, footer_bytes=2, scale={"record": 1 / 255})
    features, _ = read_all(fmt, data_path("mnist_sample.bin"))
    assert features["record"].shape == (100, 785) and features["record"].dtype == np.float32
    np.testing.assert_allclose(features["record"][:, 1:], mnist_csv()[0][:100] / 255, rtol=1e-6)


def test_multibyte_fields_byte_order_and_gzip(tmp_path):
    n = 10
    records = np.zeros(n, dtype=[("id", ">i4"), ("xy", "<f4", (2, 3)), ("pad", "u1", 3)])
    records["id"] = np.arange(n) * 1000
    records["xy"] = np.arange(n * 6).reshape(n, 2, 3) / 4
    path = tmp_path / "r.bin.gz"
    path.write_bytes(gzip.compress(b"HEAD" + records.tobytes() + b"F"))
    fmt = FixedLengthFormat(records.dtype.itemsize, header_bytes=4, footer_bytes=1, chunk_size=3,
                            fields=[{"name": "id", "dtype": ">i4", "offset": 0}, ("xy", "<f4", 4, (2, 3))])
    assert fmt.spec == {"id": ("int32", ()), "xy": ("float32", (2, 3))}
    features, counts = read_all(fmt, str(path))
    assert counts == [3, 3, 3, 1]
    np.testing.assert_array_equal(features["id"], records["id"])
    np.testing.assert_array_equal(features["xy"], records["xy"])
    assert features["id"].dtype.isnative and features["xy"].flags.writeable


def test_truncated_last_record_is_data_loss_after_the_good_ones(tmp_path):
    path = tmp_path / "t.bin"
    path.write_bytes(b"HH" + bytes(range(10)) * 3 + b"\x01\x02\x03" + b"FF")
    fmt = FixedLengthFormat(10, header_bytes=2, footer_bytes=2, chunk_size=2)
    chunks = fmt.read(path)
    assert [next(chunks).count, next(chunks).count] == [2, 1]
    with pytest.raises(DataLossError, match=rf"{path}: truncated record at offset 32: 3 of 10 bytes"):
        next(chunks)


def test_short_header_or_footer_is_data_loss(tmp_path):
    (tmp_path / "h.bin").write_bytes(b"HE")
    (tmp_path / "f.bin").write_bytes(b"HEAD" + b"x")
    fmt = FixedLengthFormat(4, header_bytes=4, footer_bytes=2)
    with pytest.raises(DataLossError, match="inside its 4-byte header"):
        list(fmt.read(tmp_path / "h.bin"))
    with pytest.raises(DataLossError, match="inside its 2-byte footer"):
        list(fmt.read(tmp_path / "f.bin"))


def test_empty_file_gives_no_records(tmp_path):
    (tmp_path / "e.bin").write_bytes(b"")
    (tmp_path / "only.bin").write_bytes(b"HEADFT")
    fmt = FixedLengthFormat(785, header_bytes=4, footer_bytes=2)
    assert list(fmt.read(tmp_path / "e.bin")) == []
    assert list(fmt.read(tmp_path / "only.bin")) == []


def test_corrupt_gzip_is_data_loss(tmp_path):
    path = tmp_path / "c.bin.gz"
    path.write_bytes(gzip.compress(bytes(1000))[:-12])
    with pytest.raises(DataLossError, match="corrupt compressed stream"):
        list(FixedLengthFormat(10).read(path))


def test_bad_specs_are_invalid_argument():
    with pytest.raises(InvalidArgumentError, match="past the 785-byte record"):
        FixedLengthFormat(785, fields=[("image", "uint8", 2, (784,))])
    with pytest.raises(InvalidArgumentError, match="record_bytes"):
        FixedLengthFormat(0)
    with pytest.raises(InvalidArgumentError, match="unique"):
        FixedLengthFormat(4, fields=[("a", "u1", 0), ("a", "u1", 1)])
    with pytest.raises(InvalidArgumentError, match="unknown dtype"):
        FixedLengthFormat(4, fields=[("a", "nope", 0)])


def test_memory_stays_flat_on_a_large_file(tmp_path):
    path = tmp_path / "big.bin"
    block = np.random.default_rng(0).integers(0, 256, 785 * 1000, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        f.write(b"MNST")
        for _ in range(8):
            f.write(block)
        f.write(b"FT")
    fmt = FixedLengthFormat(785, header_bytes=4, footer_bytes=2, fields=MNIST_FIELDS, chunk_size=128)
    peak = peak_bytes_while_reading(fmt, path)
    assert fmt.counters.records_read == 8000
    assert peak < path.stat().st_size / 10, peak
