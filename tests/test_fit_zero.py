"""fit --processes N --zero-stage S: one process's step under ZeRO, run on the meta device, is each real rank's.

The prediction (fit/sharded.py) runs the Trainer's sharded step as rank 0
of N with the other ranks stood in for; the real run is benchmarks/zero.py's
worker under `mpiexec -n N`, each rank reporting memory.py's peak by
category. They must agree to the byte, on every rank, at every stage. One
rank stands for all because all hold the same: checked here by running each
rank on the meta device. And the recommendation, where no strategy fits
one process, names the ZeRO stage and the number of processes that do.
"""

import importlib.util
import re
from pathlib import Path

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygrad_ckpt import cli, fit, meta, zero
from tinygrad_ckpt.fit.sharded import MetaCommunicator
from tinygrad_ckpt.nn import GPT, GPTConfig

from .test_distributed import needs_mpi

MODEL = dict(block_size=8, vocab_size=11, n_layer=2, n_head=1, n_embd=37)  # 34,595 parameters: no N of 2..4 divides it
ONE_STEP = dict(optim="adamw", per_device_train_batch_size=2, gradient_accumulation_steps=1, max_steps=1,
                logging_steps=0, disable_tqdm=True, seed=0)

_spec = importlib.util.spec_from_file_location("zero_bench", Path(__file__).parents[1] / "benchmarks" / "zero.py")
zero_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zero_bench)


def predicted(n, stage, checkpointing=False, model=MODEL, batch=ONE_STEP["per_device_train_batch_size"]):
    """fit's step of one process of n under `stage`, standing in for the CPU the real ranks run on."""
    return fit.gpt_step(GPTConfig(dropout=0.0, **model), batch, model["block_size"], device="cpu", processes=n,
                        zero_stage=stage, checkpointing={} if checkpointing else None)  # {}: the Trainer's default


@needs_mpi
@pytest.mark.parametrize("checkpointing", (False, True), ids=("plain", "checkpointing"))
@pytest.mark.parametrize("n", (2, 3, 4))
def test_each_real_rank_holds_to_the_byte_what_fit_predicts_for_one(n, checkpointing):
    ranks = zero_bench.launch(n, zero.STAGES, MODEL, dict(ONE_STEP, gradient_checkpointing=checkpointing), timeout=300)
    for stage in zero.STAGES:
        step = predicted(n, stage, checkpointing)
        for r, rank in enumerate(ranks):
            got = rank[stage]
            assert got["before"] == 0, f"stage {stage}, rank {r}: {got['before']} bytes left from the previous run"
            assert (got["peak"], got["bytes"]) == (step.peak_bytes, step.at_peak), (
                f"N={n}, stage {stage}, rank {r}: measured {got['peak']} {got['bytes']}, fit {step.peak_bytes} "
                f"{step.at_peak}")
    peaks = [predicted(n, stage, checkpointing).peak_bytes for stage in zero.STAGES]
    assert peaks == sorted(peaks, reverse=True) and peaks[-1] < peaks[0]  # each stage shards more


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 3), st.integers(4, 19), st.integers(2, 4), st.sampled_from(zero.STAGES), st.integers(1, 2))
def test_every_rank_holds_what_rank_0_holds(n_layer, n_embd, n, stage, batch):
    """Why fit runs one rank: the others' steps, run on the meta device too, hold the same at every moment."""
    config = GPTConfig(block_size=6, vocab_size=7, n_layer=n_layer, n_head=1, n_embd=n_embd, dropout=0.0)
    tokens = ((batch, 6), "int64")
    steps = [fit.estimate_step(GPT(config, device="meta"), {"input_ids": tokens, "labels": tokens}, None,
                               {"optim": "adamw", "zero_stage": stage}, "cuda", processes=n, rank=r) for r in range(n)]
    for r, step in enumerate(steps[1:], 1):
        assert (step.peak_bytes, step.at_peak, step.device_peak_bytes) == (
            steps[0].peak_bytes, steps[0].at_peak, steps[0].device_peak_bytes), f"rank {r}"
        assert (step.points == steps[0].points).all() and (step.scratch_points == steps[0].scratch_points).all()


def test_the_stand_in_collectives_give_this_rank_s_shapes():
    comm = MetaCommunicator(1, 4)
    flat = meta.empty((12,), "float32")
    shard = comm.reduce_scatter(flat)
    assert (shard.shape, shard.dtype) == ((3,), flat.dtype) and comm.all_gather_(flat) is flat
    assert comm.reduce_(flat, root=2) is flat and comm.all_gather("x") == ["x"] * 4
    assert list(comm.all_reduce_(numpy.array([3.0, 1.0]))) == [12.0, 4.0]  # 4 ranks alike
    assert not comm.any_(False)
    with pytest.raises(ValueError, match="pad them"):
        comm.reduce_scatter(meta.empty((10,), "float32"))


