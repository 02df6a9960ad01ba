"""The tape: recording, the reverse walk, gradient accumulation, freeing, lifetime."""

import gc

import numpy
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import Tensor, backend, memory, no_grad, tape
from tinygrad_ckpt.function import Function


def test_a_tensor_used_twice_gets_both_gradients():
    # tinygrad's first backward assigned gradients instead of adding them; this
    # is the test that caught it: d/dx (x + x) * x = 4x.
    x = Tensor([1.0, -2.0, 3.0], requires_grad=True)
    ((x + x) * x).sum().backward()
    numpy.testing.assert_allclose(x.grad.numpy(), [4.0, -8.0, 12.0])


def test_ops_append_records_in_forward_order_and_the_tape_prints():
    t = tape.Tape()
    with tape.recording(t):
        x = Tensor(numpy.ones((2, 3)), requires_grad=True)
        w = Tensor(numpy.ones((3, 4)), requires_grad=True)
        y = (x @ w).tanh().sum()
    assert [n.name for n in t.nodes()] == ["MatMul", "Tanh", "Sum"]
    assert len(t) == 3
    text = repr(t)
    assert "MatMul" in text and "(2, 4)" in text and "Tape: 3 records" in text
    # MatMul saved x (48 B) and w (96 B) as float64; Tanh saved its output (64 B).
    assert [n.ctx.saved_nbytes for n in t.nodes()] == [2 * 3 * 8 + 3 * 4 * 8, 2 * 4 * 8, 0]
    y.backward()
    # Records that saved arrays are freed and dropped once backpropagated; the Sum saved
    # nothing, so it stays while y holds it (a second backward may walk it, as in PyTorch).
    assert [n.name for n in t.nodes()] == ["Sum"]
    del y
    assert len(t) == 0


def test_no_grad_records_nothing_and_saves_nothing():
    t = tape.Tape()
    x = Tensor(numpy.ones(5), requires_grad=True)
    with tape.recording(t), no_grad():
        y = (x * x).exp()
    assert len(t) == 0
    assert not y.requires_grad and y._node is None


def test_grad_accumulates_across_backward_calls_until_zeroed():
    x = Tensor([2.0], requires_grad=True)
    (x * 3).sum().backward()
    (x * 3).sum().backward()
    numpy.testing.assert_allclose(x.grad.numpy(), [6.0])
    x.grad = None
    (x * 3).sum().backward()
    numpy.testing.assert_allclose(x.grad.numpy(), [3.0])


def test_leaf_gradients_never_share_memory():
    a = Tensor([1.0, 2.0], requires_grad=True)
    b = Tensor([3.0, 4.0], requires_grad=True)
    (a + b).sum().backward()  # Add hands the same gradient array to both
    a.grad.data *= 10  # an in-place update of one .grad (as clipping does)
    numpy.testing.assert_allclose(b.grad.numpy(), [1.0, 1.0])


def test_backward_on_a_non_scalar_needs_a_gradient():
    x = Tensor(numpy.ones(3), requires_grad=True)
    with pytest.raises(RuntimeError, match="needs a gradient argument"):
        (x * 2).backward()
    (x * 2).backward(gradient=Tensor(numpy.array([1.0, 2.0, 3.0])))
    numpy.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0, 6.0])


def test_second_backward_names_retain_graph():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        y.backward()


def test_retain_graph_allows_a_second_backward():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    numpy.testing.assert_allclose(x.grad.numpy(), [4.0, 8.0])


def test_saved_arrays_are_freed_as_backward_goes():
    gc.collect()  # a failed backward in an earlier test leaves its records to its traceback's cycle
    before = memory.current()["activations"]
    x = Tensor(numpy.ones((64, 64), dtype=numpy.float32), requires_grad=True)
    y = (x.tanh() * x).exp().sum()
    assert memory.current()["activations"] > before
    y.backward()
    assert memory.current()["activations"] == before


