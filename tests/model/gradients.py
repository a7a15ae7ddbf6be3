"""Central finite differences: what every backward in the layer library is checked against."""

import numpy as np


def numeric_gradient(f, array, eps=1e-6):
    """d f() / d array, by moving each element of `array` (in place, restored) by +-eps."""
    grad = np.zeros_like(array)
    for index in np.ndindex(array.shape):
        old = array[index]
        array[index] = old + eps
        up = f()
        array[index] = old - eps
        down = f()
        array[index] = old
        grad[index] = (up - down) / (2 * eps)
    return grad
