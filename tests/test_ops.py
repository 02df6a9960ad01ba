"""Every op's backward checked against finite differences, shapes drawn by hypothesis."""

import numpy
from hypothesis import given
from hypothesis import strategies as st

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor
from tinygrad_ckpt.gradcheck import GradcheckError, gradcheck

from .helpers import check_grad
from .strategies import arrays, away_from_zero, broadcast_pairs, nonscalar_shapes, shapes


def pair(draw_shapes, make=arrays, make_b=arrays):
    return draw_shapes.flatmap(lambda s: st.tuples(make(s.input_shapes[0]), make_b(s.input_shapes[1])))


# -- binary, with broadcasting ---------------------------------------------------
@given(pair(broadcast_pairs))
def test_add(ab):
    check_grad(lambda a, b: a + b, *ab)


@given(pair(broadcast_pairs))
def test_sub(ab):
    check_grad(lambda a, b: a - b, *ab)


@given(pair(broadcast_pairs))
def test_mul(ab):
    check_grad(lambda a, b: a * b, *ab)


@given(pair(broadcast_pairs, make_b=away_from_zero))
def test_div(ab):
    check_grad(lambda a, b: a / b, *ab)


@given(pair(broadcast_pairs, make=lambda s: arrays(s, 0.5, 2.0)))
def test_pow_tensor_exponent(ab):
    check_grad(lambda a, b: a**b, *ab)


@given(shapes.flatmap(lambda s: arrays(s, 0.5, 2.0)), st.sampled_from([2, 3, 0.5, -1.5]))
def test_pow_scalar_exponent(x, p):
    check_grad(lambda a: a**p, x)


@given(pair(broadcast_pairs))
def test_where(ab):
    a, b = ab
    cond = numpy.asarray(numpy.broadcast_to(a, numpy.broadcast_shapes(a.shape, b.shape)) > 0)
    check_grad(lambda x, y: F.where(cond, x, y), a, b)


@given(shapes.flatmap(arrays))
def test_masked_fill(x):
    mask = numpy.asarray(x > 0.3)
    check_grad(lambda a: a.masked_fill(mask, -5.0), x)


# -- unary ------------------------------------------------------------------------
@given(shapes.flatmap(arrays))
def test_neg(x):
    check_grad(lambda a: -a, x)


@given(shapes.flatmap(arrays))
def test_exp(x):
    check_grad(lambda a: a.exp(), x)


@given(shapes.flatmap(lambda s: arrays(s, 0.2, 3.0)))
def test_log(x):
    check_grad(lambda a: a.log(), x)


@given(shapes.flatmap(arrays))
def test_tanh(x):
    check_grad(lambda a: a.tanh(), x)


@given(shapes.flatmap(lambda s: arrays(s, -6, 6)))
def test_sigmoid(x):
    check_grad(lambda a: a.sigmoid(), x)


@given(shapes.flatmap(away_from_zero))  # relu has a kink at 0: stay away from it
def test_relu(x):
    check_grad(lambda a: a.relu(), x)


@given(shapes.flatmap(lambda s: arrays(s, -4, 4)))
def test_gelu(x):
    check_grad(lambda a: a.gelu(), x)


def test_gelu_is_the_tanh_approximation():
    x = numpy.linspace(-4, 4, 17)
    expected = 0.5 * x * (1 + numpy.tanh(numpy.sqrt(2 / numpy.pi) * (x + 0.044715 * x**3)))
    numpy.testing.assert_allclose(F.gelu(Tensor(x)).numpy(), expected, rtol=1e-12)


def test_gelu_backward_in_pieces_is_the_derivative():
    # More elements than one piece of GELU's backward (it works through x in
    # pieces), and a remainder, against the derivative written out in float64.
    from tinygrad_ckpt.ops.elementwise import _GELU_PIECE

    x = numpy.linspace(-5, 5, 2 * _GELU_PIECE + 7).reshape(-1, 1)
    g = numpy.cos(x)
    xt = Tensor(x, requires_grad=True)
    F.gelu(xt).backward(Tensor(g))
    c = numpy.sqrt(2 / numpy.pi)
    t = numpy.tanh(c * (x + 0.044715 * x**3))
    expected = g * (0.5 * (1 + t) + 0.5 * x * (1 - t**2) * c * (1 + 3 * 0.044715 * x**2))
    numpy.testing.assert_allclose(xt.grad.numpy(), expected, rtol=1e-12, atol=1e-15)


