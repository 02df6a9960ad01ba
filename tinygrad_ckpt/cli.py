"""The command line: `tinygrad-ckpt train ...` (also `python -m tinygrad_ckpt train ...`), `bench`, `fit`.

    tinygrad-ckpt train                                   # a small GPT on the embedded plays, ~1 minute
    tinygrad-ckpt train --model cnn --bf16                # another kind: mlp, cnn, lstm, encoder (KINDS)
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
`--help` prints. The data, model and sampling flags are written here; which
of them a model kind takes, and its defaults, is its row of KINDS. Another
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
from dataclasses import MISSING, dataclass, fields

import numpy

from . import autocast, backend, bench, fit, memory, random, schedules
from . import kinds as model_kinds
from .data import (
    array_examples, curve_task, load_char_datasets, majority_token_task, stack_collate, stripes_task, train_val_split,
)
from .distributed import DistributedError, abort_if_running, from_environment
from .nn import GPT, LSTM, GPTConfig, LSTMLanguageModel
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

# -- the model kinds: `tinygrad-ckpt train --model NAME` -------------------------------------------------
# The language models learn from the embedded text (or --data); the other kinds from a task data.py generates
# from a fixed seed (no download; the same arrays on every machine): GENERATED examples, the last
# --val-fraction of them for validation. The models and losses are kinds.py's, as `bench --kinds` and `fit --model` build them.
GENERATED = 4096


@dataclass(frozen=True)
class Kind:
    """A model kind `train --model NAME` trains: one row of KINDS."""

    flags: dict  # the model, data and sampling flags it takes (their dest names) -> its defaults
    data: object  # args -> (tokenizer or None, training set, validation set or None, the "data:" line)
    build: object  # (args, tokenizer) -> the model, its weights drawn from --seed
    describe: object  # args -> what the "model:" line calls it
    loss: object = None  # the Trainer's compute_loss_func; None: its own, a language model's
    item: str = "token"  # what the loss is a mean over
    chain: str = "blocks"  # what checkpointing cuts into segments


def _text(args):
    tokenizer, train, val = load_char_datasets(args.data, args.block_size, args.val_fraction)
    return tokenizer, train, val, (f"{'embedded Shakespeare' if args.data is None else args.data}, {len(train)} "
                                   f"training examples of {args.block_size} characters, vocabulary {tokenizer.vocab_size}")


def _generated(args, what, **arrays):
    train, val = train_val_split(array_examples(**arrays), args.val_fraction)
    return None, train, val or None, f"generated, {what}, {len(train):,} training examples"


def _curve(args):
    x, y = curve_task(GENERATED)
    return _generated(args, "tutorial 2's curve y = sin(2x) + noise for x in [-3, 3] (data.curve_task)", x=x, y=y)


def _stripes(args):
    images, labels = stripes_task(GENERATED, args.image_size)
    return _generated(args, f"which of 10 directions the stripes of a {args.image_size} x {args.image_size} image "
                            "run in (data.stripes_task)", x=images, y=labels)


def _majority(args):
    ids, labels = majority_token_task(GENERATED, args.block_size, vocab_size=8)
    return _generated(args, f"which of 8 tokens a sequence of {args.block_size} holds most often "
                            "(data.majority_token_task)", input_ids=ids, labels=labels)


def _rng(args):
    return numpy.random.default_rng(args.seed)


def _kind(name, data, describe):
    """The row of KINDS of one of kinds.py's kinds: its sizes are its model flags; its model and loss kinds.py's
    (the LSTM language model's loss is the Trainer's own, as the GPT's)."""
    kind = model_kinds.KINDS[name]
    return Kind(flags={**kind.sizes, **({"data": None} if data is _text else {})}, data=data,
                build=lambda a, tok: kind.build(vars(a), tok and tok.vocab_size, _rng(a), a.device), describe=describe,
                loss=None if name == "lstm" else kind.loss, item=kind.item, chain=kind.chain)


SIZE_FLAGS = ("n_embd", "hidden_size", "widths", "n_layer", "block_size", "image_size")  # in an out-of-memory error
KINDS = {
    "gpt": Kind(
        flags={**{k: DEFAULTS[k] for k in ("block_size", "n_layer", "n_head", "n_embd", "dropout")}, "data": None,
               "sample_chars": 300, "temperature": 0.8},
        data=_text,
        build=lambda a, tok: GPT(GPTConfig(block_size=a.block_size, vocab_size=tok.vocab_size, n_layer=a.n_layer,
                                           n_head=a.n_head, n_embd=a.n_embd, dropout=a.dropout),
                                 rng=_rng(a), device=a.device),
        describe=lambda a: f"GPT, {a.n_layer} layers, {a.n_head} heads, width {a.n_embd}"),
    "lstm": _kind("lstm", _text, lambda a: f"LSTM language model, {_plural(a.n_layer, 'layer')}, hidden size "
                                           f"{a.hidden_size}, embedding width {a.n_embd}"),
    "encoder": _kind("encoder", _majority, lambda a: f"encoder (a classifier), {a.n_layer} layers, {a.n_head} heads, "
                                                     f"width {a.n_embd}"),
    "cnn": _kind("cnn", _stripes, lambda a: f"CNN, stages of widths {', '.join(map(str, a.widths))} (Conv 3x3 -> "
                                            "BatchNorm -> ReLU, twice, then MaxPool)"),
    "mlp": _kind("mlp", _curve, lambda a: f"MLP, {a.n_layer} blocks (Linear -> GELU) of width {a.n_embd}"),
}


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
    parser.add_argument("--model", choices=KINDS, default="gpt",
                        help="the model kind: a GPT or an LSTM language model on the text, an encoder classifying "
                             "generated sequences, a CNN classifying generated images, an MLP fitting a generated "
                             "curve (default: %(default)s)")
    data = parser.add_argument_group("data")
    data.add_argument("--data", metavar="PATH", help=_taken_by("data", "a UTF-8 text file to learn from (default: "
                                                                        "the embedded Shakespeare plays)"))
    data.add_argument("--val-fraction", type=float, default=0.1,
                      help="the last fraction of the data kept for validation (default: %(default)s; 0: none)")

    model = parser.add_argument_group("model (nanoGPT's names; in brackets, the kinds that take a flag and their defaults)")
    model.add_argument("--block-size", type=_positive_int, help=_taken_by("block_size", "context length in characters (the encoder's: sequence length)"))
    model.add_argument("--n-layer", type=_positive_int, help=_taken_by("n_layer", "transformer blocks (the LSTM's: layers; the MLP's: Linear -> GELU blocks)"))
    model.add_argument("--n-head", type=_positive_int, help=_taken_by("n_head", "attention heads; must divide --n-embd"))
    model.add_argument("--n-embd", type=_positive_int, help=_taken_by("n_embd", "embedding width (the MLP's: hidden width)"))
    model.add_argument("--hidden-size", type=_positive_int, help=_taken_by("hidden_size", "the width of the LSTM's state"))
    model.add_argument("--image-size", type=_positive_int, help=_taken_by("image_size", "the images' side; divisible by 2 ** stages"))
    model.add_argument("--widths", type=_widths, help=_taken_by("widths", "the CNN's stages, by their channels"))
    model.add_argument("--dropout", type=_probability, help=_taken_by("dropout", "dropout probability"))
    model.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="'cuda' needs CuPy and a GPU (default: %(default)s)")
    model.add_argument("--threads", type=thread_count, default=None,
                       help="BLAS threads for training (default: BLAS's own, one per core; on a busy machine 1 is "
                            "faster: benchmarks/README.md, 'On a busy machine'); sampling always runs on one")

    training = parser.add_argument_group("training (TrainingArguments, as in Hugging Face)")
    add_dataclass_arguments(training, TrainingArguments, d)
    training.add_argument("--memory-report", metavar="PATH", default=None,
                          help="record the first optimizer step (all its micro-batches) and write the memory "
                               "explorer page there, one self-contained HTML file (needs Plotly: "
                               "pip install -e \".[report]\"); under mpiexec, each process's step side by side")
    training.add_argument("--resume", nargs="?", const=True, default=None, metavar="CHECKPOINT",
                          help="continue from CHECKPOINT, a file or a directory (default: the newest checkpoint "
                               "in --output-dir that verifies)")

    out = parser.add_argument_group("after training")
    out.add_argument("--sample-chars", type=_count, help=_taken_by("sample_chars", "characters to sample at the end, "
                                                                                  "on one BLAS thread; 0: none"))
    out.add_argument("--temperature", type=_positive_float, help=_taken_by("temperature", "sampling temperature, > 0"))


