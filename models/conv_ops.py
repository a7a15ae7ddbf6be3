"""Convolution and pooling over NHWC images (TensorFlow's layout), forward and backward side by side.

conv2d is im2col: every output position's receptive field becomes a row, and the
convolution is one matrix product with the [kh*kw*cin, cout] kernel; backward is
two matrix products and col2im, which adds each row back where it came from.
Padding follows TensorFlow: 'valid' uses only whole windows; 'same' pads so the
output has ceil(size / stride) positions, the odd pixel going to the bottom/right.
"""

import functools

import numpy as np

from zmqflow.models.autograd import Tensor
from zmqflow.models.ops import xp_of

PADDINGS = ("same", "valid")


def output_size(size, window, stride, padding):
    """Output positions along one axis, and the padding (before, after) it needs."""
    if padding == "valid":
        if size < window:
            raise ValueError(f"a window of {window} does not fit an input of {size} with padding 'valid'")
        return (size - window) // stride + 1, (0, 0)
    out = -(-size // stride)
    total = max((out - 1) * stride + window - size, 0)
    return out, (total // 2, total - total // 2)


def _windows(x, kh, kw, stride, padding, fill=0.0):
    """The padded input and a view [n, oh, ow, c, kh, kw] of its windows."""
    xp = xp_of(x)
    oh, pad_h = output_size(x.shape[1], kh, stride, padding)
    ow, pad_w = output_size(x.shape[2], kw, stride, padding)
    if xp is not np:    # CuPy's pad and sliding_window_view cost 0.2-0.3 ms of Python a call (the CNN's profile)
        return _strided_windows(x, kh, kw, stride, (oh, ow), (pad_h, pad_w), fill, xp)
    if any(pad_h + pad_w):
        x = xp.pad(x, ((0, 0), pad_h, pad_w, (0, 0)), constant_values=fill)
    view = xp.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))
    return x, view[:, ::stride, ::stride][:, :oh, :ow], (pad_h, pad_w)


def _strided_windows(x, kh, kw, stride, out_size, pads, fill, xp):
    """_windows made directly: the padded input by one fill and one copy, the view by its strides."""
    (oh, ow), ((top, bottom), (left, right)) = out_size, pads
    if top or bottom or left or right:
        n, h, w, c = x.shape
        padded = xp.full((n, top + h + bottom, left + w + right, c), fill, dtype=x.dtype)
        padded[:, top:top + h, left:left + w, :] = x
        x = padded
    s0, s1, s2, s3 = x.strides
    view = xp.lib.stride_tricks.as_strided(x, shape=(x.shape[0], oh, ow, x.shape[3], kh, kw),
                                           strides=(s0, s1 * stride, s2 * stride, s3, s1, s2))
    return x, view, pads


def _scatter_windows(grad_windows, padded_shape, stride, pads, dtype, xp):
    """col2im: add grad_windows [n, oh, ow, kh, kw, c] back onto the padded input, then crop.
    Channels last, so each of the kh*kw strided additions reads whole rows."""
    n, oh, ow, kh, kw, c = grad_windows.shape
    out = xp.zeros(padded_shape, dtype=dtype)
    fused = _numba_col2im() if xp is np else _cupy_col2im()
    if fused is not None and grad_windows.flags.c_contiguous and grad_windows.dtype == dtype:
        fused(grad_windows, out, stride)
    else:
        for i in range(kh):
            for j in range(kw):
                out[:, i:i + stride * oh:stride, j:j + stride * ow:stride, :] += grad_windows[:, :, :, i, j, :]
    (top, bottom), (left, right) = pads
    return out[:, top:out.shape[1] - bottom, left:out.shape[2] - right, :]


@functools.lru_cache(maxsize=None)
def _cupy_col2im():
    """The CuPy backend's col2im (one launch instead of kh*kw strided additions)."""
    from zmqflow.models.kernels.cupy_kernels import col2im
    return col2im


@functools.lru_cache(maxsize=None)
def _numba_col2im():
    """The numba backend's col2im (parallel over images), or None without numba."""
    try:
        from zmqflow.models.kernels.numba_kernels import col2im
    except ImportError:
        return None
    return col2im


