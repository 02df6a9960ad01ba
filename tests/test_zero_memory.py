"""Each rank's peak, by category, under ZeRO stages 0, 1, 2, 3 and `mpiexec -n N`, N = 2, 3, 4: the formula, to the byte.

A float32 GPT of Psi = 34,595 parameters (no N from 2 to 4 divides it: every
layout is padded) trains with AdamW, micro-batches of B = 1 sequence of
T = 8 tokens and 2 accumulation steps, each rank under benchmarks/zero.py's
worker. With S = ceil(Psi / N) and 4-byte elements, the model states are

    stage 0: parameters 4 Psi,  accumulation 4 Psi,  optimizer 8 Psi
    stage 1: parameters 4 N S,  accumulation 4 N S,  optimizer 8 S
    stage 2: parameters 4 N S,  accumulation 4 S,    optimizer 8 S

(the padding is the N S - Psi zeros past the last parameter), and the rest
of the peak is one of the step's moments, whichever is largest:

  backward   the leaf gradients, activations and other arrays of one
             micro-batch's backward at its peak: not sharded by any stage,
             so those of one process running the same micro-batch (measured
             here, in this process, without MPI).
  stage 1    the step: the reduce-scatter's received shard (4 S,
             "gradients") and the shard's mean gradient, 4 S counted "other"
             at the instant it is made, before it is named a gradient.
  stage 2    after each backward: the micro-batch's whole leaf gradient,
             4 Psi, and the first chunk of S elements gathered from it to
             be reduced to its owner, 4 S, both "gradients" (each later
             chunk is made once the one before it is freed, and with fewer
             leaf gradients alive).
  stage 1, 2 the micro-batch's token ids, 8 B T bytes ("other"), alive
             until the next micro-batch.

Stage 3 (its own test): a group a unit (each block, then the root's
embeddings and final norm), S' the sum of each unit's ceil(Psi_u / N):
parameters 4 S', accumulation 4 S', optimizer 8 S', and the larger of two
moments. In backward, as the largest parameter's gradient is made (the last
block's MLP projection, Psi_max elements): that block gathered (4 N S_block),
the gradient (4 Psi_max, held by the walk until its op's other gradients are
delivered, though the hook has sent it and set .grad = None), its bias's
gradient (4 C, "other" the instant it is wrapped), and the activations and
other arrays of one process at that moment (measured here, without MPI, by
a post-accumulate-grad hook on that parameter). At the step: the mean
gradients of every group but the last (4 (S' - S_last)) and the last's as it
is made (4 S_last, "other"), with the token ids.

The bytes each rank sends per optimizer step are checked beside them: stage
1 sends the 2 Psi of an all-reduce (a reduce-scatter and an all-gather of
N S elements each), stage 2 N reduces of S elements per micro-batch (what a
reduce-scatter sends) and the all-gather. The formula
is written here from the layout, not taken from the benchmark.
"""

import gc
import importlib.util
from pathlib import Path

import numpy
import pytest

from tinygrad_ckpt import memory
from tinygrad_ckpt.data import CharDataset
from tinygrad_ckpt.nn import GPT, GPTConfig
from tinygrad_ckpt.train import Trainer, TrainingArguments

from .test_distributed import needs_mpi

MODEL = dict(block_size=8, vocab_size=11, n_layer=2, n_head=1, n_embd=37)
TRAINING = dict(optim="adamw", per_device_train_batch_size=1, gradient_accumulation_steps=2, max_steps=3,
                logging_steps=0, disable_tqdm=True, seed=0)
STAGES = (0, 1, 2)

_spec = importlib.util.spec_from_file_location("zero_bench", Path(__file__).parents[1] / "benchmarks" / "zero.py")
zero_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zero_bench)


