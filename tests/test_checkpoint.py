"""Checkpointing: same gradients as without, one record per segment, memory, RNG, state, errors.

Tolerances. A recompute runs the same ops on the same arrays, so in float64
the gradients agree to rounding: we allow rtol 1e-12 (atol 1e-14), which
only leaves room for sums added in another order. float32: rtol 1e-5,
atol 1e-6, a few ulps on these magnitudes.

These tests run on NumPy and on the strict CuPy stand-in (conftest.py), so
inputs and models are made on the default device.
"""

import gc
import weakref

import numpy
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tinygrad_ckpt import Tensor, autograd, memory, nn, no_grad, policies, random, tape
from tinygrad_ckpt import functional as F
from tinygrad_ckpt.checkpoint import ChainCheckpointing, checkpoint, checkpoint_sequential, is_recomputing
from tinygrad_ckpt.nn.mlp import MLP
from tinygrad_ckpt.nn.transformer import GPT, GPTConfig
from tinygrad_ckpt.ops import matmul
from tinygrad_ckpt.schedules import revolve
from tinygrad_ckpt.testing import strict_cupy

from .conftest import examples

F64 = numpy.float64
RTOL64, ATOL64 = 1e-12, 1e-14
RTOL32, ATOL32 = 1e-5, 1e-6


def randn(*shape, seed=0, dtype=F64, requires_grad=False):
    return Tensor(numpy.random.default_rng(seed).standard_normal(shape).astype(dtype), requires_grad=requires_grad)


def assert_same_grads(got, want, rtol=RTOL64, atol=ATOL64):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g is None) == (w is None), f"gradient {i}: one is None"
        if g is not None:
            numpy.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"gradient {i}")


def grads(tensors):
    return [t.grad.numpy() if t.grad is not None else None for t in tensors]


def zero(params):
    for p in params:
        p.grad = None


def chain(depth, width, p_drop, seed=0):
    """Linear -> GELU (-> Dropout) blocks, float64, with their own dropout generator."""
    init = numpy.random.default_rng(seed)
    drop_rng = numpy.random.default_rng(seed + 1)
    blocks = []
    for _ in range(depth):
        layers = [nn.Linear(width, width, dtype=F64, rng=init), nn.GELU()]
        if p_drop:
            layers.append(nn.Dropout(p_drop, rng=drop_rng))
        blocks.append(nn.Sequential(*layers))
    return blocks, drop_rng


def params_of(blocks):
    return [p for b in blocks for p in b.parameters()]


def run_chain(blocks, x, segments=None, policy=None):
    if segments is None:
        for b in blocks:
            x = b(x)
        return x
    return checkpoint_sequential(blocks, segments, x, policy=policy)


def user_policy(op):
    """A user callable: keep layer norms and GELUs, recompute everything else."""
    return "save" if op in ("LayerNorm", "GELU") else "recompute"


POLICIES = [None, policies.nothing_saveable, policies.save_matmuls, policies.everything_saveable,
            policies.offload_matmuls, user_policy]


# -- the same gradients ---------------------------------------------------------
@pytest.mark.equivalence
@settings(max_examples=examples(12))
@given(depth=st.integers(1, 5), width=st.integers(1, 4), batch=st.integers(1, 3),
       segments=st.one_of(st.integers(1, 5), st.sampled_from(["sqrt", "every", "revolve0", "revolve1"])),
       p_drop=st.sampled_from([0.0, 0.3]), policy=st.sampled_from(POLICIES),
       input_grad=st.booleans(), early_stop=st.booleans(), call=st.sampled_from(["backward", "grad", "inputs"]),
       seed=st.integers(0, 2**16))
@example(depth=5, width=3, batch=2, segments="revolve0", p_drop=0.3, policy=None, input_grad=True, early_stop=True,
         call="backward", seed=1)
@example(depth=5, width=3, batch=2, segments="revolve1", p_drop=0.3, policy=None, input_grad=False, early_stop=True,
         call="grad", seed=2)
