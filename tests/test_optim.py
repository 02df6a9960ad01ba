"""optim: SGD and AdamW against hand-written NumPy formulas (and PyTorch when installed), clipping, resuming.

The expected trajectories are computed independently here, in float64, from
the textbook forms of the updates (AdamW with bias-corrected m_hat, v_hat),
not from the code under test; they agree to 1e-12 relative.
"""

import numpy
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import Tensor, memory
from tinygrad_ckpt.nn import Parameter
from tinygrad_ckpt.optim import SGD, AdamW, clip_grad_norm_, get_total_norm

from .helpers import TORCH_SKIP

TARGET = numpy.random.default_rng(1).standard_normal((3, 4))


def start():
    return numpy.random.default_rng(0).standard_normal((3, 4))


def grad_of(p):
    """The gradient of sum((p - TARGET)^2 * (1 + p^2)): depends on p, so trajectories diverge if an update is wrong."""
    return 2 * (p - TARGET) * (1 + p**2) + 2 * p * (p - TARGET) ** 2


def run(optimizer_class, steps, **kwargs):
    p = Parameter(start())
    opt = optimizer_class([p], **kwargs)
    trajectory = []
    for _ in range(steps):
        p.grad = Tensor(grad_of(p.numpy()))
        opt.step()
        trajectory.append(p.numpy().copy())
    return trajectory


def adamw_by_hand(steps, lr, betas, eps, weight_decay):
    b1, b2 = betas
    p, m, v, out = start(), 0.0, 0.0, []
    for t in range(1, steps + 1):
        g = grad_of(p)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        p = p - lr * weight_decay * p - lr * m_hat / (numpy.sqrt(v_hat) + eps)
        out.append(p)
    return out


def sgd_by_hand(steps, lr, momentum, weight_decay):
    p, buf, out = start(), 0.0, []
    for _ in range(steps):
        d = grad_of(p) + weight_decay * p
        buf = momentum * buf + d
        p = p - lr * (buf if momentum else d)
        out.append(p)
    return out


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_matches_hand_written_formula(weight_decay):
    kwargs = dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=weight_decay)
    for ours, expected in zip(run(AdamW, 4, **kwargs), adamw_by_hand(4, **kwargs)):
        numpy.testing.assert_allclose(ours, expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.9, 0.1)])
def test_sgd_matches_hand_written_formula(momentum, weight_decay):
    kwargs = dict(lr=0.01, momentum=momentum, weight_decay=weight_decay)
    for ours, expected in zip(run(SGD, 4, **kwargs), sgd_by_hand(4, **kwargs)):
        numpy.testing.assert_allclose(ours, expected, rtol=1e-12, atol=1e-14)


def test_against_torch():
    torch = pytest.importorskip("torch", reason=TORCH_SKIP)
    cases = [
        (AdamW, torch.optim.AdamW, dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)),
        (SGD, torch.optim.SGD, dict(lr=0.01, momentum=0.9, weight_decay=0.1)),
    ]
    for ours_class, torch_class, kwargs in cases:
        tp = torch.nn.Parameter(torch.tensor(start()))
        topt = torch_class([tp], **kwargs)
        for ours in run(ours_class, 5, **kwargs):
            tp.grad = torch.tensor(grad_of(tp.detach().numpy()))
            topt.step()
            numpy.testing.assert_allclose(ours, tp.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_step_keeps_float32_and_bumps_version():
    p = Parameter(numpy.ones(3, dtype=numpy.float32))
    opt = AdamW([p])
    p.grad = Tensor(numpy.ones(3, dtype=numpy.float32))
    version = p._version
    opt.step()
    assert p._version > version and p.dtype == numpy.float32 and opt.exp_avg[0].dtype == numpy.float32


@pytest.mark.parametrize("make", [lambda ps: SGD(ps, lr=0.1, momentum=0.9), lambda ps: AdamW(ps)])
def test_step_with_gradients_on_is_fine_and_a_backward_from_before_it_refuses(make):
    # The step changes parameters in place under no_grad (an in-place change of a
    # parameter is an error with gradients on); a loss computed before the step
    # saved the old weight, so its backward must refuse rather than mix the two.
    p = Parameter(numpy.ones((2, 2)))
    opt = make([p])
    (p * p).sum().backward()
    stale = (p * p).sum()  # Mul saves p
    opt.step()
    assert tg.is_grad_enabled()
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation: \[float64 tensor of shape \(2, 2\)\], "
                                           r"which is input 0 of Mul"):
        stale.backward()


