"""Every op's backward checked against finite differences, shapes drawn by hypothesis.

Shapes include 0-d (a scalar tensor) for every op where it means something,
and each test runs a 0-d case explicitly (@example); matmul, linear, layer
norm, cross-entropy and cat need at least one axis, as in PyTorch.
"""

import warnings

import numpy
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor
from tinygrad_ckpt.gradcheck import GradcheckError, gradcheck

from .helpers import TORCH_SKIP, check_grad
from .strategies import EDGES, arrays, away_from_zero, broadcast_pairs, edge_arrays, shapes


def pair(draw_shapes, make=arrays, make_b=arrays):
    return draw_shapes.flatmap(lambda s: st.tuples(make(s.input_shapes[0]), make_b(s.input_shapes[1])))


SCALAR = numpy.array(0.7)  # a 0-d array: the explicit 0-d case of each op
SCALARS = (numpy.array(0.7), numpy.array(-1.3))
SCALAR_AND_VECTOR = (numpy.array(0.7), numpy.array([1.1, -1.3]))


# -- binary, with broadcasting ---------------------------------------------------
@given(pair(broadcast_pairs))
@example(SCALARS)
@example(SCALAR_AND_VECTOR)
def test_add(ab):
    check_grad(lambda a, b: a + b, *ab)


@given(pair(broadcast_pairs))
@example(SCALARS)
@example(SCALAR_AND_VECTOR)
def test_sub(ab):
    check_grad(lambda a, b: a - b, *ab)


@given(pair(broadcast_pairs))
@example(SCALARS)
@example(SCALAR_AND_VECTOR)
def test_mul(ab):
    check_grad(lambda a, b: a * b, *ab)


@given(pair(broadcast_pairs, make_b=away_from_zero))
@example(SCALARS)
@example(SCALAR_AND_VECTOR)
def test_div(ab):
    check_grad(lambda a, b: a / b, *ab)


@given(pair(broadcast_pairs, make=lambda s: arrays(s, 0.5, 2.0)))
@example((numpy.array(0.7), numpy.array(1.3)))
def test_pow_tensor_exponent(ab):
    check_grad(lambda a, b: a**b, *ab)


@given(shapes.flatmap(lambda s: arrays(s, 0.5, 2.0)), st.sampled_from([2, 3, 0.5, -1.5]))
@example(SCALAR, 3)
@example(SCALAR, 0.5)
def test_pow_scalar_exponent(x, p):
    check_grad(lambda a: a**p, x)


@given(pair(broadcast_pairs))
@example(SCALARS)
def test_where(ab):
    a, b = ab
    cond = numpy.asarray(numpy.broadcast_to(a, numpy.broadcast_shapes(a.shape, b.shape)) > 0)
    check_grad(lambda x, y: F.where(cond, x, y), a, b)


@given(shapes.flatmap(arrays))
@example(SCALAR)
def test_masked_fill(x):
    mask = numpy.asarray(x > 0.3)
    check_grad(lambda a: a.masked_fill(mask, -5.0), x)


# -- unary ------------------------------------------------------------------------
@given(shapes.flatmap(arrays))
@example(SCALAR)
def test_neg(x):
    check_grad(lambda a: -a, x)


@given(shapes.flatmap(arrays))
@example(SCALAR)
def test_exp(x):
    check_grad(lambda a: a.exp(), x)


@given(shapes.flatmap(lambda s: arrays(s, 0.2, 3.0)))
@example(SCALAR)
def test_log(x):
    check_grad(lambda a: a.log(), x)


@given(shapes.flatmap(arrays))
@example(SCALAR)
def test_clone(x):
    check_grad(lambda a: a.clone() * a, x)


@given(shapes.flatmap(arrays))
@example(SCALAR)
def test_tanh(x):
    check_grad(lambda a: a.tanh(), x)


@given(shapes.flatmap(lambda s: arrays(s, -6, 6)))
@example(SCALAR)
def test_sigmoid(x):
    check_grad(lambda a: a.sigmoid(), x)


@given(shapes.flatmap(away_from_zero))  # relu has a kink at 0: stay away from it
@example(SCALAR)
def test_relu(x):
    check_grad(lambda a: a.relu(), x)


