"""A stub GPU for the device tests: the numpy backend underneath, but strict about where arrays live.

Arrays "on the GPU" are `FakeGpuArray`s; any ufunc (matmul, add, exp, sums...) that mixes one
with a plain host array fails, as CuPy refuses to mix numpy and CuPy arrays, so a missing
move between devices shows up. Its `device` is not the host's, so the engine moves tensors to it.
"""

import contextlib
import ctypes
import types

import numpy as np

from zmqflow.models.kernels.numpy_kernels import Kernels as NumpyKernels


class FakeGpuArray(np.ndarray):
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        arrays = inputs + tuple(kwargs.get("out", ()))
        if any(type(a) is np.ndarray and a.ndim > 0 for a in arrays):
            raise AssertionError(f"{ufunc.__name__} mixes a host array with a fake-GPU array")
        inputs = tuple(a.view(np.ndarray) if isinstance(a, FakeGpuArray) else a for a in inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(o.view(np.ndarray) for o in kwargs["out"])
        result = getattr(ufunc, method)(*inputs, **kwargs)
        return result.view(FakeGpuArray) if isinstance(result, np.ndarray) else result


class FakeGpuKernels(NumpyKernels):
    """The numpy kernels on FakeGpuArrays; counts the copies to and from the host."""

    name = "fake-gpu"

    def __init__(self, index=0):
        self.index, self.device, self.to_device_calls, self.to_host_calls = index, ("GPU", index), 0, 0

    def to_device(self, array, dtype=None):
        self.to_device_calls += 1
        assert not isinstance(array, FakeGpuArray), "device-to-device copies go through the host"
        return np.ascontiguousarray(array, dtype=dtype).copy().view(FakeGpuArray)

    def to_host(self, array):
        assert isinstance(array, FakeGpuArray), f"to_host of a {type(array).__name__}"
        self.to_host_calls += 1
        return array.view(np.ndarray).copy()


class FakeGpus:
    """`gpu_kernels` for DeviceOptions: a FakeGpuKernels per request, all kept for inspection."""

    def __init__(self):
        self.made = []

    def __call__(self, index):
        self.made.append(FakeGpuKernels(index))
        return self.made[-1]


def fake_gpu_options(num_gpus=1, **fields):
    """build_model / DeviceOptions keywords for `num_gpus` stub GPUs."""
    return dict(num_gpus=num_gpus, gpu_kernels=FakeGpus(), **fields)


# ------------------------------------------------------------------ a stub CuPy for the pinned staging

class FakeDeviceArray(FakeGpuArray):
    """A fake-GPU array with CuPy's `.data.ptr` (its address), for the staging's raw copies."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)


class _FakeStream:
    ptr = 0

    def synchronize(self):
        pass


class _FakeEvent:
    def __init__(self, block=False, disable_timing=False):
        self.recorded = 0

    def record(self, stream=None):
        self.recorded += 1

    def synchronize(self):
        pass


class FakeCupy:
    """The bits of CuPy that cupy_kernels.PinnedStaging uses, on host memory: its copies are memmoves (a wrong
    offset or size shows up as wrong numbers), its streams and events run in order."""

    ndarray = FakeGpuArray

    def __init__(self):
        self.copies = []    # (kind, bytes) of every memcpyAsync
        self.cuda = types.SimpleNamespace(
            Event=_FakeEvent, get_current_stream=_FakeStream,
            runtime=types.SimpleNamespace(memcpyHostToDevice=1, memcpyDeviceToHost=2, memcpyAsync=self._memcpy))

    def _memcpy(self, dst, src, size, kind, stream):
        self.copies.append((kind, size))
        ctypes.memmove(dst, src, size)

    @staticmethod
    def empty(shape, dtype):
        return np.empty(shape, dtype).view(FakeDeviceArray)

    @staticmethod
    def ascontiguousarray(a, dtype=None):
        return np.ascontiguousarray(a.view(np.ndarray), dtype=dtype).view(FakeDeviceArray)


class FakeStagingGpuKernels(FakeGpuKernels):
    """A FakeGpuKernels with the CuPy backend's `staging` (its real PinnedStaging) on a FakeCupy."""

    def __init__(self, index=0):
        super().__init__(index)
        self.xp = FakeCupy()

    def current(self):
        return contextlib.nullcontext()

    def to_device(self, array, dtype=None):
        return super().to_device(array, dtype).view(FakeDeviceArray)

    def staging(self, shapes, dtype):
        from zmqflow.models.kernels.cupy_kernels import PinnedStaging
        return PinnedStaging(self, shapes, dtype, empty_pinned=np.empty)
