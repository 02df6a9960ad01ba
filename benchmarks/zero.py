"""What does each rank hold under ZeRO stages 0, 1, 2 and 3, and what does it send?

    python benchmarks/zero.py

For N = 1..4 processes and stages 0, 1, 2, 3 it starts `mpiexec -n N python
benchmarks/zero.py --worker ...`: each rank trains a float32 GPT with AdamW
(micro-batches of one sequence, 2 accumulation steps) and reports its peak
by category (memory.py), its bytes sent per optimizer step by each
collective (distributed.Communicator) and its step times. The table puts
beside each figure the prediction for this engine's layout, with Psi
parameters, S = ceil(Psi / N) and 4-byte elements:

    stage   parameters   accumulation   optimizer (AdamW, K = 8)   model states
    0       4 Psi        4 Psi          8 Psi                      16 Psi
    1       4 N S        4 N S          8 S                        8 Psi + 8 Psi / N (+ padding)
    2       4 N S        4 S            8 S                        4 Psi + 12 Psi / N (+ padding)
    3       4 S'         4 S'           8 S'                       16 Psi / N (+ padding)

(stage 3: a group a unit, each block and the root, S' the sum of their
ceil(Psi_u / N)).

The paper's mixed-precision layout is (2 + 2 + K) Psi with K = 12: 16-bit
parameters and gradients, and a float32 master copy beside the two moments
in the optimizer state. Here the parameters stay float32 (autocast casts per
op, autocast.py), so they are their own master copy and K = 8; the float32
accumulation buffers are the gradients that persist between micro-batches.
What the formula leaves out, and the prediction adds (`remainder`):

  backward      the leaf gradients and activations of one micro-batch,
                never sharded: at their peak they are one process's (N = 1,
                stage 0; activations are what checkpointing is for).
  stage 1 step  the reduce-scatter's received shard (4 S, "gradients") and
                the shard's mean gradient (4 S, "other" at the instant it is
                made, before it is named a gradient).
  stage 2       after each backward, the micro-batch's whole leaf gradient
                (4 Psi) and the first of the N chunks of S elements it is
                reduced in, one to each owner (4 S); each leaf gradient is
                freed once all its elements are in chunks.
  stage 3       in backward, as the largest parameter's gradient is made
                (the last block's MLP weight, 4 Psi_max): that block
                gathered (4 N S_block), the gradient, held by the walk
                until its op's other gradients are delivered, and the
                bias's beside it (4 C, "other" the instant it is wrapped),
                with the activations and other arrays one process holds at
                that moment (measured at N = 1, stage 0, by a
                post-accumulate-grad hook); and the step: the mean
                gradients of the groups before the last (4 (S' - S_last))
                and the last one's as it is made (4 S_last, "other").
  all of them   the micro-batch's token ids (8 B T bytes, "other").

The peak is the largest of these moments. tests/test_zero_memory.py checks
the same equalities to the byte.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # N processes share the cores: one BLAS thread each

import numpy  # noqa: E402

from tinygrad_ckpt import memory  # noqa: E402
from tinygrad_ckpt.data import CharDataset  # noqa: E402
from tinygrad_ckpt.nn import GPT, GPTConfig  # noqa: E402
from tinygrad_ckpt.train import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

MODEL = dict(block_size=32, vocab_size=65, n_layer=4, n_head=4, n_embd=128)  # 0.80 M parameters
TRAINING = dict(optim="adamw", per_device_train_batch_size=1, gradient_accumulation_steps=2, max_steps=6,
                logging_steps=0, disable_tqdm=True, seed=0)
RANKS, STAGES = (1, 2, 3, 4), (0, 1, 2, 3)
SHOWN = ("parameters", "gradients", "accumulation", "optimizer", "activations")


class StepTimes(TrainerCallback):
    def __init__(self):
        self.times = []

    def on_step_begin(self, trainer):
        self.start = time.perf_counter()

    def on_step_end(self, trainer):
        self.times.append(time.perf_counter() - self.start)


def worker(model, training, stages, out):
    """Under mpiexec: one run per stage; this rank's figures into out/rank<r>.json."""
    import gc

    from tinygrad_ckpt.distributed import DataParallel

    results = {}
    for stage in stages:
        gc.collect()
        before = memory.total()  # 0: nothing of the previous stage's run is left
        parallel = DataParallel()  # a fresh one: the last one held its run's parameters and buffers
        gpt = GPT(GPTConfig(dropout=0.0, **model), rng=numpy.random.default_rng(0), dtype=numpy.float32)
        ids = numpy.random.default_rng(1).integers(0, model["vocab_size"], size=64 * model["block_size"] + 1)
        times, comm = StepTimes(), parallel.comm
        sent, all_reduced = dict(comm.bytes_sent), comm.bytes_all_reduced
        trainer = Trainer(gpt, TrainingArguments(zero_stage=stage, **training),
                          CharDataset(ids, block_size=model["block_size"]), distributed=parallel, callbacks=[times])
        largest, seen = max(p.data.size for p in gpt.parameters()), []  # stage 3's backward moment, seen at stage 0
        [p.register_post_accumulate_grad_hook(lambda p: seen.append(dict(memory.current())))
         for p in gpt.parameters() if p.data.size == largest and stage == 0]  # (no loop name left to keep a parameter)
        trainer.train()
        steps = trainer.state.global_step
        peak, by = memory.peak()
        results[stage] = {
            "before": before, "peak": peak, "bytes": by,
            "parameters": sum(p.data.size for p in trainer.accumulator.parameters),
            "largest_gradient": seen[0] if seen else None,
            "sent_per_step": {"all_reduce": (comm.bytes_all_reduced - all_reduced) / steps,
                              **{k: (comm.bytes_sent[k] - sent[k]) / steps for k in sent}},
            "step_seconds": float(numpy.median(times.times[1:])),  # the first step warms up
        }
        rank = parallel.rank
        del trainer, gpt, parallel
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))


