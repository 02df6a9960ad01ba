"""The layers' options a PyTorch user reaches for, as PyTorch 2.13 has them: pooling's ceil_mode,
count_include_pad, divisor_override and return_indices; Conv2d's padding_mode; BatchNorm's
track_running_stats, num_batches_tracked and reset_running_stats(); cross-entropy's weight,
label_smoothing and class-probability targets; GradScaler.scale of a list or tuple of losses.

Each is proved without PyTorch: the expected values are computed here in NumPy from the option's
definition (a window's real pixels, numpy.pad, the soft-target formula), never by the code under test,
and the gradients by finite differences in float64 on drawn shapes. Where PyTorch is installed, its
values and gradients are compared on the same draws too.
"""

import math

import numpy
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, nn
from tinygrad_ckpt.grad_scaler import GradScaler

from .conftest import examples
from .helpers import TORCH_SKIP, check_grad

F64 = numpy.float64


def _torch():
    return pytest.importorskip("torch", reason=TORCH_SKIP)


# -- pooling ------------------------------------------------------------------------------
@st.composite
def pool_cases(draw, dilation=True):
    """(x, options) with ceil_mode drawn: distinct values (no ties), padding at most half the kernel."""
    k = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    d = (draw(st.integers(1, 2)), draw(st.integers(1, 2))) if dilation else (1, 1)
    p = tuple(draw(st.integers(0, kk // 2)) for kk in k)
    H, W = (draw(st.integers(max(1, dd * (kk - 1) + 1 - 2 * pp), 7)) for kk, dd, pp in zip(k, d, p))
    N, C = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    x = numpy.random.default_rng(draw(st.integers(0, 2**16))).permutation(N * C * H * W).reshape(N, C, H, W) / 7.0
    options = dict(kernel_size=k, stride=s, padding=p, ceil_mode=draw(st.booleans()))
    if dilation:
        options["dilation"] = d
    return x, options


def _windows(n, k, s, p, d, out):
    """For each output position along one axis: the input positions of its window (padding included, as -1 .. n)."""
    return [[o * s - p + i * d for i in range(k)] for o in range(out)]


def _out_size(n, k, s, p, d, ceil_mode):
    """PyTorch's documented formula: floor or ceil of (n + 2p - d(k-1) - 1) / s + 1, less one in ceil mode
    if the last window would start in the right padding."""
    size = (math.ceil if ceil_mode else math.floor)((n + 2 * p - d * (k - 1) - 1) / s) + 1
    return size - 1 if ceil_mode and (size - 1) * s >= n + p else size


@given(st.integers(1, 9), st.integers(1, 4), st.integers(1, 4), st.integers(0, 2), st.integers(1, 2), st.booleans())
def test_ceil_mode_output_size_is_the_formula(n, k, s, p, d, ceil_mode):
    assume(2 * p <= k and n + 2 * p >= d * (k - 1) + 1)
    out = F.max_pool2d(Tensor(numpy.ones((1, 1, n, 3))), (k, 1), (s, 1), (p, 0), (d, 1), ceil_mode=ceil_mode)
    assert out.shape[2] == _out_size(n, k, s, p, d, ceil_mode)
    floor = _out_size(n, k, s, p, d, False)
    assert floor <= out.shape[2] <= floor + 1  # at most one more window, and it starts inside the image or its left padding
    assert (out.shape[2] - 1) * s - p < n


@settings(max_examples=examples(30))
@given(pool_cases())
def test_max_pool_is_the_largest_real_pixel_of_each_window_and_return_indices_say_where(case):
    x, o = case
    out, indices = F.max_pool2d(Tensor(x), **o, return_indices=True)
    (N, C, H, W), (kh, kw), (sh, sw), (ph, pw), (dh, dw) = x.shape, o["kernel_size"], o["stride"], o["padding"], o["dilation"]
    rows = _windows(H, kh, sh, ph, dh, _out_size(H, kh, sh, ph, dh, o["ceil_mode"]))
    cols = _windows(W, kw, sw, pw, dw, _out_size(W, kw, sw, pw, dw, o["ceil_mode"]))
    assert out.shape == (N, C, len(rows), len(cols)) == indices.shape and indices.dtype == numpy.int64
    assert not indices.requires_grad
    for a, r in enumerate(rows):
        for b, c in enumerate(cols):
            real = [(i, j) for i in r for j in c if 0 <= i < H and 0 <= j < W]
            expected = numpy.full((N, C), -numpy.inf) if not real else numpy.max([x[:, :, i, j] for i, j in real], axis=0)
            numpy.testing.assert_array_equal(out.numpy()[:, :, a, b], expected)
    found = numpy.take_along_axis(x.reshape(N, C, H * W), indices.numpy().reshape(N, C, -1), axis=2)
    finite = numpy.isfinite(out.numpy()).reshape(N, C, -1)
    numpy.testing.assert_array_equal(found[finite], out.numpy().reshape(N, C, -1)[finite])


@settings(max_examples=examples(30))
@given(pool_cases(dilation=False))
def test_avg_pool_divides_each_window_as_its_options_say(case):
    x, o = case
    (N, C, H, W), (kh, kw), (sh, sw), (ph, pw) = x.shape, o["kernel_size"], o["stride"], o["padding"]
    rows = _windows(H, kh, sh, ph, 1, _out_size(H, kh, sh, ph, 1, o["ceil_mode"]))
    cols = _windows(W, kw, sw, pw, 1, _out_size(W, kw, sw, pw, 1, o["ceil_mode"]))
    for count_include_pad, divisor_override in ((True, None), (False, None), (True, 3), (False, -2)):
        out = F.avg_pool2d(Tensor(x), **o, count_include_pad=count_include_pad, divisor_override=divisor_override)
        assert out.shape == (N, C, len(rows), len(cols))
        for a, r in enumerate(rows):
            for b, c in enumerate(cols):
                real = [(i, j) for i in r for j in c if 0 <= i < H and 0 <= j < W]
                in_padded = [i for i in r if i < H + ph], [j for j in c if j < W + pw]  # not past the padding (ceil_mode)
                divisor = (divisor_override if divisor_override is not None
                           else len(in_padded[0]) * len(in_padded[1]) if count_include_pad else len(real))
                expected = sum(x[:, :, i, j] for i, j in real) / divisor
                numpy.testing.assert_allclose(out.numpy()[:, :, a, b], expected, rtol=1e-12)


@settings(max_examples=examples(15))
@given(pool_cases())
def test_max_pool_options_gradients(case):
    x, o = case
    assume(numpy.isfinite(F.max_pool2d(Tensor(x), **o).numpy()).all())  # a window of padding only has no gradient
    check_grad(lambda t: F.max_pool2d(t, **o, return_indices=True)[0], x)


@settings(max_examples=examples(15))
@given(pool_cases(dilation=False), st.booleans(), st.sampled_from([None, 5]))
def test_avg_pool_options_gradients(case, count_include_pad, divisor_override):
    x, o = case
    check_grad(lambda t: F.avg_pool2d(t, **o, count_include_pad=count_include_pad, divisor_override=divisor_override), x)


def test_pool_layers_take_pytorchs_arguments():
    x = Tensor(numpy.arange(50.0).reshape(1, 2, 5, 5))
    out, indices = nn.MaxPool2d(2, return_indices=True, ceil_mode=True)(x)
    assert out.shape == indices.shape == (1, 2, 3, 3) and indices.numpy()[0, 0, 2, 2] == 24  # the corner, alone
    pooled = nn.AvgPool2d(2, ceil_mode=True, count_include_pad=False, divisor_override=None)(x)
    assert pooled.numpy()[0, 0, 2, 2] == 24.0  # a window of one real pixel: that pixel
    assert repr(nn.MaxPool2d(2, ceil_mode=True)).endswith("ceil_mode=True)")
    with pytest.raises(ValueError, match="divisor must be not zero"):
        nn.AvgPool2d(2, divisor_override=0)(x)


# -- Conv2d's padding_mode, F.pad's modes ------------------------------------------------
NUMPY_MODE = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}


@st.composite
def padded_conv_cases(draw):
    """(x, conv options): padding no larger than the image less one, so that every mode applies."""
    mode = draw(st.sampled_from(["zeros", "reflect", "replicate", "circular"]))
    k = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    H, W = draw(st.integers(2, 5)), draw(st.integers(2, 5))
    padding = (draw(st.integers(0, H - 1)), draw(st.integers(0, W - 1)))
    assume(all(n + 2 * p >= kk for n, p, kk in zip((H, W), padding, k)))
    rng = numpy.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.uniform(-2, 2, (draw(st.integers(1, 2)), 2, H, W))
    return x, dict(kernel_size=k, stride=draw(st.integers(1, 2)), padding=padding, padding_mode=mode)


@settings(max_examples=examples(20))
@given(padded_conv_cases())
def test_padding_mode_is_numpy_pad_then_a_convolution_without_padding(case):
    x, o = case
    conv = nn.Conv2d(2, 3, **o, dtype=F64, rng=numpy.random.default_rng(0))
    (ph, pw), mode = o["padding"], o["padding_mode"]
    widths = [(0, 0), (0, 0), (ph, ph), (pw, pw)]
    padded = numpy.pad(x, widths) if mode == "zeros" else numpy.pad(x, widths, mode=NUMPY_MODE[mode])
    expected = F.conv2d(Tensor(padded), conv.weight, conv.bias, stride=o["stride"])
    numpy.testing.assert_allclose(conv(Tensor(x)).numpy(), expected.numpy(), rtol=1e-12, atol=1e-12)


@settings(max_examples=examples(20))
@given(st.sampled_from(sorted(NUMPY_MODE)), st.integers(1, 3), st.data())
def test_pad_modes_are_numpy_pads_and_their_gradients_add_back(mode, axes, data):
    shape = tuple(data.draw(st.lists(st.integers(2, 4), min_size=axes + 1, max_size=axes + 2)))
    pad = tuple(data.draw(st.integers(0, shape[-1 - i // 2] - (mode == "reflect"))) for i in range(2 * axes))
    x = numpy.random.default_rng(data.draw(st.integers(0, 2**16))).uniform(-2, 2, shape)
    widths = [(0, 0)] * (len(shape) - axes) + [pad[2 * i:2 * i + 2] for i in range(axes)][::-1]
    numpy.testing.assert_array_equal(F.pad(Tensor(x), pad, mode).numpy(), numpy.pad(x, widths, mode=NUMPY_MODE[mode]))
    check_grad(lambda t: F.pad(t, pad, mode), x)


@settings(max_examples=examples(8))
@given(padded_conv_cases())
def test_padding_mode_gradients(case):
    x, o = case
    check_grad(nn.Conv2d(2, 3, **o, dtype=F64, rng=numpy.random.default_rng(0)), x)


@pytest.mark.parametrize("call, error, message", [
    (lambda: nn.Conv2d(1, 1, 3, padding_mode="mirror"), ValueError, r"padding_mode must be one of \('zeros', 'reflect'"),
    (lambda: F.pad(Tensor(numpy.ones((1, 1, 3, 3))), (3, 0, 0, 0), "reflect"), ValueError, r"less than the axis.* \(3, 0\)"),
    (lambda: F.pad(Tensor(numpy.ones((1, 1, 3, 3))), (4, 0, 0, 0), "circular"), ValueError, r"at most the axis"),
    (lambda: F.pad(Tensor(numpy.ones((1, 1, 3, 3))), (1, 1), "reflect"), NotImplementedError, r"Padding size 2 is not"),
    (lambda: F.pad(Tensor(numpy.ones(3)), (1, 1), "wrap"), ValueError, r"mode must be 'constant', 'reflect'"),
])
def test_bad_padding_modes_say_what_is_wrong(call, error, message):
    with pytest.raises(error, match=message):
        call()


# -- BatchNorm ----------------------------------------------------------------------------
def _batch_normalised(x):
    axes = (0, 2, 3)
    return (x - x.mean(axis=axes, keepdims=True)) / numpy.sqrt(x.var(axis=axes, keepdims=True) + 1e-5)


def test_without_running_stats_batchnorm_keeps_no_buffers_and_uses_the_batch_in_evaluation_too():
    bn = nn.BatchNorm2d(3, track_running_stats=False, dtype=F64)
    assert bn.running_mean is bn.running_var is bn.num_batches_tracked is None
    assert list(bn.state_dict()) == ["weight", "bias"]
    x = numpy.random.default_rng(0).standard_normal((4, 3, 2, 2)) * 3 + 1
    for mode in (True, False):
        numpy.testing.assert_allclose(bn.train(mode)(Tensor(x)).numpy(), _batch_normalised(x), rtol=1e-10)
    bn.reset_running_stats()  # nothing to reset
    assert "track_running_stats=False" in repr(bn)
    check_grad(lambda t: nn.BatchNorm2d(3, track_running_stats=False, affine=False, dtype=F64).eval()(t), x)


@settings(max_examples=examples(15))
@given(st.lists(st.booleans(), min_size=1, max_size=6), st.sampled_from([None, 0.1, 0.5]), st.integers(0, 2**16))
def test_num_batches_tracked_counts_training_batches_and_the_running_stats_follow_momentum(modes, momentum, seed):
    """modes: training (True) or evaluation for each call; momentum None is the cumulative average."""
    rng = numpy.random.default_rng(seed)
    bn = nn.BatchNorm2d(2, momentum=momentum, dtype=F64)
    mean, var, seen = numpy.zeros(2), numpy.ones(2), []
    for training in modes:
        x = rng.standard_normal((3, 2, 2, 2)) * rng.uniform(0.5, 3) + rng.uniform(-2, 2)
        bn.train(training)(Tensor(x))
        if training:
            seen.append(x)
            m = 1 / len(seen) if momentum is None else momentum
            mean = (1 - m) * mean + m * x.mean(axis=(0, 2, 3))
            var = (1 - m) * var + m * x.var(axis=(0, 2, 3), ddof=1)
    assert int(bn.num_batches_tracked.item()) == len(seen) and bn.num_batches_tracked.dtype == numpy.int64
    numpy.testing.assert_allclose(bn.running_mean.numpy(), mean, rtol=1e-10, atol=1e-12)
    numpy.testing.assert_allclose(bn.running_var.numpy(), var, rtol=1e-10)
    if momentum is None and seen:  # the cumulative average is the plain mean of the batches' statistics
        numpy.testing.assert_allclose(mean, numpy.mean([x.mean(axis=(0, 2, 3)) for x in seen], axis=0), rtol=1e-10)


def test_reset_running_stats_starts_the_average_again():
    bn = nn.BatchNorm2d(2, momentum=None, dtype=F64)
    rng = numpy.random.default_rng(1)
    for _ in range(3):
        bn(Tensor(rng.standard_normal((4, 2, 3, 3)) + 5))
    bn.reset_running_stats()
    assert bn.running_mean.numpy().tolist() == [0, 0] and bn.running_var.numpy().tolist() == [1, 1]
    assert int(bn.num_batches_tracked.item()) == 0
    x = rng.standard_normal((4, 2, 3, 3))
    bn(Tensor(x))  # the first batch after a reset: its statistics, whole (factor 1/1)
    numpy.testing.assert_allclose(bn.running_mean.numpy(), x.mean(axis=(0, 2, 3)), rtol=1e-12)
    numpy.testing.assert_allclose(bn.running_var.numpy(), x.var(axis=(0, 2, 3), ddof=1), rtol=1e-12)


# -- cross-entropy -------------------------------------------------------------------------
@st.composite
def ce_cases(draw):
    """(logits (..., C), integer targets with some ignored, weight (C,), class probabilities (..., C))."""
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    C = draw(st.integers(2, 5))
    rng = numpy.random.default_rng(draw(st.integers(0, 2**16)))
    targets = rng.integers(0, C, shape)
    targets[rng.random(shape) < 0.25] = -100
    assume((targets != -100).any())
    return (rng.uniform(-3, 3, shape + (C,)), targets, rng.uniform(0.1, 2.0, C),
            rng.dirichlet(numpy.ones(C), shape))


def _log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - numpy.log(numpy.exp(z).sum(axis=-1, keepdims=True))


@settings(max_examples=examples(25))
@given(ce_cases(), st.sampled_from(["mean", "sum", "none"]))
def test_weight_is_the_weighted_mean_of_the_counted_targets(case, reduction):
    logits, targets, weight, _ = case
    counted = targets != -100
    safe = numpy.where(counted, targets, 0)
    w = weight[safe] * counted
    losses = -numpy.take_along_axis(_log_softmax(logits), safe[..., None], axis=-1)[..., 0] * w
    expected = {"mean": losses.sum() / w.sum(), "sum": losses.sum(), "none": losses}[reduction]
    out = F.cross_entropy(Tensor(logits), targets, weight=weight, reduction=reduction)
    numpy.testing.assert_allclose(out.numpy(), expected, rtol=1e-12, atol=1e-15)


@settings(max_examples=examples(25))
@given(ce_cases(), st.floats(0.0, 1.0), st.booleans())
def test_label_smoothing_is_the_smoothed_target_formula(case, smoothing, weighted):
    """loss_n = -sum_c w_c q_nc log p_nc, q = (1 - e) onehot + e / C; the mean divided by the counted sum of w[y]."""
    logits, targets, weight, _ = case
    weight = weight if weighted else numpy.ones_like(weight)
    C, counted = logits.shape[-1], targets != -100
    q = (1 - smoothing) * numpy.eye(C)[numpy.where(counted, targets, 0)] + smoothing / C
    losses = -(weight * q * _log_softmax(logits)).sum(axis=-1) * counted
    expected = losses.sum() / (weight[numpy.where(counted, targets, 0)] * counted).sum()
    out = F.cross_entropy(Tensor(logits), targets, weight=weight if weighted else None, label_smoothing=smoothing)
    numpy.testing.assert_allclose(out.item(), expected, rtol=1e-12)
    none = F.cross_entropy(Tensor(logits), targets, weight=weight if weighted else None, label_smoothing=smoothing,
                           reduction="none")
    numpy.testing.assert_allclose(none.numpy(), losses, rtol=1e-12, atol=1e-15)


@settings(max_examples=examples(25))
@given(ce_cases(), st.floats(0.0, 1.0), st.booleans(), st.sampled_from(["mean", "sum", "none"]))
def test_probability_targets_are_the_soft_target_formula(case, smoothing, weighted, reduction):
    logits, _, weight, q = case
    C = logits.shape[-1]
    w = weight if weighted else numpy.ones(C)
    losses = -(w * ((1 - smoothing) * q + smoothing / C) * _log_softmax(logits)).sum(axis=-1)
    expected = {"mean": losses.mean(), "sum": losses.sum(), "none": losses}[reduction]
    out = F.cross_entropy(Tensor(logits), q, weight=weight if weighted else None, label_smoothing=smoothing,
                          reduction=reduction)
    numpy.testing.assert_allclose(out.numpy(), expected, rtol=1e-12, atol=1e-15)


@settings(max_examples=examples(15))
@given(ce_cases())
def test_one_hot_probabilities_give_the_index_targets_loss_and_gradient(case):
    logits, targets, _, _ = case
    targets = numpy.where(targets == -100, 0, targets)
    by_index, by_probability = Tensor(logits, requires_grad=True), Tensor(logits, requires_grad=True)
    F.cross_entropy(by_index, targets).backward()
    F.cross_entropy(by_probability, numpy.eye(logits.shape[-1])[targets]).backward()
    numpy.testing.assert_allclose(by_probability.grad.numpy(), by_index.grad.numpy(), rtol=1e-10, atol=1e-15)


@settings(max_examples=examples(10))
@given(ce_cases(), st.floats(0.0, 1.0), st.sampled_from(["mean", "sum", "none"]))
def test_cross_entropy_options_gradients(case, smoothing, reduction):
    logits, targets, weight, q = case
    check_grad(lambda z: F.cross_entropy(z, targets, weight=weight, label_smoothing=smoothing, reduction=reduction),
               logits)
    check_grad(lambda z, p: F.cross_entropy(z, p, weight=weight, label_smoothing=smoothing, reduction=reduction),
               logits, q)  # the probabilities take a gradient too


@pytest.mark.parametrize("kwargs, targets, message", [
    (dict(label_smoothing=1.5), numpy.array([0, 1]), r"label_smoothing must be between 0.0 and 1.0. Got: 1.5"),
    (dict(weight=numpy.ones(2)), numpy.array([0, 1]), r"weight tensor should be defined either for all 3 classes"),
    (dict(ignore_index=1), numpy.full((2, 3), 1 / 3), r"ignore_index is not supported for floating point target"),
])
def test_bad_cross_entropy_options_are_pytorchs_errors(kwargs, targets, message):
    with pytest.raises(ValueError, match=message):
        F.cross_entropy(Tensor(numpy.ones((2, 3))), targets, **kwargs)


# -- GradScaler -----------------------------------------------------------------------------
def test_grad_scaler_scales_a_list_or_tuple_of_losses_in_a_container_of_the_same_type():
    w = Tensor(numpy.array([1.0, 2.0], dtype=numpy.float32), requires_grad=True)
    a, b, c = (w * 3.0).sum(), (w * w).sum(), w.sum()
    scaler = GradScaler(init_scale=8.0)
    scaled = scaler.scale([a, (b, c)])
    assert type(scaled) is list and type(scaled[1]) is tuple
    assert [scaled[0].item(), scaled[1][0].item(), scaled[1][1].item()] == [8 * a.item(), 8 * b.item(), 8 * c.item()]
    (scaled[0] + scaled[1][0] + scaled[1][1]).backward()
    numpy.testing.assert_array_equal(w.grad.numpy(), 8 * (3 + 2 * w.numpy() + 1))
    off = [a, b]
    assert GradScaler(enabled=False).scale(off) is off
    with pytest.raises(ValueError, match="outputs must be a Tensor or an iterable of Tensors"):
        scaler.scale([a, 2.0])


# -- PyTorch, where it is installed ---------------------------------------------------------
def _same_as_torch(ours, theirs, arrays, torch, rtol=1e-10):
    """Values and gradients of ours and PyTorch's on the same float64 arrays, for the same cotangent."""
    mine = [Tensor(a, requires_grad=True) for a in arrays]
    them = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, expected = ours(*mine), theirs(*them)
    cotangent = numpy.random.default_rng(0).standard_normal(out.shape)
    out.backward(Tensor(cotangent))
    expected.backward(torch.tensor(cotangent))
    numpy.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=rtol, atol=1e-12)
    for i, (a, b) in enumerate(zip(mine, them)):
        numpy.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=rtol, atol=1e-12, err_msg=f"input {i}")


@settings(max_examples=examples(20))
@given(pool_cases(), st.booleans(), st.sampled_from([None, 3]))
def test_pooling_options_match_pytorch(case, count_include_pad, divisor_override):
    torch = _torch()
    x, o = case
    out, indices = F.max_pool2d(Tensor(x), **o, return_indices=True)
    assume(numpy.isfinite(out.numpy()).all())  # a window of padding only (dilation) has no largest pixel to point at
    numpy.testing.assert_array_equal(indices.numpy(), torch.nn.functional.max_pool2d(
        torch.tensor(x), **o, return_indices=True)[1].numpy())
    _same_as_torch(lambda t: F.max_pool2d(t, **o), lambda t: torch.nn.functional.max_pool2d(t, **o), [x], torch)
    a = dict(o, count_include_pad=count_include_pad, divisor_override=divisor_override)
    del a["dilation"]
    _same_as_torch(lambda t: F.avg_pool2d(t, **a), lambda t: torch.nn.functional.avg_pool2d(t, **a), [x], torch)


@settings(max_examples=examples(15))
@given(padded_conv_cases())
def test_padding_mode_matches_pytorch(case):
    torch = _torch()
    x, o = case
    ours = nn.Conv2d(2, 3, **o, dtype=F64, rng=numpy.random.default_rng(0))
    theirs = torch.nn.Conv2d(2, 3, **o, dtype=torch.float64)
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(ours.weight.numpy()))
        theirs.bias.copy_(torch.tensor(ours.bias.numpy()))
    _same_as_torch(ours, theirs, [x], torch)


def test_batchnorm_options_match_pytorch():
    torch = _torch()
    rng = numpy.random.default_rng(2)
    for kwargs in (dict(track_running_stats=False), dict(momentum=None), dict(momentum=0.3)):
        ours, theirs = nn.BatchNorm2d(3, dtype=F64, **kwargs), torch.nn.BatchNorm2d(3, dtype=torch.float64, **kwargs)
        for training in (True, True, False, True):
            x = rng.standard_normal((4, 3, 2, 2)) * 2 + 1
            _same_as_torch(ours.train(training), theirs.train(training), [x], torch)
        assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]
        for name, b in ours.named_buffers():
            numpy.testing.assert_allclose(b.numpy(), getattr(theirs, name).numpy(), rtol=1e-12)
        ours.reset_running_stats(), theirs.reset_running_stats()
        for name, b in ours.named_buffers():
            numpy.testing.assert_array_equal(b.numpy(), getattr(theirs, name).numpy())


@settings(max_examples=examples(20))
@given(ce_cases(), st.floats(0.0, 1.0), st.booleans(), st.booleans(), st.sampled_from(["mean", "sum", "none"]))
def test_cross_entropy_options_match_pytorch(case, smoothing, weighted, probabilities, reduction):
    torch = _torch()
    logits, targets, weight, q = case
    kwargs = dict(label_smoothing=smoothing, reduction=reduction)
    ours_w, theirs_w = (weight, torch.tensor(weight)) if weighted else (None, None)

    def classes_second(t):  # PyTorch's class axis is 1; ours is the last
        return t.movedim(-1, 1) if t.ndim > 2 else t

    if probabilities:
        _same_as_torch(lambda z, p: F.cross_entropy(z, p, weight=ours_w, **kwargs),
                       lambda z, p: torch.nn.functional.cross_entropy(classes_second(z), classes_second(p),
                                                                      weight=theirs_w, **kwargs), [logits, q], torch)
    else:
        _same_as_torch(lambda z: F.cross_entropy(z, targets, weight=ours_w, **kwargs),
                       lambda z: torch.nn.functional.cross_entropy(classes_second(z), torch.tensor(targets),
                                                                   weight=theirs_w, **kwargs), [logits], torch)


def test_grad_scaler_of_a_tuple_matches_pytorch():
    torch = _torch()
    losses = (Tensor(numpy.float32(1.5)), [Tensor(numpy.float32(-2.0))])
    ours = GradScaler().scale(losses)
    theirs = torch.amp.GradScaler("cpu").scale((torch.tensor(1.5), [torch.tensor(-2.0)]))
    assert type(ours) is type(theirs) and type(ours[1]) is type(theirs[1])
    assert [ours[0].item(), ours[1][0].item()] == [theirs[0].item(), theirs[1][0].item()]
