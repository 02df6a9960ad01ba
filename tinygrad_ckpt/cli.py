"""The command line: `tinygrad-ckpt train ...` (also `python -m tinygrad_ckpt train ...`).

    tinygrad-ckpt train                                   # a small GPT on the embedded plays, ~1 minute
    tinygrad-ckpt train --per-device-train-batch-size 4 --gradient-accumulation-steps 8
    tinygrad-ckpt train --data my.txt --max-steps 500 --output-dir out
    tinygrad-ckpt train --output-dir out --resume         # continue from out/checkpoint.npz
    mpiexec -n 2 tinygrad-ckpt train ...                  # data parallel: 2 processes (distributed.py)
    tinygrad-ckpt verify                                  # every strategy changes no gradient (testing/verify.py)

Each subcommand is a parser (its flags) and a function run(args). The train
command's flags are TrainingArguments' fields written as flags, plus the data
and model sizes. Another subcommand lives in its own module with
`add_arguments(parser)` and `run(args)`, and gets two lines in build_parser().

What does not live here: the training loop (train.py), the data (data.py),
the model (nn/).
"""

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import fields

import numpy

from . import bench, memory, random
from .data import load_char_datasets
from .distributed import DistributedError, abort_if_running, from_environment
from .nn import GPT, GPTConfig
from .testing import verify
from .train import TrainingArguments, Trainer

# The default run: a 3-layer character GPT (348k parameters) on the embedded
# text, 500 steps of 16 x 64 characters, about 45 s of CPU time; its loss falls
# from 4.2 to about 2.1 (validation about 2.15). Measured on the 2-core
# development machine; tokens/s are printed as it runs.
DEFAULTS = dict(
    block_size=64, n_layer=3, n_head=4, n_embd=96, dropout=0.0,
    per_device_train_batch_size=16, gradient_accumulation_steps=1, max_steps=500,
    learning_rate=6e-3, warmup_steps=20, lr_scheduler_type="cosine", logging_steps=50,
)