def conv2d(x, kernel, stride=1, padding="valid"):
    """x [n, h, w, cin] * kernel [kh, kw, cin, cout] -> [n, oh, ow, cout]."""
    kh, kw, cin, cout = kernel.shape
    if x.shape[-1] != cin:
        raise ValueError(f"conv2d: input has {x.shape[-1]} channels, the kernel expects {cin}")
    xp = xp_of(x.value)
    padded, view, pads = _windows(x.value, kh, kw, stride, padding)
    n, oh, ow = view.shape[:3]
    # rows in (kh, kw, cin) order, as the kernel's first three axes
    cols = xp.ascontiguousarray(view.transpose(0, 1, 2, 4, 5, 3)).reshape(n * oh * ow, kh * kw * cin)
    flat_kernel = kernel.value.reshape(kh * kw * cin, cout)
    out = Tensor((cols @ flat_kernel).reshape(n, oh, ow, cout), (x, kernel))

    def backward(g):
        g2 = g.reshape(n * oh * ow, cout)
        kernel.accumulate((cols.T @ g2).reshape(kernel.shape))
        if x.requires_grad:
            dcols = (g2 @ flat_kernel.T).reshape(n, oh, ow, kh, kw, cin)
            x.accumulate(_scatter_windows(dcols, padded.shape, stride, pads, x.dtype, xp))
    out.backward_fn = backward
    return out


def _tiles(x, size, stride, padding):
    """Non-overlapping windows that tile the input exactly (the usual 2x2 pool of an even image):
    a view [n, oh, size, ow, size, c] of x itself, with no copy and no padding; else None."""
    n, h, w, c = x.shape
    if stride != size or h % size or w % size or (padding == "valid" and (h < size or w < size)):
        return None
    return x.reshape(n, h // size, size, w // size, size, c)


def max_pool2d(x, size, stride=None, padding="valid"):
    stride = stride or size
    xp = xp_of(x.value)
    tiles = _tiles(x.value, size, stride, padding)
    if tiles is not None:
        return _max_pool_tiles(x, tiles, size, xp)
    padded, view, pads = _windows(x.value, size, size, stride, padding, fill=-np.inf)
    n, oh, ow, c = view.shape[:4]
    flat = view.reshape(n, oh, ow, c, size * size)
    winner = flat.argmax(axis=-1)
    out = Tensor(xp.take_along_axis(flat, winner[..., None], axis=-1)[..., 0], (x,))

    def backward(g):
        grad_windows = (xp.arange(size * size) == winner[..., None]) * g[..., None]      # [n, oh, ow, c, k*k]
        grad_windows = grad_windows.transpose(0, 1, 2, 4, 3).reshape(n, oh, ow, size, size, c)
        x.accumulate(_scatter_windows(grad_windows, padded.shape, stride, pads, x.dtype, xp))
    out.backward_fn = backward
    return out


def _max_pool_tiles(x, tiles, size, xp):
    """max_pool2d over exact tiles: reductions over views; the gradient goes to the first maximum
    of each window in row-major order, as TensorFlow's MaxPoolGrad (and the argmax path) route it."""
    top = tiles.max(axis=(2, 4))
    out = Tensor(top, (x,))

    def backward(g):
        if xp is not np and x.value.flags.c_contiguous:
            from zmqflow.models.kernels.cupy_kernels import max_pool_grad_tiles
            x.accumulate(max_pool_grad_tiles(x.value, top, g, size))
            return
        equal = tiles == top[:, :, None, :, None, :]
        taken = xp.zeros(top.shape, dtype=bool)
        grad = xp.zeros(tiles.shape, dtype=x.dtype)
        for i in range(size):
            for j in range(size):
                first = equal[:, :, i, :, j, :] & ~taken
                grad[:, :, i, :, j, :] = g * first
                taken |= first
        x.accumulate(grad.reshape(x.shape))
    out.backward_fn = backward
    return out


def avg_pool2d(x, size, stride=None, padding="valid"):
    """The mean of each window; with 'same' padding only real pixels count, as in TensorFlow."""
    stride = stride or size
    xp = xp_of(x.value)
    tiles = _tiles(x.value, size, stride, padding)
    if tiles is not None:
        out = Tensor(tiles.mean(axis=(2, 4)).astype(x.dtype, copy=False), (x,))
        share = 1.0 / (size * size)
        out.backward_fn = lambda g: x.accumulate(
            xp.broadcast_to((g * share)[:, :, None, :, None, :], tiles.shape).reshape(x.shape).astype(x.dtype))
        return out
    padded, view, pads = _windows(x.value, size, size, stride, padding)
    _, ones, _ = _windows(xp.ones(x.shape[:3] + (1,), dtype=x.dtype), size, size, stride, padding)
    count = ones.sum(axis=(-2, -1))                       # [n, oh, ow, 1]
    out = Tensor((view.sum(axis=(-2, -1)) / count).astype(x.dtype, copy=False), (x,))
    n, oh, ow, c = out.shape

    def backward(g):
        share = xp.broadcast_to((g / count)[:, :, :, None, None, :], (n, oh, ow, size, size, c))
        x.accumulate(_scatter_windows(share, padded.shape, stride, pads, x.dtype, xp))
    out.backward_fn = backward
    return out
