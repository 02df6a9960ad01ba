"""TrainingArguments and Trainer: validation, schedule, split-independence, memory order, resume.

Models are tiny GPTs (width 16, one layer); equivalence tests run them in
float64 and compare with atol/rtol 1e-10: the runs differ only in summation
order (~1e-16 relative per add), while a wrong split or step shows at 1e-3.
"""

import io
import math
import re
import sys

import numpy
import pytest

from tinygrad_ckpt import autograd, memory, nn
from tinygrad_ckpt.data import CharDataset, CharTokenizer
from tinygrad_ckpt.nn import GPT, GPTConfig
from tinygrad_ckpt.train import Trainer, TrainerCallback, TrainingArguments, get_learning_rate

from .helpers import time_limit

V, T = 11, 8  # vocabulary, block size


def tiny_gpt(seed=0, dtype=numpy.float64, dropout=0.0, n_layer=1):
    config = GPTConfig(block_size=T, vocab_size=V, n_layer=n_layer, n_head=2, n_embd=16, dropout=dropout)
    return GPT(config, rng=numpy.random.default_rng(seed), dtype=dtype)


def dataset(n_tokens=200, seed=1):
    ids = numpy.random.default_rng(seed).integers(0, V, size=n_tokens)
    return CharDataset(ids, block_size=T)  # (n_tokens - T - 1) // T + 1 examples


class Recording:
    """A data set that remembers which examples were read, in order."""

    def __init__(self, inner):
        self.inner, self.reads = inner, []

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        self.reads.append(i)
        return self.inner[i]


def args(**kw):
    base = dict(per_device_train_batch_size=4, learning_rate=1e-2, logging_steps=1, disable_tqdm=True, seed=3)
    return TrainingArguments(**{**base, **kw})


# -- bad input -------------------------------------------------------------------
@pytest.mark.parametrize("kw, message", [
    (dict(gradient_accumulation_steps=0), "gradient_accumulation_steps must be an integer >= 1"),
    (dict(per_device_train_batch_size=0), "per_device_train_batch_size must be an integer >= 1"),
    (dict(optim="adam"), "optim must be one of"),
    (dict(lr_scheduler_type="step"), "lr_scheduler_type must be one of"),
    (dict(max_steps=-1, num_train_epochs=0), "nothing to train"),
    (dict(learning_rate=-1.0), "learning_rate"),
    (dict(gradient_checkpointing_kwargs={"segments": "sqrt"}), "gradient_checkpointing is False"),
    (dict(gradient_checkpointing=True, gradient_checkpointing_kwargs={"context_fn": None}),
     r"some of the keys 'segments', 'policy', 'split_blocks' .* and 'use_reentrant'"),
    (dict(gradient_checkpointing=True, gradient_checkpointing_kwargs={"split_blocks": "yes"}),
     r"\['split_blocks'\] must be true or false"),
    (dict(gradient_checkpointing=True, gradient_checkpointing_kwargs={"policy": "fast"}),
     "unknown checkpoint policy 'fast'.* selective_attention"),
    (dict(gradient_checkpointing=True, gradient_checkpointing_kwargs={"policy": print}),
     "must be a ready-made policy's name"),
    (dict(gradient_checkpointing=True, gradient_checkpointing_kwargs={"segments": 1.5}),
     "'every', 'sqrt', an int or a list"),
])
def test_bad_arguments_are_clear_errors(kw, message):
    with pytest.raises(ValueError, match=message):
        TrainingArguments(**kw)


def test_data_set_smaller_than_one_micro_batch():
    with pytest.raises(ValueError, match="fewer than one micro-batch"):
        Trainer(tiny_gpt(), args(per_device_train_batch_size=64), dataset())


def test_labels_outside_the_vocabulary():
    bad = [{"input_ids": numpy.zeros(T, dtype=numpy.int64), "labels": numpy.full(T, V + 3)}] * 4
    trainer = Trainer(tiny_gpt(), args(max_steps=1), bad)
    with pytest.raises(ValueError, match=f"token id {V + 3}, outside the model's vocabulary of {V}"):
        trainer.train()


