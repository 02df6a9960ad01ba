"""Mixed precision (autocast.py, grad_scaler.py, the Trainer's fp16/bf16): each op in its policy's dtype, the
master weights float32, loss scaling that changes no gradient, and the proofs (marked `equivalence`) that
checkpointing and accumulation keep their promises under autocast."""

import contextlib
import sys

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, autocast, backend, cli, tape
from tinygrad_ckpt.accumulate import GradientAccumulator
from tinygrad_ckpt.autocast import autocast as autocast_block
from tinygrad_ckpt.checkpoint import checkpoint
from tinygrad_ckpt.grad_scaler import GradScaler
from tinygrad_ckpt.nn import GPT, GPTConfig
from tinygrad_ckpt.optim import AdamW
from tinygrad_ckpt.testing import check_checkpoint, strict_cupy
from tinygrad_ckpt.testing import strategies as tst
from tinygrad_ckpt.train import Trainer, TrainerCallback, TrainingArguments

from .conftest import examples
from .helpers import TORCH_SKIP

pytest.importorskip("ml_dtypes", reason="bfloat16 on the CPU needs ml_dtypes: pip install -e \".[bf16]\"")
import ml_dtypes  # noqa: E402

LOW = {"float16": numpy.dtype(numpy.float16), "bfloat16": numpy.dtype(ml_dtypes.bfloat16)}


def small_gpt(n_layer=2, seed=0, dropout=0.0, n_embd=8, block_size=8, vocab_size=11):
    config = GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=n_layer, n_head=2, n_embd=n_embd,
                       dropout=dropout)
    return GPT(config, rng=numpy.random.default_rng(seed))


def token_batch(n=4, T=8, vocab=11, seed=1):
    rng = numpy.random.default_rng(seed)
    labels = rng.integers(0, vocab, (n, T))
    labels[0, 3:] = -100  # uneven token counts
    return {"input_ids": rng.integers(0, vocab, (n, T)), "labels": labels}


def summed_loss(model, batch, dtype):
    """The batch's summed cross-entropy, the forward and the loss under autocast(dtype) (None: float32)."""
    with autocast_block(dtype) if dtype else contextlib.nullcontext():
        logits, _ = model(batch["input_ids"])
        return F.cross_entropy(logits, batch["labels"], reduction="sum")


def grads(model):
    return [p.grad.data.copy() for p in model.parameters()]


# -- autocast: each op in its policy's dtype ----------------------------------------------
@pytest.mark.equivalence
@settings(max_examples=examples(8))
@given(config=tst.gpt_configs(max_layers=2), dtype=st.sampled_from(sorted(LOW)), checkpointed=st.booleans())
def test_each_op_runs_in_its_policys_dtype(config, dtype, checkpointed):
    """Op by op, on a GPT's tape: matrix products in 16 bits, layer norm, softmax and the loss in float32."""
    model = GPT(config, rng=numpy.random.default_rng(0))
    if checkpointed:
        model.gradient_checkpointing_enable()
    batch = token_batch(T=config.block_size)
    with tape.recording(tape.Tape()) as recorded:
        loss = summed_loss(model, batch, dtype)
        records = recorded.nodes()
    names = set()
    for n in records:
        name, floats = n.op.__name__, {d for d in n.input_dtypes if autocast.is_float(d)}
        names.add(name)
        if name in ("MatMul", "Linear"):  # the matrix products: 16 bits
            assert floats == {LOW[dtype]}, n.describe()
        elif name in ("LayerNorm", "Softmax", "LogSoftmax", "CrossEntropy", "Sum", "Mean", "Exp", "Log"):
            assert floats == {numpy.dtype(numpy.float32)}, n.describe()
        elif name in ("Add", "Sub", "Mul", "Div", "Where"):
            assert len(floats) == 1, n.describe()  # promoted to one dtype
    if not checkpointed:  # the casts are records of their own, beside the model's products
        assert {"Cast", "Linear", "MatMul", "LayerNorm", "Softmax", "CrossEntropy"} <= names
    assert loss.dtype == numpy.float32
    loss.backward()
    for name, p in model.named_parameters():
        assert p.dtype == numpy.float32 and p.grad.dtype == numpy.float32, name  # master weights and their gradients


