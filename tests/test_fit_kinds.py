"""`tinygrad-ckpt fit --model mlp|cnn|lstm|encoder`: a row per strategy and precision (the planner's too for the
LSTM), each row's figures those of fit.estimate_step run here for the same step, the largest micro-batch the last
that fits, bad flags refused."""

import functools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygrad_ckpt import cli, fit
from tinygrad_ckpt.data import CharTokenizer, load_text
from tinygrad_ckpt.fit.kinds import plan_kind
from tinygrad_ckpt.kinds import KINDS

MIB = 1 << 20
# A memory per kind in which its default size fits some tens or hundreds of examples, so that the steps at the
# largest micro-batch and the next are quick to run here.
MEMORY = {"mlp": "1MiB", "cnn": "48MiB", "lstm": "12MiB", "encoder": "4MiB"}


def vocab(kind):
    """The LSTM reads the embedded text's characters; the other kinds their own ids."""
    return CharTokenizer.from_text(load_text()).vocab_size if kind == "lstm" else None


@functools.lru_cache(maxsize=None)
def planned(kind, dtype="float32"):
    return plan_kind(kind, effective_batch_size=24, device_memory=MEMORY[kind], dtype=dtype,
                     mixed_precision=True if dtype != "float32" else None)


def step(kind, sizes, batch, row, half):
    """fit.estimate_step of the row's step, set up here from the row's strategy and precision."""
    k = KINDS[kind]
    shapes = {name: ((batch, *shape), dtype) for name, (shape, dtype, _) in k.example(sizes, vocab(kind)).items()}
    segments = (row.checkpointing or {}).get("segments")
    args = dict(gradient_checkpointing=segments is not None,
                gradient_checkpointing_kwargs={"segments": segments} if segments else None,
                bf16=half and row.label.endswith("bfloat16 mixed"), fp16=half and row.label.endswith("float16 mixed")
                and not row.label.endswith("bfloat16 mixed"))
    return fit.estimate_step(k.build(sizes, vocab(kind), device="meta"), shapes, k.loss, args)


def rows(plan):
    """(row, whether it is a 16-bit row) for every row of the table."""
    return [(r, not r.label.endswith(", float32")) for r in plan.rows + plan.other_rows]


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_command_prints_a_row_per_strategy_and_precision(kind, capsys):
    assert cli.main(["fit", "--model", kind, "--memory", MEMORY[kind], "--effective-batch-size", "24"]) == 0
    out = capsys.readouterr().out
    link = "every " + KINDS[kind].chain[:-1]  # 'every stage', 'every time step', 'every block'
    strategies = ["no checkpointing", link, "sqrt(n) segments"] + (["planner at the budget"] if kind == "lstm" else [])
    table = [line for line in out.splitlines() if re.match(r"(no checkpointing|every [a-z ]+|sqrt\(n\) segments|"
                                                           r"planner at the budget), ", line)]
    labels = [re.split(r"\s{2,}", line)[0] for line in table]
    assert sorted(labels) == sorted(f"{s}, {p}" for s in strategies for p in ("float32", "bfloat16 mixed"))
    assert "Recommendation: " in out and "TrainingArguments(per_device_train_batch_size=" in out
    # the printed peaks are the plan's, as estimate_step gives them (the next test)
    plan = planned(kind)
    for line in table:
        label, _, _, peak, device, *_ = re.split(r"\s{2,}", line)
        row = next(r for r, _ in rows(plan) if r.label == label)
        assert (peak, device) == (f"{row.memory.peak_bytes / MIB:.2f}", f"{row.memory.device_peak_bytes / MIB:.2f}")


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_row_is_estimate_steps_step_to_the_byte(kind):
    plan = planned(kind)
    assert len(rows(plan)) == (8 if kind == "lstm" else 6)  # the LSTM's time steps have the planner's rows too
    for row, half in rows(plan):
        expected = step(kind, KINDS[kind].sizes, row.micro_batch or 1, row, half)
        got = row.memory
        assert (got.peak_bytes, got.at_peak, got.device_peak_bytes) == (
            expected.peak_bytes, expected.at_peak, expected.device_peak_bytes), row.label
        assert got.forward_flops == expected.forward_flops and got.recomputed_flops == expected.recomputed_flops
        if row.fits:  # the micro-batch divides the batch, and fits: the table's "micro x steps"
            assert row.micro_batch * row.accumulation_steps == plan.batch_per_process
            assert row.micro_batch <= row.largest_micro_batch


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_largest_micro_batch_fits_and_the_next_does_not(kind):
    plan = planned(kind)
    for row, half in rows(plan):
        largest = row.largest_micro_batch
        assert largest < 1000, (row.label, largest)  # MEMORY keeps it in range of a quick run
        if largest:  # 0: not even one example fits (the 16-bit LSTM saves each time step's weight casts)
            assert step(kind, KINDS[kind].sizes, largest, row, half).device_peak_bytes <= plan.usable_bytes, row.label
        assert step(kind, KINDS[kind].sizes, largest + 1, row, half).device_peak_bytes > plan.usable_bytes, row.label


