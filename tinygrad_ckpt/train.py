"""TrainingArguments and Trainer: the training loop, with Hugging Face's names.

    args = TrainingArguments(per_device_train_batch_size=16, gradient_accumulation_steps=8,
                             learning_rate=1e-3, max_steps=200, output_dir="out")
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val)
    history = trainer.train()          # a list of log entries, one per logging_steps
    trainer.train(resume_from_checkpoint=True)   # continue a stopped run exactly

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

Data parallelism (several processes under `mpiexec`): pass
`distributed=DataParallel()` (distributed.py); each process then reads its
share of every micro-batch, and the accumulators are summed across processes
once per optimizer step. Only process 0 prints and saves.

What does not live here: the accumulation buffers (accumulate.py), the
optimizers (optim.py), the file format (serialization.py), the data set
(data.py), the command line (cli.py), MPI (distributed.py).
"""

import contextlib
import importlib.util
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path

import numpy

from . import backend, memory, nn, policies, random, serialization
from . import functional as F
from .accumulate import GradientAccumulator
from .data import IGNORE_INDEX, collate, epoch_order
from .optim import SGD, AdamW, clip_grad_norm_
from .tape import no_grad

OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("constant", "linear", "cosine")
CHECKPOINT_NAME = "checkpoint.npz"  # the resumable training state, in output_dir
MODEL_NAME = "model.npz"  # the trained model (and tokenizer, config), in output_dir


