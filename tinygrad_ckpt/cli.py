"""The command line: `tinygrad-ckpt train ...` (also `python -m tinygrad_ckpt train ...`), `bench`, `fit`.

    tinygrad-ckpt train                                   # a small GPT on the embedded plays, ~1 minute
    tinygrad-ckpt train --per-device-train-batch-size 4 --gradient-accumulation-steps 8
    tinygrad-ckpt train --data my.txt --max-steps 500 --output-dir out --save-steps 50
    tinygrad-ckpt train --output-dir out --save-steps 50 --resume   # continue from out's newest good checkpoint
    mpiexec -n 2 tinygrad-ckpt train ...                  # data parallel: 2 processes (distributed.py)
    tinygrad-ckpt verify                                  # every strategy changes no gradient (testing/verify.py)

Each subcommand is a parser (its flags) and a function run(args). The train
command's training flags are generated from TrainingArguments' fields: each
field is one flag (`per_device_train_batch_size` -> `--per-device-train-batch-size`)
with the field's type, default and help (its metadata), so the two cannot
drift apart. The demo overrides a few defaults, all in DEFAULTS, which
`--help` prints. The data, model and sampling flags are written here. Another
subcommand lives in its own module with `add_arguments(parser)` and
`run(args)`, and gets two lines in build_parser().

Errors: a mistake a user can make (a bad flag value, a missing or damaged
file, a checkpoint of another model, a missing optional dependency, processes
that disagree, a run that diverges) is one line on stderr naming the flag or
file and what to do, with exit status 2. A traceback means a bug, or that
`--debug` was given. Flags are never abbreviated (`--lr` is not
`--lr-scheduler-type`).

What does not live here: the training loop (train.py), the data (data.py),
the model (nn/).
"""

import argparse
import contextlib
import json
import math
import os
import sys
import time
from dataclasses import MISSING, fields

import numpy

from . import backend, bench, fit, memory, random, schedules
from .data import load_char_datasets
from .distributed import DistributedError, abort_if_running, from_environment
from .nn import GPT, GPTConfig
from .nn.module import LoadStateDictError
from .testing import verify
from .threads import limited_threads, thread_count
from .train import TrainingArguments, Trainer

# The default run: a 3-layer character GPT (348k parameters) on the embedded
# text, 500 steps of 16 x 64 characters (benchmarks/README.md says how long it
# takes, and what it reaches). These are the demo's only departures from
# GPTConfig's and TrainingArguments' defaults. keep_freed_memory: the command
# owns its process, so it keeps what a step frees for the next step
# (allocator.py); the library never does unless asked.
DEFAULTS = dict(
    block_size=64, n_layer=3, n_head=4, n_embd=96, dropout=0.0,  # the model (GPTConfig)
    per_device_train_batch_size=16, per_device_eval_batch_size=32, max_steps=500, learning_rate=6e-3,
    warmup_steps=20, lr_scheduler_type="cosine", adam_beta2=0.99, logging_steps=50, logging_first_step=True,
    seed=0, keep_freed_memory=True,
)

# The exceptions that mean "the input is wrong", not "the program is wrong":
# one line and exit status 2 (CheckpointFileError is a ValueError; FloatingPointError
# is a run that diverged; MemoryError is a run too big for this machine).
USER_ERRORS = (ValueError, OSError, ImportError, DistributedError, LoadStateDictError, FloatingPointError,
               MemoryError)