def test_forwards_without_backward_do_not_pile_up():
    # An evaluation loop with gradients on: each loss is dropped, never
    # backpropagated. Records die with their outputs, so memory stays flat.
    w = Tensor(numpy.ones((256, 256), dtype=numpy.float32), requires_grad=True)
    x = Tensor(numpy.ones((32, 256), dtype=numpy.float32))

    def forward():
        return (x @ w).tanh().mean()

    forward()
    gc.collect()
    before_bytes, before_records = memory.total(), len(tape.active())
    for _ in range(1000):
        forward()
    gc.collect()
    assert memory.total() == before_bytes
    assert len(tape.active()) == before_records
    # dead references are pruned too: on a tape of its own (the shared one may carry a long list from an
    # earlier test), the list stays short while thousands of records come and go
    with tape.recording(tape.Tape()) as own:
        for _ in range(1000):
            forward()
    assert len(own.records) < 2000 < own.count


def test_graph_is_freed_when_the_loss_is_dropped():
    x = Tensor(numpy.ones(4), requires_grad=True)
    y = (x * 2).exp().sum()
    node = y._node
    import weakref

    ref = weakref.ref(node)
    del node, y
    assert ref() is None  # no cycles: freed by reference counting alone


def test_gradient_of_an_unused_output_is_zero():
    a = Tensor(numpy.arange(6.0).reshape(2, 3), requires_grad=True)
    parts = a[0], a[1]
    (parts[0] * 2).sum().backward()
    numpy.testing.assert_allclose(a.grad.numpy(), [[2, 2, 2], [0, 0, 0]])


def test_float32_stays_float32():
    x = Tensor(numpy.ones((2, 2), dtype=numpy.float32), requires_grad=True)
    y = ((x * 2.5 + 1) ** 2 / 3).gelu().softmax().log().mean()
    assert y.dtype == numpy.float32
    y.backward()
    assert x.grad.dtype == numpy.float32


def test_python_floats_default_to_float32_and_numpy_arrays_keep_their_dtype():
    assert Tensor([1.0]).dtype == numpy.float32
    assert Tensor(numpy.array([1.0])).dtype == numpy.float64
    assert tg.randn(2, rng=numpy.random.default_rng(0)).dtype == numpy.float32


def test_tensor_basics_follow_pytorch_names():
    x = Tensor([[1.0, 2.0]], requires_grad=True)
    assert x.shape == (1, 2) and x.device == tg.backend.get_default_device() and x.requires_grad and x.is_leaf
    assert x.sum().item() == 3.0
    d = x.detach()
    assert not d.requires_grad and d.data is x.data
    assert isinstance(x.numpy(), numpy.ndarray)
    assert x.to(dtype=numpy.float64).dtype == numpy.float64
    assert tg.zeros(2, 3).shape == (2, 3) and tg.ones(4).numpy().sum() == 4
    r1 = tg.randn(3, rng=numpy.random.default_rng(7)).numpy()
    r2 = tg.randn(3, rng=numpy.random.default_rng(7)).numpy()
    numpy.testing.assert_array_equal(r1, r2)


def test_in_place_methods_bump_the_version():
    x = Tensor([1.0, 2.0])
    v = x._version
    x.add_(Tensor([1.0, 1.0])).mul_(2.0)
    assert x._version == v + 2
    numpy.testing.assert_allclose(x.numpy(), [4.0, 6.0])


def test_reusing_a_backpropagated_intermediate_is_an_error():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = x * x
    y.sum().backward()
    with pytest.raises(RuntimeError, match=r"backward\(\): Trying to backward through the graph a second time: it "
                                           r"reached Mul \(record #\d+ on the tape\)"):
        (y * 2).sum().backward()


# -- in-place changes of what backward needs (version counters) ----------------------
SAVED_CHANGED = r"one of the variables needed for gradient computation has been modified by an inplace operation"

# Each in-place method, as a change of a float tensor of shape (2,).
IN_PLACE = {
    "add_": lambda t: t.add_(1.0),
    "sub_": lambda t: t.sub_(Tensor([1.0, 1.0]), alpha=2.0),
    "mul_": lambda t: t.mul_(10.0),
    "zero_": lambda t: t.zero_(),
    "fill_": lambda t: t.fill_(3.0),
    "copy_": lambda t: t.copy_(numpy.array([5.0, 6.0])),
    "setitem": lambda t: t.__setitem__(0, 7.0),
}


def test_a_saved_input_changed_in_place_is_an_error_not_a_wrong_gradient():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = x * 1.0
    z = (y * y).sum()  # Mul saves y, twice
    y.mul_(10)  # before, backward gave a 10x gradient without a word
    with pytest.raises(RuntimeError, match=SAVED_CHANGED + r": \[float32 tensor of shape \(2,\)\], which is input 0 "
                                           r"of Mul \(record #\d+ on the tape\), is at version 1; expected version "
                                           r"0 instead\. Hint: enable anomaly mode"):
        z.backward()


