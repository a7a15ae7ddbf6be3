"""Compute backends of the MLP, one module each: numpy (reference), numba (CPU), cupy (GPU).

`get_backend(name)` returns a fresh `Kernels` object (each keeps its own scratch
buffers, so use one per thread). The interface is described in numpy_kernels.
"""

from zmqflow.common.errors import InvalidArgumentError

BACKENDS = ("numpy", "numba", "cupy")


def gpu_count():
    """How many CUDA devices CuPy sees (0 without CuPy or without a GPU)."""
    from zmqflow.models.kernels import cupy_kernels
    return cupy_kernels.gpu_count()


def available_backends():
    """The backends that work on this machine, CPU ones first."""
    return ["numpy", "numba"] + (["cupy"] if gpu_count() > 0 else [])


def get_backend(name):
    """A new `Kernels` object of backend 'numpy', 'numba' or 'cupy'."""
    if name == "numpy":
        from zmqflow.models.kernels.numpy_kernels import Kernels
    elif name == "numba":
        from zmqflow.models.kernels.numba_kernels import Kernels
    elif name == "cupy":
        from zmqflow.models.kernels import cupy_kernels
        if cupy_kernels.gpu_count() == 0:
            raise InvalidArgumentError(
                f"kernel backend 'cupy' needs a GPU, but {cupy_kernels.why_no_gpu()}; use 'numba' or 'numpy'")
        Kernels = cupy_kernels.Kernels
    else:
        raise InvalidArgumentError(f"unknown kernel backend {name!r}; expected one of {', '.join(BACKENDS)}")
    return Kernels()