class ArgumentParser(argparse.ArgumentParser):
    """argparse without abbreviations, whose errors are one line (no usage block), exit status 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_train_arguments(parser):
    d = DEFAULTS
    data = parser.add_argument_group("data")
    data.add_argument("--data", metavar="PATH", default=None,
                      help="a UTF-8 text file to learn from (default: the embedded Shakespeare plays)")
    data.add_argument("--val-fraction", type=float, default=0.1,
                      help="the last fraction of the text kept for validation (default: %(default)s; 0: none)")

    model = parser.add_argument_group("model (a GPT, nanoGPT's names)")
    model.add_argument("--block-size", type=_positive_int, default=d["block_size"], help="context length in characters (default: %(default)s)")
    model.add_argument("--n-layer", type=_positive_int, default=d["n_layer"], help="transformer blocks (default: %(default)s)")
    model.add_argument("--n-head", type=_positive_int, default=d["n_head"], help="attention heads; must divide --n-embd (default: %(default)s)")
    model.add_argument("--n-embd", type=_positive_int, default=d["n_embd"], help="embedding width (default: %(default)s)")
    model.add_argument("--dropout", type=_probability, default=d["dropout"], help="dropout probability (default: %(default)s)")
    model.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="'cuda' needs CuPy and a GPU (default: %(default)s)")
    model.add_argument("--threads", type=thread_count, default=None,
                       help="BLAS threads for training (default: BLAS's own, one per core; on a busy machine 1 is "
                            "faster: benchmarks/README.md, 'On a busy machine'); sampling always runs on one")

    training = parser.add_argument_group("training (TrainingArguments, as in Hugging Face)")
    add_dataclass_arguments(training, TrainingArguments, d)
    training.add_argument("--memory-report", metavar="PATH", default=None,
                          help="record the first optimizer step (all its micro-batches) and write the memory "
                               "explorer page there, one self-contained HTML file (needs Plotly: "
                               "pip install -e \".[report]\")")
    training.add_argument("--resume", nargs="?", const=True, default=None, metavar="CHECKPOINT",
                          help="continue from CHECKPOINT, a file or a directory (default: the newest checkpoint "
                               "in --output-dir that verifies)")

    out = parser.add_argument_group("after training")
    out.add_argument("--sample-chars", type=_count, default=300,
                     help="characters to sample at the end, on one BLAS thread; 0: none (default: %(default)s)")
    out.add_argument("--temperature", type=_positive_float, default=0.8, help="sampling temperature, > 0 (default: %(default)s)")


def add_dataclass_arguments(group, cls, defaults):
    """One flag per field of the dataclass `cls`: name, type, default (from `defaults` if there), help, choices.

    bool fields become --flag / --no-flag, dict fields take JSON, and a
    field's metadata holds its "help" (and "choices", if any).
    """
    parsers = {int: int, float: float, str: str, dict: _json_object}
    for f in fields(cls):
        flag = "--" + f.name.replace("_", "-")
        default = defaults.get(f.name, f.default)
        if default is MISSING:
            raise TypeError(f"{cls.__name__}.{f.name} has no default, so it cannot be an optional flag")
        help = f.metadata.get("help", "").replace("%", "%%") + " (default: %(default)s)"
        if f.type is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help)
        elif f.type in parsers:
            group.add_argument(flag, type=parsers[f.type], default=default, choices=f.metadata.get("choices"),
                               metavar="JSON" if f.type is dict else None, help=help)
        else:
            raise TypeError(f"{cls.__name__}.{f.name} is a {f.type}, which the command line cannot parse")


def _defaults_epilog():
    shown = ", ".join(f"{name}={value!r}" for name, value in DEFAULTS.items())
    return f"The demo's defaults, where they differ from GPTConfig's and TrainingArguments': {shown}."


def _json_object(text):
    """An argparse type: a JSON object (a dict), as Hugging Face's command lines take kwargs."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"segments\": \"sqrt\"}}', got {text!r}")
    return value


def _positive_int(text):
    value = _parse(int, text, "an integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def _count(text):
    value = _parse(int, text, "an integer")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


def _positive_float(text):
    value = _parse(float, text, "a number")
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _probability(text):
    value = _parse(float, text, "a number")
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text!r}")
    return value


def _parse(kind, text, what):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None


def run_train(args):
    """tinygrad-ckpt train: data -> GPT -> Trainer -> validation loss -> a sample."""
    parallel = from_environment()  # under `mpiexec -n N` (N > 1) a DataParallel, else None
    if parallel is not None and not parallel.is_main_process:  # only rank 0 prints
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
            return _train(args, parallel)
    return _train(args, parallel)