def test_without_autocast_nothing_is_cast():
    model, batch = small_gpt(), token_batch()
    with tape.recording(tape.Tape()) as recorded:
        loss = summed_loss(model, batch, None)
        names = [n.op.__name__ for n in recorded.nodes()]
        dtypes = {d for n in recorded.nodes() for d in n.input_dtypes if autocast.is_float(d)}
    assert "Cast" not in names and dtypes == {numpy.dtype(numpy.float32)}
    assert loss.dtype == numpy.float32


def test_autocast_enabled_false_nests_and_leaving_restores():
    x = Tensor(numpy.ones((2, 3)), dtype=numpy.float32)
    w = Tensor(numpy.ones((4, 3)), dtype=numpy.float32, requires_grad=True)
    assert autocast.get_dtype() is None
    with autocast_block("float16"):
        assert F.linear(x, w).dtype == numpy.float16
        with autocast_block(enabled=False):
            assert autocast.get_dtype() is None
            assert F.linear(x, w).dtype == numpy.float32
            with autocast_block("bfloat16"):
                assert F.linear(x, w).dtype == LOW["bfloat16"]
        assert F.linear(x, w).dtype == numpy.float16
    assert autocast.get_dtype() is None
    assert F.linear(x, w).dtype == numpy.float32


def test_autocast_leaves_float64_and_integers_alone():
    x = Tensor(numpy.ones((2, 3)), dtype=numpy.float64, requires_grad=True)
    with autocast_block("bfloat16"):
        assert (x @ x.T).dtype == numpy.float64  # PyTorch leaves double tensors alone too
        assert x.softmax(axis=-1).dtype == numpy.float64


def test_a_16bit_matmul_on_numpy_is_the_float32_product_rounded_once():
    rng = numpy.random.default_rng(0)
    a32, b32 = rng.standard_normal((3, 5, 7)).astype(numpy.float32), rng.standard_normal((7, 4)).astype(numpy.float32)
    for dtype in LOW.values():
        a, b = Tensor(a32.astype(dtype), requires_grad=True), Tensor(b32.astype(dtype), requires_grad=True)
        out = a @ b
        expected = (a32.astype(dtype).astype(numpy.float32) @ b32.astype(dtype).astype(numpy.float32)).astype(dtype)
        assert out.dtype == dtype
        assert numpy.array_equal(out.data.astype(numpy.float32), expected.astype(numpy.float32))
        out.sum().backward()
        assert a.grad.dtype == dtype and b.grad.dtype == dtype


def test_a_16bit_bias_gradient_is_summed_in_float32():
    """10,000 rows of gradient 1: a bfloat16 running sum stops at 256 (ml_dtypes adds in bfloat16)."""
    x = Tensor(numpy.zeros((10_000, 2)), dtype=LOW["bfloat16"])
    w = Tensor(numpy.zeros((3, 2)), dtype=LOW["bfloat16"], requires_grad=True)
    b = Tensor(numpy.zeros(3), dtype=LOW["bfloat16"], requires_grad=True)
    F.linear(x, w, b).sum().backward()
    once = numpy.full(3, 10_000, numpy.float32).astype(LOW["bfloat16"])  # the exact sum, rounded once
    assert numpy.array_equal(b.grad.data, once)
    assert numpy.ones((10_000, 3), LOW["bfloat16"]).sum(axis=0)[0] != once[0]  # what a bfloat16 running sum gives


def test_bfloat16_without_ml_dtypes_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes now raises ImportError
    with pytest.raises(ImportError, match=r"\[bf16\]"):
        with autocast_block("bfloat16"):
            pass
    with pytest.raises(ImportError, match=r"\[bf16\]"):
        TrainingArguments(bf16=True)
    with autocast_block("float16"):  # float16 is NumPy's own
        pass


