"""Will it fit? A training step's memory, measured by running the step on arrays with no data.

    >>> plan = plan_training("gpt2-medium", effective_batch_size=32, device_memory="a10")
    >>> plan.recommendation.verdict
    'gradient accumulation'
    >>> plan.recommendation.training_arguments
    'TrainingArguments(per_device_train_batch_size=2, gradient_accumulation_steps=16)'
    >>> print(plan)                     # the table, and the recommendation  # doctest: +ELLIPSIS
    Will it fit? gpt2-medium: 24 blocks, width 1024, 16 heads, ...

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

For one GPT configuration (a GPTConfig, or a GPT-2 size by name), a sequence
length, an effective batch, a dtype, a device memory and a number of
data-parallel processes, `plan_training` answers, for each way of
checkpointing (none, every block, every block with half blocks, sqrt(n)
segments, the selective policy, the planner at the device's budget):

  * the peak of one training step by category (parameters, gradients,
    accumulation buffers, optimizer state, saved activations, and "other":
    what is in flight, a gradient travelling back, an output not saved yet),
    as memory.py counts it;
  * the device's peak: every array of the step, an op's scratch included
    (StepMemory.device_peak_bytes);
  * the largest micro-batch that fits, the micro-batch and accumulation steps
    that make the effective batch exactly, and the time the recomputation
    costs, as recomputed FLOPs over the step's (about three forwards);

and recommends, in the terms of Hugging Face's guide "Methods and tools for
efficient training on a single GPU" (transformers v4.39 docs,
docs/source/en/perf_train_gpu_one.md): no technique needed, gradient
accumulation, gradient checkpointing, both, or "does not fit even with both"
and by how much, with the TrainingArguments line that does it.

Two documented shortcuts of the run, each compared with the plain run in
tests/test_fit.py. Every array of a GPT's step is a + b x batch bytes, so the
step run at micro-batches 1 and 2 gives every batch size (StepProfile); on
the CPU, where some ops work in pieces of a fixed size, each size is run.
And a GPT's blocks are identical (_repeated_blocks_step): where the
checkpointing is one unit of blocks repeated (none, every block, half
blocks, the selective policy, the planner's pairs; not sqrt(n)'s segments
of 7 and 6 blocks for 48), the step is run with 3 and 4 units, and each
moment of the two runs (a check of memory.py, an allocation of the meta
device) is matched by what made it. A block adds the same arrays, so a
moment's bytes grow by the same amount with each unit, and the copies of a
unit's moments (its forward, its backward, its gradients' accumulation, its
update) grow by the same amount from one copy to the next: that gives every
moment of the step with any number of units, and its figures are read from
them as from a run. The step with 2 units is run too and must be what this
predicts, to the byte and in what made each moment; else, or where the
plan has no repeated unit, or where the small runs would not be fewer
blocks than the step, the step is run as it is
(test_a_step_of_many_blocks_from_steps_of_a_few_is_the_plain_run,
test_the_repeated_blocks_shortcut_falls_back_to_the_plain_run,
test_plan_training_s_table_is_the_same_with_the_shortcut_and_without).

GPU presets are the total memory CUDA reports for each card (GPUS, each from
a published report), less the CUDA context (DEFAULT_RESERVE); a size given
instead is taken as what the process can have. reserve_bytes overrides the
reserve; benchmarks/gpu_check.sh measures it on a GPU.

dtypes: float32 and float64 are the model's dtype. float16 and bfloat16
need the kind of 16-bit training said (mixed_precision), and each is run as
the Trainer runs it:
  True   mixed precision, TrainingArguments(fp16=True) or bf16=True: float32
         parameters, gradients, AdamW moments and accumulation buffers, and
         the forward's ops in 16-bit where autocast's policy says (autocast.py;
         layer norm, softmax and the loss stay float32). As PyTorch's autocast,
         not as the "16 bytes per parameter" of Rajbhandari et al. 2020 (ZeRO,
         section 3.1), which keeps 16-bit parameters beside float32 masters.
  False  a 16-bit model: every array 16-bit, AdamW's moments included.
bfloat16 needs the ml_dtypes package (NumPy has no bfloat16).

What does not live here: the meta device (meta.py), the saved-activation
formulas (activations.py), the planner (schedules.py), the command line (cli.py).
"""

import argparse
import dataclasses
import math
import pathlib
import re
import traceback
from array import array
from dataclasses import dataclass, field

import numpy

from . import activations, autocast, backend, memory, meta, observe, policies
from .data import stack_collate
from .nn.module import Parameter
from .nn.transformer import GPT, GPTConfig
from .ops.flops import op_flops
from .schedules import LayerCost, Plan, describe, minimum_budget, plan_checkpoints, segment_bounds

# GPT-2's four sizes: n_layer, n_head and n_embd as nanoGPT's GPT.from_pretrained loads
# Hugging Face's gpt2, gpt2-medium, gpt2-large and gpt2-xl; vocabulary and context as
# transformers' GPT2Config defaults (vocab_size=50257, n_positions=1024); dropout 0.1 and
# biases, tied embedding, as GPT-2.
GPT2 = {
    "gpt2": GPTConfig(block_size=1024, vocab_size=50257, n_layer=12, n_head=12, n_embd=768, dropout=0.1),
    "gpt2-medium": GPTConfig(block_size=1024, vocab_size=50257, n_layer=24, n_head=16, n_embd=1024, dropout=0.1),
    "gpt2-large": GPTConfig(block_size=1024, vocab_size=50257, n_layer=36, n_head=20, n_embd=1280, dropout=0.1),
    "gpt2-xl": GPTConfig(block_size=1024, vocab_size=50257, n_layer=48, n_head=25, n_embd=1600, dropout=0.1),
}

GiB = 1 << 30
# name -> (what it is, nominal GB, GiB as CUDA reports its total memory). The reported total is
# what cudaMemGetInfo gives and PyTorch's out-of-memory message prints ("GPU 0 has a total
# capacity of 14.56 GiB"; c10/cuda/CUDACachingAllocator.cpp), less than the nominal size (ECC,
# the driver's reservations) and varying by a few hundredths with the driver. Each from a
# published report naming the card:
GPUS = {
    "t4": ("NVIDIA T4", 16, 14.56),  # github.com/Zheng-Chong/CatVTON/issues/133 ("Tesla T4")
    "v100-16gb": ("NVIDIA V100 16 GB", 16, 15.78),  # github.com/kchengiva/Shift-GCN/issues/34 ("16G V100")
    "v100-32gb": ("NVIDIA V100 32 GB", 32, 31.74),  # github.com/liucongg/ChatGLM-Finetuning/issues/73 ("V100 32GB")
    "a10": ("NVIDIA A10", 24, 21.99),  # github.com/zai-org/CogVLM/issues/236 (Lambda's a10)
    "l4": ("NVIDIA L4", 24, 22.03),  # github.com/ArcInstitute/evo2/issues/190 ("a L4 GPU")
    "rtx-3090": ("NVIDIA GeForce RTX 3090", 24, 23.68),  # github.com/LambdaLabsML/examples/issues/48 ("3090")
    "rtx-4090": ("NVIDIA GeForce RTX 4090", 24, 23.64),  # github.com/ali-vilab/VGen/issues/104 ("RTX 4090 24GB")
    "a100-40gb": ("NVIDIA A100 40 GB", 40, 39.39),  # github.com/bottlerocket-os/bottlerocket/pull/3873 (deviceQuery,
    #                                                 A100-SXM4-40GB: 42298834944 bytes)
    "a100-80gb": ("NVIDIA A100 80 GB", 80, 79.15),  # github.com/vllm-project/vllm/issues/4408 ("A100 80GB")
    "h100-80gb": ("NVIDIA H100 80 GB", 80, 79.18),  # github.com/shyampathak22/prime-rl, benchmarks/results/BENCHMARKS.md
    #                                                 ("1xH100 HBM3")
    "h200": ("NVIDIA H200", 141, 139.81),  # github.com/sungwon-chae/arxiv_confi, etu_logging.md ("NVIDIA H200")
}
# What a GPU's process cannot have of that total, by default: the CUDA context (the driver and the
# loaded kernels), about 300 MB (github.com/pytorch/pytorch/issues/107667) to 400 MB
# (github.com/pytorch/pytorch/issues/109888) with the lazy module loading PyTorch has set since 1.13
# (github.com/pytorch/pytorch/pull/86509), and it cannot be freed.
# Rounded up to 0.5 GiB for the caching allocator's rounding: that margin is ours, not a source's.
DEFAULT_RESERVE = GiB // 2

UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}

# (key, label, what GPT.gradient_checkpointing_enable takes); the planner's row is made apart.
STRATEGIES = (
    ("none", "no checkpointing", None),
    ("every", "every block", dict(segments="every")),
    ("halves", "every block, half blocks", dict(segments="every", split_blocks=True)),
    ("sqrt", "sqrt(n) segments", dict(segments="sqrt")),
    ("selective", "selective policy", dict(segments="every", policy="selective_attention")),
)
PLANNER = ("planner", "planner at the budget")

VERDICTS = ("no technique needed", "gradient accumulation", "gradient checkpointing",
            "gradient accumulation and checkpointing", "does not fit even with both")


# -- inputs ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Precision:
    """What the arrays of a step are made of, and how the step is run."""

    dtype: str  # the model's: its parameters, gradients, optimizer state and buffers
    autocast: str  # None, or the 16-bit dtype autocast runs the forward's ops in (TrainingArguments fp16/bf16)
    description: str

    @property
    def itemsize(self):
        """Bytes per element of most activations (the planner's formulas' unit)."""
        return 2 if self.autocast else _dtype(self.dtype).itemsize


def precision(dtype="float32", mixed_precision=None):
    """The Precision of a dtype name; 16-bit ones need mixed_precision (True or False) said."""
    if dtype in ("float32", "float64"):
        if mixed_precision:
            raise ValueError(f"mixed_precision applies to float16 and bfloat16, not to dtype {dtype!r}")
        return Precision(dtype, None, dtype)
    if dtype in ("float16", "bfloat16"):
        if mixed_precision is None:
            raise ValueError(
                f"dtype {dtype!r}: say which 16-bit training with mixed_precision=True (autocast: float32 parameters, "
                "gradients, AdamW moments and buffers, the forward's ops in 16-bit; TrainingArguments "
                f"{'fp16' if dtype == 'float16' else 'bf16'}=True) or mixed_precision=False (a 16-bit model: every "
                "array 16-bit)")
        if mixed_precision:
            flag = "fp16" if dtype == "float16" else "bf16"
            return Precision("float32", dtype, f"{dtype} mixed precision ({flag}=True: float32 parameters and state, "
                             f"the forward's ops in {dtype} as autocast's policy says)")
        return Precision(dtype, None, f"pure {dtype} (a {dtype} model: every array 16-bit, AdamW's moments too)")
    raise ValueError(f"dtype must be one of float32, float64, float16, bfloat16, got {dtype!r}")


def model_config(model):
    """A GPTConfig from itself, a GPT-2 preset's name, or a dict of GPTConfig's fields; checked."""
    if isinstance(model, str):
        if model not in GPT2:
            raise ValueError(f"unknown model preset {model!r}: use one of {', '.join(GPT2)}, or give the GPT's fields")
        return GPT2[model]
    if isinstance(model, dict):
        unknown = set(model) - set(GPTConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown GPTConfig field(s) {', '.join(sorted(unknown))}; the fields are "
                             f"{', '.join(GPTConfig.__dataclass_fields__)}")
        model = GPTConfig(**model)
    if not isinstance(model, GPTConfig):
        raise TypeError(f"model must be a GPTConfig, a preset name or a dict of fields, got {type(model).__name__}")
    for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
        _positive_int(name, getattr(model, name))
    if model.n_embd % model.n_head:
        raise ValueError(f"n_head ({model.n_head}) must divide n_embd ({model.n_embd})")
    if not 0 <= model.dropout < 1:
        raise ValueError(f"dropout must be in [0, 1), got {model.dropout}")
    return model


def device_memory_bytes(memory):
    """(bytes, label) from a GPU preset's name (its total as CUDA reports it), a number of bytes, or a size
    with its unit such as '24GiB', '16 GB' or '17179869184B'.

    A string that is a bare number is refused: '3090' is a GPU's name far
    more often than 3,090 bytes, so a size written as text says its unit.
    """
    if isinstance(memory, str):
        key = memory.strip().lower()
        if key in GPUS:
            name, nominal, gib = GPUS[key]
            return round(gib * GiB), f"{name}, {nominal} GB nominal, {gib} GiB as CUDA reports it"
        number = key.rstrip("abcdefghijklmnopqrstuvwxyz ")
        unit = key[len(number):].strip()
        if not unit and re.fullmatch(r"[0-9.e+]+", number):  # a number, not 'h300'
            like = [g for g in GPUS if len(number) > 1 and number in g]  # "3090" -> rtx-3090
            raise ValueError(f"device memory {memory!r} is a bare number: give a GPU preset "
                             f"({', '.join(GPUS)}{'; did you mean ' + ' or '.join(like) + '?' if like else ''}) "
                             f"or a size with its unit ({memory.strip()}B for bytes, 24GiB, 16GB)")
        try:
            value = float(number) if unit in UNITS else None
        except ValueError:  # 'h300', 'a100': a GPU's name this table does not have
            value = None
        if value is None or not math.isfinite(value):
            raise ValueError(f"device memory {memory!r} is neither a GPU preset ({', '.join(GPUS)}) nor a size "
                             "such as 24GiB, 16GB or 17179869184B")
        memory = int(value * UNITS[unit])
    if (isinstance(memory, bool) or not isinstance(memory, (int, float)) or not math.isfinite(memory)
            or memory <= 0):
        raise ValueError(f"device memory must be a positive size, got {memory!r}")
    memory = int(memory)
    return memory, _size(memory)


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