@dataclass
class TrainingArguments:
    """The knobs of a training run; names and meanings as in transformers.TrainingArguments."""

    output_dir: str = None  # checkpoints and the final model go here; None: nothing is written
    per_device_train_batch_size: int = 8  # examples per micro-batch (one forward + one backward)
    per_device_eval_batch_size: int = 8  # examples per evaluation batch
    gradient_accumulation_steps: int = 1  # micro-batches per optimizer step (1: no accumulation)
    gradient_checkpointing: bool = False  # recompute activations in backward: model.gradient_checkpointing_enable()
    gradient_checkpointing_kwargs: dict = None  # passed to it, e.g. {"segments": "sqrt", "policy": "selective_attention"}
    learning_rate: float = 1e-3  # peak learning rate, after warmup
    weight_decay: float = 0.0  # AdamW: decoupled decay; SGD: added to the gradient
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0  # clip the global gradient norm to this (0: no clipping)
    num_train_epochs: float = 1.0  # passes over the training data (ignored when max_steps > 0)
    max_steps: int = -1  # optimizer steps to take; > 0 overrides num_train_epochs
    lr_scheduler_type: str = "linear"  # 'constant', 'linear' (to 0) or 'cosine' (to 0), after warmup
    warmup_steps: int = 0  # optimizer steps of linear warmup from lr/warmup_steps to lr
    logging_steps: int = 10  # log (and print) the loss every this many optimizer steps
    logging_first_step: bool = False  # also log after the first optimizer step (the starting loss)
    eval_steps: int = 0  # evaluate every this many optimizer steps (0: only at the end)
    save_steps: int = 0  # write the resumable state every this many optimizer steps (0: only at the end)
    seed: int = 42  # decides the example order and the default random generator (dropout)
    optim: str = "adamw"  # 'adamw' or 'sgd'
    accumulation_dtype: str = None  # dtype of the accumulation buffers (e.g. 'float64'); None: the parameters'
    disable_tqdm: bool = False  # True: no live progress line (log lines are still printed)
    memory_report: str = None  # write the memory explorer page (HTML) of the run's first optimizer step here

    def __post_init__(self):
        def positive_int(name, minimum=1, hint=""):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, numpy.integer)) or value < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}{hint}")

        positive_int("per_device_train_batch_size", hint=" (the number of examples in one micro-batch)")
        positive_int("per_device_eval_batch_size")
        positive_int("gradient_accumulation_steps", hint=" (1 means no accumulation)")
        for name in ("logging_steps", "eval_steps", "save_steps", "warmup_steps"):
            positive_int(name, minimum=0)
        if self.optim not in OPTIMIZERS:
            raise ValueError(f"optim must be one of {OPTIMIZERS}, got {self.optim!r}")
        if self.lr_scheduler_type not in SCHEDULES:
            raise ValueError(f"lr_scheduler_type must be one of {SCHEDULES}, got {self.lr_scheduler_type!r}")
        if not self.learning_rate >= 0:
            raise ValueError(f"learning_rate must be >= 0, got {self.learning_rate}")
        if not self.weight_decay >= 0 or not self.max_grad_norm >= 0:
            raise ValueError("weight_decay and max_grad_norm must be >= 0 (max_grad_norm 0 turns clipping off)")
        if not isinstance(self.max_steps, (int, numpy.integer)) or isinstance(self.max_steps, bool):
            raise ValueError(f"max_steps must be an integer, got {self.max_steps!r}")
        if self.max_steps <= 0 and not self.num_train_epochs > 0:
            raise ValueError(
                f"nothing to train: max_steps is {self.max_steps} and num_train_epochs is {self.num_train_epochs}; "
                "set max_steps > 0 or num_train_epochs > 0"
            )
        if self.accumulation_dtype is not None:
            numpy.dtype(self.accumulation_dtype)  # a TypeError names a bad dtype
        self._check_gradient_checkpointing_kwargs()

    def _check_gradient_checkpointing_kwargs(self):
        """Plain data only (names, numbers, lists), since the arguments are saved with the run."""
        kwargs = self.gradient_checkpointing_kwargs
        if kwargs is None:
            return
        if not isinstance(kwargs, dict) or not set(kwargs) <= {"segments", "policy", "split_blocks"}:
            raise ValueError(
                f"gradient_checkpointing_kwargs must be a dict with some of the keys 'segments', 'policy' and "
                f"'split_blocks' (model.gradient_checkpointing_enable's arguments), got {kwargs!r}"
            )
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
        if not isinstance(segments, (str, int, list)) or isinstance(segments, bool):
            raise ValueError(
                f"gradient_checkpointing_kwargs['segments'] must be 'every', 'sqrt', an int or a list of "
                f"boundaries, got {segments!r}"
            )

    @property
    def effective_batch_size(self):
        """Examples per optimizer step."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps


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


@dataclass
class TrainerState:
    """Where a run is: enough, with the model, optimizer and RNG, to resume it exactly."""

    global_step: int = 0  # optimizer steps taken
    epoch: int = 0  # the epoch being read
    micro_step: int = 0  # micro-batches of this epoch already consumed (always at a group boundary)
    log_history: list = None  # one dict per log entry

    def __post_init__(self):
        self.log_history = [] if self.log_history is None else self.log_history


class Trainer:
    """Train `model` on `train_dataset` with `args`; see the module docstring.

    model: a Module whose forward(input_ids) returns (logits, loss) with
    logits (B, T, vocab), as GPT does. train_dataset / eval_dataset: any
    sequence of dicts with integer arrays "input_ids" and "labels" (labels
    -100 where a position does not count). tokenizer: optional, saved with
    checkpoints and the model so a sampler can decode (anything with
    state_dict()). distributed: a distributed.DataParallel for data-parallel
    training under `mpiexec -n N` (effective batch x N); None: one process.
    """

    def __init__(self, model, args, train_dataset, eval_dataset=None, tokenizer=None, distributed=None):
        if not isinstance(args, TrainingArguments):
            raise TypeError(f"args must be a TrainingArguments, got {type(args).__name__}")
        self.model, self.args, self.tokenizer = model, args, tokenizer
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
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
            model.gradient_checkpointing_enable(**(args.gradient_checkpointing_kwargs or {}))
        self.optimizer = create_optimizer(model.parameters(), args)
        self.accumulator = GradientAccumulator(
            self.optimizer.params, args.gradient_accumulation_steps, dtype=args.accumulation_dtype
        )
        self.distributed = distributed
        self.world_size = 1 if distributed is None else distributed.world_size
        self.is_main_process = distributed is None or distributed.is_main_process  # only it prints and saves
        if distributed is not None:  # same model and args everywhere, rank 0's parameters, flat buffers
            distributed.prepare(model, self.accumulator, args, len(train_dataset))
        self.state = TrainerState()

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
        the whole effective batch (see accumulate.py for why).
        """
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
        return F.cross_entropy(logits, targets, reduction="sum"), int(counted.sum())

    def _micro_batch(self, indices, dataset):
        return collate([dataset[int(i)] for i in indices])

    # -- the loop -----------------------------------------------------------------
    def train(self, resume_from_checkpoint=None):
        """Run to total_steps optimizer steps; returns the log history (a list of dicts).

        resume_from_checkpoint: True (the checkpoint in output_dir) or a path:
        the run continues from the saved step with the same data order,
        optimizer state and random state, so its losses are those the
        uninterrupted run would have logged.
        """
        args, acc = self.args, self.accumulator
        if resume_from_checkpoint:
            self._load_checkpoint(resume_from_checkpoint)  # sets self.state, the model, optimizer and RNG
        else:
            random.manual_seed(args.seed)
            self.state = TrainerState()
        state = self.state
        B, total = args.per_device_train_batch_size * self.world_size, self.total_steps  # B: all processes' examples
        progress = _Progress(total, enabled=not args.disable_tqdm and self.is_main_process)
        step = {"loss": 0.0, "items": 0, "tokens": 0}  # summed over the micro-batches of this optimizer step
        window = {"loss": 0.0, "items": 0, "tokens": 0, "time": time.perf_counter()}  # since the last log
        memory.reset_peak()
        self.model.train()
        acc.zero_grad()
        report = _StepReport(args.memory_report) if args.memory_report and self.is_main_process else None
        while state.global_step < total:
            order = epoch_order(len(self.train_dataset), args.seed, state.epoch)
            n_micro = self.micro_batches_per_epoch
            for m in range(state.micro_step, n_micro):
                indices, items = order[m * B : (m + 1) * B], 0
                if self.distributed is not None:  # this process's share; at an epoch's end it may be empty
                    indices = self.distributed.shard(indices)
                if report is not None:
                    report.start()  # at the first micro-batch of this run's first optimizer step
                if len(indices):
                    batch = self._micro_batch(indices, self.train_dataset)
                    loss, items = self.compute_loss(batch)  # forward ...
                    loss.backward()  # ... then backward at once: this micro-batch's activations are freed
                    step["loss"] += loss.item()
                    step["items"] += items
                    step["tokens"] += batch["input_ids"].size
                    del loss
                if not acc.accumulate(items, end_of_data=(m == n_micro - 1)):
                    continue
                # The group is complete: one optimizer step with the mean gradient.
                lr = get_learning_rate(state.global_step, args, total)
                grad_norm = self._optimizer_step(lr, step)
                state.global_step += 1
                if report is not None:
                    progress.write(report.finish(f"optimizer step {state.global_step}"))
                    report = None
                state.micro_step = m + 1
                if state.micro_step == n_micro:  # the epoch is done
                    state.epoch, state.micro_step = state.epoch + 1, 0
                for key in step:
                    window[key] += step[key]
                progress.update(state.global_step, step)
                step = dict.fromkeys(step, 0)
                self._maybe_log_eval_save(window, lr, grad_norm, progress, total)
                if state.global_step >= total or state.micro_step == 0:
                    break  # done, or on to the next epoch's order
        progress.close()
        if self.eval_dataset is not None and (not args.eval_steps or total % args.eval_steps):
            self._log({"step": state.global_step, **self.evaluate()}, progress)
        if args.output_dir is not None:
            if not args.save_steps or total % args.save_steps:
                self.save_checkpoint()
            self.save_model()
        return state.log_history

    def _optimizer_step(self, lr, step):
        """write_grads (divide by the group's items), clip, step, zero: nanoGPT's order.

        With several processes, their buffers, item counts and `step`'s sums
        (for the log) are first added up across processes: one all-reduce per
        buffer dtype and one for the counts, the only communication of a step.
        """
        if self.distributed is not None:
            self.distributed.all_reduce_(self.accumulator, step)
        self.accumulator.write_grads()
        grad_norm = clip_grad_norm_(self.optimizer.params, self.args.max_grad_norm) if self.args.max_grad_norm else None
        self.optimizer.lr = lr
        self.optimizer.step()
        self.accumulator.zero_grad()
        return grad_norm

    def _maybe_log_eval_save(self, window, lr, grad_norm, progress, total):
        args, step = self.args, self.state.global_step
        first = args.logging_first_step and step == 1
        if args.logging_steps and (step % args.logging_steps == 0 or step == total or first):
            elapsed = time.perf_counter() - window["time"]
            entry = {
                "step": step,
                "epoch": round(self.state.epoch + self.state.micro_step / self.micro_batches_per_epoch, 4),
                "loss": window["loss"] / max(1, window["items"]),  # mean per token over the window
                "learning_rate": lr,
                "tokens_per_second": window["tokens"] / max(elapsed, 1e-9),
                "memory": memory.total(),
                "peak_memory": memory.peak()[0],
            }
            if grad_norm is not None:
                entry["grad_norm"] = grad_norm
            self._log(entry, progress)
            window.update(loss=0.0, items=0, tokens=0, time=time.perf_counter())
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

    # -- saving and resuming ------------------------------------------------------
    def save_checkpoint(self, path=None):
        """Write everything needed to resume, atomically (a crash keeps the last good file).

        With several processes only process 0 writes (the others hold the same
        model and optimizer state) and the others return None.
        """
        if not self.is_main_process:
            return None
        path = Path(self.args.output_dir) / CHECKPOINT_NAME if path is None else Path(path)
        extra = {
            "trainer_state": asdict(self.state),
            "rng_states": [g.bit_generator.state for g in self._generators()],  # dropout masks to come
            "batch_layout": [self.args.per_device_train_batch_size, self.args.gradient_accumulation_steps, self.args.seed],
            "world_size": self.world_size,  # micro_step counts micro-batches of all processes together
            "training_args": asdict(self.args),  # for the reader; resuming uses the args it is given
        }
        if self.tokenizer is not None:
            extra["tokenizer"] = self.tokenizer.state_dict()
        path.parent.mkdir(parents=True, exist_ok=True)
        serialization.save(path, model=self.model, optimizer=self.optimizer, extra=extra)
        return path

    def _load_checkpoint(self, where):
        path = Path(self.args.output_dir or ".") / CHECKPOINT_NAME if where is True else Path(where)
        if path.is_dir():
            path = path / CHECKPOINT_NAME
        if not path.exists():
            raise FileNotFoundError(f"no checkpoint to resume from at {str(path)!r}; was the run saved (save_steps / output_dir)?")
        extra = serialization.restore(path, model=self.model, optimizer=self.optimizer)
        B, G, seed = extra["batch_layout"]
        args = self.args
        if (B, G, seed) != (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.seed):
            raise ValueError(
                f"the checkpoint was written with per_device_train_batch_size={B}, gradient_accumulation_steps={G}, "
                f"seed={seed}; resume with the same values so the data position means the same examples"
            )
        if extra.get("world_size", 1) != self.world_size:
            raise ValueError(
                f"the checkpoint was written by {extra.get('world_size', 1)} process(es), this run has "
                f"{self.world_size}: resume with the same `mpiexec -n` so the data position means the same examples"
            )
        self.state = TrainerState(**extra["trainer_state"])
        generators = self._generators()
        if len(extra["rng_states"]) != len(generators):
            raise ValueError(
                f"the checkpoint holds {len(extra['rng_states'])} random generator states, this model uses "
                f"{len(generators)}: resume with the model the checkpoint was written from"
            )
        for g, saved in zip(generators, extra["rng_states"]):
            g.bit_generator.state = saved

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

        Only process 0 writes; the others return None.
        """
        if not self.is_main_process:
            return None
        path = Path(self.args.output_dir) / MODEL_NAME if path is None else Path(path)
        extra = {}
        if self.tokenizer is not None:
            extra["tokenizer"] = self.tokenizer.state_dict()
        config = getattr(self.model, "config", None)
        if is_dataclass(config):
            extra["config"] = asdict(config)
        path.parent.mkdir(parents=True, exist_ok=True)
        serialization.save(path, model=self.model, extra=extra)
        return path


def format_log(entry, total_steps):
    """One printed line per log entry: 'step 10/200 | loss 2.8431 | lr 1.00e-03 | ...'."""
    parts = [f"step {entry['step']}/{total_steps}"]
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
    if "tokens_per_second" in entry:
        parts.append(f"{entry['tokens_per_second']:.0f} tok/s")
    if "memory" in entry:
        parts.append(f"mem {memory.format_bytes(entry['memory'])} (peak {memory.format_bytes(entry['peak_memory'])})")
    return " | ".join(parts)


class _StepReport:
    """args.memory_report: one optimizer step, all its micro-batches, recorded (memory.timeline) and written as a page.

    Started at the step's first micro-batch, finished after its update; the
    page is memory.Timeline.to_html's (Plotly: the `report` extra). If
    training fails in between, the timeline stops with this object.
    """

    def __init__(self, path):
        if importlib.util.find_spec("plotly") is None:
            raise ImportError(f"memory_report={path!r} needs Plotly for the page: pip install 'tinygrad_ckpt[report]'")
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):  # said now, not after the step has run
            raise ValueError(f"memory_report={path!r}: the folder {folder} does not exist; create it or choose another path")
        self.path, self.recording = path, None

    def start(self):
        if self.recording is None:
            self.before = memory.current()
            self.recording = contextlib.ExitStack()
            self.events = self.recording.enter_context(memory.timeline())

    def finish(self, name):
        """Stop recording, write the page; returns the line to print."""
        self.recording.close()
        timeline = memory.Timeline(self.events, name=name, before=self.before)
        timeline.to_html(self.path)
        i, peak = timeline.peak()
        return (f"memory report: {self.path} ({os.path.getsize(self.path) / 2**20:.1f} MiB; {name}: {len(timeline)} events, "
                f"peak {memory.format_bytes(peak)} at {timeline.events[i]['op']}, {timeline.events[i]['phase']})")


class _Progress:
    """A one-line progress bar on a terminal's stderr, rewritten in place; silent elsewhere."""

    def __init__(self, total, enabled=True, stream=None):
        self.total, self.stream = total, sys.stderr if stream is None else stream
        self.enabled = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start, self.tokens, self.line = time.perf_counter(), 0, ""

    def update(self, step, stats):
        """After optimizer step `step`; stats: that step's summed loss, items and tokens."""
        if not self.enabled:
            return
        self.tokens += stats["tokens"]
        done = int(20 * step / self.total)
        rate = self.tokens / max(time.perf_counter() - self.start, 1e-9)
        loss = stats["loss"] / max(1, stats["items"])
        self.line = (
            f"[{'#' * done}{'.' * (20 - done)}] {step}/{self.total} loss {loss:.4f} | {rate:.0f} tok/s | "
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
        if self.enabled and self.line:
            self.stream.write("\r\033[K")
            self.stream.flush()
