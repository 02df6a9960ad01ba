"""Saved runs: a Trainer's checkpoint files, and resuming a run from one.

A run writes output_dir/checkpoint-<step>.npz every save_steps (the names
Hugging Face's Trainer gives its checkpoint folders) and output_dir/model.npz
at its end. In this project "checkpoint" also names recomputation
(checkpoint.py); here, as in Hugging Face's Trainer, it is a file of a saved run.
What those files mean to a run lives here:

  - TrainerState: where a run is, what a checkpoint saves and resuming
    restores (Hugging Face keeps its TrainerState beside trainer.py too, in
    trainer_callback.py).
  - writing them (save_checkpoint, save_model): beside the model and the
    optimizer, the Trainer's state, the random generators' states, the
    batch layout, the run id and (fp16) the loss scale; never a NaN or an
    inf; save_total_limit keeps the newest few checkpoints.
  - listing them (sorted_checkpoints) and choosing the newest that verifies
    (load_checkpoint), skipping damaged ones and saying so.
  - verifying one in full (verify_checkpoint): types, ranges, a position a
    run reaches, finite arrays, a loss scale a GradScaler reaches.
  - restoring a Trainer from one: nothing is restored unless all of it can
    be; one written by another model configuration, tokenizer or batch
    layout (examples a micro-batch on all processes together, accumulation
    steps, seed) is an error naming the difference; another number of
    processes is not, nor another ZeRO stage (zero_checkpoint.py re-cuts
    the optimizer state); a position past a shorter data set's epoch
    continues at the next epoch.
  - one output directory, one run: each checkpoint carries its run's id; a
    fresh run refuses a directory holding another run's output
    (claim_output_dir), a resumed one a directory holding another run's
    checkpoints.

The functions that save or restore a run take its Trainer, and the Trainer
calls them in a line each (from train(), save_checkpoint() and save_model());
those that read files take a path.

What does not live here: the file format, its atomic write and its
byte-by-byte checks (serialization.py); the loss scaler's own state check
(grad_scaler.state_problem); a ZeRO run's shards: writing, joining and
cutting them (zero_checkpoint.py); the training loop (train.py).
"""

import math
import re
import sys
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path

import numpy

from . import backend, nn, random, serialization, zero_checkpoint
from .grad_scaler import state_problem
from .serialization import CheckpointFileError

CHECKPOINT_PREFIX = "checkpoint"  # output_dir/checkpoint-<optimizer step>.npz: the resumable training state
MODEL_NAME = "model.npz"  # the trained model (and tokenizer, config), in output_dir


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


# -- writing ------------------------------------------------------------------------------
def save_checkpoint(trainer, path=None):
    """Write everything needed to resume, atomically (a crash keeps the checkpoints already written).

    path: None for output_dir/checkpoint-<global_step>.npz, after which
    the oldest checkpoints beyond save_total_limit are deleted. Refuses
    (FloatingPointError) to write a parameter or optimizer state that is
    not finite. With several processes only process 0 writes (the others
    hold the same model and optimizer state) and the others return None;
    under ZeRO every process first writes its shard of the optimizer state
    beside `path`, which is the manifest (zero_checkpoint.py).
    """
    args = trainer.args
    if path is None and args.output_dir is None:
        raise ValueError("save_checkpoint(): output_dir is None, so there is nowhere to save; pass a path")
    path = checkpoint_path(args.output_dir, trainer.state.global_step) if path is None else Path(path)
    if trainer.zero:
        zero = _save_shard(trainer, path)
    if not trainer.is_main_process:
        return None
    _check_finite(trainer, "save a checkpoint")
    extra = {
        "trainer_state": asdict(trainer.state),
        "rng_states": [g.bit_generator.state for g in _generators(trainer.model)],  # dropout masks to come
        "batch_layout": [args.per_device_train_batch_size, args.gradient_accumulation_steps, args.seed],
        "world_size": trainer.world_size,  # micro_step counts micro-batches of all processes together
        "train_examples": len(trainer.train_dataset),  # micro_step is a position in an epoch of these
        "run_id": trainer.run_id,  # resuming takes only one run's checkpoints
        "training_args": asdict(args),  # for the reader; resuming uses the args it is given
    }
    if trainer.scaler.enabled:
        extra["grad_scaler"] = trainer.scaler.state_dict()  # fp16: the loss scale goes on where it was
    if trainer.zero:
        extra["zero"] = zero  # the shards' layout, names and hashes: this file is their manifest
    extra.update(_model_description(trainer))
    path.parent.mkdir(parents=True, exist_ok=True)
    serialization.save(path, model=trainer.model, optimizer=None if trainer.zero else trainer.optimizer, extra=extra)
    if args.output_dir is not None and path.parent.resolve() == Path(args.output_dir).resolve():
        _rotate_checkpoints(args.output_dir, trainer.state.global_step, args.save_total_limit)
    return path


