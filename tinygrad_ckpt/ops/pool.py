"""Pooling: the largest value, or the mean, of each window of an image.

The windows are conv.py's: a strided view of the padded input, no copy.
Backward sends each output pixel's gradient back to the pixels of its
window, one window element (i, j) at a time, so windows that overlap
(stride < kernel) add up where they share pixels.

What does not live here: convolution (conv.py), the layers (nn/conv.py).
"""

from ..backend import array_module
from ..function import Function
from .elementwise import narrow, wide
from .conv import output_size, pad_image, pair, window_slices, windows


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


class MaxPool2d(Function):
    """out[n, c, oh, ow] = the largest value of window (oh, ow) of x (N, C, H, W), padded with -inf;
    dx = g sent to that largest element (to the first of equal ones; a NaN is the largest, as in PyTorch).

    Saves the position of the largest element in each window: an int64 array
    the size of the output, 8 bytes per output element (PyTorch saves the
    same indices). The input is not kept.
    """

    @staticmethod
    def forward(ctx, x, kernel_size, stride=None, padding=0, dilation=1):
        kernel, stride, padding, dilation = pool_options("max_pool2d", kernel_size, stride, padding, dilation)
        _check_input("max_pool2d", x)
        out_size = output_size("max_pool2d", x.shape, kernel, stride, padding, dilation)
        (N, C), (kh, kw), (OH, OW) = x.shape[:2], kernel, out_size
        view = windows(pad_image(x, padding, -float("inf")), kernel, stride, dilation, out_size)  # (N, C, kh, kw, OH, OW)
        flat = view.reshape(N, C, kh * kw, OH, OW)  # a copy: the window's elements along one axis
        ctx.shape, ctx.options = x.shape, (kernel, stride, padding, dilation, out_size)
        ctx.save_for_backward(flat.argmax(axis=2))  # (N, C, OH, OW): which element, i * kw + j
        return flat.max(axis=2)

    @staticmethod
    def backward(ctx, g):
        (position,) = ctx.saved_arrays
        (kh, kw), stride, (ph, pw), dilation, out_size = ctx.options
        N, C, H, W = ctx.shape
        xp = array_module(g)
        dxpad = xp.zeros((N, C, H + 2 * ph, W + 2 * pw), dtype=g.dtype)
        zero = g.dtype.type(0)
        for i in range(kh):
            for j in range(kw):
                rows, columns = window_slices(i, j, stride, dilation, out_size)
                dxpad[:, :, rows, columns] += xp.where(position == i * kw + j, g, zero)
        return dxpad[:, :, ph:ph + H, pw:pw + W]


class AvgPool2d(Function):
    """out[n, c, oh, ow] = the mean of window (oh, ow) of x (N, C, H, W), padded with zeros
    (the padding counts in the mean: PyTorch's default, count_include_pad=True);
    dx = g / (kh kw) added to every element of the window.  Saves nothing (the shapes only).

    A 16-bit input is summed in float32 and rounded once, forward and backward,
    as PyTorch's kernels do: 49 bfloat16 values added in bfloat16 lose a digit.
    """

    @staticmethod
    def forward(ctx, x, kernel_size, stride=None, padding=0):
        kernel, stride, padding, dilation = pool_options("avg_pool2d", kernel_size, stride, padding, 1)
        _check_input("avg_pool2d", x)
        out_size = output_size("avg_pool2d", x.shape, kernel, stride, padding, dilation)
        ctx.shape, ctx.options = x.shape, (kernel, stride, padding, dilation, out_size)
        view = windows(pad_image(wide(x), padding), kernel, stride, dilation, out_size)  # (N, C, kh, kw, OH, OW)
        return narrow(view.sum(axis=(2, 3)) / (kernel[0] * kernel[1]), x.dtype)  # summed through the view: no copy of the windows

    @staticmethod
    def backward(ctx, g):
        (kh, kw), stride, (ph, pw), dilation, out_size = ctx.options
        N, C, H, W = ctx.shape
        share = wide(g) / (kh * kw)
        dxpad = array_module(g).zeros((N, C, H + 2 * ph, W + 2 * pw), dtype=share.dtype)
        for i in range(kh):
            for j in range(kw):
                rows, columns = window_slices(i, j, stride, dilation, out_size)
                dxpad[:, :, rows, columns] += share
        return narrow(dxpad[:, :, ph:ph + H, pw:pw + W], g.dtype)
