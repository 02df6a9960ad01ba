"""Pooling: the largest value, or the mean, of each window of an image.

The windows are conv.py's: a strided view of the padded input, no copy.
Backward sends each output pixel's gradient back to the pixels of its
window, one window element (i, j) at a time, so windows that overlap
(stride < kernel) add up where they share pixels.

What does not live here: convolution (conv.py), the layers (nn/conv.py).
"""

import numbers

import numpy

from ..backend import array_module, device_of, to_device
from ..function import Function
from .conv import output_size, pair, window_slices, windows
from .elementwise import narrow, wide
from .movement import pad_array


def pool_options(op, kernel_size, stride, padding, dilation):
    """kernel, stride (the kernel's when None, as in PyTorch), padding, dilation: each a pair, checked."""
    kernel = pair(op, "kernel_size", kernel_size, 1)
    stride = kernel if stride is None else pair(op, "stride", stride, 1)
    padding, dilation = pair(op, "padding", padding, 0), pair(op, "dilation", dilation, 1)
    if any(2 * p > k for p, k in zip(padding, kernel)):  # else a window could hold padding only
        raise ValueError(f"{op}: padding should be at most half of the kernel size, "
                         f"but got padding={padding} and kernel_size={kernel}")
    return kernel, stride, padding, dilation


def _check_input(op, x):
    """A 4-D input whose channels and image are not empty; an empty batch (N = 0) is fine, as in PyTorch."""
    if x.ndim == 4 and 0 in x.shape[1:]:
        raise ValueError(f"{op}: expected a 4-D input (N, C, H, W) with C, H and W above 0 (N may be 0), "
                         f"got shape {tuple(x.shape)}")


def _pad(x, padding, overhang, value):
    """x with `padding` rows and columns of value all round, and `overhang` more at the bottom and the right:
    where ceil_mode's last, partial window reaches past the padded image."""
    (ph, pw), (eh, ew) = padding, overhang
    return pad_array(x, [(0, 0), (0, 0), (ph, ph + eh), (pw, pw + ew)], value) if ph or pw or eh or ew else x


def _overhang(shape, kernel, stride, padding, dilation, out_size):
    """How far the last window reaches past the padded image, (rows, columns); 0 unless ceil_mode."""
    return tuple(max(0, (o - 1) * s + d * (k - 1) + 1 - (n + 2 * p))
                 for n, k, s, p, d, o in zip(shape[2:], kernel, stride, padding, dilation, out_size))


def _scatter_back(share, shape, options, value_at):
    """dx (N, C, H, W): each window element (i, j) adds value_at(i, j) (N, C, OH, OW) to the pixels it read."""
    (kh, kw), stride, (ph, pw), dilation, out_size, (eh, ew) = options
    N, C, H, W = shape
    dxpad = array_module(share).zeros((N, C, H + 2 * ph + eh, W + 2 * pw + ew), dtype=share.dtype)
    for i in range(kh):
        for j in range(kw):
            rows, columns = window_slices(i, j, stride, dilation, out_size)
            dxpad[:, :, rows, columns] += value_at(i, j)
    return dxpad[:, :, ph:ph + H, pw:pw + W]