def test_autocast_refuses_another_dtype():
    with pytest.raises(ValueError, match="'bfloat16' or 'float16'"):
        with autocast_block("float32"):
            pass


# -- GradScaler ------------------------------------------------------------------------------
def test_grad_scaler_defaults_are_pytorchs():
    torch = pytest.importorskip("torch", reason=TORCH_SKIP)
    theirs = torch.amp.GradScaler("cpu")
    ours = GradScaler()
    assert ours.get_scale() == theirs.get_scale()
    assert (ours.growth_factor, ours.backoff_factor, ours.growth_interval) == (
        theirs.get_growth_factor(), theirs.get_backoff_factor(), theirs.get_growth_interval())


@settings(max_examples=examples(10))
@given(overflows=st.lists(st.booleans(), min_size=1, max_size=12), interval=st.integers(1, 4))
def test_grad_scaler_scale_follows_pytorchs_through_any_sequence_of_overflows(overflows, interval):
    torch = pytest.importorskip("torch", reason=TORCH_SKIP)
    theirs = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=interval)
    ours = GradScaler(init_scale=2.0**10, growth_interval=interval)
    p_t = torch.nn.Parameter(torch.zeros(2))
    opt_t = torch.optim.SGD([p_t], lr=0.1)
    p = Tensor(numpy.zeros(2), dtype=numpy.float32, requires_grad=True)
    opt = AdamW([p], lr=0.1)
    for overflow in overflows:
        value = float("inf") if overflow else 1.0
        p_t.grad = torch.full((2,), value)
        p.grad = Tensor(numpy.full(2, value, numpy.float32))
        theirs.scale(torch.ones(()))  # its scale is made lazily, by scale()
        theirs.unscale_(opt_t)
        assert ours.unscale_(opt) == overflow
        before = p_t.detach().clone()
        theirs.step(opt_t)
        assert ours.step(opt) == (not torch.equal(before, p_t.detach()))  # both skip, or both step
        theirs.update()
        ours.update()
        assert ours.get_scale() == theirs.get_scale()


def test_grad_scaler_unscales_once_per_step_and_skips_on_inf():
    p = Tensor(numpy.ones(3), dtype=numpy.float32, requires_grad=True)
    opt = AdamW([p], lr=0.1)
    scaler = GradScaler(init_scale=8.0)
    p.grad = Tensor(numpy.array([8.0, 16.0, 24.0], numpy.float32))
    assert scaler.unscale_(opt) is False
    assert numpy.array_equal(p.grad.data, numpy.array([1.0, 2.0, 3.0], numpy.float32))
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.update()
    before = p.data.copy()
    p.grad = Tensor(numpy.array([numpy.inf, 1.0, 1.0], numpy.float32))
    assert scaler.step(opt) is False  # unscaled inside, found the inf, did not step
    assert numpy.array_equal(p.data, before)
    scaler.update()
    assert scaler.get_scale() == 8.0 * scaler.backoff_factor


def test_grad_scaler_refuses_16bit_gradients():
    p = Tensor(numpy.ones(3), dtype=numpy.float16, requires_grad=True)
    p.grad = Tensor(numpy.ones(3), dtype=numpy.float16)
    with pytest.raises(ValueError, match="float32 gradients"):
        GradScaler().unscale_(AdamW([p]))


