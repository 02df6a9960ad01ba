"""What an axis means, said once for every op: -1 is the last axis, as in NumPy and PyTorch.

An op that takes an axis, several axes or a permutation turns them into
non-negative ints here, once, in forward (a few integer operations per
call, nothing per element). Its backward then reads plain axes: the
inverse of a permutation, the axes a gradient is broadcast back over.

An axis out of range, or an axis given twice, is an error that names the
op, the axis and the valid range, as PyTorch's "Dimension out of range
(expected to be in range of [-2, 1], but got 2)" does. A 0-d tensor takes
axis 0 or -1, as in PyTorch. An empty tuple of axes reduces over none, as
in NumPy (PyTorch's sum(dim=()) reduces over all, a quirk it keeps for
backward compatibility).
"""

import operator


class AxisError(IndexError, ValueError):
    """An axis out of range: an IndexError, as in PyTorch, and a ValueError, as NumPy's AxisError."""


def normalize_axis(op, axis, ndim):
    """`axis` as an int in [0, ndim) (0 for a 0-d tensor).

    ndim: of the tensor the axis indexes (the result's, for stack and unsqueeze).
    """
    try:
        a = operator.index(axis)  # ints and NumPy ints; not floats, not None
    except TypeError:
        raise TypeError(f"{op}: an axis must be an integer, got {axis!r}") from None
    n = max(ndim, 1)
    if not -n <= a < n:
        raise AxisError(f"{op}: axis {a} is out of range (expected to be in range of [{-n}, {n - 1}], but got {a})")
    return a % n


def normalize_axes(op, axis, ndim):
    """None -> every axis; an axis or a sequence of them -> a sorted tuple of distinct ints. 0-d: ()."""
    if axis is None:
        return tuple(range(ndim))
    given = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    axes = sorted(normalize_axis(op, a, ndim) for a in given)
    _no_repeats(op, axes, given)
    return tuple(axes) if ndim else ()


def normalize_permutation(op, axes, ndim):
    """`axes` as a tuple of ints, each of the ndim axes once (the order of the result's axes)."""
    if len(axes) != ndim:
        raise ValueError(f"{op}: {tuple(axes)} names {len(axes)} axes, but the tensor has {ndim}; "
                         f"give each of its axes once")
    perm = tuple(normalize_axis(op, a, ndim) for a in axes)
    _no_repeats(op, sorted(perm), axes)
    return perm


def _no_repeats(op, sorted_axes, given):
    for a, b in zip(sorted_axes, sorted_axes[1:]):
        if a == b:
            raise ValueError(f"{op}: axis {a} appears more than once in {tuple(given)}")
