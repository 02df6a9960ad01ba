"""What each process runs when tests/test_zero.py starts `mpiexec -n N python tests/zero_worker.py OUT`.

Not a test file (pytest does not collect it). For each case and each ZeRO
stage (0: plain data parallelism, 1, 2, 3), one Trainer run; each rank writes
`zero_rank<r>.json` into OUT: its parameters (at stage 3 gathered after
every step: all ranks must hold the same), losses, its shards' AdamW
moments, the padding, and its bytes by category when training ended. The
test compares them with a single-process run it does itself.
"""

import json
import sys
from pathlib import Path

import numpy

from tinygrad_ckpt import memory
from tinygrad_ckpt.distributed import DataParallel
from tinygrad_ckpt.nn import GPT, GPTConfig
from tinygrad_ckpt.train import Trainer

sys.path.insert(0, str(Path(__file__).parent))
from mpi_worker import T, V, dataset, training_args  # noqa: E402  (the data of data parallelism's tests)

# (name, TrainingArguments overrides, the model's dtype). Effective batch B x G x N.
CASES = [
    ("adamw", dict(optim="adamw", per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=3,
                   max_grad_norm=0.05), numpy.float64),
    ("sgd_checkpointing", dict(optim="sgd", per_device_train_batch_size=1, gradient_accumulation_steps=3, max_steps=3,
                               gradient_checkpointing=True), numpy.float64),
    ("selective", dict(optim="sgd", per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=3,
                       gradient_checkpointing=True, gradient_checkpointing_kwargs={"policy": "selective_attention"}),
     numpy.float64),
    ("bf16", dict(optim="sgd", per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=3, bf16=True,
                  gradient_checkpointing=True), numpy.float32),
    ("fp16", dict(optim="sgd", per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=6, fp16=True),
     numpy.float32),
    ("frozen", dict(optim="sgd", per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=3),
     numpy.float64),  # FROZEN stay as they were: in the root and in a block
]
FROZEN = ("wpe.weight", "blocks.0.ln_1.weight")
# epoch_end: on 3 processes the epoch's last micro-batch is 1 example: 2 ranks have none, and at stage 3 still run one
# example (its loss times 0) to gather and reduce with the rank that has it
CASES.append(("epoch_end", dict(optim="sgd", per_device_train_batch_size=1, gradient_accumulation_steps=2, max_steps=7),
              numpy.float64))
STAGES = (0, 1, 2, 3)
N_EXAMPLES = 40


def gpt(dtype, seed=0, frozen=False):
    """A small GPT of 3,421 parameters (no number of ranks from 2 to 4 divides it: every shard layout is padded);
    frozen: FROZEN do not require grad."""
    config = GPTConfig(block_size=T, vocab_size=V, n_layer=2, n_head=1, n_embd=11, dropout=0.0)
    model = GPT(config, rng=numpy.random.default_rng(seed), dtype=dtype)
    for name, p in model.named_parameters():
        p.requires_grad = not (frozen and name in FROZEN)
    return model


def run(parallel, name, overrides, dtype, stage):
    model = gpt(dtype, seed=parallel.rank, frozen=name == "frozen")  # every rank starts elsewhere: the broadcast fixes it
    trainer = Trainer(model, training_args(zero_stage=stage, **overrides), dataset(N_EXAMPLES), distributed=parallel)
    calls, micro_batches, accumulate = dict(parallel.comm.calls), [], trainer.accumulator.accumulate
    sent = dict(parallel.comm.bytes_sent)
    trainer.accumulator.accumulate = lambda *a, **k: micro_batches.append(1) or accumulate(*a, **k)
    steps = []  # stage 3: every step's parameters, gathered, on every rank
    if stage == 3:
        step = trainer._optimizer_step
        trainer._optimizer_step = lambda *a: (lambda out: steps.append(gathered(trainer, model)) or out)(step(*a))
    history = trainer.train()
    calls = {k: parallel.comm.calls[k] - calls.get(k, 0) for k in parallel.comm.calls}
    sent = {k: parallel.comm.bytes_sent[k] - sent[k] for k in sent}
    parallel.check_in_sync()
    opt = trainer.optimizer
    return {
        "params": gathered(trainer, model),
        "steps": steps,
        "groups": [members for _, members, _ in trainer.accumulator.layout.groups] if stage else [],
        "sent": sent,
        "losses": [e["loss"] for e in history if "loss" in e],
        "moments": [[a.astype(numpy.float64).tolist() for a in getattr(opt, name, [])] for name in ("exp_avg", "exp_avg_sq")],
        "padding": [p.astype(numpy.float64).tolist() for p in trainer.accumulator.layout.padding()] if stage else [],
        "bytes": dict(memory.current()),
        "calls": calls,
        "shard_sizes": [S for _, _, S in trainer.accumulator.layout.groups] if stage else [],
        "micro_batches": len(micro_batches),
    }


def gathered(trainer, model):
    """The parameters as lists (at stage 3 gathered: every rank all-gathers them together)."""
    with trainer.gathered():
        return [p.numpy().astype(numpy.float64).tolist() for p in model.parameters()]


def main(out):
    parallel = DataParallel(check_every=1)
    results = {}
    for name, overrides, dtype in CASES:
        for stage in STAGES:
            import gc
            gc.collect()
            results[f"{name}_{stage}"] = run(parallel, name, overrides, dtype, stage)
    (Path(out) / f"zero_rank{parallel.rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