def _save_shard(trainer, path):
    """ZeRO: every process checks and writes its shard (one stops, all stop); the manifest's extra["zero"]."""
    error = None
    try:
        _check_finite(trainer, "save a checkpoint")
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FloatingPointError, OSError) as e:
        error = e
    trainer.distributed.raise_if_any(error)
    return zero_checkpoint.save_shard(trainer, path)


def _delete_checkpoint(path):
    """Delete a checkpoint file and, for a ZeRO checkpoint, its shards (the manifest first)."""
    for file in [path, *zero_checkpoint.shard_files(path)]:
        file.unlink(missing_ok=True)


def _rotate_checkpoints(output_dir, saved_step, limit):
    """Keep the checkpoint just written and the newest `limit` - 1 older ones (None: keep them all).

    Checkpoints of later steps (left by a run that went further, and
    skipped when this one resumed) are never deleted here.
    """
    if limit is None:
        return
    older = [path for step, path in sorted_checkpoints(output_dir) if step < saved_step]
    for path in older[limit - 1:]:
        _delete_checkpoint(path)


def save_model(trainer, path=None):
    """Write the trained model (with the tokenizer and the model's config, if any) atomically.

    Refuses (FloatingPointError) a model that holds NaN or inf. Only
    process 0 writes; the others return None.
    """
    if not trainer.is_main_process:
        return None
    if path is None and trainer.args.output_dir is None:
        raise ValueError("save_model(): output_dir is None, so there is nowhere to save; pass a path")
    _check_finite(trainer, "save the model")
    path = Path(trainer.args.output_dir) / MODEL_NAME if path is None else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    serialization.save(path, model=trainer.model, extra=_model_description(trainer))
    return path


def _check_finite(trainer, doing):
    """Raise FloatingPointError naming the first parameter, buffer or optimizer state that holds NaN or inf."""
    model, optimizer = trainer.model, trainer.optimizer
    arrays = [(f"parameter {name!r}", p.data) for name, p in model.named_parameters()]
    arrays += [(f"buffer {name!r}", b.data) for name, b in model.named_buffers()]
    arrays += [(f"optimizer state {key}[{i}]", a) for key in optimizer.state_names
               for i, a in enumerate(getattr(optimizer, key))]
    for name, array in arrays:
        xp = backend.module_of(array)
        if array.dtype.kind in "fc" and not bool(backend.to_host(backend.as_array(xp.isfinite(array).all()))):
            raise FloatingPointError(
                f"refusing to {doing}: {name} holds NaN or inf, so the model has diverged; the checkpoints "
                "already written are kept. Resume from the newest one with a lower learning rate"
            )


def _model_description(trainer):
    """The model's configuration (a dataclass, as GPTConfig) and the tokenizer, as JSON values."""
    description = {}
    config = getattr(trainer.model, "config", None)
    if is_dataclass(config):
        description["config"] = asdict(config)
    if trainer.tokenizer is not None:
        description["tokenizer"] = trainer.tokenizer.state_dict()
    return description


def _generators(model):
    """The random generators a run draws from: the default one, then each Dropout's own, once."""
    generators = [random.default_generator]
    for module in model.modules():
        rng = getattr(module, "rng", None) if isinstance(module, nn.Dropout) else None
        if rng is not None and all(rng is not g for g in generators):
            generators.append(rng)
    return generators