def test_chain_gradients_equal_without_checkpointing(depth, width, batch, segments, p_drop, policy, input_grad,
                                                      early_stop, call, seed):
    segments = min(segments, depth) if isinstance(segments, int) else segments
    if isinstance(segments, str) and segments.startswith("revolve"):  # nested: some layers recomputed twice or more
        segments = revolve(depth, min(int(segments[-1]), max(depth - 2, 0)))
    blocks, drop_rng = chain(depth, width, p_drop, seed)
    params = params_of(blocks)
    start = drop_rng.bit_generator.state
    results = []
    for segs in (None, segments):
        drop_rng.bit_generator.state = start
        zero(params)
        x = randn(batch, width, seed=seed, requires_grad=input_grad)
        out = run_chain(blocks, x, segs, policy) if segs is None else \
            checkpoint_sequential(blocks, segs, x, policy=policy, early_stop=early_stop)
        loss = (out ** 2).sum()
        wrt = params[::2] + ([x] if input_grad else [])  # the weights (and x): a subset, for grad() and inputs=
        if call == "grad":  # the same gradients, returned, .grad untouched
            got = [g.numpy() for g in autograd.grad(loss, wrt)]
            assert all(p.grad is None for p in params)
        elif call == "inputs":  # only the tensors named get a .grad
            loss.backward(inputs=wrt)
            got = grads(wrt)
            assert all(p.grad is None for p in params[1::2])
        else:
            loss.backward()
            got = grads(params + [x])
        results.append((got, drop_rng.bit_generator.state))
    assert_same_grads(results[1][0], results[0][0])
    assert results[1][1] == results[0][1]  # the dropout generator ends where it would have


def tiny_gpt(n_layer, dropout, seed=0, dtype=F64):
    config = GPTConfig(block_size=8, vocab_size=11, n_layer=n_layer, n_head=2, n_embd=8, dropout=dropout)
    gen = numpy.random.default_rng(seed)
    return GPT(config, rng=gen, dtype=dtype), gen


@pytest.mark.equivalence
@settings(max_examples=examples(8))
@given(n_layer=st.integers(1, 4), T=st.integers(2, 8), dropout=st.sampled_from([0.0, 0.2]),
       segments=st.sampled_from(["every", "sqrt", 1, "revolve0"]),
       policy=st.sampled_from([None, policies.selective_attention, policies.save_matmuls, user_policy]),
       split=st.booleans(), early_stop=st.booleans(), seed=st.integers(0, 2**16))
@example(n_layer=4, T=8, dropout=0.2, segments="revolve0", policy=None, split=False, early_stop=True, seed=3)
@example(n_layer=2, T=8, dropout=0.2, segments="every", policy=policies.selective_attention, split=True,
         early_stop=True, seed=4)
def test_gpt_gradients_equal_without_checkpointing(n_layer, T, dropout, segments, policy, split, early_stop, seed):
    if segments == "revolve0":  # nested: block 0 recomputed n_layer - 1 times, dropout masks each time the same
        segments = revolve(n_layer * (2 if split else 1), 0)
    model, gen = tiny_gpt(n_layer, dropout, seed)
    idx = numpy.random.default_rng(seed).integers(0, 11, (2, T))
    start = gen.bit_generator.state
    results = []
    for enable in (False, True):
        gen.bit_generator.state = start
        model.zero_grad()
        if enable:
            model.gradient_checkpointing_enable(segments, policy=policy, split_blocks=split, early_stop=early_stop)
        else:
            model.gradient_checkpointing_disable()
        _, loss = model(idx, idx)
        loss.backward()
        results.append((grads(list(model.parameters())), gen.bit_generator.state, loss.item()))
    assert_same_grads(results[1][0], results[0][0])
    assert results[1][1] == results[0][1]
    assert results[1][2] == results[0][2]


