"""TrainingArguments and Trainer: the training loop, with Hugging Face's names.

    >>> import tempfile, numpy
    >>> from tinygrad_ckpt.data import CharDataset
    >>> from tinygrad_ckpt.nn import GPT, GPTConfig
    >>> model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=16))
    >>> train = CharDataset(numpy.arange(200) % 11, block_size=8)
    >>> out = tempfile.TemporaryDirectory()
    >>> args = TrainingArguments(per_device_train_batch_size=4, gradient_accumulation_steps=2,
    ...                          max_steps=2, logging_steps=1, output_dir=out.name, disable_tqdm=True)
    >>> history = Trainer(model=model, args=args, train_dataset=train).train()
    step 1/2 | epoch 0.33 | loss ...
    step 2/2 | epoch 0.67 | loss ...
    >>> [entry["step"] for entry in history]          # one log entry per logging_steps
    [1, 2]
    >>> args.max_steps = 3                            # continue the stopped run exactly, from output_dir
    >>> trainer = Trainer(model=model, args=args, train_dataset=train)
    >>> _ = trainer.train(resume_from_checkpoint=True)
    step 3/3 | epoch 1.00 | loss ...
    >>> trainer.state.global_step
    3
    >>> out.cleanup()

One optimizer step reads per_device_train_batch_size * gradient_accumulation_steps
examples (the effective batch) as gradient_accumulation_steps micro-batches,
each forward then backward at once, so only one micro-batch's activations are
ever alive. The gradients add up in a GradientAccumulator (accumulate.py),
which divides once by the number of tokens counted in the whole effective
batch: the step is the step of the big batch.

Everything counts optimizer steps, as in Hugging Face: max_steps,
logging_steps, eval_steps, save_steps, warmup_steps and the learning-rate
schedule, which advances once per optimizer step, never per micro-batch.

The order of examples comes from the seed alone (data.epoch_order), cut into
effective batches, so two runs that differ only in how an effective batch is
split into micro-batches see the same examples in every optimizer step.

What the Trainer guards, so that a run never loses a good state:
  - a step whose loss or gradient norm is NaN or infinite is skipped (the
    parameters and optimizer state stay as they were), logged and counted;
    max_consecutive_nonfinite_steps of them in a row stop the run with
    FloatingPointError. A checkpoint or model that holds NaN or inf is never
    written.
  - checkpoints are output_dir/checkpoint-<step>.npz (the names Hugging
    Face's Trainer gives its checkpoint folders); save_total_limit keeps the
    newest few. Resuming takes the newest one that
    verifies in full (serialization.load, then verify_checkpoint), skipping
    damaged ones and saying so; one written by another model configuration,
    tokenizer or batch layout is an error naming the difference, and nothing
    is restored unless all of it can be.
  - one output directory holds one run: each checkpoint carries its run's
    id, a fresh run refuses a directory that holds another run's output
    (unless overwrite_output_dir, which deletes it, as Hugging Face's
    example scripts do); resuming refuses a directory whose checkpoints come
    from two runs, and an output_dir that holds another run's checkpoints
    than the one it continues.
  - a checkpoint's position (epoch, micro_step, global_step, the counts of
    skipped steps) is range-checked when it is read; with fewer training
    examples than it was written with, a position past the end of an epoch
    continues at the next epoch, and says so.
  - before the first step: the output directory must be writable, and the
    temporary files of a save that was killed are removed.
  - with detect_anomaly=True the steps run in anomaly mode (autograd.py):
    the first op whose output or gradient is NaN or infinite stops the run
    with FloatingPointError, naming the op and the line of code that made it.
    With fp16 too, a gradient that overflows in the scaled loss's backward
    (and a NaN made from it) is the GradScaler's to skip, not an anomaly
    (detect_anomaly(loss_scaling=True)); a NaN from finite gradients is.

Mixed precision (fp16=True or bf16=True, Hugging Face's names): the forward
and the loss run under autocast (autocast.py): matrix products in 16 bits,
layer norm, softmax and the loss in float32; parameters, gradients, the
optimizer state and the accumulation buffers stay float32. With fp16 each
micro-batch's loss is scaled (grad_scaler.py) before its backward, and the
accumulated gradients are unscaled once, after write_grads and before
clipping; a step whose gradients overflowed is skipped by the same rule as
any non-finite step, and logged with the loss scale. The scale starts at
PyTorch's 2**16. This Trainer backpropagates a sum over the micro-batch,
whose gradients are as many times larger as it has items, so its first
steps overflow and the scale backs off (the default run: steps 1 to 9, to
128, then 18 to 21, to 8); PyTorch's GradScaler docstring expects as much
("the first few iterations as its value calibrates"). A skipped step does
not advance the learning-rate schedule, so those steps cost their compute
and nothing else: benchmarks/mixed_precision_training.py's default run,
500 steps, ended at validation loss 2.1249 in float16 from 2**16 against
float32's 2.1535 (0.34 above it while skipped steps still used up the
warm-up).

Data parallelism (several processes under `mpiexec`): pass
`distributed=DataParallel()` (distributed.py); each process then reads its
share of every micro-batch, and the accumulators are summed across processes
once per optimizer step. Only process 0 prints and saves.

What does not live here: the accumulation buffers (accumulate.py), the
optimizers (optim.py), the file format (serialization.py), the data set
(data.py), the command line (cli.py), MPI (distributed.py).
"""

import contextlib
import math
import numbers
import re
import secrets
import sys
import time
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path

import numpy

from . import allocator, autocast, autograd, backend, memory, nn, policies, random, serialization
from . import functional as F
from .accumulate import GradientAccumulator
from .checkpoint import check_options
from .data import IGNORE_INDEX, collate, epoch_order
from .distributed import DistributedError
from .grad_scaler import GradScaler, state_problem
from .optim import SGD, AdamW, clip_grad_norm_, get_total_norm
from .serialization import CheckpointFileError
from .tape import no_grad

OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("constant", "linear", "cosine")
ANOMALY = "anomaly mode:"  # how every error of anomaly mode begins (tape.py)
CHECKPOINT_PREFIX = "checkpoint"  # output_dir/checkpoint-<optimizer step>.npz: the resumable training state
MODEL_NAME = "model.npz"  # the trained model (and tokenizer, config), in output_dir


def _field(default, help, **more):
    """A TrainingArguments field: its default, and the help `tinygrad-ckpt train --help` shows (cli.py)."""
    return field(default=default, metadata={"help": help, **more})


