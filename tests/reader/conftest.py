"""Fixtures of the reader pipeline tests: CSV shards cut from the shared MNIST file."""

import gzip

import numpy as np
import pytest

from tests.reader import data_path

MNIST_OPTIONS = {"record_defaults": [[0.0]] * 784 + [[0]], "columns": {"image": list(range(784)), "label": 784},
                 "scale": {"image": 1 / 255}}
# the shards below carry one more column, the row's index in the MNIST file, to count deliveries
ID_OPTIONS = {"record_defaults": [[0.0]] * 784 + [[0], [0]],
              "columns": {"image": list(range(784)), "label": 784, "id": 785}, "scale": {"image": 1 / 255}}


@pytest.fixture(scope="session")
def mnist_lines():
    """The 5,000 lines of data/mnist_5k.csv.gz (sorted by label), as bytes with their newline."""
    with gzip.open(data_path("mnist_5k.csv.gz")) as f:
        return f.read().splitlines(keepends=True)


def write_shards(directory, lines, count, with_id=False):
    """`count` contiguous shards of `lines` as shard-XX.csv in `directory`; returns their paths."""
    paths = []
    for i, rows in enumerate(np.array_split(np.arange(len(lines)), count)):
        path = directory / f"shard-{i:02d}.csv"
        with open(path, "wb") as f:
            for r in rows:
                f.write(lines[r].rstrip(b"\n") + b",%d\n" % r if with_id else lines[r])
        paths.append(path)
    return paths


@pytest.fixture(scope="session")
def id_shards(tmp_path_factory, mnist_lines):
    """8 CSV shards of the 5,000 MNIST rows with an id column: (glob pattern, number of rows)."""
    directory = tmp_path_factory.mktemp("id-shards")
    write_shards(directory, mnist_lines, 8, with_id=True)
    return str(directory / "shard-*.csv"), len(mnist_lines)


@pytest.fixture(scope="session")
def label_shards(tmp_path_factory, mnist_lines):
    """200 shards of 25 rows each: as the file is sorted by label, every shard holds one label."""
    directory = tmp_path_factory.mktemp("label-shards")
    write_shards(directory, mnist_lines, 200)
    return str(directory / "shard-*.csv")
