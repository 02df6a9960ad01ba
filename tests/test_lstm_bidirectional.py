"""The bidirectional LSTM: PyTorch's names and numbers, each direction an LSTM of its own, and
checkpointing through time in both directions giving the plain gradients bit for bit."""

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygrad_ckpt import Tensor, memory
from tinygrad_ckpt.gradcheck import gradcheck
from tinygrad_ckpt.nn import LSTM
from tinygrad_ckpt.testing import check_checkpoint
from tinygrad_ckpt.testing import strategies as tst

from .conftest import examples
from .helpers import ATOL, RTOL, TORCH_SKIP
from .test_lstm import both_runs, flat, leaf, rng

F64 = numpy.float64


def one_direction(bi, k, direction, width_in):
    """A unidirectional one-layer LSTM holding layer k's weights of one direction of `bi`."""
    uni = LSTM(width_in, bi.hidden_size, bias=bi.bias, dtype=F64)
    uni.load_state_dict({f"{name}_l0": getattr(bi, f"{name}_l{k}{direction}").numpy()
                         for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")[:4 if bi.bias else 2]})
    return uni


@settings(max_examples=examples(15))
@given(T=st.integers(1, 6), B=st.integers(1, 3), num_layers=st.integers(1, 3), bias=st.booleans(),
       batch_first=st.booleans(), seed=st.integers(0, 2**16))
def test_each_direction_is_an_lstm_of_its_own_the_reverse_one_reading_the_sequence_from_its_end(
        T, B, num_layers, bias, batch_first, seed):
    """The definition, built from unidirectional LSTMs in the test: layer k's forward half is an LSTM over
    the sequence, its reverse half an LSTM over the reversed sequence, reversed back; layer k+1 reads both."""
    D, H = 3, 4
    bi = LSTM(D, H, num_layers, bias=bias, batch_first=batch_first, bidirectional=True, dtype=F64, rng=rng(seed))
    x = rng(seed + 1).standard_normal((B, T, D) if batch_first else (T, B, D))
    h0, c0 = rng(seed + 2).standard_normal((2 * num_layers, B, H)), rng(seed + 3).standard_normal((2 * num_layers, B, H))
    output, (h_n, c_n) = bi(Tensor(x), (Tensor(h0), Tensor(c0)))

    seq = x.swapaxes(0, 1) if batch_first else x  # (T, B, D)
    for k in range(num_layers):
        halves = []
        for j, direction in enumerate(("", "_reverse")):
            uni = one_direction(bi, k, direction, seq.shape[-1])
            state = (Tensor(h0[2 * k + j][None]), Tensor(c0[2 * k + j][None]))
            y, (h, c) = uni(Tensor(seq if j == 0 else seq[::-1].copy()), state)
            halves.append(y.numpy() if j == 0 else y.numpy()[::-1])
            numpy.testing.assert_allclose(h_n.numpy()[2 * k + j], h.numpy()[0], rtol=1e-12, atol=1e-14)
            numpy.testing.assert_allclose(c_n.numpy()[2 * k + j], c.numpy()[0], rtol=1e-12, atol=1e-14)
        seq = numpy.concatenate(halves, axis=-1)  # (T, B, 2H): what the next layer reads
    ours = output.numpy().swapaxes(0, 1) if batch_first else output.numpy()
    numpy.testing.assert_allclose(ours, seq, rtol=1e-12, atol=1e-14)


def test_names_and_shapes_are_pytorchs():
    H = 5
    lstm = LSTM(3, H, num_layers=2, bidirectional=True)
    shapes = {n: p.shape for n, p in lstm.named_parameters()}
    expected = {}
    for k, width in ((0, 3), (1, 2 * H)):
        for d in ("", "_reverse"):
            expected.update({f"weight_ih_l{k}{d}": (4 * H, width), f"weight_hh_l{k}{d}": (4 * H, H),
                             f"bias_ih_l{k}{d}": (4 * H,), f"bias_hh_l{k}{d}": (4 * H,)})
    assert shapes == expected and list(shapes) == list(expected)  # PyTorch's order: per layer, per direction
    output, (h, c) = lstm(Tensor(numpy.ones((7, 2, 3), dtype=numpy.float32)))
    assert output.shape == (7, 2, 2 * H) and h.shape == c.shape == (4, 2, H)
    assert "bidirectional=True" in repr(lstm) and "bidirectional" not in repr(LSTM(3, H))


def test_matches_pytorch_outputs_and_gradients():
    torch = pytest.importorskip("torch", reason=TORCH_SKIP)
    T, B, D, H, L = 5, 3, 4, 6, 2
    torch.manual_seed(0)
    theirs = torch.nn.LSTM(D, H, L, bidirectional=True).double()
    ours = LSTM(D, H, L, bidirectional=True, dtype=F64)
    ours.load_state_dict(theirs.state_dict())
    x, h0, c0 = rng(1).standard_normal((T, B, D)), rng(2).standard_normal((2 * L, B, H)), rng(3).standard_normal((2 * L, B, H))
    weights = [rng(4 + k).standard_normal(s) for k, s in enumerate([(T, B, 2 * H), (2 * L, B, H), (2 * L, B, H)])]
    for mine, them in both_runs(torch, theirs, ours, (x, h0, c0), weights):
        numpy.testing.assert_allclose(mine.numpy(), them.detach().numpy(), rtol=1e-10, atol=1e-12)
    their_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        numpy.testing.assert_allclose(p.grad.numpy(), their_params[name].grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("segments", [None, "sqrt", [0, 1, 3]])
def test_gradcheck_plain_and_checkpointed(segments):
    lstm = LSTM(2, 3, num_layers=2, batch_first=True, bidirectional=True, dtype=F64, rng=rng())
    if segments is not None:
        lstm.gradient_checkpointing_enable(segments)
    x, h0, c0 = leaf(2, 4, 2, seed=1), leaf(4, 2, 3, seed=2), leaf(4, 2, 3, seed=3)
    assert gradcheck(lambda *_: flat(*lstm(x, (h0, c0))), [*lstm.parameters(), x, h0, c0], atol=ATOL, rtol=RTOL)


@pytest.mark.equivalence
@settings(max_examples=examples(15))
@given(data=st.data(), T=st.integers(1, 8), num_layers=st.integers(1, 2), batch_first=st.booleans(),
       with_state=st.booleans(), seed=st.integers(0, 2**16))
def test_checkpointed_through_time_in_both_directions_gives_the_plain_gradients_exactly(
        data, T, num_layers, batch_first, with_state, seed):
    segments = data.draw(tst.segment_plans(T), label="segments")
    B, D, H = 2, 3, 4
    lstm = LSTM(D, H, num_layers, batch_first=batch_first, bidirectional=True, dtype=F64, rng=rng(seed))
    x = leaf(*((B, T, D) if batch_first else (T, B, D)), seed=seed + 1)
    state = (leaf(2 * num_layers, B, H, seed=seed + 2), leaf(2 * num_layers, B, H, seed=seed + 3))
    report = check_checkpoint(lstm, (x, state) if with_state else (x,), strategy=segments, rtol=0, atol=0,
                              raise_exception=True)
    assert len(report.entries) == 3 + len(list(lstm.parameters())) + 1 + (2 if with_state else 0)


def saved_peak(lstm, T, segments):
    """The highest saved-activation bytes over a forward and backward of (T, 4, 8) ones."""
    lstm.gradient_checkpointing_disable() if segments is None else lstm.gradient_checkpointing_enable(segments)
    x = Tensor(numpy.ones((T, 4, 8), dtype=numpy.float32), requires_grad=True)
    base = memory.current()["activations"]
    with memory.timeline() as events:
        output, _ = lstm(x)
        output.sum().backward()
    return max(e["activations"] for e in events) - base


def test_sqrt_segments_lower_the_saved_peak_in_both_directions():
    lstm = LSTM(8, 16, bidirectional=True, rng=rng())
    plain, sqrt = saved_peak(lstm, 64, None), saved_peak(lstm, 64, "sqrt")
    print(f"bidirectional LSTM(8, 16), B=4, T=64: saved peak {plain} B plain, {sqrt} B with sqrt(T) segments")
    assert sqrt < plain / 2


def test_bad_state_and_a_plan_for_one_chain_are_refused_saying_what_to_do():
    lstm = LSTM(3, 4, num_layers=2, bidirectional=True)
    x = Tensor(numpy.ones((5, 2, 3), dtype=numpy.float32))
    wrong = Tensor(numpy.zeros((2, 2, 4), dtype=numpy.float32))  # num_layers, not 2 * num_layers
    with pytest.raises(ValueError, match=r"expected h_0 of shape \(4, 2, 4\) \(2 \* num_layers"):
        lstm(x, (wrong, wrong))
    with pytest.raises(ValueError, match="bidirectional one runs a chain per layer and direction"):
        lstm.measure_time_steps(x)