# -- verifying ----------------------------------------------------------------------------
def verify_checkpoint(path):
    """Read a Trainer checkpoint and check all of it; returns what serialization.load returns.

    On top of serialization.load's checks (every byte, every array's dtype
    and shape, the metadata's types): it holds a model, an optimizer, the
    Trainer's state of the right types, only finite parameters and
    optimizer state, and (fp16) a loss scaler state a GradScaler can reach
    (grad_scaler.state_problem). A ZeRO checkpoint's shards are read,
    checked and joined (zero_checkpoint.join_shards), so it returns what one
    process would have written. Any problem raises CheckpointFileError
    naming the file (or the shard) and the field.
    """
    checkpoint = serialization.load(path)
    if "zero" in checkpoint["extra"]:  # a ZeRO run's manifest: its shards, checked and joined
        checkpoint = zero_checkpoint.join_shards(checkpoint, path)
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
    this run's data is _restore's (a shorter data set moves on to the next
    epoch: _fit_position).
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


# -- resuming -----------------------------------------------------------------------------
def load_checkpoint(trainer, where):
    """Restore the newest checkpoint that verifies (of `where`: True, a directory or a file).

    A damaged checkpoint (CheckpointFileError) is skipped for the next older
    one, and said so (a ZeRO checkpoint with a damaged or missing shard
    too: every process reads every shard, so all skip alike); one written by
    another model, tokenizer or batch layout is an error, since every
    checkpoint of the directory comes from the same run. Everything is
    checked before anything is restored.
    """
    if where is True:
        if trainer.args.output_dir is None:
            raise ValueError("resume_from_checkpoint=True looks in output_dir, which is None; "
                             "set output_dir or pass the checkpoint's path")
        where = trainer.args.output_dir
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
    trainer.skipped_checkpoints = []
    for path in candidates:
        try:
            checkpoint = verify_checkpoint(path)
        except CheckpointFileError as e:
            if len(candidates) == 1:
                raise
            trainer.skipped_checkpoints.append((path, str(e)))
            if trainer.is_main_process:
                print(f"resume: skipped {path}: {e}", file=sys.stderr)
            continue
        _check_output_dir_is_this_run(trainer, checkpoint["extra"].get("run_id"), path)
        _restore(trainer, checkpoint, path)
        trainer.resumed_from = path
        if trainer.is_main_process and trainer.skipped_checkpoints:
            print(f"resume: continuing from {path} (optimizer step {trainer.state.global_step})", file=sys.stderr)
        return path
    raise CheckpointFileError(f"no checkpoint in {str(where)!r} can be resumed from: all {len(candidates)} are damaged "
                              f"(the newest: {trainer.skipped_checkpoints[0][1]})")


def _restore(trainer, checkpoint, path):
    """Check that `checkpoint` belongs to this run, then restore the model, optimizer, state and RNG."""
    extra, args, where = checkpoint["extra"], trainer.args, repr(str(path))
    (B, G, seed), N = extra["batch_layout"], extra.get("world_size", 1)
    b, n = args.per_device_train_batch_size, trainer.world_size
    if (B * N, G, seed) != (b * n, args.gradient_accumulation_steps, args.seed):  # a micro-batch: B x N examples
        raise ValueError(
            f"the checkpoint {where} was written by {N} process(es) x per_device_train_batch_size={B} = {B * N} "
            f"examples a micro-batch, gradient_accumulation_steps={G}, seed={seed}; this run has {n} x {b} = {b * n}, "
            f"{args.gradient_accumulation_steps}, {args.seed}: resume with the same `mpiexec -n {N}` and values, or "
            f"with processes x per_device_train_batch_size = {B * N}, so the data position means the same examples"
        )
    ours = _model_description(trainer)
    for key, what in (("tokenizer", "tokenizer"), ("config", "model configuration")):
        if key in ours and key in extra:
            for name in list(ours[key]) + [n for n in extra[key] if n not in ours[key]]:
                if ours[key].get(name) != extra[key].get(name):
                    raise ValueError(
                        f"cannot resume from {where}: its {what} differs in {name!r}: "
                        f"{_difference(extra[key].get(name), ours[key].get(name))}; resume with the "
                        f"{'data' if key == 'tokenizer' else 'model settings'} the checkpoint was written with"
                    )
    generators = _generators(trainer.model)
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
    if trainer.zero:  # this process's shard of the whole optimizer state, on however many processes
        checkpoint = {**checkpoint, "optimizer": zero_checkpoint.cut(checkpoint["optimizer"], trainer.accumulator.layout)}
    serialization.restore(checkpoint, model=trainer.model, optimizer=trainer.optimizer)  # checks, then copies
    trainer.state, trainer.run_id = TrainerState(**extra["trainer_state"]), extra.get("run_id")
    if trainer.scaler.enabled and "grad_scaler" in extra:
        trainer.scaler.load_state_dict(extra["grad_scaler"])
    for g, saved in zip(generators, extra["rng_states"]):
        g.bit_generator.state = saved
    _fit_position(trainer, extra.get("train_examples"))