class MaxPool2d(Function):
    """out[n, c, oh, ow] = the largest value of window (oh, ow) of x (N, C, H, W), padded with -inf;
    dx = g sent to that largest element (to the first of equal ones; a NaN is the largest, as in PyTorch).

    Saves the position of the largest element in each window: an int64 array
    the size of the output, 8 bytes per output element (PyTorch saves the
    same indices). The input is not kept. ceil_mode: see output_size.
    return_indices: a second output, where each largest element is, as
    PyTorch's: row * W + column in its image (not differentiable; for
    MaxUnpool2d).
    """

    @staticmethod
    def forward(ctx, x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
        kernel, stride, padding, dilation = pool_options("max_pool2d", kernel_size, stride, padding, dilation)
        _check_input("max_pool2d", x)
        out_size = output_size("max_pool2d", x.shape, kernel, stride, padding, dilation, ceil_mode)
        overhang = _overhang(x.shape, kernel, stride, padding, dilation, out_size)
        (N, C, _, W), (kh, kw), (OH, OW) = x.shape, kernel, out_size
        view = windows(_pad(x, padding, overhang, -float("inf")), kernel, stride, dilation, out_size)
        flat = view.reshape(N, C, kh * kw, OH, OW)  # a copy: the window's elements along one axis
        position = flat.argmax(axis=2)  # (N, C, OH, OW): which element, i * kw + j
        ctx.shape, ctx.options = x.shape, (kernel, stride, padding, dilation, out_size, overhang)
        ctx.save_for_backward(position)
        out = flat.max(axis=2)
        if not return_indices:
            return out
        xp, (sh, sw), (ph, pw), (dh, dw) = array_module(x), stride, padding, dilation
        i, j = position // kw, position % kw
        rows = xp.arange(OH)[:, None] * sh - ph + i * dh  # the row of x the largest element is in
        columns = xp.arange(OW) * sw - pw + j * dw
        return out, rows * W + columns

    @staticmethod
    def backward(ctx, g, g_indices=None):  # the indices take no gradient
        (position,) = ctx.saved_arrays
        xp, kw, zero = array_module(g), ctx.options[0][1], g.dtype.type(0)

        def routed(i, j):  # g where element (i, j) of the window was its largest, 0 elsewhere
            return xp.where(position == i * kw + j, g, zero)

        return _scatter_back(g, ctx.shape, ctx.options, routed)


class AvgPool2d(Function):
    """out[n, c, oh, ow] = the sum of window (oh, ow) of x (N, C, H, W), padded with zeros, / its divisor;
    dx = g / divisor added to every element of the window.  Saves nothing (the shapes only).

    The divisor, as PyTorch 2.13's kernel (aten/src/ATen/native/cpu/AvgPoolKernel.cpp) takes it:
    divisor_override if given; else the window's size within the padded image
    (count_include_pad=True, the default: the zero padding counts, ceil_mode's
    overhang does not); else (count_include_pad=False) the number of real
    pixels in the window. Each is a count of rows times a count of columns.

    A 16-bit input is summed in float32 and rounded once, forward and backward,
    as PyTorch's kernels do: 49 bfloat16 values added in bfloat16 lose a digit.
    """

    @staticmethod
    def forward(ctx, x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
        kernel, stride, padding, dilation = pool_options("avg_pool2d", kernel_size, stride, padding, 1)
        _check_input("avg_pool2d", x)
        out_size = output_size("avg_pool2d", x.shape, kernel, stride, padding, dilation, ceil_mode)
        overhang = _overhang(x.shape, kernel, stride, padding, dilation, out_size)
        ctx.shape, ctx.options = x.shape, (kernel, stride, padding, dilation, out_size, overhang)
        ctx.divide = count_include_pad, divisor_override
        view = windows(_pad(wide(x), padding, overhang, 0.0), kernel, stride, dilation, out_size)
        summed = view.sum(axis=(2, 3))  # summed through the view: no copy of the windows
        return narrow(summed / _divisor(x.shape, ctx.options, *ctx.divide, summed), x.dtype)

    @staticmethod
    def backward(ctx, g):
        share = wide(g)
        share = share / _divisor(ctx.shape, ctx.options, *ctx.divide, share)  # made again: nothing saved
        return narrow(_scatter_back(share, ctx.shape, ctx.options, lambda i, j: share), g.dtype)


def _divisor(shape, options, count_include_pad, divisor_override, like):
    """What each window's sum is divided by (see AvgPool2d): a number, or an (OH, OW) array of counts,
    made on the host and copied to like's device in like's dtype."""
    if divisor_override is not None:
        if isinstance(divisor_override, bool) or not isinstance(divisor_override, numbers.Integral):
            raise TypeError(f"avg_pool2d: divisor_override must be an int, got {divisor_override!r}")
        if divisor_override == 0:
            raise ValueError("avg_pool2d: divisor must be not zero")
        return float(divisor_override)
    kernel, stride, padding, _, out_size, _ = options
    counts = []
    for n, k, s, p, o in zip(shape[2:], kernel, stride, padding, out_size):
        start = numpy.arange(o) * s - p  # where each window starts, in x's coordinates
        end = numpy.minimum(start + k, n + p)  # within the padded image
        if not count_include_pad:  # the real pixels only
            start, end = numpy.maximum(start, 0), numpy.minimum(end, n)
        counts.append(end - start)
    if all((c == k).all() for c, k in zip(counts, kernel)):
        return float(kernel[0] * kernel[1])  # every window whole: one number
    return to_device((counts[0][:, None] * counts[1]).astype(like.dtype), device_of(like))  # (OH, OW)
