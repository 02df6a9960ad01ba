"""Will it fit? The step run on the meta device against the same step on real arrays, and fit's table.

The meta run (fit.estimate_step, meta.py) is checked where it can be
measured: for many small configurations of the GPT, for the MLP and for a
model defined here, one real Trainer step is run and memory.py's peak, its
split by category and each category's highest value are compared with the
meta run's, to the byte; the meta device's own count against tracemalloc.
Then its shortcut (every batch size from two runs) is checked against running
each size, and fit's table and command line against their contract.
"""

import doctest
import gc
import io
import re
import sys
import time
import tracemalloc
from contextlib import contextmanager

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, activations, cli, fit, memory, meta, policies
from tinygrad_ckpt.data import stack_collate
from tinygrad_ckpt.nn import (
    CNN, GPT, MLP, CNNConfig, Encoder, EncoderConfig, GPTConfig, Linear, LSTMConfig, LSTMLanguageModel, Module,
)
from tinygrad_ckpt.saved import op_flops
from tinygrad_ckpt.schedules import revolve, segment_bounds
from tinygrad_ckpt.train import TrainingArguments, Trainer



# -- measuring one real step ----------------------------------------------------------------
@contextmanager
def every_check():
    """Each category's highest value at every check memory.py makes (the finest it measures)."""
    tracker = memory.tracker
    highest = dict(tracker.current)
    update = tracker._update_peak

    def checked():
        update()
        for c, v in tracker.current.items():
            highest[c] = max(highest[c], v)

    tracker._update_peak = checked
    try:
        yield highest
    finally:
        del tracker._update_peak


def trainer_for(config, batch, seq_len, dtype="float32", checkpointing=None, steps=1, accumulation_dtype=None,
                optim="adamw"):
    """A Trainer for one optimizer step of `steps` micro-batches of random tokens."""
    model = GPT(config, rng=numpy.random.default_rng(0), dtype=numpy.dtype(dtype))
    rng = numpy.random.default_rng(1)
    data = [{"input_ids": rng.integers(0, config.vocab_size, seq_len),
             "labels": rng.integers(0, config.vocab_size, seq_len)} for _ in range(batch * steps)]
    extra = {} if checkpointing is None else dict(gradient_checkpointing=True, gradient_checkpointing_kwargs=checkpointing)
    args = TrainingArguments(per_device_train_batch_size=batch, gradient_accumulation_steps=steps, max_steps=1,
                             disable_tqdm=True, logging_steps=0, optim=optim, accumulation_dtype=accumulation_dtype,
                             **extra)
    return Trainer(model, args, data)


def measure_step(*args, **kwargs):
    """(peak, its split, each category's highest) of one Trainer.train() step, as memory.py counts them,
    less what lived before the model was made (arrays other tests may keep)."""
    gc.collect()
    before = memory.current()
    trainer = trainer_for(*args, **kwargs)
    with every_check() as highest:
        trainer.train()
    peak, split = memory.peak()
    return (peak - sum(before.values()), {c: split[c] - before[c] for c in split},
            {c: highest[c] - before[c] for c in highest})


def walk(config, batch, seq_len, dtype="float32", checkpointing=None, steps=1, accumulation_dtype=None,
         optim="adamw", device="cpu"):
    """fit.gpt_step, the step on the meta device, with measure_step's arguments."""
    return fit.gpt_step(config, batch, seq_len, dtype=dtype, checkpointing=checkpointing,
                        accumulation_dtype=accumulation_dtype, optim=optim, device=device)


# -- drawing small configurations ------------------------------------------------------------------
@st.composite
def configurations(draw, max_layers=4, max_seq=6):
    n_head, head_size, n_layer = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, max_layers))
    seq_len = draw(st.integers(1, max_seq))
    return GPTConfig(block_size=seq_len + draw(st.integers(0, 2)), vocab_size=draw(st.integers(2, 40)), n_layer=n_layer,
                     n_head=n_head, n_embd=n_head * head_size, dropout=draw(st.sampled_from([0.0, 0.1])),
                     bias=draw(st.booleans()), tie_weights=draw(st.booleans())), seq_len


