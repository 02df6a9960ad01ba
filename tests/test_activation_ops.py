"""The activations (leaky_relu, relu6, hardswish, silu, softplus, mish, the exact GELU), erfc, and
cross_entropy(reduction='none').

Finite differences in float64 always; values and gradients against
PyTorch's at edge values (0, -0.0, +-inf, NaN, huge, tiny) where PyTorch is
installed, as tests/test_ops.py does for the other ops; erfc against
Python's math.erfc; each op on the strict CuPy stand-in.
(tests/test_activations.py is another subject: the analytic counts of
activation memory.)
"""

import math

import numpy
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, backend, nn
from tinygrad_ckpt.nn.transformer import GPT, GPTConfig
from tinygrad_ckpt.ops import special
from tinygrad_ckpt.testing import strict_cupy

from .helpers import TORCH_SKIP, check_grad
from .strategies import EDGES, arrays, edge_arrays, shapes
from .test_ops import _matches_pytorch

SCALAR = numpy.array(0.7)

# name: (ours, PyTorch's, where finite differences may not look: a kink's position or None)
ACTIVATIONS = {
    "leaky_relu": (lambda t: F.leaky_relu(t, 0.2), lambda torch, t: torch.nn.functional.leaky_relu(t, 0.2), [0.0]),
    "leaky_relu, slope above 1": (lambda t: F.leaky_relu(t, 1.5), lambda torch, t: torch.nn.functional.leaky_relu(t, 1.5), [0.0]),
    "relu6": (F.relu6, lambda torch, t: torch.nn.functional.relu6(t), [0.0, 6.0]),
    "hardswish": (F.hardswish, lambda torch, t: torch.nn.functional.hardswish(t), [-3.0, 3.0]),
    "silu": (F.silu, lambda torch, t: torch.nn.functional.silu(t), []),
    "mish": (F.mish, lambda torch, t: torch.nn.functional.mish(t), []),
    "softplus": (F.softplus, lambda torch, t: torch.nn.functional.softplus(t), [20.0]),
    "softplus, beta 2, threshold 3": (lambda t: F.softplus(t, beta=2.0, threshold=3.0),
                                      lambda torch, t: torch.nn.functional.softplus(t, beta=2.0, threshold=3.0), [1.5]),
    "gelu, exact": (lambda t: F.gelu(t, approximate="none"), lambda torch, t: torch.nn.functional.gelu(t), []),
}


def _away_from(kinks, x):
    """x with values within 0.05 of a kink moved 0.1 away: finite differences across a kink mean nothing."""
    for k in kinks:
        x = numpy.where(abs(x - k) < 0.05, k + 0.1, x)
    return x


@pytest.mark.parametrize("name", list(ACTIVATIONS))
@given(x=shapes.flatmap(lambda s: arrays(s, -7.0, 7.0)))
@example(x=SCALAR)
def test_activation_gradients(name, x):
    ours, _, kinks = ACTIVATIONS[name]
    check_grad(ours, _away_from(kinks, x))


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32])
@pytest.mark.parametrize("name", list(ACTIVATIONS))
@given(x=st.sampled_from([(), (4,), (2, 3)]).flatmap(edge_arrays))
@example(x=numpy.array(EDGES))
@example(x=numpy.array([0.0, 6.0, -3.0, 3.0, 20.0, 1.5, -40.0, 40.0, 710.0, -710.0]))  # the kinks, the far tails
def test_activations_at_edge_values_match_pytorch(name, dtype, x):
    torch = pytest.importorskip("torch", reason=TORCH_SKIP)
    if name in ("relu6", "hardswish"):
        # PyTorch's own kernels disagree on a NaN's gradient: its vectorised loop gives 0 (relu6) or NaN
        # (hardswish), its scalar loop for the elements left over gives g, as ours does everywhere.
        x = numpy.nan_to_num(x, nan=1.0, posinf=numpy.inf, neginf=-numpy.inf)
    if name == "gelu, exact" and dtype == numpy.float32:
        # PyTorch's float32 kernel overflows where the value is finite (x (1 + erf) / 2 at 3e38 is inf)
        # and gives NaN at inf: compare below float32's overflow only.
        x = numpy.where(abs(x) > 1e30, 2.0, x)
    ours, theirs, _ = ACTIVATIONS[name]
    _matches_pytorch(torch, ours, theirs, [x], dtype)


