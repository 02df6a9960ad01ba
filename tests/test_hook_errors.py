"""Hooks and calls that go wrong say which hook or call, and which record, in PyTorch's words where it has them.

  * an unpack hook (saved_tensors_hooks) whose tensor is not what pack was
    given: another shape, a dtype of another kind, another device, or no
    tensor at all; a pack hook that changes its input in place;
  * a gradient hook (register_hook) that changes its gradient in place: the
    array may be another record's gradient too (Add hands one array to both
    inputs), so hooks get it read-only, as PyTorch's docstring asks;
  * a second backward()/autograd.grad() through records the first one freed.

Before, each of these ended in NumPy's or Python's own message (operands
could not be broadcast, output array is read-only), or in no error at all
(a second backward(inputs=...) gave no gradient).
"""

import re

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygrad_ckpt import Tensor, autograd, backend
from tinygrad_ckpt.autograd import saved_tensors_hooks
from tinygrad_ckpt.testing import strict_cupy

from .conftest import examples

shapes = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)


def leaf(shape, dtype="float64", seed=0):
    return Tensor(numpy.random.default_rng(seed).standard_normal(shape).astype(dtype), requires_grad=True)


def keep(t):
    return t


# -- unpack hooks --------------------------------------------------------------------------------------
def other_shape(how, shape):
    """A shape the unpack hook gives back instead of `shape` (drawn), or None if `how` cannot change it."""
    if how == "extra axis":
        return shape + (1,)
    if how == "flattened" and len(shape) > 1:
        return (int(numpy.prod(shape)),)
    if how == "reversed" and shape[::-1] != shape:
        return shape[::-1]
    if how == "first row" and shape[0] > 1:
        return (1,) + shape[1:]
    return None


@settings(max_examples=examples(15))
@given(shape=shapes, how=st.sampled_from(["extra axis", "flattened", "reversed", "first row"]),
       op=st.sampled_from(["mul", "tanh", "exp"]))
def test_an_unpack_hook_returning_another_shape_names_the_hook_and_the_record(shape, how, op):
    wrong = other_shape(how, shape)
    if wrong is None:
        return

    def unpack_reshaped(t):
        return Tensor(numpy.zeros(wrong, dtype=t.dtype))

    x = leaf(shape)
    with saved_tensors_hooks(keep, unpack_reshaped):
        y = {"mul": lambda: x * x, "tanh": x.tanh, "exp": x.exp}[op]()
    name = {"mul": "Mul", "tanh": "Tanh", "exp": "Exp"}[op]
    with pytest.raises(RuntimeError) as caught:
        y.sum().backward()
    message = str(caught.value)
    assert "unpack hook 'test_an_unpack_hook_returning_another_shape_names_the_hook_and_the_record.<locals>." \
           "unpack_reshaped'" in message
    assert re.search(rf"the array {name} \(record #\d+ on the tape\) saved at position 0", message), message
    assert f"saved metadata: {{'shape': {shape}, 'dtype': float64, 'device': 'cpu'}}" in message
    assert f"unpacked metadata: {{'shape': {wrong}, 'dtype': float64, 'device': 'cpu'}}" in message
    assert x.grad is None  # refused before the op's backward ran


@settings(max_examples=examples(10))
@given(shape=shapes, dtype=st.sampled_from(["int64", "int32", "bool"]))
def test_an_unpack_hook_returning_a_dtype_of_another_kind_is_refused(shape, dtype):
    x = leaf(shape)
    with saved_tensors_hooks(keep, lambda t: t.to(dtype=dtype)):
        y = x * x
    with pytest.raises(RuntimeError, match=rf"unpacked metadata: {{'shape': {re.escape(str(shape))}, "
                                           rf"'dtype': {dtype}, 'device': 'cpu'}}"):
        y.sum().backward()


@settings(max_examples=examples(10))
@given(shape=shapes, saved=st.sampled_from(["float32", "float64"]), seed=st.integers(0, 2**16))
def test_an_unpack_hook_returning_another_float_dtype_is_accepted(shape, saved, seed):
    """Backward then computes in that dtype and the gradient is cast back, as PyTorch's validate_outputs does."""
    other = "float64" if saved == "float32" else "float32"
    x = leaf(shape, saved, seed)
    with saved_tensors_hooks(keep, lambda t: t.to(dtype=other)):
        y = x * x
    y.sum().backward()
    assert x.grad.dtype == numpy.dtype(saved)
    numpy.testing.assert_allclose(x.grad.numpy(), 2 * x.numpy(), rtol=1e-6)