@pytest.mark.equivalence
def test_mlp_float32_gradients_within_tolerance():
    model = MLP(6, 8, 3, n_layers=5, rng=numpy.random.default_rng(0))
    x = randn(4, 6, dtype=numpy.float32, requires_grad=True)
    results = []
    for enable in (False, True):
        model.zero_grad()
        x.grad = None
        if enable:
            model.gradient_checkpointing_enable("sqrt")
        (model(x) ** 2).mean().backward()
        results.append(grads(list(model.parameters()) + [x]))
    assert_same_grads(results[1], results[0], rtol=RTOL32, atol=ATOL32)


@pytest.mark.equivalence
def test_multiple_inputs_outputs_keywords_and_non_tensor_arguments():
    a, b = randn(3, 2, seed=1, requires_grad=True), randn(3, 2, seed=2, requires_grad=True)
    w = nn.Linear(2, 2, dtype=F64, rng=numpy.random.default_rng(3))

    def fn(a, scale, b=None, mode="x"):
        assert mode == "y" and scale == 2.0
        h = w(a * b)
        return h.tanh() * scale, (h + b).exp()

    results = []
    for use in (False, True):
        zero([a, b] + list(w.parameters()))
        y, z = checkpoint(fn, a, 2.0, b=b, mode="y") if use else fn(a, 2.0, b=b, mode="y")
        (y.sum() + (z * z).sum()).backward()
        results.append(grads([a, b] + list(w.parameters())))
    assert_same_grads(results[1], results[0])


# -- what the tape holds ------------------------------------------------------------
def test_one_record_per_segment_saving_only_its_inputs():
    blocks, _ = chain(6, 4, 0.0)
    x = randn(3, 4, requires_grad=True)
    recorded = tape.Tape()
    with tape.recording(recorded):
        y = checkpoint_sequential(blocks, 3, x)
        nodes = recorded.nodes()
        assert [n.name for n in nodes] == ["Checkpoint"] * 3
        assert all(n.ctx.saved_nbytes == 3 * 4 * 8 for n in nodes)  # one (3, 4) float64 input each
        assert "Checkpoint" in repr(recorded)
        (y * y).sum().backward()
    assert all(n.freed for n in nodes)
    assert x.grad is not None


def test_saved_activations_are_only_the_inputs_and_recompute_is_freed():
    blocks, _ = chain(8, 16, 0.0)
    x = randn(4, 16)
    before = memory.current()["activations"]
    y = checkpoint_sequential(blocks, "every", x)
    loss = (y * y).sum()
    # 8 records, each saving its (4, 16) float64 input (the first one is x),
    # plus Mul's saved y: 9 buffers of 512 bytes.
    assert memory.current()["activations"] - before == 9 * 4 * 16 * 8
    with memory.timeline() as events:
        loss.backward()
    assert any(e["phase"] == "recompute" for e in events)
    assert memory.current()["activations"] == before


@pytest.mark.parametrize("options", [dict(), dict(early_stop=False), dict(policy="save_matmuls")],
                         ids=["planned", "plain", "policy"])
def test_a_segment_goes_with_its_record_without_the_cycle_collector(options):
    """Nothing a segment holds points back at it (the planned recompute holds the segment, never the
    reverse), so what it holds (its input tensors) is freed as soon as its record is: memory figures
    taken during backward depend on it."""
    x = randn(4, 16)
    w = Tensor(numpy.ones((16, 16)), requires_grad=True)
    y = checkpoint(lambda v: (v @ w).tanh() * 2.0, x * 1.0, **options)
    ctx = y._node.ctx
    segment, path = weakref.ref(ctx.segment), weakref.ref(ctx.path)
    del ctx
    gc.disable()
    try:
        y.sum().backward()
        del y
        assert segment() is None and path() is None
    finally:
        gc.enable()


def test_policy_keeps_results_as_saved_activations_of_the_record():
    blocks, _ = chain(1, 4, 0.0)
    x = randn(3, 4)
    plain = checkpoint(blocks[0], x)
    kept = checkpoint(blocks[0], x, policy=policies.save_matmuls)
    # save_matmuls keeps Linear's (3, 4) output; its saved x is the input
    # (kept once) and its weight a parameter (not an activation).
    assert plain._node.ctx.saved_nbytes == 3 * 4 * 8
    assert kept._node.ctx.saved_nbytes == 2 * 3 * 4 * 8