def test_gradient_checkpointing_on_a_model_without_it():
    class NoCheckpointing(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

    with pytest.raises(ValueError, match="does not support it"):
        Trainer(NoCheckpointing(), args(gradient_checkpointing=True), dataset())


def test_gradient_checkpointing_flag_calls_the_model():
    class Checkpointable(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.enabled = False

        def gradient_checkpointing_enable(self):
            self.enabled = True

    model = Checkpointable()
    Trainer(model, args(gradient_checkpointing=True), dataset())
    assert model.enabled


# -- steps, schedule, logging ---------------------------------------------------
def test_schedule_warmup_then_decay():
    a = args(learning_rate=1.0, warmup_steps=2, lr_scheduler_type="linear")
    assert [get_learning_rate(s, a, 5) for s in range(5)] == pytest.approx([0.5, 1.0, 1.0, 2 / 3, 1 / 3])
    a = args(learning_rate=1.0, warmup_steps=0, lr_scheduler_type="cosine")
    assert [get_learning_rate(s, a, 4) for s in range(4)] == pytest.approx([1.0, 0.853553, 0.5, 0.146447], abs=1e-6)
    a = args(learning_rate=1.0, warmup_steps=4, lr_scheduler_type="constant")
    assert [get_learning_rate(s, a, 6) for s in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1, 1, 1])


def test_schedule_logging_and_max_steps_count_optimizer_steps_not_micro_batches():
    data = Recording(dataset())
    trainer = Trainer(tiny_gpt(), args(
        gradient_accumulation_steps=3, max_steps=4, learning_rate=1.0, warmup_steps=2, lr_scheduler_type="linear",
    ), data)
    history = trainer.train()
    train_logs = [e for e in history if "loss" in e]
    assert [e["step"] for e in train_logs] == [1, 2, 3, 4]
    assert [e["learning_rate"] for e in train_logs] == pytest.approx([0.5, 1.0, 1.0, 0.5])
    assert len(data.reads) == 4 * 3 * 4  # steps x micro-batches x examples
    assert all(isinstance(e["loss"], float) and e["loss"] > 0 for e in train_logs)
    assert all(e["tokens_per_second"] > 0 and e["peak_memory"] >= e["memory"] > 0 for e in train_logs)


def test_epochs_and_the_short_last_group():
    # 24 examples, micro-batches of 4 -> 6 per epoch; groups of 4 -> 2 steps per epoch, the second short
    data = Recording(dataset(n_tokens=24 * T + 1))
    assert len(data) == 24
    trainer = Trainer(tiny_gpt(), args(gradient_accumulation_steps=4, num_train_epochs=2), data)
    assert trainer.steps_per_epoch == 2 and trainer.total_steps == 4
    trainer.train()
    assert trainer.state.global_step == 4
    assert sorted(data.reads[:24]) == list(range(24)) and sorted(data.reads[24:]) == list(range(24))
    assert data.reads[:24] != data.reads[24:]  # a new order each epoch


# -- the split does not change the run --------------------------------------------
@pytest.mark.equivalence
@pytest.mark.parametrize("optim", ["sgd", "adamw"])
def test_same_examples_and_same_updates_however_the_effective_batch_is_split(optim):
    # effective batch 8; 25 examples -> steps of 8, 8, 8, 1 per epoch (a short last group)
    runs = {}
    for B, G in [(8, 1), (4, 2), (2, 4), (1, 8)]:
        data = Recording(dataset(n_tokens=25 * T + 1))
        model = tiny_gpt()
        history = Trainer(model, args(per_device_train_batch_size=B, gradient_accumulation_steps=G,
                                      max_steps=6, optim=optim, weight_decay=0.1), data).train()
        runs[B, G] = data.reads, [e["loss"] for e in history], [p.numpy() for p in model.parameters()]
    reads, losses, params = runs[8, 1]
    assert len(reads) == 6 * 8 - 7  # the fourth step of an epoch has one example
    for key, (r, run_losses, p) in runs.items():
        assert r == reads, key  # the same examples, in the same optimizer steps
        numpy.testing.assert_allclose(run_losses, losses, rtol=1e-10, atol=1e-10)
        for a, b in zip(p, params):
            numpy.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
    assert losses[-1] < losses[0]  # and it learns something


def test_each_micro_batch_is_backpropagated_before_the_next_forward():
    """Peak saved activations of B=2 x G=4 match B=2 x G=1, not B=8 x G=1."""
    def peak_activations(B, G):
        model = tiny_gpt(dtype=numpy.float32, n_layer=2)
        trainer = Trainer(model, args(per_device_train_batch_size=B, gradient_accumulation_steps=G, max_steps=2,
                                      logging_steps=0), dataset(n_tokens=400))
        with memory.timeline() as events:
            trainer.train()
        return max(e["activations"] for e in events)

    one = peak_activations(2, 1)
    accumulated = peak_activations(2, 4)
    big = peak_activations(8, 1)
    assert accumulated <= 1.01 * one
    assert big >= 3.5 * one  # four times the examples, about four times the activations


# -- resuming ---------------------------------------------------------------------
class Crash(Exception):
    pass


class CrashAfter(Recording):
    """Raise after `n` reads: a run killed in the middle of training."""

    def __init__(self, inner, n):
        super().__init__(inner)
        self.n = n

    def __getitem__(self, i):
        if len(self.reads) >= self.n:
            raise Crash
        return super().__getitem__(i)


def test_resume_gives_the_uninterrupted_loss_curve(tmp_path):
    # dropout on (the RNG state must be restored), an epoch boundary crossed
    # (11 examples: 3 steps of 4, 4, 3 per epoch), a linear schedule (the step must be restored)
    kw = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=7, save_steps=3,
              lr_scheduler_type="linear", warmup_steps=2)
    full = Trainer(tiny_gpt(dropout=0.2), args(output_dir=str(tmp_path / "full"), **kw), dataset(n_tokens=11 * T + 1))
    full_losses = [e["loss"] for e in full.train() if "loss" in e]
    full_params = [p.numpy() for p in full.model.parameters()]

    out = str(tmp_path / "stopped")
    crashing = CrashAfter(dataset(n_tokens=11 * T + 1), n=4 * 4 + 2)  # dies in step 5, after the save at step 3
    stopped = Trainer(tiny_gpt(dropout=0.2), args(output_dir=out, **kw), crashing)
    with pytest.raises(Crash):
        stopped.train()
    assert stopped.state.global_step == 4  # the crash lost step 4's work; the checkpoint is at step 3

    resumed = Trainer(tiny_gpt(seed=99, dropout=0.2), args(output_dir=out, **kw), dataset(n_tokens=11 * T + 1))
    history = resumed.train(resume_from_checkpoint=True)
    losses = [e["loss"] for e in history if "loss" in e]
    assert [e["step"] for e in history if "loss" in e] == list(range(1, 8))
    assert losses == full_losses  # exactly: same data, same arithmetic, same dropout masks
    for a, b in zip((p.numpy() for p in resumed.model.parameters()), full_params):
        numpy.testing.assert_array_equal(a, b)


def test_resume_errors(tmp_path):
    trainer = Trainer(tiny_gpt(), args(output_dir=str(tmp_path), max_steps=2, save_steps=1), dataset())
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        trainer.train(resume_from_checkpoint=True)
    trainer.train()
    other = Trainer(tiny_gpt(), args(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2), dataset())
    with pytest.raises(ValueError, match="per_device_train_batch_size=4"):
        other.train(resume_from_checkpoint=True)


def test_output_dir_holds_the_model_with_its_tokenizer_and_config(tmp_path):
    from tinygrad_ckpt import serialization

    tok = CharTokenizer("abcdefghijk")
    trainer = Trainer(tiny_gpt(), args(output_dir=str(tmp_path), max_steps=1), dataset(), tokenizer=tok)
    trainer.train()
    model = tiny_gpt(seed=5)
    extra = serialization.restore(tmp_path / "model.npz", model)
    assert CharTokenizer.from_state_dict(extra["tokenizer"]).chars == tok.chars
    assert GPTConfig(**extra["config"]) == trainer.model.config
    for a, b in zip(model.parameters(), trainer.model.parameters()):
        numpy.testing.assert_array_equal(a.numpy(), b.numpy())
    assert (tmp_path / "checkpoint-1.npz").exists()


