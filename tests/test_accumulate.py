"""GradientAccumulator: accumulated gradients equal big-batch gradients, exactly normalised.

The model here is a tiny float64 language model made of raw tensors
(embedding -> tanh -> linear head), so these tests depend only on the core
engine. Tolerances: every comparison is float64 of sums over at most a few
hundred terms of size ~1, where summation order changes results by ~1e-15
relative; atol 1e-12 / rtol 1e-10 leaves three orders of margin and still
fails for any wrong scale factor (those are off by ~1e-1).
"""

import numpy
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, backend, memory
from tinygrad_ckpt.accumulate import GradientAccumulator
from tinygrad_ckpt.nn import Parameter
from tinygrad_ckpt.optim import SGD, AdamW, clip_grad_norm_
from tinygrad_ckpt.testing.strategies import micro_batch_splits, padded_batches

ATOL, RTOL = 1e-12, 1e-10
V, C = 7, 5  # vocabulary, width


def make_params(seed=0, dtype="float64"):
    rng = numpy.random.default_rng(seed)
    return [
        Tensor(rng.normal(size=(V, C)), requires_grad=True, dtype=dtype),  # token embedding
        Tensor(rng.normal(size=(V, C)), requires_grad=True, dtype=dtype),  # head weight
        Tensor(rng.normal(size=(V,)), requires_grad=True, dtype=dtype),  # head bias
    ]


def loss_of(params, input_ids, labels, reduction):
    wte, w, b = params
    x = F.embedding(input_ids, wte).tanh()  # (B, T, C)
    logits = F.linear(x, w, b)  # (B, T, V)
    return F.cross_entropy(logits, labels, reduction=reduction)


def big_batch_grads(params, input_ids, labels):
    loss = loss_of(params, input_ids, labels, "mean")
    loss.backward()
    grads = [p.grad.numpy().copy() for p in params]
    for p in params:
        p.grad = None
    return grads


@pytest.mark.equivalence
@given(data=st.data(), batch=padded_batches(vocab_size=V))
def test_accumulated_gradient_equals_full_batch_gradient(data, batch):
    input_ids, labels = batch
    bounds = numpy.cumsum([0, *data.draw(micro_batch_splits(len(input_ids)))]).tolist()
    params = make_params()
    expected = big_batch_grads(params, input_ids, labels)

    acc = GradientAccumulator(params, gradient_accumulation_steps=len(bounds) - 1)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        assert not acc.sync_gradients
        loss_of(params, input_ids[lo:hi], labels[lo:hi], "sum").backward()
        acc.accumulate(int((labels[lo:hi] != -100).sum()))
        assert all(p.grad is None for p in params)  # added into the buffers and dropped
    assert acc.sync_gradients and acc.items == (labels != -100).sum()
    acc.write_grads()
    for p, g in zip(params, expected):
        numpy.testing.assert_allclose(p.grad.numpy(), g, atol=ATOL, rtol=RTOL)
    acc.zero_grad()
    assert all(p.grad is None for p in params) and acc.items == 0
    assert all(not backend.to_host(buf).any() for buf in acc.buffers)


@pytest.mark.equivalence
@pytest.mark.parametrize("make_optimizer", [
    lambda params: SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01),
    lambda params: AdamW(params, lr=0.01, weight_decay=0.1),
], ids=["sgd", "adamw"])
@given(data=st.data(), batch=padded_batches(vocab_size=V, max_examples=12))
def test_parameters_after_several_steps_equal_the_big_batch_run(make_optimizer, data, batch):
    """One epoch of optimizer steps, each over B*k examples; the last group may be short."""
    input_ids, labels = batch
    n = len(input_ids)
    B = data.draw(st.integers(1, n), label="micro-batch size")
    k = data.draw(st.integers(1, 4), label="gradient_accumulation_steps")

    big = make_params()
    opt = make_optimizer(big)
    for lo in range(0, n, B * k):  # the big-batch run: one batch of B*k examples per step
        sl = slice(lo, lo + B * k)
        if (labels[sl] != -100).any():
            loss_of(big, input_ids[sl], labels[sl], "mean").backward()
            clip_grad_norm_(big, 1.0)
            opt.step()
        opt.zero_grad()

    small = make_params()
    opt = make_optimizer(small)
    acc = GradientAccumulator(small, gradient_accumulation_steps=k)
    starts = list(range(0, n, B))
    for m, lo in enumerate(starts):  # micro-batches of B, forward then backward each
        sl = slice(lo, lo + B)
        loss_of(small, input_ids[sl], labels[sl], "sum").backward()
        if acc.accumulate(int((labels[sl] != -100).sum()), end_of_data=(m == len(starts) - 1)):
            if acc.items:
                acc.write_grads()
                clip_grad_norm_(small, 1.0)
                opt.step()
            acc.zero_grad()
    for p, q in zip(small, big):
        numpy.testing.assert_allclose(p.numpy(), q.numpy(), atol=1e-10, rtol=1e-10)


