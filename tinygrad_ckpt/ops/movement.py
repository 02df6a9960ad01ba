"""Movement ops: reshape, permute, expand, indexing, splitting, concatenation, padding, copies (clone, to a device).

They move values without changing them, so each backward moves the gradient
back the opposite way: reshape back, permute by the inverse permutation, sum
over what expand repeated, scatter into zeros, split, cut the padding off. None of them saves an
array for backward except integer indices (an embedding lookup must remember
which rows it read).
Forward results are views wherever NumPy gives one, so no memory is copied
(except by clone, whose point is a copy).
"""

import numpy

from .. import backend
from ..backend import array_module
from ..function import Function
from .axes import normalize_axis, normalize_permutation
from .elementwise import unbroadcast


class Reshape(Function):
    """out = x.reshape(shape);  dx = g.reshape(x.shape).  Saves nothing.

    One size in `shape` may be -1: whatever makes the element count match,
    as in PyTorch (NumPy would take any negative size so).
    """

    @staticmethod
    def forward(ctx, x, shape):
        ctx.shape = x.shape
        if any(n < -1 for n in shape) or shape.count(-1) > 1:
            raise ValueError(f"reshape: {tuple(shape)} is not a shape: sizes are >= 0, and one at most may be -1 "
                             "(inferred from the others)")
        try:
            return x.reshape(shape)
        except ValueError:
            raise ValueError(
                f"reshape: cannot reshape a tensor of shape {tuple(x.shape)} "
                f"({x.size} elements) into {tuple(shape)}"
            ) from None

    @staticmethod
    def backward(ctx, g):
        return g.reshape(ctx.shape)


class Permute(Function):
    """out = x.transpose(axes);  dx = g.transpose(inverse of axes).  Saves nothing.

    The inverse is argsort(axes), which holds for axes in [0, ndim) only:
    forward normalises them first (-1 -> ndim - 1).
    """

    @staticmethod
    def forward(ctx, x, axes):
        ctx.axes = normalize_permutation("permute", axes, x.ndim)
        return x.transpose(ctx.axes)

    @staticmethod
    def backward(ctx, g):
        return g.transpose(tuple(int(a) for a in numpy.argsort(ctx.axes)))  # Python ints, as CuPy wants


class Expand(Function):
    """out = x repeated along its axes of size 1 (and new leading axes) to `shape`, a view;
    dx = g summed back over them (unbroadcast).  Saves nothing.

    As PyTorch's expand: -1 keeps an axis's size; only axes of size 1 grow.
    """

    @staticmethod
    def forward(ctx, x, shape):
        ctx.shape = x.shape
        extra = len(shape) - x.ndim  # new leading axes
        if extra < 0:
            raise ValueError(f"expand: {tuple(shape)} has fewer axes than the tensor's shape {tuple(x.shape)}")
        shape = tuple(x.shape[i - extra] if n == -1 and i >= extra else n for i, n in enumerate(shape))
        try:
            return array_module(x).broadcast_to(x, shape)
        except ValueError:
            raise ValueError(f"expand: a tensor of shape {tuple(x.shape)} cannot be expanded to {shape}: "
                             "only axes of size 1 grow (-1 keeps an axis, and is not allowed for a new one)") from None

    @staticmethod
    def backward(ctx, g):
        return unbroadcast(g, ctx.shape)


def _is_basic(index):
    """Slices, integers, None and Ellipsis only: no array indices."""
    parts = index if isinstance(index, tuple) else (index,)
    return all(p is None or p is Ellipsis or isinstance(p, (int, slice)) for p in parts)


class GetItem(Function):
    """out = x[index];  dx = zeros with g scattered (added) back at index.

    Basic indices (slices, ints) save nothing; integer-array indices, as in
    an embedding lookup, save the index array, since backward must know
    which rows to add the gradient into.
    """

    @staticmethod
    def forward(ctx, x, index):
        ctx.shape, ctx.dtype, ctx.basic = x.shape, x.dtype, _is_basic(index)
        if ctx.basic:
            ctx.index = index
        else:
            parts = index if isinstance(index, tuple) else (index,)
            ctx.save_for_backward(*[p if hasattr(p, "shape") else None for p in parts])
            ctx.index_parts = [None if hasattr(p, "shape") else p for p in parts]
            ctx.is_tuple = isinstance(index, tuple)
        try:
            return x[index]
        except IndexError as e:
            raise IndexError(f"getitem: index does not fit a tensor of shape {tuple(x.shape)}: {e}") from None

    @staticmethod
    def backward(ctx, g):
        grad = array_module(g).zeros(ctx.shape, dtype=ctx.dtype)
        if ctx.basic:
            grad[ctx.index] = g
            return grad
        parts = tuple(a if a is not None else p for a, p in zip(ctx.saved_arrays, ctx.index_parts))
        index = parts if ctx.is_tuple else parts[0]
        return backend.scatter_add(grad, index, g)


