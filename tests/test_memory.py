"""memory.py's figures against independent measures.

The independent measure on CPU is Python's tracemalloc, which sees every
NumPy data buffer (NumPy reports them in its own tracemalloc domain). The
parameter, gradient, optimizer and accumulation figures are also checked
against bytes computed here from the layers' shapes.

What the comparison can and cannot show, and so the margins used:

  * current bytes, between operations: EXACT. Every NumPy buffer alive
    between two ops of a training step belongs to a Tensor, a saved
    activation, a .grad, an optimizer or accumulation buffer, all of which
    memory.py counts, so the NumPy-domain total of tracemalloc equals
    memory.total() to the byte (both measured as a rise from a baseline).
  * the peak: memory.py's peak <= tracemalloc's peak <= memory.py's peak +
    6 x the largest array the step makes + 256 KiB. memory.py updates its peak
    when a buffer becomes known, so it cannot see arrays that live only
    inside one op: a backward builds a few input-sized temporaries (GELU,
    softmax, layer norm), Linear's backward makes the weight gradient before
    it is added into .grad, AdamW's step makes three parameter-sized
    temporaries. tracemalloc sees those, and Python objects as well (it
    traces every allocation: the Tensors and tape records of the small GPT's
    forward take about 110 KiB; 256 KiB is allowed). Measured on these
    models: op temporaries of about 3 x the largest array above memory.py's peak.
"""

import gc
import tracemalloc

import numpy
import pytest

from tinygrad_ckpt import Tensor, backend, memory, optim
import tinygrad_ckpt.functional as F
from tinygrad_ckpt.accumulate import GradientAccumulator
from tinygrad_ckpt.nn.mlp import MLP
from tinygrad_ckpt.nn.transformer import GPT, GPTConfig

NUMPY_DOMAIN = numpy.lib.tracemalloc_domain
PYTHON_OBJECTS = 256 * 1024  # slack for Python objects in tracemalloc's figures
F32 = 4  # bytes per float32


def numpy_bytes():
    """Bytes of live NumPy data buffers, as tracemalloc sees them."""
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, NUMPY_DOMAIN)])
    return sum(trace.size for trace in snapshot.traces)


@pytest.fixture
def traced():
    gc.collect()  # cycles left by earlier tests (a raised error's traceback) would be freed mid-test
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


# -- two small models, with the bytes of their parameters counted from shapes ----
B, WIDTH, DEPTH = 32, 128, 3  # a W1-shaped MLP, small


def mlp_case(rng):
    model = MLP(WIDTH, WIDTH, WIDTH, n_layers=DEPTH, rng=rng, device=backend.get_default_device())
    x = Tensor(rng.standard_normal((B, WIDTH), dtype=numpy.float32))
    y = Tensor(rng.standard_normal((B, WIDTH), dtype=numpy.float32))
    param_bytes = (DEPTH + 1) * (WIDTH * WIDTH + WIDTH) * F32  # DEPTH blocks + head: weight and bias each
    largest = max(B * WIDTH, WIDTH * WIDTH) * F32
    return model, (lambda: F.mse_loss(model(x), y)), param_bytes, largest


GPT_CONFIG = dict(block_size=16, vocab_size=32, n_layer=2, n_head=2, n_embd=32, dropout=0.1)
GB, GT = 4, 16


def gpt_case(rng):
    config = GPTConfig(**GPT_CONFIG)
    model = GPT(config, rng=rng, device=backend.get_default_device())
    idx = Tensor(rng.integers(0, config.vocab_size, (GB, GT)))
    targets = Tensor(rng.integers(0, config.vocab_size, (GB, GT)))
    C, V, L = config.n_embd, config.vocab_size, config.n_layer
    per_block = (
        2 * C  # ln_1 weight and bias
        + 3 * C * C + 3 * C  # c_attn
        + C * C + C  # attention c_proj
        + 2 * C  # ln_2
        + 4 * C * C + 4 * C  # c_fc
        + 4 * C * C + C  # feed-forward c_proj
    )
    # wte (tied with lm_head: counted once), wpe, the blocks, ln_f
    param_bytes = (V * C + config.block_size * C + L * per_block + 2 * C) * F32
    largest = max(GB * GT * 4 * C, GB * config.n_head * GT * GT, GB * GT * V, 4 * C * C) * F32
    return model, (lambda: model(idx, targets)[1]), param_bytes, largest


CASES = {"mlp": mlp_case, "gpt": gpt_case}


# -- current and peak against tracemalloc (NumPy only: it sees host buffers) -------
@pytest.mark.backends("numpy")
@pytest.mark.parametrize("case", CASES)
def test_current_bytes_equal_tracemalloc_at_every_stage_of_a_training_step(case, traced):
    rng = numpy.random.default_rng(0)
    np0, mem0 = numpy_bytes(), memory.total()
    model, loss_fn, _, _ = CASES[case](rng)
    optimizer = optim.AdamW(model.parameters(), lr=1e-3)

    def check(stage):
        assert numpy_bytes() - np0 == memory.total() - mem0, stage

    check("after building the model and optimizer")
    for _ in range(2):  # the second step starts with optimizer state in place
        loss = loss_fn()
        check("after forward")
        loss.backward()
        check("after backward, loss still held")
        del loss
        check("after dropping the loss")
        optimizer.step()
        check("after step")
        optimizer.zero_grad()
        check("after zero_grad")