def test_a_crash_during_a_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    from tinygrad_ckpt import serialization

    trainer = Trainer(tiny_gpt(), args(output_dir=str(tmp_path), max_steps=2, save_steps=1), dataset())
    trainer.train()
    good = (tmp_path / "checkpoint-2.npz").read_bytes()

    def dies_half_way(f, **arrays):
        f.write(b"PK\x03\x04 half a zip file")
        raise KeyboardInterrupt  # the process is stopped mid-write

    monkeypatch.setattr(serialization.numpy, "savez", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        trainer.save_checkpoint()
    assert (tmp_path / "checkpoint-2.npz").read_bytes() == good
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_training_on_a_device_never_copies_to_the_host_behind_our_back(tmp_path):
    """The Trainer on device 'cuda' backed by the strict CuPy stand-in: every transfer is explicit."""
    from tinygrad_ckpt import backend
    from tinygrad_ckpt.testing import strict_cupy

    previous = backend.set_cuda_module(strict_cupy)
    try:
        config = GPTConfig(block_size=T, vocab_size=V, n_layer=1, n_head=2, n_embd=16, dropout=0.1)
        model = GPT(config, rng=numpy.random.default_rng(0), device="cuda")
        trainer = Trainer(model, args(gradient_accumulation_steps=2, max_steps=3, save_steps=2,
                                      output_dir=str(tmp_path)), dataset(), eval_dataset=dataset(seed=2))
        history = trainer.train()
        assert all(isinstance(p.data, strict_cupy.ndarray) for p in model.parameters())
        assert all(isinstance(buf, strict_cupy.ndarray) for buf in trainer.accumulator.buffers)
        assert "eval_loss" in history[-1] and history[-2]["loss"] > 0
        resumed = Trainer(GPT(config, rng=numpy.random.default_rng(1), device="cuda"),
                          args(gradient_accumulation_steps=2, max_steps=3, output_dir=str(tmp_path)), dataset())
        resumed.train(resume_from_checkpoint=True)
    finally:
        backend.set_cuda_module(previous)


@pytest.mark.equivalence
@pytest.mark.parametrize("kwargs", [None, {"segments": "every", "policy": "selective_attention"},
                                    {"segments": [1], "policy": "save_matmuls"},
                                    {"segments": "every", "policy": "selective_attention", "split_blocks": True}])
def test_gradient_checkpointing_with_accumulation_same_run_less_activation_memory(kwargs, tmp_path):
    """GPT's own checkpointing through the flag (and its kwargs): the same losses and weights, fewer saved bytes."""
    results = {}
    for flag in (False, True):
        model = tiny_gpt(n_layer=2, dropout=0.1)
        extra = dict(gradient_checkpointing_kwargs=kwargs, output_dir=str(tmp_path)) if flag else {}
        trainer = Trainer(model, args(gradient_checkpointing=flag, gradient_accumulation_steps=2, max_steps=3, **extra),
                          dataset())
        with memory.timeline() as events:
            history = trainer.train()
        results[flag] = ([e["loss"] for e in history], [p.numpy() for p in model.parameters()],
                         max(e["activations"] for e in events))
    (plain_loss, plain_params, plain_act), (ckpt_loss, ckpt_params, ckpt_act) = results[False], results[True]
    numpy.testing.assert_allclose(ckpt_loss, plain_loss, rtol=1e-10, atol=1e-10)
    for a, b in zip(ckpt_params, plain_params):
        numpy.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
    assert ckpt_act < plain_act


# -- every field checked, named in the message ------------------------------------------
@pytest.mark.parametrize("kw", [
    dict(learning_rate=float("nan")), dict(learning_rate=float("inf")), dict(learning_rate=0.0),
    dict(learning_rate="0.1"), dict(weight_decay=float("nan")), dict(weight_decay=-0.1),
    dict(adam_beta1=1.0), dict(adam_beta2=-0.1), dict(adam_beta2=float("nan")), dict(adam_epsilon=0.0),
    dict(max_grad_norm=float("inf")), dict(max_grad_norm=-1.0), dict(num_train_epochs=float("nan")),
    dict(max_steps=2.5), dict(max_steps=True), dict(per_device_eval_batch_size=0), dict(eval_steps=-1),
    dict(save_steps=1.0), dict(logging_steps=-5), dict(warmup_steps=None), dict(seed=-1), dict(seed=1.5),
    dict(save_total_limit=0), dict(save_total_limit=1.5), dict(max_consecutive_nonfinite_steps=0),
    dict(accumulation_dtype="int32"), dict(accumulation_dtype="float99"), dict(accumulation_dtype=3),
    dict(gradient_checkpointing=1), dict(logging_first_step="yes"), dict(disable_tqdm=None), dict(detect_anomaly="on"),
    dict(output_dir=3), dict(output_dir=""), dict(optim=None), dict(lr_scheduler_type="Linear"),
], ids=lambda kw: f"{next(iter(kw))}={next(iter(kw.values()))!r}")
def test_every_field_is_checked_and_named(kw):
    (name, value), = kw.items()
    with pytest.raises(ValueError, match=rf"^{name} must be .*got {re.escape(repr(value))}"):
        TrainingArguments(**kw)


def test_good_arguments_pass():
    a = TrainingArguments(learning_rate=numpy.float32(1e-3), accumulation_dtype="float64", save_total_limit=2,
                          output_dir="out", max_consecutive_nonfinite_steps=1, adam_beta2=0.0, seed=0)
    assert a.save_total_limit == 2 and a.max_consecutive_nonfinite_steps == 1


# -- non-finite steps never reach the parameters --------------------------------------------
class Poisoned(Trainer):
    """A Trainer whose loss is NaN (or inf) in the micro-batches numbered in `bad` (0-based)."""

    def __init__(self, *a, bad=(), value=float("nan"), **kw):
        super().__init__(*a, **kw)
        self.bad, self.value, self.calls = set(bad), value, 0

    def compute_loss(self, batch):
        loss, items = super().compute_loss(batch)
        self.calls += 1
        if self.calls - 1 in self.bad:
            loss = loss * self.value
        return loss, items


def state_of(trainer):
    opt = trainer.optimizer
    return ([p.numpy().copy() for p in trainer.model.parameters()],
            [a.copy() for key in opt.state_names for a in getattr(opt, key)], list(opt.steps))


def assert_same_state(a, b):
    for x, y in zip(a[0] + a[1], b[0] + b[1]):
        numpy.testing.assert_array_equal(x, y)
    assert a[2] == b[2]


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # inf * 0 in the backward of an inf loss
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_loss_skips_the_step_and_leaves_parameters_and_optimizer_state(value):
    kw = dict(gradient_accumulation_steps=2, lr_scheduler_type="constant")
    clean = Trainer(tiny_gpt(), args(max_steps=2, **kw), dataset())
    clean.train()
    poisoned = Poisoned(tiny_gpt(), args(max_steps=3, **kw), dataset(), bad={5}, value=value)  # step 3's 2nd micro-batch
    history = poisoned.train()
    assert_same_state(state_of(poisoned), state_of(clean))  # step 3 changed nothing
    skipped = [e for e in history if "skipped" in e]
    assert skipped == [{"step": 3, "skipped": f"loss {value}, grad_norm nan", "consecutive_nonfinite_steps": 1,
                        "nonfinite_steps": 1}]
    assert poisoned.state.nonfinite_steps == 1 and poisoned.state.global_step == 3
    assert all(math.isfinite(e["loss"]) for e in history if "loss" in e)

    more = Poisoned(tiny_gpt(), args(max_steps=5, **kw), dataset(), bad={5})  # training goes on after it
    history = more.train()
    assert [e["step"] for e in history if "loss" in e] == [1, 2, 4, 5]
    assert more.state.consecutive_nonfinite_steps == 0
    assert all(numpy.isfinite(p.numpy()).all() for p in more.model.parameters())


def test_an_infinite_gradient_with_a_finite_loss_skips_the_step():
    trainer = Trainer(tiny_gpt(), args(max_steps=2, max_grad_norm=0.0, lr_scheduler_type="constant"), dataset())
    accumulate, calls = trainer.accumulator.accumulate, []

    def overflowing(num_items, end_of_data=False):
        calls.append(num_items)
        if len(calls) == 2:  # the second micro-batch's gradient overflows
            p = trainer.optimizer.params[0]
            p.grad.data[0] = numpy.inf
        return accumulate(num_items, end_of_data)

    trainer.accumulator.accumulate = overflowing
    clean = Trainer(tiny_gpt(), args(max_steps=1, max_grad_norm=0.0, lr_scheduler_type="constant"), dataset())
    clean.train()
    history = trainer.train()
    assert [e["skipped"] for e in history if "skipped" in e] == ["grad_norm inf"]
    assert_same_state(state_of(trainer), state_of(clean))


def test_one_nan_micro_batch_never_reaches_a_checkpoint(tmp_path):
    from tinygrad_ckpt.train import sorted_checkpoints, verify_checkpoint

    trainer = Poisoned(tiny_gpt(), args(max_steps=4, save_steps=1, output_dir=str(tmp_path)), dataset(), bad={1})
    trainer.train()
    saved = sorted_checkpoints(tmp_path)
    assert [step for step, _ in saved] == [4, 3, 2, 1]
    for _, path in saved:
        verify_checkpoint(path)  # finite parameters and optimizer state in every one
    assert all(numpy.isfinite(p.numpy()).all() for p in trainer.model.parameters())


def test_too_many_non_finite_steps_in_a_row_stop_with_a_clear_error(tmp_path, capsys):
    trainer = Poisoned(tiny_gpt(), args(max_steps=20, save_steps=1, output_dir=str(tmp_path),
                                        max_consecutive_nonfinite_steps=3), dataset(), bad={0, 3, 4, 5})
    with pytest.raises(FloatingPointError, match=r"3 optimizer steps in a row \(steps 4 to 6\) had a non-finite "
                                                 r"loss .* the parameters, which are those after step 3"):
        trainer.train()
    assert trainer.state.nonfinite_steps == 4 and trainer.state.global_step == 6
    assert "skipped, not finite: loss nan, grad_norm nan; parameters unchanged (3 in a row, 4 in all)" in capsys.readouterr().out


def test_detect_anomaly_stops_at_the_op_that_made_a_nan_and_names_it():
    trainer = Trainer(tiny_gpt(), args(max_steps=2, detect_anomaly=True), dataset())
    trainer.model.blocks[0].mlp.c_fc.weight.data[0, 0] = numpy.nan  # planted: the first op that reads it makes NaN
    with pytest.raises(FloatingPointError, match=r"^anomaly mode: Function Linear \(record #\d+ on the tape\) returned "
                                                 r"nan values .* At .*layers\.py, line \d+, in forward: .* <- "
                                                 r".*transformer\.py, line \d+, in forward: .*c_fc") as caught:
        trainer.train()
    assert "\n" not in str(caught.value)  # one line: the traceback is in the cause
    assert "Traceback of the forward call" in str(caught.value.__cause__)
    assert trainer.state.global_step == 0 and not autograd.is_anomaly_enabled()  # stopped at once, mode put back

    plain = Trainer(tiny_gpt(), args(max_steps=2, max_consecutive_nonfinite_steps=5), dataset())
    plain.model.blocks[0].mlp.c_fc.weight.data[0, 0] = numpy.nan
    history = plain.train()  # without anomaly mode: skipped steps, no error
    assert [e["step"] for e in history if "skipped" in e] == [1, 2]


def test_the_progress_bar_shows_the_log_lines_loss_and_ends_before_what_follows(monkeypatch, capsys):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    trainer = Trainer(tiny_gpt(), args(max_steps=4, logging_steps=2, disable_tqdm=False), dataset(), eval_dataset=dataset())
    history = trainer.train()
    bars = [part for part in terminal.getvalue().replace("\n", "\r").split("\r") if part.startswith("\033[K[")]
    shown = {int(b.split("] ")[1].split("/")[0]): b for b in bars}  # step -> the last bar drawn for it
    for entry in (e for e in history if "loss" in e):  # at a logging step, the bar's loss is the log line's
        assert f"| loss {entry['loss']:.4f} (mean of steps {entry['step'] - 1}-{entry['step']}) |" in shown[entry["step"]]
    assert terminal.getvalue().endswith("\n")  # the bar is ended: the evaluation's line starts a line of its own
    assert "eval_loss" in capsys.readouterr().out


def test_a_non_finite_model_is_never_saved(tmp_path):
    from tinygrad_ckpt.train import sorted_checkpoints

    trainer = Trainer(tiny_gpt(), args(max_steps=1, output_dir=str(tmp_path)), dataset())
    trainer.train()
    before = sorted_checkpoints(tmp_path)[0][1].read_bytes()
    trainer.model.wte.weight.data[0, 0] = numpy.nan
    with pytest.raises(FloatingPointError, match="refusing to save a checkpoint: parameter 'wte.weight' holds NaN"):
        trainer.save_checkpoint()
    with pytest.raises(FloatingPointError, match="refusing to save the model"):
        trainer.save_model()
    trainer.model.wte.weight.data[0, 0] = 0.0
    trainer.optimizer.exp_avg_sq[1][...] = numpy.inf
    with pytest.raises(FloatingPointError, match=r"optimizer state exp_avg_sq\[1\] holds NaN or inf"):
        trainer.save_checkpoint()
    assert sorted_checkpoints(tmp_path)[0][1].read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


# -- several checkpoints; resuming from the newest that verifies ----------------------------------
def test_save_total_limit_keeps_the_newest_checkpoints(tmp_path):
    from tinygrad_ckpt.train import sorted_checkpoints

    for limit, kept in [(None, [5, 4, 3, 2, 1]), (2, [5, 4]), (1, [5])]:
        out = tmp_path / str(limit)
        Trainer(tiny_gpt(), args(max_steps=5, save_steps=1, save_total_limit=limit, output_dir=str(out)), dataset()).train()
        assert [step for step, _ in sorted_checkpoints(out)] == kept
        assert sorted(p.name for p in out.iterdir()) == sorted([f"checkpoint-{s}.npz" for s in kept] + ["model.npz"])


def test_resume_skips_damaged_checkpoints_for_the_newest_good_one(tmp_path, capsys):
    kw = dict(max_steps=6, save_steps=2, output_dir=str(tmp_path), lr_scheduler_type="cosine", warmup_steps=1)
    full = Trainer(tiny_gpt(dropout=0.1), args(**kw), dataset())
    full_losses = [e["loss"] for e in full.train() if "loss" in e]
    truncated = tmp_path / "checkpoint-6.npz"
    truncated.write_bytes(truncated.read_bytes()[:1000])
    flipped = tmp_path / "checkpoint-4.npz"
    data = bytearray(flipped.read_bytes())
    data[len(data) // 3] ^= 0x40
    flipped.write_bytes(bytes(data))
    capsys.readouterr()

    resumed = Trainer(tiny_gpt(seed=9, dropout=0.1), args(**kw), dataset())
    history = resumed.train(resume_from_checkpoint=True)
    assert resumed.resumed_from == tmp_path / "checkpoint-2.npz"
    assert [p.name for p, _ in resumed.skipped_checkpoints] == ["checkpoint-6.npz", "checkpoint-4.npz"]
    assert all("corrupt" in why for _, why in resumed.skipped_checkpoints)
    err = capsys.readouterr().err
    assert "resume: skipped " + str(truncated) in err and "resume: continuing from " + str(tmp_path / "checkpoint-2.npz") in err
    assert [e["loss"] for e in history if "loss" in e] == full_losses
    for a, b in zip(resumed.model.parameters(), full.model.parameters()):
        numpy.testing.assert_array_equal(a.numpy(), b.numpy())


def test_resume_when_every_checkpoint_is_damaged(tmp_path):
    from tinygrad_ckpt.serialization import CheckpointFileError

    Trainer(tiny_gpt(), args(max_steps=2, save_steps=1, output_dir=str(tmp_path)), dataset()).train()
    for name in ("checkpoint-1.npz", "checkpoint-2.npz"):
        (tmp_path / name).write_bytes(b"garbage")
    with pytest.raises(CheckpointFileError, match=r"no checkpoint in .* can be resumed from: all 2 are damaged"):
        Trainer(tiny_gpt(), args(max_steps=2, output_dir=str(tmp_path)), dataset()).train(resume_from_checkpoint=True)
    with pytest.raises(CheckpointFileError, match=r"checkpoint-1\.npz' is corrupt"):  # a file named: no fallback
        Trainer(tiny_gpt(), args(max_steps=2), dataset()).train(resume_from_checkpoint=tmp_path / "checkpoint-1.npz")


def test_rotation_after_a_fallback_keeps_the_good_checkpoint(tmp_path):
    from tinygrad_ckpt.train import sorted_checkpoints, verify_checkpoint

    kw = dict(save_steps=1, save_total_limit=1, output_dir=str(tmp_path))
    Trainer(tiny_gpt(), args(max_steps=3, save_total_limit=None, **{k: v for k, v in kw.items() if k != "save_total_limit"}),
            dataset()).train()
    (tmp_path / "checkpoint-3.npz").write_bytes(b"damaged")
    (tmp_path / "model.npz").unlink()
    stopped = CrashAfter(dataset(), n=4)  # resumes from step 2, saves step 3, dies reading step 4
    with pytest.raises(Crash):
        Trainer(tiny_gpt(), args(max_steps=5, **kw), stopped).train(resume_from_checkpoint=True)
    # the checkpoint just written replaced the damaged one of the same step; the older good one went
    assert [step for step, _ in sorted_checkpoints(tmp_path)] == [3]
    verify_checkpoint(tmp_path / "checkpoint-3.npz")


# -- a checkpoint belongs to one model, one tokenizer --------------------------------------------
def test_resume_with_another_model_configuration_names_the_field_and_restores_nothing(tmp_path):
    Trainer(tiny_gpt(), args(max_steps=1, output_dir=str(tmp_path)), dataset()).train()
    config = GPTConfig(block_size=T, vocab_size=V, n_layer=1, n_head=4, n_embd=16, dropout=0.0)  # same shapes
    other = GPT(config, rng=numpy.random.default_rng(7), dtype=numpy.float64)
    before = other.state_dict()
    trainer = Trainer(other, args(max_steps=2, output_dir=str(tmp_path)), dataset())
    with pytest.raises(ValueError, match=r"its model configuration differs in 'n_head': the checkpoint has 2, "
                                         r"this run has 4"):
        trainer.train(resume_from_checkpoint=True)
    for name, value in other.state_dict().items():
        numpy.testing.assert_array_equal(value, before[name])


def test_resume_with_another_tokenizer_names_it(tmp_path):
    Trainer(tiny_gpt(), args(max_steps=1, output_dir=str(tmp_path)), dataset(), tokenizer=CharTokenizer("abcdefghijk")).train()
    swapped = CharTokenizer("abcdefghikj")  # the same characters, two ids swapped
    trainer = Trainer(tiny_gpt(), args(max_steps=2, output_dir=str(tmp_path)), dataset(), tokenizer=swapped)
    with pytest.raises(ValueError, match=r"its tokenizer differs in 'chars': the checkpoint's has 11 entries, this "
                                         r"run's 11; the first difference is at position 9: 'j' against 'k'"):
        trainer.train(resume_from_checkpoint=True)


def test_a_failed_resume_restores_nothing(tmp_path):
    Trainer(tiny_gpt(), args(max_steps=1, output_dir=str(tmp_path)), dataset()).train()
    model = tiny_gpt(seed=4)
    before = model.state_dict()
    trainer = Trainer(model, args(max_steps=2, output_dir=str(tmp_path), per_device_train_batch_size=2), dataset())
    with pytest.raises(ValueError, match="per_device_train_batch_size=4"):
        trainer.train(resume_from_checkpoint=True)
    for name, value in model.state_dict().items():
        numpy.testing.assert_array_equal(value, before[name])
    assert trainer.optimizer.steps == [0] * len(trainer.optimizer.params)


# -- fail fast, clean up --------------------------------------------------------------------------
def test_an_output_dir_that_cannot_be_written_fails_before_the_first_step(tmp_path):
    (tmp_path / "a_file").write_text("x")
    data = Recording(dataset())
    trainer = Trainer(tiny_gpt(), args(max_steps=2, output_dir=str(tmp_path / "a_file" / "out")), data)
    with pytest.raises(OSError, match=r"output directory .*a_file/out' is not writable"):
        trainer.train()
    assert data.reads == []  # not one example was read


def test_temporary_files_of_an_interrupted_save_are_removed_at_start(tmp_path, capsys):
    import subprocess
    import sys

    dead_pid = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                                  text=True).stdout)
    leftovers = [tmp_path / f".checkpoint-{s}.npz.{dead_pid}.0123abcd.tmp" for s in (1, 2)]
    for path in leftovers:
        path.write_bytes(b"PK\x03\x04 half a zip")
    Trainer(tiny_gpt(), args(max_steps=1, output_dir=str(tmp_path)), dataset()).train()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1.npz", "model.npz"]
    assert "removed 2 temporary file(s) left by an interrupted save" in capsys.readouterr().err