@pytest.mark.equivalence
@settings(max_examples=examples(10))
@given(k=st.integers(0, 14), dtype=st.sampled_from([None, "bfloat16"]), seed=st.integers(0, 2**16))
def test_a_power_of_two_loss_scale_changes_no_gradient(k, dtype, seed):
    """Scaled by 2**k, backpropagated, unscaled: the gradients of the unscaled loss, bit for bit.

    float32 and bfloat16 (float32's exponent range): nothing overflows or
    becomes subnormal at these scales, so a power of two moves exponents only.
    """
    batch = token_batch(seed=seed)
    plain = small_gpt(seed=seed)
    summed_loss(plain, batch, dtype).backward()
    scaled = small_gpt(seed=seed)
    scaler = GradScaler(init_scale=2.0**k)
    scaler.scale(summed_loss(scaled, batch, dtype)).backward()
    assert scaler.unscale_(AdamW(scaled.parameters())) is False
    for (name, p), q in zip(plain.named_parameters(), scaled.parameters()):
        assert numpy.array_equal(p.grad.data, q.grad.data), name


def test_float16_scaling_keeps_small_gradients_that_float16_would_lose():
    """What the scaler is for: a gradient below float16's range is 0 unscaled, kept when scaled (then unscaled)."""
    x = Tensor(numpy.full((1, 4), 1e-4), dtype=numpy.float32)
    w = Tensor(numpy.full((1, 4), 1e-4), dtype=numpy.float32, requires_grad=True)
    opt = AdamW([w])
    tiniest = float(ml_dtypes.finfo(numpy.float16).smallest_subnormal)
    with autocast_block("float16"):
        loss = F.linear(x, w).sum() * 1e-4
    loss.backward()  # dw = 1e-4 * x = 1e-8 in the float16 product: under half the smallest subnormal
    assert 1e-8 < tiniest / 2 and not w.grad.data.any()
    w.grad = None
    scaler = GradScaler()
    with autocast_block("float16"):
        loss = F.linear(x, w).sum() * 1e-4
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    assert numpy.allclose(w.grad.data, 1e-8, rtol=1e-2)


# -- checkpointing and accumulation under autocast ---------------------------------------------------
@pytest.mark.equivalence
@settings(max_examples=examples(10))
@given(config=tst.gpt_configs(max_layers=3), dtype=st.sampled_from(sorted(LOW)), policy=tst.policies(),
       segments=st.sampled_from(["every", "sqrt", 1]), split=st.booleans(), micro_batches=st.integers(1, 2),
       seed=st.integers(0, 2**16))
def test_checkpointed_gradients_equal_plain_ones_bit_for_bit_under_autocast(config, dtype, policy, segments, split,
                                                                            micro_batches, seed):
    """The recompute runs under the forward's autocast (backward runs outside it): the same casts, the same bits.

    Any policy, any segments, with accumulation over micro-batches.
    """
    batch = token_batch(n=4, T=config.block_size, seed=seed)
    runs = []
    for checkpointed in (False, True):
        model = GPT(config, rng=numpy.random.default_rng(seed))
        if checkpointed:
            model.gradient_checkpointing_enable(segments, policy=policy, split_blocks=split)
        acc = GradientAccumulator(model.parameters(), micro_batches)
        for rows in numpy.array_split(numpy.arange(4), micro_batches):
            part = {k: v[rows] for k, v in batch.items()}
            summed_loss(model, part, dtype).backward()  # outside autocast
            acc.accumulate(int((part["labels"] != -100).sum()))
        acc.write_grads()
        runs.append(grads(model))
    for (name, _), plain, checked in zip(model.named_parameters(), *runs):
        assert numpy.array_equal(plain, checked), name