@given(shapes.flatmap(away_from_zero))  # abs has a kink at 0: stay away from it
@example(SCALAR)
def test_abs(x):
    check_grad(lambda a: abs(a), x)


@given(shapes.flatmap(lambda s: arrays(s, -4, 4)))
@example(SCALAR)
def test_gelu(x):
    check_grad(lambda a: a.gelu(), x)


def test_gelu_is_the_tanh_approximation():
    x = numpy.linspace(-4, 4, 17)
    expected = 0.5 * x * (1 + numpy.tanh(numpy.sqrt(2 / numpy.pi) * (x + 0.044715 * x**3)))
    numpy.testing.assert_allclose(F.gelu(Tensor(x)).numpy(), expected, rtol=1e-12)


def test_gelu_backward_in_pieces_is_the_derivative():
    # More elements than one piece of GELU's backward (it works through x in
    # pieces), and a remainder, against the derivative written out in float64.
    from tinygrad_ckpt.ops.elementwise import GELU

    x = numpy.linspace(-5, 5, 2 * GELU.piece + 7).reshape(-1, 1)
    g = numpy.cos(x)
    xt = Tensor(x, requires_grad=True)
    F.gelu(xt).backward(Tensor(g))
    c = numpy.sqrt(2 / numpy.pi)
    t = numpy.tanh(c * (x + 0.044715 * x**3))
    expected = g * (0.5 * (1 + t) + 0.5 * x * (1 - t**2) * c * (1 + 3 * 0.044715 * x**2))
    numpy.testing.assert_allclose(xt.grad.numpy(), expected, rtol=1e-12, atol=1e-15)


# -- reductions -------------------------------------------------------------------
def axes_for(shape):
    """None, one axis or several; a 0-d tensor takes axis 0 or -1, as in PyTorch."""
    ndim = len(shape)
    if ndim == 0:
        return st.sampled_from([None, 0, -1])
    single = st.integers(-ndim, ndim - 1)
    several = st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True).map(tuple)
    return st.one_of(st.none(), single, several)


reduction_cases = shapes.flatmap(lambda s: st.tuples(arrays(s), axes_for(s), st.booleans()))


@given(reduction_cases)
@example((SCALAR, None, False))
@example((SCALAR, -1, True))
def test_sum(case):
    x, axis, keepdims = case
    check_grad(lambda a: a.sum(axis=axis, keepdims=keepdims), x)


@given(reduction_cases)
@example((SCALAR, None, False))
@example((SCALAR, 0, False))
def test_mean(case):
    x, axis, keepdims = case
    check_grad(lambda a: a.mean(axis=axis, keepdims=keepdims), x)


@given(shapes.flatmap(lambda s: st.tuples(st.permutations(range(int(numpy.prod(s)))), st.just(s), axes_for(s), st.booleans())))
@example(([0], (), None, False))
@example(([0], (), -1, True))
def test_max(case):
    perm, shape, axis, keepdims = case
    x = numpy.array(perm, dtype=numpy.float64).reshape(shape) / 3  # distinct values: no ties
    check_grad(lambda a: a.max(axis=axis, keepdims=keepdims), x)


@given(shapes.flatmap(lambda s: st.tuples(st.permutations(range(int(numpy.prod(s)))), st.just(s), axes_for(s), st.booleans())))
@example(([0], (), None, False))
def test_min(case):
    perm, shape, axis, keepdims = case
    x = numpy.array(perm, dtype=numpy.float64).reshape(shape) / 3  # distinct values: no ties
    check_grad(lambda a: a.min(axis=axis, keepdims=keepdims), x)


def test_max_shares_gradient_between_ties():
    x = Tensor([1.0, 3.0, 3.0], requires_grad=True)
    x.max().backward()
    numpy.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.5, 0.5])


def one_axis(shape):
    return st.integers(-max(len(shape), 1), max(len(shape), 1) - 1)


@given(shapes.flatmap(lambda s: st.tuples(arrays(s), one_axis(s))))
@example((SCALAR, -1))
def test_softmax(case):
    x, axis = case
    check_grad(lambda a: a.softmax(axis=axis), x)