def test_save_matmuls_does_not_recompute_matmuls(monkeypatch):
    model, gen = tiny_gpt(2, 0.1)
    calls = {"Linear": 0, "MatMul": 0}
    for name in calls:
        op = getattr(matmul, name)
        original = op.forward

        def counting(ctx, *arrays, _original=original, _name=name, **options):
            calls[_name] += 1
            return _original(ctx, *arrays, **options)

        monkeypatch.setattr(op, "forward", staticmethod(counting))
    idx = numpy.zeros((2, 8), dtype=numpy.int64)
    counts = {}
    for policy in (None, policies.save_matmuls, policies.selective_attention):
        model.gradient_checkpointing_enable("every", policy=policy)
        _, loss = model(idx, idx)
        forward = dict(calls)
        loss.backward()
        counts[policy] = {k: calls[k] - forward[k] for k in calls}  # forward runs in backward
        for k in calls:
            calls[k] = 0
    # Per block: 4 Linear, 2 MatMul. Without a policy the recompute runs all but the block's
    # last Linear again: it saved only its input (GELU's output) and its weight, and what
    # follows it (dropout, whose mask is an input, and the residual add) needs its result
    # in no saved array, so its record is rebuilt without running it. save_matmuls runs
    # none; selective_attention only the attention core's two MatMuls.
    assert counts[None] == {"Linear": 6, "MatMul": 4}
    assert counts[policies.save_matmuls] == {"Linear": 0, "MatMul": 0}
    assert counts[policies.selective_attention] == {"Linear": 0, "MatMul": 4}


def test_offload_moves_kept_arrays_to_the_host_on_a_device(array_backend):
    blocks, _ = chain(1, 4, 0.0)
    x = randn(3, 4)
    saved = checkpoint(blocks[0], x, policy=policies.save_matmuls)._node.ctx.saved_nbytes
    strict_cupy.reset_transfers()
    y = checkpoint(blocks[0], x, policy=policies.offload_matmuls)
    if x.device == "cpu":  # NumPy: nothing to offload to, "offload" is "save"
        assert y._node.ctx.saved_nbytes == saved
    else:  # the kept Linear output waits on the host: the record holds only the input
        assert y._node.ctx.saved_nbytes == 3 * 4 * 8
        if array_backend == "strict":
            assert strict_cupy.transfers["device_to_host"] == 1
    (y * y).sum().backward()
    if array_backend == "strict":
        assert strict_cupy.transfers["host_to_device"] == 1  # and comes back for backward


# -- parameters when the input needs no gradient; nesting ---------------------------
@pytest.mark.equivalence
def test_parameters_get_gradients_when_the_input_does_not_require_grad():
    blocks, _ = chain(4, 3, 0.0)
    params = params_of(blocks)
    x = randn(2, 3)  # data: requires_grad=False
    results = []
    for segs in (None, 2):
        zero(params)
        y = run_chain(blocks, x, segs)
        if segs is not None:
            assert y._node is not None and y._node.name == "Checkpoint"  # recorded all the same
        (y * y).sum().backward()
        results.append(grads(params))
    assert all(g is not None for g in results[1])
    assert_same_grads(results[1], results[0])
    assert x.grad is None


def test_nothing_recorded_when_nothing_inside_needs_a_gradient():
    w = Tensor(numpy.ones((2, 2)))
    y = checkpoint(lambda x: x @ w, randn(3, 2))
    assert y._node is None and not y.requires_grad


