"""What each process runs when tests/test_distributed.py starts `mpiexec -n 2 python tests/mpi_worker.py SCENARIO OUT`.

Not a test file (pytest does not collect it). Each scenario trains or fails
on every rank and writes what the test checks into the folder OUT, one
file per rank (`<scenario>_rank<r>.npz` or `.json`); the test compares them
with a single-process run that it does itself. The model and data builders
live here and are imported by the test, so both sides build the same thing.

    equivalence  Trainer runs (SGD / AdamW, with and without checkpointing,
                 uneven and empty shares; AdamW again on device 'cuda' backed
                 by the strict CuPy stand-in, so every host copy MPI needs is
                 explicit): parameters, log, examples read, all-reduce counts
                 seen at every micro-batch; and a run stopped after 2 steps
                 and resumed (rank 0 saves, both load), against one that was not
                 and a run where one rank's micro-batch has a NaN loss: every
                 rank skips that optimizer step alike
    errors       ranks that disagree on the model, its configuration, the
                 tokenizer, the arguments or the data (its size or its
                 contents), too little data for the world size, parameters
                 that diverge, an output directory rank 0 cannot write, and
                 ranks that resume from different checkpoints
    abort        rank 1 fails alone while rank 0 waits in a collective:
                 abort_if_running must end both (exit status 3), not hang
"""

import json
import sys
from pathlib import Path

import numpy

from tinygrad_ckpt.data import CharDataset, CharTokenizer
from tinygrad_ckpt.nn import GPT, GPTConfig
from tinygrad_ckpt.train import TrainingArguments, Trainer

V, T = 11, 8  # vocabulary, block size

# (name, TrainingArguments overrides, examples in the data set). Effective batch
# = B x G x 2 ranks = 12 in both: with 29 examples an epoch is 12 + 12 + 5,
# the 5 read as global micro-batches of 4 and 1, so rank 1's share of the
# last one is empty; with 23 examples the last group (11) shares 3/3 and 3/2.
CASES = [
    ("sgd", dict(optim="sgd", per_device_train_batch_size=2, gradient_accumulation_steps=3, max_steps=6), 29),
    ("adamw", dict(optim="adamw", per_device_train_batch_size=3, gradient_accumulation_steps=2, max_steps=5), 23),
    ("sgd_one_micro_batch", dict(optim="sgd", per_device_train_batch_size=6, gradient_accumulation_steps=1, max_steps=3), 29),
]


DEVICE_CASE = "adamw"  # run once more on the 'cuda' stand-in


def tiny_gpt(n_embd=16, seed=0, device=None, n_head=2):
    config = GPTConfig(block_size=T, vocab_size=V, n_layer=2, n_head=n_head, n_embd=n_embd, dropout=0.0)
    return GPT(config, rng=numpy.random.default_rng(seed), dtype=numpy.float64, device=device)


def dataset(n_examples, seed=1):
    ids = numpy.random.default_rng(seed).integers(0, V, size=n_examples * T + 1)
    return CharDataset(ids, block_size=T)


def training_args(**kw):
    base = dict(learning_rate=3e-2, weight_decay=0.1, warmup_steps=1, logging_steps=1, disable_tqdm=True, seed=3)
    return TrainingArguments(**{**base, **kw})


class Recording:
    """A data set that remembers which examples were read, in order."""

    def __init__(self, inner):
        self.inner, self.reads = inner, []

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        self.reads.append(int(i))
        return self.inner[i]


def equivalence(parallel, out, checkpointing):
    from tinygrad_ckpt import backend
    from tinygrad_ckpt.testing import strict_cupy

    backend.set_cuda_module(strict_cupy)
    runs = []  # (key, case, gradient checkpointing, device)
    for case in CASES:
        runs.append((case[0], case, False, None))
        if checkpointing:
            runs.append((case[0] + "_ckpt", case, True, None))
        if case[0] == DEVICE_CASE:
            runs.append((case[0] + "_cuda", case, False, "cuda"))
    results = {}
    for key, (name, overrides, n_examples), ckpt, device in runs:
        model = tiny_gpt(seed=parallel.rank, device=device)  # rank 1's model starts elsewhere:
        args = training_args(gradient_checkpointing=ckpt, **overrides)  # the broadcast must fix that
        data = Recording(dataset(n_examples))
        parallel.check_every, parallel.steps = 1, 0  # check the parameters' checksums before every step
        calls_before, bytes_before = dict(parallel.comm.calls), parallel.comm.bytes_all_reduced
        trainer = Trainer(model, args, data, distributed=parallel)
        seen = []  # all-reduce calls made so far, at each micro-batch: must not move inside a group
        accumulate = trainer.accumulator.accumulate

        def counting_accumulate(num_items, end_of_data=False, accumulate=accumulate, seen=seen):
            seen.append(parallel.comm.calls["all_reduce"] - calls_before["all_reduce"])
            return accumulate(num_items, end_of_data)

        trainer.accumulator.accumulate = counting_accumulate
        history = trainer.train()
        parallel.check_in_sync()
        results[key] = {
            "params": [p.numpy().tolist() for p in trainer.optimizer.params],
            "losses": [e["loss"] for e in history if "loss" in e],
            "reads": data.reads,
            "seen": seen,
            "calls": {k: parallel.comm.calls[k] - calls_before[k] for k in calls_before},
            "bytes_all_reduced": parallel.comm.bytes_all_reduced - bytes_before,
            "steps": trainer.state.global_step,
            "flat_buffers": len(parallel.flat_buffers),
            "device": str(trainer.optimizer.params[0].device),
        }
    results["resume"] = resume(parallel, out)
    results["nonfinite"] = nonfinite(parallel)
    (out / f"equivalence_rank{parallel.rank}.json").write_text(json.dumps(results))