def test_a_saved_output_changed_in_place_is_an_error():
    x = Tensor([1.0, 2.0], requires_grad=True)
    t = tape.Tape()
    with tape.recording(t):
        y = x.exp()  # saves its output
        loss = y.sum()
    y.mul_(2.0)
    with pytest.raises(RuntimeError, match=r"which is output 0 of Exp \(record #0 on the tape\), is at version 1"):
        loss.backward()


@pytest.mark.parametrize("change", list(IN_PLACE))
def test_every_in_place_method_bumps_the_version_and_is_caught(change):
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = x * 1.0
    loss = y.tanh().sum() + (y * x).sum()  # Mul saves y; Tanh saves its output
    IN_PLACE[change](y)
    assert y._version == 1
    with pytest.raises(RuntimeError, match=SAVED_CHANGED):
        loss.backward()
    assert x.grad is None  # raised before any backward ran into x


def test_the_check_runs_before_the_op_backward():
    from tinygrad_ckpt.function import Function

    calls = []

    class Square(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            calls.append("backward")
            return 2 * g * ctx.saved_arrays[0]

    x = Tensor([1.0, 2.0], requires_grad=True)
    h = x * 1.0
    loss = Square.apply(h).sum()
    h.add_(1.0)
    with pytest.raises(RuntimeError, match=SAVED_CHANGED + r".*input 0 of Square"):
        loss.backward()
    assert calls == []


def test_views_and_detached_tensors_share_the_version():
    x = Tensor(numpy.ones((2, 3)), requires_grad=True)
    y = x * 2.0
    loss = (y * y).sum()
    for view in (y.reshape(6), y.T, y[0], y.detach()):
        before = y._version
        view.add_(0.0)
        assert y._version == before + 1 and view._version == y._version
    with pytest.raises(RuntimeError, match=SAVED_CHANGED):
        loss.backward()


def test_a_change_that_no_backward_reads_is_allowed():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = x * 1.0
    loss = (y + 1.0).sum()  # Add saves nothing: its gradient does not depend on y's values
    y.mul_(10)
    loss.backward()
    numpy.testing.assert_allclose(x.grad.numpy(), [1.0, 1.0])


def test_a_tensor_changed_in_place_is_not_used_by_another_op():
    # In-place methods are not recorded: y's record computed the old values,
    # so a gradient through the new ones would be wrong.
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = x * 2.0
    y.add_(1.0)
    with pytest.raises(RuntimeError, match=r"Tanh: the tensor \(shape \(2,\)\) was modified by an inplace "
                                           r"operation after Mul \(record #\d+ on the tape\) computed it"):
        y.tanh()
    with pytest.raises(RuntimeError, match=r"backward\(\): the tensor \(shape \(2,\)\) was modified"):
        y.backward(Tensor([1.0, 1.0]))
    with no_grad():
        y.tanh()  # nothing is recorded: nothing to get wrong
    (y.detach() * x).sum().backward()  # detached, y is a leaf: its values are data
    numpy.testing.assert_allclose(x.grad.numpy(), [3.0, 5.0])
    h = x * 2.0
    copy = h.clone()  # changing a clone made before leaves h's record right
    copy.add_(1.0)
    x.grad = None
    (h * h).sum().backward()
    numpy.testing.assert_allclose(x.grad.numpy(), [8.0, 16.0])


@pytest.mark.parametrize("change", list(IN_PLACE))
def test_in_place_on_a_leaf_that_requires_grad_is_an_error_outside_no_grad(change):
    p = Tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"^a leaf Variable that requires grad is being used in an in-place operation\."):
        IN_PLACE[change](p)
    assert p._version == 0
    with no_grad():
        IN_PLACE[change](p)
    assert p._version == 1


def test_in_place_from_a_tensor_that_requires_grad_is_an_error():
    buf, y = Tensor([0.0, 0.0]), Tensor([1.0, 2.0], requires_grad=True) * 2.0
    for change in (lambda: buf.add_(y), lambda: buf.copy_(y), lambda: buf.__setitem__(0, y[0])):
        with pytest.raises(RuntimeError, match=r"takes a tensor of shape .* that requires grad.*would be lost"):
            change()
    buf.add_(y.detach())
    numpy.testing.assert_allclose(buf.numpy(), [2.0, 4.0])


