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
500 steps, ended at validation loss 2.1185 in float16 from 2**16 against
float32's 2.1535 (benchmarks/README.md, 2026-12-06; 0.34 above it while
skipped steps still used up the warm-up).

Data parallelism (several processes under `mpiexec`): pass
`distributed=DataParallel()` (distributed.py); each process then reads its
share of every micro-batch, and the accumulators are summed across processes
once per optimizer step. Only process 0 prints and saves (with zero_stage,
each process saves its shard of the optimizer state too: zero_checkpoint.py).

What does not live here: the accumulation buffers (accumulate.py), the
optimizers (optim.py), writing, verifying and resuming from checkpoints
(resume.py), the file format (serialization.py), the data set (data.py),
the command line (cli.py), MPI (distributed.py).
"""

import contextlib
import math
import numbers
import re
import secrets
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy

from . import allocator, autocast, autograd, backend, memory, policies, random, resume, serialization
from . import functional as F
from .accumulate import GradientAccumulator
from .checkpoint import check_options
from .data import IGNORE_INDEX, collate, epoch_order
from .distributed import DistributedError
from .grad_scaler import GradScaler
from .optim import SGD, AdamW, clip_grad_norm_, clip_grads_with_norm_, get_total_norm
from .resume import MODEL_NAME, TrainerState
# The saved-run functions live in resume.py; scripts and tests import them from here too:
from .resume import checkpoint_path, sorted_checkpoints, verify_checkpoint  # noqa: F401
from .tape import no_grad
from .zero import STAGES as ZERO_STAGES
from .zero import FlatShards, GatheredParameters, ShardedAccumulator, ShardedGradScaler, Stage3Hooks, stage3_units, total_norm

OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("constant", "linear", "cosine")
ANOMALY = "anomaly mode:"  # how every error of anomaly mode begins (tape.py)


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
    zero_stage: int = _field(
        0, "with several processes (mpiexec -n N), what each keeps 1/N of (zero.py; DeepSpeed's "
           "zero_optimization.stage): 0 nothing, 1 the optimizer state, 2 the accumulation buffers too, 3 the "
           "parameters too (each block gathered for its forward and its backward)",
        choices=ZERO_STAGES)
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
            kwargs = dict(args.gradient_checkpointing_kwargs or {})
            if args.zero_stage == 3 and distributed is not None:  # the recompute must call the blocks (zero.py)
                if kwargs.get("split_blocks"):
                    raise ValueError("zero_stage=3 gathers each block's parameters when the block is called, so "
                                     "its checkpointing must recompute whole blocks, calling them again, not "
                                     "their halves: drop gradient_checkpointing_kwargs' split_blocks")
                kwargs["early_stop"] = False
            try:
                model.gradient_checkpointing_enable(**kwargs)
            except TypeError as e:  # a value the model cannot take: the user's arguments, not a bug
                raise ValueError(f"gradient_checkpointing_kwargs {args.gradient_checkpointing_kwargs}: {e}") from None
        if distributed is not None:  # agree before anything is sent: each sizes ZeRO's shards from its own model
            distributed.agree(model, args, train_dataset, tokenizer,
                              [(name, p) for name, p in model.named_parameters() if p.requires_grad])
        self.zero = args.zero_stage if distributed is not None else 0  # one process has nothing to shard
        trainable = [p for p in model.parameters() if p.requires_grad]  # frozen ones: neither stepped nor sharded
        if self.zero:  # the optimizer steps this process's shards; the accumulator sums into them (zero.py)
            units = stage3_units(model) if self.zero == 3 else None  # stage 3: the blocks and the root
            shards = FlatShards(trainable, distributed.rank, distributed.world_size,
                                units=units and [params for _, params in units], comm=distributed.comm,
                                names={id(p): name for name, p in model.named_parameters()})
            self.stage3 = Stage3Hooks(model, units, shards) if units else None
            self.optimizer = create_optimizer(shards.shards, args)
            self.accumulator = ShardedAccumulator(shards, distributed.comm, self.zero,
                                                  args.gradient_accumulation_steps, dtype=args.accumulation_dtype)
            self.scaler = ShardedGradScaler(distributed.comm, enabled=args.fp16)
        else:
            self.optimizer = create_optimizer(trainable, args)
            self.accumulator = GradientAccumulator(
                self.optimizer.params, args.gradient_accumulation_steps, dtype=args.accumulation_dtype
            )
            self.scaler = GradScaler(enabled=args.fp16)  # fp16: PyTorch's defaults; otherwise a pass-through
        self.scaler_backed_off = False  # the last step was skipped only for overflow at a loss scale above 1
        self.distributed = distributed
        self.world_size = 1 if distributed is None else distributed.world_size
        self.is_main_process = distributed is None or distributed.is_main_process  # only it prints and saves
        if distributed is not None:  # same model, config, tokenizer, args and data everywhere; flat buffers
            with self.gathered():  # stage 3: rank 0's values, broadcast, become every process's shards
                distributed.prepare(model, self.accumulator, args, train_dataset, tokenizer)
        self.state = TrainerState()
        self.run_id = None  # written in each checkpoint: --resume takes only one run's checkpoints
        self.resumed_from = None  # the checkpoint train(resume_from_checkpoint=...) continued from
        self.skipped_checkpoints = []  # [(path, why)]: newer checkpoints it could not use

    def gathered(self):
        """Stage 3: every parameter whole while inside (zero.GatheredParameters; all processes enter it); else nothing."""
        return GatheredParameters(self.accumulator.layout) if self.zero == 3 else contextlib.nullcontext()

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
            if not {"input_ids", "labels"} <= set(batch):
                raise ValueError(f"the Trainer's own loss is a language model's, on the batch's input_ids and labels; "
                                 f"this batch holds {sorted(batch)}: pass compute_loss_func=f(model, batch) -> "
                                 "(the sum of the batch's losses, the items it sums)")
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
            with self.gathered():  # stage 3: the whole model is loaded, each process keeps its shard
                resume.load_checkpoint(self, resume_from_checkpoint)  # sets self.state, model, optimizer, RNG, run id
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
            if state.micro_step >= n_micro:  # a position past this data's epoch (see resume.py): the next epoch
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
                idle = not len(indices) and self.zero == 3  # stage 3: it must gather and reduce with the others
                if len(indices) or idle:
                    batch = self._micro_batch(order[m * B : m * B + 1] if idle else indices, self.train_dataset)
                    loss, items = self.compute_loss(batch)  # forward ...
                    if idle:
                        loss, items = loss * 0.0, 0  # one example, its gradient zero: it counts nothing
                    self.scaler.scale(loss).backward()  # ... then backward at once (fp16: of the scaled loss)
                    if backend.holds_values(loss.device):  # the meta device (fit) has no loss to read
                        step["loss"] += loss.item()
                    step["items"] += items
                    step["tokens"] += 0 if idle else batch["input_ids"].size if "input_ids" in batch else items
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
        if self.zero:  # each process holds a shard of the gradients: the norm is summed across them
            grad_norm = total_norm(params, self.distributed.comm)  # None on the meta device (fit)
            if self.args.max_grad_norm:
                clip_grads_with_norm_(params, self.args.max_grad_norm, grad_norm)
        elif self.args.max_grad_norm:
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
            if self.zero in (1, 2):  # every process's updated shards to every process (stage 3: the next forward)
                for flat, _, _ in self.accumulator.layout.groups:
                    self.distributed.comm.all_gather_(flat)
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
                        resume.claim_output_dir(self)  # one output directory, one run
            except (OSError, ValueError, ImportError) as e:
                error = e
        if self.distributed is not None:
            self.distributed.raise_if_any(error)
        elif error is not None:
            raise error

    def _check_ranks_start_together(self):
        """Every process must start from the same parameters (after a resume too: the same checkpoint)."""
        try:
            self.distributed.check_in_sync()
        except DistributedError as e:
            if self.resumed_from is None:
                raise
            raise type(e)(f"after resuming from {str(self.resumed_from)!r}: {e}; every process must read "
                          "the same checkpoint (a directory all of them share)") from None

    # -- saving and resuming (resume.py) ------------------------------------------
    def save_checkpoint(self, path=None):
        """Write everything needed to resume, atomically: output_dir/checkpoint-<global_step>.npz by default.

        See resume.save_checkpoint (save_total_limit, the refusal of NaN or
        inf, only process 0 writing; under ZeRO every process its shard).
        """
        with self.gathered():  # stage 3: the manifest holds the whole model, as at stages 1 and 2
            return resume.save_checkpoint(self, path)

    def save_model(self, path=None):
        """Write the trained model (with the tokenizer and the model's config, if any) atomically.

        See resume.save_model: output_dir/model.npz by default; NaN or inf refused.
        """
        with self.gathered():
            return resume.save_model(self, path)


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
