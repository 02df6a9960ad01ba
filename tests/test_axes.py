"""Negative axes mean what NumPy and PyTorch say, for every op that takes an axis (ops/axes.py).

The same axes written positive and negative give the same values and the
same gradients; an axis out of range, or given twice, is an error naming
the op and the valid range; and, where PyTorch is installed, an op accepts
exactly the axes PyTorch accepts, with the same values.
"""

import numpy
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor
from tinygrad_ckpt.ops.axes import AxisError
from tinygrad_ckpt.ops.flops import op_flops

from .helpers import TORCH_SKIP
from .strategies import arrays, nonscalar_shapes, shapes


# How each op draws its axes for a shape (as non-negative ints), and how it is called with them.
def one(data, shape):
    return (data.draw(st.integers(0, len(shape) - 1), label="axis"),)


def one_of_the_result(data, shape):  # stack and unsqueeze: an axis of the result, one more
    return (data.draw(st.integers(0, len(shape)), label="axis"),)


def two(data, shape):
    return tuple(data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=2, max_size=2), label="axes"))


def some(data, shape):
    return tuple(data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape), unique=True),
                           label="axes"))


def permutation(data, shape):
    return tuple(data.draw(st.permutations(range(len(shape))), label="axes"))


CASES = {  # name: (draw the axes, does the axis index the result (one more axis), call)
    "permute": (permutation, 0, lambda t, a: t.permute(*a)),
    "transpose": (two, 0, lambda t, a: t.transpose(*a)),
    "sum": (one, 0, lambda t, a: t.sum(axis=a[0])),
    "sum of several": (some, 0, lambda t, a: t.sum(axis=a)),
    "sum, keepdims": (some, 0, lambda t, a: t.sum(axis=list(a), keepdims=True)),
    "mean": (some, 0, lambda t, a: t.mean(axis=a)),
    "max": (some, 0, lambda t, a: t.max(axis=a)),
    "max, keepdims": (one, 0, lambda t, a: t.max(axis=a[0], keepdims=True)),
    "min": (some, 0, lambda t, a: t.min(axis=a)),
    "softmax": (one, 0, lambda t, a: t.softmax(axis=a[0])),
    "F.softmax": (one, 0, lambda t, a: F.softmax(t, axis=a[0])),
    "log_softmax": (one, 0, lambda t, a: t.log_softmax(axis=a[0])),
    "F.log_softmax": (one, 0, lambda t, a: F.log_softmax(t, axis=a[0])),
    "split": (one, 0, lambda t, a: t.split(2, dim=a[0])),
    "split in sizes": (one, 0, lambda t, a: t.split([t.shape[a[0]] - 1, 1], dim=a[0])),
    "cat": (one, 0, lambda t, a: F.cat([t, t * 2], axis=a[0])),
    "stack": (one_of_the_result, 1, lambda t, a: F.stack([t, t * 2], axis=a[0])),
    "unsqueeze": (one_of_the_result, 1, lambda t, a: t.unsqueeze(a[0])),
    "squeeze": (one, 0, lambda t, a: t.squeeze(a[0])),
}


def written_negative(data, axes, ndim):
    """The same axes with each written as a - ndim or not, as drawn; at least one of them negative."""
    negative = data.draw(st.lists(st.booleans(), min_size=len(axes), max_size=len(axes)), label="negative")
    negative[0] = True
    return tuple(a - ndim if n else a for a, n in zip(axes, negative))


def values_and_grad(call, x, axes):
    """The op's outputs and the gradient of a weighted sum of them (weights differ per element)."""
    t = Tensor(x, requires_grad=True)
    out = call(t, axes)
    outs = out if isinstance(out, tuple) else (out,)
    loss = 0
    for o in outs:
        weights = numpy.cos(numpy.arange(o.numel(), dtype=numpy.float64)).reshape(o.shape)
        loss = (o * Tensor(weights)).sum() + loss
    loss.backward()
    return [o.numpy() for o in outs], t.grad.numpy()


@given(st.sampled_from(sorted(CASES)), nonscalar_shapes.map(lambda s: s[:-1] + (3,) if len(s) == 1 else s), st.data())
@example("permute", (2, 3), None)  # the example: x.permute(-1, 0) of a non-square x
def test_negative_axes_give_the_same_values_and_gradients(name, shape, data):
    draw_axes, extra, call = CASES[name]
    x = numpy.arange(1.0, 1.0 + numpy.prod(shape)).reshape(shape) / 7  # distinct values: no ties
    if data is None:  # the explicit example
        axes, negative = (1, 0), (-1, 0)
    else:
        axes = draw_axes(data, shape)
        negative = written_negative(data, axes, len(shape) + extra)
    expected_values, expected_grad = values_and_grad(call, x, axes)
    got_values, got_grad = values_and_grad(call, x, negative)
    assert [v.shape for v in got_values] == [v.shape for v in expected_values]
    for got, expected in zip(got_values, expected_values):
        numpy.testing.assert_array_equal(got, expected)
    numpy.testing.assert_array_equal(got_grad, expected_grad)


