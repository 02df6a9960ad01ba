"""What the tutorials say other libraries do, shown on the library itself; and this engine's side.

Tutorial 5's last section compares this engine's checkpointing with
PyTorch's `torch.utils.checkpoint` (the text names torch 2.13.0, the version
these tests were written against); tutorials 1 and 8 and the docstrings of
ops/nn.py and ops/elementwise.py say what PyTorch's anomaly mode,
DistributedDataParallel, layer norm and GELU do. Each claim about PyTorch is a test here that
runs PyTorch and skips, saying so, where it is not installed; each place
where the text says this engine differs has a test of this engine's side,
which needs nothing but the package. Also here: what autocast.py's
docstring says NumPy and ml_dtypes do with 16-bit sums, and what the README
and tutorial 12 say accumulation gives (the whole batch's gradients up to
rounding, and only without dropout).
"""

import functools
import warnings

import numpy
import pytest

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, nn
from tinygrad_ckpt.checkpoint import checkpoint, checkpoint_sequential

from .helpers import TORCH_SKIP

TORCH_DESCRIBED = "2.13"  # the version the tutorials' text describes


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason=TORCH_SKIP)


def torch_checkpoint(torch):
    from torch.utils.checkpoint import checkpoint as ckpt

    return ckpt


class CallCounter:
    """Wraps a layer; counts how often its forward runs (forward and recomputes alike)."""

    def __init__(self, layer):
        self.layer, self.calls = layer, 0

    def __call__(self, x):
        self.calls += 1
        return self.layer(x)


# -- parameters inside a segment whose input needs no gradient ---------------------
def test_torch_reentrant_checkpoint_gives_parameters_no_gradient_when_no_input_requires_grad(torch):
    ckpt = torch_checkpoint(torch)
    layer = torch.nn.Linear(4, 3)
    batch = torch.randn(5, 4)  # data: requires no gradient
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        out = ckpt(layer, batch, use_reentrant=True)
    assert not out.requires_grad  # nothing to backpropagate: the weight gets no gradient
    assert layer.weight.grad is None
    out = ckpt(layer, batch, use_reentrant=False)
    out.sum().backward()
    assert layer.weight.grad is not None


def test_ours_gives_parameters_their_gradient_when_no_input_requires_grad():
    layer = nn.Linear(4, 3, dtype=numpy.float64, rng=numpy.random.default_rng(0))
    batch = Tensor(numpy.random.default_rng(1).standard_normal((5, 4)))
    checkpoint(layer, batch).sum().backward()
    layer_plain = nn.Linear(4, 3, dtype=numpy.float64, rng=numpy.random.default_rng(0))
    layer_plain(batch).sum().backward()
    numpy.testing.assert_array_equal(layer.weight.grad.numpy(), layer_plain.weight.grad.numpy())


# -- what only the non-reentrant implementation supports ----------------------------
def test_torch_reentrant_checkpoint_refuses_keyword_arguments_and_autograd_grad(torch):
    ckpt = torch_checkpoint(torch)
    x = torch.randn(3, requires_grad=True)

    def scaled(x, scale=1.0):
        return x * scale

    with pytest.raises(ValueError, match="Unexpected keyword arguments: scale"):
        ckpt(scaled, x, scale=2.0, use_reentrant=True)
    out = ckpt(torch.sin, x, use_reentrant=True)
    with pytest.raises(RuntimeError, match=r"use_reentrant=True.*incompatible with \.grad\(\)"):
        torch.autograd.grad(out.sum(), x)
    # The non-reentrant implementation does both.
    assert torch.equal(ckpt(scaled, x, scale=2.0, use_reentrant=False), x * 2.0)
    (grad,) = torch.autograd.grad(ckpt(torch.sin, x, use_reentrant=False).sum(), x)
    assert torch.allclose(grad, torch.cos(x))


def test_torch_non_reentrant_checkpoint_stops_the_recompute_early(torch):
    """early_stop: the recompute ends once every saved tensor is rebuilt; the rest never runs."""
    ckpt = torch_checkpoint(torch)
    for early_stop, runs_of_tail in ((True, 1), (False, 2)):
        calls = []

        def segment(x):
            y = x.exp()  # saves its output: the last thing backward needs
            calls.append("tail")  # runs after it: skipped in an early-stopped recompute
            return y + 1

        ckpt(segment, torch.randn(3, requires_grad=True), use_reentrant=False, early_stop=early_stop).sum().backward()
        assert calls == ["tail"] * runs_of_tail


