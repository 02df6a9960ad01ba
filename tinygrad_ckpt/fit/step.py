"""One training step, run on the meta device: what it holds, by category and in all (estimate_step).

To know what a step will hold, run the same code on arrays that have a shape
and a dtype and no data: `estimate_step` builds nothing of the model's size,
runs one optimizer step of the real Trainer on the meta device (meta.py),
and reads memory.py's count by category and the meta device's count of
every array. Whatever the engine does (early stop, rebuilt records,
policies, the blockwise cross-entropy, accumulation buffers, AdamW's
moments) is in the figures, with no second description of it; for a small
model, tests/test_fit.py runs the same step on real arrays and finds the same
bytes. It works for any Module built with device="meta"; `gpt_step` is it
for nn/transformer.py's GPT.
"""

import dataclasses
import pathlib
import traceback
from dataclasses import dataclass, field

import numpy

from .. import backend, memory, meta, policies
from ..data import stack_collate
from ..nn.module import Parameter
from ..nn.transformer import GPT
from . import progress
from .inputs import dtype_of
from .recorder import _Recorder
from .sharded import MetaDataParallel


@dataclass
class StepMemory:
    """What one training step holds: its peak and the split of it by category, in bytes.

    peak_bytes: the highest live bytes over the step, as memory.py counts
    them (memory.peak()[0] of the same step run on real arrays); at_peak:
    bytes by category at that moment; highest: each category's own highest
    value (saved activations: the figure activations.chain_peak predicts for
    a GPT); start: what lives before the step (parameters, optimizer state,
    accumulation buffers).

    device_peak_bytes: the highest of all the step's arrays together, as the
    meta device counts them: memory.py's arrays and every other array the
    engine makes (an op's scratch, a gradient before it is delivered), plus
    `constant_bytes`: on the CPU, the batch's host arrays, which the meta
    device does not see (on a GPU they are host memory). What an allocator
    must find room for, before its own overheads.

    forward_flops: the FLOPs of the ops the step ran forward; recomputed_flops:
    the forward FLOPs of the ops the step's checkpoint recomputes ran (what a
    policy's stash replays is not run). Both counted by ops/flops.py from the
    shapes of the op events the run sees.
    """

    peak_bytes: int
    at_peak: dict
    highest: dict
    start: dict
    device_peak_bytes: int = 0
    constant_bytes: int = 0
    recomputed_flops: int = 0
    forward_flops: int = 0
    points: numpy.ndarray = field(default=None, repr=False)  # bytes at every check of memory.py: (checks, CATEGORIES)
    scratch_points: numpy.ndarray = field(default=None, repr=False)  # the meta device's live bytes after every allocation


def estimate_step(model, batch_shapes, compute_loss_func=None, training_arguments=None, device="cuda", processes=1,
                  rank=0):
    """One optimizer step of `model`, run by the Trainer on the meta device: a StepMemory.

    >>> from tinygrad_ckpt import Tensor, functional as F
    >>> from tinygrad_ckpt.nn import MLP
    >>> model = MLP(784, 512, 10, n_layers=2, device="meta")    # no values, nothing drawn
    >>> def loss(model, b):                                     # (sum of the losses, items)
    ...     logits = model(Tensor(b["x"], device="meta"))
    ...     return F.cross_entropy(logits, b["y"], reduction="sum"), len(b["y"])
    >>> step = estimate_step(model, {"x": ((64, 784), "float32"), "y": ((64,), "int64")}, loss)
    >>> step.start["parameters"]                # (784*512 + 512 + 512*512 + 512 + 512*10 + 10) * 4 bytes
    2678824
    >>> step.peak_bytes, step.device_peak_bytes
    (13525200, 15532192)

    model: any Module built with device="meta" (its arrays are entered into
    the count, as Module.to enters them). batch_shapes: {field: (shape, dtype)}
    of one micro-batch; the step gets host arrays of zeros of those shapes
    (labels of 0: every item counts). compute_loss_func: the Trainer's
    (model, batch) -> (sum of the losses, items); None: the GPT's loss on
    "input_ids" and "labels". training_arguments: a TrainingArguments or a dict
    of its fields (gradient checkpointing, accumulation dtype, optimizer...);
    per_device_train_batch_size is the batch's first axis. device: "cuda" or
    "cpu", the device the meta device stands in for (meta.like). processes,
    rank: the step of rank `rank` of that many data-parallel processes, each
    given a micro-batch of the batch's shape (the other ranks stood in for:
    fit/sharded.py); training_arguments' zero_stage then shards it (zero.py).

    The model is left as the Trainer leaves it (checkpointing switched on if asked).
    A step that asks for a value (`.item()`, `if loss > 0:`) cannot be sized
    without values, and following a made-up branch would size another step:
    meta.NeedsValues, naming the line that asked.
    """
    from ..train import Trainer, TrainingArguments

    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1 or not 0 <= rank < processes:
        raise ValueError(f"processes must be an integer of at least 1 and rank one of 0 .. processes - 1, got "
                         f"processes={processes!r}, rank={rank!r}")
    if not batch_shapes:
        raise ValueError("batch_shapes is empty: give each field of a micro-batch as name: (shape, dtype)")
    shapes = {name: (tuple(shape), numpy.dtype(dtype)) for name, (shape, dtype) in batch_shapes.items()}
    B = {shape[0] if shape else None for shape, _ in shapes.values()}
    if len(B) != 1 or None in B or B == {0}:
        raise ValueError(f"every field of batch_shapes needs the same first axis, the micro-batch: {batch_shapes}")
    B = B.pop()
    args = dict(training_arguments or {}) if not isinstance(training_arguments, TrainingArguments) else {
        f.name: getattr(training_arguments, f.name) for f in dataclasses.fields(training_arguments)}
    args.update(per_device_train_batch_size=B, gradient_accumulation_steps=1, max_steps=1, logging_steps=0,
                disable_tqdm=True, keep_freed_memory=False, output_dir=None, save_steps=0, eval_steps=0)
    args = TrainingArguments(**args)
    ck = (args.gradient_checkpointing_kwargs or {}) if args.gradient_checkpointing else {}
    policy = policies.resolve(ck.get("policy"))
    example = {name: numpy.zeros(shape[1:], dtype) for name, (shape, dtype) in shapes.items()}
    recorder, batches = _Recorder(policy), []

    def collate(examples):  # a host batch of zeros; kept, to see which arrays the device never saw
        batches.append(stack_collate(examples))
        return batches[-1]

    previous, memory.tracker = memory.tracker, memory.MemoryTracker()  # the step's own count
    tracker = memory.tracker
    try:
        with recorder, meta.counting(points=True, stands_in_for=device) as count:
            _enter(model, count)
            ranks = MetaDataParallel(rank, processes) if processes > 1 else None
            trainer = Trainer(model, args, [example] * (B * processes), data_collator=collate,
                              compute_loss_func=compute_loss_func, distributed=ranks)
            try:
                trainer.train()
            except meta.NeedsValues as e:
                raise meta.NeedsValues(f"estimate_step: the step asks for a value at {_asking_line(e)}; the meta "
                                       f"device has none (a branch taken on a made-up one would size another "
                                       f"step). {e}") from e
            # On the CPU the batch is host memory and device memory at once: what the step never brought
            # to the meta device (say, labels read on the host only) is added, as alive through the step.
            constant = 0 if device == "cuda" else sum(a.nbytes for batch in batches for a in batch.values()
                                                      if not meta.has_stand_in(a))
    finally:
        memory.tracker = previous
    points = numpy.frombuffer(recorder.checks, dtype=numpy.int64).reshape(-1, len(memory.CATEGORIES))
    highest = dict(zip(memory.CATEGORIES, map(int, points.max(axis=0))))
    scratch = numpy.frombuffer(count.points, dtype=numpy.int64)
    return StepMemory(tracker.peak_total, dict(tracker.peak), highest, recorder.start, count.peak + constant,
                      constant, recorder.recomputed_flops, recorder.forward_flops, points, scratch)