def _taken_by(flag, help):
    """A model flag's help, and the kinds that take it with their defaults: '... [gpt 64, lstm 64]'."""
    def shown(value):
        return "" if value is None else " " + (",".join(map(str, value)) if isinstance(value, tuple) else str(value))

    taken = [name + shown(kind.flags[flag]) for name, kind in KINDS.items() if flag in kind.flags]
    return f"{help} [{', '.join(taken)}]".replace("%", "%%")


def model_flags(args):
    """Fill in the kind's defaults for the model flags not given; refuse one the kind does not take."""
    kind = KINDS[args.model]
    every = {flag for k in KINDS.values() for flag in k.flags}
    given = sorted(flag for flag in every - kind.flags.keys() if getattr(args, flag) is not None)
    if given:
        raise ValueError(f"{_flag_list(given)} {'does' if len(given) == 1 else 'do'} not apply to --model "
                         f"{args.model}, which takes {_flag_list(kind.flags)} (and the training flags)")
    if "split_blocks" in (args.gradient_checkpointing_kwargs or {}) and args.model != "gpt":
        raise ValueError(f"gradient_checkpointing_kwargs' split_blocks cuts a GPT's blocks in halves; --model "
                         f"{args.model} checkpoints its {kind.chain}: give it segments and a policy only")
    for flag in every:
        if getattr(args, flag) is None:
            setattr(args, flag, kind.flags.get(flag))
    return kind


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