def one_process(at_largest_gradient=False):
    """(Psi, the gradients, activations and other bytes at the peak of one process with the same micro-batches);
    at_largest_gradient: (the largest parameter's size, the bytes by category when its gradient is first made)."""
    gc.collect()
    before = memory.current()  # what earlier tests in this process left alive
    ids = numpy.random.default_rng(1).integers(0, MODEL["vocab_size"], size=64 * MODEL["block_size"] + 1)
    model = GPT(GPTConfig(dropout=0.0, **MODEL), rng=numpy.random.default_rng(0), dtype=numpy.float32)
    largest, seen = max(p.data.size for p in model.parameters()), []
    for p in model.parameters():
        if p.data.size == largest:
            p.register_post_accumulate_grad_hook(lambda p: seen.append({c: b - before[c] for c, b in memory.current().items()}))
    trainer = Trainer(model, TrainingArguments(**TRAINING), CharDataset(ids, block_size=MODEL["block_size"]))
    trainer.train()
    by = {c: b - before[c] for c, b in memory.peak()[1].items()}
    P = sum(p.data.size for p in trainer.optimizer.params)
    assert (by["parameters"], by["accumulation"], by["optimizer"]) == (4 * P, 4 * P, 8 * P)  # stage 0, N = 1
    if at_largest_gradient:
        return largest, seen[0]
    return P, {c: by[c] for c in ("gradients", "activations", "other")}