# -- a stored position is checked against the data before the first step (resume never hangs) -----
@pytest.fixture
def within_20_seconds():
    """A test that would hang fails instead."""
    with time_limit(20, "still running: the resumed run loops without taking a step"):
        yield


def saved_run(out, **kw):
    """A run of 11 examples, batch 2 (6 micro-batches an epoch), a checkpoint after every step."""
    Trainer(tiny_gpt(), args(output_dir=str(out), per_device_train_batch_size=2, max_steps=5, save_steps=1, **kw),
            dataset(n_tokens=11 * T + 1)).train()
    return out


def test_resume_with_fewer_examples_continues_at_the_next_epoch(tmp_path, capsys, within_20_seconds):
    out = saved_run(tmp_path)  # checkpoint-4: epoch 0, micro-batch 4 of 6
    shorter = Recording(dataset(n_tokens=7 * T + 1))  # 7 examples: 4 micro-batches an epoch
    resumed = Trainer(tiny_gpt(), args(per_device_train_batch_size=2, max_steps=7), shorter)
    history = resumed.train(resume_from_checkpoint=out / "checkpoint-4.npz")
    assert [e["step"] for e in history if "loss" in e][-3:] == [5, 6, 7]
    assert (resumed.state.epoch, resumed.state.micro_step) == (1, 3)  # epoch 1 from its start: 3 steps
    err = capsys.readouterr().err
    assert "the training data has 7 examples, the checkpoint's run had 11" in err
    assert "continuing at the start of epoch 1" in err
    assert sorted(shorter.reads[:6]) == sorted(int(i) for i in
                                               __import__("tinygrad_ckpt").data.epoch_order(7, 3, 1)[:6])