def test_an_unpack_hook_returning_no_tensor_says_what_it_returned_in_pytorchs_words():
    x = leaf((2, 3))

    def unpack_to_array(t):
        return t.numpy()

    with saved_tensors_hooks(keep, unpack_to_array):
        y = x.tanh()
    with pytest.raises(TypeError, match=r"Output of saved tensor unpack_hook expected to be a Tensor but got result "
                                        r"of type ndarray \(the unpack hook '.*unpack_to_array', for the array Tanh "
                                        r"\(record #\d+ on the tape\) saved at position 0\)"):
        y.sum().backward()


def test_a_pack_hook_that_changes_its_input_in_place_is_refused():
    x = leaf((3,))
    before = x.numpy().copy()

    def pack_doubling(t):
        t.mul_(2.0)
        return t

    with pytest.raises(RuntimeError, match=r"the pack hook '.*pack_doubling' is modifying its input in place"):
        with saved_tensors_hooks(pack_doubling, keep):
            (x * x).sum()
    assert x.numpy().tolist() == (2 * before).tolist()  # found after the change, as PyTorch finds it


@pytest.fixture
def strict_cuda():
    """The strict CuPy stand-in as device 'cuda' (arrays that cannot be read-only, and cannot mix with NumPy's)."""
    previous_module = backend.set_cuda_module(strict_cupy)
    previous_device = backend.set_default_device("cuda")
    try:
        yield
    finally:
        backend.set_default_device(previous_device)
        backend.set_cuda_module(previous_module)


def test_an_unpack_hook_returning_another_device_is_refused(strict_cuda):
    x = leaf((2, 2))
    assert x.device == "cuda"
    with saved_tensors_hooks(keep, lambda t: t.to("cpu")):
        y = x * x
    with pytest.raises(RuntimeError, match=r"saved metadata: \{'shape': \(2, 2\), 'dtype': float64, 'device': "
                                           r"'cuda'\}\nunpacked metadata: \{'shape': \(2, 2\), 'dtype': float64, "
                                           r"'device': 'cpu'\}"):
        y.sum().backward()


# -- gradient hooks that write in place ------------------------------------------------------------------
IN_PLACE = {
    "mul_": lambda g: g.mul_(10.0),
    "add_": lambda g: g.add_(1.0),
    "zero_": lambda g: g.zero_(),
    "fill_": lambda g: g.fill_(3.0),
    "setitem": lambda g: g.__setitem__(0, 5.0),
    "copy_": lambda g: g.copy_(g * 2),
}


def shared_gradient_graph(width):
    """y = 2x + 3x: Add hands the one gradient array to both of its inputs' records."""
    x = leaf((width,))
    a, b = x * 2.0, x * 3.0
    return x, a, b, a + b


@settings(max_examples=examples(12))
@given(width=st.integers(1, 5), how=st.sampled_from(sorted(IN_PLACE)), on=st.sampled_from(["computed", "leaf"]),
       start=st.sampled_from(["sum", "given"]))
def test_a_hook_that_changes_its_gradient_in_place_is_refused_naming_the_hook(width, how, on, start):
    x, a, b, y = shared_gradient_graph(width)

    def hook_in_place(g):
        IN_PLACE[how](g)

    (a if on == "computed" else x).register_hook(hook_in_place)
    where = (r"a hook on output 0 of Mul \(record #\d+ on the tape\)" if on == "computed"
             else rf"a hook on a leaf tensor of shape \({width},\)")
    given_grad = numpy.ones(width)  # backward(gradient): the caller's own array, which no hook may change
    with pytest.raises(RuntimeError, match=rf"{where} \('.*hook_in_place'\) modified its gradient in place\. "
                                           r"The hook should not modify its argument"):
        if start == "sum":
            y.sum().backward()
        else:
            y.backward(Tensor(given_grad))
    assert given_grad.tolist() == [1.0] * width


@settings(max_examples=examples(8))
@given(width=st.integers(1, 5), factor=st.floats(-4, 4, allow_nan=False))
def test_a_hook_that_returns_a_new_gradient_changes_only_its_own(width, factor):
    x, a, b, y = shared_gradient_graph(width)
    a.register_hook(lambda g: g * factor)
    y.sum().backward()
    # d/dx of 2x (its gradient scaled by factor) + 3x: the b path keeps the gradient Add gave it.
    numpy.testing.assert_allclose(x.grad.numpy(), numpy.full(width, 2.0 * factor + 3.0))