# -- reductions -------------------------------------------------------------------
def axes_for(shape):
    ndim = len(shape)
    single = st.integers(-ndim, ndim - 1) if ndim else st.nothing()
    several = st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True).map(tuple) if ndim else st.nothing()
    return st.one_of(st.none(), single, several)


reduction_cases = nonscalar_shapes.flatmap(lambda s: st.tuples(arrays(s), axes_for(s), st.booleans()))


@given(reduction_cases)
def test_sum(case):
    x, axis, keepdims = case
    check_grad(lambda a: a.sum(axis=axis, keepdims=keepdims), x)


@given(reduction_cases)
def test_mean(case):
    x, axis, keepdims = case
    check_grad(lambda a: a.mean(axis=axis, keepdims=keepdims), x)


@given(nonscalar_shapes.flatmap(lambda s: st.tuples(st.permutations(range(int(numpy.prod(s)))), st.just(s), axes_for(s), st.booleans())))
def test_max(case):
    perm, shape, axis, keepdims = case
    x = numpy.array(perm, dtype=numpy.float64).reshape(shape) / 3  # distinct values: no ties
    check_grad(lambda a: a.max(axis=axis, keepdims=keepdims), x)


def test_max_shares_gradient_between_ties():
    x = Tensor([1.0, 3.0, 3.0], requires_grad=True)
    x.max().backward()
    numpy.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.5, 0.5])


@given(nonscalar_shapes.flatmap(lambda s: st.tuples(arrays(s), st.integers(-len(s), len(s) - 1))))
def test_softmax(case):
    x, axis = case
    check_grad(lambda a: a.softmax(axis=axis), x)


@given(nonscalar_shapes.flatmap(lambda s: st.tuples(arrays(s), st.integers(-len(s), len(s) - 1))))
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
@given(st.sampled_from([((2, 3), (3, 2)), ((2, 3), (6,)), ((2, 3, 2), (3, -1)), ((4,), (2, 2, 1))]), st.data())
def test_reshape(shapes_, data):
    src, dst = shapes_
    check_grad(lambda a: a.reshape(dst), data.draw(arrays(src)))


@given(nonscalar_shapes.flatmap(lambda s: st.tuples(arrays(s), st.permutations(range(len(s))))))
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


@given(arrays((5, 3)), st.lists(st.integers(0, 4), min_size=1, max_size=8))
def test_getitem_integer_array_repeats_add(x, rows):
    idx = numpy.array(rows)
    check_grad(lambda a: a[idx], x)
    check_grad(lambda w: F.embedding(idx.reshape(1, -1), w), x)


@given(st.integers(0, 1), st.lists(st.integers(1, 3), min_size=1, max_size=3), st.data())
def test_cat(axis, sizes, data):
    parts = [data.draw(arrays((n, 2) if axis == 0 else (2, n))) for n in sizes]
    check_grad(lambda *xs: F.cat(xs, axis=axis), *parts)


@given(st.integers(-2, 2), st.integers(1, 3), st.data())
def test_stack(axis, count, data):
    parts = [data.draw(arrays((2, 3))) for _ in range(count)]
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


@given(arrays((3, 4)), st.sampled_from([0.1, 0.5]), st.integers(0, 100))
def test_dropout(x, p, seed):
    # The same seed gives the same mask, so finite differences see one function.
    check_grad(lambda a: F.dropout(a, p, training=True, rng=numpy.random.default_rng(seed)), x)


def test_dropout_keeps_the_expected_fraction_and_scales():
    x = Tensor(numpy.ones((200, 100)))
    out = F.dropout(x, 0.25, training=True, rng=numpy.random.default_rng(1)).numpy()
    assert set(numpy.unique(out)) == {0.0, 1 / 0.75}
    assert abs((out == 0).mean() - 0.25) < 0.02
    assert F.dropout(x, 0.25, training=False) is x


@given(arrays((3, 2)), arrays((3, 2)))
def test_mse_loss(a, b):
    check_grad(lambda x, y: F.mse_loss(x, y), a, b)


@given(arrays((2, 3)))
def test_cast_round_trip(x):
    t = Tensor(x, requires_grad=True, dtype="float64")
    t.to(dtype=numpy.float32).sum().backward()
    assert t.grad.dtype == numpy.float64
    numpy.testing.assert_array_equal(t.grad.numpy(), numpy.ones_like(x))


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