@dataclass
class TrainingArguments:
    """The knobs of a training run; names and meanings as in transformers.TrainingArguments.

    Every field is checked when the arguments are made: a ValueError names
    the field, what it must be, and the value it got. The command line
    (cli.py) makes one flag per field, with the help written here.
    """

    output_dir: str = _field(None, "where checkpoint-<step>.npz and model.npz are written (None: nothing is written)")
    overwrite_output_dir: bool = _field(
        False, "start a fresh run even though output_dir holds another run's checkpoint-<step>.npz or model.npz, "
               "deleting them first (without it such a run is refused: resume it, or choose another output_dir)")
    per_device_train_batch_size: int = _field(
        8, "examples per micro-batch, on each process: one forward and one backward, whose activations are "
           "alive at once; memory grows with it")
    per_device_eval_batch_size: int = _field(8, "examples per evaluation batch")
    gradient_accumulation_steps: int = _field(
        1, "micro-batches per optimizer step, their gradients added up (1: no accumulation). As in Hugging "
           "Face, it raises the effective batch: per_device_train_batch_size x gradient_accumulation_steps "
           "x processes examples per optimizer step. To keep the batch and cut memory, divide "
           "per_device_train_batch_size and multiply this by the same factor (16 x 1 -> 4 x 4): the same "
           "update, a quarter of the activations alive at once")
    gradient_checkpointing: bool = _field(False, "recompute activations in backward instead of keeping them "
                                                 "(model.gradient_checkpointing_enable())")
    gradient_checkpointing_kwargs: dict = _field(
        None, "with gradient_checkpointing: its arguments, e.g. "
              "{\"segments\": \"sqrt\", \"policy\": \"selective_attention\"} (None: every block, full recompute); "
              "{\"use_reentrant\": false} is accepted, as in Hugging Face's snippets (this checkpoint is the "
              "non-reentrant kind)")
    learning_rate: float = _field(1e-3, "peak learning rate, after warmup")
    weight_decay: float = _field(0.0, "AdamW: decoupled weight decay; SGD: added to the gradient")
    adam_beta1: float = _field(0.9, "AdamW's first-moment decay")
    adam_beta2: float = _field(0.999, "AdamW's second-moment decay")
    adam_epsilon: float = _field(1e-8, "AdamW's epsilon")
    max_grad_norm: float = _field(1.0, "clip the global gradient norm to this (0: no clipping)")
    max_consecutive_nonfinite_steps: int = _field(
        10, "stop after this many optimizer steps in a row with a NaN or infinite loss or gradient norm "
            "(each such step is skipped: the parameters and optimizer state stay as they were)")
    num_train_epochs: float = _field(1.0, "passes over the training data (used when max_steps <= 0)")
    max_steps: int = _field(-1, "optimizer steps to take; > 0 overrides num_train_epochs")
    lr_scheduler_type: str = _field("linear", "learning-rate schedule after warmup (to 0 for linear and cosine)",
                                    choices=SCHEDULES)
    warmup_steps: int = _field(0, "optimizer steps of linear warmup from lr/warmup_steps to lr")
    logging_steps: int = _field(10, "log (and print) the loss every this many optimizer steps (0: never)")
    logging_first_step: bool = _field(False, "also log after the first optimizer step (the starting loss)")
    eval_steps: int = _field(0, "evaluate every this many optimizer steps (0: only at the end)")
    save_steps: int = _field(0, "write a resumable checkpoint every this many optimizer steps (0: only at the end)")
    save_total_limit: int = _field(None, "keep only the newest this many checkpoints in output_dir, deleting "
                                         "older ones after each save (None: keep them all)")
    seed: int = _field(42, "decides the example order and the default random generator (dropout)")
    optim: str = _field("adamw", "the optimizer", choices=OPTIMIZERS)
    accumulation_dtype: str = _field(None, "dtype of the accumulation buffers, e.g. float64 (None: the parameters')")
    fp16: bool = _field(
        False, "mixed precision with float16 (autocast.py): matrix products in float16, parameters, gradients and "
               "optimizer state float32, the loss scaled (GradScaler) and steps whose gradients overflow skipped")
    bf16: bool = _field(
        False, "mixed precision with bfloat16 (autocast.py): matrix products in bfloat16, parameters, gradients and "
               "optimizer state float32; no loss scaling (bfloat16 has float32's range). On the CPU it needs "
               "ml_dtypes (pip install -e \".[bf16]\")")
    disable_tqdm: bool = _field(False, "no live progress line (log lines are still printed)")
    detect_anomaly: bool = _field(
        False, "run the training steps in anomaly mode (tinygrad_ckpt.autograd.detect_anomaly): the first op "
               "whose output or gradient is NaN or infinite stops the run, naming the op and the line that "
               "made it. Slow: for debugging")
    keep_freed_memory: bool = _field(
        False, "ask glibc's malloc to keep the memory a step frees for the next step, instead of handing it "
               "back to the system and faulting it in again (tinygrad_ckpt.allocator): faster steps, and the "
               "process keeps its peak size. A setting of the whole process: the library's default is False, "
               "`tinygrad-ckpt train`'s True")

    def __post_init__(self):
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                     "max_consecutive_nonfinite_steps"):
            self._check_int(name, minimum=1)
        for name in ("warmup_steps", "logging_steps", "eval_steps", "save_steps", "seed"):
            self._check_int(name, minimum=0)
        self._check_int("max_steps", minimum=None)  # <= 0: num_train_epochs decides
        if self.save_total_limit is not None:
            self._check_int("save_total_limit", minimum=1, hint=" or None to keep every checkpoint")
        self._check_number("learning_rate", "a finite number > 0", lambda v: v > 0)
        self._check_number("adam_epsilon", "a finite number > 0", lambda v: v > 0)
        for name in ("weight_decay", "max_grad_norm", "num_train_epochs"):
            self._check_number(name, "a finite number >= 0", lambda v: v >= 0)
        for name in ("adam_beta1", "adam_beta2"):
            self._check_number(name, "a number in [0, 1)", lambda v: 0 <= v < 1)
        for name in ("overwrite_output_dir", "gradient_checkpointing", "logging_first_step", "disable_tqdm",
                     "detect_anomaly", "keep_freed_memory", "fp16", "bf16"):
            if not isinstance(getattr(self, name), (bool, numpy.bool_)):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        for f in fields(self):
            choices = f.metadata.get("choices")
            if choices is not None and getattr(self, f.name) not in choices:
                raise ValueError(f"{f.name} must be one of {choices}, got {getattr(self, f.name)!r}")
        if self.output_dir is not None and (not isinstance(self.output_dir, (str, Path)) or str(self.output_dir) == ""):
            raise ValueError(f"output_dir must be a directory path or None, got {self.output_dir!r}")
        if self.save_steps and self.output_dir is None:
            raise ValueError(f"save_steps={self.save_steps} needs output_dir, where the checkpoints are written; "
                             "set output_dir (--output-dir) or save_steps=0")
        if self.max_steps <= 0 and not self.num_train_epochs > 0:
            raise ValueError(
                f"nothing to train: max_steps is {self.max_steps} and num_train_epochs is {self.num_train_epochs}; "
                "set max_steps > 0 or num_train_epochs > 0"
            )
        self._check_accumulation_dtype()
        self._check_gradient_checkpointing_kwargs()
        if self.fp16 and self.bf16:
            raise ValueError("fp16 and bf16 are both True; choose one 16-bit dtype for mixed precision "
                             "(--fp16 or --bf16), or neither for float32")
        if self.bf16:
            autocast.bfloat16()  # ImportError naming the extra now, not at the first step

    def _check_int(self, name, minimum, hint=""):
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, (int, numpy.integer)) or (minimum is not None and value < minimum):
            requirement = "an integer" if minimum is None else f"an integer >= {minimum}"
            raise ValueError(f"{name} must be {requirement}{hint}, got {value!r}")

    def _check_number(self, name, requirement, holds):
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or not holds(value):
            raise ValueError(f"{name} must be {requirement}, got {value!r}")

    def _check_accumulation_dtype(self):
        if self.accumulation_dtype is None:
            return
        try:
            dtype = numpy.dtype(self.accumulation_dtype)
        except (TypeError, ValueError):
            dtype = None
        if dtype is None or dtype.kind != "f":
            raise ValueError(f"accumulation_dtype must be a floating dtype such as 'float32' or 'float64' (or None "
                             f"for the parameters' own), got {self.accumulation_dtype!r}")

    def _check_gradient_checkpointing_kwargs(self):
        """Plain data only (names, numbers, lists), since the arguments are saved with the run."""
        kwargs = self.gradient_checkpointing_kwargs
        if kwargs is None:
            return
        if not isinstance(kwargs, dict) or not set(kwargs) <= {"segments", "policy", "split_blocks", "use_reentrant"}:
            raise ValueError(
                f"gradient_checkpointing_kwargs must be a dict with some of the keys 'segments', 'policy', "
                f"'split_blocks' (model.gradient_checkpointing_enable's arguments) and 'use_reentrant' (false), "
                f"got {kwargs!r}"
            )
        if "use_reentrant" in kwargs:
            value = kwargs["use_reentrant"]
            if value is not None and not isinstance(value, (bool, numpy.bool_)):
                raise ValueError(f"gradient_checkpointing_kwargs['use_reentrant'] must be false, got {value!r}")
            try:
                check_options(use_reentrant=value)
            except ValueError as e:  # True: the error that explains the two kinds of checkpoint
                raise ValueError(f"gradient_checkpointing_kwargs['use_reentrant']: {e}") from None
        if not isinstance(kwargs.get("split_blocks", False), bool):
            raise ValueError(f"gradient_checkpointing_kwargs['split_blocks'] must be true or false, "
                             f"got {kwargs['split_blocks']!r}")
        if not self.gradient_checkpointing:
            raise ValueError("gradient_checkpointing_kwargs is set but gradient_checkpointing is False; "
                             "set gradient_checkpointing=True to use them")
        policy = kwargs.get("policy")
        if policy is not None and not isinstance(policy, str):
            raise ValueError(
                f"gradient_checkpointing_kwargs['policy'] must be a ready-made policy's name such as "
                f"'selective_attention' (the arguments are saved with the run), got {policy!r}; for a "
                "policy of your own, call model.gradient_checkpointing_enable(policy=...) yourself"
            )
        policies.resolve(policy)  # an unknown name fails here, with the names it could be
        segments = kwargs.get("segments", "every")
        if not (segments in ("every", "sqrt") or _is_count(segments, 1)
                or (isinstance(segments, list) and (all(_is_count(b, 0) for b in segments)  # boundaries
                                                    or all(isinstance(b, (tuple, list)) and len(b) == 3
                                                           for b in segments)))):  # (start, stop, checkpointed)
            raise ValueError(
                f"gradient_checkpointing_kwargs['segments'] must be 'every', 'sqrt', an int or a list of block "
                f"boundaries such as [2, 4] (an int: the number of segments, at least 1), got {segments!r}"
            )

    @property
    def autocast_dtype(self):
        """"float16", "bfloat16" or None (float32 throughout): the dtype autocast gives the matrix products."""
        return "float16" if self.fp16 else "bfloat16" if self.bf16 else None

    @property
    def effective_batch_size(self):
        """Examples per optimizer step."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps


def _is_count(value, minimum):
    return isinstance(value, (int, numpy.integer)) and not isinstance(value, bool) and value >= minimum


def get_learning_rate(step, args, total_steps):
    """The learning rate of optimizer step `step` (0-based): warmup, then the schedule.

    Warmup rises linearly to the peak, reaching it at step warmup_steps - 1;
    then 'constant' stays, 'linear' falls to 0 and 'cosine' follows half a
    cosine to 0 at total_steps.
    """
    lr = args.learning_rate
    if step < args.warmup_steps:
        return lr * (step + 1) / args.warmup_steps
    if args.lr_scheduler_type == "constant":
        return lr
    progress = (step - args.warmup_steps) / max(1, total_steps - args.warmup_steps)  # 0 -> 1
    if args.lr_scheduler_type == "linear":
        return lr * max(0.0, 1.0 - progress)
    return lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def create_optimizer(parameters, args):
    if args.optim == "sgd":
        return SGD(parameters, lr=args.learning_rate, weight_decay=args.weight_decay)
    return AdamW(
        parameters, lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_epsilon, weight_decay=args.weight_decay,
    )


class TrainerCallback:
    """Something called at points of training: Hugging Face's TrainerCallback, with the two events this Trainer has.

    Subclass it and pass an instance in Trainer(..., callbacks=[...]). Both
    events get the trainer (its state, args, model); on_step_end may return
    a line to print, or None.
    """

    def on_step_begin(self, trainer):
        """At the first micro-batch of an optimizer step."""

    def on_step_end(self, trainer):
        """After the optimizer step's update (trainer.state.global_step counts it)."""
        return None