@pytest.mark.equivalence
@settings(max_examples=examples(6))
@given(splits=st.integers(2, 4), seed=st.integers(0, 2**16))
def test_accumulation_under_float16_equals_the_whole_batch_within_float16s_rounding(splits, seed):
    """Micro-batches add 16-bit partial products in float32 where the whole batch rounds one sum:
    the mean gradients agree to a few float16 roundings of the largest gradient."""
    batch = token_batch(n=8, seed=seed)
    count = int((batch["labels"] != -100).sum())
    whole = small_gpt(seed=seed)
    summed_loss(whole, batch, "float16").backward()
    model = small_gpt(seed=seed)
    acc = GradientAccumulator(model.parameters(), splits)
    for rows in numpy.array_split(numpy.arange(8), splits):
        part = {k: v[rows] for k, v in batch.items()}
        summed_loss(model, part, "float16").backward()
        acc.accumulate(int((part["labels"] != -100).sum()))
    acc.write_grads()
    eps = float(numpy.finfo(numpy.float16).eps)
    worst = 0.0
    for (name, p), q in zip(whole.named_parameters(), model.parameters()):
        reference = p.grad.data / count
        scale = max(float(numpy.abs(reference).max()), float(numpy.finfo(numpy.float16).tiny))
        rel = float(numpy.abs(q.grad.data - reference).max()) / scale
        worst = max(worst, rel)
        assert rel <= 8 * eps, f"{name}: {rel:.2e} of its largest gradient, more than 8 float16 epsilons"
    assert worst > 0.0  # float16 roundings do show: the bound is not vacuous because nothing differs


# -- the Trainer --------------------------------------------------------------------------------
def char_data(n=24, T=8, vocab=11, seed=0):
    rng = numpy.random.default_rng(seed)
    return [{"input_ids": rng.integers(0, vocab, T), "labels": rng.integers(0, vocab, T)} for _ in range(n)]


def run_trainer(callbacks=(), **kwargs):
    args = dict(per_device_train_batch_size=4, max_steps=4, logging_steps=1, disable_tqdm=True, learning_rate=1e-2)
    args.update(kwargs)
    trainer = Trainer(small_gpt(), TrainingArguments(**args), char_data(), callbacks=list(callbacks))
    trainer.train()
    return trainer


def test_fp16_and_bf16_are_exclusive():
    with pytest.raises(ValueError, match="fp16 and bf16"):
        TrainingArguments(fp16=True, bf16=True)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_trainer_mixed_precision_keeps_master_weights_and_state_float32(precision):
    trainer = run_trainer(**{precision: True}, gradient_accumulation_steps=2, max_steps=2)
    f32 = numpy.dtype(numpy.float32)
    assert {p.dtype for p in trainer.optimizer.params} == {f32}
    assert {a.dtype for key in trainer.optimizer.state_names for a in getattr(trainer.optimizer, key)} == {f32}
    assert {b.dtype for b in trainer.accumulator.buffers} == {f32}
    assert all(numpy.isfinite(p.data).all() for p in trainer.optimizer.params)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_trainer_checkpointing_changes_no_parameter_under_mixed_precision(precision):
    """Checkpointing with accumulation under fp16/bf16: the same losses and parameters, to the bit."""
    runs = [run_trainer(**{precision: True}, gradient_accumulation_steps=2, gradient_checkpointing=ckpt)
            for ckpt in (False, True)]
    plain, checked = runs
    assert [e.get("loss") for e in plain.state.log_history] == [e.get("loss") for e in checked.state.log_history]
    for p, q in zip(plain.optimizer.params, checked.optimizer.params):
        assert numpy.array_equal(p.data, q.data)