def add_train_arguments(parser):
    d = DEFAULTS
    data = parser.add_argument_group("data")
    data.add_argument("--data", metavar="PATH", default=None,
                      help="a UTF-8 text file to learn from (default: the embedded Shakespeare plays)")
    data.add_argument("--val-fraction", type=float, default=0.1,
                      help="the last fraction of the text kept for validation (default: %(default)s; 0: none)")

    model = parser.add_argument_group("model (a GPT, nanoGPT's names)")
    model.add_argument("--block-size", type=int, default=d["block_size"], help="context length in characters (default: %(default)s)")
    model.add_argument("--n-layer", type=int, default=d["n_layer"], help="transformer blocks (default: %(default)s)")
    model.add_argument("--n-head", type=int, default=d["n_head"], help="attention heads; must divide --n-embd (default: %(default)s)")
    model.add_argument("--n-embd", type=int, default=d["n_embd"], help="embedding width (default: %(default)s)")
    model.add_argument("--dropout", type=float, default=d["dropout"], help="dropout probability (default: %(default)s)")
    model.add_argument("--device", default="cpu", help="'cpu' or 'cuda' (needs CuPy) (default: %(default)s)")

    t = parser.add_argument_group("training (TrainingArguments, as in Hugging Face)")
    t.add_argument("--per-device-train-batch-size", type=int, default=d["per_device_train_batch_size"],
                   help="examples per micro-batch (default: %(default)s)")
    t.add_argument("--per-device-eval-batch-size", type=int, default=32, help="examples per evaluation batch (default: %(default)s)")
    t.add_argument("--gradient-accumulation-steps", type=int, default=d["gradient_accumulation_steps"],
                   help="micro-batches per optimizer step (default: %(default)s)")
    t.add_argument("--gradient-checkpointing", action="store_true",
                   help="recompute activations in backward instead of keeping them")
    t.add_argument("--gradient-checkpointing-kwargs", type=_json_object, default=None, metavar="JSON",
                   help="""with --gradient-checkpointing: which segments and policy, as JSON, e.g. """
                        """'{"segments": "sqrt", "policy": "selective_attention"}' (default: every block, full recompute)""")
    t.add_argument("--max-steps", type=int, default=d["max_steps"],
                   help="optimizer steps; <= 0 to use --num-train-epochs (default: %(default)s)")
    t.add_argument("--num-train-epochs", type=float, default=1.0, help="epochs, when --max-steps <= 0 (default: %(default)s)")
    t.add_argument("--learning-rate", type=float, default=d["learning_rate"], help="peak learning rate (default: %(default)s)")
    t.add_argument("--lr-scheduler-type", choices=("constant", "linear", "cosine"), default=d["lr_scheduler_type"],
                   help="learning-rate schedule after warmup (default: %(default)s)")
    t.add_argument("--warmup-steps", type=int, default=d["warmup_steps"], help="linear warmup steps (default: %(default)s)")
    t.add_argument("--weight-decay", type=float, default=0.0, help="(default: %(default)s)")
    t.add_argument("--adam-beta1", type=float, default=0.9, help="(default: %(default)s)")
    t.add_argument("--adam-beta2", type=float, default=0.99, help="(default: %(default)s)")
    t.add_argument("--adam-epsilon", type=float, default=1e-8, help="(default: %(default)s)")
    t.add_argument("--max-grad-norm", type=float, default=1.0, help="clip the gradient norm; 0: off (default: %(default)s)")
    t.add_argument("--optim", choices=("adamw", "sgd"), default="adamw", help="(default: %(default)s)")
    t.add_argument("--accumulation-dtype", default=None, help="dtype of the accumulation buffers, e.g. float64 (default: the parameters')")
    t.add_argument("--logging-steps", type=int, default=d["logging_steps"], help="print the loss every N optimizer steps (default: %(default)s)")
    t.add_argument("--logging-first-step", action=argparse.BooleanOptionalAction, default=True,
                   help="also log the first step's loss (default: %(default)s)")
    t.add_argument("--eval-steps", type=int, default=0, help="evaluate every N optimizer steps; 0: at the end only (default: %(default)s)")
    t.add_argument("--save-steps", type=int, default=0,
                   help="write the resumable state every N optimizer steps; 0: at the end only (default: %(default)s)")
    t.add_argument("--output-dir", default=None, help="where checkpoint.npz and model.npz are written (default: nowhere)")
    t.add_argument("--resume", nargs="?", const=True, default=None, metavar="CHECKPOINT",
                   help="continue from CHECKPOINT (default: OUTPUT_DIR/checkpoint.npz)")
    t.add_argument("--seed", type=int, default=0, help="model init, data order and dropout (default: %(default)s)")
    t.add_argument("--disable-tqdm", action="store_true", help="no live progress line")

    out = parser.add_argument_group("after training")
    out.add_argument("--sample-chars", type=int, default=300, help="characters to sample at the end; 0: none (default: %(default)s)")
    out.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default: %(default)s)")