def test_requires_grad_of_each_output_is_what_it_would_be_without_checkpoint():
    x, k = randn(3, requires_grad=True), randn(3, seed=1)
    layer = nn.Linear(3, 3, dtype=F64, rng=numpy.random.default_rng(2))

    def fn(x, k):
        return x * 2.0, k * 3.0, layer(k), (k * k).sum()

    plain = fn(x, k)
    checkpointed = checkpoint(fn, x, k)
    assert [o.requires_grad for o in checkpointed] == [o.requires_grad for o in plain] == [True, False, True, False]
    for o in (plain[1], checkpointed[1], plain[3], checkpointed[3]):
        assert o.grad_fn is None
        with pytest.raises(RuntimeError, match="backward\\(\\) on a tensor that does not require grad"):
            o.sum().backward()
    (checkpointed[0].sum() + checkpointed[2].sum()).backward()
    numpy.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0, 2.0])
    numpy.testing.assert_allclose(layer.bias.grad.numpy(), [1.0, 1.0, 1.0])


def test_outputs_that_depend_on_no_gradient_record_nothing():
    layer = nn.Linear(2, 2, dtype=F64, rng=numpy.random.default_rng(0))
    t = tape.Tape()
    with tape.recording(t):
        y = checkpoint(lambda h: layer(h).detach() * 2.0, randn(2, 2))  # reads parameters, depends on none
    assert not y.requires_grad and len(t) == 0
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.sum().backward()


SEGMENTS_WITH_SCALARS = {
    "to a scalar": lambda x, w: ((x * w).tanh() * x).sum(),
    "through a scalar": lambda x, w: x.exp() * (x * w).mean(),
    "scalar steps": lambda x, w: ((x * w).sum() * (x.max() + 1.0)).exp().log() / (w.sum() * w.sum() + 1.0),
}


@settings(max_examples=10)
@given(shape=st.sampled_from([(), (1,), (3,), (2, 3)]), segment=st.sampled_from(list(SEGMENTS_WITH_SCALARS)),
       policy=st.sampled_from(POLICIES), seed=st.integers(0, 2**16))
@example(shape=(), segment="to a scalar", policy=policies.everything_saveable, seed=0)
@example(shape=(), segment="scalar steps", policy=policies.everything_saveable, seed=1)
@example(shape=(2, 3), segment="scalar steps", policy=policies.everything_saveable, seed=2)
def test_scalar_tensors_in_a_segment_with_every_policy(shape, segment, policy, seed):
    fn = SEGMENTS_WITH_SCALARS[segment]
    results = []
    for use in (False, True):
        x, w = randn(*shape, seed=seed, requires_grad=True), randn(*shape, seed=seed + 1, requires_grad=True)
        y = checkpoint(fn, x, w, policy=policy) if use else fn(x, w)
        (y * y).sum().backward()  # the output used twice
        results.append(grads([x, w]) + [y.numpy()])
    assert_same_grads(results[1], results[0])


@pytest.mark.equivalence
def test_nested_checkpoints():
    blocks, drop_rng = chain(6, 3, 0.25)
    params = params_of(blocks)
    x = randn(2, 3, requires_grad=True)

    def inner(h, part):
        return checkpoint_sequential(part, 3, h)

    def outer(h):
        h = checkpoint(inner, h, blocks[:3])
        return checkpoint(inner, h, blocks[3:])

    start = drop_rng.bit_generator.state
    results = []
    for nested in (False, True):
        drop_rng.bit_generator.state = start
        zero(params + [x])
        recorded = tape.Tape()
        with tape.recording(recorded):
            y = checkpoint(outer, x) if nested else run_chain(blocks, x)
            if nested:
                assert [n.name for n in recorded.nodes()] == ["Checkpoint"]
            (y * y).sum().backward()
        results.append((grads(params + [x]), drop_rng.bit_generator.state))
    assert_same_grads(results[1][0], results[0][0])
    assert results[1][1] == results[0][1]


def test_backward_twice_with_retain_graph():
    for policy in (None, policies.save_matmuls):
        blocks, _ = chain(2, 3, 0.0)
        x = randn(2, 3, requires_grad=True)
        loss = (checkpoint_sequential(blocks, 2, x, policy=policy) ** 2).sum()
        loss.backward(retain_graph=True)
        once = x.grad.numpy().copy()
        loss.backward()
        numpy.testing.assert_allclose(x.grad.numpy(), 2 * once, rtol=RTOL64)