# -- one training step, run on the meta device -----------------------------------------------
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

    recomputed_flops: the forward FLOPs of the ops the step's checkpoint
    recomputes ran (ops/flops.py; what a policy's stash replays is not run).
    """

    peak_bytes: int
    at_peak: dict
    highest: dict
    start: dict
    device_peak_bytes: int = 0
    constant_bytes: int = 0
    recomputed_flops: int = 0
    points: list = field(default=None, repr=False)  # bytes at every check of memory.py, one column per category
    scratch_points: list = field(default=None, repr=False)  # the meta device's live bytes after every allocation
    # For the repeated-blocks shortcut (_trace): what made each check, the allocations before it, each
    # allocation's bytes, the meta device's live bytes at the start.
    trace: tuple = field(default=None, repr=False)


class _Recorder(observe.Observer):
    """Watches the step (observe.py): from its start (train()'s reset_peak) the bytes by category at every
    check memory.py makes, what made each check (for the repeated-blocks shortcut), and the FLOPs of the ops
    a recompute runs (which a policy says to recompute)."""

    def __init__(self, policy):
        self.points = self.start = None
        self.policy = policy
        self.recomputed_flops = 0
        self.doing = ("start",)  # the last event: what the step is doing (op, phase, kind)
        # At every check, for the repeated-blocks shortcut (_trace): what the step was doing and the array
        # checked, and how many allocations of the meta device came before it.
        self.labels, self.allocations = [], array("q")
        self.live_at_start = 0  # the meta device's live bytes at the step's start

    def on_reset_peak(self):
        self.start = dict(memory.tracker.current)
        self.points = [array("q", [self.start[c]]) for c in memory.CATEGORIES]
        meta.count.reset_peak()
        self.live_at_start = meta.count.live
        self.labels, self.allocations = [self.doing], array("q", [0])

    def on_track(self, buffer, category, new):
        if self.points is not None:
            for column, c in zip(self.points, memory.CATEGORIES):
                column.append(memory.tracker.current[c])
            self.labels.append((self.doing, (buffer.nbytes, category)))
            self.allocations.append(len(meta.count.points))

    def on_op(self, event):
        op, phase = event["op"], event["phase"]
        self.doing = (op, phase, event["kind"])
        if phase == "recompute" and "outputs" in event and (
                self.policy is None or self.policy(op) == policies.RECOMPUTE):
            self.recomputed_flops += op_flops(op, [a.shape for a in event["inputs"]],
                                              [o.shape for o in event["outputs"]])


def estimate_step(model, batch_shapes, compute_loss_func=None, training_arguments=None, device="cuda"):
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
    "cpu", the device the meta device stands in for (meta.like).

    The model is left as the Trainer leaves it (checkpointing switched on if asked).
    A step that asks for a value (`.item()`, `if loss > 0:`) cannot be sized
    without values, and following a made-up branch would size another step:
    meta.NeedsValues, naming the line that asked.
    """
    from .train import Trainer, TrainingArguments

    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
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
            trainer = Trainer(model, args, [example] * B, data_collator=collate, compute_loss_func=compute_loss_func)
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
    points = recorder.points
    highest = {c: max(column) for c, column in zip(memory.CATEGORIES, points)}
    trace = (recorder.labels, recorder.allocations, count.sizes, recorder.live_at_start)
    return StepMemory(tracker.peak_total, dict(tracker.peak), highest, recorder.start, count.peak + constant,
                      constant, recorder.recomputed_flops, points, count.points, trace)


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
    seen = set()
    for t in list(model.parameters()) + [b for _, b in model.named_buffers()]:
        base = backend.storage(t.data)
        if backend.device_of(base) != "meta":
            raise ValueError(f"the model has a {backend.device_of(base)} array: build it with device='meta'")
        if id(base) not in seen:
            seen.add(id(base))
            count.live += base.nbytes
        memory.track(t.data, "parameters" if isinstance(t, Parameter) else None)
    count.peak = count.live


def gpt_step(config, batch_size, seq_len, dtype="float32", checkpointing=None, accumulation_dtype=None,
             optim="adamw", device="cuda", autocast=None):
    """estimate_step for nn/transformer.py's GPT (a GPTConfig) on batches of batch_size x seq_len tokens.

    checkpointing: None, or GPT.gradient_checkpointing_enable's arguments
    (segments, policy, split_blocks); dtype: the model's; accumulation_dtype,
    optim: as TrainingArguments'; autocast: None, "bfloat16" or "float16",
    mixed precision as TrainingArguments' bf16 / fp16.
    """
    key = (repr(config), batch_size, seq_len, dtype, repr(checkpointing), accumulation_dtype, optim, device, autocast)
    return _kept(_STEPS, key, lambda: dataclasses.replace(
        _gpt_step(config, batch_size, seq_len, dtype, checkpointing, accumulation_dtype, optim, device, autocast),
        points=None, scratch_points=None, trace=None))


# The steps and profiles run so far, by what they depend on (not the GPU asked about): asking about
# another GPU, or the table after the command line, runs nothing again. The oldest go first.
_STEPS, _PROFILES = {}, {}


def _kept(store, key, make, size=64):
    if key not in store:
        if len(store) >= size:
            store.pop(next(iter(store)))
        store[key] = make()
    return store[key]


def _gpt_step(config, batch_size, seq_len, dtype, checkpointing, accumulation_dtype, optim, device, autocast):
    """The step with every check's bytes (StepMemory.points): from a few blocks where that is exact and
    cheaper (_repeated_blocks_step), else run as it is."""
    run = lambda config, checkpointing: _plain_step(  # noqa: E731 (the same step, another depth or plan)
        config, batch_size, seq_len, dtype, checkpointing, accumulation_dtype, optim, device, autocast)
    repeats = _Repeats.of(config.n_layer, checkpointing) if REPEATED_BLOCKS else None
    if repeats is not None and repeats.worth_it():
        step = _repeated_blocks_step(config, repeats, run)
        if step is not None:
            return step
    return run(config, checkpointing)


def _plain_step(config, batch_size, seq_len, dtype, checkpointing, accumulation_dtype, optim, device, autocast):
    """The step run as it is: estimate_step on a GPT of config's size."""
    model = GPT(config, dtype=_dtype(dtype), device="meta")
    args = dict(optim=optim, accumulation_dtype=accumulation_dtype, fp16=autocast == "float16",
                bf16=autocast == "bfloat16")
    if checkpointing is not None:
        args.update(gradient_checkpointing=True, gradient_checkpointing_kwargs=dict(checkpointing))
    tokens = ((batch_size, seq_len), numpy.int64)
    return estimate_step(model, {"input_ids": tokens, "labels": tokens}, None, args, device)


# -- the second shortcut: identical blocks, run a few times ---------------------------------
REPEATED_BLOCKS = True  # False: every step is run as it is (tests compare the two)


@dataclass
class _Repeats:
    """A checkpointing plan as a head, a unit repeated `count` times, and a tail, in the chain's layers.

    The chain is the blocks, or their halves with split_blocks (per_block
    layers a block); the unit covers whole blocks (`unit_blocks`). at(copies)
    is the same plan with `copies` units: a GPT of blocks(copies) blocks and
    the checkpointing that goes with it.
    """

    checkpointing: dict  # as given (None: no checkpointing)
    per_block: int
    head: list  # segments (start, stop, how) before the first unit
    unit: list  # the first unit's segments
    count: int
    tail: list  # segments after the last unit
    unit_blocks: int
    other_blocks: int  # the head's and the tail's

    @classmethod
    def of(cls, n_layer, checkpointing):
        """The plan's longest run of a repeated unit; None if it has none (as sqrt(n)'s segments of 7 and 6)."""
        if checkpointing is None:  # every block alike
            return cls(None, 1, [], [], n_layer, [], 1, 0)
        split = bool(checkpointing.get("split_blocks", False))
        per_block = 2 if split else 1
        try:
            segments = segment_bounds(n_layer * per_block, checkpointing.get("segments", "every"))
        except (TypeError, ValueError):  # the plain run says what is wrong
            return None
        best = None
        for first in range(len(segments)):
            if segments[first][0] % per_block:
                continue
            for size in range(1, (len(segments) - first) // 3 + 1):
                width = segments[first + size - 1][1] - segments[first][0]
                if width % per_block:
                    continue
                unit = segments[first:first + size]
                count = 1
                while segments[first + count * size:first + (count + 1) * size] == _shifted(unit, count * width):
                    count += 1
                if count >= 3 and (best is None or count * width > best[2] * best[3]):
                    best = (first, size, count, width)
        if best is None:
            return None
        first, size, count, width = best
        return cls(checkpointing, per_block, segments[:first], segments[first:first + size], count,
                   segments[first + count * size:], width // per_block, n_layer - count * width // per_block)

    def blocks(self, copies):
        return self.other_blocks + copies * self.unit_blocks

    def at(self, copies):
        """(blocks, checkpointing) of the plan with `copies` units."""
        if self.checkpointing is None:
            return copies, None
        width = self.unit_blocks * self.per_block
        segments = (self.head + [s for i in range(copies) for s in _shifted(self.unit, i * width)]
                    + _shifted(self.tail, (copies - self.count) * width))
        return self.blocks(copies), {**self.checkpointing, "segments": segments}

    def worth_it(self):
        """Are the three small runs (SMALL_COPIES) fewer blocks than the step's?"""
        return sum(self.blocks(c) for c in SMALL_COPIES) < self.blocks(self.count) and self.count > max(SMALL_COPIES)


# The runs, in units: the steps of the first two give the step of any number; the third, one unit fewer
# than the first, is predicted from them and compared with its run. (Three copies in the first: where the
# first or the last copy of a run differs from the others, two are still in step.)
SMALL_COPIES = (3, 4, 2)


def _shifted(segments, by):
    """Segments (start, stop, how), an inner plan's too, moved by `by` layers."""
    return [(a + by, b + by, _shifted(how, by) if isinstance(how, list) else how) for a, b, how in segments]


def _repeated_blocks_step(config, repeats, run):
    """The step of config's blocks from steps of 3, 4 and 2 units of blocks; None where that is not exact.

    See _trace and _extended for what is predicted and how. The steps of 3
    and 4 units give the step of any number; the step of 2 units is
    predicted from them and compared with its run, every check's bytes, what
    made it, and the step's other figures: anything different, and None.
    """
    small = []
    for copies in SMALL_COPIES:
        blocks, checkpointing = repeats.at(copies)
        small.append(run(dataclasses.replace(config, n_layer=blocks), checkpointing))
    traces = [_trace(step) for step in small]
    first, _, third = SMALL_COPIES
    places = _places(traces[0], traces[1])
    if places is None:
        return None
    check = _extended(traces[0], traces[1], places, third - first)
    if check[0] != traces[2][0] or not numpy.array_equal(check[1], traces[2][1]):
        return None
    # The step's other figures, each affine in the number of units too (checked the same way).
    figures = numpy.array([[step.trace[3], step.constant_bytes, step.recomputed_flops]
                           + [step.start[c] for c in memory.CATEGORIES] for step in small], dtype=numpy.int64)
    if not (figures[2] == figures[0] + (third - first) * (figures[1] - figures[0])).all():
        return None
    extended = _extended(traces[0], traces[1], places, repeats.count - first)
    return _step_from_trace(extended, figures[0] + (repeats.count - first) * (figures[1] - figures[0]))


def _trace(step):
    """(labels, bytes) of every moment of a run step, in order: each check of memory.py and each allocation
    of the meta device.

    bytes: one row a moment, seven columns: a check's bytes by category
    (memory.CATEGORIES), then an allocation's live bytes on the meta device
    (the other columns 0). labels: what made the moment: ("check", the last
    event (op, phase, kind) and the array checked (bytes, category)) or
    ("allocation", the last check's label, the array's bytes). The labels
    let two runs be matched moment by moment (_extended).
    """
    doing, allocations, sizes, _ = step.trace
    checks = numpy.array(step.points, dtype=numpy.int64).T  # (checks, categories)
    scratch = numpy.array(step.scratch_points, dtype=numpy.int64)
    allocations = numpy.array(allocations, dtype=numpy.int64)  # allocations before each check
    at_check = numpy.arange(len(checks)) + allocations  # where each check goes among all the moments
    before = numpy.searchsorted(allocations, numpy.arange(len(scratch)), side="right")  # checks before each allocation
    at_allocation = numpy.arange(len(scratch)) + before
    values = numpy.zeros((len(checks) + len(scratch), len(memory.CATEGORIES) + 1), dtype=numpy.int64)
    values[at_check, :-1] = checks
    values[at_allocation, -1] = scratch
    labels = [None] * len(values)
    for i, where in enumerate(at_check.tolist()):
        labels[where] = ("check", doing[i])
    for i, where in enumerate(at_allocation.tolist()):
        labels[where] = ("allocation", doing[before[i] - 1], sizes[i])
    return labels, values


def _places(small, larger):
    """Where the trace (_trace) `larger`, of one unit more than `small`, has moments that `small` has
    not: [(place in `small`, length of one copy)], or None if these are not copies in runs of copies.

    The two are walked side by side while their labels agree. Where they
    part, `larger` has one more copy of a unit's moments (a block's forward,
    its backward, its gradients' accumulation, its parameters' update) at the
    end of a run of copies: the shortest stretch that repeats what `small`
    has just had and after which the two agree again (for LOOK_AHEAD
    moments). Each is then moved to a boundary between two whole copies of
    its run (_place).
    """
    (a, va), (b, _) = small, larger
    places, i, j = [], 0, 0
    while j < len(b):
        if i < len(a) and a[i] == b[j]:
            i, j = i + 1, j + 1
            continue
        size = next((r for r in range(1, i + 1)
                     if b[j:j + r] == a[i - r:i] and b[j + r:j + r + LOOK_AHEAD] == a[i:i + LOOK_AHEAD]), None)
        if size is None:
            return None
        low = high = i  # the places where the same copy could go: the run of copies around i
        while low > 0 and a[low - 1] == b[j + (low - 1 - i) % size]:
            low -= 1
        while high < len(a) and a[high] == b[j + (high - i) % size]:
            high += 1
        place = _place(va, low, high, size)
        if place is None:
            return None
        places.append((place, size))
        j += size
    places.sort()
    if i != len(a) or any(p + s > q - t for (p, s), (q, t) in zip(places, places[1:])):  # copies overlap
        return None
    return places


LOOK_AHEAD = 16  # moments after a copy that must agree again (a wrong match fails the check run, not the step)


def _extended(small, larger, places, more):
    """The trace (_trace) of the step with `more` units beyond `small`'s (-1: one fewer), from `small`'s and
    `larger`'s (one unit more), whose copies go at `places` (_places).

    With `more` copies at each place (or, for -1, the copy before each place
    left out):
      * a moment of `small` changes by `more` times its change from `small`
        to `larger`, matched as counted from the start before the place and
        from the end after it (every byte is affine in the number of blocks:
        a block adds the same arrays);
      * copies inside a run are affine in their position, as the copies run
        step by step: copy e after the one before the place is that copy
        plus e times the step from it to the one after.
    All the copies are made, and the step's figures come from them as from a
    run (_step_from_trace); being affine in their position, only a run's
    first and last copies can be the highest.
    """
    if more < -1:
        raise ValueError(f"more must be at least -1, got {more}")
    (a, va), (_, vb) = small, larger
    # Each moment's change from `small` to `larger`: moments before a place are matched as counted from the
    # start, after it as counted from the end.
    matched = numpy.arange(len(a))
    for place, size in places:
        matched[place:] += size
    change = vb[matched] - va
    labels, pieces, start = [], [], 0
    for place, size in places:
        kept = place if more >= 0 else place - size  # one unit fewer: the copy before the place goes
        labels += a[start:kept]
        pieces.append(va[start:kept] + more * change[start:kept])
        before = va[place - size:place] + more * change[place - size:place]
        step = va[place:place + size] - va[place - size:place]
        for e in range(1, more + 1):
            labels += a[place - size:place]
            pieces.append(before + e * step)
        start = place
    labels += a[start:]
    pieces.append(va[start:] + more * change[start:])
    return labels, numpy.concatenate(pieces)


def _place(values, low, high, size):
    """Where, in a run of copies values[low:high] (as far as their labels go), one more copy goes: between
    two whole copies, and next to a third in step with them (the run's first or last copy, or the parts
    the labels let into the run, may differ: the first block's input is the embedding's output); None if
    the run has no two whole copies."""
    places = range(low + size, high - size + 1, size)
    copy = lambda k: values[low + k * size:low + (k + 1) * size]  # noqa: E731
    for k, place in enumerate(places, start=1):
        for a, b, c in ((k - 2, k - 1, k), (k - 1, k, k + 1)):
            if a >= 0 and low + (c + 1) * size <= high and numpy.array_equal(copy(b) - copy(a), copy(c) - copy(b)):
                return place
    return places[len(places) // 2] if places else None


def _step_from_trace(trace, figures):
    """The StepMemory of a trace (_trace), with the step's other figures: [the meta device's live bytes at
    the start, constant_bytes, recomputed_flops, start by category]: as estimate_step reads them from a run."""
    labels, values = trace
    is_check = numpy.array([label[0] == "check" for label in labels])
    checks, scratch = values[is_check, :-1], values[~is_check, -1]
    live_at_start, constant, flops, *start = (int(x) for x in figures)
    totals = checks.sum(axis=1)
    first = int(totals.argmax())  # memory.py keeps the first of equal peaks
    device = max(live_at_start, int(scratch.max()) if len(scratch) else 0) + constant
    return StepMemory(int(totals[first]), dict(zip(memory.CATEGORIES, map(int, checks[first]))),
                      dict(zip(memory.CATEGORIES, map(int, checks.max(axis=0)))),
                      dict(zip(memory.CATEGORIES, start)), device, constant, flops,
                      [checks[:, c] for c in range(checks.shape[1])], scratch)


def _dtype(name):
    """A NumPy dtype from its name; bfloat16 from ml_dtypes, as autocast gets it (ValueError without it)."""
    if name != "bfloat16":
        return numpy.dtype(name)
    try:
        return autocast.bfloat16()
    except ImportError as e:  # the command line reports a ValueError as a one-line error
        raise ValueError(str(e)) from None


class StepProfile:
    """One step's memory at every micro-batch size, from the step run at two sizes.

    Every array of a GPT's step is a + b * batch bytes (activations grow with
    the batch; parameters, the causal mask and scalars do not), and the step
    makes the same arrays in the same order at every batch size on a GPU, so
    the bytes at each check are affine in the batch: two runs, at `batch` and
    batch + 1, give them all, exactly (tests/test_fit.py compares with running
    each size). A micro-batch of 1 can make views where larger ones copy (an
    axis of 1 merges with anything): then the runs are at 2 and 3, and `below`
    holds the run at 1. `at(b)` is the step at b; `largest_batch(limit)` the
    largest micro-batch whose peak fits.
    """

    def __init__(self, one, two, batch=1, below=None):
        if len(one.scratch_points) != len(two.scratch_points) or len(one.points[0]) != len(two.points[0]):
            raise ValueError(f"the step makes different arrays at micro-batches {batch} and {batch + 1}")
        p1, p2 = numpy.array(one.points, dtype=numpy.int64).T, numpy.array(two.points, dtype=numpy.int64).T
        s1, s2 = numpy.array(one.scratch_points, dtype=numpy.int64), numpy.array(two.scratch_points, dtype=numpy.int64)
        affine = lambda x1, x2: (x1 - batch * (x2 - x1), x2 - x1)  # noqa: E731 (at batch 0, and per example)
        a, k = affine(p1, p2)
        # A check that another beats at every batch size can never be a peak: only the others are kept
        # (the first of equal ones), in order, for the totals and for each category.
        keep = _front(a.sum(axis=1), k.sum(axis=1))
        for c in range(a.shape[1]):
            keep |= _front(a[:, c], k[:, c])
        self._points = (a[keep], k[keep])
        a, k = affine(s1, s2)
        keep = _front(a, k)
        self._scratch = (a[keep], k[keep])
        self._constant = affine(one.constant_bytes, two.constant_bytes)
        self._flops = affine(one.recomputed_flops, two.recomputed_flops)
        self.start, self.batch, self.below = one.start, batch, dict(below or {})

    def at(self, batch_size):
        """The StepMemory of a micro-batch of batch_size examples."""
        if batch_size in self.below:
            return self.below[batch_size]
        points = self._points[0] + self._points[1] * batch_size
        totals = points.sum(axis=1)
        first = int(totals.argmax())  # memory.py keeps the first of equal peaks
        constant = int(self._constant[0] + self._constant[1] * batch_size)
        scratch = self._scratch[0] + self._scratch[1] * batch_size
        device = max(int(totals[first]), int(scratch.max()) if len(scratch) else 0) + constant
        split = dict(zip(memory.CATEGORIES, map(int, points[first])))
        highest = dict(zip(memory.CATEGORIES, map(int, points.max(axis=0))))
        flops = int(self._flops[0] + self._flops[1] * batch_size)
        return StepMemory(int(totals[first]), split, highest, dict(self.start), device, constant, flops)

    def largest_batch(self, limit, device=True):
        """The largest micro-batch whose peak is at most `limit` bytes (0 if not even 1 fits).

        device: judge by the device peak (StepMemory.device_peak_bytes), else
        by memory.py's peak.
        """
        c0, c1 = self._constant if device else (0, 0)
        a, k = (self._scratch if device else (self._points[0].sum(axis=1), self._points[1].sum(axis=1)))
        a, k = a + c0, k + c1
        grow = k > 0
        if (a[~grow] + k[~grow] * self.batch > limit).any() or (a + k * self.batch > limit).any():
            most = 0  # not even `batch` fits
        else:
            most = int(((limit - a[grow]) // k[grow]).min()) if grow.any() else 1 << 40
        if most < self.batch:  # the sizes run apart
            peak = (lambda s: s.device_peak_bytes) if device else (lambda s: s.peak_bytes)  # noqa: E731
            most = max([b for b, step in self.below.items() if peak(step) <= limit], default=0)
        return most


def _front(a, k):
    """The lines a + k * batch (batch >= 1) that may be the highest at some batch: a boolean mask.

    A line is left out if another is higher at batch 1 and rises at least as
    fast, or is as high at batch 1, rises at least as fast and comes first
    (memory.py keeps the first of equal peaks).
    """
    order = numpy.lexsort((numpy.arange(len(a)), -(a + k)))  # highest at batch 1 first; in order among equals
    steep = k[order]
    before = numpy.maximum.accumulate(numpy.concatenate(([numpy.iinfo(numpy.int64).min], steep[:-1])))
    keep = numpy.zeros(len(a), dtype=bool)
    keep[order[steep > before]] = True  # steeper than every line before it in that order
    return keep


def profile_gpt(config, seq_len, **kwargs):
    """The step at every micro-batch on a GPU: a StepProfile (kwargs as gpt_step's, without batch_size and device).

    Not for the CPU, where GELU and the cross-entropy work in pieces of a fixed
    size: there the step is not affine in the batch; run gpt_step at each size.
    """
    return _kept(_PROFILES, (repr(config), seq_len, repr(sorted(kwargs.items()))), lambda: _profile(config, seq_len, kwargs))


def _profile(config, seq_len, kwargs):
    step = {**dict(dtype="float32", checkpointing=None, accumulation_dtype=None, optim="adamw", device="cuda",
                   autocast=None), **kwargs}
    run = lambda b: _gpt_step(config, b, seq_len, **step)  # noqa: E731 (with every moment's bytes)
    one, two = run(1), run(2)
    try:
        return StepProfile(one, two)
    except ValueError:  # 1 is not like the others (see StepProfile)
        return StepProfile(two, run(3), batch=2, below={1: dataclasses.replace(one, points=None, scratch_points=None,
                                                                                trace=None)})


# -- FLOPs ---------------------------------------------------------------------------------
def _sublayer_ops(config, B, T):
    """(op, input shapes, output shapes) per op of each half block, as the GPT runs them forward."""
    C, nh = config.n_embd, config.n_head
    hs, x, drop, bias = C // nh, (B, T, C), config.dropout > 0, config.bias

    def linear(n_in, n_out):
        return ("Linear", [(B, T, n_in), (n_out, n_in)] + ([(n_out,)] if bias else []), [(B, T, n_out)])

    scores = (B, nh, T, T)
    attention = [("LayerNorm", [x, (C,), (C,)], [x]), linear(C, 3 * C),
                 ("MatMul", [(B, nh, T, hs), (B, nh, hs, T)], [scores]), ("Mul", [scores, ()], [scores]),
                 ("Where", [(), scores], [scores]), ("Softmax", [scores], [scores])]
    attention += [("Dropout", [scores], [scores])] if drop else []
    attention += [("MatMul", [scores, (B, nh, T, hs)], [(B, nh, T, hs)]), linear(C, C)]
    attention += [("Dropout", [x], [x])] if drop else []
    attention += [("Add", [x, x], [x])]
    feed_forward = [("LayerNorm", [x, (C,), (C,)], [x]), linear(C, 4 * C), ("GELU", [(B, T, 4 * C)], [(B, T, 4 * C)]),
                    linear(4 * C, C)] + ([("Dropout", [x], [x])] if drop else []) + [("Add", [x, x], [x])]
    return attention, feed_forward


def step_flops(config, batch_size, seq_len):
    """(forward FLOPs of one micro-batch, forward FLOPs of each half block: [attention, feed-forward]).

    Counted with ops/flops.py's op_flops on the shapes each op sees, as the
    bench counts a measured step's timeline; the backward is about twice the
    forward. (What a checkpointed step recomputes is counted as the step
    runs: StepMemory.recomputed_flops.)
    """
    B, T, C, V = batch_size, seq_len, config.n_embd, config.vocab_size
    x = (B, T, C)
    halves = [sum(op_flops(op, i, o) for op, i, o in ops) for ops in _sublayer_ops(config, B, T)]
    embed = op_flops("Add", [x, (T, C)], [x]) + (op_flops("Dropout", [x], [x]) if config.dropout > 0 else 0)
    head = (op_flops("LayerNorm", [x, (C,), (C,)], [x]) + op_flops("Linear", [x, (V, C)], [(B, T, V)])
            + op_flops("CrossEntropy", [(B * T, V)], [()]))
    forward = embed + config.n_layer * sum(halves) + head
    return forward, halves


# -- the rows ------------------------------------------------------------------------------
@dataclass
class StrategyFit:
    """One way of checkpointing, at the largest micro-batch that fits (or at 1, if none does)."""

    key: str
    label: str
    checkpointing: dict  # GPT.gradient_checkpointing_enable's arguments; None: off
    largest_micro_batch: int  # 0: not even one example fits
    micro_batch: int  # the micro-batch used: the largest that divides the batch per process and fits; 0: none
    accumulation_steps: int  # per process; 0 if it does not fit
    memory: StepMemory  # at micro_batch (at 1 if it does not fit)
    recompute_ratio: float  # (3F + recomputed FLOPs) / 3F: the time a step takes, relative
    plan: Plan = None  # the planner's plan, for its row

    @property
    def fits(self):
        return self.micro_batch > 0


@dataclass
class Recommendation:
    """What to do, in the guide's terms, and the TrainingArguments line that does it."""

    verdict: str  # one of VERDICTS
    strategy: StrategyFit  # the row it rests on (None if nothing fits)
    training_arguments: str  # None if nothing fits
    reason: str
    shortfall_bytes: int = 0  # for "does not fit": the least any strategy needs beyond the memory


@dataclass
class TrainingPlan:
    """plan_training's answer: the inputs, a StrategyFit per strategy, the recommendation."""

    config: GPTConfig
    model_name: str
    seq_len: int
    effective_batch_size: int
    processes: int
    memory_bytes: int
    memory_label: str
    usable_bytes: int
    precision: Precision
    parameters: int
    rows: list = field(default_factory=list)
    recommendation: Recommendation = None

    @property
    def batch_per_process(self):
        return self.effective_batch_size // self.processes

    def row(self, key):
        return next(r for r in self.rows if r.key == key)

    def __str__(self):
        return render(self)


def plan_training(model="gpt2", seq_len=None, effective_batch_size=8, device_memory="a100-80gb", dtype="float32",
                  mixed_precision=None, processes=1, reserve_bytes=None, nested_plans=False,
                  planner_layers=24):
    """Will a GPT training step fit, with which technique? A TrainingPlan (print it for the table).

    model: a GPTConfig, a GPT-2 preset ("gpt2", "gpt2-medium", "gpt2-large",
    "gpt2-xl") or a dict of GPTConfig's fields. seq_len: tokens per example
    (default the model's block_size). effective_batch_size: examples per
    optimizer step, over all processes (= micro-batch x accumulation steps x
    processes). device_memory: a GPU preset (GPUS), bytes (an int), or a size
    with its unit such as "24GiB" (a bare number as text is refused). dtype,
    mixed_precision: see the module docstring. processes: data-parallel
    processes, each holding the whole model (distributed.py).
    reserve_bytes: memory to keep free (CUDA context, allocator); default
    DEFAULT_RESERVE (0.5 GiB) for a GPU preset, 0 for a size given. nested_plans: let
    the planner recompute some blocks more than once (slower to plan and to
    run). planner_layers: the planner may cut the chain every
    ceil(n_layer / planner_layers) blocks (every block up to 24 blocks, every
    second for GPT-2 XL's 48): schedules.plan_checkpoints' search grows
    quickly with the number of places it may cut.

    Raises ValueError naming the field for bad input.
    """
    name = model if isinstance(model, str) else "custom GPT"
    config = model_config(model)
    seq_len = config.block_size if seq_len is None else seq_len
    _positive_int("seq_len", seq_len)
    if seq_len > config.block_size:
        raise ValueError(f"seq_len ({seq_len}) is longer than the position table (block_size {config.block_size})")
    _positive_int("effective_batch_size", effective_batch_size)
    _positive_int("processes", processes)
    if effective_batch_size % processes:
        raise ValueError(f"effective_batch_size ({effective_batch_size}) must be a multiple of processes "
                         f"({processes}): "
                         "each process takes the same share")
    _positive_int("planner_layers", planner_layers)
    memory_bytes, label = device_memory_bytes(device_memory)
    if reserve_bytes is None:  # a GPU preset: its CUDA context; a size given: taken as what the process can have
        preset = isinstance(device_memory, str) and device_memory.strip().lower() in GPUS
        reserve_bytes = DEFAULT_RESERVE if preset else 0
    if isinstance(reserve_bytes, bool) or not isinstance(reserve_bytes, int) or not 0 <= reserve_bytes < memory_bytes:
        raise ValueError(f"reserve_bytes must be an integer from 0 to below the device memory ({memory_bytes}), "
                         f"got {reserve_bytes!r}")
    prec = precision(dtype, mixed_precision)
    parameters = sum(p.data.size for p in GPT(config, device="meta").parameters())
    plan = TrainingPlan(config, name, seq_len, effective_batch_size, processes, memory_bytes, label,
                        memory_bytes - reserve_bytes, prec, parameters)
    run = dict(dtype=prec.dtype, autocast=prec.autocast)
    forward, halves = step_flops(config, 1, seq_len)
    profiles = {}
    for key, label_, checkpointing in STRATEGIES:
        profiles[key] = profile_gpt(config, seq_len, checkpointing=checkpointing, **run)
        recomputed = profiles[key].at(1).recomputed_flops  # what its recomputes run, per example
        plan.rows.append(_row(plan, key, label_, checkpointing, profiles[key], 1 + recomputed / (3 * forward)))
    plan.rows.append(_planner_row(plan, run, forward, halves, nested_plans, planner_layers, profiles["every"]))
    plan.recommendation = recommend(plan)
    return plan


def _row(plan, key, label, checkpointing, profile, ratio, plan_=None):
    largest = profile.largest_batch(plan.usable_bytes)
    micro = _largest_divisor(plan.batch_per_process, largest)
    return StrategyFit(key, label, checkpointing, min(largest, 1 << 40), micro,
                       plan.batch_per_process // micro if micro else 0, profile.at(micro or 1), ratio, plan_)


def _largest_divisor(n, most):
    """The largest divisor of n that is at most `most` (0 if most < 1)."""
    return max((d for d in range(1, min(n, most) + 1) if n % d == 0), default=0)


# -- the planner at the device's budget ----------------------------------------------------------
def _planner_row(plan, run, forward, halves, nested, planner_layers, every):
    """The plan that recomputes least within the device's memory, at the largest micro-batch one fits.

    The planner (schedules.plan_checkpoints) plans saved activations from
    their formulas (activations.py). It is given the device's memory less the
    rest of the step (parameters, gradients, optimizer state, buffers, what
    is in flight) as the every-block step holds it; the plan it returns is
    run, and if the whole step does not fit, its budget shrinks by the excess
    and it plans again. Its largest micro-batch is the one its least-memory
    plan fits. Every block is a plan too: measured by the same run, the row
    is the better of the two (a larger micro-batch, else less recompute, else
    less memory), so "every block" never beats it on every count.
    """
    return _better_than_every(plan, _planned(plan, run, forward, halves, nested, planner_layers, every))


def _planned(plan, run, forward, halves, nested, planner_layers, every):
    """The planner's own row (see _planner_row)."""
    config, T, f = plan.config, plan.seq_len, plan.precision.itemsize
    L = config.n_layer
    group = math.ceil(L / planner_layers)
    label = PLANNER if group == 1 else (PLANNER[0], f"{PLANNER[1]}, cuts every {group} blocks")
    none = plan.row("none")

    def costs_at(b):
        inputs, held = activations.gpt_chain(L, T, b, config.n_embd, config.n_head, config.dropout > 0, itemsize=f)
        flops = sum(halves) * b
        costs = []
        for start in range(0, L, group):
            stop = min(start + group, L)
            costs.append(LayerCost(f"blocks {start}:{stop}", inputs[start], sum(held[start:stop]) - inputs[start], True,
                                   inputs[start], (stop - start) * flops, (stop - start) * flops))
        after = activations.gpt_head(T, b, config.n_embd, config.vocab_size, f)
        return costs, after

    def expand(segments):  # a plan over groups of blocks -> over blocks
        out = []
        for a, b, how in segments:
            out.append((a * group, min(b * group, L), expand(how) if isinstance(how, list) else how))
        return out

    # The least-memory plan, and the largest micro-batch it fits.
    costs1, after1 = costs_at(1)
    least = plan_checkpoints(costs1, minimum_budget(costs1, nested, after1), nested, after1)
    least_segments = expand(least.segments)
    profile = profile_gpt(config, T, checkpointing=dict(segments=least_segments), **run)
    largest = max(profile.largest_batch(plan.usable_bytes), none.largest_micro_batch)
    per = plan.batch_per_process
    for plan_b in sorted((d for d in range(1, min(per, largest) + 1) if per % d == 0), reverse=True):
        if none.largest_micro_batch >= plan_b:  # nothing to checkpoint: the planner stores every block
            stored = Plan([(0, L, False)], 0, 0.0)
            return _fixed(plan, label, None, none.memory if none.micro_batch == plan_b else
                          gpt_step(config, plan_b, T, **run), largest, plan_b, 1.0, stored)
        costs, after = costs_at(plan_b)
        at = every.at(plan_b)
        budget = plan.usable_bytes - (at.device_peak_bytes - at.highest["activations"])
        for _ in range(4):
            try:
                found = plan_checkpoints(costs, budget, nested, after)
            except ValueError:
                break
            segments = expand(found.segments)
            memory = gpt_step(config, plan_b, T, checkpointing=dict(segments=segments), **run)
            excess = memory.device_peak_bytes - plan.usable_bytes
            if excess <= 0:
                found = Plan(segments, found.peak_bytes, found.recompute_seconds)
                ratio = 1 + memory.recomputed_flops / (3 * forward * plan_b)
                return _fixed(plan, label, dict(segments=segments), memory, largest, plan_b, ratio, found)
            budget -= excess
    at_one = profile.at(1)
    return _fixed(plan, label, dict(segments=least_segments), at_one, largest, 0,
                  1 + at_one.recomputed_flops / (3 * forward), Plan(least_segments, least.peak_bytes,
                                                                    least.recompute_seconds))


def _better_than_every(plan, row):
    """The planner's row, or every block's plan under the planner's name where that is better:
    a larger micro-batch, else the same and less recompute, else the same and less memory."""
    every = plan.row("every")
    rank = lambda r: (r.micro_batch, r.largest_micro_batch, -r.recompute_ratio, -r.memory.device_peak_bytes)  # noqa: E731
    if rank(every) <= rank(row):
        return row
    segments = [(i, i + 1, True) for i in range(plan.config.n_layer)]
    # Its label must not say "cuts every 2 blocks" above a plan that cuts at every block.
    return StrategyFit(row.key, f"{PLANNER[1]}: every block", every.checkpointing, every.largest_micro_batch,
                       every.micro_batch, every.accumulation_steps, every.memory, every.recompute_ratio, Plan(segments, 0, 0.0))


def _fixed(plan, key_label, checkpointing, memory, largest, micro, ratio, plan_):
    key, label = key_label
    return StrategyFit(key, label, checkpointing, largest, micro, plan.batch_per_process // micro if micro else 0,
                       memory, ratio, plan_)


# -- the recommendation --------------------------------------------------------------------------
def recommend(plan):
    """The guide's answer for this plan's rows (see the module docstring for the guide).

    The preferred batch fits without any technique: nothing to do ("if the
    preferred batch size fits into memory, there's no reason to apply
    memory-optimizing techniques because they can slow down the training").
    Else, if some micro-batch fits without checkpointing: gradient
    accumulation, at the largest micro-batch that fits (the guide: keep the
    micro-batch as large as fits, and accumulate the rest). Else gradient
    checkpointing ("some large models may still face memory issues even when
    the batch size is set to 1 and gradient accumulation is used"): the
    strategy that recomputes least among those that fit the whole batch
    per process, or, if none does, among those that fit some micro-batch,
    with accumulation too. Else it does not fit, short by the least any
    strategy needs at a micro-batch of 1, beyond the usable memory.
    """
    per, none = plan.batch_per_process, plan.row("none")
    checkpointed = [r for r in plan.rows if r.key != "none" and r.fits]
    if none.micro_batch == per:
        return Recommendation(VERDICTS[0], none, _arguments(plan, none),
                              f"the batch of {per} per process fits without accumulation or checkpointing")
    if none.fits:
        return Recommendation(VERDICTS[1], none, _arguments(plan, none),
                              f"at most {_examples(none.largest_micro_batch)} at once; {none.accumulation_steps} "
                              f"micro-batches of {none.micro_batch} make the batch of {per} per process")
    whole = [r for r in checkpointed if r.micro_batch == per]
    if whole:
        best = min(whole, key=lambda r: (r.recompute_ratio, -r.micro_batch))
        return Recommendation(VERDICTS[2], best, _arguments(plan, best),
                              f"not even one example fits without checkpointing; with {best.label} the batch of "
                              f"{per} per process fits, for {best.recompute_ratio - 1:+.0%} time")
    if checkpointed:
        best = min(checkpointed, key=lambda r: (r.recompute_ratio, -r.micro_batch))
        return Recommendation(VERDICTS[3], best, _arguments(plan, best),
                              f"not even one example fits without checkpointing; with {best.label} micro-batches "
                              f"of {best.micro_batch} fit, {best.accumulation_steps} of them make the batch of {per} "
                              f"per process, for {best.recompute_ratio - 1:+.0%} time")
    least = min(plan.rows, key=lambda r: r.memory.device_peak_bytes)
    short = least.memory.device_peak_bytes - plan.usable_bytes
    return Recommendation(VERDICTS[4], None, None,
                          f"even one example with {least.label} needs {_size(least.memory.device_peak_bytes)}, "
                          f"{_size(short)} more than the {_size(plan.usable_bytes)} usable", short)


def _examples(n):
    """'1 example fits', '3 examples fit'."""
    return "1 example fits" if n == 1 else f"{n} examples fit"


def _arguments(plan, row):
    """The TrainingArguments line (this engine's train.py) for a row at its micro-batch."""
    args = [f"per_device_train_batch_size={row.micro_batch}"]
    if row.accumulation_steps > 1:
        args.append(f"gradient_accumulation_steps={row.accumulation_steps}")
    if row.checkpointing is not None:
        args.append("gradient_checkpointing=True")
        kwargs = {k: v for k, v in row.checkpointing.items() if (k, v) != ("segments", "every")}
        if kwargs:
            args.append(f"gradient_checkpointing_kwargs={kwargs!r}")
    return f"TrainingArguments({', '.join(args)})"


# -- the table -------------------------------------------------------------------------------------
COLUMNS = ("parameters", "gradients", "accumulation", "optimizer", "activations", "other")


def _size(n):
    for unit, scale in (("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _plan_text(segments, n_layer):
    """A plan in words: 'every block checkpointed', or its segments ('[0:8]* [8:10]', * = checkpointed) with
    a run of three or more alike ones written as its first and last and a count, so that a 48-block plan
    stays one short line."""
    if list(segments) == [(i, i + 1, True) for i in range(n_layer)]:
        return f"every block checkpointed, each of the {n_layer} a segment of its own (as the 'every block' row)"
    parts, k = [], 0
    while k < len(segments):
        a, b, how = segments[k]
        run = 1
        while (k + run < len(segments) and not isinstance(how, list) and segments[k + run][2] == how
               and segments[k + run][1] - segments[k + run][0] == b - a):
            run += 1
        if run >= 3:
            size = "1 block" if b - a == 1 else f"{b - a} blocks"
            parts.append(f"{describe(segments[k:k + 1])} ... {describe(segments[k + run - 1:k + run])} "
                         f"({run} segments of {size})")
        else:
            parts.append(describe(segments[k:k + run]))
        k += run
    return " ".join(parts) + " (blocks; * = checkpointed)"


def render(plan):
    """The plan as text: what was asked, a table of the strategies, the recommendation."""
    c, prec = plan.config, plan.precision
    unit, scale = ("GiB", GiB) if plan.memory_bytes >= 4 * GiB else ("MiB", 1 << 20)
    lines = [
        f"Will it fit? {plan.model_name}: {c.n_layer} blocks, width {c.n_embd}, {c.n_head} heads, vocabulary "
        f"{c.vocab_size}, {plan.parameters / 1e6:.0f}M parameters; sequence {plan.seq_len}",
        f"  on {plan.memory_label} ({_size(plan.usable_bytes)} usable), {prec.description}",
        f"  effective batch {plan.effective_batch_size} = {plan.batch_per_process} per process x {plan.processes} "
        f"process{'es' if plan.processes > 1 else ''}",
        "",
        f"Peak of one training step at the micro-batch used ({unit}; by category as memory.py counts it, "
        "'device' adds each op's scratch arrays):",
        "",
    ]
    head = ["strategy", "largest", "micro x steps", "peak", "device"] + list(COLUMNS) + ["time"]
    rows = []
    for r in plan.rows:
        m = r.memory
        largest = "none" if not r.largest_micro_batch else (
            f"{r.largest_micro_batch:,}" if r.largest_micro_batch < 1 << 40 else "any")
        micro = f"{r.micro_batch} x {r.accumulation_steps}" if r.fits else "does not fit"
        rows.append([r.label, largest, micro, f"{m.peak_bytes / scale:.2f}", f"{m.device_peak_bytes / scale:.2f}"]
                    + [f"{m.at_peak[k] / scale:.2f}" for k in COLUMNS] + [f"{r.recompute_ratio - 1:+.0%}"])
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    for cells in [head] + rows:
        lines.append("  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(cells, widths))))
    planner = plan.row("planner")
    if planner.plan is not None and planner.checkpointing is not None:
        lines += ["", f"planner's plan: {_plan_text(planner.plan.segments, c.n_layer)}"]
    rec = plan.recommendation
    lines += ["", f"Recommendation: {rec.verdict} ({rec.reason})."]
    if rec.training_arguments:
        under = f", under mpiexec -n {plan.processes}" if plan.processes > 1 else ""
        lines.append(f"  {rec.training_arguments}{under}")
    lines += ["", "largest: the largest micro-batch that fits in the usable memory with that strategy ('none': not "
              "even one example); micro x steps: the micro-batch used, the largest that divides the batch per process "
              "and fits, x the gradient accumulation steps.",
              "planner at the budget: schedules.plan_checkpoints, given as its budget for saved activations the usable "
              "memory less the rest of the step (parameters, gradients, buffers, optimizer state): the plan that fits "
              "and recomputes least"
              + ("; 'cuts every k blocks': it may cut only between groups of k blocks (--planner-layers)"
                 if "cuts every" in planner.label else "")
              + ("; ': every block': checkpointing every block measured better than the planner's own plans "
                 "(--planner-layers sets where those may cut)" if planner.label.endswith(": every block") else "")
              + ".",
              "time: a step's FLOPs with the recomputation over a step's without (about three forwards); "
              "peaks are memory.py's count of the step run on the meta device, exact for this engine "
              + "in every precision."]
    return "\n".join(lines)


# -- the command line: tinygrad-ckpt fit -------------------------------------------------------------
DESCRIPTION = """Will a GPT training step fit on a GPU, and with which technique? For no checkpointing,
every block, half blocks, sqrt(n), the selective policy and the planner: the peak of one
step by category, the largest micro-batch that fits, the accumulation steps for the
effective batch, the recompute time; then the recommendation and its TrainingArguments.

  tinygrad-ckpt fit --model gpt2-xl --memory a100-80gb --effective-batch-size 512 --processes 8
  tinygrad-ckpt fit --model gpt2 --n-layer 24 --memory 24GiB --seq-len 512
  tinygrad-ckpt fit --model gpt2-large --memory t4 --dtype bfloat16 --mixed-precision

GPUs: """ + ", ".join(GPUS) + """ (the total CUDA reports for each, less 0.5 GiB for the CUDA
context: see --reserve)."""

# The flag that sets each plan_training argument or GPTConfig field, for error messages.
FLAGS = {"seq_len": "--seq-len", "effective_batch_size": "--effective-batch-size", "processes": "--processes",
         "reserve_bytes": "--reserve", "dtype": "--dtype", "mixed_precision": "--mixed-precision",
         "planner_layers": "--planner-layers", "block_size": "--block-size", "vocab_size": "--vocab-size",
         "n_layer": "--n-layer", "n_head": "--n-head", "n_embd": "--n-embd", "dropout": "--dropout",
         "device memory": "--memory", "model preset": "--model"}
MODEL_FLAGS = ("n_layer", "n_head", "n_embd", "vocab_size", "block_size", "dropout")  # GPTConfig fields with a flag


def add_arguments(parser):
    model = parser.add_argument_group("model (a GPT-2 size, and any field changed)")
    model.add_argument("--model", default="gpt2", metavar="PRESET",
                       help=f"{', '.join(GPT2)} (default: %(default)s)")
    for name in MODEL_FLAGS[:-1]:
        model.add_argument(FLAGS[name], type=int, default=None, dest=name, help=f"{name} (default: the preset's)")
    model.add_argument("--dropout", type=float, default=None, help="dropout probability (default: the preset's, 0.1)")
    model.add_argument("--no-bias", action="store_true", help="no biases in Linear and LayerNorm layers")
    model.add_argument("--no-tie-weights", action="store_true", help="lm_head its own matrix, not the token embedding")
    run = parser.add_argument_group("training")
    run.add_argument("--seq-len", type=int, default=None, help="tokens per example (default: the block size)")
    run.add_argument("--effective-batch-size", type=int, default=8,
                     help="examples per optimizer step, all processes together (default: %(default)s)")
    run.add_argument("--processes", type=int, default=1,
                     help="data-parallel processes, one per GPU (default: %(default)s)")
    run.add_argument("--dtype", default="float32", help="float32, float64, float16 or bfloat16 (default: %(default)s)")
    run.add_argument("--mixed-precision", action=argparse.BooleanOptionalAction, default=None,
                     help="for float16/bfloat16, required: float32 master weights and AdamW moments "
                          "(--mixed-precision: float32 parameters and state, autocast's 16-bit ops) or a 16-bit model "
                          "(--no-mixed-precision)")
    hw = parser.add_argument_group("device")
    hw.add_argument("--memory", default="a100-80gb",
                    help="a GPU (" + ", ".join(GPUS) + "), or a size with its unit: 24GiB, 16GB, 17179869184B "
                         "(default: %(default)s)")
    hw.add_argument("--reserve", default=None, metavar="SIZE",
                    help="memory to keep free: the CUDA context, the allocator's overheads (default: 0.5 GiB for a "
                         "GPU preset, 0 for a size)")
    plan = parser.add_argument_group("planner")
    plan.add_argument("--nested-plans", action="store_true",
                      help="let the planner recompute some blocks more than once")
    plan.add_argument("--planner-layers", type=int, default=24,
                      help="the planner cuts every ceil(n_layer / this) blocks (default: %(default)s)")


def run(args):
    """tinygrad-ckpt fit: plan_training from the flags, printed."""
    try:
        if args.dtype in ("float16", "bfloat16") and args.mixed_precision is None:
            raise ValueError(f"--dtype {args.dtype}: add --mixed-precision (autocast: float32 parameters and "
                             "state, the forward's ops in 16-bit) or --no-mixed-precision (a 16-bit model)")
        if args.model not in GPT2:
            raise ValueError(f"unknown model preset {args.model!r}: use one of {', '.join(GPT2)}")
        fields = {name: getattr(args, name) for name in MODEL_FLAGS if getattr(args, name) is not None}
        fields.update({"bias": False} if args.no_bias else {})
        fields.update({"tie_weights": False} if args.no_tie_weights else {})
        model = args.model if not fields else {**GPT2[args.model].__dict__, **fields}
        reserve = None if args.reserve is None else 0
        if args.reserve is not None and args.reserve.strip() not in ("0", ""):
            if args.reserve.strip().lower() in GPUS:
                raise ValueError(f"--reserve {args.reserve!r}: give a size such as 2GiB, 500MB or 536870912B")
            try:
                reserve = device_memory_bytes(args.reserve)[0]
            except ValueError:
                raise ValueError(f"--reserve {args.reserve!r} is not a size with its unit, such as 2GiB, 500MB or "
                                 "536870912B") from None
        plan = plan_training(model, args.seq_len, args.effective_batch_size, args.memory, args.dtype,
                             args.mixed_precision, args.processes, reserve, args.nested_plans,
                             args.planner_layers)
    except ValueError as e:
        raise ValueError(_flag_names(str(e))) from None
    if not isinstance(args.model, str) or fields:
        plan.model_name = f"{args.model} with " + ", ".join(f"{k}={v}" for k, v in fields.items())
    print(plan)
    return 0


def _flag_names(message):
    """An error message with plan_training's argument and field names written as the flags that set them."""
    for name in sorted(FLAGS, key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){re.escape(name)}(?![\w])", FLAGS[name], message)
    return message
