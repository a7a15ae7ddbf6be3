"""The MNIST sample that ships in data/, and its fixed train/test split.

The CSV is sorted by label, so the test split is every 10th row (500 rows,
50 per digit) and the other 4,500 rows train; pixels are scaled to [0, 1].
"""

import gzip
import os

import numpy as np

DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
MNIST_CSV = os.path.join(DATA_DIR, "mnist_5k.csv.gz")


def load_mnist(path=MNIST_CSV):
    """(images float32 [N, 784] in [0, 1], labels int32 [N])."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    return table[:, :-1] / np.float32(255.0), table[:, -1].astype(np.int32)


def mnist_split(path=MNIST_CSV):
    """((train_x, train_y), (test_x, test_y)): test is every 10th row."""
    x, y = load_mnist(path)
    test = np.arange(len(y)) % 10 == 0
    return (x[~test], y[~test]), (x[test], y[test])