def test_writing_through_data_is_the_escape_hatch():
    p = Tensor([1.0, 2.0], requires_grad=True)
    loss = (p * p).sum()
    p.data[...] = 3.0  # no check, no version: the caller takes responsibility
    assert p._version == 0
    loss.backward()
    numpy.testing.assert_allclose(p.grad.numpy(), [6.0, 6.0])  # computed from the values now there


def test_setitem_writes_numbers_arrays_and_tensors():
    t = Tensor(numpy.zeros((2, 3)))
    t[0] = 1.0
    t[1, :2] = numpy.array([2.0, 3.0])
    t[:, 2] = Tensor([4.0, 5.0])
    numpy.testing.assert_array_equal(t.numpy(), [[1.0, 1.0, 4.0], [2.0, 3.0, 5.0]])
    assert t._version == 3


def test_backward_after_changing_a_parameter_in_place_is_an_error():
    # An optimizer step between forward and backward: the Linear saved the old weight.
    w = Tensor(numpy.ones((2, 2)), requires_grad=True)
    loss = tg.functional.linear(Tensor(numpy.ones((1, 2)), requires_grad=True), w).sum()
    with no_grad():
        w.sub_(0.1)
    with pytest.raises(RuntimeError, match=SAVED_CHANGED + r": \[float64 tensor of shape \(2, 2\)\], which is input 1 of Linear"):
        loss.backward()


# -- 0-d tensors --------------------------------------------------------------------
def test_a_0d_intermediate_used_twice():
    x = Tensor([1.0, 2.0], requires_grad=True)
    total = x.sum()
    (total * total).backward()  # d/dx (sum x)^2 = 2 sum x
    numpy.testing.assert_allclose(x.grad.numpy(), [6.0, 6.0])


def test_0d_results_are_arrays_on_the_tape():
    x = Tensor(numpy.array(0.5), requires_grad=True)
    y = x.exp()
    z = (y * y + y.tanh()).sum()
    assert all(hasattr(t.data, "shape") and t.shape == () for t in (y, z))
    z.backward()
    expected = 2 * numpy.exp(1.0) + (1 - numpy.tanh(numpy.exp(0.5)) ** 2) * numpy.exp(0.5)
    numpy.testing.assert_allclose(x.grad.numpy(), expected)


# -- what a backward hands back is checked where it enters the graph ---------------------------
class Doubled(Function):
    """2x, whose backward returns what the test puts in `Doubled.give(g)`."""

    give = staticmethod(lambda g: g * 2)

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return Doubled.give(g)


@pytest.fixture
def doubled():
    yield Doubled
    Doubled.give = staticmethod(lambda g: g * 2)


def test_a_gradient_of_another_shape_is_an_error_naming_the_op(doubled):
    # PyTorch's validate_outputs: "Function ... returned an invalid gradient at index 0 - got [10] but
    # expected shape compatible with [5, 5]". Accepted before, it left a (5, 5) leaf with a (10,) .grad.
    doubled.give = staticmethod(lambda g: backend.module_of(g).ones(10, dtype=g.dtype))
    x = Tensor(numpy.ones((5, 5), dtype=numpy.float32), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Function Doubled returned an invalid gradient at index 0 - got \[10\] "
                                           r"but expected shape compatible with \[5, 5\]"):
        Doubled.apply(x).sum().backward()
    assert x.grad is None


def test_a_gradient_the_input_broadcasts_to_is_summed_down_and_another_dtype_cast_back(doubled):
    doubled.give = staticmethod(lambda g: backend.module_of(g).broadcast_to(g * 2, (3,) + g.shape).astype("float64"))
    x = Tensor(numpy.ones((2, 2), dtype=numpy.float32), requires_grad=True)
    Doubled.apply(x).sum().backward()
    assert x.grad.shape == (2, 2) and x.grad.dtype == numpy.float32
    numpy.testing.assert_array_equal(x.grad.numpy(), numpy.full((2, 2), 6.0))