class Split(Function):
    """outs = x cut along axis into pieces of the given sizes (views);  dx = the pieces' gradients
    concatenated back (zeros for a piece no gradient reached).  Saves nothing.

    One record for every piece: backward writes x's gradient once, where
    slicing x piece by piece (GetItem) would scatter each piece's gradient
    into zeros the size of x and add them up.
    """

    @staticmethod
    def forward(ctx, x, sizes, axis=0):
        axis = normalize_axis("split", axis, x.ndim)
        if sum(sizes) != x.shape[axis] or min(sizes, default=0) < 0:
            raise ValueError(f"split: sizes {list(sizes)} do not add up to {x.shape[axis]}, "
                             f"axis {axis} of the tensor of shape {tuple(x.shape)}")
        ctx.axis = axis
        pieces, start = [], 0
        for n in sizes:
            pieces.append(x[(slice(None),) * axis + (slice(start, start + n),)])
            start += n
        return tuple(pieces)

    @staticmethod
    def backward(ctx, *grads):
        return array_module(*grads).concatenate(grads, axis=ctx.axis)


class Cat(Function):
    """out = concatenate(xs, axis);  dxs = g split at the same sizes.  Saves nothing."""

    @staticmethod
    def forward(ctx, *xs, axis=0):
        if not xs:
            raise ValueError("cat: needs at least one tensor, got none")
        if xs[0].ndim == 0:
            raise ValueError("cat: 0-d tensors cannot be concatenated (they have no axis); stack them instead")
        axis = ctx.axis = normalize_axis("cat", axis, xs[0].ndim)
        try:
            out = array_module(*xs).concatenate(xs, axis=axis)
        except ValueError:
            shapes = ", ".join(str(tuple(x.shape)) for x in xs)
            raise ValueError(f"cat: shapes {shapes} differ outside axis {axis}") from None
        ctx.sizes = [x.shape[axis] for x in xs]
        return out

    @staticmethod
    def backward(ctx, g):
        grads, start = [], 0
        for n, need in zip(ctx.sizes, ctx.needs_input_grad):
            index = [slice(None)] * g.ndim
            index[ctx.axis] = slice(start, start + n)
            grads.append(g[tuple(index)] if need else None)
            start += n
        return tuple(grads)


class Stack(Function):
    """out = stack(xs, axis);  dxs[i] = g taken at position i along axis.  Saves nothing."""

    @staticmethod
    def forward(ctx, *xs, axis=0):
        if not xs:
            raise ValueError("stack: needs at least one tensor, got none")
        axis = ctx.axis = normalize_axis("stack", axis, xs[0].ndim + 1)  # an axis of the result
        if len({tuple(x.shape) for x in xs}) > 1:
            shapes = ", ".join(str(tuple(x.shape)) for x in xs)
            raise ValueError(f"stack: all tensors need the same shape, got {shapes}")
        return array_module(*xs).stack(xs, axis=axis)

    @staticmethod
    def backward(ctx, g):
        return tuple(g[(slice(None),) * ctx.axis + (i,)] if need else None for i, need in enumerate(ctx.needs_input_grad))


class Pad(Function):
    """out = x with constant `value` around it;  dx = g with the border cut off.  Saves nothing.

    `widths`: one (before, after) pair per axis of x, each >= 0 (F.pad turns
    PyTorch's flat, last-axis-first argument into these pairs).
    """

    @staticmethod
    def forward(ctx, x, widths, value=0.0):
        if len(widths) != x.ndim or any(a < 0 or b < 0 for a, b in widths):
            raise ValueError(f"pad: widths {list(widths)} must be one pair (before, after) of sizes >= 0 "
                             f"for each of the {x.ndim} axes of the tensor of shape {tuple(x.shape)}")
        ctx.inside = tuple(slice(a, a + n) for n, (a, _) in zip(x.shape, widths))
        return pad_array(x, widths, value)

    @staticmethod
    def backward(ctx, g):
        return g[ctx.inside]


def pad_array(x, widths, value=0.0):
    """A new array: x with `value` around it, widths[i] = (before, after) along axis i.

    The Pad op's forward, and what conv.py and pool.py pad with.
    """
    shape = tuple(n + a + b for n, (a, b) in zip(x.shape, widths))
    out = array_module(x).full(shape, value, dtype=x.dtype)
    out[tuple(slice(a, a + n) for n, (a, _) in zip(x.shape, widths))] = x
    return out


class Clone(Function):
    """out = a copy of x in new memory;  dx = g.  Saves nothing."""

    @staticmethod
    def forward(ctx, x):
        return x.copy()

    @staticmethod
    def backward(ctx, g):
        return g


class ToDevice(Function):
    """out = x copied to another device;  dx = g copied back.  Saves nothing."""

    @staticmethod
    def forward(ctx, x, device):
        ctx.device = backend.device_of(x)
        return backend.to_device(x, device)

    @staticmethod
    def backward(ctx, g):
        return backend.to_device(g, ctx.device)
