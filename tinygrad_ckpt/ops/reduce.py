"""Reductions: sum, mean and max over axes, with or without keepdims.

The adjoint of a reduction is a broadcast: the gradient of `x.sum(axis)` is
the incoming gradient, given its reduced axes back (as size 1) and broadcast
to x's shape. `expand` does that once for all three ops. Axes are
normalised by axes.py (-1 is the last; out of range is an error).
"""

from ..autocast import is_float
from ..backend import array_module, as_array
from ..function import Function
from .axes import normalize_axes


def expand(g, shape, axes):
    """Give `g` back the reduced `axes` (size 1) and broadcast it to `shape` (a view)."""
    g = as_array(g)  # NumPy may hand a 0-d result back as a scalar
    keep = tuple(1 if i in axes else n for i, n in enumerate(shape))
    return array_module(g).broadcast_to(g.reshape(keep), shape)


class Sum(Function):
    """out = x.sum(axes);  dx = g broadcast back over the summed axes.  Saves nothing."""

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        ctx.shape, ctx.axes = x.shape, normalize_axes("sum", axis, x.ndim)
        return x.sum(axis=ctx.axes, keepdims=keepdims)

    @staticmethod
    def backward(ctx, g):
        return expand(g, ctx.shape, ctx.axes)


class Mean(Function):
    """out = x.mean(axes);  dx = g / n broadcast back, n = elements averaged.  Saves nothing."""

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        ctx.shape, ctx.axes = x.shape, normalize_axes("mean", axis, x.ndim)
        n = 1
        for a in ctx.axes:
            n *= x.shape[a]
        ctx.n = n
        return x.mean(axis=ctx.axes, keepdims=keepdims)

    @staticmethod
    def backward(ctx, g):
        return expand(g / ctx.n, ctx.shape, ctx.axes)


class Max(Function):
    """out = x.max(axes);  dx = g at the maxima, shared equally between ties.

    As torch.amax and torch.max() (no dim); torch.max(x, dim) gives all of
    g to one of the ties instead. A NaN is the maximum of its slice, and the
    gradient goes to the NaNs, as torch.max's does (torch.amax's is NaN).
    Saves a boolean mask of where the maxima are (1 byte per element) and
    the number of ties per reduced slice.
    """

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        ctx.shape, ctx.axes = x.shape, normalize_axes("max", axis, x.ndim)
        if x.size == 0:
            raise ValueError(f"max of an empty tensor of shape {tuple(x.shape)}")
        out = x.max(axis=ctx.axes, keepdims=True)
        is_max = x == out
        if is_float(x.dtype):
            is_max |= array_module(x).isnan(x)  # NaN != NaN, yet it is the max
        ctx.save_for_backward(is_max, is_max.sum(axis=ctx.axes, keepdims=True).astype(x.dtype))
        return out if keepdims else out.reshape([n for i, n in enumerate(x.shape) if i not in ctx.axes])

    @staticmethod
    def backward(ctx, g):
        is_max, ties = ctx.saved_arrays
        return is_max * expand(g, ctx.shape, ctx.axes) / ties