@pytest.mark.equivalence
def test_mean_of_means_is_wrong_when_token_counts_differ_and_we_do_not_use_it():
    rng = numpy.random.default_rng(1)
    input_ids = rng.integers(0, V, size=(2, 6))
    labels = rng.integers(0, V, size=(2, 6))
    labels[0, 1:] = -100  # micro-batch 1 counts 1 token, micro-batch 2 counts 6
    params = make_params()
    expected = big_batch_grads(params, input_ids, labels)

    # mean of means: each micro-batch averaged, then the average of the two
    for i in range(2):
        (loss_of(params, input_ids[i : i + 1], labels[i : i + 1], "mean") / 2).backward()
    mean_of_means = [p.grad.numpy().copy() for p in params]
    for p in params:
        p.grad = None
    gap = max(numpy.abs(m - e).max() for m, e in zip(mean_of_means, expected))
    assert gap > 1e-2  # clearly a different update, not rounding

    # the accumulator: sums, then one division by the 7 tokens of the whole batch
    acc = GradientAccumulator(params, gradient_accumulation_steps=2)
    for i in range(2):
        loss_of(params, input_ids[i : i + 1], labels[i : i + 1], "sum").backward()
        acc.accumulate(int((labels[i] != -100).sum()))
    assert acc.write_grads() == 7
    for p, e in zip(params, expected):
        numpy.testing.assert_allclose(p.grad.numpy(), e, atol=ATOL, rtol=RTOL)


def test_sync_gradients_every_k_micro_batches_and_at_the_end_of_the_data():
    params = make_params()
    acc = GradientAccumulator(params, gradient_accumulation_steps=3)
    flags = []
    for i in range(7):  # groups of 3, 3 and a short last group of 1
        loss_of(params, numpy.array([[i % V]]), numpy.array([[1]]), "sum").backward()
        flags.append(acc.accumulate(1, end_of_data=(i == 6)))
        if acc.sync_gradients:
            acc.write_grads()
            acc.zero_grad()
    assert flags == [False, False, True, False, False, True, True]


@pytest.mark.equivalence
def test_short_last_group_is_the_exact_mean_over_its_own_items():
    # 5 micro-batches of 2 examples, gradient_accumulation_steps=3: groups of 3 and 2
    rng = numpy.random.default_rng(2)
    input_ids = rng.integers(0, V, size=(10, 4))
    labels = rng.integers(0, V, size=(10, 4))
    params = make_params()
    expected_last = big_batch_grads(params, input_ids[6:], labels[6:])  # the 4 examples of group 2
    acc = GradientAccumulator(params, gradient_accumulation_steps=3)
    for m in range(5):
        sl = slice(2 * m, 2 * m + 2)
        loss_of(params, input_ids[sl], labels[sl], "sum").backward()
        if acc.accumulate(int((labels[sl] != -100).sum()), end_of_data=(m == 4)) and m < 4:
            acc.zero_grad()  # first group: not what this test checks
    assert acc.sync_gradients and acc.micro_batches == 2 and acc.items == 16
    acc.write_grads()
    for p, e in zip(params, expected_last):
        numpy.testing.assert_allclose(p.grad.numpy(), e, atol=ATOL, rtol=RTOL)


def test_buffers_allocated_once_counted_as_accumulation_and_reused():
    params = make_params(dtype="float32")
    before = memory.current()["accumulation"]
    acc = GradientAccumulator(params, gradient_accumulation_steps=2, dtype="float64")
    nbytes = sum(p.data.size * 8 for p in params)
    assert memory.current()["accumulation"] - before == nbytes
    assert all(buf.dtype == numpy.float64 for buf in acc.buffers)
    ids = [id(buf) for buf in acc.buffers]
    for _ in range(3):  # three groups
        for _ in range(2):
            loss_of(params, numpy.array([[1, 2]]), numpy.array([[3, 4]]), "sum").backward()
            acc.accumulate(2)
        acc.write_grads()
        assert all(p.grad.dtype == numpy.float32 for p in params)  # handed over in the parameter's dtype
        acc.zero_grad()
    assert [id(buf) for buf in acc.buffers] == ids
    assert memory.current()["accumulation"] - before == nbytes