@pytest.mark.equivalence
def test_the_trainers_scaler_skips_exactly_the_steps_whose_scaled_gradients_overflow():
    """Replayed by hand from each step's parameters and loss scale: a step is skipped iff a float16 gradient of
    its scaled loss is inf or NaN; the scale halves after each skip and stays after each good step."""
    snapshots, batches = [], []

    class Record(TrainerCallback):
        def on_step_begin(self, trainer):
            snapshots.append(([p.data.copy() for p in trainer.optimizer.params], trainer.scaler.get_scale()))
            batches.append([])

    args = TrainingArguments(per_device_train_batch_size=8, gradient_accumulation_steps=2, max_steps=12,
                             logging_steps=1, disable_tqdm=True, fp16=True, learning_rate=1e-2)
    trainer = Trainer(small_gpt(n_embd=16), args, char_data(n=64), callbacks=[Record()])
    trainer.scaler = GradScaler()  # PyTorch's starting scale, too high for a summed loss: overflows on purpose
    compute_loss = trainer.compute_loss

    def recorded(batch):
        batches[-1].append(batch)
        return compute_loss(batch)

    trainer.compute_loss = recorded
    trainer.train()
    skipped = {e["step"] for e in trainer.state.log_history if "skipped" in e}
    expected, scales = set(), []
    for step, ((params, scale), micro) in enumerate(zip(snapshots, batches), start=1):
        model = small_gpt(n_embd=16)
        for p, data in zip(model.parameters(), params):
            p.data[...] = data
        with numpy.errstate(over="ignore", invalid="ignore"):
            for batch in micro:
                (summed_loss(model, batch, "float16") * scale).backward()
            overflow = not all(numpy.isfinite(p.grad.data).all() for p in model.parameters() if p.grad is not None)
        if overflow:
            expected.add(step)
        scales.append(scale)
    assert expected and len(expected) < len(snapshots), "both kinds of step, or this test proves little"
    assert skipped == expected
    for step in range(1, len(scales)):  # growth_interval is far away: the scale only backs off
        assert scales[step] == scales[step - 1] * (0.5 if step in skipped else 1.0)


def test_cli_fp16_and_bf16_flags_and_header(capsys):
    common = ["train", "--max-steps", "1", "--n-layer", "1", "--n-embd", "8", "--n-head", "2", "--block-size", "8",
              "--per-device-train-batch-size", "2", "--sample-chars", "0", "--val-fraction", "0",
              "--disable-tqdm", "--logging-steps", "1"]
    assert cli.main(common + ["--bf16"]) == 0
    out = capsys.readouterr().out
    assert "precision: mixed, bfloat16" in out and "no loss scaling" in out
    assert cli.main(common + ["--fp16"]) == 0
    assert "precision: mixed, float16" in capsys.readouterr().out
    assert cli.main(common) == 0
    assert "precision: parameters float32" in capsys.readouterr().out
    assert cli.main(common + ["--fp16", "--bf16"]) == 2
    assert "fp16 and bf16" in capsys.readouterr().err


def test_an_fp16_run_resumed_from_a_checkpoint_continues_with_its_loss_scale(tmp_path):
    """The scale is part of the state: a resumed run skips and steps exactly as the uninterrupted one."""
    common = dict(fp16=True, max_steps=6, save_steps=3, gradient_accumulation_steps=2)
    whole = run_trainer(**common, output_dir=str(tmp_path / "whole"))
    first = run_trainer(**common, output_dir=str(tmp_path / "parts"))
    assert first.scaler.get_scale() != GradScaler().get_scale()  # it backed off: the saved scale matters
    args = dict(per_device_train_batch_size=4, logging_steps=1, disable_tqdm=True, learning_rate=1e-2, **common)
    resumed = Trainer(small_gpt(), TrainingArguments(**args, output_dir=str(tmp_path / "parts")), char_data())
    resumed.train(resume_from_checkpoint=str(tmp_path / "parts" / "checkpoint-3.npz"))
    assert resumed.scaler.get_scale() == whole.scaler.get_scale()
    for p, q in zip(whole.optimizer.params, resumed.optimizer.params):
        assert numpy.array_equal(p.data, q.data)


