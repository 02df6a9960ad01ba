"""Movement ops: reshape, permute, indexing, splitting, concatenation, copies (clone, to a device).

They move values without changing them, so each backward moves the gradient
back the opposite way: reshape back, permute by the inverse permutation,
scatter into zeros, split. None of them saves an array for backward except
integer indices (an embedding lookup must remember which rows it read).
Forward results are views wherever NumPy gives one, so no memory is copied
(except by clone, whose point is a copy).
"""

import numpy

from .. import backend
from ..backend import array_module
from ..function import Function


class Reshape(Function):
    """out = x.reshape(shape);  dx = g.reshape(x.shape).  Saves nothing."""

    @staticmethod
    def forward(ctx, x, shape):
        ctx.shape = x.shape
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
    """out = x.transpose(axes);  dx = g.transpose(inverse of axes).  Saves nothing."""

    @staticmethod
    def forward(ctx, x, axes):
        if sorted(a % max(x.ndim, 1) for a in axes) != list(range(x.ndim)):
            raise ValueError(f"permute: {axes} is not a permutation of the {x.ndim} axes of shape {tuple(x.shape)}")
        ctx.axes = axes
        return x.transpose(axes)

    @staticmethod
    def backward(ctx, g):
        return g.transpose(tuple(int(a) for a in numpy.argsort(ctx.axes)))  # Python ints, as CuPy wants


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
        axis = axis % max(x.ndim, 1)
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
        ctx.axis = axis
        ctx.sizes = [x.shape[axis] for x in xs]
        try:
            return array_module(*xs).concatenate(xs, axis=axis)
        except ValueError:
            shapes = ", ".join(str(tuple(x.shape)) for x in xs)
            raise ValueError(f"cat: shapes {shapes} differ outside axis {axis}") from None

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
        ctx.axis, ctx.n = axis, len(xs)
        if len({tuple(x.shape) for x in xs}) > 1:
            shapes = ", ".join(str(tuple(x.shape)) for x in xs)
            raise ValueError(f"stack: all tensors need the same shape, got {shapes}")
        return array_module(*xs).stack(xs, axis=axis)

    @staticmethod
    def backward(ctx, g):
        axis = ctx.axis % g.ndim
        return tuple(g[(slice(None),) * axis + (i,)] if need else None for i, need in enumerate(ctx.needs_input_grad))


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
