"""GradScaler's state (grad_scaler.py) and what the Trainer does with it (train.py), as PyTorch 2.13's
torch/amp/grad_scaler.py and Hugging Face's trainer.py behave:

1. the state of an iteration is kept per optimizer;
2. calls out of order (step twice, update with nothing checked, a {} state) are PyTorch's errors;
3. a checkpoint's scaler state is checked before anything is restored, and a damaged one is skipped;
4. the Trainer's schedule does not advance on a skipped step, which is counted and logged;
5. with fp16 and anomaly mode, an overflow in the scaled backward is the scaler's to skip; a NaN from finite
   gradients is still an anomaly.

Expected values come from a small reference written here (PyTorch's rules as its source states them), never
from the code under test.
"""

import contextlib
import io
import math
import shutil
import tempfile
from pathlib import Path

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, autograd
from tinygrad_ckpt.autocast import autocast
from tinygrad_ckpt.function import Function
from tinygrad_ckpt.grad_scaler import STATE_FIELDS, GradScaler, state_problem
from tinygrad_ckpt.nn import GPT, GPTConfig
from tinygrad_ckpt.optim import SGD
from tinygrad_ckpt.serialization import CheckpointFileError
from tinygrad_ckpt.train import Trainer, TrainingArguments, get_learning_rate, sorted_checkpoints, verify_checkpoint

from .conftest import examples

V, T = 11, 8  # vocabulary, block size


def tiny_gpt(seed=0):
    config = GPTConfig(block_size=T, vocab_size=V, n_layer=1, n_head=2, n_embd=16, dropout=0.0)
    return GPT(config, rng=numpy.random.default_rng(seed))  # float32: what fp16 mixed precision keeps


def examples_of(n=24, seed=0):
    rng = numpy.random.default_rng(seed)
    return [{"input_ids": rng.integers(0, V, T), "labels": rng.integers(0, V, T)} for _ in range(n)]


def training_args(**kw):
    base = dict(per_device_train_batch_size=4, learning_rate=1e-2, logging_steps=1, disable_tqdm=True, seed=3)
    return TrainingArguments(**{**base, **kw})


def parameter(values):
    p = Tensor(numpy.zeros(len(values)), dtype=numpy.float32, requires_grad=True)
    p.grad = Tensor(numpy.asarray(values, numpy.float32))
    return p


# -- 1. state per optimizer ------------------------------------------------------------------
gradient_values = st.lists(st.sampled_from([1.0, -2.0, 0.5, 3.0, math.inf, -math.inf, math.nan]), min_size=1,
                           max_size=4)


@settings(max_examples=examples(40), deadline=None)
@given(grads=st.lists(gradient_values, min_size=2, max_size=3), unscaled_first=st.sets(st.integers(0, 2)),
       k=st.integers(0, 12))
def test_each_optimizer_is_unscaled_checked_and_stepped_on_its_own(grads, unscaled_first, k):
    """Whichever optimizers were unscaled by hand, step(opt) unscales the others itself and skips exactly those
    whose own gradients held inf or NaN; update() backs off if any did."""
    scale, lr = 2.0**k, 0.5
    params = [parameter([g * scale for g in values]) for values in grads]
    optimizers = [SGD([p], lr=lr) for p in params]
    scaler = GradScaler(init_scale=scale)
    for i in sorted(unscaled_first):
        if i < len(optimizers):
            scaler.unscale_(optimizers[i])
    for values, p, opt in zip(grads, params, optimizers):
        bad = not all(math.isfinite(v) for v in values)
        assert scaler.step(opt) == (not bad)
        unscaled = numpy.float32(numpy.asarray(values, numpy.float32) * numpy.float32(scale)) * numpy.float32(1 / scale)
        numpy.testing.assert_array_equal(p.grad.data, unscaled)  # divided by the scale, once
        expected = numpy.zeros(len(values), numpy.float32) if bad else -numpy.float32(lr) * unscaled
        numpy.testing.assert_array_equal(p.data, expected)
    scaler.update()
    any_bad = any(not math.isfinite(v) for values in grads for v in values)
    assert scaler.get_scale() == (scale * 0.5 if any_bad else scale)