def test_a_hook_that_returns_its_argument_keeps_the_gradient():
    x, a, b, y = shared_gradient_graph(3)
    a.register_hook(lambda g: g)
    x.register_hook(lambda g: g)
    y.sum().backward()
    numpy.testing.assert_array_equal(x.grad.numpy(), numpy.full(3, 5.0))
    x.grad.data += 1  # the .grad it got is its own, writable
    assert x.grad.numpy().tolist() == [6.0] * 3


def test_without_read_only_arrays_the_in_place_change_is_caught_by_the_version_counter(strict_cuda):
    x, a, b, y = shared_gradient_graph(3)
    assert x.device == "cuda"

    def hook_in_place(g):
        g.mul_(10.0)

    a.register_hook(hook_in_place)
    with pytest.raises(RuntimeError, match=r"\('.*hook_in_place'\) modified its gradient in place"):
        y.sum().backward()


# -- a second backward through freed records ----------------------------------------------------------------
CALLS = {
    "backward()": lambda loss, wrt: loss.backward(),
    "backward(inputs=...)": lambda loss, wrt: loss.backward(inputs=wrt),
    "autograd.grad()": lambda loss, wrt: autograd.grad(loss, wrt),
}


@settings(max_examples=examples(15))
@given(first=st.sampled_from(sorted(CALLS)), second=st.sampled_from(sorted(CALLS)), depth=st.integers(1, 4),
       width=st.integers(1, 4), wrt=st.sampled_from(["x", "w", "both"]))
def test_a_second_backward_without_retain_graph_names_the_call_and_the_record(first, second, depth, width, wrt):
    x, w = leaf((width,), seed=1), leaf((width,), seed=2)
    h = x
    for _ in range(depth):
        h = (h * w).tanh()
    loss = h.sum()
    asked = {"x": [x], "w": [w], "both": [x, w]}[wrt]
    CALLS[first](loss, asked)
    with pytest.raises(RuntimeError) as caught:
        CALLS[second](loss, asked)
    message = str(caught.value)
    assert message.startswith(f"{second}: Trying to backward through the graph a second time: it reached ")
    assert re.search(r"reached (Tanh|Mul) \(record #\d+ on the tape\), whose saved arrays an earlier backward "
                     r"freed", message), message
    assert "Specify retain_graph=True" in message


@settings(max_examples=examples(8))
@given(first=st.sampled_from(sorted(CALLS)), second=st.sampled_from(sorted(CALLS)), width=st.integers(1, 4))
def test_with_retain_graph_the_second_call_gives_the_same_gradients(first, second, width):
    x, w = leaf((width,), seed=1), leaf((width,), seed=2)
    loss = ((x * w).tanh() * w).sum()
    wanted = autograd.grad(loss, [x, w], retain_graph=True)
    if first == "autograd.grad()":
        autograd.grad(loss, [x, w], retain_graph=True)
    else:
        loss.backward(retain_graph=True, inputs=[x, w] if first != "backward()" else None)
    x.grad = w.grad = None
    got = CALLS[second](loss, [x, w])
    got = got if second == "autograd.grad()" else (x.grad, w.grad)
    for g, want in zip(got, wanted):
        numpy.testing.assert_array_equal(g.numpy(), want.numpy())


# -- removing a hook ------------------------------------------------------------------------------------
class Scale:
    """A hook that compares equal to another with the same factor (as a dataclass would)."""

    def __init__(self, factor):
        self.factor = factor

    def __eq__(self, other):
        return isinstance(other, Scale) and other.factor == self.factor

    __hash__ = None

    def __call__(self, g):
        return g * self.factor


@settings(max_examples=examples(6))
@given(on=st.sampled_from(["computed", "leaf"]), remove_first=st.booleans())
def test_a_handle_removes_its_own_hook_not_an_equal_one(on, remove_first):
    x = leaf((2,))
    t = x * 1.0 if on == "computed" else x
    first, second = t.register_hook(Scale(3.0)), t.register_hook(Scale(3.0))
    (first if remove_first else second).remove()
    (second if remove_first else first).remove()
    (t * 1.0).sum().backward()
    numpy.testing.assert_array_equal(x.grad.numpy(), numpy.ones(2))  # both hooks are off


def test_a_gradient_a_hook_returns_as_a_view_is_copied_before_it_is_handed_out():
    """The hook's argument is read-only; a view of it that the hook returns is not handed on as someone's own."""
    x = leaf((3,))
    x.register_hook(lambda g: g[...])
    (g,) = autograd.grad((x * x).sum(), [x])
    g.data += 1  # writable, and nobody else's
    numpy.testing.assert_array_equal(g.numpy(), 2 * x.numpy() + 1)
