"""The tape: recording, the reverse walk, gradient accumulation, freeing, lifetime."""

import gc

import numpy
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import Tensor, memory, no_grad, tape


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
    assert len(t) == 0  # records are dropped once backpropagated


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
    x = Tensor(numpy.ones((64, 64), dtype=numpy.float32), requires_grad=True)
    y = (x.tanh() * x).exp().sum()
    assert memory.current()["activations"] > 0
    y.backward()
    assert memory.current()["activations"] == 0


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
    for _ in range(200):
        forward()
    gc.collect()
    assert memory.total() == before_bytes
    assert len(tape.active()) == before_records
    assert len(tape.active().records) < 2000  # dead references are pruned too


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
    with pytest.raises(RuntimeError, match="Mul a second time"):
        (y * 2).sum().backward()