def test_resume_with_more_examples_says_the_order_changed(tmp_path, capsys, within_20_seconds):
    out = saved_run(tmp_path)
    resumed = Trainer(tiny_gpt(), args(per_device_train_batch_size=2, max_steps=6), dataset(n_tokens=15 * T + 1))
    resumed.train(resume_from_checkpoint=out / "checkpoint-4.npz")
    assert resumed.state.global_step == 6
    assert "continuing at micro-batch 4 of epoch 0, in this data's order" in capsys.readouterr().err


def craft(path, change):
    """Rewrite a checkpoint with change(checkpoint) applied: a file whose bytes are whole but whose fields lie."""
    from tinygrad_ckpt import serialization

    checkpoint = serialization.load(path)
    change(checkpoint)
    serialization.save(path, model=checkpoint["model"], optimizer=checkpoint["optimizer"], extra=checkpoint["extra"])
    return path


def position(**values):
    return lambda checkpoint: checkpoint["extra"]["trainer_state"].update(values)


@pytest.mark.parametrize("change, message", [
    (position(micro_step=50), r"micro_step 50 is past the end of an epoch of 6 micro-batches"),
    (position(micro_step=6), r"micro_step 6 is past the end of an epoch of 6"),
    (position(epoch=10**6), r"\(epoch 1000000, micro_step 4\) is more than global_step=4"),
    (position(global_step=1), r"is more than global_step=1"),
    (position(nonfinite_steps=9), r"skipped steps .* exceed global_step=4"),
    (position(consecutive_nonfinite_steps=2, nonfinite_steps=1), r"skipped steps"),
    (position(global_step=-1), r"bad step count"),
    (position(log_history=[{"step": 99, "loss": 1.0}]), r"log history holds a step outside 0..global_step=4"),
    (lambda c: c["extra"].update(batch_layout=[2, 0, 3]), r"'batch_layout' is not"),
    (lambda c: c["extra"].update(train_examples=0), r"'train_examples' is not"),
    (lambda c: c["extra"].update(world_size=0), r"'world_size' is not"),
    (lambda c: c["extra"].update(run_id="../x"), r"'run_id' is not"),
    (lambda c: c["optimizer"]["hyper"].update(betas=[0.9, 1.5]), r"the optimizer's betas is \[0.9, 1.5\]; it must "
                                                                    r"be numbers in \[0, 1\)"),
    (lambda c: c["optimizer"]["hyper"].update(lr=-1.0), r"the optimizer's lr is -1.0; it must be a finite number >= 0"),
    (lambda c: c["optimizer"]["hyper"].update(eps=0.0), r"the optimizer's eps is 0.0"),
    (lambda c: c["optimizer"]["hyper"].update(weight_decay=float("nan")), r"the optimizer's weight_decay is nan"),
    (lambda c: c["optimizer"]["state"]["exp_avg_sq"][0].__setitem__(0, -1.0), r"exp_avg_sq/0, a mean of squares"),
    (lambda c: c["optimizer"]["steps"].__setitem__(0, 9), r"its optimizer has taken more steps \(9\) than "
                                                              r"global_step=4"),
])
def test_every_stored_field_is_range_checked(tmp_path, within_20_seconds, change, message):
    from tinygrad_ckpt.serialization import CheckpointFileError

    path = craft(saved_run(tmp_path) / "checkpoint-4.npz", change)
    trainer = Trainer(tiny_gpt(), args(per_device_train_batch_size=2, max_steps=8), Recording(dataset(n_tokens=11 * T + 1)))
    with pytest.raises(CheckpointFileError, match=message):
        trainer.train(resume_from_checkpoint=path)
    assert trainer.train_dataset.reads == []