def test_state_is_counted_as_optimizer_memory():
    before = memory.current()["optimizer"]
    params = [Parameter(numpy.ones((10, 10), dtype=numpy.float32)), Parameter(numpy.ones(7, dtype=numpy.float32))]
    opt = AdamW(params)
    assert memory.current()["optimizer"] - before == 2 * (100 + 7) * 4
    del opt


def test_lr_can_be_changed_between_steps():
    a, b = Parameter(start()), Parameter(start())
    opt_a, opt_b = AdamW([a], lr=0.1), AdamW([b], lr=0.1)
    for lr in (0.1, 0.02, 0.3):
        opt_b.lr = lr
        for p, opt in ((a, opt_a), (b, opt_b)):
            p.grad = Tensor(grad_of(p.numpy()))
            opt.step()
    assert not numpy.allclose(a.numpy(), b.numpy())
    c = Parameter(start())
    opt_c = AdamW([c], lr=0.1)
    for lr in (0.1, 0.02, 0.3):
        opt_c.lr = lr
        c.grad = Tensor(grad_of(c.numpy()))
        opt_c.step()
    assert numpy.array_equal(b.numpy(), c.numpy())


def test_parameters_without_grad_are_skipped():
    p, q = Parameter(start()), Parameter(start())
    opt = AdamW([p, q], weight_decay=0.1)
    p.grad = Tensor(grad_of(p.numpy()))
    opt.step()
    assert numpy.array_equal(q.numpy(), start()) and not numpy.array_equal(p.numpy(), start())
    assert opt.steps == [1, 0]


@pytest.mark.parametrize("optimizer_class,kwargs", [(AdamW, dict(lr=0.05)), (SGD, dict(lr=0.01, momentum=0.9))])
def test_resume_from_state_dict_continues_identically(optimizer_class, kwargs):
    p = Parameter(start())
    opt = optimizer_class([p], **kwargs)
    for _ in range(3):
        p.grad = Tensor(grad_of(p.numpy()))
        opt.step()
    saved_p, saved = p.numpy().copy(), opt.state_dict()
    for _ in range(2):
        p.grad = Tensor(grad_of(p.numpy()))
        opt.step()

    q = Parameter(saved_p)
    resumed = optimizer_class([q], **{**kwargs, "lr": 123.0})  # the lr comes back from the state
    resumed.load_state_dict(saved)
    for _ in range(2):
        q.grad = Tensor(grad_of(q.numpy()))
        resumed.step()
    assert resumed.lr == kwargs["lr"]
    assert numpy.array_equal(p.numpy(), q.numpy())


def test_load_state_dict_rejects_a_different_optimizer():
    p = Parameter(start())
    with pytest.raises(ValueError, match="cannot load a SGD state into AdamW"):
        AdamW([p]).load_state_dict(SGD([p], lr=0.1).state_dict())
    with pytest.raises(ValueError, match="does not fit"):
        AdamW([p]).load_state_dict(AdamW([p, Parameter(start())]).state_dict())


def test_zero_grad():
    p = Parameter(start())
    opt = SGD([p], lr=0.1)
    p.grad = Tensor(numpy.ones((3, 4)))
    opt.zero_grad(set_to_none=False)
    assert not p.grad.numpy().any()
    opt.zero_grad()
    assert p.grad is None


def test_bad_arguments():
    with pytest.raises(ValueError, match="empty parameter list"):
        SGD([], lr=0.1)
    with pytest.raises(ValueError, match="does not require grad"):
        SGD([Tensor(numpy.ones(2))], lr=0.1)
    with pytest.raises(ValueError, match="learning rate must be >= 0"):
        AdamW([Parameter(start())], lr=-1)


def test_shared_parameter_is_updated_once():
    p = Parameter(start())
    opt = SGD([p, p], lr=0.1)
    assert len(opt.params) == 1


# -- clip_grad_norm_ ---------------------------------------------------------------
def make_grads(scale):
    rng = numpy.random.default_rng(3)
    params = [Parameter(rng.standard_normal(s)) for s in ((3, 4), (5,))]
    for p in params:
        p.grad = Tensor(rng.standard_normal(p.shape) * scale)
    return params