@st.composite
def checkpointing(draw, n_layer):
    """GPT.gradient_checkpointing_enable's arguments (as gradient_checkpointing_kwargs), or None."""
    kind = draw(st.sampled_from(["none", "every", "sqrt", "count", "selective", "plan", "nested"]))
    if kind == "none":
        return None
    split = draw(st.booleans())
    n = n_layer * (2 if split else 1)
    out = {"split_blocks": split}
    if kind in ("every", "sqrt"):
        out["segments"] = kind
    elif kind == "count":
        out["segments"] = draw(st.integers(1, n))
    elif kind == "selective":
        out.update(segments=draw(st.sampled_from(["every", "sqrt"])), policy="selective_attention")
    elif kind == "plan":  # cut anywhere, each segment checkpointed or stored
        cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=3))) if n > 1 else []
        bounds = [0] + cuts + [n]
        out["segments"] = [(a, b, draw(st.booleans())) for a, b in zip(bounds, bounds[1:])]
    else:  # Griewank's revolve: some layers recomputed more than once
        out["segments"] = revolve(n, draw(st.integers(0, max(0, n - 2)))) if n > 1 else "every"
    return out


# -- 1. the meta run is the real step, to the byte --------------------------------------------------------
@given(st.data())
def test_the_meta_step_is_the_real_step_to_the_byte(data):
    config, seq_len = data.draw(configurations())
    case = dict(batch=data.draw(st.integers(1, 3)), seq_len=seq_len, dtype=data.draw(st.sampled_from(["float32", "float64"])),
                checkpointing=data.draw(checkpointing(config.n_layer)), steps=data.draw(st.integers(1, 2)),
                accumulation_dtype=data.draw(st.sampled_from([None, "float64"])),
                optim=data.draw(st.sampled_from(["adamw", "sgd"])))
    peak, split, highest = measure_step(config, **case)
    predicted = walk(config, **case)
    assert predicted.peak_bytes == peak, (config, case)
    assert predicted.at_peak == split, (config, case)
    assert predicted.highest == highest, (config, case)


@pytest.mark.parametrize("checkpointing", [None, {"segments": "every"}, {"segments": "sqrt"},
                                           {"segments": "every", "policy": "selective_attention", "split_blocks": True}])
def test_a_step_of_several_micro_batches_peaks_as_one(checkpointing):
    """Each micro-batch starts where the last began (its gradients are in the buffers): the same peak."""
    config = GPTConfig(block_size=6, vocab_size=11, n_layer=3, n_head=2, n_embd=8)
    one = measure_step(config, 2, 6, checkpointing=checkpointing, steps=1)
    three = measure_step(config, 2, 6, checkpointing=checkpointing, steps=3)
    assert one == three
    assert walk(config, 2, 6, checkpointing=checkpointing).peak_bytes == three[0]


def test_the_meta_step_and_the_activation_formulas_agree():
    """Two derivations of the saved activations: the meta step's highest and activations.chain_peak."""
    s, b, h, a, V = 5, 2, 12, 3, 17
    for n_layer, dropout, itemsize, split, selective, segments in [
            (3, 0.1, 4, False, False, None), (4, 0.0, 8, False, False, "sqrt"), (4, 0.1, 4, True, False, "every"),
            (3, 0.1, 8, True, True, "every"), (5, 0.1, 4, False, True, "every"), (6, 0.0, 4, False, False, revolve(6, 1)),
            (4, 0.1, 4, True, False, [(0, 3, True), (3, 5, False), (5, 8, True)])]:
        config = GPTConfig(block_size=s, vocab_size=V, n_layer=n_layer, n_head=a, n_embd=h, dropout=dropout)
        n = n_layer * (2 if split else 1)
        inputs, held = activations.gpt_chain(n_layer, s, b, h, a, dropout > 0, split, selective, itemsize)
        bounds = segment_bounds(n, segments) if segments is not None else [(0, n, False)]
        formula = activations.chain_peak(activations.gpt_embedding(s, b, h, dropout > 0), inputs, held,
                                         activations.gpt_head(s, b, h, V, itemsize), bounds)
        checkpointing = None if segments is None else dict(segments=segments, split_blocks=split,
                                                           policy="selective_attention" if selective else None)
        ran = fit.gpt_step(config, b, s, dtype="float32" if itemsize == 4 else "float64", checkpointing=checkpointing)
        assert ran.highest["activations"] == formula, (n_layer, split, selective, segments)


# -- 2. the shortcut: two runs give every batch size --------------------------------------------------------
@settings(max_examples=20)
@given(st.data())
def test_two_runs_give_every_batch_size(data):
    config, seq_len = data.draw(configurations(max_layers=8))
    ck = data.draw(checkpointing(config.n_layer))
    kw = dict(checkpointing=ck, accumulation_dtype=data.draw(st.sampled_from([None, "float64"])))
    profile = fit.profile_gpt(config, seq_len, **kw)
    for batch in (1, 3, 7, 20):
        direct, from_profile = fit.gpt_step(config, batch, seq_len, **kw), profile.at(batch)
        assert (from_profile.peak_bytes, from_profile.at_peak, from_profile.highest, from_profile.device_peak_bytes,
                from_profile.recomputed_flops, from_profile.forward_flops) == (
            direct.peak_bytes, direct.at_peak, direct.highest, direct.device_peak_bytes, direct.recomputed_flops,
            direct.forward_flops)
    limit = profile.at(5).device_peak_bytes + data.draw(st.integers(0, 1000))
    largest = profile.largest_batch(limit)
    assert fit.gpt_step(config, largest, seq_len, **kw).device_peak_bytes <= limit
    assert fit.gpt_step(config, largest + 1, seq_len, **kw).device_peak_bytes > limit


