"""Convolution, pooling and padding (ops/conv.py, ops/pool.py, movement.Pad) and their layers (nn/conv.py,
BatchNorm2d, Flatten).

Each op is checked by finite differences in float64 on hypothesis-drawn
shapes, strides, paddings, dilations and groups (always), against PyTorch's
values and gradients on the same draws (where PyTorch is installed), and on
device 'cuda' (the strict CuPy stand-in always, CuPy where there is a GPU).
"""

import math

import numpy
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, backend, memory, nn
from tinygrad_ckpt.checkpoint import checkpoint
from tinygrad_ckpt.ops import conv, flops
from tinygrad_ckpt.testing import strict_cupy

from .conftest import cupy_unavailable_reason, examples
from .helpers import TORCH_SKIP, check_grad

F64 = numpy.float64


def _torch():
    return pytest.importorskip("torch", reason=TORCH_SKIP)


def _values(rng, shape):
    return rng.uniform(-2, 2, size=shape)


# -- the cases: shapes that fit together, drawn -------------------------------------------
@st.composite
def conv_cases(draw):
    """(x, weight, bias or None, options): every option drawn, H and W at least the dilated kernel minus the padding."""
    groups, per_group_in, per_group_out = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    stride = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    H, W = (draw(st.integers(max(1, s - 2 * p), max(1, s - 2 * p) + 3)) for s, p in zip(spans, padding))
    N = draw(st.integers(1, 2))
    rng = numpy.random.default_rng(draw(st.integers(0, 2**16)))
    x = _values(rng, (N, groups * per_group_in, H, W))
    weight = _values(rng, (groups * per_group_out, per_group_in, *kernel))
    bias = _values(rng, (groups * per_group_out,)) if draw(st.booleans()) else None
    return x, weight, bias, dict(stride=stride, padding=padding, dilation=dilation, groups=groups)