@dataclass
class TrainerState:
    """Where a run is: enough, with the model, optimizer and RNG, to resume it exactly."""

    global_step: int = 0  # optimizer steps taken (skipped ones included: their examples were read)
    epoch: int = 0  # the epoch being read
    micro_step: int = 0  # micro-batches of this epoch already consumed (always at a group boundary)
    log_history: list = None  # one dict per log entry
    nonfinite_steps: int = 0  # optimizer steps skipped for a NaN or infinite loss or gradient norm, in all
    consecutive_nonfinite_steps: int = 0  # ... in a row, up to now

    def __post_init__(self):
        self.log_history = [] if self.log_history is None else self.log_history


# -- the checkpoints of a run: output_dir/checkpoint-<step>.npz ---------------------------
def checkpoint_path(output_dir, step):
    """Where the checkpoint of optimizer step `step` is written: output_dir/checkpoint-<step>.npz."""
    return Path(output_dir) / f"{CHECKPOINT_PREFIX}-{step}.npz"


def sorted_checkpoints(directory):
    """[(step, path)] of the checkpoint-<step>.npz files in `directory`, newest (highest step) first."""
    pattern = re.compile(rf"{CHECKPOINT_PREFIX}-(\d+)\.npz")
    found = []
    for path in Path(directory).iterdir():
        match = pattern.fullmatch(path.name)
        if match is not None and path.is_file():
            found.append((int(match.group(1)), path))
    return sorted(found, reverse=True)


def verify_checkpoint(path):
    """Read a Trainer checkpoint and check all of it; returns what serialization.load returns.

    On top of serialization.load's checks (every byte, every array's dtype
    and shape, the metadata's types): it holds a model, an optimizer, the
    Trainer's state of the right types, only finite parameters and
    optimizer state, and (fp16) a loss scaler state a GradScaler can reach
    (grad_scaler.state_problem). Any problem raises CheckpointFileError
    naming the file and the field.
    """
    checkpoint = serialization.load(path)
    where = repr(str(path))

    def expect(condition, what):
        if not condition:
            raise CheckpointFileError(f"{where} is not a resumable Trainer checkpoint: {what}")

    def count(value):
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    expect(checkpoint["model"] is not None and checkpoint["optimizer"] is not None,
           "it holds no model or no optimizer state")
    extra = checkpoint["extra"]
    state = extra.get("trainer_state")
    names = {f.name for f in fields(TrainerState)}
    expect(isinstance(state, dict) and set(state) <= names, "'trainer_state' is not a TrainerState")
    expect(all(count(v) for k, v in state.items() if k != "log_history"), "'trainer_state' holds a bad step count")
    expect(isinstance(state.get("log_history", []), list) and all(isinstance(e, dict) for e in state.get("log_history", [])),
           "'trainer_state' holds a log history that is not a list of dicts")
    expect(isinstance(extra.get("rng_states"), list) and all(isinstance(r, dict) for r in extra["rng_states"]),
           "'rng_states' is not a list of generator states")
    layout = extra.get("batch_layout")
    expect(isinstance(layout, list) and len(layout) == 3 and all(count(v) for v in layout) and min(layout[:2]) >= 1,
           "'batch_layout' is not [per_device_train_batch_size, gradient_accumulation_steps, seed]")
    expect(count(extra.get("world_size", 1)) and extra.get("world_size", 1) >= 1, "'world_size' is not a process count")
    expect(count(extra.get("train_examples", 1)) and extra.get("train_examples", 1) >= 1,
           "'train_examples' is not a number of examples")
    run_id = extra.get("run_id")
    expect(run_id is None or (isinstance(run_id, str) and re.fullmatch(r"[0-9a-f]{1,64}", run_id)),
           "'run_id' is not a run id (hexadecimal digits)")
    for key in ("config", "tokenizer", "training_args"):
        expect(isinstance(extra.get(key, {}), dict), f"{key!r} is not a dict")
    _check_position(state, layout, extra, checkpoint["optimizer"]["steps"], expect)
    if "grad_scaler" in extra:  # fp16: the loss scale goes on from here, so it must be one a scaler can reach
        expect(extra["grad_scaler"] != {}, "its 'grad_scaler' is {}, what a disabled GradScaler saves; an fp16 "
                                           "run saves the scale it reached")
        problem = state_problem(extra["grad_scaler"])
        expect(problem is None, f"its 'grad_scaler' is damaged: {problem}")
    arrays = [(f"model/{name}", a) for name, a in checkpoint["model"].items()]
    arrays += [(f"optimizer/{key}/{i}", a) for key, values in checkpoint["optimizer"]["state"].items()
               for i, a in enumerate(values)]
    for name, array in arrays:
        if array.dtype.kind in "fc" and not numpy.isfinite(array).all():
            raise CheckpointFileError(f"{where} holds non-finite values (NaN or inf) in {name}; it cannot be resumed from")
    for name, value in checkpoint["optimizer"]["hyper"].items():
        holds, requirement = HYPER_RANGES.get(name, (lambda v: True, "a finite number"))
        values = value if isinstance(value, list) else [value]
        expect(all(math.isfinite(v) and holds(v) for v in values),
               f"the optimizer's {name} is {value!r}; it must be {requirement}")
    for i, array in enumerate(checkpoint["optimizer"]["state"].get("exp_avg_sq", [])):
        expect(not (array < 0).any(), f"optimizer/exp_avg_sq/{i}, a mean of squares, holds a negative value")
    return checkpoint