def test_a_backward_that_returns_too_many_gradients_or_no_array_is_an_error(doubled):
    x = Tensor(numpy.ones(3), requires_grad=True)
    doubled.give = staticmethod(lambda g: (g, g))
    with pytest.raises(RuntimeError, match=r"Doubled returned an incorrect number of gradients \(expected 1, got 2\)"):
        Doubled.apply(x).sum().backward()
    doubled.give = staticmethod(lambda g: 3)
    with pytest.raises(TypeError, match=r"Doubled returned a 'int' as the gradient at index 0"):
        Doubled.apply(x).sum().backward()


def test_an_unpack_hook_that_returns_another_dtype_leaves_the_leaf_gradient_in_its_own():
    from tinygrad_ckpt.autograd import saved_tensors_hooks

    x = Tensor(numpy.ones((2, 3), dtype=numpy.float32), requires_grad=True)
    with saved_tensors_hooks(lambda t: t, lambda t: t.to(numpy.float64)):
        loss = (x * x).sum()
    loss.backward()
    assert x.grad.dtype == numpy.float32  # PyTorch casts the gradient back to the input's dtype too
    numpy.testing.assert_array_equal(x.grad.numpy(), numpy.full((2, 3), 2.0))


def test_a_hook_that_returns_no_tensor_says_what_it_returned():
    x = Tensor(numpy.ones(3), requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: 3)
    with pytest.raises(TypeError, match=r"hook returned 'int'"):
        y.sum().backward()
    x.register_hook(lambda g: "no")
    with pytest.raises(TypeError, match=r"hook returned 'str'"):
        (x * 2).sum().backward()


def test_a_second_backward_through_records_that_saved_nothing_is_allowed():
    # PyTorch: c = b + 1; c.backward(g); c.backward(g) works, and b.grad adds up both.
    b = Tensor(numpy.ones(3), requires_grad=True)
    c = (b + 1) - 2.0
    g = Tensor(numpy.full(3, 0.5))
    c.backward(g)
    c.backward(g)
    numpy.testing.assert_array_equal(b.grad.numpy(), numpy.ones(3))
    # A record whose saved arrays the first backward freed still refuses, and says so.
    d = (b * b) + 1
    d.backward(g)
    with pytest.raises(RuntimeError, match=r"a second time: it reached Mul \(record #\d+ on the tape\), whose saved "
                                           r"arrays an earlier backward freed"):
        d.backward(g)


class Counted(Function):
    """The identity, counting its backward calls."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        return x * 1

    @staticmethod
    def backward(ctx, g):
        Counted.calls += 1
        return g


@pytest.mark.parametrize("call", ["grad", "backward"])
def test_grad_and_backward_inputs_run_only_the_records_that_reach_the_inputs(call):
    from tinygrad_ckpt import autograd

    a = Tensor(numpy.ones(3), requires_grad=True)
    b = Tensor(numpy.ones(3), requires_grad=True)
    h = Counted.apply(a)
    loss = (Counted.apply(h) * b).sum() + Counted.apply(b).sum()
    Counted.calls = 0
    if call == "grad":
        (gb,) = autograd.grad(loss, [b], retain_graph=True)
        numpy.testing.assert_array_equal(gb.numpy(), numpy.full(3, 2.0))
    else:
        loss.backward(inputs=[b], retain_graph=True)
        numpy.testing.assert_array_equal(b.grad.numpy(), numpy.full(3, 2.0))
        assert a.grad is None
    assert Counted.calls == 1  # the Counted of b only: the two on a's path cannot reach b (PyTorch prunes them)
    # A computed tensor asked for: only what lies between the loss and it runs.
    Counted.calls = 0
    (gh,) = autograd.grad(loss, [h])
    numpy.testing.assert_array_equal(gh.numpy(), numpy.ones(3))
    assert Counted.calls == 1


def test_tensor_copies_and_from_numpy_shares_as_in_pytorch():
    a = numpy.ones(3)
    x = tg.tensor(a, requires_grad=True)
    w = Tensor(numpy.full(3, 2.0), requires_grad=True)
    loss = (x * w).sum()
    a[:] = 5.0  # the caller's array changes after the forward
    loss.backward()
    numpy.testing.assert_array_equal(w.grad.numpy(), numpy.ones(3))  # x kept its own copy
    shared = tg.from_numpy(a)
    a[0] = 7.0
    assert shared.numpy()[0] == 7.0 and shared.device == "cpu"
    with pytest.raises(TypeError, match=r"from_numpy: expected a numpy.ndarray, got list"):
        tg.from_numpy([1.0])