# One op each: (function of float32 tensors, the dtype its record's floating inputs must have under autocast:
# "low" the 16-bit dtype, "float32", or "input" the dtype it was given, which here is 16-bit).
ONE_OP = {
    "matmul": (lambda a, b: a @ b.T, "low"), "linear": (lambda a, b: F.linear(a, b), "low"),
    "softmax": (lambda a: a.softmax(axis=-1), "float32"), "log_softmax": (lambda a: a.log_softmax(axis=-1), "float32"),
    "layer_norm": (lambda a: F.layer_norm(a, (a.shape[-1],)), "float32"), "sum": (lambda a: a.sum(), "float32"),
    "mean": (lambda a: a.mean(axis=0), "float32"), "exp": (lambda a: a.exp(), "float32"),
    "log": (lambda a: (a * a + 1.0).log(), "float32"), "pow": (lambda a: a ** 3, "float32"),
    "cross_entropy": (lambda a: F.cross_entropy(a, numpy.array([0, 1, 2])), "float32"),
    "gelu": (lambda a: a.gelu(), "input"), "tanh": (lambda a: a.tanh(), "input"), "relu": (lambda a: a.relu(), "input"),
    "max": (lambda a: a.max(axis=-1), "input"), "reshape": (lambda a: a.reshape(-1), "input"),
}
OP_CLASS = {"matmul": "MatMul", "linear": "Linear", "softmax": "Softmax", "log_softmax": "LogSoftmax",
            "layer_norm": "LayerNorm", "sum": "Sum", "mean": "Mean", "exp": "Exp", "log": "Log", "pow": "PowScalar",
            "cross_entropy": "CrossEntropy", "gelu": "GELU", "tanh": "Tanh", "relu": "ReLU", "max": "Max",
            "reshape": "Reshape"}


@pytest.mark.parametrize("dtype", sorted(LOW))
@pytest.mark.parametrize("op", sorted(ONE_OP))
def test_each_op_alone_runs_in_its_policys_dtype(op, dtype):
    """Given 16-bit inputs (what a matmul hands on), each op's record sees the dtype the policy names."""
    fn, wanted = ONE_OP[op]
    rng = numpy.random.default_rng(0)
    inputs = [Tensor(rng.standard_normal((3, 4)).astype(numpy.float32).astype(LOW[dtype]), requires_grad=True)
              for _ in range(2 if op in ("matmul", "linear") else 1)]
    with tape.recording(tape.Tape()) as recorded, autocast_block(dtype):
        loss = fn(*inputs).sum()
        records = [n for n in recorded.nodes() if n.op.__name__ == OP_CLASS[op]]
    assert records, f"no {OP_CLASS[op]} record"
    expected = {"low": LOW[dtype], "float32": numpy.dtype(numpy.float32), "input": LOW[dtype]}[wanted]
    assert {d for d in records[-1].input_dtypes if autocast.is_float(d)} == {expected}
    loss.backward()  # the gradients come back in the inputs' own dtype, through the casts
    assert all(x.grad.dtype == LOW[dtype] for x in inputs)


@pytest.mark.parametrize("dtype", sorted(LOW))
def test_ops_of_several_inputs_run_in_the_widest_dtype(dtype):
    """A float32 residual plus a 16-bit branch: one float32 sum (PyTorch's type promotion)."""
    x = Tensor(numpy.ones((2, 3)), dtype=numpy.float32, requires_grad=True)
    y = Tensor(numpy.ones((2, 3)), dtype=LOW[dtype], requires_grad=True)
    with autocast_block(dtype):
        for out in (x + y, y - x, x * y, y / (x + 1.0)):
            assert out.dtype == numpy.float32
    with pytest.raises(TypeError, match="different dtypes"):
        x + y  # outside autocast the engine still refuses to mix dtypes


# The ops of tests/test_equivalence.py's proof, on float32 inputs (float64 ones autocast leaves alone).
EVERY_OP = {
    "add": (lambda a, b: a + b, 2), "mul": (lambda a, b: a * b, 2), "div": (lambda a, b: a / (b * b + 1.0), 2),
    "matmul": (lambda a, b: a @ b.T, 2), "linear": (lambda a, b: F.linear(a, b), 2),
    "exp": (lambda a: a.exp(), 1), "tanh": (lambda a: a.tanh(), 1), "gelu": (lambda a: a.gelu(), 1),
    "softmax": (lambda a: a.softmax(axis=-1), 1), "log_softmax": (lambda a: a.log_softmax(axis=-1), 1),
    "sum": (lambda a: a.sum(axis=0), 1), "mean": (lambda a: a.mean(axis=-1), 1), "max": (lambda a: a.max(axis=-1), 1),
    "layer_norm": (lambda a: F.layer_norm(a, (a.shape[-1],)), 1), "dropout": (lambda a: F.dropout(a, 0.5), 1),
    "attention": (lambda a, b: (a @ b.T).softmax(axis=-1) @ b + a, 2),
}