def test_16_bit_asked_recommends_from_the_16_bit_rows():
    plan = planned("cnn", "bfloat16")
    assert all(r.label.endswith("bfloat16 mixed") for r in plan.rows)
    assert all(r.label.endswith("float32") for r in plan.other_rows)
    assert plan.recommendation.strategy in plan.rows
    assert "bf16=True" in plan.recommendation.training_arguments


@settings(max_examples=4, deadline=None)
@given(side=st.integers(1, 4), widths=st.lists(st.integers(2, 24), min_size=1, max_size=3), memory=st.integers(2, 24))
def test_any_cnn_the_largest_fits_and_the_next_does_not(side, widths, memory):
    sizes = dict(image_size=side * 2 ** len(widths), widths=tuple(widths))  # each stage halves the side
    plan = plan_kind("cnn", sizes, effective_batch_size=8, device_memory=f"{memory}MiB")
    for row, half in rows(plan):
        largest = row.largest_micro_batch
        if largest:
            assert step("cnn", sizes, largest, row, half).device_peak_bytes <= plan.usable_bytes
        assert step("cnn", sizes, largest + 1, row, half).device_peak_bytes > plan.usable_bytes


def flags(names):
    return ", ".join("--" + n.replace("_", "-") for n in names)


@pytest.mark.parametrize("kind, bad", [("mlp", ["--image-size", "8"]), ("cnn", ["--n-layer", "3"]),
                                       ("lstm", ["--widths", "4,8"]), ("encoder", ["--hidden-size", "16"]),
                                       ("cnn", ["--seq-len", "16"]), ("mlp", ["--vocab-size", "16"])])
def test_a_flag_the_kind_does_not_take_is_one_line_naming_those_it_takes(kind, bad, capsys):
    assert cli.main(["fit", "--model", kind, *bad]) == 2
    err = capsys.readouterr().err
    takes = list(KINDS[kind].sizes) + (["vocab_size"] if kind == "lstm" else [])
    assert err.count("\n") == 1
    assert f"{bad[0]} does not apply to --model {kind}, which takes {flags(takes)}" in err


def test_a_gpt_refuses_the_other_kinds_flags(capsys):
    assert cli.main(["fit", "--model", "gpt2", "--widths", "4,8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--widths does not apply to --model gpt2, which takes --n-layer" in err


def test_the_lstm_has_the_planners_rows_up_to_its_limit_and_says_so_beyond():
    from tinygrad_ckpt.fit.kinds import PLANNER_STEPS
    assert any(r.key == "planner" for r in planned("lstm").rows)  # the default 64 steps
    beyond = plan_kind("lstm", {"block_size": PLANNER_STEPS + 1, "hidden_size": 16, "n_embd": 8},
                       device_memory="8MiB")
    assert not any(r.key == "planner" for r in beyond.rows + beyond.other_rows)
    assert f"no planner rows past {PLANNER_STEPS} time steps" in str(beyond)