@st.composite
def pool_cases(draw, dilation=True):
    """(x, options) for pooling: distinct values (no ties, so max pooling's gradient is defined), padding <= half the kernel."""
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    stride = draw(st.one_of(st.none(), st.tuples(st.integers(1, 3), st.integers(1, 3))))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2))) if dilation else (1, 1)
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dil)]
    padding = tuple(draw(st.integers(0, k // 2)) for k in kernel)
    H, W = (draw(st.integers(max(1, s - 2 * p), max(1, s - 2 * p) + 3)) for s, p in zip(spans, padding))
    N, C = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    x = numpy.random.default_rng(draw(st.integers(0, 2**16))).permutation(N * C * H * W).reshape(N, C, H, W) / 7.0
    options = dict(kernel_size=kernel, stride=stride, padding=padding)
    if dilation:
        options["dilation"] = dil
    return x, options


@st.composite
def pad_cases(draw):
    """(x, pad): 1 to 2 (before, after) pairs for the last axes, PyTorch's order."""
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    pairs = draw(st.integers(1, len(shape)))
    pad = tuple(draw(st.lists(st.integers(0, 2), min_size=2 * pairs, max_size=2 * pairs)))
    return numpy.random.default_rng(draw(st.integers(0, 2**16))).uniform(-2, 2, shape), pad


def _conv(x, w, b, options):
    return F.conv2d(x, w, b, **options)


# -- finite differences, always -----------------------------------------------------------
@settings(max_examples=examples(20))
@given(conv_cases())
def test_conv2d_gradients(case):
    x, weight, bias, options = case
    if bias is None:
        check_grad(lambda x, w: _conv(x, w, None, options), x, weight)
    else:
        check_grad(lambda x, w, b: _conv(x, w, b, options), x, weight, bias)


def _no_window_of_padding_only(x, options):
    """With dilation a window can miss the input and read padding only: its max is -inf there (PyTorch's too), no gradient."""
    assume(numpy.isfinite(F.max_pool2d(Tensor(x), **options).numpy()).all())


@given(pool_cases())
def test_max_pool2d_gradients(case):
    x, options = case
    _no_window_of_padding_only(x, options)
    check_grad(lambda t: F.max_pool2d(t, **options), x)


@given(pool_cases(dilation=False))
def test_avg_pool2d_gradients(case):
    x, options = case
    check_grad(lambda t: F.avg_pool2d(t, **options), x)


@given(pad_cases(), st.sampled_from([0.0, -1.5]))
def test_pad_gradients(case, value):
    x, pad = case
    check_grad(lambda t: F.pad(t, pad, value=value), x)


# -- against PyTorch, where installed: values and gradients in float64 -----------------------
def _ours_and_theirs(ours, theirs, arrays):
    """(values, gradients) of ours and of PyTorch's on the same float64 arrays, backpropagating the same cotangent."""
    torch = _torch()
    mine = [Tensor(a, requires_grad=True) for a in arrays]
    out = ours(*mine)
    cotangent = numpy.random.default_rng(0).standard_normal(out.shape)
    out.backward(Tensor(cotangent))
    them = [torch.tensor(a, requires_grad=True) for a in arrays]
    expected = theirs(torch, *them)
    expected.backward(torch.tensor(cotangent))
    numpy.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-10, atol=1e-12, equal_nan=True)
    for i, (a, b) in enumerate(zip(mine, them)):
        numpy.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=f"input {i}")


@given(conv_cases())
def test_conv2d_matches_pytorch(case):
    x, weight, bias, options = case
    arrays = [x, weight] + ([bias] if bias is not None else [])
    _ours_and_theirs(lambda *t: _conv(t[0], t[1], t[2] if len(t) > 2 else None, options),
                     lambda torch, *t: torch.nn.functional.conv2d(*t, **options), arrays)


@given(pool_cases())
def test_max_pool2d_matches_pytorch(case):
    x, options = case
    _no_window_of_padding_only(x, options)
    _ours_and_theirs(lambda t: F.max_pool2d(t, **options), lambda torch, t: torch.nn.functional.max_pool2d(t, **options), [x])


@given(pool_cases(dilation=False))
def test_avg_pool2d_matches_pytorch(case):
    x, options = case
    _ours_and_theirs(lambda t: F.avg_pool2d(t, **options), lambda torch, t: torch.nn.functional.avg_pool2d(t, **options), [x])


@given(pad_cases(), st.sampled_from([0.0, 2.5]))
def test_pad_matches_pytorch(case, value):
    x, pad = case
    _ours_and_theirs(lambda t: F.pad(t, pad, value=value), lambda torch, t: torch.nn.functional.pad(t, pad, value=value), [x])


@pytest.mark.filterwarnings("ignore:Using padding='same'")  # PyTorch's note that it copies the input too
@pytest.mark.parametrize("kernel,dilation", [((3, 3), 1), ((2, 3), 1), ((2, 4), (2, 1)), ((1, 1), 1)])
def test_conv2d_same_and_valid_padding_match_pytorch(kernel, dilation):
    rng = numpy.random.default_rng(8)
    x, w = rng.standard_normal((2, 2, 5, 6)), rng.standard_normal((3, 2, *kernel))
    for padding in ("same", "valid"):
        out = F.conv2d(Tensor(x), Tensor(w), padding=padding, dilation=dilation)
        if padding == "same":
            assert out.shape[2:] == x.shape[2:]
        _ours_and_theirs(lambda a, b: F.conv2d(a, b, padding=padding, dilation=dilation),
                         lambda torch, a, b: torch.nn.functional.conv2d(a, b, padding=padding, dilation=dilation), [x, w])
    with pytest.raises(ValueError, match="padding='same' is not supported for strided"):
        F.conv2d(Tensor(x), Tensor(w), padding="same", stride=2)


def test_max_pool2d_ties_and_nan_as_pytorch():
    # Ties: the first of the equal elements takes the gradient; a NaN is the largest and takes it.
    x = numpy.array([[[[1.0, 1.0, 0.0, 2.0], [1.0, 0.5, numpy.nan, 2.0]]]])
    _ours_and_theirs(lambda t: F.max_pool2d(t, 2), lambda torch, t: torch.nn.functional.max_pool2d(t, 2), [x])
    grad = Tensor(x, requires_grad=True)
    F.max_pool2d(grad, 2).sum().backward()
    numpy.testing.assert_array_equal(grad.grad.numpy(), [[[[1, 0, 0, 0], [0, 0, 1, 0]]]])  # the first 1; the NaN


# -- what conv saves, and the view ---------------------------------------------------------
def test_windows_is_a_view_with_the_window_values():
    x = numpy.arange(2 * 3 * 6 * 7, dtype=F64).reshape(2, 3, 6, 7)
    kernel, stride, dilation = (2, 3), (2, 1), (2, 2)
    out_size = conv.output_size("test", x.shape, kernel, stride, (0, 0), dilation)
    view = conv.windows(x, kernel, stride, dilation, out_size)
    assert numpy.shares_memory(view, x)  # no copy
    for n, c, i, j, oh, ow in numpy.ndindex(view.shape):  # the definition, element by element
        assert view[n, c, i, j, oh, ow] == x[n, c, oh * stride[0] + i * dilation[0], ow * stride[1] + j * dilation[1]]


def test_conv2d_and_pooling_of_a_view_with_other_strides():
    # The windows are made from the input's own strides: a transposed (non-contiguous) input works as its copy.
    rng = numpy.random.default_rng(9)
    x, w = rng.standard_normal((2, 3, 6, 5)), rng.standard_normal((4, 3, 2, 3))
    results = []
    for transposed in (True, False):
        xt = Tensor(x.transpose(0, 1, 3, 2).copy(), requires_grad=True)
        h = xt.transpose(2, 3) if transposed else Tensor(x)  # the same values, other strides
        if transposed:
            assert not h.data.flags["C_CONTIGUOUS"]
        wt = Tensor(w, requires_grad=True)
        out = F.conv2d(h, wt, stride=(2, 1), padding=(0, 1)) + F.max_pool2d(h, 2, 1)[:, :1, :3, :4].sum()
        out.sum().backward()
        results.append((out.numpy(), wt.grad.numpy()))
    for a, b in zip(*results):
        numpy.testing.assert_allclose(a, b, rtol=1e-12)


def test_conv2d_saves_only_its_input_and_weight():
    rng = numpy.random.default_rng(0)
    x = Tensor(rng.standard_normal((2, 4, 9, 9)), requires_grad=True)
    w = Tensor(rng.standard_normal((6, 4, 3, 3)), requires_grad=True)
    out = F.conv2d(x, w, padding=1)
    saved = out.grad_fn.ctx.saved_arrays
    assert len(saved) == 2 and saved[0] is x.data and saved[1] is w.data  # no im2col matrix, no padded copy
    pooled = F.max_pool2d(out, 2)
    (position,) = pooled.grad_fn.ctx.saved_arrays  # one integer per output element
    assert position.shape == pooled.shape and position.dtype.kind == "i"


def test_conv2d_and_max_pool2d_keep_no_temporary_alive():
    # memory.py's count: after conv's forward the only new memory is its output, and the activations
    # rise by its input's bytes (the weight is a parameter); max pooling keeps 8 bytes per output element.
    rng = numpy.random.default_rng(0)
    x = Tensor(rng.standard_normal((2, 4, 9, 9)).astype(numpy.float32), requires_grad=True)
    w = nn.Parameter(rng.standard_normal((6, 4, 3, 3)), dtype=numpy.float32)
    h = x * 2.0  # an op's output: kept only if the conv keeps it
    before = memory.current()
    out = F.conv2d(h, w, padding=1)
    after = memory.current()
    assert after["activations"] - before["activations"] == h.data.nbytes
    assert sum(after.values()) - sum(before.values()) == out.data.nbytes  # no im2col copy, no padded copy
    pooled = F.max_pool2d(out, 2)
    assert memory.current()["activations"] - after["activations"] == 8 * pooled.numel()


def test_conv2d_saves_what_each_gradient_needs():
    x, w = numpy.ones((1, 2, 4, 4)), numpy.ones((3, 2, 3, 3))
    frozen_weight = F.conv2d(Tensor(x, requires_grad=True), Tensor(w))
    assert frozen_weight.grad_fn.ctx.saved_arrays[0] is None  # dx needs the weight only
    frozen_input = F.conv2d(Tensor(x), Tensor(w, requires_grad=True))
    assert frozen_input.grad_fn.ctx.saved_arrays[1] is None  # dweight needs the input only


@pytest.mark.parametrize("needed", range(3))
def test_conv2d_backward_returns_none_exactly_for_inputs_that_need_no_gradient(needed):
    rng = numpy.random.default_rng(1)
    arrays = [rng.standard_normal((2, 4, 5, 5)), rng.standard_normal((6, 2, 3, 3)), rng.standard_normal(6)]
    inputs = [Tensor(a, requires_grad=i == needed) for i, a in enumerate(arrays)]
    out = F.conv2d(*inputs, stride=2, padding=1, groups=2)
    grads = out.grad_fn.op.backward(out.grad_fn.ctx, out.data * 0 + 1)
    assert [g is not None for g in grads] == [i == needed for i in range(3)]
    assert grads[needed].shape == arrays[needed].shape


def test_conv2d_flops_are_those_of_its_matrix_product():
    # The count from shapes equals the Linear over the im2col matrix: (N OH OW, K) rows times (Co, K).
    N, C, Co, k, OH, OW = 2, 3, 5, 3, 6, 4
    as_conv = flops.op_flops("Conv2d", [(N, C, 8, 6), (Co, C, k, k), (Co,)], [(N, Co, OH, OW)])
    as_linear = flops.op_flops("Linear", [(N * OH * OW, C * k * k), (Co, C * k * k), (Co,)], [(N * OH * OW, Co)])
    assert as_conv == as_linear


# -- bad input: errors that say what is wrong ---------------------------------------------
def test_conv2d_errors():
    x = Tensor(numpy.ones((2, 4, 5, 5)))
    with pytest.raises(ValueError, match=r"expected input\[2, 4, 5, 5\] to have 3 channels, but got 4"):
        F.conv2d(x, Tensor(numpy.ones((8, 3, 3, 3))))
    with pytest.raises(ValueError, match="kernel cannot be greater than the padded input"):
        F.conv2d(x, Tensor(numpy.ones((8, 4, 7, 3))))
    with pytest.raises(ValueError, match=r"\(dilated\) kernel size \(9 x 9\)"):
        F.conv2d(x, Tensor(numpy.ones((8, 4, 3, 3))), dilation=4, padding=1)
    with pytest.raises(ValueError, match="divisible by 3 at dimension 0"):
        F.conv2d(Tensor(numpy.ones((2, 6, 5, 5))), Tensor(numpy.ones((4, 2, 3, 3))), groups=3)
    with pytest.raises(ValueError, match=r"4-D input \(N, C, H, W\)"):
        F.conv2d(Tensor(numpy.ones((4, 5, 5))), Tensor(numpy.ones((8, 4, 3, 3))))
    with pytest.raises(ValueError, match="stride must be an int >= 1"):
        F.conv2d(x, Tensor(numpy.ones((8, 4, 3, 3))), stride=0)
    with pytest.raises(ValueError, match="bias of shape \\(3,\\) does not match 8 output channels"):
        F.conv2d(x, Tensor(numpy.ones((8, 4, 3, 3))), Tensor(numpy.ones(3)))


def test_pool_and_pad_errors():
    x = Tensor(numpy.ones((1, 1, 4, 4)))
    with pytest.raises(ValueError, match="padding should be at most half"):
        F.max_pool2d(x, 2, padding=2)
    with pytest.raises(ValueError, match="kernel cannot be greater than the padded input"):
        F.avg_pool2d(x, 5)
    with pytest.raises(ValueError, match="must be pairs"):
        F.pad(x, (1, 2, 3))
    with pytest.raises(ValueError, match="at most one for each"):
        F.pad(Tensor(numpy.ones(3)), (1, 1, 1, 1))
    with pytest.raises(ValueError, match="sizes >= 0"):
        F.pad(x, (1, -1))
    with pytest.raises(ValueError, match="mode must be 'constant', 'reflect', 'replicate' or 'circular'"):
        F.pad(x, (1, 1), mode="mirror")  # the other modes: tests/test_layer_options.py


# -- the layers ---------------------------------------------------------------------------
def test_conv2d_layer_has_pytorch_names_shapes_and_init_bounds():
    layer = nn.Conv2d(6, 8, (3, 2), groups=2, rng=numpy.random.default_rng(0))
    params = dict(layer.named_parameters())
    assert list(params) == ["weight", "bias"]
    assert params["weight"].shape == (8, 3, 3, 2) and params["bias"].shape == (8,)
    bound = 1 / math.sqrt(3 * 3 * 2)  # fan_in = in_channels / groups * kh * kw
    for p in params.values():
        values = p.numpy()
        assert numpy.abs(values).max() <= bound and numpy.abs(values).max() > bound / 2  # uniform in +-bound
    assert nn.Conv2d(2, 3, 1, bias=False).bias is None
    with pytest.raises(ValueError, match="divisible by groups"):
        nn.Conv2d(3, 4, 3, groups=2)


def test_conv2d_layer_matches_pytorch_with_the_same_parameters():
    torch = _torch()
    theirs = torch.nn.Conv2d(4, 6, 3, stride=2, padding=1, dilation=1, groups=2).double()
    ours = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2, dtype=F64)
    ours.load_state_dict({name: t.detach().numpy() for name, t in theirs.state_dict().items()})
    x = numpy.random.default_rng(1).standard_normal((2, 4, 7, 7))
    numpy.testing.assert_allclose(ours(Tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(), rtol=1e-12, atol=1e-12)
    assert torch.nn.MaxPool2d(2)(torch.tensor(x)).shape == nn.MaxPool2d(2)(Tensor(x)).shape
    numpy.testing.assert_allclose(nn.AvgPool2d(3, 2, 1)(Tensor(x)).numpy(),
                                  torch.nn.AvgPool2d(3, 2, 1)(torch.tensor(x)).numpy(), rtol=1e-12)


def test_flatten():
    x = numpy.arange(24.0).reshape(2, 3, 2, 2)
    assert nn.Flatten()(Tensor(x)).shape == (2, 12)
    assert nn.Flatten(0, 1)(Tensor(x)).shape == (6, 2, 2)
    check_grad(lambda t: nn.Flatten(1, 2)(t) * Tensor(numpy.arange(24.0).reshape(2, 6, 2)), x)


def test_batchnorm2d_matches_pytorch_in_training_and_evaluation():
    torch = _torch()
    x = numpy.random.default_rng(2).standard_normal((3, 4, 5, 2)) * 2 + 1
    ours, theirs = nn.BatchNorm2d(4, dtype=F64), torch.nn.BatchNorm2d(4).double()
    with torch.no_grad():
        theirs.weight += torch.arange(4, dtype=torch.float64)  # not all ones
    ours.load_state_dict({"weight": theirs.weight.detach().numpy(), "bias": theirs.bias.detach().numpy()}, strict=False)
    _ours_and_theirs(lambda t: ours(t), lambda torch, t: theirs(t), [x])
    for name in ("running_mean", "running_var"):
        numpy.testing.assert_allclose(getattr(ours, name).numpy(), getattr(theirs, name).numpy(), rtol=1e-12)
    ours.eval(), theirs.eval()
    _ours_and_theirs(lambda t: ours(t), lambda torch, t: theirs(t), [x])


def test_batchnorm2d_gradients_and_bad_input():
    x = numpy.random.default_rng(3).standard_normal((2, 3, 2, 2))
    check_grad(lambda t, w, b: _batchnorm_with(t, w, b), x, numpy.array([1.0, 2.0, -1.0]), numpy.array([0.5, 0.0, 1.0]))
    with pytest.raises(ValueError, match=r"BatchNorm2d\(3\) expects input \(N, 3, H, W\)"):
        nn.BatchNorm2d(3)(Tensor(numpy.ones((2, 3, 4), dtype=numpy.float32)))
    with pytest.raises(ValueError, match="more than one value per channel"):
        nn.BatchNorm2d(3)(Tensor(numpy.ones((1, 3, 1, 1), dtype=numpy.float32)))


def _batchnorm_with(x, weight, bias):
    bn = nn.BatchNorm2d(3, dtype=F64)
    bn.weight, bn.bias = weight, bias
    return bn(x)


def test_batchnorm2d_running_statistics_updated_once_under_checkpoint():
    x = Tensor(numpy.random.default_rng(4).standard_normal((4, 2, 3, 3)) * 3 + 1, requires_grad=True)

    def make():
        return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1, dtype=F64, rng=numpy.random.default_rng(5)),
                             nn.BatchNorm2d(3, dtype=F64), nn.ReLU())

    plain, checkpointed = make(), make()
    plain(x).sum().backward()
    checkpoint(checkpointed, x).sum().backward()
    for name in ("running_mean", "running_var"):
        numpy.testing.assert_allclose(getattr(checkpointed[1], name).numpy(), getattr(plain[1], name).numpy(), rtol=1e-12)
    assert not numpy.allclose(plain[1].running_mean.numpy(), 0.0)  # it did move, once
    for (name, a), (_, b) in zip(checkpointed.named_parameters(), plain.named_parameters()):
        numpy.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-12, err_msg=name)


