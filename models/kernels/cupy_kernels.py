"""The CuPy backend of the engine's ops (interface: numpy_kernels): cuBLAS matmuls (`@`),
fused elementwise kernels.

Same structure as the numba backend: one elementwise kernel for bias add + activation,
one for upstream gradient * activation derivative, and the softmax cross-entropy
gradient in one kernel after two row reductions; bias gradients are column sums.

CuPy is imported only when a `Kernels` object is made, so this module imports on
machines without CuPy; `gpu_count()` says whether one can be made. Arrays live on the
GPU the `Kernels` object was made for (CuPy's current device by default).
"""

import functools
import sys
import threading

import numpy as np

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.kernels.numpy_kernels import check_labels

_ACTIVATION = {  # y = f(z + b)
    "sigmoid": "y = (T)1 / ((T)1 + exp(-(z + b)));",
    "relu": "y = max(z + b, (T)0);",
    "tanh": "y = tanh(z + b);",
    "none": "y = z + b;",
}
_DERIVATIVE = {  # d = g * f'(z), from the output a = f(z)
    "sigmoid": "d = g * a * ((T)1 - a);",
    "relu": "d = a > (T)0 ? g : (T)0;",
    "tanh": "d = g * ((T)1 - a * a);",
}


def _import_cupy():
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CUDA library that fails to load
        raise InvalidArgumentError(f"kernel backend 'cupy' is not available: {exc}") from exc
    return cupy


def gpu_count():
    """The number of CUDA devices CuPy can use; 0 without CuPy, a driver or a GPU."""
    try:
        return _import_cupy().cuda.runtime.getDeviceCount()
    except Exception:
        return 0


def why_no_gpu():
    """A short reason for gpu_count() == 0, for error messages."""
    try:
        cupy = _import_cupy()
        count = cupy.cuda.runtime.getDeviceCount()
        return f"CuPy sees {count} CUDA devices"
    except Exception as exc:
        return f"CuPy cannot use a GPU here ({exc})"


@functools.cache
def _kernels():
    """The compiled-on-first-use elementwise kernels, one per activation."""
    cupy = _import_cupy()
    bias_act = {name: cupy.ElementwiseKernel("T z, T b", "T y", body, f"zmqflow_bias_{name}")
                for name, body in _ACTIVATION.items()}
    act_grad = {name: cupy.ElementwiseKernel("T a, T g", "T d", body, f"zmqflow_grad_{name}")
                for name, body in _DERIVATIVE.items()}
    exp_shift = cupy.ElementwiseKernel("T top", "T z", "z = exp(z - top);", "zmqflow_exp_shift")
    xent_grad = cupy.ElementwiseKernel(
        "T total, raw L labels, int32 classes, T scale", "T p",
        "p = (p / total - (labels[i / classes] == i % classes ? (T)1 : (T)0)) * scale;",
        "zmqflow_xent_grad")
    return bias_act, act_grad, exp_shift, xent_grad


_COL2IM = """
int ch = i % c, rest = i / c;
int x = rest % w; rest /= w;
int y = rest % h; int b = rest / h;
T sum = out;
for (int ki = 0; ki < kh; ++ki) {
    int dy = y - ki;
    if (dy < 0 || dy % stride != 0 || dy / stride >= oh) continue;
    for (int kj = 0; kj < kw; ++kj) {
        int dx = x - kj;
        if (dx < 0 || dx % stride != 0 || dx / stride >= ow) continue;
        sum += windows[((((long long)(b * oh + dy / stride) * ow + dx / stride) * kh + ki) * kw + kj) * c + ch];
    }
}
out = sum;
"""


@functools.cache
def _col2im_kernel():
    return _import_cupy().ElementwiseKernel(
        "raw T windows, int32 oh, int32 ow, int32 kh, int32 kw, int32 c, int32 h, int32 w, int32 stride", "T out",
        _COL2IM, "zmqflow_col2im")


def col2im(grad_windows, out, stride):
    """Add grad_windows [n, oh, ow, kh, kw, c] (C-contiguous) onto out [n, h, w, c] (the padded input) in place:
    conv2d's input gradient in one launch, a thread per input element gathering the windows that cover it, in
    the (kh, kw) order of the reference's loop (numpy_kernels' caller, models/conv_ops.py)."""
    n, oh, ow, kh, kw, c = grad_windows.shape
    _col2im_kernel()(grad_windows, oh, ow, kh, kw, c, out.shape[1], out.shape[2], stride, out)
    return out


_MAX_POOL_GRAD = """
int ch = i % c, rest = i / c;
int x = rest % w; rest /= w;
int y = rest % h; int b = rest / h;
int oy = y / size, ox = x / size;
long long o = (((long long)b * (h / size) + oy) * (w / size) + ox) * c + ch;
int first = -1;
for (int k = 0; k < size * size && first < 0; ++k) {
    if (input[(((long long)b * h + oy * size + k / size) * w + ox * size + k % size) * c + ch] == top[o]) first = k;
}
out = first == (y - oy * size) * size + (x - ox * size) ? grad[o] : (T)0;
"""