@pytest.mark.equivalence
@settings(max_examples=examples(20))
@given(op=st.sampled_from(sorted(EVERY_OP)), dtype=st.sampled_from(sorted(LOW)), policy=tst.policies(),
       seed=st.integers(0, 2**16))
def test_every_op_under_checkpoint_and_autocast_gives_the_plain_gradients_bit_for_bit(op, dtype, policy, seed):
    fn, arity = EVERY_OP[op]
    rng = numpy.random.default_rng(seed)
    inputs = [Tensor(rng.standard_normal((3, 4)), dtype=numpy.float32, requires_grad=True) for _ in range(arity)]
    report = check_checkpoint(fn, inputs, policy=policy, autocast=dtype, rtol=0.0, atol=0.0)
    assert report.passed, str(report)
    assert "autocast" in report.summary()


def test_check_checkpoint_under_autocast_catches_a_strategy_that_drops_autocast():
    """The plain run is under autocast: a checked run in float32 differs, and the check says so.
    (A recompute that forgot the forward's autocast fails the proofs above: checkpoint.py's restore is needed.)"""
    def forgetful(fn, *inputs):
        with autocast_block(enabled=False):
            return checkpoint(fn, *inputs)

    x = Tensor(numpy.random.default_rng(0).standard_normal((3, 4)), dtype=numpy.float32, requires_grad=True)
    report = check_checkpoint(lambda a: (a @ a.T).tanh(), [x], strategy=forgetful, autocast="bfloat16")
    assert not report.passed


@pytest.mark.parametrize("dtype", sorted(LOW))
def test_autocast_on_the_gpu_path_makes_no_numpy_call(dtype):
    """On the strict CuPy stand-in (device 'cuda'), where any NumPy call on a device array fails: the casts, the
    16-bit products (the GPU's own, no float32 detour) and the float32 gradients."""
    previous_module = backend.set_cuda_module(strict_cupy)
    try:
        model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8),
                    rng=numpy.random.default_rng(0), device="cuda")
        batch = token_batch()
        with numpy.errstate(over="ignore", invalid="ignore"):
            with autocast_block(dtype):
                logits, _ = model(batch["input_ids"])
                loss = F.cross_entropy(logits, backend.to_device(batch["labels"], "cuda"), reduction="sum")
            loss.backward()
        assert backend.device_of(logits.data) == "cuda" and logits.dtype == LOW[dtype]
        assert {p.grad.dtype for p in model.parameters()} == {numpy.dtype(numpy.float32)}
    finally:
        backend.set_cuda_module(previous_module)


def test_a_fresh_fp16_run_starts_at_pytorchs_scale_and_backs_off_without_using_up_the_warmup():
    """The Trainer's scaler starts at PyTorch's 2**16; its summed loss overflows there, so the first steps are
    skipped while the scale calibrates, and the first step taken gets the warm-up's first learning rate."""
    args = TrainingArguments(per_device_train_batch_size=8, max_steps=6, logging_steps=1, disable_tqdm=True, fp16=True,
                             learning_rate=1e-2, warmup_steps=4)
    trainer = Trainer(small_gpt(n_embd=16), args, char_data(n=64))
    assert trainer.scaler.get_scale() == 2.0**16
    history = trainer.train()
    skipped = [e["step"] for e in history if "skipped" in e]
    taken = [e for e in history if "learning_rate" in e]
    assert skipped and skipped[0] == 1 and taken
    assert taken[0]["learning_rate"] == pytest.approx(1e-2 / 4)
