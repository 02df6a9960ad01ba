"""Device 'cuda' gives the CPU's gradients, moves nothing to the host, and counts memory as the device does.

Every test runs twice, once per meaning of 'cuda':
  [strict]  the CPU stand-in for CuPy (tinygrad_ckpt/testing/strict_cupy.py): always
            runs, and proves a training step makes no device-to-host transfer
            (its transfer counter stays at zero until we read the gradients);
  [cupy]    real CuPy on a GPU: runs where one is present (benchmarks/gpu_check.sh
            runs it on a GPU machine), skipped otherwise with the reason.

The reference is the same model on the CPU (NumPy), without checkpointing.
Tolerance: float64 everywhere. The GPU adds in another order (cuBLAS,
its reductions), so results differ by rounding only: about 1e-16 relative
per operation, a few orders more through a small network. rtol 1e-9 and
atol 1e-12 leave that margin and still catch any wrong gradient (those are
off by O(1)). On the stand-in the arithmetic is NumPy's, so they are equal.
"""

import gc

import numpy
import pytest

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, backend, memory, nn
from tinygrad_ckpt.testing import strict_cupy
from tinygrad_ckpt.checkpoint import checkpoint

from .conftest import cupy_unavailable_reason

RTOL, ATOL = 1e-9, 1e-12


@pytest.fixture(params=["strict", "cupy"], scope="module")
def cuda(request):
    """Install the stand-in or CuPy as device 'cuda' (the default device stays 'cpu')."""
    if request.param == "cupy" and cupy_unavailable_reason() is not None:
        pytest.skip(f"no GPU run here: {cupy_unavailable_reason()}")
    previous = backend.set_cuda_module(strict_cupy if request.param == "strict" else None)
    try:
        yield backend.module_for("cuda")  # for 'cupy': imports CuPy again into the emptied slot
    finally:
        backend.set_cuda_module(previous)


class Checkpointed(nn.Module):
    """Runs `inner` under checkpoint(): stands in for model.gradient_checkpointing_enable()
    until the models have that method."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return checkpoint(self.inner, x)


def enable_checkpointing(model):
    if hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable()
    else:
        model.blocks = nn.Sequential(*[Checkpointed(block) for block in model.blocks])


# -- the two models, built the same way on any device ---------------------------------
def mlp_and_loss(device):
    model = nn.MLP(6, 8, 3, n_layers=3, dtype=numpy.float64, device=device, rng=numpy.random.default_rng(0))
    data = numpy.random.default_rng(1)
    x = Tensor(data.standard_normal((4, 6)), device=device)
    target = Tensor(data.standard_normal((4, 3)), device=device)
    return model, lambda: F.mse_loss(model(x), target)


def gpt_and_loss(device):
    config = nn.GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=8, dropout=0.1)
    # One generator draws the weights and then the dropout masks, in the same order on every device.
    model = nn.GPT(config, rng=numpy.random.default_rng(0), dtype=numpy.float64, device=device)
    data = numpy.random.default_rng(1)
    idx = data.integers(0, 11, size=(2, 8))
    targets = data.integers(0, 11, size=(2, 8))
    targets[0, :3] = -100  # ignored positions too
    return model, lambda: model(idx, targets)[1]


MODELS = {"mlp": mlp_and_loss, "gpt": gpt_and_loss}


def train_step(make, device, checkpointing):
    """(loss, gradients as host arrays, saved activation bytes after forward, device->host copies during the step)."""
    model, loss_fn = make(device)
    if checkpointing:
        enable_checkpointing(model)
    strict_cupy.reset_transfers()
    loss = loss_fn()
    saved = memory.current()["activations"]
    loss.backward()
    copies = strict_cupy.transfers["device_to_host"]
    return loss.item(), [p.grad.numpy() for p in model.parameters()], saved, copies


@pytest.mark.parametrize("checkpointing", [False, pytest.param(True, marks=pytest.mark.equivalence)],
                         ids=["plain", "checkpointed"])
@pytest.mark.parametrize("model", list(MODELS))
def test_cuda_gradients_equal_cpu_gradients(cuda, model, checkpointing):
    cpu_loss, cpu_grads, cpu_saved, _ = train_step(MODELS[model], "cpu", checkpointing=False)
    loss, grads, saved, copies = train_step(MODELS[model], "cuda", checkpointing)
    assert loss == pytest.approx(cpu_loss, rel=RTOL, abs=ATOL)
    assert len(grads) == len(cpu_grads)
    for g, expected in zip(grads, cpu_grads):
        numpy.testing.assert_allclose(g, expected, rtol=RTOL, atol=ATOL)
    if checkpointing:
        assert saved < cpu_saved  # checkpointing really was on: the forward kept less
    if cuda is strict_cupy:
        assert copies == 0  # forward and backward never copied anything to the host


def test_reading_gradients_is_the_only_transfer_to_the_host(cuda):
    if cuda is not strict_cupy:
        pytest.skip("the transfer counter belongs to the stand-in")
    model, loss_fn = mlp_and_loss("cuda")
    loss_fn().backward()
    strict_cupy.reset_transfers()
    grads = [p.grad.numpy() for p in model.parameters()]
    assert strict_cupy.transfers["device_to_host"] == len(grads)  # one explicit copy each, nothing else


# -- memory: the engine's accounting against the device allocator ----------------------
def float32_mlp_step(device):
    model = nn.MLP(64, 128, 16, n_layers=4, device=device, rng=numpy.random.default_rng(0))
    x = Tensor(numpy.random.default_rng(1).standard_normal((32, 64)), dtype=numpy.float32, device=device)
    loss = (model(x) ** 2).mean()
    return model, x, loss


def test_memory_accounting_matches_the_device_pool(cuda):
    # CuPy's pool hands out every buffer rounded up to 512 bytes; the engine
    # counts the exact bytes of every buffer it knows. After a warm-up step
    # (one-time allocations done), the bytes the pool says are in use for a
    # forward must be the engine's buffers, each rounded up: nothing unseen.
    pool = cuda.get_default_memory_pool()
    float32_mlp_step("cuda")[2].backward()  # warm-up
    gc.collect()
    pool.free_all_blocks()
    before_used, before_buffers = pool.used_bytes(), set(memory.tracker.buffers)
    model, x, loss = float32_mlp_step("cuda")
    gc.collect()
    new = [b for key, b in memory.tracker.buffers.items() if key not in before_buffers]
    tracked = sum(-(-b.nbytes // 512) * 512 for b in new)
    used = pool.used_bytes() - before_used
    if cuda is strict_cupy:
        assert used == tracked
    else:  # a real allocator: allow 1 MiB for anything CuPy keeps for itself
        assert tracked <= used <= tracked + 2**20, f"pool {used} B in use, engine knows {tracked} B"
    del model, x, loss, new
    gc.collect()
    assert pool.used_bytes() == before_used  # and all of it is given back


def test_memory_by_category_is_the_same_on_cpu_and_cuda(cuda):
    def peak_of_a_step(device):
        gc.collect()
        before = memory.current()
        memory.reset_peak()
        model, x, loss = float32_mlp_step(device)
        loss.backward()
        _, at_peak = memory.peak()
        return {c: at_peak[c] - before[c] for c in at_peak}

    assert peak_of_a_step("cuda") == peak_of_a_step("cpu")