@given(shapes.flatmap(lambda s: st.tuples(arrays(s), one_axis(s))))
@example((SCALAR, 0))
def test_log_softmax(case):
    x, axis = case
    check_grad(lambda a: a.log_softmax(axis=axis), x)


def test_softmax_is_stable_for_large_logits():
    out = F.softmax(Tensor([1000.0, 1000.0, -1000.0])).numpy()
    numpy.testing.assert_allclose(out, [0.5, 0.5, 0.0])


# -- matmul -----------------------------------------------------------------------
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.sampled_from([(), (2,), (1, 2), (2, 1)]), st.sampled_from([(), (2,), (2, 2)]), st.data())
def test_matmul_batched_and_broadcast(m, k, n, batch_a, batch_b, data):
    if batch_a == (2, 1) and batch_b == (2,):
        batch_b = (1,)
    a = data.draw(arrays(batch_a + (m, k)))
    b = data.draw(arrays(batch_b + (k, n)))
    check_grad(lambda x, y: x @ y, a, b)


@given(st.integers(1, 4), st.data())
def test_matmul_vectors(k, data):
    a, b, m = data.draw(arrays((k,))), data.draw(arrays((k,))), data.draw(arrays((3, k)))
    check_grad(lambda x, y: x @ y, a, b)
    check_grad(lambda x, y: x @ y, m, b)
    check_grad(lambda x, y: x @ y, a, m.T.copy())


@given(st.sampled_from([(4,), (2, 4), (2, 3, 4)]), st.integers(1, 3), st.booleans(), st.data())
def test_linear(x_shape, out_features, with_bias, data):
    x = data.draw(arrays(x_shape))
    w = data.draw(arrays((out_features, x_shape[-1])))
    b = data.draw(arrays((out_features,)))
    if with_bias:
        check_grad(lambda x, w, b: F.linear(x, w, b), x, w, b)
    else:
        check_grad(lambda x, w: F.linear(x, w), x, w)


# -- movement ---------------------------------------------------------------------
RESHAPES = [((2, 3), (3, 2)), ((2, 3), (6,)), ((2, 3, 2), (3, -1)), ((4,), (2, 2, 1)), ((), (1, 1)), ((1,), ()), ((), (-1,))]


@given(st.sampled_from(RESHAPES).flatmap(lambda case: st.tuples(arrays(case[0]), st.just(case[1]))))
@example((SCALAR, (1,)))
def test_reshape(case):
    x, shape = case
    check_grad(lambda a: a.reshape(shape), x)


@given(shapes.flatmap(lambda s: st.tuples(arrays(s), st.permutations(range(len(s))))))
@example((SCALAR, []))
def test_permute(case):
    x, axes = case
    check_grad(lambda a: a.permute(tuple(axes)), x)


@given(arrays((2, 3)))
def test_transpose_and_T(x):
    check_grad(lambda a: a.T, x)
    check_grad(lambda a: a.transpose(0, 1), x)


@given(arrays((4, 3)), st.sampled_from([(slice(1, 3),), (1,), (slice(None), 2), (Ellipsis, slice(0, 2)), (slice(None, None, 2), slice(1, None))]))
def test_getitem_basic(x, index):
    check_grad(lambda a: a[index], x)


@pytest.mark.parametrize("index", [(), None, Ellipsis, (None, Ellipsis)])
def test_getitem_of_a_scalar(index):
    check_grad(lambda a: a[index], SCALAR)


def test_embedding_of_one_index_is_one_row():
    check_grad(lambda w: F.embedding(numpy.array(2), w), numpy.arange(12.0).reshape(4, 3) / 7)


@given(arrays((5, 3)), st.lists(st.integers(0, 4), min_size=1, max_size=8))
def test_getitem_integer_array_repeats_add(x, rows):
    idx = numpy.array(rows)
    check_grad(lambda a: a[idx], x)
    check_grad(lambda w: F.embedding(idx.reshape(1, -1), w), x)


@given(st.integers(0, 1), st.lists(st.integers(1, 3), min_size=1, max_size=3), st.data())
def test_cat(axis, sizes, data):
    parts = [data.draw(arrays((n, 2) if axis == 0 else (2, n))) for n in sizes]
    check_grad(lambda *xs: F.cat(xs, axis=axis), *parts)