def _asking_line(error):
    """'file:line: code' of the innermost frame of `error` outside the engine's plumbing (the tensor, the
    backend, the ops, the meta device): the line that asked for a value."""
    package = pathlib.Path(backend.__file__).parent
    plumbing = {package / name for name in ("tensor.py", "backend.py", "function.py", "meta.py")}
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        path = pathlib.Path(frame.filename)
        if path not in plumbing and path.parent != package / "ops":
            return f"{frame.filename}:{frame.lineno}" + (f" ({frame.line})" if frame.line else "")
    return "an unknown line"


def _enter(model, count):
    """Put the model's arrays (made before the count began) in the count, as Module.to puts them."""
    for t in list(model.parameters()) + [b for _, b in model.named_buffers()]:
        base = backend.storage(t.data)
        if backend.device_of(base) != "meta":
            raise ValueError(f"the model has a {backend.device_of(base)} array: build it with device='meta'")
        count.adopt(base)  # once each (a tied weight is listed once); freed from the count if ZeRO replaces it
        memory.track(t.data, "parameters" if isinstance(t, Parameter) else None)
    count.peak = count.live


def gpt_step(config, batch_size, seq_len, dtype="float32", checkpointing=None, accumulation_dtype=None,
             optim="adamw", device="cuda", autocast=None, processes=1, zero_stage=0):
    """estimate_step for nn/transformer.py's GPT (a GPTConfig) on batches of batch_size x seq_len tokens.

    checkpointing: None, or GPT.gradient_checkpointing_enable's arguments
    (segments, policy, split_blocks); dtype: the model's; accumulation_dtype,
    optim: as TrainingArguments'; autocast: None, "bfloat16" or "float16",
    mixed precision as TrainingArguments' bf16 / fp16; processes, zero_stage:
    one rank's step of that many, with TrainingArguments' zero_stage.
    """
    key = (repr(config), batch_size, seq_len, dtype, repr(checkpointing), accumulation_dtype, optim, device, autocast,
           processes, zero_stage)
    return kept(STEPS, key, lambda: dataclasses.replace(
        _gpt_step(config, batch_size, seq_len, dtype, checkpointing, accumulation_dtype, optim, device, autocast,
                  processes, zero_stage), points=None, scratch_points=None))


# The steps and profiles run so far, by what they depend on (not the GPU asked about): asking about
# another GPU, or the table after the command line, runs nothing again. The oldest go first.
STEPS, PROFILES = {}, {}


def kept(store, key, make, size=64):
    if key not in store:
        if len(store) >= size:
            store.pop(next(iter(store)))
        store[key] = make()
    return store[key]


def _gpt_step(config, batch_size, seq_len, dtype, checkpointing, accumulation_dtype, optim, device, autocast,
              processes=1, zero_stage=0):
    """The step with every check's bytes (StepMemory.points): estimate_step on a GPT of config's size."""
    model = GPT(config, dtype=dtype_of(dtype), device="meta")
    args = dict(optim=optim, accumulation_dtype=accumulation_dtype, fp16=autocast == "float16",
                bf16=autocast == "bfloat16", zero_stage=zero_stage)
    if checkpointing is not None:
        args.update(gradient_checkpointing=True, gradient_checkpointing_kwargs=dict(checkpointing))
    tokens = ((batch_size, seq_len), numpy.int64)
    step = estimate_step(model, {"input_ids": tokens, "labels": tokens}, None, args, device, processes)
    progress.ran()
    return step