def launch(n, stages=STAGES, model=MODEL, training=TRAINING, timeout=600):
    """[rank 0's {stage: figures}, ...] from `mpiexec -n n` running `worker`."""
    mpiexec = Path(sys.executable).with_name("mpiexec")
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", str(n), sys.executable, __file__,
                        "--worker", json.dumps([model, training, list(stages), out])],
                       check=True, timeout=timeout, env=env)
        return [{int(k): v for k, v in json.loads(Path(out, f"rank{r}.json").read_text()).items()} for r in range(n)]


def units(model=MODEL):
    """Stage 3's groups: the parameters of each unit (zero.stage3_units: each block, then the root), in the
    order of its layout (by each unit's first parameter in the model); and the largest parameter."""
    from tinygrad_ckpt.zero import stage3_units

    gpt = GPT(GPTConfig(dropout=0.0, **model), rng=numpy.random.default_rng(0), dtype=numpy.float32)
    order = {id(p): i for i, p in enumerate(gpt.parameters())}
    found = sorted(stage3_units(gpt), key=lambda unit: min(order[id(p)] for p in unit[1]))
    return [sum(p.data.size for p in params) for _, params in found], max(p.data.size for p in gpt.parameters())


def states(stage, P, n, sizes=None):
    """The formula: bytes of parameters, accumulation buffers and AdamW state on each rank (sizes: stage 3's units)."""
    S, S3 = -(-P // n), sum(-(-u // n) for u in sizes or ())
    return {0: dict(parameters=4 * P, accumulation=4 * P, optimizer=8 * P),
            1: dict(parameters=4 * n * S, accumulation=4 * n * S, optimizer=8 * S),
            2: dict(parameters=4 * n * S, accumulation=4 * S, optimizer=8 * S),
            3: dict(parameters=4 * S3, accumulation=4 * S3, optimizer=8 * S3)}[stage]


def predict(stage, P, n, backward, tokens, largest_gradient=None, model=MODEL):
    """The formula plus the remainders (see the module docstring), at the largest of the step's moments.

    backward: one process's gradients, activations and other at its peak; tokens: 8 B T, the token ids;
    largest_gradient: one process's bytes when backward makes the largest parameter's gradient (stage 3)."""
    S, base = -(-P // n), dict.fromkeys(memory.CATEGORIES, 0)
    moments = [{**backward}] if stage < 3 else []  # stage 3 makes one parameter's gradient at a time: its own moments
    if stage == 1:
        moments.append(dict(gradients=4 * S, other=4 * S + tokens))
    if stage == 2:
        moments.append(dict(gradients=4 * P + 4 * S, other=tokens))
    sizes, largest = units(model) if stage == 3 else (None, 0)
    moments = [{**base, **states(stage, P, n, sizes), **m} for m in moments]
    if stage == 3:
        shards = [-(-u // n) for u in sizes]
        moments.append({**base, **states(3, P, n, sizes), "gradients": 4 * largest,
                        "parameters": 4 * sum(shards) + 4 * n * max(shards[1:]),  # the block being walked, gathered
                        "activations": largest_gradient["activations"],
                        "other": largest_gradient["other"] + 4 * model["n_embd"]})  # its bias's gradient
        moments.append({**base, **states(3, P, n, sizes), "gradients": 4 * (sum(shards) - shards[-1]),
                        "other": 4 * shards[-1] + tokens})  # the step: the last group's mean gradient made
    return max(moments, key=lambda m: sum(m.values()))


def main():
    start = time.perf_counter()
    runs = {n: launch(n) for n in RANKS}
    one = runs[1][0][0]
    P, tokens = one["parameters"], 8 * TRAINING["per_device_train_batch_size"] * MODEL["block_size"]
    backward = {c: one["bytes"][c] for c in ("gradients", "activations", "other")}
    print(f"GPT {MODEL}, float32, AdamW: Psi = {P:,} parameters; micro-batch {TRAINING['per_device_train_batch_size']}"
          f" x {MODEL['block_size']} tokens, {TRAINING['gradient_accumulation_steps']} accumulation steps; "
          f"{os.cpu_count()} cores (os.cpu_count()), one BLAS thread a process")
    print("bytes of rank 0 at its peak, measured / predicted (formula + remainders); sent per optimizer step by "
          "each rank; median step time")
    print("| N | stage | " + " | ".join(SHOWN) + " | peak | all-reduce | reduce-scatter | reduce | all-gather | step |")
    print("|---" * (len(SHOWN) + 8) + "|")
    for n in RANKS:
        for stage in STAGES:
            got, want = runs[n][0][stage], predict(stage, P, n, backward, tokens, one["largest_gradient"])
            assert all(r[stage]["bytes"] == got["bytes"] for r in runs[n]), f"N={n} stage {stage}: ranks differ"
            cells = [f"{got['bytes'][c] / 2**20:.3f} / {want[c] / 2**20:.3f}" for c in SHOWN]
            sent = got["sent_per_step"]
            print(f"| {n} | {stage} | " + " | ".join(cells) + f" | {got['peak'] / 2**20:.3f} / "
                  f"{sum(want.values()) / 2**20:.3f} | {sent['all_reduce'] / 2**20:.3f} | "
                  f"{sent['reduce_scatter'] / 2**20:.3f} | {sent['reduce'] / 2**20:.3f} | "
                  f"{sent['all_gather_arrays'] / 2**20:.3f} | "
                  f"{got['step_seconds'] * 1e3:.0f} ms |")
    for n in RANKS[1:]:  # stage 3 with checkpointing: each block's recompute gathers it again
        got = launch(n, (3,), MODEL, {**TRAINING, "gradient_checkpointing": True})[0][3]
        sent = got["sent_per_step"]
        print(f"stage 3 with gradient checkpointing, N = {n}: peak {got['peak'] / 2**20:.3f} MiB (activations "
              f"{got['bytes']['activations'] / 2**20:.3f}); per step reduce {sent['reduce'] / 2**20:.3f}, all-gather "
              f"{sent['all_gather_arrays'] / 2**20:.3f} MiB; step {got['step_seconds'] * 1e3:.0f} ms")
    print(f"MiB. The all-reduce column counts the array once (Communicator.bytes_all_reduced); a ring all-reduce "
          f"moves it twice, a reduce-scatter then an all-gather: 2 Psi = {2 * 4 * P / 2**20:.3f} MiB, what stage 1 "
          f"sends; stage 2 reduces each micro-batch, N chunks of S; stage 3 all-gathers every unit twice a "
          f"micro-batch (forward, backward) and reduces each gradient as it is made: 3 Psi a micro-batch, with "
          f"checkpointing too (the recompute's gather replaces the backward's). {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(*json.loads(sys.argv[2]))
    else:
        main()