# -- random generators and stateful layers ------------------------------------------
@pytest.mark.equivalence
def test_default_generator_left_where_it_would_have_been():
    blocks = [nn.Sequential(nn.Linear(4, 4, dtype=F64, rng=numpy.random.default_rng(i)), nn.Dropout(0.5))
              for i in range(3)]
    states, results = [], []
    for segs in (None, "every"):
        random.manual_seed(7)
        zero(params_of(blocks))
        (run_chain(blocks, randn(5, 4), segs) ** 2).sum().backward()
        results.append(grads(params_of(blocks)))
        states.append(random.default_generator.bit_generator.state)
    assert_same_grads(results[1], results[0])
    assert states[1] == states[0]


def test_without_preserve_rng_state_masks_differ_and_the_values_check_says_so():
    block = nn.Sequential(nn.Linear(8, 8, dtype=F64, rng=numpy.random.default_rng(0)), nn.Dropout(0.5))
    x = randn(16, 8, requires_grad=True)
    y = checkpoint(block, x, preserve_rng_state=False, determinism_check="values")
    with pytest.raises(RuntimeError, match=r"recompute of segment 'Sequential' gave other values for output 0"):
        y.sum().backward()


@pytest.mark.equivalence
def test_batchnorm_running_stats_updated_once():
    def make():
        init = numpy.random.default_rng(0)
        return nn.Sequential(nn.Linear(3, 4, dtype=F64, rng=init), nn.BatchNorm1d(4, dtype=F64), nn.Tanh())

    plain, ckpt = make(), make()
    x = randn(6, 3)
    (plain(x) ** 2).sum().backward()
    seen = []

    class Spy(nn.Module):
        def forward(self, h):
            seen.append(is_recomputing())
            return h

    (checkpoint(nn.Sequential(ckpt, Spy()), x) ** 2).sum().backward()
    assert seen == [False, True]  # the forward, then the recompute
    for name in ("running_mean", "running_var"):
        numpy.testing.assert_allclose(getattr(ckpt[1], name).numpy(), getattr(plain[1], name).numpy(), rtol=RTOL64)
    assert_same_grads(grads(list(ckpt.parameters())), grads(list(plain.parameters())))


# -- errors ---------------------------------------------------------------------------
def test_recompute_with_another_shape_is_an_error_naming_the_segment():
    calls = []

    def shifty(x):
        calls.append(1)
        return x[: len(calls)] * 2.0

    y = checkpoint(shifty, randn(3, 2, requires_grad=True))
    with pytest.raises(RuntimeError, match=r"recompute of segment 'test_recompute_with_another_shape.*shifty' "
                                           r"returned output 0 with shape \(2, 2\).*forward returned shape \(1, 2\)"):
        y.sum().backward()


def test_recompute_with_another_dtype_is_an_error():
    calls = []

    def caster(x):
        calls.append(1)
        return x * 2.0 if len(calls) == 1 else (x * 2.0).to(numpy.float32)

    y = checkpoint(caster, randn(3, requires_grad=True), early_stop=False)
    # The recompute calls one op more than the forward (the cast): caught as it is called.
    with pytest.raises(RuntimeError, match=r"recompute of segment '.*caster' ran Cast as op #1, where its forward "
                                           r"ran nothing more"):
        y.sum().backward()


def test_early_stop_never_checks_what_it_did_not_need_to_run():
    # With early stop (the default, as PyTorch's) the recompute stops once backward has what it
    # needs; an op after that point that differs (here the extra cast) is neither run nor checked.
    calls = []

    def caster(x):
        calls.append(1)
        y = (x * 2.0).exp()
        return y if len(calls) == 1 else y.to(numpy.float32)

    x = randn(3, requires_grad=True)
    checkpoint(caster, x).sum().backward()
    numpy.testing.assert_allclose(x.grad.numpy(), 2.0 * numpy.exp(2.0 * x.numpy()))


