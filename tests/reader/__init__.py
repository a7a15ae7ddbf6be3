"""Tests of the reader service; helpers shared by its format tests."""

import gzip
import os
import tracemalloc

import numpy as np

from zmqflow.inputs.datasets import DATA_DIR

DATA = DATA_DIR


def data_path(name):
    return os.path.normpath(os.path.join(DATA, name))


def read_all(fmt, path):
    """Every chunk of `path` concatenated: {name: array}, plus the list of chunk counts."""
    chunks = list(fmt.read(path))
    names = fmt.spec
    features = {name: np.concatenate([c.features[name] for c in chunks]) if chunks else None for name in names}
    return features, [c.count for c in chunks]


_MNIST = None


def mnist_csv():
    """(pixels uint8 [5000, 784], labels int [5000]) of data/mnist_5k.csv.gz, parsed by plain Python."""
    global _MNIST
    if _MNIST is None:
        with gzip.open(data_path("mnist_5k.csv.gz"), "rt") as f:
            table = np.array([[int(field) for field in line.split(",")] for line in f])
        _MNIST = table[:, :784].astype(np.uint8), table[:, 784]
    return _MNIST


def peak_bytes_while_reading(fmt, path):
    """Peak traced allocation while every chunk of `path` is read and dropped."""
    tracemalloc.start()
    try:
        for _ in fmt.read(path):
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