# -- 2. calls out of order ---------------------------------------------------------------------
@settings(max_examples=examples(60), deadline=None)
@given(calls=st.lists(st.tuples(st.sampled_from(["unscale_", "step", "update"]), st.integers(0, 1)), max_size=12))
def test_calls_out_of_order_raise_pytorchs_errors(calls):
    """Any sequence of unscale_/step/update on two optimizers, against PyTorch's state machine (READY ->
    UNSCALED -> STEPPED per optimizer, update() back to READY and needs at least one inf check)."""
    params = [parameter([1.0, 2.0]), parameter([3.0])]
    optimizers = [SGD([p], lr=0.1) for p in params]
    scaler = GradScaler(init_scale=4.0)
    stage = ["ready", "ready"]
    for name, i in calls:
        if name == "unscale_":
            expected = {"unscaled": "unscale_\\(\\) has already been called on this optimizer since the last "
                                    "update\\(\\)", "stepped": "unscale_\\(\\) is being called after step\\(\\)"}
            error, after = expected.get(stage[i]), "unscaled"
            call = lambda: scaler.unscale_(optimizers[i])  # noqa: E731
        elif name == "step":
            error = "step\\(\\) has already been called since the last update\\(\\)" if stage[i] == "stepped" else None
            after = "stepped"
            call = lambda: scaler.step(optimizers[i])  # noqa: E731
        else:
            error = "No inf checks were recorded prior to update" if stage == ["ready", "ready"] else None
            call = scaler.update
        if error is not None:
            with pytest.raises(RuntimeError, match=error):
                call()
            continue
        call()
        if name == "update":
            stage = ["ready", "ready"]
        else:
            stage[i] = after
        for p in params:  # a fresh scaled gradient for the next iteration, whatever happened to this one
            p.grad.data[...] = 4.0


def test_step_of_an_optimizer_without_gradients_says_so():
    p = Tensor(numpy.zeros(2), dtype=numpy.float32, requires_grad=True)
    with pytest.raises(RuntimeError, match="No inf checks were recorded for this optimizer"):
        GradScaler().step(SGD([p], lr=0.1))


def test_loading_a_disabled_scalers_state_says_what_it_is():
    saved = GradScaler(enabled=False).state_dict()
    assert saved == {}
    with pytest.raises(RuntimeError, match="saved from a disabled instance of GradScaler"):
        GradScaler().load_state_dict(saved)
    GradScaler(enabled=False).load_state_dict(saved)  # a disabled scaler loads nothing, as PyTorch's


# -- 3. a checked state ------------------------------------------------------------------------
valid_states = st.integers(1, 50).flatmap(lambda interval: st.fixed_dictionaries({
    "scale": st.floats(1e-30, 1e30), "growth_factor": st.floats(1.0, 100.0, exclude_min=True),
    "backoff_factor": st.floats(0.0, 1.0, exclude_min=True, exclude_max=True),
    "growth_interval": st.just(interval), "_growth_tracker": st.integers(0, interval - 1)}))

# (field, a value it must not have): not finite or not > 0, factors on the wrong side of 1, a count out of range,
# the wrong type
DAMAGE = {
    "scale": st.sampled_from([0.0, -1.0, math.nan, math.inf, "65536", None, True, [1.0]]),
    "growth_factor": st.one_of(st.floats(-10.0, 1.0), st.sampled_from([math.nan, math.inf, "2"])),
    "backoff_factor": st.one_of(st.floats(1.0, 10.0), st.floats(-10.0, 0.0), st.sampled_from([math.nan, "0.5"])),
    "growth_interval": st.one_of(st.integers(-5, 0), st.sampled_from([2.0, "2000", None, True])),
    "_growth_tracker": st.one_of(st.integers(-100, -1), st.sampled_from([0.5, "0", None])),
}


@st.composite
def damaged_states(draw):
    """(state, the field an error must name)."""
    state = dict(draw(valid_states))
    how = draw(st.sampled_from(["value", "missing", "unknown", "tracker at the interval"]))
    if how == "missing":
        field = draw(st.sampled_from(STATE_FIELDS))
        del state[field]
    elif how == "unknown":
        field = "_scale"
        state[field] = 1.0
    elif how == "tracker at the interval":  # never reached: update() resets it there; past it, no growth ever
        field = "_growth_tracker"
        state[field] = state["growth_interval"] + draw(st.integers(0, 5))
    else:
        field = draw(st.sampled_from(sorted(DAMAGE)))
        state[field] = draw(DAMAGE[field])
    return state, field


@settings(max_examples=examples(40), deadline=None)
@given(state=valid_states, resumed_scale_power=st.integers(-3, 3))
def test_a_reachable_state_passes_and_loads_exactly(state, resumed_scale_power):
    assert state_problem(state) is None
    scaler = GradScaler(init_scale=2.0**resumed_scale_power)
    scaler.load_state_dict(state)
    assert scaler.state_dict() == state