def _fit_position(trainer, saved_examples):
    """Move a restored position that is past this data's epoch to the next epoch, and say so.

    The checkpoint's own counts were range-checked (verify_checkpoint);
    here they meet this run's data: with fewer examples than when the
    checkpoint was written, its micro-batch may lie beyond the end of an
    epoch, and the run continues at the start of the next one, as
    Hugging Face's Trainer does. Any other change of the data is said too:
    the order of an epoch depends on the number of examples.
    """
    state, n, n_micro = trainer.state, len(trainer.train_dataset), trainer.micro_batches_per_epoch
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
    if trainer.is_main_process:
        print(f"resume: the training data has {n} examples, the checkpoint's run had {had}; {now}", file=sys.stderr)


def _difference(saved, ours):
    """'the checkpoint has X, this run has Y', pointing at the first difference of two strings or lists."""
    if isinstance(saved, (str, list)) and isinstance(ours, (str, list)) and len(saved) > 8:
        at = next((i for i, (a, b) in enumerate(zip(saved, ours)) if a != b), min(len(saved), len(ours)))
        return (f"the checkpoint's has {len(saved)} entries, this run's {len(ours)}; the first difference is at "
                f"position {at}: {saved[at:at + 1]!r} against {ours[at:at + 1]!r}")
    return f"the checkpoint has {saved!r}, this run has {ours!r}"


# -- one output directory, one run --------------------------------------------------------
def claim_output_dir(trainer):
    """A fresh run's output_dir must hold no other run's output; overwrite_output_dir deletes it."""
    directory = Path(trainer.args.output_dir)
    previous = [path for _, path in sorted_checkpoints(directory)]
    previous += [directory / MODEL_NAME] if (directory / MODEL_NAME).is_file() else []
    if not previous:
        return
    names = ", ".join(path.name for path in previous[:4]) + (", ..." if len(previous) > 4 else "")
    if not trainer.args.overwrite_output_dir:
        raise ValueError(
            f"output directory {str(directory)!r} already holds another run ({names}): continue it with "
            "--resume (resume_from_checkpoint=True), replace it with --overwrite-output-dir "
            "(overwrite_output_dir=True), or choose another --output-dir"
        )
    for path in previous:
        _delete_checkpoint(path)
    print(f"overwrite_output_dir: deleted the previous run's {len(previous)} file(s) in {str(directory)!r}: "
          f"{names}", file=sys.stderr)


def _check_output_dir_is_this_run(trainer, run_id, source):
    """Resuming from `source` (of run `run_id`) writes into output_dir: it must hold no other run's checkpoints.

    With overwrite_output_dir they are deleted, and said so. Checked
    before anything is restored, by every process (they resume from a
    directory they share, so they stop alike, never one waiting for the others).
    """
    directory = trainer.args.output_dir
    if directory is None or not Path(directory).is_dir():
        return
    others = {rid: paths for rid, paths in _checkpoint_runs(p for _, p in sorted_checkpoints(directory)).items()
              if rid != run_id}
    if not others:
        return
    listed = _describe_runs(others)
    if not trainer.args.overwrite_output_dir:
        raise ValueError(
            f"output directory {str(directory)!r} holds another run's checkpoints ({listed}), not those of "
            f"the run {str(source)!r} continues ({'run ' + run_id if run_id else 'without a run id'}): "
            "choose another --output-dir, or --overwrite-output-dir (overwrite_output_dir=True) to delete them"
        )
    for paths in others.values():
        for path in paths:
            _delete_checkpoint(path)
    if trainer.is_main_process:
        print(f"overwrite_output_dir: deleted another run's checkpoints in {str(directory)!r}: {listed}",
              file=sys.stderr)


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