@pytest.mark.backends("numpy")
@pytest.mark.parametrize("case", CASES)
def test_peak_is_within_the_stated_margin_of_tracemalloc(case, traced):
    rng = numpy.random.default_rng(1)
    model, loss_fn, _, largest = CASES[case](rng)
    optimizer = optim.AdamW(model.parameters(), lr=1e-3)
    margin = 6 * largest + PYTHON_OBJECTS
    for stage in range(2):
        memory.reset_peak()
        tracemalloc.reset_peak()
        traced0, mem0 = tracemalloc.get_traced_memory()[0], memory.total()
        loss = loss_fn()
        loss.backward()
        del loss
        optimizer.step()
        optimizer.zero_grad()
        ours = memory.peak()[0] - mem0
        theirs = tracemalloc.get_traced_memory()[1] - traced0
        assert ours - PYTHON_OBJECTS <= theirs <= ours + margin, (stage, ours, theirs, margin)


# -- categories ------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_categories_add_up_to_the_total_now_at_the_peak_and_in_the_timeline(case):
    model, loss_fn, _, _ = CASES[case](numpy.random.default_rng(2))
    memory.reset_peak()
    with memory.timeline() as events:
        loss = loss_fn()
        assert sum(memory.current().values()) == memory.total()
        loss.backward()
    total, by_category = memory.peak()
    assert sum(by_category.values()) == total
    assert set(by_category) == set(memory.CATEGORIES)
    assert events, "the timeline recorded nothing"
    for e in events:
        assert {"op", "phase"} <= set(e) and set(memory.CATEGORIES) <= set(e)


@pytest.mark.parametrize("case", CASES)
def test_saved_activations_return_to_zero_after_backward(case):
    model, loss_fn, _, _ = CASES[case](numpy.random.default_rng(3))
    before = memory.current()["activations"]
    loss = loss_fn()
    assert memory.current()["activations"] > before
    loss.backward()
    assert memory.current()["activations"] == before  # while the loss itself is still alive


@pytest.mark.parametrize("case", CASES)
def test_a_forward_that_is_never_backpropagated_leaves_no_activations(case):
    # The input batch outlives the forward's records: the holds they had on it
    # must go with them, or it would stay counted as activations.
    model, loss_fn, _, _ = CASES[case](numpy.random.default_rng(7))
    before = memory.current()
    for _ in range(3):
        loss = loss_fn()
        assert memory.current()["activations"] > before["activations"]
        del loss
        assert memory.current() == before


@pytest.mark.parametrize("case", CASES)
def test_timeline_rises_in_forward_and_falls_in_backward(case):
    model, loss_fn, _, _ = CASES[case](numpy.random.default_rng(4))
    with memory.timeline() as events:
        loss_fn().backward()
    forward = [e["activations"] for e in events if e["phase"] == "forward"]
    backward = [e["activations"] for e in events if e["phase"] == "backward"]
    assert forward == sorted(forward)  # forward only ever saves more
    assert backward == sorted(backward, reverse=True)  # backward only ever frees
    assert backward[-1] < forward[-1]


@pytest.mark.parametrize("case", CASES)
def test_parameters_gradients_and_optimizer_state_are_exactly_their_arrays_bytes(case):
    base = memory.current()
    model, loss_fn, param_bytes, _ = CASES[case](numpy.random.default_rng(5))

    def rise(category):
        return memory.current()[category] - base[category]

    assert rise("parameters") == param_bytes
    optimizer = optim.AdamW(model.parameters(), lr=1e-3)
    assert rise("optimizer") == 2 * param_bytes  # Adam's two moments, one of each per parameter
    loss = loss_fn()
    loss.backward()
    assert rise("gradients") == param_bytes  # one .grad per parameter, the tied weight once
    optimizer.step()
    optimizer.zero_grad()
    assert rise("gradients") == 0
    del optimizer
    assert rise("optimizer") == 0
    sgd = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    assert rise("optimizer") == param_bytes  # one momentum buffer per parameter
    del sgd


def test_accumulation_buffers_are_exactly_the_parameters_bytes():
    base = memory.current()["accumulation"]
    model, loss_fn, param_bytes, _ = mlp_case(numpy.random.default_rng(6))
    acc = GradientAccumulator(model.parameters(), gradient_accumulation_steps=2)
    assert memory.current()["accumulation"] - base == param_bytes
    wide = GradientAccumulator(model.parameters(), gradient_accumulation_steps=2, dtype=numpy.float64)
    assert memory.current()["accumulation"] - base == 3 * param_bytes  # float64 buffers: twice as many bytes
    del acc, wide
    assert memory.current()["accumulation"] == base