# What a checkpoint's optimizer hyperparameters may be (a list, such as betas: each of its numbers).
HYPER_RANGES = {
    "lr": (lambda v: v >= 0, "a finite number >= 0"),
    "eps": (lambda v: v > 0, "a finite number > 0"),
    "betas": (lambda v: 0 <= v < 1, "numbers in [0, 1)"),
    "weight_decay": (lambda v: v >= 0, "a finite number >= 0"),
    "momentum": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
}


def _check_position(state, layout, extra, optimizer_steps, expect):
    """The stored position must be one a run reaches: every count in range, the counts consistent.

    Only what the checkpoint itself says is used here; the position against
    this run's data is Trainer._restore's (a shorter data set moves on to
    the next epoch).
    """
    state = {**asdict(TrainerState()), **state}
    step, epoch, micro = state["global_step"], state["epoch"], state["micro_step"]
    B, G, _ = layout
    expect(micro % G == 0, f"its micro_step {micro} is not at the start of an optimizer step "
                           f"(a multiple of gradient_accumulation_steps={G})")
    if "train_examples" in extra:
        per_epoch = math.ceil(extra["train_examples"] / (B * extra.get("world_size", 1)))
        expect(micro < per_epoch, f"its micro_step {micro} is past the end of an epoch of {per_epoch} micro-batches "
                                  f"(the {extra['train_examples']} examples it was written with)")
    expect(step >= epoch + micro // G, f"its position (epoch {epoch}, micro_step {micro}) is more than "
                                       f"global_step={step} optimizer steps can reach")
    expect(state["consecutive_nonfinite_steps"] <= state["nonfinite_steps"] <= step,
           f"its counts of skipped steps ({state['consecutive_nonfinite_steps']} in a row, "
           f"{state['nonfinite_steps']} in all) exceed global_step={step}")
    expect(all(s <= step for s in optimizer_steps), f"its optimizer has taken more steps "
                                                    f"({max(optimizer_steps)}) than global_step={step}")
    expect(all(type(e.get("step", 0)) is int and 0 <= e.get("step", 0) <= step for e in state["log_history"]),
           f"its log history holds a step outside 0..global_step={step}")