@functools.cache
def _max_pool_grad_kernel():
    return _import_cupy().ElementwiseKernel(
        "raw T input, raw T top, raw T grad, int32 h, int32 w, int32 c, int32 size", "T out",
        _MAX_POOL_GRAD, "zmqflow_max_pool_grad")


def max_pool_grad_tiles(x, top, g, size):
    """The gradient of a max pool over exact size x size tiles of x [n, h, w, c] (C-contiguous), in one launch:
    each window's gradient goes to its first maximum in row-major order, as the reference (models/conv_ops.py's
    loop) and TensorFlow's MaxPoolGrad route it; a window holding NaN passes none."""
    xp = _import_cupy()
    n, h, w, c = x.shape
    out = xp.empty_like(x)
    _max_pool_grad_kernel()(x, xp.ascontiguousarray(top), xp.ascontiguousarray(g, dtype=x.dtype), h, w, c, size,
                            out)
    return out


class Kernels:
    """The CuPy backend (interface: see numpy_kernels) on GPU `index` (None: CuPy's current device).
    Every op runs with its GPU current, so layers on several GPUs compute each on its own."""

    name = "cupy"

    def __init__(self, index=None):
        self.xp = _import_cupy()
        self.index = self.xp.cuda.runtime.getDevice() if index is None else index
        self.device = ("GPU", self.index)
        self._bias_act, self._act_grad, self._exp_shift, self._xent_grad = _kernels()

    def current(self):
        """CuPy's `with` scope that makes this GPU current."""
        return self.xp.cuda.Device(self.index)

    def to_device(self, array, dtype=None):
        with self.current():
            return self.xp.ascontiguousarray(self.xp.asarray(array, dtype=dtype))

    def to_host(self, array):
        with self.current():
            return array.get()

    def dense(self, x, w, b, activation):
        with self.current():
            z = x @ w
            return self._bias_act[activation](z, 0 if b is None else b, z)

    def dense_grad(self, g, x, w, y, activation, need_dx, need_db):
        with self.current():
            d = g if activation == "none" else self._act_grad[activation](y, g, self.xp.empty_like(g))
            return d @ w.T if need_dx else None, x.T @ d, d.sum(axis=0) if need_db else None

    def softmax_cross_entropy(self, logits, labels):
        xp, (n, classes) = self.xp, logits.shape
        if isinstance(labels, np.ndarray):  # checked on the host, before the copy, without a device sync
            check_labels(labels, classes)
        with self.current():
            labels = xp.asarray(labels)
            d = logits.copy()
            top = d.max(axis=1, keepdims=True)
            picked = d[xp.arange(n), labels]
            self._exp_shift(top, d)
            total = d.sum(axis=1, keepdims=True)
            loss = xp.mean(xp.log(total[:, 0]) + top[:, 0] - picked)
            correct = xp.count_nonzero(logits.argmax(axis=1) == labels)
            self._xent_grad(total, labels, np.int32(classes), d.dtype.type(1.0 / n), d)
            loss, correct = xp.stack([loss.astype(xp.float64), correct.astype(xp.float64)]).get()   # one wait
            return float(loss), d, int(correct)

    def softmax(self, logits):
        with self.current():
            probs = logits.copy()
            self._exp_shift(probs.max(axis=1, keepdims=True), probs)
            probs /= probs.sum(axis=1, keepdims=True)
            return probs

    def staging(self, shapes, dtype):
        """A `PinnedStaging` for arrays of `shapes` in `dtype` on this GPU (one per model: its buffers are reused)."""
        return PinnedStaging(self, shapes, dtype)


_ALIGN_BYTES = 256
"""Each array's offset in a staging buffer: the alignment of CuPy's own allocations' blocks (cuBLAS and the
vectorised kernels read aligned rows)."""