@given(nonscalar_shapes.flatmap(lambda s: st.tuples(arrays(s), st.integers(0, len(s) - 1))))
def test_argmax_and_size_take_negative_axes(case):
    x, axis = case
    t = Tensor(x)
    assert t.size(axis - x.ndim) == t.size(axis) == x.shape[axis]
    numpy.testing.assert_array_equal(t.argmax(axis - x.ndim).numpy(), t.argmax(axis).numpy())


def test_reshape_infers_one_minus_one_and_refuses_other_negatives():
    x = Tensor(numpy.arange(6.0), requires_grad=True)
    assert x.reshape(-1, 2).shape == x.reshape(3, 2).shape == (3, 2)
    for bad in [(-2, 3), (-1, -1), (2, -3)]:
        with pytest.raises(ValueError, match=r"reshape: .* is not a shape: sizes are >= 0, and one at most may be -1"):
            x.reshape(*bad)


def test_expand_keeps_an_axis_with_minus_one_and_sums_back():
    x = Tensor(numpy.arange(3.0).reshape(3, 1), requires_grad=True)
    out = x.expand(2, -1, 4)  # (3, 1) -> (2, 3, 4)
    assert out.shape == (2, 3, 4)
    out.sum().backward()
    numpy.testing.assert_array_equal(x.grad.numpy(), numpy.full((3, 1), 8.0))
    with pytest.raises(ValueError, match=r"expand: a tensor of shape \(3, 1\) cannot be expanded to \(2, 3\)"):
        x.expand(2, 3)
    assert out.grad_fn.name == "Expand" and op_flops("Expand", [(3, 1)], [(2, 3, 4)]) == 0  # a view: no arithmetic


# -- errors: name the op, the axis and the valid range ---------------------------------------
OUT_OF_RANGE = {  # on a (2, 3) tensor: op, call with an axis, valid range
    "permute": (lambda t, a: t.permute(0, a), "[-2, 1]"),
    "transpose": (lambda t, a: t.transpose(0, a), "[-2, 1]"),
    "sum": (lambda t, a: t.sum(axis=a), "[-2, 1]"),
    "mean": (lambda t, a: t.mean(axis=(0, a)), "[-2, 1]"),
    "max": (lambda t, a: t.max(axis=a), "[-2, 1]"),
    "min": (lambda t, a: t.min(axis=a), "[-2, 1]"),
    "argmax": (lambda t, a: t.argmax(axis=a), "[-2, 1]"),
    "size": (lambda t, a: t.size(a), "[-2, 1]"),
    "softmax": (lambda t, a: F.softmax(t, axis=a), "[-2, 1]"),
    "log_softmax": (lambda t, a: t.log_softmax(axis=a), "[-2, 1]"),
    "split": (lambda t, a: t.split(1, dim=a), "[-2, 1]"),
    "cat": (lambda t, a: F.cat([t, t], axis=a), "[-2, 1]"),
    "squeeze": (lambda t, a: t.squeeze(a), "[-2, 1]"),
    "stack": (lambda t, a: F.stack([t, t], axis=a), "[-3, 2]"),  # an axis of the result, which has 3
    "unsqueeze": (lambda t, a: t.unsqueeze(a), "[-3, 2]"),
}


@pytest.mark.parametrize("op", sorted(OUT_OF_RANGE))
@pytest.mark.parametrize("side", ["above", "below"])
def test_an_axis_out_of_range_names_the_op_the_axis_and_the_range(op, side):
    call, valid = OUT_OF_RANGE[op]
    low, high = (int(n) for n in valid.strip("[]").split(", "))
    axis = high + 1 if side == "above" else low - 1
    with pytest.raises(IndexError, match=rf"{op}: axis {axis} is out of range "
                                         rf"\(expected to be in range of \[{low}, {high}\], but got {axis}\)") as e:
        call(Tensor(numpy.ones((2, 3))), axis)
    assert isinstance(e.value, AxisError) and isinstance(e.value, ValueError)  # also what NumPy raises