class Trainer:
    """Train `model` on `train_dataset` with `args`; see the module docstring.

    model: a Module whose forward(input_ids) returns (logits, loss) with
    logits (B, T, vocab), as GPT does. train_dataset / eval_dataset: any
    sequence of dicts with integer arrays "input_ids" and "labels" (labels
    -100 where a position does not count). tokenizer: optional, saved with
    checkpoints and the model so a sampler can decode (anything with
    state_dict()). distributed: a distributed.DataParallel for data-parallel
    training under `mpiexec -n N` (effective batch x N); None: one process.
    callbacks: TrainerCallback objects (Hugging Face's name), called at each
    optimizer step's first micro-batch and after its update (the memory
    explorer's page of one step is one: bench.explorer.MemoryReport).
    data_collator: makes a micro-batch (a dict of arrays) from a list of
    examples; default data.collate (input_ids and labels, padded).
    compute_loss_func: for a model that is not a language model,
    f(model, batch) -> (the SUM of the batch's losses as a scalar Tensor,
    the number of items it sums); default compute_loss's GPT loss.
    """

    def __init__(self, model, args, train_dataset, eval_dataset=None, tokenizer=None, distributed=None,
                 callbacks=None, data_collator=None, compute_loss_func=None):
        if not isinstance(args, TrainingArguments):
            raise TypeError(f"args must be a TrainingArguments, got {type(args).__name__}")
        self.model, self.args, self.tokenizer = model, args, tokenizer
        self.data_collator = data_collator or collate
        self.compute_loss_func = compute_loss_func
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.callbacks = list(callbacks or ())
        B = args.per_device_train_batch_size
        if len(train_dataset) < B:
            raise ValueError(
                f"the training data set has {len(train_dataset)} examples, fewer than one micro-batch "
                f"(per_device_train_batch_size={B}); use a smaller batch size or more data"
            )
        if eval_dataset is not None and len(eval_dataset) == 0:
            raise ValueError("eval_dataset is empty; pass None for no evaluation")
        if args.gradient_checkpointing:
            if not hasattr(model, "gradient_checkpointing_enable"):
                raise ValueError(
                    f"gradient_checkpointing=True, but {type(model).__name__} does not support it "
                    "(it has no gradient_checkpointing_enable() method)"
                )
            try:
                model.gradient_checkpointing_enable(**(args.gradient_checkpointing_kwargs or {}))
            except TypeError as e:  # a value the model cannot take: the user's arguments, not a bug
                raise ValueError(f"gradient_checkpointing_kwargs {args.gradient_checkpointing_kwargs}: {e}") from None
        self.optimizer = create_optimizer(model.parameters(), args)
        self.accumulator = GradientAccumulator(
            self.optimizer.params, args.gradient_accumulation_steps, dtype=args.accumulation_dtype
        )
        # float16's loss scaling; a pass-through otherwise
        self.scaler = GradScaler(enabled=args.fp16)  # fp16: PyTorch's defaults; otherwise a pass-through
        self.scaler_backed_off = False  # the last step was skipped only for overflow at a loss scale above 1
        self.distributed = distributed
        self.world_size = 1 if distributed is None else distributed.world_size
        self.is_main_process = distributed is None or distributed.is_main_process  # only it prints and saves
        if distributed is not None:  # same model, config, tokenizer, args and data everywhere; flat buffers
            distributed.prepare(model, self.accumulator, args, train_dataset, tokenizer)
        self.state = TrainerState()
        self.run_id = None  # written in each checkpoint: --resume takes only one run's checkpoints
        self.resumed_from = None  # the checkpoint train(resume_from_checkpoint=...) continued from
        self.skipped_checkpoints = []  # [(path, why)]: newer checkpoints it could not use

    # -- sizes ------------------------------------------------------------------
    @property
    def micro_batches_per_epoch(self):
        """Micro-batches per epoch, counting one micro-batch on every process as one."""
        return math.ceil(len(self.train_dataset) / (self.args.per_device_train_batch_size * self.world_size))

    @property
    def steps_per_epoch(self):
        """Optimizer steps per epoch; the last group of an epoch may be short."""
        return math.ceil(self.micro_batches_per_epoch / self.args.gradient_accumulation_steps)

    @property
    def total_steps(self):
        if self.args.max_steps > 0:
            return self.args.max_steps
        return max(1, math.ceil(self.args.num_train_epochs * self.steps_per_epoch))

    # -- one micro-batch ----------------------------------------------------------
    def compute_loss(self, batch):
        """(sum of the per-token losses as a scalar Tensor, number of tokens counted).

        The SUM, not the mean: the accumulator divides once by the tokens of
        the whole effective batch (see accumulate.py for why). With a
        compute_loss_func, that function's (sum, items) for (model, batch).
        Either runs under autocast when bf16 or fp16 is set: mixed precision
        is the run's, whichever model and loss it trains.
        """
        dtype = self.args.autocast_dtype  # fp16/bf16: the forward and the loss under autocast (mixed precision)
        with autocast.autocast(dtype) if dtype else contextlib.nullcontext():
            if self.compute_loss_func is not None:
                return self.compute_loss_func(self.model, batch)
            input_ids, labels = batch["input_ids"], batch["labels"]
            logits, _ = self.model(input_ids)  # (B, T, vocab)
            vocab = logits.shape[-1]
            counted = labels != IGNORE_INDEX
            bad = labels[counted & ((labels < 0) | (labels >= vocab))]
            if bad.size:
                raise ValueError(
                    f"labels hold token id {int(bad[0])}, outside the model's vocabulary of {vocab} "
                    f"(0..{vocab - 1}; -100 marks an ignored position): was the data tokenised for another model?"
                )
            targets = backend.to_device(labels, logits.device)
            return F.cross_entropy(logits, targets, reduction="sum"), int(counted.sum())  # float32, by the policy

    def _micro_batch(self, indices, dataset):
        return self.data_collator([dataset[int(i)] for i in indices])

    # -- the loop -----------------------------------------------------------------
    def train(self, resume_from_checkpoint=None):
        """Run to total_steps optimizer steps; returns the log history (a list of dicts).

        resume_from_checkpoint: True (the newest checkpoint in output_dir
        that verifies), a directory (the same, there) or a checkpoint file:
        the run continues from the saved step with the same data order,
        optimizer state and random state, so its losses are those the
        uninterrupted run would have logged. Newer checkpoints that are
        damaged are skipped, and said so (self.skipped_checkpoints).

        Before the first step: the output directory must be writable (and
        temporary files of an interrupted save are removed from it); with
        several processes, every process must hold the same parameters.
        """
        args, acc = self.args, self.accumulator
        self._prepare_outputs(fresh=not resume_from_checkpoint)
        if resume_from_checkpoint:
            self._load_checkpoint(resume_from_checkpoint)  # sets self.state, the model, optimizer, RNG and run id
        else:
            random.manual_seed(args.seed)
            self.state, self.run_id = TrainerState(), secrets.token_hex(8)
        if self.distributed is not None:
            self._check_ranks_start_together()
        state = self.state
        if args.keep_freed_memory:
            applied, why = allocator.keep_freed_memory()
            if not applied and self.is_main_process:
                print(f"keep_freed_memory: not applied: {why}", file=sys.stderr)
        progress = _Progress(self.total_steps, enabled=not args.disable_tqdm and self.is_main_process)
        memory.reset_peak()
        self.model.train()
        acc.zero_grad()
        try:
            # fp16: an overflow to inf is expected and handled (the GradScaler skips the step): no NumPy warnings
            # fp16 and anomaly mode: a scaled gradient's overflow is the scaler's to skip, not an anomaly
            with (autograd.detect_anomaly(loss_scaling=args.fp16) if args.detect_anomaly else contextlib.nullcontext(),
                  numpy.errstate(over="ignore", invalid="ignore") if args.fp16 else contextlib.nullcontext()):
                self._training_loop(progress)
        except RuntimeError as e:
            if not (args.detect_anomaly and str(e).startswith(ANOMALY)):
                raise
            raise FloatingPointError(_anomaly_summary(e)) from e  # a diverged run: the input's fault, not a bug
        finally:
            progress.close()  # the bar ends before anything else is printed
        if self.eval_dataset is not None and (not args.eval_steps or self.total_steps % args.eval_steps):
            self._log({"step": state.global_step, **self.evaluate()}, progress)
        if args.output_dir is not None:
            if not args.save_steps or self.total_steps % args.save_steps:
                self.save_checkpoint()
            self.save_model()
        return state.log_history

    def _training_loop(self, progress):
        """The optimizer steps, from self.state to total_steps (train() prepares and finishes)."""
        args, acc, state = self.args, self.accumulator, self.state
        B, total = args.per_device_train_batch_size * self.world_size, self.total_steps  # B: all processes' examples
        step = {"loss": 0.0, "items": 0, "tokens": 0}  # summed over the micro-batches of this optimizer step
        window = {"loss": 0.0, "items": 0, "tokens": 0, "time": time.perf_counter(),  # since the last log
                  "first_step": state.global_step + 1}
        n_micro = self.micro_batches_per_epoch
        begun = False  # the callbacks were told that this optimizer step began
        while state.global_step < total:
            if state.micro_step >= n_micro:  # a position past this data's epoch (see _restore): the next epoch
                state.epoch, state.micro_step = state.epoch + 1, 0
            order = epoch_order(len(self.train_dataset), args.seed, state.epoch)
            for m in range(state.micro_step, n_micro):
                indices, items = order[m * B : (m + 1) * B], 0
                if self.distributed is not None:  # this process's share; at an epoch's end it may be empty
                    indices = self.distributed.shard(indices)
                if not begun:  # the first micro-batch of an optimizer step
                    for callback in self.callbacks:
                        callback.on_step_begin(self)
                    begun = True
                if len(indices):
                    batch = self._micro_batch(indices, self.train_dataset)
                    loss, items = self.compute_loss(batch)  # forward ...
                    self.scaler.scale(loss).backward()  # ... then backward at once (fp16: of the scaled loss)
                    if backend.holds_values(loss.device):  # the meta device (fit) has no loss to read
                        step["loss"] += loss.item()
                    step["items"] += items
                    step["tokens"] += batch["input_ids"].size if "input_ids" in batch else items
                    del loss
                if not acc.accumulate(items, end_of_data=(m == n_micro - 1)):
                    continue
                # The group is complete: one optimizer step with the mean gradient, unless it is not finite.
                # The schedule counts the steps taken: a skipped step moves it on no more than the parameters
                # (Hugging Face steps its scheduler only when optimizer_step_was_skipped is false).
                lr = get_learning_rate(state.global_step - state.nonfinite_steps, args, total)
                grad_norm, nonfinite = self._optimizer_step(lr, step)
                state.global_step += 1
                for callback in self.callbacks:
                    said = callback.on_step_end(self)
                    if said:
                        progress.write(said)
                begun = False
                state.micro_step = m + 1
                if state.micro_step == n_micro:  # the epoch is done
                    state.epoch, state.micro_step = state.epoch + 1, 0
                if nonfinite:
                    self._skipped(nonfinite, progress)  # logs and counts it; raises after too many in a row
                    grad_norm = None  # the log shows the norm of steps that were taken
                else:
                    state.consecutive_nonfinite_steps = 0
                    for key in step:
                        window[key] += step[key]
                progress.update(state.global_step, step["tokens"], window)
                step = dict.fromkeys(step, 0)
                self._maybe_log_eval_save(window, lr, grad_norm, progress, total)
                if state.global_step >= total or state.micro_step == 0:
                    break  # done, or on to the next epoch's order

    def _optimizer_step(self, lr, step):
        """write_grads (divide by the group's items), clip, step, zero: nanoGPT's order.

        Returns (gradient norm, None), or (gradient norm, what was not
        finite) for a step that was skipped: when the loss or the gradient
        norm is NaN or infinite, the optimizer does not step, so the
        parameters and the optimizer state stay as they were (what
        mixed-precision loss scalers do with an overflowing step).

        With several processes, their buffers, item counts and `step`'s sums
        (for the log) are first added up across processes: one all-reduce per
        buffer dtype and one for the counts, the only communication of a step.
        Every process then sees the same loss and norm, and skips or steps alike.
        """
        if self.distributed is not None:
            self.distributed.all_reduce_(self.accumulator, step)
        self.accumulator.write_grads()
        scale = self.scaler.get_scale()
        overflow = self.scaler.unscale_(self.optimizer)  # fp16: p.grad /= scale, once, before clipping
        params = self.optimizer.params
        if self.args.max_grad_norm:
            grad_norm = clip_grad_norm_(params, self.args.max_grad_norm)
        else:
            grad_norm = get_total_norm(p.grad for p in params if p.grad is not None)
        nonfinite = ", ".join(f"{name} {value}" for name, value in (("loss", step["loss"]), ("grad_norm", grad_norm))
                              if value is not None and not math.isfinite(value))  # None: the meta device's norm
        if overflow:  # what GradScaler.step() would skip; the scale backs off
            nonfinite = f"{nonfinite or 'gradients'} (inf or NaN at loss scale {scale:g}; now {scale * self.scaler.backoff_factor:g})"
        self.scaler_backed_off = bool(overflow and math.isfinite(step["loss"]) and scale > 1)
        if not nonfinite:
            self.optimizer.lr = lr
            self.optimizer.step()
        self.scaler.update()
        self.accumulator.zero_grad()
        return (grad_norm if self.args.max_grad_norm else None), (nonfinite or None)

    def _skipped(self, nonfinite, progress):
        """Count and log a skipped step; after max_consecutive_nonfinite_steps in a row, stop.

        fp16: a step skipped only because its scaled gradients overflowed, at
        a loss scale above 1, is the GradScaler finding its scale (it halves
        it): counted in all, not in a row, and the learning-rate schedule
        stays where it was. The Trainer's summed loss makes the gradients grow
        with the tokens of a micro-batch, so the first steps may back off many
        times (from 2**16 to 2**7 in the default run's first 9 steps).
        """
        state, limit = self.state, self.args.max_consecutive_nonfinite_steps
        state.nonfinite_steps += 1
        if not self.scaler_backed_off:
            state.consecutive_nonfinite_steps += 1
        self._log({"step": state.global_step, "skipped": nonfinite,
                   "consecutive_nonfinite_steps": state.consecutive_nonfinite_steps,
                   "nonfinite_steps": state.nonfinite_steps}, progress)
        if state.consecutive_nonfinite_steps >= limit:
            progress.close()
            first = state.global_step - limit + 1
            raise FloatingPointError(
                f"{limit} optimizer steps in a row (steps {first} to {state.global_step}) had a non-finite loss "
                f"or gradient norm (the last: {nonfinite}); none of them changed the parameters, which are "
                f"those after step {first - 1}. Stopping: lower the learning rate, look for bad examples in "
                "the data, or raise max_consecutive_nonfinite_steps"
            )

    def _maybe_log_eval_save(self, window, lr, grad_norm, progress, total):
        args, step = self.args, self.state.global_step
        first = args.logging_first_step and step == 1
        logging_step = args.logging_steps and (step % args.logging_steps == 0 or step == total or first)
        if logging_step and window["items"]:  # no entry for a window of skipped steps only
            elapsed = time.perf_counter() - window["time"]
            entry = {
                "step": step,
                "epoch": round(self.state.epoch + self.state.micro_step / self.micro_batches_per_epoch, 4),
                "loss": window["loss"] / window["items"],  # mean per token over the window
                "learning_rate": lr,
                "tokens_per_second": window["tokens"] / max(elapsed, 1e-9),
                "memory": memory.total(),
                "peak_memory": memory.peak()[0],
            }
            if grad_norm is not None:
                entry["grad_norm"] = grad_norm
            if self.scaler.enabled:
                entry["loss_scale"] = self.scaler.get_scale()  # fp16: the scale the next step starts with
            self._log(entry, progress)
            window.update(loss=0.0, items=0, tokens=0, time=time.perf_counter(), first_step=step + 1)
        paused = time.perf_counter()  # evaluating and saving do not count against tokens/s
        if self.eval_dataset is not None and args.eval_steps and step % args.eval_steps == 0:
            self._log({"step": step, **self.evaluate()}, progress)
        if args.output_dir is not None and args.save_steps and step % args.save_steps == 0:
            self.save_checkpoint()
        window["time"] += time.perf_counter() - paused

    def _log(self, entry, progress):
        self.state.log_history.append(entry)
        if self.is_main_process:
            progress.write(format_log(entry, self.total_steps))

    # -- evaluation ---------------------------------------------------------------
    def evaluate(self, eval_dataset=None):
        """{"eval_loss": mean loss per counted token} over the whole data set, without gradients."""
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        if dataset is None:
            raise ValueError("evaluate(): no eval_dataset given to the Trainer or to evaluate()")
        B = self.args.per_device_eval_batch_size
        total, items = 0.0, 0
        self.model.eval()
        with no_grad():
            for lo in range(0, len(dataset), B):
                loss, n = self.compute_loss(self._micro_batch(range(lo, min(lo + B, len(dataset))), dataset))
                total, items = total + loss.item(), items + n
        self.model.train()
        return {"eval_loss": total / max(1, items)}

    # -- before the first step ------------------------------------------------------
    def _prepare_outputs(self, fresh):
        """Fail now, not at the first save, if what the run writes cannot be written.

        output_dir must be writable (stale temporary files are removed from
        it). fresh: a run that does not
        resume. One output directory holds one run, as with Hugging Face's
        overwrite_output_dir: if it already holds another run's checkpoints
        or model, a fresh run is refused (ValueError naming it), or with
        overwrite_output_dir they are deleted first, and said so. Only
        process 0 writes, so only it looks; with several processes they all
        stop together if it finds a problem.
        """
        error = None
        if self.is_main_process:
            try:
                if self.args.output_dir is not None:
                    serialization.check_writable(self.args.output_dir)
                    serialization.check_file_writable(Path(self.args.output_dir) / MODEL_NAME)  # not a folder
                    removed = serialization.remove_stale_temporary_files(self.args.output_dir)
                    if removed:
                        print(f"removed {len(removed)} temporary file(s) left by an interrupted save: "
                              f"{', '.join(Path(p).name for p in removed)}", file=sys.stderr)
                    if fresh:
                        self._claim_output_dir()
            except (OSError, ValueError, ImportError) as e:
                error = e
        if self.distributed is not None:
            self.distributed.raise_if_any(error)
        elif error is not None:
            raise error

    def _claim_output_dir(self):
        """A fresh run's output_dir must hold no other run's output; overwrite_output_dir deletes it."""
        directory = Path(self.args.output_dir)
        previous = [path for _, path in sorted_checkpoints(directory)]
        previous += [directory / MODEL_NAME] if (directory / MODEL_NAME).is_file() else []
        if not previous:
            return
        names = ", ".join(path.name for path in previous[:4]) + (", ..." if len(previous) > 4 else "")
        if not self.args.overwrite_output_dir:
            raise ValueError(
                f"output directory {str(directory)!r} already holds another run ({names}): continue it with "
                "--resume (resume_from_checkpoint=True), replace it with --overwrite-output-dir "
                "(overwrite_output_dir=True), or choose another --output-dir"
            )
        for path in previous:
            path.unlink(missing_ok=True)
        print(f"overwrite_output_dir: deleted the previous run's {len(previous)} file(s) in {str(directory)!r}: "
              f"{names}", file=sys.stderr)

    def _check_ranks_start_together(self):
        """Every process must start from the same parameters (after a resume too: the same checkpoint)."""
        try:
            self.distributed.check_in_sync()
        except DistributedError as e:
            if self.resumed_from is None:
                raise
            raise type(e)(f"after resuming from {str(self.resumed_from)!r}: {e}; every process must read "
                          "the same checkpoint (a directory all of them share)") from None

    # -- saving and resuming ------------------------------------------------------
    def save_checkpoint(self, path=None):
        """Write everything needed to resume, atomically (a crash keeps the checkpoints already written).

        path: None for output_dir/checkpoint-<global_step>.npz, after which
        the oldest checkpoints beyond save_total_limit are deleted. Refuses
        (FloatingPointError) to write a parameter or optimizer state that is
        not finite. With several processes only process 0 writes (the others
        hold the same model and optimizer state) and the others return None.
        """
        if not self.is_main_process:
            return None
        if path is None and self.args.output_dir is None:
            raise ValueError("save_checkpoint(): output_dir is None, so there is nowhere to save; pass a path")
        self._check_finite("save a checkpoint")
        path = checkpoint_path(self.args.output_dir, self.state.global_step) if path is None else Path(path)
        extra = {
            "trainer_state": asdict(self.state),
            "rng_states": [g.bit_generator.state for g in self._generators()],  # dropout masks to come
            "batch_layout": [self.args.per_device_train_batch_size, self.args.gradient_accumulation_steps, self.args.seed],
            "world_size": self.world_size,  # micro_step counts micro-batches of all processes together
            "train_examples": len(self.train_dataset),  # micro_step is a position in an epoch of these
            "run_id": self.run_id,  # resuming takes only one run's checkpoints
            "training_args": asdict(self.args),  # for the reader; resuming uses the args it is given
        }
        if self.scaler.enabled:
            extra["grad_scaler"] = self.scaler.state_dict()  # fp16: the loss scale goes on where it was
        extra.update(self._model_description())
        path.parent.mkdir(parents=True, exist_ok=True)
        serialization.save(path, model=self.model, optimizer=self.optimizer, extra=extra)
        if self.args.output_dir is not None and path.parent.resolve() == Path(self.args.output_dir).resolve():
            self._rotate_checkpoints(self.state.global_step)
        return path

    def _rotate_checkpoints(self, saved_step):
        """Keep the checkpoint just written and the newest save_total_limit - 1 older ones.

        Checkpoints of later steps (left by a run that went further, and
        skipped when this one resumed) are never deleted here.
        """
        limit = self.args.save_total_limit
        if limit is None:
            return
        older = [path for step, path in sorted_checkpoints(self.args.output_dir) if step < saved_step]
        for path in older[limit - 1:]:
            path.unlink(missing_ok=True)

    def _check_finite(self, doing):
        """Raise FloatingPointError naming the first parameter, buffer or optimizer state that holds NaN or inf."""
        arrays = [(f"parameter {name!r}", p.data) for name, p in self.model.named_parameters()]
        arrays += [(f"buffer {name!r}", b.data) for name, b in self.model.named_buffers()]
        arrays += [(f"optimizer state {key}[{i}]", a) for key in self.optimizer.state_names
                   for i, a in enumerate(getattr(self.optimizer, key))]
        for name, array in arrays:
            xp = backend.module_of(array)
            if array.dtype.kind in "fc" and not bool(backend.to_host(backend.as_array(xp.isfinite(array).all()))):
                raise FloatingPointError(
                    f"refusing to {doing}: {name} holds NaN or inf, so the model has diverged; the checkpoints "
                    "already written are kept. Resume from the newest one with a lower learning rate"
                )

    def _model_description(self):
        """The model's configuration (a dataclass, as GPTConfig) and the tokenizer, as JSON values."""
        description = {}
        config = getattr(self.model, "config", None)
        if is_dataclass(config):
            description["config"] = asdict(config)
        if self.tokenizer is not None:
            description["tokenizer"] = self.tokenizer.state_dict()
        return description

    def _load_checkpoint(self, where):
        """Restore the newest checkpoint that verifies (of `where`: True, a directory or a file).

        A damaged checkpoint (CheckpointFileError) is skipped for the next older
        one, and said so; one written by another model, tokenizer, batch
        layout or number of processes is an error, since every checkpoint of
        the directory comes from the same run. Everything is checked before
        anything is restored.
        """
        if where is True:
            if self.args.output_dir is None:
                raise ValueError("resume_from_checkpoint=True looks in output_dir, which is None; "
                                 "set output_dir or pass the checkpoint's path")
            where = self.args.output_dir
        where = Path(where)
        if where.is_dir():
            candidates = [path for _, path in sorted_checkpoints(where)]
            if not candidates:
                raise FileNotFoundError(f"no checkpoint to resume from in {str(where)!r} (no {CHECKPOINT_PREFIX}-<step>.npz); "
                                        "was the run saved (save_steps / output_dir)?")
            _check_one_run(where, candidates)
        elif where.exists():
            candidates = [where]
        else:
            raise FileNotFoundError(f"no checkpoint to resume from at {str(where)!r}; was the run saved (save_steps / output_dir)?")
        self.skipped_checkpoints = []
        for path in candidates:
            try:
                checkpoint = verify_checkpoint(path)
            except CheckpointFileError as e:
                if len(candidates) == 1:
                    raise
                self.skipped_checkpoints.append((path, str(e)))
                if self.is_main_process:
                    print(f"resume: skipped {path}: {e}", file=sys.stderr)
                continue
            self._check_output_dir_is_this_run(checkpoint["extra"].get("run_id"), path)
            self._restore(checkpoint, path)
            self.resumed_from = path
            if self.is_main_process and self.skipped_checkpoints:
                print(f"resume: continuing from {path} (optimizer step {self.state.global_step})", file=sys.stderr)
            return path
        raise CheckpointFileError(f"no checkpoint in {str(where)!r} can be resumed from: all {len(candidates)} are damaged "
                              f"(the newest: {self.skipped_checkpoints[0][1]})")

    def _check_output_dir_is_this_run(self, run_id, source):
        """Resuming from `source` (of run `run_id`) writes into output_dir: it must hold no other run's checkpoints.

        With overwrite_output_dir they are deleted, and said so. Checked
        before anything is restored, by every process (they resume from a
        directory they share, so they stop alike, never one waiting for the others).
        """
        directory = self.args.output_dir
        if directory is None or not Path(directory).is_dir():
            return
        others = {rid: paths for rid, paths in _checkpoint_runs(p for _, p in sorted_checkpoints(directory)).items()
                  if rid != run_id}
        if not others:
            return
        listed = _describe_runs(others)
        if not self.args.overwrite_output_dir:
            raise ValueError(
                f"output directory {str(directory)!r} holds another run's checkpoints ({listed}), not those of "
                f"the run {str(source)!r} continues ({'run ' + run_id if run_id else 'without a run id'}): "
                "choose another --output-dir, or --overwrite-output-dir (overwrite_output_dir=True) to delete them"
            )
        for paths in others.values():
            for path in paths:
                path.unlink(missing_ok=True)
        if self.is_main_process:
            print(f"overwrite_output_dir: deleted another run's checkpoints in {str(directory)!r}: {listed}",
                  file=sys.stderr)

    def _restore(self, checkpoint, path):
        """Check that `checkpoint` belongs to this run, then restore the model, optimizer, state and RNG."""
        extra, args, where = checkpoint["extra"], self.args, repr(str(path))
        B, G, seed = extra["batch_layout"]
        if (B, G, seed) != (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.seed):
            raise ValueError(
                f"the checkpoint {where} was written with per_device_train_batch_size={B}, gradient_accumulation_steps={G}, "
                f"seed={seed}; resume with the same values so the data position means the same examples"
            )
        if extra.get("world_size", 1) != self.world_size:
            raise ValueError(
                f"the checkpoint {where} was written by {extra.get('world_size', 1)} process(es), this run has "
                f"{self.world_size}: resume with the same `mpiexec -n` so the data position means the same examples"
            )
        ours = self._model_description()
        for key, what in (("tokenizer", "tokenizer"), ("config", "model configuration")):
            if key in ours and key in extra:
                for name in list(ours[key]) + [n for n in extra[key] if n not in ours[key]]:
                    if ours[key].get(name) != extra[key].get(name):
                        raise ValueError(
                            f"cannot resume from {where}: its {what} differs in {name!r}: "
                            f"{_difference(extra[key].get(name), ours[key].get(name))}; resume with the "
                            f"{'data' if key == 'tokenizer' else 'model settings'} the checkpoint was written with"
                        )
        generators = self._generators()
        if len(extra["rng_states"]) != len(generators):
            raise ValueError(
                f"the checkpoint {where} holds {len(extra['rng_states'])} random generator states, this model uses "
                f"{len(generators)}: resume with the model the checkpoint was written from"
            )
        for g, saved in zip(generators, extra["rng_states"]):
            try:  # on a throwaway generator first: nothing is restored unless all of it can be
                type(g.bit_generator)().state = saved
            except (TypeError, ValueError, KeyError) as e:
                raise CheckpointFileError(f"{where} holds a random generator state that does not fit "
                                      f"{type(g.bit_generator).__name__} ({type(e).__name__}: {e})") from None
        serialization.restore(checkpoint, model=self.model, optimizer=self.optimizer)  # checks, then copies
        self.state, self.run_id = TrainerState(**extra["trainer_state"]), extra.get("run_id")
        if self.scaler.enabled and "grad_scaler" in extra:
            self.scaler.load_state_dict(extra["grad_scaler"])
        for g, saved in zip(generators, extra["rng_states"]):
            g.bit_generator.state = saved
        self._fit_position(extra.get("train_examples"))

    def _fit_position(self, saved_examples):
        """Move a restored position that is past this data's epoch to the next epoch, and say so.

        The checkpoint's own counts were range-checked (verify_checkpoint);
        here they meet this run's data: with fewer examples than when the
        checkpoint was written, its micro-batch may lie beyond the end of an
        epoch, and the run continues at the start of the next one, as
        Hugging Face's Trainer does. Any other change of the data is said too:
        the order of an epoch depends on the number of examples.
        """
        state, n, n_micro = self.state, len(self.train_dataset), self.micro_batches_per_epoch
        if saved_examples in (None, n) and state.micro_step < n_micro:
            return
        had = "another number" if saved_examples is None else saved_examples
        if state.micro_step >= n_micro:
            now = (f"it stopped at micro-batch {state.micro_step} of epoch {state.epoch}, past this data's "
                   f"{n_micro} per epoch: continuing at the start of epoch {state.epoch + 1}")
            state.epoch, state.micro_step = state.epoch + 1, 0
        else:
            now = (f"continuing at micro-batch {state.micro_step} of epoch {state.epoch}, in this data's order "
                   "(an epoch's order depends on the number of examples)")
        if self.is_main_process:
            print(f"resume: the training data has {n} examples, the checkpoint's run had {had}; {now}", file=sys.stderr)

    def _generators(self):
        """The random generators a run draws from: the default one, then each Dropout's own, once."""
        generators = [random.default_generator]
        for module in self.model.modules():
            rng = getattr(module, "rng", None) if isinstance(module, nn.Dropout) else None
            if rng is not None and all(rng is not g for g in generators):
                generators.append(rng)
        return generators

    def save_model(self, path=None):
        """Write the trained model (with the tokenizer and the model's config, if any) atomically.

        Refuses (FloatingPointError) a model that holds NaN or inf. Only
        process 0 writes; the others return None.
        """
        if not self.is_main_process:
            return None
        if path is None and self.args.output_dir is None:
            raise ValueError("save_model(): output_dir is None, so there is nowhere to save; pass a path")
        self._check_finite("save the model")
        path = Path(self.args.output_dir) / MODEL_NAME if path is None else Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        serialization.save(path, model=self.model, extra=self._model_description())
        return path


