"""VariableSpec: what every task knows of a model variable (checkpoints, placement and models share it)."""

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class VariableSpec:
    """One model variable: its name (`hidden/weights`), shape and dtype name.

    `trainable` False: the optimizer never touches it (BatchNorm's moving statistics, which the
    model computes and the ps stores); `initializer` names how a model draws its first value
    (e.g. "glorot_uniform", "zeros", "truncated_normal:0.1"); `device` is an optional
    placement hint (`/job:worker/task:1`), `None` for wherever the model runs.
    """

    name: str
    shape: tuple
    dtype: str = "float32"
    trainable: bool = True
    initializer: str = None
    device: str = None

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))


@dataclasses.dataclass(frozen=True)
class IndexedSlices:
    """A sparse gradient, as TensorFlow's: `values[k]` is the gradient of row `indices[k]` of a
    table (an Embedding's), every other row's is zero. A worker pushes only these rows."""

    indices: np.ndarray
    values: np.ndarray