@given(st.lists(st.integers(0, 3), min_size=1, max_size=4), st.integers(0, 1), st.data())
def test_split(sizes, axis, data):
    # Pieces of the given sizes (a piece may be empty), each used: every piece's gradient comes back.
    shape = (sum(sizes), 2) if axis == 0 else (2, sum(sizes))
    x = data.draw(arrays(shape))
    check_grad(lambda t: F.cat([p * (i + 1) for i, p in enumerate(t.split(sizes, dim=axis))], axis=axis), x)


def test_split_as_pytorch_and_a_piece_left_unused():
    x = Tensor(numpy.arange(14.0).reshape(2, 7), requires_grad=True)
    pieces = x.split(3, dim=-1)  # PyTorch: pieces of 3, the last one smaller
    assert [p.shape for p in pieces] == [(2, 3), (2, 3), (2, 1)]
    numpy.testing.assert_array_equal(pieces[2].numpy(), [[6.0], [13.0]])
    assert all(p.data.base is not None for p in pieces)  # views of x, as PyTorch's
    pieces[1].sum().backward()  # the other pieces get no gradient: zeros there
    numpy.testing.assert_array_equal(x.grad.numpy(), [[0, 0, 0, 1, 1, 1, 0]] * 2)
    with pytest.raises(ValueError, match="split: sizes \\[2, 2\\] do not add up to 7"):
        x.split([2, 2], dim=1)
    with pytest.raises(ValueError, match="split_size must be a positive integer"):
        x.split(0, dim=1)


def stack_case(shape):
    """1 to 3 arrays of one shape, and an axis to stack them along."""
    return st.tuples(st.lists(arrays(shape), min_size=1, max_size=3), st.integers(-len(shape) - 1, len(shape)))


@given(st.sampled_from([(), (3,), (2, 3)]).flatmap(stack_case))
@example(([SCALAR, -SCALAR], 0))
def test_stack(case):
    parts, axis = case
    check_grad(lambda *xs: F.stack(xs, axis=axis), *parts)


# -- nn ops -------------------------------------------------------------------------
@given(st.sampled_from([(4,), (2, 4), (2, 3, 5)]), st.data())
def test_layer_norm(shape, data):
    x = data.draw(arrays(shape))
    w = data.draw(arrays(shape[-1:]))
    b = data.draw(arrays(shape[-1:]))
    check_grad(lambda x, w, b: F.layer_norm(x, shape[-1:], w, b), x, w, b)


@given(st.integers(1, 5), st.integers(2, 4), st.sampled_from(["mean", "sum"]), st.data())
def test_cross_entropy_with_ignored_targets(n, classes, reduction, data):
    logits = data.draw(arrays((n, classes), -3, 3))
    targets = numpy.array(data.draw(st.lists(st.integers(0, classes - 1), min_size=n, max_size=n)))
    ignore = numpy.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    ignore[0] = False  # at least one target counts
    targets[ignore] = -100
    check_grad(lambda z: F.cross_entropy(z, targets, reduction=reduction), logits)