def test_a_position_not_at_a_step_boundary_is_refused(tmp_path, within_20_seconds):
    from tinygrad_ckpt.serialization import CheckpointFileError

    saved_run(tmp_path, gradient_accumulation_steps=2)
    path = craft(tmp_path / "checkpoint-2.npz", position(micro_step=1))
    trainer = Trainer(tiny_gpt(), args(per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=8),
                      dataset(n_tokens=11 * T + 1))
    with pytest.raises(CheckpointFileError, match=r"micro_step 1 is not at the start of an optimizer step"):
        trainer.train(resume_from_checkpoint=path)


def test_an_old_checkpoint_without_its_data_size_past_the_epoch_moves_on(tmp_path, capsys, within_20_seconds):
    def old_and_far(checkpoint):  # written before train_examples was stored, its micro_step beyond this data
        del checkpoint["extra"]["train_examples"]
        checkpoint["extra"]["trainer_state"].update(global_step=60, micro_step=50)

    path = craft(saved_run(tmp_path) / "checkpoint-4.npz", old_and_far)
    path = path.rename(tmp_path / "checkpoint-60.npz")
    trainer = Trainer(tiny_gpt(), args(per_device_train_batch_size=2, max_steps=62), dataset(n_tokens=11 * T + 1))
    trainer.train(resume_from_checkpoint=path)
    assert (trainer.state.global_step, trainer.state.epoch) == (62, 1)
    assert "continuing at the start of epoch 1" in capsys.readouterr().err


