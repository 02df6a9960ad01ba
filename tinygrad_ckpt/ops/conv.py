"""2-D convolution, as a matrix product over a sliding-window view of the input (im2col).

Every output pixel of a convolution reads one window of the (padded)
input: C/groups channels by kh by kw values. Lay each window out as a
column of a matrix (im2col) and the convolution is one matrix product,
weight (Co, C/groups * kh * kw) @ columns. NumPy's stride tricks make that
matrix a *view* of the input, `windows` below: no value is copied until the
product needs the columns side by side.

What lives here: `windows` (the strided view; pool.py slides the same
windows), `pair` and `output_size` (the argument checks conv and pooling
share), and the Conv2d op. What does not: pooling (pool.py), padding as an
op of its own (movement.Pad), the Conv2d layer with its parameters
(nn/conv.py).
"""

import numbers

import numpy

from ..autocast import is_16bit
from ..backend import array_module
from ..function import Function
from .matmul import _mm
from .movement import pad_array


def pair(op, name, value, smallest):
    """An int or a pair of ints, as a pair of Python ints (height, width); each at least `smallest`.

    NumPy integers count as ints (shapes read from arrays are NumPy integers); bools do not.
    """
    def is_int(v):
        return isinstance(v, numbers.Integral) and not isinstance(v, bool)

    values = (value, value) if is_int(value) else tuple(value) if isinstance(value, (tuple, list)) else ()
    if len(values) != 2 or not all(is_int(v) and v >= smallest for v in values):
        raise ValueError(f"{op}: {name} must be an int >= {smallest} or a pair of them, got {value!r}")
    return tuple(int(v) for v in values)