def test_cross_entropy_matches_a_direct_computation():
    rng = numpy.random.default_rng(0)
    logits = rng.standard_normal((2, 3, 5))
    targets = numpy.array([[1, 4, -100], [0, -100, 2]])
    logp = logits - numpy.log(numpy.exp(logits).sum(-1, keepdims=True))
    picked = [logp[b, t, targets[b, t]] for b in range(2) for t in range(3) if targets[b, t] != -100]
    assert abs(F.cross_entropy(Tensor(logits), targets).item() - (-numpy.mean(picked))) < 1e-12
    assert abs(F.cross_entropy(Tensor(logits), targets, reduction="sum").item() - (-numpy.sum(picked))) < 1e-12


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_with_every_target_ignored_gives_zero_gradients(reduction):
    # PyTorch's behaviour: the mean over no counted target is NaN (0 / 0), the
    # sum is 0, and the gradient is zero either way, not NaN; and no warning.
    logits = Tensor(numpy.random.default_rng(0).standard_normal((3, 4)), requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss = F.cross_entropy(logits, numpy.full(3, -100), reduction=reduction)
        loss.backward()
    assert numpy.isnan(loss.item()) if reduction == "mean" else loss.item() == 0.0
    numpy.testing.assert_array_equal(logits.grad.numpy(), numpy.zeros((3, 4)))


def _torch():
    return pytest.importorskip("torch", reason=TORCH_SKIP)


@pytest.mark.parametrize("ignored", ["every target", "some targets", "no target"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_matches_pytorch(ignored, reduction):
    torch = _torch()
    rng = numpy.random.default_rng(1)
    logits, targets = rng.standard_normal((5, 4)), rng.integers(0, 4, 5)
    targets[{"every target": slice(None), "some targets": [1, 3], "no target": []}[ignored]] = -100
    ours = Tensor(logits, requires_grad=True)
    loss = F.cross_entropy(ours, targets, reduction=reduction)
    loss.backward()
    theirs = torch.tensor(logits, requires_grad=True)
    expected = torch.nn.functional.cross_entropy(theirs, torch.tensor(targets), reduction=reduction)
    expected.backward()
    numpy.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-12)  # NaN equals NaN here
    numpy.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-10, atol=1e-15)


@given(shapes.flatmap(arrays), st.sampled_from([0.1, 0.5]), st.integers(0, 100))
@example(SCALAR, 0.5, 1)
def test_dropout(x, p, seed):
    # The same seed gives the same mask, so finite differences see one function.
    check_grad(lambda a: F.dropout(a, p, training=True, rng=numpy.random.default_rng(seed)), x)


def test_dropout_keeps_the_expected_fraction_and_scales():
    x = Tensor(numpy.ones((200, 100)))
    out = F.dropout(x, 0.25, training=True, rng=numpy.random.default_rng(1)).numpy()
    assert set(numpy.unique(out)) == {0.0, 1 / 0.75}
    assert abs((out == 0).mean() - 0.25) < 0.02
    assert F.dropout(x, 0.25, training=False) is x


@given(shapes.flatmap(lambda s: st.tuples(arrays(s), arrays(s))))
@example(SCALARS)
def test_mse_loss(ab):
    check_grad(lambda x, y: F.mse_loss(x, y), *ab)


@given(shapes.flatmap(arrays))
@example(SCALAR)
def test_cast_round_trip(x):
    t = Tensor(x, requires_grad=True, dtype="float64")
    t.to(dtype=numpy.float32).sum().backward()
    assert t.grad.dtype == numpy.float64
    numpy.testing.assert_array_equal(t.grad.numpy(), numpy.ones_like(x))


# -- Python numbers in arithmetic: PyTorch's type promotion -------------------------------
# (tensor dtype, number, result dtype), as PyTorch 2.13 gives them (checked against it below).
PROMOTIONS = [
    ("int64", 0.5, "float32"), ("int64", 2, "int64"), ("int64", True, "int64"), ("int32", 0.5, "float32"),
    ("int32", 7, "int32"), ("uint8", 3, "uint8"), ("bool", True, "bool"), ("bool", 2, "int64"),
    ("bool", 0.5, "float32"), ("float32", 2, "float32"), ("float32", 0.5, "float32"),
    ("float64", 0.5, "float64"), ("float16", 2.5, "float16"), ("int64", numpy.float64(0.5), "float32"),
    ("int32", numpy.int64(3), "int32"), ("float32", numpy.float64(0.5), "float32"),
]


@pytest.mark.parametrize("dtype,number,expected", PROMOTIONS)
def test_python_numbers_promote_as_in_pytorch(dtype, number, expected):
    t = Tensor(numpy.array([1, 0]).astype(dtype))
    for result in (t + number, number + t, t * number, number * t):
        assert result.dtype == numpy.dtype(expected)


def test_an_integer_tensor_plus_a_fraction_is_a_float_tensor():
    x = Tensor(numpy.array([1, 2, 3]))
    numpy.testing.assert_array_equal((x + 0.5).numpy(), numpy.array([1.5, 2.5, 3.5], dtype=numpy.float32))
    numpy.testing.assert_array_equal((x - 0.5).numpy(), [0.5, 1.5, 2.5])
    numpy.testing.assert_array_equal((1.5 - x).numpy(), [0.5, -0.5, -1.5])
    numpy.testing.assert_array_equal((x * 0.5).numpy(), [0.5, 1.0, 1.5])
    numpy.testing.assert_array_equal((x**0.5).numpy(), numpy.sqrt([1, 2, 3]).astype(numpy.float32))
    numpy.testing.assert_array_equal((0.5**x).numpy(), [0.5, 0.25, 0.125])
    assert (x**2).dtype == numpy.int64 and (2**x).tolist() == [2, 4, 8]


def test_true_division_of_integers_is_float32():
    x = Tensor(numpy.array([1, 2]))
    for result in (x / 2, 2 / x, x / x):
        assert result.dtype == numpy.float32
    numpy.testing.assert_array_equal((x / 2).numpy(), [0.5, 1.0])


def test_where_promotes_a_number_and_masked_fill_keeps_the_dtype():
    x, mask = Tensor(numpy.array([1, 2])), numpy.array([True, False])
    numpy.testing.assert_array_equal(F.where(mask, x, 0.5).numpy(), numpy.array([1.0, 0.5], dtype=numpy.float32))
    numpy.testing.assert_array_equal(F.where(mask, 0.5, x).numpy(), numpy.array([0.5, 2.0], dtype=numpy.float32))
    assert x.masked_fill(mask, 0.5).tolist() == [0, 2]  # the value takes x's dtype, as in PyTorch


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint8", "bool", "float32", "float64"])
def test_promotion_of_numbers_matches_pytorch(dtype):
    torch = _torch()
    values = numpy.array([1, 2, 3]).astype(dtype)  # no zero: no division by it
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b,
           "**": lambda a, b: a**b}
    for number in (2, 0.5, True, numpy.float64(0.25), numpy.int64(3)):
        for name, op in ops.items():
            for reflected in (False, True):
                def run(t):
                    return op(number, t) if reflected else op(t, number)

                try:
                    expected = run(torch.tensor(values))
                except NotImplementedError:  # PyTorch has no pow of two bools
                    continue
                except RuntimeError:  # subtracting bools: an error in PyTorch, and here
                    with pytest.raises((TypeError, RuntimeError)):
                        run(Tensor(values))
                    continue
                ours = run(Tensor(values))
                assert str(ours.dtype) == str(expected.dtype).replace("torch.", ""), (number, name, reflected)
                numpy.testing.assert_allclose(ours.numpy(), expected.numpy(), rtol=1e-6)