def _train(args, parallel):
    start, cpu_start = time.perf_counter(), time.process_time()
    training_args = TrainingArguments(**{f.name: getattr(args, f.name) for f in fields(TrainingArguments)})
    if args.device == "cuda":
        try:
            backend.module_for("cuda")
        except RuntimeError as e:  # CuPy or a GPU is missing: an optional dependency, not a bug
            raise ImportError(str(e)) from None
    callbacks = []
    if args.memory_report is not None:
        from .bench.explorer import MemoryReport  # Plotly, the `report` extra: only when asked for

        callbacks.append(MemoryReport(args.memory_report))  # its path is checked now, before any step
    tokenizer, train_data, val_data = load_char_datasets(args.data, args.block_size, args.val_fraction)
    random.manual_seed(args.seed)
    config = GPTConfig(
        block_size=args.block_size, vocab_size=tokenizer.vocab_size, n_layer=args.n_layer,
        n_head=args.n_head, n_embd=args.n_embd, dropout=args.dropout,
    )
    try:
        model = GPT(config, rng=numpy.random.default_rng(args.seed), device=args.device)
        trainer = Trainer(model=model, args=training_args, train_dataset=train_data, eval_dataset=val_data,
                          tokenizer=tokenizer, distributed=parallel, callbacks=callbacks)
    except MemoryError as e:  # the model itself, before any batch: the batch advice would not help
        raise ValueError(f"the model and its optimizer state do not fit in memory ({e or 'MemoryError'}); use a "
                         "smaller --n-embd, --n-layer or --block-size") from None

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
    for line in training_header(trainer):
        print(line)
    with limited_threads(args.threads):  # None: as BLAS set itself up
        history = trainer.train(resume_from_checkpoint=args.resume)

    evals = [e["eval_loss"] for e in history if "eval_loss" in e]
    logs = [e for e in history if "loss" in e]
    if logs:
        print(f"training loss: {logs[0]['loss']:.4f} (step {logs[0]['step']}) -> {logs[-1]['loss']:.4f} (step {logs[-1]['step']})")
    if trainer.state.nonfinite_steps:
        print(f"skipped: {trainer.state.nonfinite_steps} optimizer step(s) with a non-finite loss or gradient norm")
    if evals:
        print(f"validation loss: {evals[-1]:.4f}")
    if args.output_dir is not None:
        print(f"saved: {args.output_dir}/model.npz (model, tokenizer, config) and "
              f"{args.output_dir}/checkpoint-{trainer.state.global_step}.npz (to resume)")
    if args.sample_chars > 0:
        model.eval()
        prompt = "\n" if "\n" in tokenizer.stoi else tokenizer.chars[0]
        # One BLAS thread: each character is a forward on one sequence, products too small to split
        # among threads, and on a busy machine threads that wait for a core make it many times slower
        # (threads.py; benchmarks/README.md, "On a busy machine").
        with limited_threads(1):
            ids = model.generate(tokenizer.encode(prompt)[None, :], args.sample_chars,
                                 temperature=args.temperature, rng=numpy.random.default_rng(args.seed))
        print("sample:\n" + tokenizer.decode(ids[0, len(prompt):]))
    print(f"time: {time.perf_counter() - start:.1f} s wall clock, {time.process_time() - cpu_start:.1f} s of CPU "
          "(all threads of this process)")
    return 0


def training_header(trainer):
    """The lines that say what a run does: the effective batch, checkpointing, memory, and what "loss" means."""
    args, world = trainer.args, trainer.world_size
    lines = [
        f"training: {trainer.total_steps} optimizer steps, each of {args.effective_batch_size * world} examples "
        f"(the effective batch) = {args.per_device_train_batch_size} per micro-batch x "
        f"{_plural(args.gradient_accumulation_steps, 'accumulation step')} x {_plural(world, 'process', 'processes')}",
        f"checkpointing: {_checkpointing_in_force(trainer.model, args.gradient_checkpointing_kwargs)}",
        f"precision: {_precision(trainer)}",
        "memory: 'mem' in a log line is what the process holds then (parameters, gradients, optimizer state, "
        "accumulation buffers, activations), 'peak' the most since training started" if world == 1 else
        f"memory: per process: 'mem' in a log line is what process 0 holds then, 'peak' the most since training "
        f"started; each of the {world} processes holds as much (its own model, gradients, optimizer state, "
        "buffers and activations)",
    ]
    lines.append("allocator: freed memory is kept for the next step (glibc's malloc, tinygrad_ckpt.allocator; "
                 "this command's default, --no-keep-freed-memory leaves the C library's); 'mem' and 'peak' count "
                 "the arrays, not the freed memory malloc keeps"
                 if args.keep_freed_memory else
                 "allocator: the C library's default (--no-keep-freed-memory): what a step frees may go back to "
                 "the system, to be faulted in again by the next step")
    if args.logging_steps:
        every = "every optimizer step" if args.logging_steps == 1 else f"every {args.logging_steps} optimizer steps"
        lines.append(f"logging: {every}{' and after the first' if args.logging_first_step and args.logging_steps > 1 else ''}; "
                     "'loss' is the mean per token over the optimizer steps since the previous log line, "
                     "in the log lines and in the progress bar")
    return lines


def _precision(trainer):
    """Which dtype each kind of array has in this run (fp16 / bf16: mixed precision, autocast.py), in words."""
    params = trainer.optimizer.params
    kept = (f"parameters {params[0].dtype}, gradients {params[0].dtype}, optimizer state {params[0].dtype}, "
            f"accumulation buffers {trainer.accumulator.buffers[0].dtype}")
    low = trainer.args.autocast_dtype
    if low is None:
        return f"{kept}, activations {params[0].dtype} (--bf16 or --fp16: mixed precision)"
    scaling = (f"the loss scaled by {trainer.scaler.get_scale():g} (GradScaler; a step whose gradients overflow is "
               "skipped and the scale halved)" if trainer.scaler.enabled else
               "no loss scaling (bfloat16 has float32's exponent range)")
    return (f"mixed, {low}: {kept}; matrix products (Linear, the attention products) and what they save in {low}; "
            f"layer norm, softmax and the loss in float32; {scaling}")


