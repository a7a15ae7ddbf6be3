"""Backends of the engine's ops, one module each: numpy (reference), numba (CPU), cupy (GPU).

A backend is a table of ops (dense, its gradient, softmax cross-entropy, softmax) that
zmqflow.models.ops wraps as differentiable ops for every model; `get_backend(name)` returns
a `Kernels` object of one. The interface is described in numpy_kernels.
"""

from zmqflow.common.errors import InvalidArgumentError

BACKENDS = ("numpy", "numba", "cupy")
DEFAULT_BACKEND = "numba"
"""Every command's and the Python API's default (train, worker, sweep, serve, evaluate, zmqflow.serve): numba's
kernels are compiled once and cached on disk (cache=True), then run the MNIST MLP's steps several times faster
than numpy's (`zmqflow bench kernels`)."""


def gpu_count():
    """How many CUDA devices CuPy sees (0 without CuPy or without a GPU)."""
    from zmqflow.models.kernels import cupy_kernels
    return cupy_kernels.gpu_count()


def available_backends():
    """The backends that work on this machine, CPU ones first."""
    return ["numpy", "numba"] + (["cupy"] if gpu_count() > 0 else [])


def get_backend(name, gpu=None):
    """A `Kernels` object of backend 'numpy', 'numba' or 'cupy' (on GPU `gpu`, CuPy's current one by default)."""
    if name == "numpy":
        from zmqflow.models.kernels.numpy_kernels import Kernels
    elif name == "numba":
        from zmqflow.models.kernels.numba_kernels import Kernels
    elif name == "cupy":
        from zmqflow.models.kernels import cupy_kernels
        if cupy_kernels.gpu_count() == 0:
            raise InvalidArgumentError(
                f"kernel backend 'cupy' needs a GPU, but {cupy_kernels.why_no_gpu()}; use 'numba' or 'numpy'")
        return cupy_kernels.Kernels(gpu)
    else:
        raise InvalidArgumentError(f"unknown kernel backend {name!r}; expected one of {', '.join(BACKENDS)}")
    return Kernels()