# -- one rule for gradients nobody asked for (function.py) -------------------------------
def _ops_with_several_inputs():
    a, b = numpy.array([[0.5, -1.0], [2.0, 0.3]]), numpy.array([[1.5, 0.7], [0.4, 1.1]])
    row = numpy.array([0.2, -0.4])
    return {
        "Add": (lambda x, y: x + y, [a, b]), "Sub": (lambda x, y: x - y, [a, b]),
        "Mul": (lambda x, y: x * y, [a, b]), "Div": (lambda x, y: x / y, [a, b]),
        "Pow": (lambda x, y: x**y, [b, a]), "Where": (lambda x, y: F.where(a > 0, x, y), [a, b]),
        "MatMul": (lambda x, y: x @ y, [a, b]), "Linear": (lambda x, w, c: F.linear(x, w, c), [a, b, row]),
        "LayerNorm": (lambda x, w, c: F.layer_norm(x, 2, w, c), [a, row, row]),
        "Cat": (lambda x, y: F.cat([x, y]), [a, b]), "Stack": (lambda x, y: F.stack([x, y]), [a, b]),
    }


@pytest.mark.parametrize("op", list(_ops_with_several_inputs()))
def test_backward_returns_none_exactly_for_inputs_that_need_no_gradient(op):
    fn, arrays = _ops_with_several_inputs()[op]
    for needed in range(len(arrays)):
        inputs = [Tensor(a, requires_grad=i == needed) for i, a in enumerate(arrays)]
        out = fn(*inputs)
        assert out.grad_fn.name == op
        grads = out.grad_fn.op.backward(out.grad_fn.ctx, out.data * 0 + 1)
        assert [g is not None for g in grads] == [i == needed for i in range(len(arrays))], f"needed: input {needed}"