@settings(max_examples=examples(60), deadline=None)
@given(damaged=damaged_states())
def test_a_damaged_state_is_refused_naming_the_field(damaged):
    state, field = damaged
    problem = state_problem(state)
    assert problem is not None and repr(field)[1:-1] in problem
    scaler = GradScaler(init_scale=8.0)
    with pytest.raises(ValueError, match=repr(field)[1:-1]):
        scaler.load_state_dict(state)
    assert scaler.get_scale() == 8.0  # nothing was restored


@pytest.fixture(scope="module")
def fp16_run(tmp_path_factory):
    """An fp16 run with checkpoints at steps 2 and 4 (the scale backed off: it started too high on purpose)."""
    out = tmp_path_factory.mktemp("fp16_run")
    trainer = Trainer(tiny_gpt(), training_args(fp16=True, max_steps=4, save_steps=2, output_dir=str(out)),
                      examples_of())
    trainer.scaler = GradScaler(init_scale=2.0**17)
    trainer.train()
    assert [step for step, _ in sorted_checkpoints(out)] == [4, 2]
    return out


def _craft(path, scaler_state):
    from tinygrad_ckpt import serialization

    checkpoint = serialization.load(path)
    checkpoint["extra"]["grad_scaler"] = scaler_state
    serialization.save(path, model=checkpoint["model"], optimizer=checkpoint["optimizer"], extra=checkpoint["extra"])


@settings(max_examples=examples(8), deadline=None)
@given(damaged=st.one_of(damaged_states(), st.just(({}, "a disabled GradScaler saves"))))
def test_a_checkpoint_with_a_damaged_scaler_is_skipped_for_the_previous_one(fp16_run, damaged):
    """verify_checkpoint names the field; resuming from the directory falls back to checkpoint-2, as for any
    other damage, and goes on with checkpoint-2's scale."""
    state, field = damaged
    with tempfile.TemporaryDirectory() as where:
        out = Path(where) / "run"
        shutil.copytree(fp16_run, out)
        _craft(out / "checkpoint-4.npz", state)
        with pytest.raises(CheckpointFileError, match=f"'grad_scaler'.*{repr(field)[1:-1]}"):
            verify_checkpoint(out / "checkpoint-4.npz")
        resumed = Trainer(tiny_gpt(), training_args(fp16=True, max_steps=4, save_steps=2, output_dir=str(out)),
                          examples_of())
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            resumed.train(resume_from_checkpoint=True)
        assert resumed.resumed_from == out / "checkpoint-2.npz"
        assert f"resume: skipped {out / 'checkpoint-4.npz'}" in said.getvalue()
        kept = verify_checkpoint(out / "checkpoint-2.npz")["extra"]["grad_scaler"]
        assert kept["scale"] < 2.0**17  # the saved scale had backed off; the resumed run started from it