def test_erfc_is_float64_rounding_away_from_math_erfc():
    x = numpy.concatenate([numpy.linspace(-6, 27, 20001), [0.0, -0.0, 0.46875, -0.46875, 4.0, -4.0, 1e-300, 26.5]])
    expected = numpy.array([math.erfc(v) for v in x])
    ours = special.erfc(x)
    normal = expected > numpy.finfo(numpy.float64).tiny  # subnormal results have fewer digits to be right to
    ulps = abs(ours - expected)[normal] / numpy.spacing(expected[normal])
    assert ulps.max() <= 16, f"{ulps.max()} units in the last place at x = {x[normal][ulps.argmax()]}"
    edges = special.erfc(numpy.array([numpy.inf, -numpy.inf, numpy.nan]))
    assert edges[0] == 0.0 and edges[1] == 2.0 and numpy.isnan(edges[2])
    assert special.erfc(numpy.float32([0.3, -2.0])).dtype == numpy.float32  # the input's dtype


def test_exact_gelu_is_x_times_the_normal_cdf():
    x = numpy.linspace(-8, 8, 161)
    expected = numpy.array([v * 0.5 * math.erfc(-v / math.sqrt(2)) for v in x])
    # rtol: x / sqrt(2) is rounded, and erfc's relative change is 2 z^2 times its argument's (64 at x = -8)
    numpy.testing.assert_allclose(F.gelu(Tensor(x), approximate="none").numpy(), expected, rtol=5e-14, atol=1e-300)


def test_gelu_default_stays_the_tanh_form_and_the_gpt_uses_it_explicitly():
    x = Tensor(numpy.linspace(-3, 3, 13))
    numpy.testing.assert_array_equal(F.gelu(x).numpy(), F.gelu(x, approximate="tanh").numpy())
    assert not numpy.allclose(F.gelu(x).numpy(), F.gelu(x, approximate="none").numpy(), rtol=1e-6)  # they do differ
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        F.gelu(x, approximate="erf")
    gpt = GPT(GPTConfig(block_size=4, vocab_size=5, n_layer=1, n_head=1, n_embd=4), rng=numpy.random.default_rng(0))
    assert [m.approximate for m in gpt.modules() if isinstance(m, nn.GELU)] == ["tanh"]
    assert repr(nn.GELU()) == "GELU()" and repr(nn.GELU("none")) == "GELU(approximate='none')"


def test_modules_compute_their_functions():
    x = Tensor(numpy.linspace(-5, 8, 27))
    pairs = [(nn.LeakyReLU(0.3), F.leaky_relu(x, 0.3)), (nn.ReLU6(), F.relu6(x)), (nn.Hardswish(), F.hardswish(x)),
             (nn.SiLU(), F.silu(x)), (nn.Softplus(2.0, 5.0), F.softplus(x, 2.0, 5.0)), (nn.Mish(), F.mish(x)),
             (nn.GELU("none"), F.gelu(x, approximate="none"))]
    for module, expected in pairs:
        numpy.testing.assert_array_equal(module(x).numpy(), expected.numpy(), err_msg=type(module).__name__)
    # and each function is the formula it names
    v = x.numpy()
    sigmoid = 1 / (1 + numpy.exp(-v))
    numpy.testing.assert_allclose(F.silu(x).numpy(), v * sigmoid, rtol=1e-6)
    numpy.testing.assert_allclose(F.mish(x).numpy(), v * numpy.tanh(numpy.log1p(numpy.exp(v))), rtol=1e-6)
    numpy.testing.assert_allclose(F.relu6(x).numpy(), numpy.minimum(numpy.maximum(v, 0), 6))
    numpy.testing.assert_allclose(F.hardswish(x).numpy(), v * numpy.minimum(numpy.maximum(v + 3, 0), 6) / 6, rtol=1e-6)