# -- the checker itself must be able to fail -------------------------------------------
def test_gradcheck_catches_a_wrong_backward():
    from tinygrad_ckpt.function import Function

    class WrongSquare(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_arrays
            return g * x  # should be 2 * g * x

    x = Tensor(numpy.array([1.0, 2.0]), requires_grad=True)
    try:
        gradcheck(lambda a: WrongSquare.apply(a), [x])
    except GradcheckError as e:
        assert "input 0" in str(e) and "index (0,)" in str(e)
    else:
        raise AssertionError("gradcheck accepted a wrong derivative")


# -- edge values: 0, -0.0, +-inf, NaN, the edges of each domain, against PyTorch ----------
# Values and gradients (of out.backward(ones)) must match PyTorch's, NaN matching NaN.
# Drawn from the edges and from ordinary values (edge_arrays), so an edge meets every neighbour.
# name: (ours, PyTorch's); each takes its tensors (PyTorch's, the torch module first).
UNARY_AT_EDGES = {
    "neg": (lambda t: -t, lambda torch, t: -t),
    "exp": (lambda t: t.exp(), lambda torch, t: t.exp()),
    "log": (lambda t: t.log(), lambda torch, t: t.log()),
    "sqrt": (lambda t: t.sqrt(), lambda torch, t: t.sqrt()),
    "tanh": (lambda t: t.tanh(), lambda torch, t: t.tanh()),
    "sigmoid": (lambda t: t.sigmoid(), lambda torch, t: t.sigmoid()),
    "relu": (lambda t: t.relu(), lambda torch, t: t.relu()),
    "gelu": (lambda t: t.gelu(), lambda torch, t: torch.nn.functional.gelu(t, approximate="tanh")),
    "softmax": (lambda t: t.softmax(axis=-1), lambda torch, t: t.softmax(-1)),
    "log_softmax": (lambda t: t.log_softmax(axis=0), lambda torch, t: t.log_softmax(0)),
    "sum": (lambda t: t.sum(axis=-1), lambda torch, t: t.sum(-1)),
    "mean": (lambda t: t.mean(), lambda torch, t: t.mean()),
    "max": (lambda t: t.max(), lambda torch, t: t.max()),  # ties share the gradient; a NaN takes it
    "max over an axis": (lambda t: t.max(axis=0), lambda torch, t: t.amax(0)),  # (no NaN: see reduce.Max)
    "min": (lambda t: t.min(), lambda torch, t: t.min()),
    "min over an axis": (lambda t: t.min(axis=-1, keepdims=True), lambda torch, t: t.amin(-1, keepdim=True)),
    "abs": (lambda t: abs(t), lambda torch, t: t.abs()),
    "layer_norm": (lambda t: F.layer_norm(t, t.shape[-1:]), lambda torch, t: torch.nn.functional.layer_norm(t, t.shape[-1:])),
    "cross_entropy": (lambda t: F.cross_entropy(t, _targets_for(t.shape)),
                      lambda torch, t: torch.nn.functional.cross_entropy(t, torch.tensor(_targets_for(t.shape)))),
    **{f"x ** {p}": (lambda t, p=p: t**p, lambda torch, t, p=p: t**p) for p in [0, 1, 2, 3, 0.5, -0.5, -1, -1.5, -2, 2.5]},
    **{f"{b} ** x": (lambda t, b=b: b**t, lambda torch, t, b=b: b**t) for b in [0.0, 1.0, 2.0, 0.5, -2.0]},
}
NEEDS_AN_AXIS = {"layer_norm", "cross_entropy"}
# Sums of huge values of both signs cancel to what the order of the additions makes them (NumPy's pairwise
# sum and PyTorch's vectorised one differ), and layer norm's variance overflows float32: they draw no huge
# finite values (infinities they do).
SUMS = {"sum", "mean", "layer_norm"}


def _targets_for(shape):
    """Class indices for logits of `shape` (..., C): 0, 1, 2, ... wrapping at C."""
    return numpy.arange(int(numpy.prod(shape[:-1]))).reshape(shape[:-1]) % shape[-1]


BINARY_AT_EDGES = {
    "add": (lambda a, b: a + b, lambda torch, a, b: a + b), "sub": (lambda a, b: a - b, lambda torch, a, b: a - b),
    "mul": (lambda a, b: a * b, lambda torch, a, b: a * b), "div": (lambda a, b: a / b, lambda torch, a, b: a / b),
    "pow": (lambda a, b: a**b, lambda torch, a, b: a**b),
    "where": (lambda a, b: F.where(numpy.asarray(numpy.arange(a.numel()).reshape(a.shape) % 2 == 0), a, b),
              lambda torch, a, b: torch.where(torch.arange(a.numel()).reshape(a.shape) % 2 == 0, a, b)),
}


def _same(ours, theirs, what):
    # float32: rounding apart (1 + tanh(u) cancels in GELU's left tail), not a different value
    rtol, atol = (1e-9, 1e-12) if ours.dtype == numpy.float64 else (1e-4, 1e-6)
    numpy.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


def _run_ours(fn, arrays):
    inputs = [Tensor(a, requires_grad=True) for a in arrays]
    with numpy.errstate(all="ignore"):
        out = fn(*inputs)
        out.backward(Tensor(numpy.ones(out.shape, dtype=out.dtype)))
    return out.numpy(), [t.grad.numpy() for t in inputs]


def _run_torch(torch, fn, arrays):
    inputs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = fn(torch, *inputs)
    out.backward(torch.ones_like(out))
    return out.detach().numpy(), [t.grad.numpy() for t in inputs]


def _matches_pytorch(torch, ours_fn, torch_fn, arrays, dtype):
    with numpy.errstate(over="ignore", under="ignore"):
        arrays = [a.astype(dtype) for a in arrays]
    value, grads = _run_ours(ours_fn, arrays)
    expected_value, expected_grads = _run_torch(torch, torch_fn, arrays)
    _same(value, expected_value, f"values at {arrays}")
    for i, (g, e) in enumerate(zip(grads, expected_grads)):
        _same(g, e, f"gradient of input {i} at {arrays}")


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32])
@pytest.mark.parametrize("name", list(UNARY_AT_EDGES))
@given(x=st.sampled_from([(), (4,), (2, 3)]).flatmap(edge_arrays))
@example(x=numpy.array(EDGES))
def test_unary_ops_at_edge_values_match_pytorch(name, dtype, x):
    torch = _torch()
    if name in NEEDS_AN_AXIS and x.ndim == 0:
        return
    if name in SUMS:
        x = numpy.where(numpy.isfinite(x) & (abs(x) >= 1e20), 2.0, x)
    if name == "layer_norm" and dtype == numpy.float32:
        return  # float32 rounding times 1 / std can be any size: float64 only
    if name in ("max over an axis", "min over an axis"):
        x = numpy.nan_to_num(x, nan=1.0)  # a NaN: torch.amax's gradient is NaN, ours goes to the NaN (reduce.Max)
    ours, theirs = UNARY_AT_EDGES[name]
    _matches_pytorch(torch, ours, theirs, [x], dtype)


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32])
@pytest.mark.parametrize("name", list(BINARY_AT_EDGES))
@given(ab=st.sampled_from([(), (5,), (2, 3)]).flatmap(lambda s: st.tuples(edge_arrays(s), edge_arrays(s))))
@example(ab=(numpy.array(EDGES)[:, None] * numpy.ones(len(EDGES)), numpy.ones(len(EDGES))[:, None] * numpy.array(EDGES)))
def test_binary_ops_at_edge_values_match_pytorch(name, dtype, ab):
    torch = _torch()
    ours, theirs = BINARY_AT_EDGES[name]
    _matches_pytorch(torch, ours, theirs, list(ab), dtype)


def test_zero_to_the_power_of_a_tensor_has_a_zero_gradient():
    # The example: d(0 ** x)/dx is 0 for x > 0 (0 ** x is 0 there, flat), not 0 * log(0) = NaN.
    x = Tensor(numpy.array([0.5, 1.0, 2.0, 0.0]), requires_grad=True)
    (0**x).sum().backward()
    numpy.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0, 0.0, 0.0])
    y = Tensor(numpy.array([0.0, 2.0]), requires_grad=True)
    (y**0).sum().backward()  # y ** 0 is 1 for every y, 0 included: flat
    numpy.testing.assert_array_equal(y.grad.numpy(), [0.0, 0.0])