# -- one run per output directory ----------------------------------------------------------------
def test_a_fresh_run_refuses_a_directory_that_holds_another_run(tmp_path, capsys):
    from tinygrad_ckpt import serialization
    from tinygrad_ckpt.train import sorted_checkpoints

    Trainer(tiny_gpt(), args(max_steps=3, save_steps=1, output_dir=str(tmp_path)), dataset()).train()
    data = Recording(dataset())
    again = Trainer(tiny_gpt(), args(max_steps=2, output_dir=str(tmp_path)), data)
    with pytest.raises(ValueError, match=r"output directory '.*' already holds another run \(checkpoint-3.npz, "
                                         r"checkpoint-2.npz, checkpoint-1.npz, model.npz\): continue it with --resume .*"
                                         r"--overwrite-output-dir"):
        again.train()
    assert data.reads == [] and len(sorted_checkpoints(tmp_path)) == 3

    fresh = Trainer(tiny_gpt(), args(max_steps=2, save_steps=1, output_dir=str(tmp_path), overwrite_output_dir=True),
                    dataset())
    fresh.train()
    assert "overwrite_output_dir: deleted the previous run's 4 file(s)" in capsys.readouterr().err
    assert [step for step, _ in sorted_checkpoints(tmp_path)] == [2, 1]  # the old step 3 is gone
    ids = {serialization.read_extra(path)["run_id"] for _, path in sorted_checkpoints(tmp_path)}
    assert ids == {fresh.run_id} and re.fullmatch(r"[0-9a-f]{16}", fresh.run_id)