def test_float64_buffers_hold_a_long_float32_accumulation_more_exactly():
    # 200 micro-batches each adding a gradient of 0.1-ish: a float32 buffer
    # rounds at every add, a float64 one keeps the sum of the float32 values.
    p32 = Tensor(numpy.zeros(1000, dtype=numpy.float32), requires_grad=True)
    rng = numpy.random.default_rng(3)
    grads = rng.uniform(0.05, 0.15, size=(200, 1000)).astype(numpy.float32)
    exact = grads.astype(numpy.float64).sum(axis=0) / 200
    errors = {}
    for dtype in ("float32", "float64"):
        acc = GradientAccumulator([p32], gradient_accumulation_steps=200, dtype=dtype)
        for g in grads:
            p32.grad = Tensor(g.copy())
            acc.accumulate(1)
        acc.write_grads()
        errors[dtype] = numpy.abs(p32.grad.numpy().astype(numpy.float64) - exact).max()
        acc.zero_grad()
    assert errors["float64"] <= 2 ** -24 * 0.15  # only the final cast to float32 rounds
    assert errors["float32"] > 4 * errors["float64"]


def test_peak_activation_memory_is_one_micro_batch_not_the_effective_batch():
    # Activations dominate: k=8 micro-batches of b=4 sequences of 64 tokens.
    # Weights are Parameters (counted as "parameters", not as the activations
    # that save them) and each micro-batch's ids are its own array, so nothing
    # is shared between micro-batches and the figures compare cleanly.
    rng = numpy.random.default_rng(4)
    vocab, width, b, k, T = 11, 32, 4, 8, 64
    params = [
        Parameter(rng.normal(size=(vocab, width))),
        Parameter(rng.normal(size=(width, width))),
        Parameter(rng.normal(size=(vocab, width))),
    ]
    micro_batches = [
        (rng.integers(0, vocab, size=(b, T)), rng.integers(0, vocab, size=(b, T))) for _ in range(k)
    ]

    def micro_loss(m):
        wte, w1, head = params
        input_ids, labels = micro_batches[m]
        h = F.linear(F.embedding(input_ids, wte), w1).tanh()  # (b, T, width)
        return F.cross_entropy(F.linear(h, head), labels, reduction="sum")

    acc = GradientAccumulator(params, gradient_accumulation_steps=k)

    def measure(run):
        """(peak total bytes above what was live before, peak saved-activation bytes)."""
        for p in params:
            p.grad = None
        baseline = memory.total()
        memory.reset_peak()
        with memory.timeline() as events:
            run()
        total, _ = memory.peak()
        return total - baseline, max(e["activations"] for e in events)

    def one_batch():
        micro_loss(0).backward()

    def accumulate_properly():  # forward, backward, forward, backward, ...
        for m in range(k):
            micro_loss(m).backward()
            acc.accumulate(b * T)
        acc.zero_grad()

    def eight_forwards_then_one_backward():
        losses = [micro_loss(m) for m in range(k)]
        total = losses[0]
        for loss in losses[1:]:
            total = total + loss
        total.backward()

    one_total, one_act = measure(one_batch)
    acc_total, acc_act = measure(accumulate_properly)
    bad_total, bad_act = measure(eight_forwards_then_one_backward)
    assert one_act > 0
    # Forward-then-backward per micro-batch: one micro-batch's activations at a
    # time; the total adds only the accumulation buffers (one per parameter).
    buffers = sum(p.data.nbytes for p in params)
    assert acc_act <= 1.01 * one_act and acc_total <= 1.01 * one_total + buffers
    # The wrong order holds all eight micro-batches' activations at once.
    assert bad_act >= 0.99 * k * one_act and bad_total >= 0.5 * k * one_total


def test_bad_use_is_a_clear_error():
    params = make_params()
    with pytest.raises(ValueError, match="at least 1"):
        GradientAccumulator(params, gradient_accumulation_steps=0)
    with pytest.raises(TypeError, match="int"):
        GradientAccumulator(params, gradient_accumulation_steps=2.0)
    with pytest.raises(ValueError, match="no parameters"):
        GradientAccumulator(iter([]))
    acc = GradientAccumulator(params, gradient_accumulation_steps=1)
    with pytest.raises(ValueError, match="no items"):
        acc.write_grads()
    loss_of(params, numpy.array([[1]]), numpy.array([[2]]), "sum").backward()
    acc.accumulate(1)
    with pytest.raises(RuntimeError, match="zero_grad"):
        acc.accumulate(1)
    acc.write_grads()
    with pytest.raises(RuntimeError, match="twice"):
        acc.write_grads()