@needs_mpi
@pytest.mark.parametrize("n", (2, 3, 4))
def test_each_ranks_peak_by_category_is_the_formula_plus_the_stated_remainders(n):
    P, backward = one_process()
    S, tokens = -(-P // n), 8 * TRAINING["per_device_train_batch_size"] * MODEL["block_size"]
    assert n * S > P  # padded
    states = {0: dict(parameters=4 * P, accumulation=4 * P, optimizer=8 * P),
              1: dict(parameters=4 * n * S, accumulation=4 * n * S, optimizer=8 * S),
              2: dict(parameters=4 * n * S, accumulation=4 * S, optimizer=8 * S)}
    moments = {0: [backward],
               1: [backward, dict(gradients=4 * S, activations=0, other=4 * S + tokens)],
               2: [backward, dict(gradients=4 * P + 4 * S, activations=0, other=tokens)]}
    ranks = zero_bench.launch(n, STAGES, MODEL, TRAINING, timeout=300)
    for stage in STAGES:
        want = max(({**states[stage], **m} for m in moments[stage]), key=lambda m: sum(m.values()))
        for r, rank in enumerate(ranks):
            got = rank[stage]
            assert got["before"] == 0, f"stage {stage}, rank {r}: {got['before']} bytes left from the previous run"
            assert got["bytes"] == want and got["peak"] == sum(want.values()), (
                f"N={n}, stage {stage}, rank {r}: measured {got['bytes']}, predicted {want}")
        # bytes each rank sends per optimizer step: stage 1 one reduce-scatter and one all-gather of N S elements
        # (together the 2 Psi of an all-reduce), stage 2 N reduces of S elements per micro-batch; beside them, all-reduces
        # of 4 float64 (the item count, and the step's loss, items and tokens for the log) and, with ZeRO, 1 more
        # (the squared norm of the shard's gradient, summed across the ranks)
        G = TRAINING["gradient_accumulation_steps"]
        want_sent = {0: dict(all_reduce=4 * P + 32, reduce_scatter=0, reduce=0, all_gather_arrays=0),
                     1: dict(all_reduce=40, reduce_scatter=4 * n * S, reduce=0, all_gather_arrays=4 * n * S),
                     2: dict(all_reduce=40, reduce_scatter=0, reduce=G * n * 4 * S, all_gather_arrays=4 * n * S)}[stage]
        assert all(rank[stage]["sent_per_step"] == want_sent for rank in ranks), (stage, ranks[0][stage]["sent_per_step"])
    peaks = {stage: ranks[0][stage]["peak"] for stage in STAGES}
    assert peaks[2] < peaks[1] < peaks[0]  # sharding lowers every rank's peak, and stage 2's more than stage 1's


@needs_mpi
@pytest.mark.parametrize("stage", (2, 3))
def test_train_under_mpiexec_prints_each_processs_peak_and_its_shards(stage):
    """`mpiexec -n 3 tinygrad-ckpt train --zero-stage 2`: one line per process, its categories adding up to its
    peak, its accumulation buffers and AdamW state the 4 S and 8 S bytes of its shard (S = ceil(Psi / 3)).
    Stage 3: S' = ceil(Psi_root / 3) + ceil(Psi_block / 3) (one block), and the parameters its shards plus
    the units gathered at the peak: none, the root, the block, or both (the root stays gathered for the
    whole forward), never more."""
    import os
    import re
    import subprocess
    import sys

    from .test_distributed import find_mpiexec

    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OPENBLAS_NUM_THREADS": "1"}
    run = subprocess.run([find_mpiexec(), "-n", "3", sys.executable, "-m", "tinygrad_ckpt", "train", "--zero-stage", str(stage),
                          "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "16", "--max-steps", "2",
                          "--val-fraction", "0", "--sample-chars", "0", "--disable-tqdm"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    P = int(re.search(r"([\d,]+) parameters", run.stdout).group(1).replace(",", ""))
    S = -(-P // 3)
    V, C, T = int(re.search(r"vocabulary (\d+)", run.stdout).group(1)), 16, 16
    root = V * C + T * C + 2 * C  # wte, wpe, ln_f
    S_root, S_block = -(-root // 3), -(-(P - root) // 3)
    lines = re.findall(r"^peak memory of process (\d): .* \(([\d,]+) bytes\) = (.*)$", run.stdout, re.M)
    assert [int(rank) for rank, _, _ in lines] == [0, 1, 2]
    for _, peak, categories in lines:
        by = {name: int(value.replace(",", "")) for name, value in (c.rsplit(" ", 1) for c in categories.split(", "))}
        assert list(by) == list(memory.CATEGORIES) and sum(by.values()) == int(peak.replace(",", ""))
        if stage == 2:
            assert (by["parameters"], by["accumulation"], by["optimizer"]) == (4 * 3 * S, 4 * S, 8 * S)
        else:
            S3 = S_root + S_block
            assert (by["accumulation"], by["optimizer"]) == (4 * S3, 8 * S3)
            assert by["parameters"] - 4 * S3 in {0, 4 * 3 * S_root, 4 * 3 * S_block, 4 * 3 * (S_root + S_block)}


@needs_mpi
@pytest.mark.parametrize("n", (2, 3, 4))
def test_stage_3_each_ranks_peak_is_its_shards_plus_one_gathered_block_and_one_gradient(n):
    from tinygrad_ckpt.zero import stage3_units

    largest, moment = one_process(at_largest_gradient=True)
    model = GPT(GPTConfig(dropout=0.0, **MODEL), rng=numpy.random.default_rng(0), dtype=numpy.float32)
    units = stage3_units(model)  # the blocks, then the root
    P = sum(p.data.size for p in model.parameters())
    shards = [-(-sum(p.data.size for p in params) // n) for _, params in units]
    blocks, root, S3 = shards[:-1], shards[-1], sum(shards)
    last = blocks[-1]  # the layout's groups go by each unit's first parameter: the root (wte) first, the last block last
    tokens = 8 * TRAINING["per_device_train_batch_size"] * MODEL["block_size"]
    states = dict(parameters=4 * S3, accumulation=4 * S3, optimizer=8 * S3)
    backward = {**moment, **states, "parameters": 4 * S3 + 4 * n * max(blocks), "gradients": 4 * largest,
                "other": moment["other"] + 4 * MODEL["n_embd"]}
    step = dict(states, gradients=4 * (S3 - last), activations=0, other=4 * last + tokens)
    want = max(backward, step, key=lambda m: sum(m.values()))
    assert root < min(blocks) and sum(want.values()) < 4 * P + 4 * P + 8 * P  # below stage 0's model states alone
    ranks = zero_bench.launch(n, (3,), MODEL, TRAINING, timeout=300)
    G = TRAINING["gradient_accumulation_steps"]
    for r, rank in enumerate(ranks):
        got = rank[3]
        assert got["before"] == 0
        assert got["bytes"] == want and got["peak"] == sum(want.values()), (
            f"N={n}, stage 3, rank {r}: measured {got['bytes']}, predicted {want}")
        # per micro-batch: every unit gathered for forward and again for backward (2 x 4 N S'), each gradient
        # reduced to its owners as it is made (4 Psi, and the tied embedding's twice: it is the head too); and once
        # for the run, the Trainer's start gathers every unit (rank 0's values checked and broadcast: 4 N S')
        steps = TRAINING["max_steps"]
        assert got["sent_per_step"] == dict(all_reduce=40, reduce_scatter=0, reduce=G * 4 * (P + model.wte.weight.data.size),
                                            all_gather_arrays=(2 * G * steps + 1) * 4 * n * S3 / steps), got["sent_per_step"]