def traced(trainer):
    """tracemalloc's peak over trainer.train(): every NumPy buffer and Python object the step makes."""
    gc.collect()
    tracemalloc.start()
    try:
        trainer.train()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("checkpointing", [None, {"segments": "every", "policy": "selective_attention",
                                                 "split_blocks": True}])
def test_the_meta_device_sees_every_buffer_the_step_makes(checkpointing):
    """memory.py's peak <= tracemalloc's (every NumPy buffer) <= the meta device's peak + Python objects.

    The Python objects (tensors, tape records) are measured apart, on the
    same model with tiny arrays; the arrays here are 256 KiB and more, so an
    array the meta device missed would show. (NumPy may reuse a temporary's
    buffer for the next result, which the meta device does not: an upper bound.)
    """
    big = GPTConfig(block_size=64, vocab_size=1000, n_layer=2, n_head=4, n_embd=256)
    tiny = GPTConfig(block_size=4, vocab_size=10, n_layer=2, n_head=2, n_embd=8)
    seen, predicted = traced(trainer_for(big, 4, 64, checkpointing=checkpointing)), walk(big, 4, 64, checkpointing=checkpointing)
    objects, tiny_predicted = traced(trainer_for(tiny, 1, 4, checkpointing=checkpointing)), walk(tiny, 1, 4, checkpointing=checkpointing)
    objects -= tiny_predicted.device_peak_bytes - sum(tiny_predicted.start.values())
    start = sum(predicted.start.values())
    assert predicted.peak_bytes - start <= seen <= predicted.device_peak_bytes - start + objects + 64 * 1024


# -- any model: the MLP, and one defined here ---------------------------------------------------------------
class ResidualClassifier(Module):
    """A model fit has never heard of: LayerNorm, a residual feed-forward with dropout, a head."""

    def __init__(self, width, classes, device=None, rng=None):
        super().__init__()
        self.up = Linear(width, 3 * width, device=device, rng=rng)
        self.down = Linear(3 * width, width, device=device, rng=rng)
        self.head = Linear(width, classes, device=device, rng=rng)

    def forward(self, x):
        h = F.layer_norm(x, (x.shape[-1],))
        x = x + F.dropout(self.down(F.gelu(self.up(h))), 0.1, training=self.training)
        return self.head(x)


def classification_loss(model, batch):
    """(sum of the cross-entropies, items): the Trainer's compute_loss_func for x -> class logits."""
    x = Tensor(batch["x"], device=model.head.weight.device)
    return F.cross_entropy(model(x), batch["y"], reduction="sum"), len(batch["y"])


def real_step(model, batch, features, args):
    """(peak, its split, each category's highest) of one Trainer step of `model` on real arrays."""
    rng = numpy.random.default_rng(2)
    data = [{"x": rng.standard_normal(features).astype(numpy.float32), "y": rng.integers(0, 10)} for _ in range(batch)]
    trainer = Trainer(model, TrainingArguments(per_device_train_batch_size=batch, max_steps=1, disable_tqdm=True,
                                               logging_steps=0, **args), data, data_collator=stack_collate,
                      compute_loss_func=classification_loss)
    with every_check() as highest:
        trainer.train()
    peak, split = memory.peak()
    return trainer, peak, split, highest


MODELS = {
    "mlp": lambda device, width=24: MLP(width, width + 16, 10, 4, device=device, rng=numpy.random.default_rng(0)),
    "residual": lambda device, width=24: ResidualClassifier(width, 10, device=device, rng=numpy.random.default_rng(0)),
}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("args", [{}, {"gradient_checkpointing": True}, {"accumulation_dtype": "float64", "optim": "sgd"}])
def test_any_model_s_meta_step_is_its_real_step_to_the_byte(name, args):
    if name == "residual" and args.get("gradient_checkpointing"):
        args = {"max_grad_norm": 1e-9}  # no chain to checkpoint: clipping that scales instead
    gc.collect()
    before = memory.current()
    _, peak, split, highest = real_step(MODELS[name]("cpu"), 6, 24, args)
    predicted = fit.estimate_step(MODELS[name]("meta"), {"x": ((6, 24), "float32"), "y": ((6,), "int64")},
                                  classification_loss, args, device="cpu")
    assert predicted.peak_bytes == peak - sum(before.values())
    assert predicted.at_peak == {c: split[c] - before[c] for c in split}
    assert predicted.highest == {c: highest[c] - before[c] for c in highest}


