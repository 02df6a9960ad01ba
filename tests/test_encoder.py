"""The encoder (nn/encoder.py) and its generated task (data.majority_token_task).

What each test proves: attention without the causal mask lets the first
position see the last (and the GPT's blocks still do not); the task's
labels are the majority tokens, counted independently, and the seed alone
decides them; the encoder learns the task; checkpointing its blocks with
every strategy gives the plain gradients bit for bit; bad input is named.
"""

import collections

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygrad_ckpt import Tensor, optim
from tinygrad_ckpt.data import majority_token_task
from tinygrad_ckpt.nn import Encoder, EncoderConfig, GPTConfig, TransformerBlock
from tinygrad_ckpt.schedules import revolve
from tinygrad_ckpt.testing import check_checkpoint
from tinygrad_ckpt.testing import strategies as tst

from .conftest import examples

F64 = numpy.float64


def rng(seed=0):
    return numpy.random.default_rng(seed)


@pytest.mark.parametrize("causal", [True, False])
def test_without_the_mask_the_first_position_sees_the_last(causal):
    config = GPTConfig(block_size=5, n_layer=1, n_head=2, n_embd=8, dropout=0.0)
    block = TransformerBlock(config, rng=rng(), dtype=F64, causal=causal)
    x = rng(1).standard_normal((1, 5, 8))
    changed = x.copy()
    changed[0, -1, 0] += 1.0  # only the last position's input differs (one feature: LayerNorm removes a shift)
    first = block(Tensor(x)).numpy()[0, 0]
    first_changed = block(Tensor(changed)).numpy()[0, 0]
    assert numpy.array_equal(first, first_changed) == causal  # causal: position 0 cannot see position 4


def test_the_task_labels_are_the_majority_tokens():
    ids, labels = majority_token_task(200, seq_len=10, vocab_size=5, seed=3)
    assert ids.shape == (200, 10) and labels.shape == (200,) and ids.dtype == labels.dtype == numpy.int64
    for row, label in zip(ids, labels):
        counts = collections.Counter(row.tolist())
        most = max(counts.values())
        assert label == min(t for t, n in counts.items() if n == most)  # the most frequent; the smallest on a tie
    assert set(labels.tolist()) == set(range(5))  # every class occurs
    again, again_labels = majority_token_task(200, seq_len=10, vocab_size=5, seed=3)
    assert numpy.array_equal(again, ids) and numpy.array_equal(again_labels, labels)  # the seed decides
    assert not numpy.array_equal(majority_token_task(200, seq_len=10, vocab_size=5, seed=4)[0], ids)
    with pytest.raises(ValueError, match="vocab_size >= 2"):
        majority_token_task(10, vocab_size=1)


@pytest.mark.backends("numpy")  # learning is the ops' work, which the other tests check on every backend
def test_the_encoder_learns_the_majority_task():
    ids, labels = majority_token_task(256, seq_len=12, vocab_size=6, seed=0)
    config = EncoderConfig(block_size=12, vocab_size=6, num_classes=6, n_layer=1, n_head=2, n_embd=16)
    model = Encoder(config, rng=rng())
    model.gradient_checkpointing_enable("every")  # checkpointed: it learns the same
    optimizer = optim.AdamW(model.parameters(), lr=1e-2)
    order, losses = rng(1), []
    for _ in range(40):
        batch = order.integers(0, len(ids), 32)
        _, loss = model(ids[batch], labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] > 0.9 * numpy.log(6)  # it starts by guessing
    assert numpy.mean(losses[-5:]) < 0.5 * losses[0], losses
    logits, _ = model(ids[:64])
    accuracy = (logits.numpy().argmax(axis=1) == labels[:64]).mean()
    assert accuracy > 2 / 6  # well above guessing (1/6)


def small_encoder(n_layer=3, dropout=0.0, seed=0):
    config = EncoderConfig(block_size=6, vocab_size=7, num_classes=3, n_layer=n_layer, n_head=2, n_embd=8,
                           dropout=dropout)
    return Encoder(config, rng=rng(seed), dtype=F64)


@pytest.mark.equivalence
@pytest.mark.parametrize("segments", ["every", "sqrt", 2, [0, 2], [(0, 1, False), (1, 3, True)], revolve(3, 1)])
@pytest.mark.parametrize("policy", [None, "selective_attention", "save_matmuls"])
def test_checkpointed_encoder_gives_the_plain_gradients_exactly(segments, policy):
    model = small_encoder(dropout=0.1)  # dropout: the recompute must draw the same masks
    ids, targets = rng(1).integers(0, 7, (4, 6)), rng(2).integers(0, 3, 4)
    report = check_checkpoint(model, (ids, targets), strategy=segments, policy=policy, rtol=0, atol=0)
    assert report.passed, report
    assert {e.name for e in report.entries} >= {n for n, _ in model.named_parameters()}


@pytest.mark.equivalence
@settings(max_examples=examples(10))
@given(data=st.data(), n_layer=st.integers(1, 4), policy=tst.policies(), seed=st.integers(0, 2**16))
def test_any_plan_on_any_encoder_gives_the_plain_gradients_exactly(data, n_layer, policy, seed):
    model = small_encoder(n_layer=n_layer, seed=seed)
    segments = data.draw(tst.segment_plans(n_layer), label="segments")
    ids, targets = rng(seed + 1).integers(0, 7, (3, 5)), rng(seed + 2).integers(0, 3, 3)
    check_checkpoint(model, (ids, targets), strategy=segments, policy=policy, rtol=0, atol=0, raise_exception=True)


def test_bad_input_is_named():
    model = small_encoder(n_layer=1)
    with pytest.raises(ValueError, match="sequence of length 7 is longer than block_size 6"):
        model(numpy.zeros((2, 7), dtype=numpy.int64))
    with pytest.raises(ValueError, match="target 3 is out of range for 3 classes"):
        model(numpy.zeros((2, 4), dtype=numpy.int64), numpy.array([0, 3]))
    with pytest.raises(ValueError, match=r"number of layers \(1\), got 2"):
        model.gradient_checkpointing_enable(2)