@pytest.mark.parametrize("call, message", [
    (lambda t: t.permute(0, 0), r"permute: axis 0 appears more than once in \(0, 0\)"),
    (lambda t: t.permute(1, -1), r"permute: axis 1 appears more than once in \(1, -1\)"),
    (lambda t: t.permute(0), r"permute: \(0,\) names 1 axes, but the tensor has 2"),
    (lambda t: t.sum(axis=(0, -2)), r"sum: axis 0 appears more than once in \(0, -2\)"),
    (lambda t: t.max(axis=[1, 1]), r"max: axis 1 appears more than once in \(1, 1\)"),
])
def test_an_axis_given_twice_is_an_error(call, message):
    with pytest.raises(ValueError, match=message):
        call(Tensor(numpy.ones((2, 3))))


def test_an_axis_must_be_an_integer():
    with pytest.raises(TypeError, match=r"sum: an axis must be an integer, got 0.5"):
        Tensor(numpy.ones((2, 3))).sum(axis=0.5)


# -- the same axes as PyTorch, accepted and refused ---------------------------------------
def _torch():
    return pytest.importorskip("torch", reason=TORCH_SKIP)


def torch_and_ours(torch):
    """name: (PyTorch's call, ours), each taking a tensor and an axis."""
    return {
        "sum": (lambda t, a: t.sum(dim=a), lambda t, a: t.sum(axis=a)),
        "mean": (lambda t, a: t.mean(dim=a), lambda t, a: t.mean(axis=a)),
        "amax": (lambda t, a: torch.amax(t, dim=a), lambda t, a: t.max(axis=a)),
        "amin": (lambda t, a: torch.amin(t, dim=a), lambda t, a: t.min(axis=a)),
        "softmax": (lambda t, a: torch.softmax(t, a), lambda t, a: t.softmax(axis=a)),
        "log_softmax": (lambda t, a: torch.log_softmax(t, a), lambda t, a: F.log_softmax(t, axis=a)),
        "transpose": (lambda t, a: t.transpose(0, a) if t.ndim else t.transpose(a, a), lambda t, a: t.transpose(0, a) if t.ndim else t.transpose(a, a)),
        "permute": (lambda t, a: t.permute(*[a] + list(range(1, t.ndim))),
                    lambda t, a: t.permute(*[a] + list(range(1, t.ndim)))),
        "split": (lambda t, a: t.split(2, dim=a), lambda t, a: t.split(2, dim=a)),
        "cat": (lambda t, a: torch.cat([t, t * 2], a), lambda t, a: F.cat([t, t * 2], axis=a)),
        "stack": (lambda t, a: torch.stack([t, t * 2], a), lambda t, a: F.stack([t, t * 2], axis=a)),
        "unsqueeze": (lambda t, a: t.unsqueeze(a), lambda t, a: t.unsqueeze(a)),
        "squeeze": (lambda t, a: t.squeeze(a), lambda t, a: t.squeeze(a)),
        "argmax": (lambda t, a: t.argmax(a), lambda t, a: t.argmax(a)),
        "size": (lambda t, a: t.size(a), lambda t, a: t.size(a)),
    }


OPS_WITH_TORCH = ["sum", "mean", "amax", "amin", "softmax", "log_softmax", "transpose", "permute", "split", "cat", "stack",
                  "unsqueeze", "squeeze", "argmax", "size"]


@pytest.mark.parametrize("name", OPS_WITH_TORCH)
@given(shape=shapes.map(lambda s: s if len(s) != 1 else s + (1,)), axis=st.integers(-5, 5))
def test_an_op_takes_exactly_the_axes_pytorch_takes(name, shape, axis):
    torch = _torch()
    theirs, ours = torch_and_ours(torch)[name]
    x = numpy.arange(1.0, 1.0 + numpy.prod(shape)).reshape(shape) / 7
    try:
        expected = theirs(torch.tensor(x), axis)
    except (IndexError, RuntimeError) as e:
        with pytest.raises(IndexError if isinstance(e, IndexError) else (ValueError, IndexError)):
            ours(Tensor(x), axis)
        return
    got = ours(Tensor(x), axis)
    if isinstance(expected, tuple) and not isinstance(expected, torch.Size):
        assert len(got) == len(expected)
    else:
        got, expected = [got], [expected]
    for g, e in zip(got, expected):
        if isinstance(e, torch.Size):
            assert g == tuple(e)
        elif isinstance(e, int):
            assert g == e
        else:
            assert g.shape == tuple(e.shape)
            numpy.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-12)


def test_cat_and_stack_of_no_tensors_say_so():
    with pytest.raises(ValueError, match="cat: needs at least one tensor, got none"):
        F.cat([])
    with pytest.raises(ValueError, match="stack: needs at least one tensor, got none"):
        F.stack([])
    with pytest.raises(ValueError, match="cat: 0-d tensors cannot be concatenated"):
        F.cat([Tensor(numpy.array(1.0)), Tensor(numpy.array(2.0))])