@pytest.mark.parametrize("name", MODELS)
def test_any_model_s_buffers_are_all_seen(name):
    """As for the GPT: tracemalloc's peak over the real step <= the meta device's + the Python objects."""

    def both(width, batch):
        rng = numpy.random.default_rng(2)
        data = [{"x": rng.standard_normal(width).astype(numpy.float32), "y": rng.integers(0, 10)} for _ in range(batch)]
        trainer = Trainer(MODELS[name]("cpu", width), TrainingArguments(
            per_device_train_batch_size=batch, max_steps=1, disable_tqdm=True, logging_steps=0),
            data, data_collator=stack_collate, compute_loss_func=classification_loss)
        predicted = fit.estimate_step(MODELS[name]("meta", width),
                                      {"x": ((batch, width), "float32"), "y": ((batch,), "int64")},
                                      classification_loss, device="cpu")
        return traced(trainer), predicted

    seen, predicted = both(512, 256)
    objects, tiny_predicted = both(4, 2)
    objects -= tiny_predicted.device_peak_bytes - sum(tiny_predicted.start.values())
    start = sum(predicted.start.values())
    assert predicted.peak_bytes - start <= seen <= predicted.device_peak_bytes - start + objects + 64 * 1024


def image_loss(model, batch):
    logits, _ = model(Tensor(batch["x"], device=model.head.weight.device))
    return F.cross_entropy(logits, batch["y"], reduction="sum"), len(batch["y"])


