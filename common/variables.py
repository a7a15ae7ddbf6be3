"""VariableSpec: what every task knows of a model variable (checkpoints, placement and models share it)."""

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class VariableSpec:
    """One model variable: its name (`hidden/weights`), shape and dtype name."""

    name: str
    shape: tuple
    dtype: str = "float32"

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))