def test_torch_early_stop_skips_the_last_op_of_a_block(torch):
    """Linear, GELU, Linear, GELU: the recompute runs addmm, gelu, addmm; the last GELU saves its
    input before it runs, which is where the recompute stops (tutorial 5: ours does the same)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpsRun(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    ckpt = torch_checkpoint(torch)
    block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU(), torch.nn.Linear(4, 4), torch.nn.GELU())
    forwards = {"aten.addmm.default", "aten.gelu.default"}
    for early_stop, expected in ((True, ["addmm", "gelu", "addmm"]), (False, ["addmm", "gelu", "addmm", "gelu"])):
        out = ckpt(block, torch.randn(2, 4, requires_grad=True), use_reentrant=False, early_stop=early_stop).sum()
        with OpsRun() as ops:
            out.backward()
        assert [n.split(".")[1] for n in ops.names if n in forwards] == expected


def test_ours_recompute_of_the_same_block_runs_the_same_ops():
    from tinygrad_ckpt import memory

    rng = numpy.random.default_rng(0)
    block = nn.Sequential(nn.Linear(4, 4, rng=rng), nn.GELU(), nn.Linear(4, 4, rng=rng), nn.GELU())
    for early_stop, expected in ((True, ["Linear", "GELU", "Linear"]), (False, ["Linear", "GELU", "Linear", "GELU"])):
        out = checkpoint(block, Tensor(rng.standard_normal((2, 4), dtype=numpy.float32), requires_grad=True),
                         early_stop=early_stop).sum()
        with memory.timeline() as events:
            out.backward()
        assert [e["op"] for e in events if e["phase"] == "recompute" and "output_shapes" in e] == expected


def test_torch_default_determinism_check_misses_another_path_to_same_shaped_saved_tensors(torch):
    """exp in the forward (saves its output), sin in the recompute (saves its input): same shapes,
    so torch 2.13's default check passes, and the gradient is sin's rule on exp's record: wrong."""
    ckpt = torch_checkpoint(torch)
    x = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64, requires_grad=True)
    calls = []

    def segment(t):
        calls.append(1)
        return t.exp() if len(calls) == 1 else t.sin()

    ckpt(segment, x, use_reentrant=False).sum().backward()  # no error
    assert not torch.allclose(x.grad, torch.exp(x.detach()))  # the right gradient of exp is exp
    assert torch.allclose(x.grad, x.detach())  # exp's backward, grad * output, fed sin's saved input


def test_ours_names_the_two_ops_when_the_recompute_takes_another_path():
    from tinygrad_ckpt.checkpoint import CheckpointError

    x = Tensor(numpy.array([0.5, 1.0, 2.0]), requires_grad=True)
    calls = []

    def segment(t):
        calls.append(1)
        return t.exp() if len(calls) == 1 else t.tanh()  # tanh: this engine has no sin

    y = checkpoint(segment, x)
    with pytest.raises(CheckpointError, match="ran Tanh as op #0, where its forward ran Exp"):
        y.sum().backward()


def test_ours_accepts_use_reentrant_false_and_explains_true():
    x = Tensor(numpy.ones(3), requires_grad=True)
    checkpoint(lambda t: t.exp(), x, use_reentrant=False).sum().backward()
    numpy.testing.assert_allclose(x.grad.numpy(), numpy.exp(numpy.ones(3)))
    with pytest.raises(ValueError, match="This engine's checkpoint is the non-reentrant kind"):
        checkpoint(lambda t: t.exp(), x, use_reentrant=True)