def nonfinite(parallel):
    """Rank 1's second micro-batch has a NaN loss: both ranks must skip optimizer step 1, alike."""
    class Poisoned(Trainer):
        calls = 0

        def compute_loss(self, batch):
            loss, items = super().compute_loss(batch)
            self.calls += 1
            return (loss * float("nan") if parallel.rank == 1 and self.calls == 2 else loss), items

    args = training_args(optim="adamw", per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=3)
    trainer = Poisoned(tiny_gpt(), args, dataset(23), distributed=parallel)
    history = trainer.train()
    parallel.check_in_sync()  # the copies are still identical
    return {"skipped": [e for e in history if "skipped" in e], "steps": [e["step"] for e in history if "loss" in e],
            "params": [p.numpy().tolist() for p in trainer.optimizer.params]}


def resume(parallel, out):
    """Losses of an uninterrupted 4-step run, and of one stopped after 2 steps and resumed."""
    def run(max_steps, output_dir, resume_from_checkpoint=None):
        args = training_args(optim="adamw", per_device_train_batch_size=2, gradient_accumulation_steps=2,
                             lr_scheduler_type="constant", max_steps=max_steps, output_dir=str(output_dir))
        trainer = Trainer(tiny_gpt(), args, dataset(23), distributed=parallel)
        history = trainer.train(resume_from_checkpoint=resume_from_checkpoint)
        return [e["loss"] for e in history if "loss" in e], [p.numpy().tolist() for p in trainer.optimizer.params]

    full, full_params = run(4, out / "full")
    run(2, out / "stopped")
    resumed, resumed_params = run(4, out / "stopped", resume_from_checkpoint=True)
    return {"full": full, "resumed": resumed, "same_params": full_params == resumed_params,
            "checkpoint": str(out / "stopped" / "checkpoint-4.npz")}


def errors(parallel, out):
    from tinygrad_ckpt.distributed import DistributedError

    messages = {}

    def attempt(name, build):
        try:
            build()
            messages[name] = None
        except (DistributedError, ValueError) as e:
            messages[name] = f"{type(e).__name__}: {e}"

    rank = parallel.rank
    attempt("model", lambda: Trainer(tiny_gpt(n_embd=16 if rank == 0 else 24), training_args(), dataset(20),
                                     distributed=parallel))
    attempt("arguments", lambda: Trainer(tiny_gpt(), training_args(seed=3 + rank), dataset(20), distributed=parallel))
    attempt("data_size", lambda: Trainer(tiny_gpt(), training_args(), dataset(20 + rank), distributed=parallel))
    attempt("config", lambda: Trainer(tiny_gpt(n_head=2 if rank == 0 else 4), training_args(), dataset(20),
                                      distributed=parallel))  # the same shapes: only the configuration differs
    attempt("tokenizer", lambda: Trainer(tiny_gpt(), training_args(), dataset(20), distributed=parallel,
                                         tokenizer=CharTokenizer("abcdefghijk" if rank == 0 else "abcdefghikj")))
    attempt("data", lambda: Trainer(tiny_gpt(), training_args(), dataset(20, seed=1 + rank), distributed=parallel))
    (out / "a_file").write_text("rank 0 cannot make a directory inside a file")
    attempt("output_dir", lambda: Trainer(tiny_gpt(), training_args(output_dir=str(out / "a_file" / "run")), dataset(20),
                                          distributed=parallel).train())

    def resume_elsewhere():  # two runs' checkpoints; each rank resumes from another one
        for lr in (3e-2, 1e-2):
            args = training_args(max_steps=1, learning_rate=lr, output_dir=str(out / f"run_{lr}"))
            Trainer(tiny_gpt(), args, dataset(20), distributed=parallel).train()
        mine = out / f"run_{3e-2 if rank == 0 else 1e-2}" / "checkpoint-1.npz"
        Trainer(tiny_gpt(), training_args(max_steps=2), dataset(20), distributed=parallel).train(resume_from_checkpoint=mine)

    attempt("resume_elsewhere", resume_elsewhere)
    attempt("too_little_data", lambda: Trainer(tiny_gpt(), training_args(per_device_train_batch_size=3), dataset(5),
                                               distributed=parallel))

    def diverge():
        model = tiny_gpt()
        trainer = Trainer(model, training_args(max_steps=3), dataset(20), distributed=parallel)
        parallel.check_every, parallel.steps = 1, 0
        if rank == 1:  # one rank's copy changes outside the optimizer step
            model.blocks[1].mlp.c_fc.weight.data[0, 0] += 1e-12
        trainer.train()

    attempt("diverge", diverge)
    (out / f"errors_rank{rank}.json").write_text(json.dumps(messages))


def main(scenario, out):
    from tinygrad_ckpt.distributed import DataParallel

    parallel = DataParallel()
    out = Path(out)
    if scenario == "equivalence":
        equivalence(parallel, out, checkpointing=hasattr(GPT, "gradient_checkpointing_enable"))
    elif scenario == "errors":
        errors(parallel, out)
    elif scenario == "abort":
        from tinygrad_ckpt.distributed import abort_if_running

        if parallel.rank == 1:
            print("rank 1 failed alone", file=sys.stderr, flush=True)
            abort_if_running(3)
        parallel.comm.all_gather("rank 0 waits here for rank 1, which never comes")
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