def _layout(shapes, itemsize):
    """([(offset, size, shape)] in elements, total elements): `shapes` one after another, each aligned."""
    align, placed, offset = max(1, _ALIGN_BYTES // itemsize), [], 0
    for shape in shapes:
        shape = tuple(int(d) for d in shape)
        size = int(np.prod(shape, dtype=np.int64))
        placed.append((offset, size, shape))
        offset += -(-size // align) * align
    return placed, max(offset, 1)


class PinnedStaging:
    """A model's variables in and its gradients out through page-locked (pinned) host buffers: one host
    memcpy per variable into one pinned buffer, then ONE asynchronous copy into one device buffer whose slices
    are the variables (kept across steps); the gradients go out by asynchronous copies into one pinned buffer
    and a single wait. A copy from pageable memory is staged by the driver in small pinned chunks, synchronously,
    and cost a CuPy worker's CNN step more than half its time (13 MB each way).

    The gradients handed out are numpy views of a pinned buffer, and a push may still hold them (in flight)
    when the next step runs: a buffer is written again only when no view of it is alive (its reference counts
    are back to those it had when made), else another is made, up to `OUT_BUFFERS`; with all of them still
    held, `gradients_out` returns None and the caller copies the old way. Not for concurrent use: the caller
    holds `lock` around a step."""

    OUT_BUFFERS = 3

    def __init__(self, kernels, shapes, dtype, empty_pinned=None):
        self.kernels, self.xp = kernels, kernels.xp
        self.dtype = np.dtype(dtype)
        self.layout, self.total = _layout(shapes, self.dtype.itemsize)
        self.lock = threading.Lock()
        if empty_pinned is None:
            import cupyx
            empty_pinned = cupyx.empty_pinned
        self._empty_pinned = empty_pinned     # (shape, dtype=) -> a numpy array in page-locked memory
        self._device = None   # the device buffer, its views, the pinned buffer in: made by the first variables_in
        self._out = []        # [[pinned flat array, its reference counts when no view of it is out]]

    def _make_in(self):
        with self.kernels.current():
            self._device = self.xp.empty(self.total, dtype=self.dtype)
            self.device_views = [self._device[o:o + n].reshape(shape) for o, n, shape in self.layout]
            self._copied_in = self.xp.cuda.Event(block=False, disable_timing=True)
        self._pinned_in = self._empty_pinned((self.total,), dtype=self.dtype)
        self._in_views = [self._pinned_in[o:o + n].reshape(shape) for o, n, shape in self.layout]
        self._in_pending = False

    def variables_in(self, values):
        """Device arrays (views of the one device buffer) holding `values` (host arrays of the layout's shapes
        and dtype), copied in by one asynchronous copy on the GPU's current stream: the step's kernels, on that
        stream, run after it. The previous step's copy out of the pinned buffer is waited for first."""
        xp = self.xp
        if self._device is None:
            self._make_in()
        with self.kernels.current():
            if self._in_pending:
                self._copied_in.synchronize()
            for view, value in zip(self._in_views, values, strict=True):
                np.copyto(view, value, casting="same_kind")
            stream = xp.cuda.get_current_stream()
            xp.cuda.runtime.memcpyAsync(self._device.data.ptr, self._pinned_in.ctypes.data, self._pinned_in.nbytes,
                                        xp.cuda.runtime.memcpyHostToDevice, stream.ptr)
            self._copied_in.record(stream)
            self._in_pending = True
        return self.device_views

    def gradients_out(self, grads):
        """Host arrays of `grads` (device arrays of the layout's shapes, or None for a zero gradient): views of a
        free pinned buffer, filled by one asynchronous copy each and one wait; None when every buffer is held
        or a gradient's shape is not its variable's (the caller copies those the old way)."""
        grads = list(grads)
        if len(grads) != len(self.layout) or any(
                g is not None and (not isinstance(g, self.xp.ndarray) or tuple(g.shape) != shape)
                for (_, _, shape), g in zip(self.layout, grads)):
            return None
        flat = self._free_out()
        if flat is None:
            return None
        xp, keep, out = self.xp, [], []
        with self.kernels.current():
            stream = xp.cuda.get_current_stream()
            base = flat.ctypes.data
            for (offset, size, shape), g in zip(self.layout, grads):
                view = flat[offset:offset + size].reshape(shape)
                if g is None:
                    view[...] = 0
                elif size:
                    g = xp.ascontiguousarray(g, dtype=self.dtype)
                    keep.append(g)      # alive until the copies are done
                    xp.cuda.runtime.memcpyAsync(base + offset * self.dtype.itemsize, g.data.ptr, g.nbytes,
                                                xp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
                out.append(view)
            stream.synchronize()      # the step's one wait for its gradients (and for the GPU's tail)
        return out

    def _free_out(self):
        """A pinned gradient buffer that no handed-out view holds any more, made if need be; None if all are held.
        The counts are taken the same way when made and when checked (the list entry, the call's argument)."""
        for entry in self._out:
            if _references(entry[0]) == entry[1]:
                return entry[0]
        if len(self._out) == self.OUT_BUFFERS:
            return None
        self._out.append([self._empty_pinned((self.total,), dtype=self.dtype), None])
        entry = self._out[-1]
        entry[1] = _references(entry[0])
        return entry[0]


def _references(flat):
    """The reference counts of a buffer's array and of what it wraps: a numpy view of it holds one of them
    (numpy points a view's base at the array, or, in some versions, at the buffer under it)."""
    base = flat.base
    return sys.getrefcount(flat), (None if base is None else sys.getrefcount(base))