# -- on device 'cuda': the strict stand-in (every NumPy call on a device array fails), CuPy where there is a GPU
@pytest.fixture(params=["strict", "cupy"])
def cuda(request):
    if request.param == "cupy" and cupy_unavailable_reason() is not None:
        pytest.skip(f"no GPU run here: {cupy_unavailable_reason()}")
    previous = backend.set_cuda_module(strict_cupy if request.param == "strict" else None)
    try:
        yield backend.module_for("cuda")
    finally:
        backend.set_cuda_module(previous)


def test_conv_pool_pad_and_batchnorm2d_run_on_the_device(cuda):
    rng = numpy.random.default_rng(6)
    x = rng.standard_normal((2, 4, 7, 6))
    model = nn.Sequential(
        nn.Conv2d(4, 6, 3, stride=(1, 2), padding=2, dilation=(2, 1), groups=2, dtype=F64, rng=numpy.random.default_rng(7)),
        nn.BatchNorm2d(6, dtype=F64), nn.ReLU(), nn.MaxPool2d(2, padding=1), nn.AvgPool2d((2, 1)), nn.Flatten())
    on_host = model(Tensor(x, requires_grad=True))
    (F.pad(on_host, (1, 2), value=0.5) ** 2).sum().backward()
    host_grads = [p.grad.numpy() for p in model.parameters()]
    model.zero_grad()
    model.to("cuda")
    strict_cupy.reset_transfers()
    xd = Tensor(x, requires_grad=True, device="cuda")
    out = model(xd)
    (F.pad(out, (1, 2), value=0.5) ** 2).sum().backward()
    if cuda is strict_cupy:
        assert strict_cupy.transfers["device_to_host"] == 0  # nothing came back to the host on its own
    numpy.testing.assert_allclose(out.numpy(), on_host.numpy(), rtol=1e-10, atol=1e-12)
    for p, expected in zip(model.parameters(), host_grads):
        numpy.testing.assert_allclose(p.grad.numpy(), expected, rtol=1e-10, atol=1e-12)