def _widths(text):
    """An argparse type: channels per stage, '16,32,64' -> (16, 32, 64)."""
    return tuple(_positive_int(part) for part in text.split(","))


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
    """tinygrad-ckpt train: data -> the model (--model, a GPT by default) -> Trainer -> validation loss -> a sample
    (the GPT's)."""
    parallel = from_environment()  # under `mpiexec -n N` (N > 1) a DataParallel, else None
    if parallel is not None and not parallel.is_main_process:  # only rank 0 prints
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
            return _train(args, parallel)
    return _train(args, parallel)


def _train(args, parallel):
    start, cpu_start = time.perf_counter(), time.process_time()
    kind = model_flags(args)
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
    tokenizer, train_data, val_data, data_line = kind.data(args)
    random.manual_seed(args.seed)
    try:
        model = kind.build(args, tokenizer)
        trainer = Trainer(model=model, args=training_args, train_dataset=train_data, eval_dataset=val_data,
                          tokenizer=tokenizer, distributed=parallel, callbacks=callbacks,
                          data_collator=None if kind.loss is None else stack_collate, compute_loss_func=kind.loss)
    except MemoryError as e:  # the model itself, before any batch: the batch advice would not help
        sizes = [flag for flag in SIZE_FLAGS if flag in kind.flags]
        raise ValueError(f"the model and its optimizer state do not fit in memory ({e or 'MemoryError'}); use a "
                         f"smaller {_flag_list(sizes[:-1])} or {_flag_list(sizes[-1:])}") from None

    n_params = sum(p.numel() for p in trainer.accumulator.parameters)  # the whole model's (ZeRO: not the shards)
    print(f"data: {data_line}" + (f", {len(val_data)} validation examples" if val_data is not None else ""))
    print(f"model: {kind.describe(args)}, {n_params:,} parameters "
          f"({memory.format_bytes(memory.current()['parameters'])}) on {args.device}")
    for line in training_header(trainer, kind, args.block_size):
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
    if parallel is not None:  # every process's peak, gathered to process 0 (the only one that prints)
        for rank, (peak, by) in enumerate(parallel.comm.all_gather(memory.peak())):
            print(f"peak memory of process {rank}: {memory.format_bytes(peak)} ({peak:,} bytes) = "
                  + ", ".join(f"{c} {by[c]:,}" for c in memory.CATEGORIES))
    if args.output_dir is not None:
        kept = ["model"] + ["tokenizer"] * (tokenizer is not None) + ["config"] * hasattr(model, "config")
        print(f"saved: {args.output_dir}/model.npz ({', '.join(kept)}) and "
              f"{args.output_dir}/checkpoint-{trainer.state.global_step}.npz (to resume)")
    if args.sample_chars:  # the GPT's (None for the kinds that do not sample)
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