def test_activations_save_one_array():
    # x, or a boolean mask for the piecewise-linear ones: never an intermediate beside it.
    x = Tensor(numpy.linspace(-2, 2, 8), requires_grad=True)
    for fn, dtype in [(F.leaky_relu, bool), (F.relu6, bool), (F.hardswish, x.dtype), (F.silu, x.dtype), (F.softplus, x.dtype),
                      (F.mish, x.dtype), (lambda t: F.gelu(t, approximate="none"), x.dtype)]:
        saved = fn(x).grad_fn.ctx.saved_arrays
        assert len(saved) == 1 and saved[0].shape == x.shape and saved[0].dtype == dtype


# -- cross_entropy(reduction='none') ------------------------------------------------------
@given(st.integers(1, 5), st.integers(2, 4), st.data())
def test_cross_entropy_none_gradients(n, classes, data):
    logits = data.draw(arrays((n, classes), -3, 3))
    targets = numpy.array(data.draw(st.lists(st.integers(0, classes - 1), min_size=n, max_size=n)))
    targets[numpy.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))] = -100
    weights = numpy.arange(1.0, n + 1)  # a different weight per row: each row's own gradient is checked
    check_grad(lambda z: (F.cross_entropy(z, targets, reduction="none") * Tensor(weights)).sum(), logits)


def test_cross_entropy_none_is_per_target_zero_where_ignored_and_sums_to_the_sum():
    rng = numpy.random.default_rng(0)
    logits, targets = rng.standard_normal((2, 3, 5)), numpy.array([[1, 4, -100], [0, -100, 2]])
    losses = F.cross_entropy(Tensor(logits), targets, reduction="none")
    assert losses.shape == (2, 3)
    assert losses.numpy()[0, 2] == 0.0 and losses.numpy()[1, 1] == 0.0
    logp = logits - numpy.log(numpy.exp(logits).sum(-1, keepdims=True))
    assert abs(losses.numpy()[1, 2] - -logp[1, 2, 2]) < 1e-12
    assert abs(losses.numpy().sum() - F.cross_entropy(Tensor(logits), targets, reduction="sum").item()) < 1e-12
    with pytest.raises(ValueError, match="reduction must be 'mean', 'sum' or 'none'"):
        F.cross_entropy(Tensor(logits), targets, reduction="max")


def test_cross_entropy_none_matches_pytorch():
    torch = pytest.importorskip("torch", reason=TORCH_SKIP)
    rng = numpy.random.default_rng(1)
    logits, targets = rng.standard_normal((6, 4)), rng.integers(0, 4, 6)
    targets[[1, 4]] = -100
    g = rng.standard_normal(6)
    ours = Tensor(logits, requires_grad=True)
    loss = F.cross_entropy(ours, targets, reduction="none")
    loss.backward(Tensor(g))
    theirs = torch.tensor(logits, requires_grad=True)
    expected = torch.nn.functional.cross_entropy(theirs, torch.tensor(targets), reduction="none")
    expected.backward(torch.tensor(g))
    numpy.testing.assert_allclose(loss.numpy(), expected.detach().numpy(), rtol=1e-12, atol=1e-15)
    numpy.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-10, atol=1e-15)


# -- on the strict stand-in: no NumPy call on a device array --------------------------------
def test_activations_run_on_the_strict_stand_in():
    previous = backend.set_cuda_module(strict_cupy)
    try:
        x = numpy.linspace(-5, 25, 31)
        for name, (ours, _, _) in ACTIVATIONS.items():
            host, device = Tensor(x, requires_grad=True), Tensor(x, requires_grad=True, device="cuda")
            ours(host).sum().backward()
            out = ours(device)
            out.sum().backward()
            numpy.testing.assert_allclose(out.numpy(), ours(Tensor(x)).numpy(), rtol=1e-12, err_msg=name)
            numpy.testing.assert_allclose(device.grad.numpy(), host.grad.numpy(), rtol=1e-12, err_msg=name)
        logits = Tensor(numpy.ones((3, 4)), requires_grad=True, device="cuda")
        F.cross_entropy(logits, numpy.array([0, -100, 3]), reduction="none").sum().backward()
        assert logits.grad.numpy()[1].tolist() == [0.0] * 4
    finally:
        backend.set_cuda_module(previous)