def test_torch_default_is_reentrant_with_a_warning(torch):
    if not torch.__version__.startswith(TORCH_DESCRIBED):
        pytest.skip(f"the text describes torch {TORCH_DESCRIBED}'s default; torch {torch.__version__} is installed")
    ckpt = torch_checkpoint(torch)
    layer = torch.nn.Linear(4, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = ckpt(layer, torch.randn(5, 4))  # use_reentrant not passed
    assert any("use_reentrant parameter should be passed explicitly" in str(w.message) for w in caught)
    assert not out.requires_grad  # the reentrant behaviour, as in the first test


# -- selective checkpointing: PyTorch's counterpart of a policy ---------------------
def test_torch_selective_checkpoint_context_keeps_the_named_op(torch):
    from torch.utils._python_dispatch import TorchDispatchMode  # sees every op that actually runs

    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    class OpsRun(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    ckpt = torch_checkpoint(torch)
    keep_exp = functools.partial(create_selective_checkpoint_contexts, [torch.ops.aten.exp.default])
    recomputed_exp = {}
    for name, options in (("full recompute", {}), ("exp kept", {"context_fn": keep_exp})):
        x = torch.randn(5, requires_grad=True)
        out = ckpt(lambda x: x.exp().sigmoid(), x, use_reentrant=False, **options)
        with OpsRun() as ops:
            out.sum().backward()
        recomputed_exp[name] = ops.names.count("aten.exp.default")
    assert recomputed_exp == {"full recompute": 1, "exp kept": 0}
    with pytest.raises(ValueError, match="only supported when use_reentrant=False"):
        ckpt(torch.sin, torch.randn(3, requires_grad=True), use_reentrant=True, context_fn=keep_exp)


# -- BatchNorm's running statistics under checkpoint --------------------------------
def test_torch_updates_batchnorm_running_statistics_twice_under_checkpoint(torch):
    ckpt = torch_checkpoint(torch)
    x = torch.randn(8, 4)
    for use_reentrant in (True, False):
        plain, checkpointed = torch.nn.BatchNorm1d(4), torch.nn.BatchNorm1d(4)
        plain(x.clone().requires_grad_()).sum().backward()
        ckpt(checkpointed, x.clone().requires_grad_(), use_reentrant=use_reentrant).sum().backward()
        assert plain.num_batches_tracked.item() == 1
        assert checkpointed.num_batches_tracked.item() == 2  # the forward, then the recompute
        twice = torch.nn.BatchNorm1d(4)
        twice(x), twice(x)  # two plain updates with the same batch
        assert torch.allclose(checkpointed.running_mean, twice.running_mean)
        assert not torch.allclose(checkpointed.running_mean, plain.running_mean)


def test_ours_updates_batchnorm_running_statistics_once_under_checkpoint():
    x = Tensor(numpy.random.default_rng(0).standard_normal((8, 4)) * 3 + 1, requires_grad=True)
    plain, checkpointed = nn.BatchNorm1d(4, dtype=numpy.float64), nn.BatchNorm1d(4, dtype=numpy.float64)
    plain(x).sum().backward()
    checkpoint(checkpointed, x).sum().backward()
    for name in ("running_mean", "running_var"):
        numpy.testing.assert_allclose(getattr(checkpointed, name).numpy(), getattr(plain, name).numpy(), rtol=1e-12)
    assert not numpy.allclose(plain.running_mean.numpy(), 0.0)  # it did move, once


# -- checkpoint_sequential: the last segment ----------------------------------------
def test_torch_checkpoint_sequential_runs_its_last_segment_without_checkpoint(torch):
    from torch.utils.checkpoint import checkpoint_sequential as torch_checkpoint_sequential

    layers = [CallCounter(torch.nn.Linear(3, 3)) for _ in range(4)]
    out = torch_checkpoint_sequential(layers, 2, torch.randn(2, 3, requires_grad=True), use_reentrant=False)
    out.sum().backward()
    assert [layer.calls for layer in layers] == [2, 2, 1, 1]  # segment [0:2] recomputed, [2:4] not


def test_ours_checkpoints_every_segment_including_the_last():
    init = numpy.random.default_rng(0)
    layers = [CallCounter(nn.Linear(3, 3, dtype=numpy.float64, rng=init)) for _ in range(4)]
    x = Tensor(numpy.random.default_rng(1).standard_normal((2, 3)), requires_grad=True)
    F.mse_loss(checkpoint_sequential(layers, 2, x), Tensor(numpy.zeros((2, 3)))).backward()
    assert [layer.calls for layer in layers] == [2, 2, 2, 2]


# -- the caching allocator, as allocator.py and benchmarks/README.md quote it ------------------------
def test_torch_describes_reserved_memory_and_empty_cache_as_quoted(torch):
    """The two phrases benchmarks/README.md and allocator.py quote from torch/cuda/memory.py (no GPU needed: docstrings)."""
    def words(text):
        return " ".join(text.replace("`", "").split())

    assert "the current GPU memory managed by the caching allocator" in words(torch.cuda.memory_reserved.__doc__)
    assert "all unoccupied cached memory currently held by the caching allocator" in words(
        torch.cuda.empty_cache.__doc__)


# -- GELU's backward: no scratch arrays in PyTorch's kernel (ops/elementwise.py) -------
def test_torch_gelu_backward_allocates_its_result_only(torch):
    from torch.profiler import ProfilerActivity, profile

    x, g = torch.randn(1 << 16), torch.randn(1 << 16)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        torch.ops.aten.gelu_backward(g, x, approximate="tanh")
    (event,) = [e for e in prof.key_averages() if e.key == "aten::gelu_backward"]
    assert event.self_cpu_memory_usage == x.numel() * x.element_size()  # dx, and nothing besides


# -- what layer norm saves for backward (ops/nn.py) ---------------------------------------
def test_torch_layer_norm_saves_input_weight_bias_mean_and_rstd(torch):
    layer, x = torch.nn.LayerNorm(4), torch.randn(8, 4, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    named = {"x": x, "weight": layer.weight, "bias": layer.bias}
    assert {name for name, t in named.items() if any(s is t for s in saved)} == {"x", "weight", "bias"}
    assert sorted(tuple(s.shape) for s in saved if all(s is not t for t in named.values())) == [(8, 1), (8, 1)]


# -- anomaly mode: what PyTorch's checks (tutorial 1) -----------------------------------
def test_torch_detect_anomaly_checks_backward_results_for_nan_only(torch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Anomaly Detection has been enabled", and the forward's traceback
        with torch.autograd.detect_anomaly():
            made_nan = torch.log(torch.tensor([-1.0], requires_grad=True))  # NaN in the forward: no error
            assert made_nan.isnan().all()
            x = torch.tensor([0.0], requires_grad=True)
            x.reciprocal().sum().backward()  # an infinite gradient: no error either
            assert x.grad.isinf().all()
            with pytest.raises(RuntimeError, match="'SqrtBackward0' returned nan values"):
                torch.sqrt(torch.tensor([-1.0], requires_grad=True)).sum().backward()


# -- DistributedDataParallel, as tutorial 8 describes it ----------------------------------
def test_torch_ddp_buckets_25_mib_and_no_sync_defers_the_all_reduce(torch):
    from torch.nn.parallel import distributed

    assert distributed._DEFAULT_BUCKET_CAP_MB == 25  # torch/nn/parallel/distributed.py
    assert "disable gradient synchronizations" in distributed.DistributedDataParallel.no_sync.__doc__
    assert "gradients between different nodes are averaged" in " ".join(
        distributed.DistributedDataParallel.__doc__.split())


# -- what the autocast docstring says NumPy and ml_dtypes do with 16-bit sums --------------------
def test_ml_dtypes_bfloat16_adds_in_bfloat16():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes (the bf16 extra) is not installed")
    ones = numpy.ones(10_000, ml_dtypes.bfloat16)
    assert float(ones.sum()) == 256  # 256 + 1 rounds back to 256 in 8 bits
    assert abs(float(ones.mean()) - 0.0256) < 1e-3


def test_numpy_float16_sum_depends_on_the_layout_and_its_mean_accumulates_in_float32():
    column = numpy.ones((10_000, 4), numpy.float16)  # summed down axis 0: a strided reduction
    assert float(column.sum(axis=0)[0]) == 2048  # 2048 + 1 rounds back to 2048 in float16
    assert float(numpy.ones(10_000, numpy.float16).sum()) == 10_000  # contiguous: pairwise, in float32
    assert float(column.mean(axis=0)[0]) == 1.0  # NumPy's mean of float16 accumulates in float32


def test_ours_mean_under_autocast_runs_in_float32():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes (the bf16 extra) is not installed")
    from tinygrad_ckpt.autocast import autocast

    x = Tensor(numpy.ones(10_000, ml_dtypes.bfloat16))
    with autocast("bfloat16"):
        assert float(x.mean().numpy()) == 1.0  # in bfloat16 it would be 0.0256


# -- accumulation gives the whole batch's gradients up to rounding, and only without dropout ------
def _gpt_gradients(dropout, splits):
    from tinygrad_ckpt import random

    rng = numpy.random.default_rng(0)
    idx = rng.integers(0, 16, (8, 12))
    config = nn.GPTConfig(block_size=12, vocab_size=16, n_layer=2, n_head=2, n_embd=16, dropout=dropout)
    model = nn.GPT(config, rng=numpy.random.default_rng(1))
    random.manual_seed(2)  # dropout's masks: the same stream for both runs
    for part in numpy.array_split(numpy.arange(8), splits):
        logits, _ = model(idx[part])
        F.cross_entropy(logits, idx[part], reduction="sum").backward()
    return [p.grad.numpy().astype(numpy.float64) for p in model.parameters()]


def test_accumulated_micro_batches_give_the_whole_batch_up_to_rounding_without_dropout():
    whole, micro = _gpt_gradients(0.0, 1), _gpt_gradients(0.0, 4)
    assert len(whole) == len(micro) > 0
    for a, b in zip(whole, micro):
        numpy.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)  # float32 sums in another order


def test_with_dropout_accumulated_micro_batches_draw_other_masks():
    whole, micro = _gpt_gradients(0.1, 1), _gpt_gradients(0.1, 4)
    largest = max(numpy.abs(a).max() for a in whole)
    assert max(numpy.abs(a - b).max() for a, b in zip(whole, micro)) > 1e-3 * largest  # far beyond rounding