# -- 4. the schedule holds on a skipped step -------------------------------------------------------
class Poisoned(Trainer):
    """A Trainer whose loss is NaN on the optimizer steps in `bad` (1-based)."""

    def __init__(self, *args, bad=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.bad = set(bad)

    def compute_loss(self, batch):
        loss, items = super().compute_loss(batch)
        if self.state.global_step + 1 in self.bad:
            loss = loss * math.nan
        return loss, items


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@settings(max_examples=examples(8), deadline=None)
@given(bad=st.sets(st.integers(1, 6), max_size=3), schedule=st.sampled_from(["linear", "cosine"]),
       warmup=st.integers(0, 3))
def test_the_schedule_advances_only_on_steps_taken(bad, schedule, warmup):
    """The n-th step taken gets the schedule's n-th learning rate, however many were skipped before it
    (Hugging Face's trainer.py steps its scheduler only when optimizer_step_was_skipped is false); each skipped
    step is logged and counted."""
    args = training_args(max_steps=6, lr_scheduler_type=schedule, warmup_steps=warmup)
    trainer = Poisoned(tiny_gpt(), args, examples_of(), bad=bad)
    history = trainer.train()
    taken = [e for e in history if "learning_rate" in e]
    assert [e["step"] for e in taken] == [s for s in range(1, 7) if s not in bad]
    assert [e["learning_rate"] for e in taken] == [get_learning_rate(n, args, 6) for n in range(len(taken))]
    assert sorted(e["step"] for e in history if "skipped" in e) == sorted(bad)
    assert trainer.state.nonfinite_steps == len(bad) and trainer.state.global_step == 6


def test_an_fp16_runs_first_step_taken_is_the_first_of_the_warmup():
    """Started at a scale that overflows, the steps the scaler skips leave the warm-up where it was."""
    args = training_args(fp16=True, max_steps=8, warmup_steps=4)
    trainer = Trainer(tiny_gpt(), args, examples_of())
    trainer.scaler = GradScaler(init_scale=2.0**20)
    history = trainer.train()
    skipped = [e["step"] for e in history if "skipped" in e]
    taken = [e for e in history if "learning_rate" in e]
    assert skipped and taken, "both kinds of step, or this proves little"
    assert taken[0]["learning_rate"] == pytest.approx(args.learning_rate / 4)


# -- 5. anomaly mode under loss scaling --------------------------------------------------------------
def scaled_linear_loss(x, w, scale):
    with autocast("float16"):
        loss = F.linear(x, w).sum()  # the float16 product, summed in float32
    return loss * scale


@settings(max_examples=examples(20), deadline=None)
@given(k=st.integers(17, 30), values=st.lists(st.sampled_from([0.0, 0.5, 1.0, -2.0]), min_size=4, max_size=4))
def test_an_overflow_in_a_scaled_backward_is_the_scalers_not_an_anomaly(k, values):
    """d(scale * sum)/d(output) = scale > 65504 overflows in float16: anomaly mode says so, unless told the loss is
    scaled; then the scaler finds the inf (or the NaN an inf * 0 makes) and skips the step."""
    x = Tensor(numpy.asarray([values], numpy.float32))
    w = Tensor(numpy.ones((2, 4), numpy.float32), requires_grad=True)
    with numpy.errstate(over="ignore", invalid="ignore"):
        with autograd.detect_anomaly(), pytest.raises(RuntimeError, match="returned inf values"):
            scaled_linear_loss(x, w, 2.0**k).backward()
        w.grad = None
        with autograd.detect_anomaly(loss_scaling=True):
            scaled_linear_loss(x, w, 2.0**k).backward()
    assert not autograd.is_anomaly_enabled()
    scaler, opt = GradScaler(init_scale=2.0**k), SGD([w], lr=0.1)
    assert scaler.step(opt) is False
    numpy.testing.assert_array_equal(w.data, numpy.ones((2, 4), numpy.float32))


class NaNGradient(Function):
    """The identity, whose backward makes NaN where `mask` is set, from whatever finite gradient it receives."""

    @staticmethod
    def forward(ctx, x, mask=None):
        ctx.mask = mask
        return x.copy()

    @staticmethod
    def backward(ctx, grad):
        return numpy.where(ctx.mask, numpy.nan, grad).astype(grad.dtype)


@settings(max_examples=examples(20), deadline=None)
@given(mask=st.lists(st.booleans(), min_size=3, max_size=3).filter(any), k=st.integers(0, 12))
def test_a_nan_from_finite_gradients_is_still_an_anomaly_under_loss_scaling(mask, k):
    x = Tensor(numpy.ones(3, numpy.float32), requires_grad=True)
    with autograd.detect_anomaly(loss_scaling=True), pytest.raises(RuntimeError, match="NaNGradient .* returned nan"):
        (NaNGradient.apply(x, mask=numpy.asarray(mask)).sum() * 2.0**k).backward()


@settings(max_examples=examples(3), deadline=None)
@given(k=st.integers(18, 22))
def test_an_fp16_run_in_anomaly_mode_skips_overflows_and_matches_the_plain_run(k):
    """fp16 + detect_anomaly: steps whose scaled gradients overflow are skipped, not stopped; the parameters are
    those of the same run without anomaly mode, to the bit."""
    runs = []
    for anomaly in (False, True):
        trainer = Trainer(tiny_gpt(), training_args(fp16=True, max_steps=4, detect_anomaly=anomaly), examples_of())
        trainer.scaler = GradScaler(init_scale=2.0**k)
        history = trainer.train()
        runs.append(([e["step"] for e in history if "skipped" in e], [p.data.copy() for p in trainer.optimizer.params]))
    (plain_skipped, plain), (anomaly_skipped, checked) = runs
    assert plain_skipped and plain_skipped == anomaly_skipped
    for p, q in zip(plain, checked):
        numpy.testing.assert_array_equal(p, q)


def test_an_fp16_run_in_anomaly_mode_still_stops_at_a_nan():
    trainer = Trainer(tiny_gpt(), training_args(fp16=True, max_steps=2, detect_anomaly=True), examples_of())
    trainer.model.blocks[0].mlp.c_fc.weight.data[0, 0] = numpy.nan  # the first op that reads it makes NaN
    with pytest.raises(FloatingPointError, match="returned nan values"):
        trainer.train()
    assert trainer.state.global_step == 0 and not autograd.is_anomaly_enabled()