def test_input_modified_in_place_is_an_error():
    x = randn(2, 3, requires_grad=True)
    h = x * 1.0
    y = checkpoint(lambda t: t.tanh(), h)
    h.add_(1.0)
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation: \[float64 tensor of shape \(2, 3\)\], "
                                           r"which is input 0 of checkpoint segment '.*', in Checkpoint \(record #\d+ "
                                           r"on the tape\), is at version 1; expected version 0 instead"):
        y.sum().backward()


def test_parameter_modified_in_place_is_an_error():
    layer = nn.Linear(3, 3, dtype=F64, rng=numpy.random.default_rng(0))
    y = checkpoint(layer, randn(2, 3))
    with no_grad():  # as an optimizer step does
        layer.weight.mul_(0.5)
    with pytest.raises(RuntimeError, match=r"\[float64 tensor of shape \(3, 3\)\], which is a parameter read by "
                                           r"checkpoint segment 'Linear' \(call backward before optimizer.step\(\)\)"):
        y.sum().backward()


def test_bad_policy_decision_is_an_error():
    with pytest.raises(ValueError, match=r"returned 'keep' for op Mul; a policy returns 'save', 'recompute' or 'offload'"):
        checkpoint(lambda x: x * 2.0, randn(2, requires_grad=True), policy=lambda op: "keep")


def test_policy_replay_of_other_ops_is_an_error():
    calls = []

    def changing(x):
        calls.append(1)
        return x.exp() if len(calls) == 1 else x.tanh()

    y = checkpoint(changing, randn(3, requires_grad=True), policy=policies.save_matmuls)
    with pytest.raises(RuntimeError, match=r"ran Tanh as op #0, where its forward ran Exp"):
        y.sum().backward()


def test_bad_segments_are_clear_errors():
    model = MLP(2, 2, 2, n_layers=3)
    with pytest.raises(ValueError, match=r"segments must be between 1 and the number of layers \(3\), got 5"):
        model.gradient_checkpointing_enable(5)
    with pytest.raises(ValueError, match=r"boundaries must increase strictly from 0 to the number of layers \(3\)"):
        model.gradient_checkpointing_enable([0, 2, 2])
    with pytest.raises(ValueError, match=r"segments must be 'sqrt', 'every', an int.*got 'half'"):
        model.gradient_checkpointing_enable("half")  # a string, but not one of the names: its value is wrong
    with pytest.raises(TypeError, match=r"segments must be an int, 'sqrt', 'every'.*got 2.5"):
        model.gradient_checkpointing_enable(2.5)
    model.gradient_checkpointing_enable(numpy.int64(3))  # NumPy's integers are integers
    assert model.checkpoint_segments == 3
    with pytest.raises(TypeError, match=r"unknown checkpoint policy 3"):
        model.gradient_checkpointing_enable(policy=3)
    gpt, _ = tiny_gpt(2, 0.0)
    gpt.gradient_checkpointing_enable(4, split_blocks=True)  # 2 blocks: 4 halves
    assert len(gpt.checkpoint_chain()) == 4
    with pytest.raises(ValueError, match=r"number of layers \(2\), got 4"):
        gpt.gradient_checkpointing_enable(4)
    assert gpt.checkpoint_split_blocks and gpt.checkpoint_segments == 4  # a refused call changed nothing
    gpt.gradient_checkpointing_disable()
    assert len(gpt.checkpoint_chain()) == 2