def _checkpoint_runs(paths):
    """{run id: [paths]} of checkpoint files, reading only their metadata; damaged files are left out."""
    runs = {}
    for path in paths:
        try:
            run_id = serialization.read_extra(path).get("run_id")
        except (CheckpointFileError, OSError):
            continue  # the resume's own checks say what is wrong with it, if it is ever read
        runs.setdefault(run_id, []).append(path)
    return runs


def _describe_runs(runs):
    return "; ".join(f"{'run ' + run_id if run_id else 'a run without a run id'}: {', '.join(p.name for p in paths)}"
                     for run_id, paths in runs.items())


def _check_one_run(directory, candidates):
    """Refuse a directory whose checkpoints come from more than one run (their run ids differ).

    Resuming would otherwise take the newest step, whichever run wrote it.
    """
    runs = _checkpoint_runs(candidates)
    if len(runs) > 1:
        listed = _describe_runs(runs)
        raise ValueError(
            f"cannot resume from {str(directory)!r}: it holds the checkpoints of {len(runs)} different runs "
            f"({listed}); move the other run's checkpoints away, or resume from one file (--resume PATH, "
            "resume_from_checkpoint=PATH) into another --output-dir"
        )


_FRAME = re.compile(r'^\s*File "(.*)", line (\d+), in (\S+)\n\s*(.*)$', re.MULTILINE)