def test_clip_grad_norm_scales_to_max_norm():
    params = make_grads(10.0)
    before = [p.grad.numpy().copy() for p in params]
    expected = numpy.sqrt(sum((g**2).sum() for g in before))
    norm = clip_grad_norm_(params, max_norm=1.0)
    assert isinstance(norm, float) and numpy.isclose(norm, expected, rtol=1e-12)
    after = numpy.sqrt(sum((p.grad.numpy() ** 2).sum() for p in params))
    assert numpy.isclose(after, 1.0, rtol=1e-5)
    for b, p in zip(before, params):  # one common factor: directions unchanged
        numpy.testing.assert_allclose(p.grad.numpy(), b * (1.0 / (expected + 1e-6)), rtol=1e-12)


def test_clip_grad_norm_leaves_small_gradients_alone():
    params = make_grads(0.01)
    before = [p.grad.numpy().copy() for p in params]
    clip_grad_norm_(params, max_norm=1.0)
    for b, p in zip(before, params):
        assert numpy.array_equal(b, p.grad.numpy())


def test_clip_grad_norm_without_grads():
    assert clip_grad_norm_([Parameter(start())], 1.0) == 0.0


@pytest.mark.parametrize("bad", [numpy.nan, numpy.inf])
def test_clip_grad_norm_returns_a_non_finite_norm_and_scales_by_it_as_pytorch(bad):
    params = make_grads(1.0)
    grad = params[0].grad.numpy().copy()
    grad[1, 2] = bad
    params[0].grad = Tensor(grad)
    norm = clip_grad_norm_(params, max_norm=1.0)
    assert numpy.isnan(norm) if numpy.isnan(bad) else norm == numpy.inf
    # as torch.nn.utils.clip_grad_norm_(error_if_nonfinite=False): grad *= min(1 / (norm + 1e-6), 1)
    with numpy.errstate(invalid="ignore"):  # inf * 0
        expected = [g * (numpy.nan if numpy.isnan(bad) else 0.0) for g in (grad, make_grads(1.0)[1].grad.numpy())]
    for p, want in zip(params, expected):
        numpy.testing.assert_array_equal(p.grad.numpy(), want)


def test_clip_grad_norm_error_if_nonfinite_raises_pytorchs_error_and_leaves_the_gradients():
    params = make_grads(1.0)
    grad = params[1].grad.numpy().copy()
    grad[0] = numpy.inf
    params[1].grad = Tensor(grad)
    before = [p.grad.numpy().copy() for p in params]
    with pytest.raises(RuntimeError, match=r"The total norm of order 2.0 for gradients from `parameters` is "
                                           r"non-finite, so it cannot be clipped.*error_if_nonfinite=False"):
        clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    for b, p in zip(before, params):
        numpy.testing.assert_array_equal(p.grad.numpy(), b)
    assert clip_grad_norm_(make_grads(10.0), 1.0, error_if_nonfinite=True) > 1.0  # finite: as usual


def test_get_total_norm():
    params = make_grads(3.0)
    grads = [p.grad for p in params]
    expected = numpy.sqrt(sum((g.numpy() ** 2).sum() for g in grads))
    assert get_total_norm(grads) == pytest.approx(expected, rel=1e-12) and get_total_norm([]) == 0.0
    assert numpy.isnan(get_total_norm([Tensor(numpy.array([1.0, numpy.nan]))]))


@pytest.mark.backends("numpy")
def test_clip_grad_norm_against_torch_with_non_finite_gradients():
    torch = pytest.importorskip("torch", reason=TORCH_SKIP)
    for bad in (numpy.nan, numpy.inf, 5.0):
        params = make_grads(2.0)
        grad = params[0].grad.numpy().copy()
        grad[0, 0] = bad
        params[0].grad = Tensor(grad)
        tparams = [torch.nn.Parameter(torch.tensor(p.numpy())) for p in params]
        for tp, p in zip(tparams, params):
            tp.grad = torch.tensor(p.grad.numpy())
        ours = clip_grad_norm_(params, 1.0)
        theirs = torch.nn.utils.clip_grad_norm_(tparams, 1.0, error_if_nonfinite=False)
        numpy.testing.assert_allclose(ours, theirs.item(), rtol=1e-12)
        for p, tp in zip(params, tparams):
            numpy.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-12)