def output_size(op, x_shape, kernel, stride, padding, dilation):
    """(OH, OW): how many windows fit, OH = (H + 2 ph - dh (kh - 1) - 1) // sh + 1 (and OW alike).

    A kernel larger than the padded input is an error, as in PyTorch.
    """
    if len(x_shape) != 4:
        raise ValueError(f"{op}: expected a 4-D input (N, C, H, W), got shape {tuple(x_shape)}")
    padded = [n + 2 * p for n, p in zip(x_shape[2:], padding)]
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]  # a dilated kernel's extent
    if any(s > n for s, n in zip(spans, padded)):
        raise ValueError(f"{op}: padded input size per channel ({padded[0]} x {padded[1]}) is smaller than "
                         f"the (dilated) kernel size ({spans[0]} x {spans[1]}): the kernel cannot be "
                         "greater than the padded input")
    return tuple((n - s) // st + 1 for n, s, st in zip(padded, spans, stride))


def windows(x, kernel, stride, dilation, out_size):
    """The sliding windows of x (N, C, H, W) as a view of shape (N, C, kh, kw, OH, OW):

        view[n, c, i, j, oh, ow] = x[n, c, oh * sh + i * dh, ow * sw + j * dw]

    No copy: the view steps through x's memory with these strides (moving
    one window down is sh rows of x, one kernel row down is dh rows). Read it
    only: its elements overlap, so writing one would change several.
    """
    (kh, kw), (sh, sw), (dh, dw), (OH, OW) = kernel, stride, dilation, out_size
    N, C = x.shape[:2]
    sN, sC, sH, sW = x.strides
    return array_module(x).lib.stride_tricks.as_strided(
        x, shape=(N, C, kh, kw, OH, OW), strides=(sN, sC, sH * dh, sW * dw, sH * sh, sW * sw))


def window_slices(i, j, stride, dilation, out_size):
    """The pixels that element (i, j) of every window reads, as a pair of slices of the padded input."""
    (sh, sw), (dh, dw), (OH, OW) = stride, dilation, out_size
    return (slice(i * dh, i * dh + sh * (OH - 1) + 1, sh),
            slice(j * dw, j * dw + sw * (OW - 1) + 1, sw))


def pad_image(x, padding, value=0.0):
    """x (N, C, H, W) with `padding` (ph, pw) rows and columns of value around each image; x itself for (0, 0)."""
    ph, pw = padding
    return pad_array(x, [(0, 0), (0, 0), (ph, ph), (pw, pw)], value) if ph or pw else x


class Conv2d(Function):
    """PyTorch's conv2d (a cross-correlation): x (N, C, H, W), weight (Co, C/G, kh, kw), bias (Co,)
    -> out (N, Co, OH, OW), with G = groups, stride, padding, dilation as in PyTorch:

        out[n, o, oh, ow] = bias[o] + sum over c, i, j of
                            weight[o, c, i, j] * xpad[n, group(o) * C/G + c, oh sh + i dh, ow sw + j dw]

    Per group, a matrix product (K = C/G kh kw values per window, L = OH OW windows):

        cols    = the windows of xpad, (N, G, K, L)       the im2col matrix
        out     = weight (G, Co/G, K) @ cols               (N, G, Co/G, L)
        dweight = g (G, Co/G, N L) @ cols^T                summed over the batch by the product
        dcols   = weight^T (G, K, Co/G) @ g                each column added back where its window came from -> dx
        dbias   = g summed over N, OH, OW

    Saves x (for dweight) and weight (for dx), what PyTorch saves too:
    x.nbytes of activation memory (the weight is a parameter, held anyway),
    and only what a gradient is asked for needs (x if the weight needs one,
    the weight if x does). The padded input and `cols` are temporaries:
    cols is a view of the padded input until the product copies it,
    N G K L itemsize bytes (kh kw times x's bytes for stride 1 and padding
    that keeps the size), freed when forward returns; backward makes it
    again, in the order its product wants, for dweight.

    16-bit (autocast.py puts conv2d on the lower-precision list): the
    products go through matmul.py's `_mm` (float32 sums, rounded once), and
    the sums of backward (the bias's, col2im's) add in float32 too.
    """

    @staticmethod
    def forward(ctx, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        stride, padding = pair("conv2d", "stride", stride, 1), pair("conv2d", "padding", padding, 0)
        dilation = pair("conv2d", "dilation", dilation, 1)
        Co, Cg, kh, kw = _check_shapes(x, weight, bias, groups)
        OH, OW = output_size("conv2d", x.shape, (kh, kw), stride, padding, dilation)
        N, C = x.shape[:2]
        G = int(groups)
        ctx.shapes = x.shape, weight.shape, (OH, OW)
        ctx.options = stride, padding, dilation, G
        need_x, need_weight = ctx.needs_input_grad[:2]
        ctx.save_for_backward(x if need_weight else None, weight if need_x else None)
        view = windows(pad_image(x, padding), (kh, kw), stride, dilation, (OH, OW))  # (N, C, kh, kw, OH, OW)
        cols = view.reshape(N, G, Cg * kh * kw, OH * OW)  # (N, G, K, L): the copy
        out = _mm(weight.reshape(G, Co // G, Cg * kh * kw), cols)  # (N, G, Co/G, L)
        out = out.reshape(N, Co, OH, OW)  # a view: the groups' channels are consecutive
        if bias is not None:
            out += bias.reshape(Co, 1, 1)
        return out

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_arrays
        (N, C, H, W), (Co, Cg, kh, kw), (OH, OW) = ctx.shapes
        stride, padding, dilation, G = ctx.options
        need = ctx.needs_input_grad
        xp = array_module(g)
        K = Cg * kh * kw
        dx = dweight = None
        if need[0] or need[1]:  # g with the batch folded into the pixels, one matrix per group
            g_rows = g.reshape(N, G, Co // G, OH * OW).transpose(1, 2, 0, 3).reshape(G, Co // G, N * OH * OW)  # a copy
        if need[1]:
            view = windows(pad_image(x, padding), (kh, kw), stride, dilation, (OH, OW))  # (N, C, kh, kw, OH, OW)
            cols = view.transpose(1, 2, 3, 0, 4, 5).reshape(G, K, N * OH * OW)  # (G, K, N L): the copy
            dweight = _mm(g_rows, cols.transpose(0, 2, 1)).reshape(Co, Cg, kh, kw)  # (G, Co/G, K)
        if need[0]:
            dcols = _mm(weight.reshape(G, Co // G, K).transpose(0, 2, 1), g_rows)  # (G, K, N L)
            dcols = dcols.reshape(C, kh, kw, N, OH, OW)  # (G, Cg) are the channels, in order
            ph, pw = padding
            wide = numpy.float32 if is_16bit(g.dtype) else g.dtype  # 16 bits: add in float32, round once
            dxpad = xp.zeros((N, C, H + 2 * ph, W + 2 * pw), dtype=wide)
            for i in range(kh):  # col2im: each window element adds its gradient back to the pixels it read
                for j in range(kw):
                    rows, columns = window_slices(i, j, stride, dilation, (OH, OW))
                    dxpad[:, :, rows, columns] += dcols[:, i, j].transpose(1, 0, 2, 3)  # (N, C, OH, OW)
            dx = dxpad[:, :, ph:ph + H, pw:pw + W].astype(g.dtype, copy=False)
        if len(need) == 2:
            return dx, dweight
        dbias = None
        if need[2]:  # 16 bits: summed in float32, rounded once
            dbias = g.sum(axis=(0, 2, 3), dtype=numpy.float32 if is_16bit(g.dtype) else None).astype(g.dtype, copy=False)
        return dx, dweight, dbias


def _check_shapes(x, weight, bias, groups):
    """Shapes that fit together, as PyTorch checks them; returns weight's shape (Co, C/G, kh, kw)."""
    if weight.ndim != 4:
        raise ValueError(f"conv2d: weight must be 4-D (out_channels, in_channels/groups, kh, kw), got shape {tuple(weight.shape)}")
    if x.ndim != 4:
        raise ValueError(f"conv2d: expected a 4-D input (N, C, H, W), got shape {tuple(x.shape)}")
    Co, Cg, kh, kw = weight.shape
    if isinstance(groups, bool) or not isinstance(groups, numbers.Integral) or groups < 1:
        raise ValueError(f"conv2d: groups must be a positive integer, got {groups!r}")
    if Co % groups:
        raise ValueError(f"conv2d: given groups={groups}, expected weight to be divisible by {groups} at "
                         f"dimension 0, but got weight of size {list(weight.shape)} instead")
    if x.shape[1] != Cg * groups:
        raise ValueError(f"conv2d: given groups={groups}, weight of size {list(weight.shape)}, expected "
                         f"input{list(x.shape)} to have {Cg * groups} channels, but got {x.shape[1]} channels instead")
    if bias is not None and tuple(bias.shape) != (Co,):
        raise ValueError(f"conv2d: bias of shape {tuple(bias.shape)} does not match {Co} output channels")
    return Co, Cg, kh, kw
