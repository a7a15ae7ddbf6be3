"""The MNIST sample that ships inside the package (zmqflow.data), and its fixed train/test split.

The CSV is sorted by label, so the test split is every 10th row (500 rows,
50 per digit) and the other 4,500 rows train; pixels are scaled to [0, 1].
Readers take the training split as fixed-length record shards (write_record_shards,
RECORD_FORMAT), so that no test row is ever trained on.
"""

import glob
import gzip
import importlib.resources
import io
import os

import numpy as np

DATA_DIR = str(importlib.resources.files("zmqflow.data"))
"""The shipped sample files' directory. Readers glob it, so it must be a real directory: it is for every
installed wheel and for `pip install -e .` (a zip import is not supported)."""
MNIST_CSV = os.path.join(DATA_DIR, "mnist_5k.csv.gz")
RECORD_FORMAT = {"record_bytes": 785, "fields": [["label", "uint8", 0], ["image", "uint8", 1, [784]]],
                 "scale": {"image": 1 / 255}}
"""The fixed_length reader options of write_record_shards' files: a label byte, then 784 pixel bytes."""


def load_mnist(path=MNIST_CSV):
    """(images float32 [N, 784] in [0, 1], labels int32 [N])."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        text = f.read()
    table = small_integer_table(text)
    if table is None:   # not the sample's plain layout: numpy's general parser
        table = np.loadtxt(io.StringIO(text.decode()), delimiter=",", dtype=np.float32, ndmin=2)
    return table[:, :-1] / np.float32(255.0), table[:, -1].astype(np.int32)


def small_integer_table(text):
    """A CSV of integers 0-999 without a header (the sample's pixels and labels) as float32 [rows, columns], or
    None for any other text (signs, decimals, spaces, empty fields, ragged rows). Whole-array numpy steps over
    the bytes instead of np.loadtxt's per-field parsing: 0.12 s of CPU against 0.6 s for the sample, which
    every MNIST job and many tests read at start."""
    if not text.endswith(b"\n"):
        text += b"\n"
    chars = np.frombuffer(text, np.uint8)
    newline = chars == ord("\n")
    separator = newline | (chars == ord(","))
    digits = chars - np.uint8(ord("0"))               # any other byte wraps past 9
    digit = digits <= 9
    if len(chars) < 2 or not np.all(digit | separator):
        return None
    if separator[0] or np.any(separator[1:] & separator[:-1]):
        return None                                   # an empty field
    if np.any(digit[3:] & digit[2:-1] & digit[1:-2] & digit[:-3]):
        return None                                   # a field of 4 digits or more
    number = digits.astype(np.uint16)                 # at each digit: its field's value up to it
    number[1:] += np.uint16(10) * digits[:-1] * digit[:-1]
    number[2:] += np.uint16(100) * digits[:-2] * (digit[:-2] & digit[1:-1])
    values = number[:-1][separator[1:]]               # each field's value, read at its last digit
    row_ends = np.flatnonzero(newline[separator])
    columns = row_ends[0] + 1
    if not np.array_equal(row_ends, np.arange(columns - 1, len(values), columns)):
        return None                                   # ragged rows
    return values.reshape(len(row_ends), columns).astype(np.float32)


def mnist_split(path=MNIST_CSV):
    """((train_x, train_y), (test_x, test_y)): test is every 10th row."""
    x, y = load_mnist(path)
    test = np.arange(len(y)) % 10 == 0
    return (x[~test], y[~test]), (x[test], y[test])


def write_record_shards(x, y, directory, shards=8, seed=0):
    """The rows as `shards` fixed-length record files (RECORD_FORMAT), in a seeded random order so that
    every file holds every digit; returns their paths. Each file is replaced atomically and shards of an
    earlier run with another count are removed, so rerunning is safe while nothing reads the files."""
    order = np.random.default_rng(seed).permutation(len(y))
    pixels = np.rint(x[order] * 255).astype(np.uint8)
    return write_shards(np.concatenate([y[order].astype(np.uint8)[:, None], pixels], axis=1), directory, shards)


def write_shards(records, directory, shards):
    """`records` (an array, one row per record) split over `shards` files train-XX-of-YY.bin, each
    replaced atomically; shards of an earlier run with another count are removed. Returns the paths."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i, part in enumerate(np.array_split(records, shards)):
        path = os.path.join(directory, f"train-{i:02d}-of-{shards:02d}.bin")
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(part.tobytes())
        os.replace(tmp, path)
        paths.append(path)
    for stale in set(glob.glob(os.path.join(directory, "train-*-of-*.bin"))) - set(paths):
        os.remove(stale)
    return paths
