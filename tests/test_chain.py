"""One segment runner: checkpoint_sequential with a sequence read beside the chain (xs), as the LSTM's time steps.

A chain that reads xs (function i is f(xs[i], carry) -> (y_i, carry)) must
give, checkpointed in any segments (nested ones included), the outputs and
gradients of the plain loop over the steps, bit for bit: the recompute runs
the same ops on the same arrays. The LSTM runs through this runner and has
no segment loop or switch of its own.
"""

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygrad_ckpt import Tensor
from tinygrad_ckpt import functional as F
from tinygrad_ckpt.checkpoint import ChainCheckpointing, checkpoint_sequential
from tinygrad_ckpt.nn.lstm import LSTM
from tinygrad_ckpt.schedules import revolve

from .conftest import examples


def tensor(rng, *shape, requires_grad=True):
    return Tensor(rng.standard_normal(shape), requires_grad=requires_grad)


class Step:
    """carry (h, c) and x_t (B, width_in) -> (y, (h', c')): a small recurrence with a parameter of its own."""

    def __init__(self, rng, width_in, H):
        self.w = tensor(rng, width_in, H)

    def __call__(self, x_t, carry):
        h, c = carry
        c = (x_t @ self.w + h).tanh() * c + h
        h = c.sigmoid() * h
        return h * 2.0, (h, c)


def plain_scan(steps, xs, carry):
    """The loop checkpoint_sequential's xs stands for, written out."""
    ys = []
    for t, f in enumerate(steps):
        y, carry = f(xs[t], carry)
        ys.append(y)
    return F.stack(ys), carry


def run(steps, xs, carry, segments):
    ys, (h, c) = plain_scan(steps, xs, carry) if segments is None else checkpoint_sequential(steps, segments, carry, xs=xs)
    ((ys * ys).sum() + h.sum() + (c * c).sum()).backward()
    tensors = [xs, *carry, *(f.w for f in steps)]
    grads = [t.grad.numpy().copy() for t in tensors]
    for t in tensors:
        t.grad = None
    return ys.numpy().copy(), grads


@settings(max_examples=examples(10), deadline=None)
@given(T=st.integers(1, 12), kind=st.sampled_from(["every", "sqrt", "count", "boundaries", "revolve"]),
       seed=st.integers(0, 2**16))
def test_a_chain_that_reads_xs_gives_the_plain_loop_bit_for_bit(T, kind, seed):
    rng = numpy.random.default_rng(seed)
    B, width_in, H = 2, 3, 4
    steps = [Step(rng, width_in, H) for _ in range(T)]
    xs = tensor(rng, T, B, width_in)
    carry = (tensor(rng, B, H), tensor(rng, B, H))
    segments = {"every": "every", "sqrt": "sqrt", "count": max(1, T // 2), "boundaries": list(range(0, T, 3)),
                "revolve": revolve(T, 2)}[kind]
    want_ys, want_grads = run(steps, xs, carry, None)
    got_ys, got_grads = run(steps, xs, carry, segments)
    assert numpy.array_equal(got_ys, want_ys)
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        assert numpy.array_equal(g, w), f"gradient {i} ({kind} segments of {T} steps)"


def test_xs_must_have_one_entry_per_function():
    rng = numpy.random.default_rng(0)
    steps = [Step(rng, 3, 4) for _ in range(3)]
    carry = (tensor(rng, 2, 4), tensor(rng, 2, 4))
    with pytest.raises(ValueError, match=r"xs must be a Tensor with one entry per function along its first axis \(3\)"):
        checkpoint_sequential(steps, "every", carry, xs=tensor(rng, 4, 2, 3))
    with pytest.raises(ValueError, match="xs must be a Tensor"):
        checkpoint_sequential(steps, "every", carry, xs=[1, 2, 3])


def test_the_lstm_keeps_chain_checkpointings_switch():
    """No gradient_checkpointing_enable of its own: ChainCheckpointing's, checking segments against the length
    they name (the chain is the input's time steps)."""
    assert "gradient_checkpointing_enable" not in vars(LSTM)
    lstm = LSTM(3, 4, rng=numpy.random.default_rng(0))
    assert lstm.gradient_checkpointing_enable.__func__ is ChainCheckpointing.gradient_checkpointing_enable
    lstm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"segments": [0, 4, 8], "use_reentrant": False})
    assert lstm.time_segments(10) == [(0, 4, True), (4, 8, True), (8, 10, True)]
    with pytest.raises(ValueError, match="segments must be a count of at least 1"):
        lstm.gradient_checkpointing_enable(0)
    assert lstm.checkpoint_segments == [0, 4, 8]  # the refused call changed nothing