@pytest.mark.parametrize("argv, says", [
    (["--zero-stage", "2"], r"--zero-stage 2 .*add --processes N"),
    (["--processes", "0", "--zero-stage", "1"], r"--processes must be a positive integer, got 0"),
    (["--processes", "2", "--zero-stage", "7"], r"--zero-stage must be one of 0, 1, 2"),
    (["--processes", "2", "--zero-stage", "-1"], r"--zero-stage must be one of"),
    (["--model", "mlp", "--processes", "2", "--zero-stage", "1"], r"--zero-stage does not apply to --model mlp"),
])
def test_bad_zero_input_is_one_line_naming_the_flag_and_what_to_do(argv, says, capsys):
    assert cli.main(["fit", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(says, err), err


def test_without_the_flags_the_plan_is_as_before():
    plan = fit.plan_training(MODEL | {"dropout": 0.0}, effective_batch_size=4, device_memory="1GiB")
    assert plan.zero_stage is None and not plan.stage_rows and "ZeRO" not in str(plan)


def test_without_the_flags_a_model_that_fits_not_even_with_both_gets_the_stage_and_the_processes():
    """Plain fit, no --zero-stage: where no strategy fits one example, the answer is not a dead end but the
    ZeRO stage and process count that zero_rescue finds, the same as with --zero-stage 0."""
    model = dict(MODEL, n_layer=3, n_embd=64, n_head=2, block_size=16, vocab_size=97, dropout=0.0)
    usable = fit.gpt_step(GPTConfig(**model), 1, 16, checkpointing={"segments": "every"}, processes=4,
                          zero_stage=2).device_peak_bytes
    plain = fit.plan_training(model, effective_batch_size=8, device_memory=f"{usable}B")
    flagged = fit.plan_training(model, effective_batch_size=8, device_memory=f"{usable}B", zero_stage=0)
    assert all(not r.fits for r in plain.rows) and not plain.stage_rows
    assert plain.recommendation.processes == flagged.recommendation.processes in (2, 4)
    assert plain.recommendation.reason == flagged.recommendation.reason
    assert f"under mpiexec -n {plain.recommendation.processes}" in str(plain)


def test_a_model_that_fits_only_with_zero_gets_the_stage_and_the_processes():
    """The memory: what stage 2 on 4 processes needs for one example with the least-memory strategy. No
    strategy fits one process there; the recommendation must name a (stage, N) whose step fits, with no
    fewer processes fitting at any stage and no lower stage fitting at its N."""
    model = dict(MODEL, n_layer=3, n_embd=64, n_head=2, block_size=16, vocab_size=97, dropout=0.0)
    config = GPTConfig(**model)
    least = {"segments": "every"}
    steps = {(n, s): fit.gpt_step(config, 1, 16, checkpointing=least, processes=n, zero_stage=s)
             for n in (1, 2, 4) for s in zero.STAGES}
    usable = steps[4, 2].device_peak_bytes
    plan = fit.plan_training(model, effective_batch_size=8, device_memory=f"{usable}B", zero_stage=0)
    rec = plan.recommendation
    assert plan.row("none").largest_micro_batch == 0 and all(not r.fits for r in plan.rows)
    assert rec.training_arguments is not None and rec.processes in (2, 4), rec
    stage = int(re.search(r"zero_stage=(\d)", rec.training_arguments).group(1))
    assert f"ZeRO stage {stage} on {rec.processes} processes" in rec.reason
    assert rec.strategy.memory.device_peak_bytes <= plan.usable_bytes
    lower = [(rec.processes // 2, s) for s in zero.STAGES if rec.processes > 2] + [
        (rec.processes, s) for s in zero.STAGES if s < stage]
    for n, s in lower:  # the same least-memory strategy
        step = fit.gpt_step(config, 1, 16, checkpointing=rec.strategy.checkpointing, processes=n, zero_stage=s)
        assert step.device_peak_bytes > plan.usable_bytes, (n, s)
    out = str(plan)
    assert f"under mpiexec -n {rec.processes}" in out and "ZeRO stage 2, " in out
    assert steps[4, 2].peak_bytes < steps[2, 2].peak_bytes < steps[1, 2].peak_bytes


def test_fit_command_with_the_flags_prints_a_row_per_stage_and_the_stage_in_its_arguments(capsys):
    argv = ["fit", "--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--block-size", "32", "--memory", "1GiB",
            "--effective-batch-size", "4", "--processes", "2", "--zero-stage", "1"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "ZeRO stage 1: every peak is one process's" in out and "under mpiexec -n 2" in out
    assert all(f"ZeRO stage {s}, " in out for s in zero.STAGES)
    assert re.search(r"TrainingArguments\(zero_stage=1, per_device_train_batch_size=2\)", out), out


@pytest.mark.parametrize("stage", zero.STAGES)
def test_two_runs_give_every_micro_batch_of_one_process_too(stage):
    """The profile (every micro-batch from two runs) of one process's sharded step is the step run at each size:
    the whole model, then its shards, made before the step (stage 3 frees the first) are not the step's."""
    config, kw = GPTConfig(dropout=0.0, **MODEL), dict(checkpointing={"segments": "every"}, processes=3, zero_stage=stage)
    profile = fit.profile_gpt(config, 8, **kw)
    for b in (1, 2, 5):
        step, got = fit.gpt_step(config, b, 8, **kw), profile.at(b)
        assert (got.peak_bytes, got.at_peak, got.device_peak_bytes) == (
            step.peak_bytes, step.at_peak, step.device_peak_bytes), b