# -- one switch for every chain of layers --------------------------------------------------
@pytest.mark.equivalence
def test_sequential_has_the_same_switch_as_the_models():
    blocks, _ = chain(depth=6, width=5, p_drop=0.0)
    model, x = nn.Sequential(*blocks), randn(3, 5, requires_grad=True)
    assert isinstance(model, ChainCheckpointing) and isinstance(MLP(2, 2, 2, 1), ChainCheckpointing)
    results, peaks = [], []
    for segments in (None, "sqrt", "every"):
        if segments is None:
            model.gradient_checkpointing_disable()
        else:
            model.gradient_checkpointing_enable(segments)
        zero(list(model.parameters()) + [x])
        base = memory.current()["activations"]
        with memory.timeline() as events:
            (model(x) ** 2).sum().backward()
        peaks.append(max(e["activations"] for e in events) - base)
        results.append(grads(list(model.parameters()) + [x]))
        assert any(e["phase"] == "recompute" for e in events) == (segments is not None)
    assert_same_grads(results[1], results[0])
    assert_same_grads(results[2], results[0])
    assert peaks[1] < peaks[0] and peaks[2] < peaks[0]  # checkpointed: less held at once
    with pytest.raises(ValueError, match=r"number of layers \(6\), got 7"):
        model.gradient_checkpointing_enable(7)
    assert model.checkpoint_segments == "every"  # a refused call changed nothing
    with pytest.raises(ValueError, match="policy"):
        model.gradient_checkpointing_enable("sqrt", policy="no such policy")
    assert model.checkpoint_segments == "every" and model.checkpoint_policy is None


@pytest.mark.equivalence
def test_a_model_of_your_own_gets_the_switch_by_naming_its_chain():
    class Tower(ChainCheckpointing, nn.Module):  # a user's model: two Linear layers with a Tanh between
        def __init__(self):
            super().__init__()
            rng = numpy.random.default_rng(0)
            self.a, self.b = nn.Linear(4, 4, dtype=F64, rng=rng), nn.Linear(4, 4, dtype=F64, rng=rng)

        def checkpoint_chain(self):
            return [self.a, lambda h: h.tanh(), self.b]

        def forward(self, x):
            return self.run_chain(x).sum()

    tower, x = Tower(), randn(3, 4)
    results = []
    for segments in (None, [0, 2]):
        zero(tower.parameters())
        if segments is not None:
            tower.gradient_checkpointing_enable(segments, policy="save_matmuls")
        with memory.timeline() as events:
            tower(x).backward()
        results.append(grads(list(tower.parameters())))
    assert_same_grads(results[1], results[0])
    assert any(e["phase"] == "recompute" for e in events)
    with pytest.raises(NotImplementedError, match="checkpoint_chain"):
        type("NoChain", (ChainCheckpointing,), {})().gradient_checkpointing_enable()


# -- memory of a deep chain --------------------------------------------------------------
def peak_activations(step):
    """The highest saved-activation bytes at any op of step() (the timeline has one point per op)."""
    with memory.timeline() as events:
        step()
    return max(e["activations"] for e in events)


def test_sqrt_segments_on_a_64_layer_mlp_keep_at_most_30_percent():
    model = MLP(32, 32, 32, n_layers=64, rng=numpy.random.default_rng(0))
    x, target = randn(8, 32, dtype=numpy.float32), randn(8, 32, seed=1, dtype=numpy.float32)

    def step():
        model.zero_grad()
        F.mse_loss(model(x), target).backward()

    base = memory.current()["activations"]
    full = peak_activations(step) - base
    model.gradient_checkpointing_enable("sqrt")
    sqrt = peak_activations(step) - base
    model.gradient_checkpointing_disable()
    assert sqrt <= 0.30 * full, (sqrt, full)
    assert peak_activations(step) - base == full  # disable puts it back


@settings(deadline=None)
@given(depth=st.integers(3, 6), segments=st.sampled_from([1, 2, 3, "sqrt", "every"]))
def test_checkpoint_sequential_takes_a_sequential_as_its_layers_in_order(depth, segments):
    """PyTorch's checkpoint_sequential takes an nn.Sequential; ours gives what the list of its layers gives."""
    blocks, _ = chain(depth, 5, 0.0)
    model = nn.Sequential(*blocks)
    results = []
    for functions in (blocks, model):
        zero(params_of(blocks))
        x = randn(3, 5, requires_grad=True)
        y = checkpoint_sequential(functions, segments, x)
        (y * y).sum().backward()
        results.append((y.numpy(), grads(params_of(blocks) + [x])))
    numpy.testing.assert_array_equal(results[1][0], results[0][0])
    assert_same_grads(results[1][1], results[0][1], rtol=0, atol=0)