def training_header(trainer, kind, block_size):
    """The lines that say what a run does: the effective batch, checkpointing, memory, and what "loss" means.

    kind: the model's row of KINDS; block_size: the sequences' length (an LSTM's checkpointed chain).
    """
    args, world = trainer.args, trainer.world_size
    lines = [
        f"training: {trainer.total_steps} optimizer steps, each of {args.effective_batch_size * world} examples "
        f"(the effective batch) = {args.per_device_train_batch_size} per micro-batch x "
        f"{_plural(args.gradient_accumulation_steps, 'accumulation step')} x {_plural(world, 'process', 'processes')}",
        f"checkpointing: {_checkpointing_in_force(trainer.model, args.gradient_checkpointing_kwargs, kind.chain, block_size)}",
        f"precision: {_precision(trainer)}",
        "memory: 'mem' in a log line is what the process holds then (parameters, gradients, optimizer state, "
        "accumulation buffers, activations), 'peak' the most since training started" if world == 1 else
        f"memory: per process: 'mem' in a log line is what process 0 holds then, 'peak' the most since training "
        f"started; each of the {world} processes holds as much (its own model, gradients, optimizer state, "
        "buffers and activations)" if not trainer.zero else
        f"memory: per process: 'mem' in a log line is what process 0 holds then, 'peak' the most since training "
        f"started; ZeRO stage {trainer.zero}: each of the {world} processes holds 1/{world} of the optimizer state"
        f"{' and of the accumulation buffers' if trainer.zero >= 2 else ''}"
        f"{' and of the parameters (each block gathered for its forward and backward)' if trainer.zero == 3 else ''}"
        " and all of the rest; the last lines "
        "give each process's peak",
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
                     f"'loss' is the mean per {kind.item} over the optimizer steps since the previous log line, "
                     "in the log lines and in the progress bar"
                     + ("" if "input_ids" in trainer.train_dataset[0] else f"; 'tok/s' counts {kind.item}s"))
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
    return (f"mixed, {low}: {kept}; the ops on autocast's lower-precision list ({', '.join(sorted(autocast.LOWER))}) "
            f"and what they save in {low}; those on its float32 list (layer norm, softmax, the loss, ...) in float32; "
            f"{scaling}")


def _checkpointing_in_force(model, kwargs, unit, block_size):
    """What the model's gradient checkpointing was switched to (the Trainer switches it on), in words.

    kwargs: TrainingArguments.gradient_checkpointing_kwargs, for the name the policy was given by;
    unit: what the chain's links are (a Kind's chain); block_size: the length of an LSTM's chain, its time steps.
    """
    if isinstance(model, LSTMLanguageModel):  # it checkpoints its LSTM through time
        model = model.lstm
    segments = getattr(model, "checkpoint_segments", None)
    if segments is None:
        return "off: every activation is kept for backward (--gradient-checkpointing recomputes instead)"
    length = block_size if isinstance(model, LSTM) else len(model.checkpoint_chain())
    if getattr(model, "checkpoint_split_blocks", False):
        unit = "half blocks (each block's attention and feed-forward apart)"
    if segments == "every":
        cut = f"each of the {length} {unit} is a segment"
    else:
        given = str(segments) if isinstance(segments, schedules.Plan) else repr(segments)
        n = len(schedules.segment_bounds(length, segments))
        cut = f"{_plural(n, 'segment')} (segments={given}) of the {length} {unit}"
    policy = getattr(model, "checkpoint_policy", None)
    if policy is None:
        return f"{cut}; a segment keeps only its input, and recomputes all of its inside in backward"
    name = (kwargs or {}).get("policy")
    name = name if isinstance(name, str) else getattr(policy, "__name__", repr(policy))
    return f"{cut}; policy {name}: a segment keeps what the policy saves, and recomputes the rest in backward"


def _flag_list(flags):
    return ", ".join("--" + flag.replace("_", "-") for flag in flags)


def _plural(n, word, plural=None):
    return f"{n} {word if n == 1 else plural or word + 's'}"


def build_parser():
    parser = ArgumentParser(
        prog="tinygrad-ckpt",
        description="Train small models with gradient accumulation and activation checkpointing, "
                    "and watch the memory.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train = commands.add_parser("train", help="train a character-level GPT (embedded data by default), or --model lstm, "
                                "encoder, cnn, mlp",
                                description=run_train.__doc__, epilog=_defaults_epilog())
    add_train_arguments(train)
    train.set_defaults(run=run_train)
    bench_parser = commands.add_parser("bench", help="compare checkpointing and accumulation strategies: tables, JSON, plots",
                                       description=bench.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_arguments(bench_parser)
    bench_parser.set_defaults(run=bench.run)
    fit_parser = commands.add_parser("fit", help="will a training step fit on a GPU (a GPT, or another kind)? per strategy, and what to do",
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
        abort_if_running(130)  # under mpiexec, a process interrupted alone would leave the others waiting
        return 130
    except SystemExit as e:  # sys.exit() in the middle of a run (a callback's): the same, or the others wait forever
        abort_if_running(e.code if isinstance(e.code, int) and e.code else 1, traceback=True)
        raise
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