KINDS = {  # (a small model on a device, its batch's fields: (shape, dtype, values), its loss (None: the Trainer's))
    "cnn": (lambda device: CNN(CNNConfig(image_size=8, widths=(4, 8)), rng=numpy.random.default_rng(0), device=device),
            {"x": ((4, 3, 8, 8), "float32", lambda r, s: r.standard_normal(s)), "y": ((4,), "int64", lambda r, s: r.integers(0, 10, s))},
            image_loss),
    "lstm": (lambda device: LSTMLanguageModel(LSTMConfig(vocab_size=20, n_embd=8, hidden_size=12, num_layers=2),
                                              rng=numpy.random.default_rng(0), device=device),
             {"input_ids": ((3, 9), "int64", lambda r, s: r.integers(0, 20, s)),
              "labels": ((3, 9), "int64", lambda r, s: r.integers(0, 20, s))}, None),
    "encoder": (lambda device: Encoder(EncoderConfig(block_size=8, vocab_size=12, num_classes=5, dropout=0.1),
                                       rng=numpy.random.default_rng(0), device=device),
                {"input_ids": ((3, 8), "int64", lambda r, s: r.integers(0, 12, s)),
                 "labels": ((3,), "int64", lambda r, s: r.integers(0, 5, s))}, None),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("checkpointing", [None, {"segments": "every"}, {"segments": "sqrt"}])
def test_every_model_kind_s_meta_step_is_its_real_step_to_the_byte(kind, checkpointing):
    """The CNN, the LSTM language model (checkpointed through time) and the encoder, as the GPT and the MLP."""
    make, fields, loss = KINDS[kind]
    args = {} if checkpointing is None else dict(gradient_checkpointing=True, gradient_checkpointing_kwargs=checkpointing)
    rng = numpy.random.default_rng(3)
    batch = fields[next(iter(fields))][0][0]
    data = [{name: draw(rng, shape[1:]).astype(dtype) for name, (shape, dtype, draw) in fields.items()} for _ in range(batch)]
    gc.collect()
    before = memory.current()
    trainer = Trainer(make("cpu"), TrainingArguments(per_device_train_batch_size=batch, max_steps=1, disable_tqdm=True,
                                                     logging_steps=0, **args), data, data_collator=stack_collate,
                      compute_loss_func=loss)
    with every_check() as highest:
        trainer.train()
    peak, split = memory.peak()
    del trainer
    predicted = fit.estimate_step(make("meta"), {name: (shape, dtype) for name, (shape, dtype, _) in fields.items()},
                                  loss, args, device="cpu")
    assert predicted.peak_bytes == peak - sum(before.values())
    assert predicted.at_peak == {c: split[c] - before[c] for c in split}
    assert predicted.highest == {c: highest[c] - before[c] for c in highest}


def test_estimate_step_names_what_is_wrong():
    with pytest.raises(ValueError, match="device='meta'"):
        fit.estimate_step(MODELS["mlp"]("cpu"), {"x": ((2, 24), "float32"), "y": ((2,), "int64")}, classification_loss)
    with pytest.raises(ValueError, match="first axis"):
        fit.estimate_step(MODELS["mlp"]("meta"), {"x": ((2, 24), "float32"), "y": ((3,), "int64")}, classification_loss)
    with pytest.raises(meta.NeedsValues, match="bool"):  # a loss that branches on a value cannot run without data
        fit.estimate_step(MODELS["mlp"]("meta"), {"x": ((2, 24), "float32"), "y": ((2,), "int64")},
                          lambda m, b: (classification_loss(m, b)[0], 2) if bool(m.head.weight.data.sum()) else None)


# -- 3. FLOPs -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["none", "every", "halves", "sqrt", "selective"])
@pytest.mark.parametrize("dropout, bias", [(0.0, False), (0.1, True)])
def test_the_time_column_is_the_measured_recompute_over_three_forwards(strategy, dropout, bias):
    """fit's recompute ratio and forward FLOPs, counted from the meta run's op events, against the FLOPs of the
    ops a real step ran forward and recomputed (a dropout or a bias changes which ops the recompute must run:
    recompute.make_plan)."""
    config = GPTConfig(block_size=6, vocab_size=13, n_layer=4, n_head=2, n_embd=8, dropout=dropout, bias=bias)
    plan = fit.plan_training(config, effective_batch_size=3, device_memory="1GiB")
    row = plan.row(strategy)
    trainer = trainer_for(config, row.micro_batch, 6, checkpointing=row.checkpointing)
    with memory.timeline() as events:
        trainer.train()
    policy = policies.resolve((row.checkpointing or {}).get("policy"))
    forward = sum(op_flops(e["op"], e["input_shapes"], e["output_shapes"]) for e in events
                  if e["phase"] == "forward" and "output_shapes" in e)
    recomputed = sum(op_flops(e["op"], e["input_shapes"], e["output_shapes"]) for e in events
                     if e["phase"] == "recompute" and "output_shapes" in e
                     and (policy is None or policy(e["op"]) == policies.RECOMPUTE))
    assert row.recompute_ratio == pytest.approx(1 + recomputed / (3 * forward), rel=1e-12)
    assert row.memory.forward_flops == forward


# -- 4. the table and the recommendation -------------------------------------------------------------------
SMALL = GPTConfig(block_size=32, vocab_size=64, n_layer=2, n_head=2, n_embd=32)
LARGE = GPTConfig(block_size=128, vocab_size=512, n_layer=24, n_head=8, n_embd=32)  # deep: activations dominate


def needed(config, seq_len, batch, **kwargs):
    return fit.gpt_step(config, batch, seq_len, checkpointing=kwargs or None).device_peak_bytes


def test_the_guide_s_four_cases_and_the_fifth():
    """A small model on a small GPU needs nothing; a large batch, accumulation; a large model,
    checkpointing; both, both; and a GPU too small for either is short by a stated amount."""
    gpu = needed(SMALL, 32, 8) + 1  # room for 8 examples of the small model, and no more
    assert fit.plan_training(SMALL, 32, 8, gpu).recommendation.verdict == "no technique needed"
    assert fit.plan_training(SMALL, 32, 64, gpu).recommendation.verdict == "gradient accumulation"
    roomy = needed(LARGE, 128, 8, segments="every")  # every block fits 8 examples; none fits one
    assert needed(LARGE, 128, 1) > roomy
    assert fit.plan_training(LARGE, 128, 8, roomy).recommendation.verdict == "gradient checkpointing"
    assert fit.plan_training(LARGE, 128, 64, roomy).recommendation.verdict == "gradient accumulation and checkpointing"
    tight = needed(LARGE, 128, 1, segments="every", split_blocks=True) // 2
    plan = fit.plan_training(LARGE, 128, 8, tight)
    least = min(r.memory.device_peak_bytes for r in plan.rows)
    assert plan.recommendation.verdict == "does not fit even with both"
    assert plan.recommendation.shortfall_bytes == least - tight > 0
    assert f"{(least - tight) / 2**20:.2f} MiB more" in str(plan)


@pytest.mark.parametrize("model, memory, batch, processes", [("gpt2", "t4", 32, 1), ("gpt2-medium", "a10", 64, 2),
                                                              ("gpt2-xl", "a100-80gb", 512, 8), ("gpt2-large", "h200", 16, 1)])
def test_every_row_keeps_its_promises(model, memory, batch, processes):
    plan = fit.plan_training(model, effective_batch_size=batch, device_memory=memory, processes=processes)
    per = batch // processes
    for row in plan.rows:
        if row.fits:  # micro-batch x steps x processes is the effective batch, and the step fits
            assert row.micro_batch * row.accumulation_steps * processes == batch
            assert row.memory.device_peak_bytes <= plan.usable_bytes
            assert row.micro_batch <= row.largest_micro_batch
            assert per % row.micro_batch == 0
        if row.key != "planner" and row.largest_micro_batch:  # one more example would not fit
            config = fit.model_config(model)
            assert needed(config, 1024, row.largest_micro_batch + 1, **(row.checkpointing or {})) > plan.usable_bytes
    rec = plan.recommendation
    if rec.training_arguments:  # the line runs, and says what the row does
        args = eval(rec.training_arguments, {"TrainingArguments": TrainingArguments})
        assert args.per_device_train_batch_size * args.gradient_accumulation_steps * processes == batch
        assert args.gradient_checkpointing == (rec.strategy.checkpointing is not None)


def test_gpt2_presets_have_the_published_sizes():
    """Parameter counts (tied embedding) against the sizes published with the checkpoints: 124M, 355M, 774M, 1.5B."""
    published = {"gpt2": 124, "gpt2-medium": 355, "gpt2-large": 774, "gpt2-xl": 1558}
    for name, millions in published.items():
        plan = fit.plan_training(name, effective_batch_size=1, device_memory="h200")
        assert round(plan.parameters / 1e6) == millions


@pytest.mark.parametrize("bias, tie_weights", [(True, True), (False, False), (True, False)])
def test_the_parameter_count_is_the_model_s(bias, tie_weights):
    config = GPTConfig(block_size=9, vocab_size=37, n_layer=3, n_head=2, n_embd=10, bias=bias, tie_weights=tie_weights)
    model = GPT(config, rng=numpy.random.default_rng(0))
    plan = fit.plan_training(config, effective_batch_size=1, device_memory="1GiB")
    assert plan.parameters == sum(p.numel() for p in model.parameters())


def test_16_bit_is_the_trainer_s_16_bit_step_under_a_stated_assumption():
    with pytest.raises(ValueError, match="mixed_precision"):
        fit.plan_training("gpt2", dtype="bfloat16")
    mixed = fit.plan_training("gpt2", dtype="bfloat16", mixed_precision=True, effective_batch_size=1)
    pure = fit.plan_training("gpt2", dtype="float16", mixed_precision=False, effective_batch_size=1)
    f32 = fit.plan_training("gpt2", effective_batch_size=1)
    p = f32.parameters
    at = {name: plan.row("none").memory.highest for name, plan in (("mixed", mixed), ("pure", pure), ("f32", f32))}
    # autocast keeps float32 parameters, moments and buffers; a 16-bit model has 16-bit ones
    assert (at["mixed"]["parameters"], at["mixed"]["optimizer"], at["mixed"]["accumulation"]) == (4 * p, 8 * p, 4 * p)
    assert (at["pure"]["parameters"], at["pure"]["optimizer"], at["pure"]["accumulation"]) == (2 * p, 4 * p, 2 * p)
    assert (at["f32"]["parameters"], at["f32"]["optimizer"], at["f32"]["accumulation"]) == (4 * p, 8 * p, 4 * p)
    # the 16-bit model's floating activations are half float32's; dropout's masks (1 byte an element)
    # and the loss's targets are the same size in both
    assert 0.5 * at["f32"]["activations"] < at["pure"]["activations"] < 0.6 * at["f32"]["activations"]
    # under autocast some activations stay float32 (layer norm's input, softmax's output, the log-probabilities)
    # and the casts keep 16-bit copies: fewer bytes than float32, more than the 16-bit model
    assert at["pure"]["activations"] < at["mixed"]["activations"] < at["f32"]["activations"]
    assert "bf16=True" in str(mixed) and "estimate" not in str(mixed)


def test_fit_s_mixed_precision_step_is_the_real_one_to_the_byte():
    """The Trainer's bf16 and fp16 steps on the meta device against the same steps on real arrays."""
    config = GPTConfig(block_size=8, vocab_size=31, n_layer=2, n_head=2, n_embd=16)
    for checkpointing, half in ((None, "bfloat16"), ({"segments": "every"}, "bfloat16"), ({"segments": "sqrt"}, "float16")):
        gc.collect()
        before = memory.current()
        rng = numpy.random.default_rng(1)
        data = [{"input_ids": rng.integers(0, 31, 8), "labels": rng.integers(0, 31, 8)} for _ in range(3)]
        extra = {} if checkpointing is None else dict(gradient_checkpointing=True, gradient_checkpointing_kwargs=checkpointing)
        Trainer(GPT(config, rng=numpy.random.default_rng(0)), TrainingArguments(
            per_device_train_batch_size=3, max_steps=1, disable_tqdm=True, logging_steps=0, bf16=half == "bfloat16",
            fp16=half == "float16", **extra), data).train()
        peak, split = memory.peak()
        ran = fit.gpt_step(config, 3, 8, checkpointing=checkpointing, autocast=half, device="cpu")
        assert ran.peak_bytes == peak - sum(before.values())
        assert ran.at_peak == {c: split[c] - before[c] for c in split}


# -- 5. bad input, speed ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, field", [
    (dict(model={"n_embd": 768, "n_head": 5}), "n_head"),
    (dict(model="gpt2", seq_len=2048), "seq_len"),
    (dict(model={"n_layer": 0}), "n_layer"),
    (dict(model={"vocab_size": -3}), "vocab_size"),
    (dict(effective_batch_size=0), "effective_batch_size"),
    (dict(effective_batch_size=6, processes=4), "processes"),
    (dict(processes=-1), "processes"),
    (dict(model="gpt5"), "preset"),
    (dict(model={"n_emb": 8}), "n_emb"),
    (dict(device_memory="a200"), "device memory"),
    (dict(device_memory=-5), "device memory"),
    (dict(device_memory="12 XB"), "device memory"),
    (dict(dtype="int8"), "dtype"),
    (dict(dtype="float32", mixed_precision=True), "mixed_precision"),
    (dict(reserve_bytes=-1), "reserve_bytes"),
])
def test_bad_input_is_an_error_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        fit.plan_training(**kwargs)