def _checkpointing_in_force(model, kwargs):
    """What the model's gradient checkpointing was switched to (the Trainer switches it on), in words.

    kwargs: TrainingArguments.gradient_checkpointing_kwargs, for the name the policy was given by.
    """
    segments = getattr(model, "checkpoint_segments", None)
    if segments is None:
        return "off: every activation is kept for backward (--gradient-checkpointing recomputes instead)"
    chain = model.checkpoint_chain()
    split = getattr(model, "checkpoint_split_blocks", False)
    unit = "half blocks (each block's attention and feed-forward apart)" if split else "blocks"
    if segments == "every":
        cut = f"each of the {len(chain)} {unit} is a segment"
    else:
        given = str(segments) if isinstance(segments, schedules.Plan) else repr(segments)
        n = len(schedules.segment_bounds(len(chain), segments))
        cut = f"{_plural(n, 'segment')} (segments={given}) of the {len(chain)} {unit}"
    policy = getattr(model, "checkpoint_policy", None)
    if policy is None:
        return f"{cut}; a segment keeps only its input, and recomputes all of its inside in backward"
    name = (kwargs or {}).get("policy")
    name = name if isinstance(name, str) else getattr(policy, "__name__", repr(policy))
    return f"{cut}; policy {name}: a segment keeps what the policy saves, and recomputes the rest in backward"


def _plural(n, word, plural=None):
    return f"{n} {word if n == 1 else plural or word + 's'}"


def build_parser():
    parser = ArgumentParser(
        prog="tinygrad-ckpt",
        description="Train small models with gradient accumulation and activation checkpointing, "
                    "and watch the memory.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train = commands.add_parser("train", help="train a character-level GPT (embedded data by default)",
                                description=run_train.__doc__, epilog=_defaults_epilog())
    add_train_arguments(train)
    train.set_defaults(run=run_train)
    bench_parser = commands.add_parser("bench", help="compare checkpointing and accumulation strategies: tables, JSON, plots",
                                       description=bench.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_arguments(bench_parser)
    bench_parser.set_defaults(run=bench.run)
    fit_parser = commands.add_parser("fit", help="will a GPT's training step fit on a GPU? per strategy, and what to do",
                                     description=fit.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    fit.add_arguments(fit_parser)
    fit_parser.set_defaults(run=fit.run)
    verify_parser = commands.add_parser("verify", help="check every checkpointing and accumulation strategy "
                                        "against the plain gradients: one table", description=verify.DESCRIPTION,
                                        formatter_class=argparse.RawDescriptionHelpFormatter)
    verify.add_arguments(verify_parser)
    verify_parser.set_defaults(run=verify.run)
    parser.subcommands = {"train": train, "bench": bench_parser, "fit": fit_parser, "verify": verify_parser}
    for subcommand in parser.subcommands.values():
        subcommand.add_argument("--debug", action="store_true",
                                help="show the full traceback of an error, not only its one-line message")
    return parser


def main(argv=None):
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # reported by the subcommand, so the message points at its --help
        parser.subcommands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except USER_ERRORS as e:  # bad input: say what is wrong in one line, no traceback (unless --debug)
        if args.debug:
            abort_if_running(2, traceback=True)
            raise
        print(f"tinygrad-ckpt {args.command}: error: {_one_line(e, args.command)}", file=sys.stderr)
        abort_if_running(2)  # under mpiexec: stop the other processes too, or they would wait forever
        return 2
    except Exception:
        abort_if_running(1, traceback=True)  # the same, after the traceback (a plain run just raises)
        raise


# What to try when a command runs out of memory: the flags of that command.
MEMORY_ADVICE = {
    "train": "try a smaller --per-device-train-batch-size with more --gradient-accumulation-steps, or "
             "--gradient-checkpointing",
    "verify": "try a smaller --batch-size or a smaller model (--n-layer, --n-embd, --mlp-width)",
    "bench": "try --quick",
}


def _one_line(error, command="train"):
    """The error's message on one line (a message listing several problems is joined with '; ')."""
    message = str(error)
    if isinstance(error, OSError) and error.strerror:  # without "[Errno 13]"
        message = error.strerror if error.filename is None else f"{error.filename!r}: {error.strerror}"
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    text = lines[0].rstrip(":") + (": " + "; ".join(lines[1:]) if len(lines) > 1 else "") if lines else ""
    if isinstance(error, MemoryError):
        text = f"out of memory ({text or type(error).__name__}); {MEMORY_ADVICE.get(command, MEMORY_ADVICE['train'])}"
    return text or type(error).__name__