def _anomaly_summary(error):
    """Anomaly mode's error on one line: what, which op, and the innermost lines of code that made it.

    tape.py's message names the op, then the line outside the package that
    created its record, then a traceback; a model of the package's own (the
    command line's GPT) is all inside the package, so the traceback's two
    innermost calls (Module.__call__ left out) say more: the layer, and the
    line of the model that called it.
    """
    text = str(error)
    what = text.splitlines()[0]
    frames = [m.groups() for m in _FRAME.finditer(text) if not (m.group(3) == "__call__" and
                                                                 m.group(1).endswith("module.py"))]
    where = " <- ".join(f"{file}, line {line}, in {name}: {code.strip()}" for file, line, name, code in frames[::-1][:2])
    return (f"{what} At {where or 'an unknown line'} (detect_anomaly=True stops the run at the first NaN or "
            "infinity; for the traceback of the forward call: --debug on the command line, or this error's "
            "__cause__)")


def _difference(saved, ours):
    """'the checkpoint has X, this run has Y', pointing at the first difference of two strings or lists."""
    if isinstance(saved, (str, list)) and isinstance(ours, (str, list)) and len(saved) > 8:
        at = next((i for i, (a, b) in enumerate(zip(saved, ours)) if a != b), min(len(saved), len(ours)))
        return (f"the checkpoint's has {len(saved)} entries, this run's {len(ours)}; the first difference is at "
                f"position {at}: {saved[at:at + 1]!r} against {ours[at:at + 1]!r}")
    return f"the checkpoint has {saved!r}, this run has {ours!r}"