@pytest.mark.parametrize("argv, flag", [
    (["--n-head", "5"], "--n-head"), (["--seq-len", "4096"], "--seq-len"), (["--n-layer", "0"], "--n-layer"),
    (["--effective-batch-size", "-2"], "--effective-batch-size"), (["--model", "gpt5"], "--model"),
    (["--memory", "lots"], "--memory"), (["--dtype", "float16"], "--mixed-precision"),
    (["--effective-batch-size", "6", "--processes", "4"], "--processes"), (["--reserve=-1GiB"], "--reserve"), (["--reserve", "90GiB"], "--reserve"),
])
def test_fit_command_bad_input_is_one_line_naming_the_flag(argv, flag, capsys):
    assert cli.main(["fit", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err, err


def test_fit_command_prints_the_table(capsys):
    assert cli.main(["fit", "--model", "gpt2-medium", "--memory", "a10", "--effective-batch-size", "32"]) == 0
    out = capsys.readouterr().out
    for label in ("no checkpointing", "every block", "half blocks", "sqrt(n)", "selective", "planner"):
        assert label in out
    assert "Recommendation: gradient accumulation" in out and "TrainingArguments(" in out


@pytest.mark.parametrize("terminal", [True, False])
def test_a_long_fit_shows_its_progress_on_a_terminal_only(terminal, monkeypatch):
    """On a terminal the bar is drawn once the fit has taken a second, counts the runs, and is cleared
    before the table is printed; on anything else (a pipe, a file, a notebook's capture) nothing is written."""
    class Stream(io.StringIO):
        def isatty(self):
            return terminal

    seconds = iter(range(10**6))  # a clock that moves a second at each look: every draw is due
    monkeypatch.setattr(fit.progress.time, "perf_counter", lambda: next(seconds))
    monkeypatch.setattr(sys, "stderr", Stream())
    fit._STEPS.clear()
    fit._PROFILES.clear()
    plan = fit.plan_training(SMALL, effective_batch_size=2, device_memory="1GiB")
    written = sys.stderr.getvalue()
    if not terminal:
        assert written == ""
        return
    runs = re.findall(r"step (\d+) of about (\d+) running", written)
    done = [int(step) for step, _ in runs]
    assert done == sorted(done) and done[-1] > 2 * len(fit.STRATEGIES)  # each strategy run twice, then the planner
    assert all(int(step) <= int(total) for step, total in runs)
    assert written.endswith("\r\033[K") and "Will it fit?" in str(plan)


def test_fit_output_explains_its_columns_and_counts_one_example_in_the_singular():
    plan = fit.plan_training("gpt2-medium", effective_batch_size=32, device_memory="t4")
    assert plan.row("none").largest_micro_batch == 1
    text = fit.render(plan)
    assert "at most 1 example fits at once" in text and "1 examples" not in text
    assert "\nlargest: the largest micro-batch that fits" in text
    assert "\nplanner at the budget: schedules.plan_checkpoints, given as its budget" in text
    assert "at most 2 examples fit at once" in fit.render(
        fit.plan_training("gpt2-medium", effective_batch_size=32, device_memory="a10"))
    assert fit.device_memory_bytes("h200") == (round(139.81 * fit.GiB), "NVIDIA H200, 141 GB nominal, 139.81 GiB as "
                                                                          "CUDA reports it")


def test_the_module_docstring_s_example_runs():
    results = doctest.testmod(fit, optionflags=doctest.ELLIPSIS)
    assert results.attempted >= 4 and results.failed == 0


def test_gpt2_xl_table_allocates_nothing_of_the_model_s_size():
    """The whole table for GPT-2 XL takes no more memory than for its 48 blocks 25 times narrower: what fit
    allocates grows with the ops it runs (the engine's Python objects, a few MiB), never with the arrays (one
    activation at batch 1 is 6.25 MiB, the parameters 6 GiB); benchmarks/fit_speed.py times it."""
    xl = fit.GPT2["gpt2-xl"]

    def traced_table(config):
        fit._STEPS.clear()
        fit._PROFILES.clear()
        gc.collect()
        tracemalloc.start()
        try:
            start = time.process_time()  # CPU seconds: a busy machine's load does not count
            plan = fit.plan_training(config, effective_batch_size=512, device_memory="h100-80gb", processes=8)
            return plan, time.process_time() - start, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    traced_table(GPTConfig(**{**xl.__dict__, "n_embd": 128, "n_head": 2}))  # the lazy imports, once
    _, _, narrow = traced_table(GPTConfig(**{**xl.__dict__, "n_embd": 64, "n_head": 1}))
    plan, seconds, peak = traced_table(xl)
    assert peak < narrow + 2 * 2**20, (peak, narrow)
    assert len(plan.rows) == 6 and seconds < 60  # a hang, not a timing: the benchmark script times it


# -- 6. the planner's row, and the GPUs ---------------------------------------------------------------------------
def _dominated(plan):
    """Is the planner's row beaten by every block's on every count (micro-batch, memory, recompute)?"""
    planner, every = plan.row("planner"), plan.row("every")
    return (every.largest_micro_batch >= planner.largest_micro_batch and every.micro_batch >= planner.micro_batch
            and every.memory.device_peak_bytes <= planner.memory.device_peak_bytes
            and every.recompute_ratio <= planner.recompute_ratio
            and (every.memory.device_peak_bytes, every.recompute_ratio) != (planner.memory.device_peak_bytes,
                                                                             planner.recompute_ratio))


@pytest.mark.parametrize("model, batch, gpu", [("gpt2-medium", 32, "a10"), ("gpt2", 32, "t4"), ("gpt2-xl", 32, "a100-80gb")])
def test_the_planner_s_row_is_never_beaten_by_every_block(model, batch, gpu):
    assert not _dominated(fit.plan_training(model, effective_batch_size=batch, device_memory=gpu))


@settings(max_examples=8, deadline=None)
@given(st.integers(4, 12), st.integers(1, 4), st.sampled_from([16, 32, 64]), st.integers(1, 64), st.integers(6, 40))
def test_the_planner_s_row_is_never_beaten_by_every_block_drawn(n_layer, n_head, seq_len, batch, mib):
    config = GPTConfig(block_size=seq_len, vocab_size=300, n_layer=n_layer, n_head=n_head, n_embd=16 * n_head)
    assert not _dominated(fit.plan_training(config, effective_batch_size=batch, device_memory=f"{mib}MiB"))


def test_gpu_presets_are_what_cuda_reports_less_the_context():
    for key, (name, nominal, gib) in fit.GPUS.items():
        assert gib < nominal  # CUDA reports less than the nominal size, even taken as GiB
        plan = fit.plan_training("gpt2", effective_batch_size=1, device_memory=key)
        assert plan.memory_bytes == round(gib * fit.GiB)
        assert plan.usable_bytes == plan.memory_bytes - fit.DEFAULT_RESERVE
        assert f"{gib} GiB as CUDA reports it" in str(plan)
    assert fit.plan_training("gpt2", effective_batch_size=1, device_memory="t4", reserve_bytes=0).usable_bytes == \
        round(14.56 * fit.GiB)
    assert fit.plan_training("gpt2", effective_batch_size=1, device_memory="20GiB").usable_bytes == 20 * fit.GiB