def test_resume_never_takes_another_runs_newer_checkpoint(tmp_path):
    import shutil

    from tinygrad_ckpt.train import sorted_checkpoints

    Trainer(tiny_gpt(), args(max_steps=6, save_steps=3, output_dir=str(tmp_path / "a")), dataset()).train()
    ours = Trainer(tiny_gpt(), args(max_steps=2, save_steps=1, output_dir=str(tmp_path / "b")), dataset())
    ours.train()
    shutil.copy(tmp_path / "a" / "checkpoint-6.npz", tmp_path / "b")  # another run's newer step
    with pytest.raises(ValueError, match=r"holds the checkpoints of 2 different runs .*checkpoint-6.npz.*; move the "
                                         r"other run's checkpoints away, or resume from one file"):
        Trainer(tiny_gpt(), args(max_steps=4, output_dir=str(tmp_path / "b")), dataset()).train(resume_from_checkpoint=True)
    (tmp_path / "b" / "checkpoint-6.npz").unlink()
    resumed = Trainer(tiny_gpt(), args(max_steps=4, save_steps=1, output_dir=str(tmp_path / "b")), dataset())
    resumed.train(resume_from_checkpoint=True)
    assert resumed.run_id == ours.run_id  # a resumed run is the same run: its checkpoints say so
    assert [step for step, _ in sorted_checkpoints(tmp_path / "b")] == [4, 3, 2, 1]
    resumed.train(resume_from_checkpoint=True)  # and resumes again without a complaint


# -- everything that will be written is checked before the first step ---------------------------
@pytest.mark.parametrize("where, message", [
    ("directory", r"memory_report: '.*' is a directory; give the path of a file in it"),
    ("missing", r"memory_report: the folder of '.*step.html', .* does not exist"),
    ("proc", r"memory_report: '/proc/step.html' cannot be written"),
])
def test_the_memory_report_path_is_checked_before_the_first_step(tmp_path, where, message):
    import sys as _sys

    pytest.importorskip("plotly", reason="the memory explorer page needs Plotly (pip install -e \".[report]\")")
    from tinygrad_ckpt.bench.explorer import MemoryReport

    if where == "proc" and not _sys.platform.startswith("linux"):
        pytest.skip("/proc is Linux's")
    path = {"directory": str(tmp_path), "missing": str(tmp_path / "no" / "step.html"), "proc": "/proc/step.html"}[where]
    data = Recording(dataset())
    with pytest.raises(OSError, match=message):  # when the callback is made: before any step
        Trainer(tiny_gpt(), args(max_steps=1), data, callbacks=[MemoryReport(path)]).train()
    assert data.reads == []


def test_save_steps_without_an_output_dir_is_an_error():
    with pytest.raises(ValueError, match=r"save_steps=5 needs output_dir, where the checkpoints are written; set "
                                         r"output_dir \(--output-dir\) or save_steps=0"):
        args(save_steps=5)


def test_resuming_into_another_runs_output_dir_is_refused_before_anything_is_restored(tmp_path, capsys):
    from tinygrad_ckpt.train import sorted_checkpoints

    Trainer(tiny_gpt(), args(max_steps=4, save_steps=2, output_dir=str(tmp_path / "a")), dataset()).train()
    Trainer(tiny_gpt(), args(max_steps=2, save_steps=1, output_dir=str(tmp_path / "b")), dataset()).train()
    model = tiny_gpt(seed=4)
    before = model.state_dict()
    into_b = Trainer(model, args(max_steps=6, output_dir=str(tmp_path / "b")), dataset())
    with pytest.raises(ValueError, match=r"output directory '.*b' holds another run's checkpoints \(run [0-9a-f]+: "
                                         r"checkpoint-2.npz, checkpoint-1.npz\), not those of the run '.*checkpoint-4.npz' "
                                         r"continues .*--overwrite-output-dir"):
        into_b.train(resume_from_checkpoint=tmp_path / "a" / "checkpoint-4.npz")
    for name, value in model.state_dict().items():
        numpy.testing.assert_array_equal(value, before[name])
    replacing = Trainer(tiny_gpt(), args(max_steps=6, save_steps=2, output_dir=str(tmp_path / "b"),
                                         overwrite_output_dir=True), dataset())
    replacing.train(resume_from_checkpoint=tmp_path / "a" / "checkpoint-4.npz")
    assert "overwrite_output_dir: deleted another run's checkpoints" in capsys.readouterr().err
    assert [step for step, _ in sorted_checkpoints(tmp_path / "b")] == [6]
    replacing.train(resume_from_checkpoint=True)  # b now holds one run, the one resumed from a


def test_a_model_path_taken_by_a_folder_is_said_before_the_first_step(tmp_path):
    (tmp_path / "model.npz").mkdir()
    data = Recording(dataset())
    with pytest.raises(OSError, match=r"model.npz' is a directory"):
        Trainer(tiny_gpt(), args(max_steps=1, output_dir=str(tmp_path)), data).train()
    assert data.reads == []


def test_callbacks_hear_each_optimizer_step_begin_at_its_first_micro_batch_and_end_after_its_update(capsys):
    class Heard(TrainerCallback):
        def __init__(self):
            self.events = []

        def on_step_begin(self, trainer):
            self.events.append(("begin", trainer.state.global_step, trainer.accumulator.micro_batches))

        def on_step_end(self, trainer):
            self.events.append(("end", trainer.state.global_step, trainer.accumulator.micro_batches))
            return f"heard step {trainer.state.global_step}"

    heard, silent = Heard(), TrainerCallback()  # the base class does nothing, says nothing
    Trainer(tiny_gpt(), args(max_steps=3, gradient_accumulation_steps=2), dataset(), callbacks=[silent, heard]).train()
    # Each optimizer step of 2 micro-batches: begun before its first (none accumulated yet), ended after its update.
    assert [(e, step) for e, step, _ in heard.events] == [("begin", 0), ("end", 1), ("begin", 1), ("end", 2),
                                                          ("begin", 2), ("end", 3)]
    assert [n for e, _, n in heard.events if e == "begin"] == [0, 0, 0]
    out = capsys.readouterr()
    assert [line for line in (out.out + out.err).splitlines() if line.startswith("heard")] == [
        "heard step 1", "heard step 2", "heard step 3"]