def format_log(entry, total_steps):
    """One printed line per log entry: 'step 10/200 | loss 2.8431 | lr 1.00e-03 | ...'."""
    parts = [f"step {entry['step']}/{total_steps}"]
    if "skipped" in entry:
        in_a_row = (f"{entry['consecutive_nonfinite_steps']} in a row" if entry["consecutive_nonfinite_steps"] else
                    "the loss scale backing off, not counted in a row")  # Trainer._skipped
        parts.append(f"skipped, not finite: {entry['skipped']}; parameters unchanged "
                     f"({in_a_row}, {entry['nonfinite_steps']} in all)")
    if "epoch" in entry:
        parts.append(f"epoch {entry['epoch']:.2f}")
    if "loss" in entry:
        parts.append(f"loss {entry['loss']:.4f}")
    if "eval_loss" in entry:
        parts.append(f"eval_loss {entry['eval_loss']:.4f}")
    if "learning_rate" in entry:
        parts.append(f"lr {entry['learning_rate']:.2e}")
    if "grad_norm" in entry:
        parts.append(f"grad_norm {entry['grad_norm']:.3f}")
    if "loss_scale" in entry:
        parts.append(f"loss scale {entry['loss_scale']:g}")
    if "tokens_per_second" in entry:
        parts.append(f"{entry['tokens_per_second']:.0f} tok/s")
    if "memory" in entry:
        parts.append(f"mem {memory.format_bytes(entry['memory'])} (peak {memory.format_bytes(entry['peak_memory'])})")
    return " | ".join(parts)


class _Progress:
    """A one-line progress bar on a terminal's stderr, rewritten in place; silent elsewhere.

    Its "loss" is the log lines' "loss": the mean per token over the
    optimizer steps since the previous log line, so at a logging step the
    bar and the log line show the same number. close() ends the bar with a
    newline, so what is printed after it starts on a line of its own.
    """

    def __init__(self, total, enabled=True, stream=None):
        self.total, self.stream = total, sys.stderr if stream is None else stream
        self.enabled = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start, self.tokens, self.line = time.perf_counter(), 0, ""

    def update(self, step, tokens, window):
        """After optimizer step `step`, which read `tokens` tokens; window: the sums since the last log line."""
        if not self.enabled:
            return
        self.tokens += tokens
        done = int(20 * step / self.total)
        rate = self.tokens / max(time.perf_counter() - self.start, 1e-9)
        if window["items"]:
            first = window["first_step"]
            since = f"step {first}" if first == step else f"steps {first}-{step}"
            loss = f"loss {window['loss'] / window['items']:.4f} (mean of {since})"
        else:
            loss = "loss - (skipped steps only)"
        self.line = (
            f"[{'#' * done}{'.' * (20 - done)}] {step}/{self.total} | {loss} | {rate:.0f} tok/s | "
            f"mem {memory.format_bytes(memory.total())} (peak {memory.format_bytes(memory.peak()[0])})"
        )
        self.stream.write("\r\033[K" + self.line)
        self.stream.flush()

    def write(self, text):
        """Print a log line above the bar."""
        if self.enabled:
            self.stream.write("\r\033[K")
        print(text, flush=True)
        if self.enabled and self.line:
            self.stream.write(self.line)
            self.stream.flush()

    def close(self):
        """End the bar: it stays on screen as it last was, and the cursor moves to the next line."""
        if self.enabled and self.line:
            self.stream.write("\n")
            self.stream.flush()
        self.enabled, self.line = False, ""