def _json_object(text):
    """An argparse type: a JSON object (a dict), as Hugging Face's command lines take kwargs."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"segments\": \"sqrt\"}}', got {text!r}")
    return value


def run_train(args):
    """tinygrad-ckpt train: data -> GPT -> Trainer -> validation loss -> a sample."""
    parallel = from_environment()  # under `mpiexec -n N` (N > 1) a DataParallel, else None
    if parallel is not None and not parallel.is_main_process:  # only rank 0 prints
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
            return _train(args, parallel)
    return _train(args, parallel)


def _train(args, parallel):
    start = time.perf_counter()
    tokenizer, train_data, val_data = load_char_datasets(args.data, args.block_size, args.val_fraction)
    training_args = TrainingArguments(**{f.name: getattr(args, f.name) for f in fields(TrainingArguments)})
    random.manual_seed(args.seed)
    config = GPTConfig(
        block_size=args.block_size, vocab_size=tokenizer.vocab_size, n_layer=args.n_layer,
        n_head=args.n_head, n_embd=args.n_embd, dropout=args.dropout,
    )
    model = GPT(config, rng=numpy.random.default_rng(args.seed), device=args.device)
    trainer = Trainer(model=model, args=training_args, train_dataset=train_data, eval_dataset=val_data, tokenizer=tokenizer,
                      distributed=parallel)

    n_params = sum(p.numel() for p in trainer.optimizer.params)
    print(
        f"data: {'embedded Shakespeare' if args.data is None else args.data}, {len(train_data)} training examples "
        f"of {args.block_size} characters, vocabulary {tokenizer.vocab_size}"
        + (f", {len(val_data)} validation examples" if val_data is not None else "")
    )
    print(
        f"model: GPT, {args.n_layer} layers, {args.n_head} heads, width {args.n_embd}, {n_params:,} parameters "
        f"({memory.format_bytes(memory.current()['parameters'])}) on {args.device}"
    )
    print(
        f"training: {trainer.total_steps} optimizer steps of {training_args.effective_batch_size * trainer.world_size} "
        f"examples = {args.per_device_train_batch_size} per micro-batch x {args.gradient_accumulation_steps} "
        "accumulation steps" + (f" x {trainer.world_size} processes" if parallel is not None else "")
    )
    history = trainer.train(resume_from_checkpoint=args.resume)

    evals = [e["eval_loss"] for e in history if "eval_loss" in e]
    logs = [e for e in history if "loss" in e]
    if logs:
        print(f"training loss: {logs[0]['loss']:.4f} (step {logs[0]['step']}) -> {logs[-1]['loss']:.4f} (step {logs[-1]['step']})")
    if evals:
        print(f"validation loss: {evals[-1]:.4f}")
    if args.output_dir is not None:
        print(f"saved: {args.output_dir}/model.npz (model, tokenizer, config) and {args.output_dir}/checkpoint.npz (to resume)")
    if args.sample_chars > 0:
        model.eval()
        prompt = "\n" if "\n" in tokenizer.stoi else tokenizer.chars[0]
        ids = model.generate(tokenizer.encode(prompt)[None, :], args.sample_chars,
                             temperature=args.temperature, rng=numpy.random.default_rng(args.seed))
        print("sample:\n" + tokenizer.decode(ids[0, len(prompt):]))
    print(f"time: {time.perf_counter() - start:.1f} s")
    return 0


def build_parser():
    parser = argparse.ArgumentParser(
        prog="tinygrad-ckpt",
        description="Train small models with gradient accumulation and activation checkpointing, "
                    "and watch the memory.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train = commands.add_parser("train", help="train a character-level GPT (embedded data by default)",
                                description=run_train.__doc__)
    add_train_arguments(train)
    train.set_defaults(run=run_train)
    bench_parser = commands.add_parser("bench", help="compare checkpointing and accumulation strategies: tables, JSON, plots",
                                       description=bench.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_arguments(bench_parser)
    bench_parser.set_defaults(run=bench.run)
    verify_parser = commands.add_parser("verify", help="check every checkpointing and accumulation strategy "
                                        "against the plain gradients: one table", description=verify.DESCRIPTION,
                                        formatter_class=argparse.RawDescriptionHelpFormatter)
    verify.add_arguments(verify_parser)
    verify_parser.set_defaults(run=verify.run)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, OSError, ImportError, DistributedError) as e:  # bad input: say what is wrong, no traceback
        print(f"tinygrad-ckpt {args.command}: error: {e}", file=sys.stderr)
        abort_if_running(2)  # under mpiexec: stop the other processes too, or they would wait forever
        return 2
    except Exception:
        abort_if_running(1, traceback=True)  # the same, after the traceback (a plain run just raises)
        raise
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
