"""Will it fit? A GPT training step's memory on a given GPU, and what to do about it.

    >>> plan = plan_training("gpt2-medium", effective_batch_size=32, device_memory="a10")
    >>> plan.recommendation.verdict
    'gradient accumulation'
    >>> plan.recommendation.training_arguments
    'TrainingArguments(per_device_train_batch_size=2, gradient_accumulation_steps=16)'
    >>> print(plan)                     # the table, and the recommendation  # doctest: +ELLIPSIS
    Will it fit? gpt2-medium: 24 blocks, width 1024, 16 heads, ...

For one GPT configuration (nn/transformer.py's GPTConfig, or a GPT-2 size by
name), a sequence length, an effective batch, a dtype, a device memory and a
number of data-parallel processes, `plan_training` answers, for each way of
checkpointing (none, every block, every block with half blocks, sqrt(n)
segments, the selective policy, the planner at the device's budget):

  * the peak of one training step by category (parameters, gradients,
    accumulation buffers, optimizer state, saved activations, and "other":
    what is in flight, a gradient travelling back, an output not saved yet),
    as memory.py would count it, from step_memory.py's walk of the step;
  * an upper bound of what the device must hold at that peak (the counted
    bytes plus each op's scratch arrays: step_memory.StepMemory.device_peak_bytes);
  * the largest micro-batch that fits, the micro-batch and accumulation steps
    that make the effective batch exactly, and the time the recomputation
    costs, as recomputed FLOPs over the step's (about three forwards);

and recommends, in the terms of Hugging Face's guide "Methods and tools for
efficient training on a single GPU" (transformers v4.39 docs,
docs/source/en/perf_train_gpu_one.md): no technique needed, gradient
accumulation, gradient checkpointing, both, or "does not fit even with both"
and by how much, with the TrainingArguments line that does it.

It allocates no array of the model's size: the walk works on sizes, and a
GPT-2 XL table takes a fraction of a second (benchmarks/fit_speed.py).

Device memory presets are nominal sizes, the memory each card is sold with
(NVIDIA's product pages quote GB: the H200's 141 GB), taken here as GiB
(2**30 bytes), which is more than CUDA reports: about 14.6 GiB on a 16 GB
T4 (PyTorch's out-of-memory message, "a total capacity of 14.56 GiB",
github.com/AlphaGPU/leetgpu-challenges/issues/52). A process can allocate
less still: the CUDA context takes some, and a caching allocator rounds
requests and keeps freed blocks. Pass reserve_bytes
for what your setup loses; benchmarks/gpu_check.sh measures it on a GPU.

dtypes: this engine runs float32 and float64, and for those the figures are
its own. float16 and bfloat16 are estimates of the same arrays at 2 bytes,
under an assumption the caller must state (mixed_precision):
  True   mixed precision: 16-bit parameters, gradients and activations;
         float32 master weights and AdamW moments (12 bytes per parameter);
         float32 accumulation buffers. The usual count, in Rajbhandari et
         al. 2020 (ZeRO) section 3.1, is 16 bytes per parameter (2 + 2 + 12);
         this engine's Trainer adds its accumulation buffers (4 more).
  False  every array 16-bit, AdamW's moments included (8 bytes per parameter
         with the buffers).

What does not live here: the walk of the step (step_memory.py), the
saved-activation formulas (activations.py), the planner (schedules.py), the
command line (cli.py).
"""

import argparse
import math
import re
from dataclasses import dataclass, field

from . import activations, step_memory
from .nn.transformer import GPTConfig
from .ops.flops import op_flops
from .schedules import LayerCost, Plan, describe, minimum_budget, plan_checkpoints

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
# Nominal memory (see the module docstring): name -> (what it is, GiB).
GPUS = {
    "t4": ("NVIDIA T4", 16),
    "v100-16gb": ("NVIDIA V100 16 GB", 16),
    "v100-32gb": ("NVIDIA V100 32 GB", 32),
    "a10": ("NVIDIA A10", 24),
    "l4": ("NVIDIA L4", 24),
    "rtx-3090": ("NVIDIA GeForce RTX 3090", 24),
    "rtx-4090": ("NVIDIA GeForce RTX 4090", 24),
    "a100-40gb": ("NVIDIA A100 40 GB", 40),
    "a100-80gb": ("NVIDIA A100 80 GB", 80),
    "h100-80gb": ("NVIDIA H100 80 GB", 80),
    "h200": ("NVIDIA H200", 141),
}

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
    """What the arrays of a step are made of, in bytes."""

    dtype: str
    itemsize: int  # activations, parameters and gradients, per element
    optimizer_bytes: int  # optimizer state per parameter
    accumulation_itemsize: int  # the accumulation buffers, per element
    runs_here: bool  # this engine runs it (float32, float64); else an estimate
    description: str


def precision(dtype="float32", mixed_precision=None):
    """The Precision of a dtype name; 16-bit ones need mixed_precision (True or False) said."""
    if dtype in ("float32", "float64"):
        if mixed_precision:
            raise ValueError(f"mixed_precision applies to float16 and bfloat16, not to dtype {dtype!r}")
        f = 4 if dtype == "float32" else 8
        return Precision(dtype, f, 2 * f, f, True, f"{dtype}, as this engine runs it")
    if dtype in ("float16", "bfloat16"):
        if mixed_precision is None:
            raise ValueError(
                f"dtype {dtype!r} is an estimate (this engine runs float32 and float64): say what it assumes with "
                "mixed_precision=True (16-bit parameters, gradients and activations, float32 master weights and AdamW "
                "moments) or mixed_precision=False (every array 16-bit)")
        if mixed_precision:
            return Precision(dtype, 2, 12, 4, False, f"{dtype} mixed precision (float32 master weights and AdamW "
                             "moments, float32 accumulation buffers): an estimate, this engine does not run 16-bit")
        return Precision(dtype, 2, 4, 2, False, f"pure {dtype} (every array 16-bit, AdamW moments too): an "
                         "estimate, this engine does not run 16-bit")
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
    """(bytes, label) from a GPU preset's name, a number of bytes, or a size such as '24GiB' or '16 GB'."""
    if isinstance(memory, str):
        key = memory.strip().lower()
        if key in GPUS:
            name, gib = GPUS[key]
            return gib * GiB, f"{name}, {gib} GB nominal, taken as {gib} GiB"
        number = key.rstrip("abcdefghijklmnopqrstuvwxyz ")
        unit = key[len(number):].strip() or "b"
        try:
            value = float(number) if unit in UNITS else None
        except ValueError:  # 'h300', 'a100': a GPU's name this table does not have
            value = None
        if value is None or not math.isfinite(value):
            raise ValueError(f"device memory {memory!r} is neither a GPU preset ({', '.join(GPUS)}) nor a size "
                             "such as 24GiB, 16GB or 17179869184")
        memory = int(value * UNITS[unit])
    if (isinstance(memory, bool) or not isinstance(memory, (int, float)) or not math.isfinite(memory)
            or memory <= 0):
        raise ValueError(f"device memory must be a positive size, got {memory!r}")
    memory = int(memory)
    return memory, _size(memory)


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


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
    forward. (What a checkpointed step recomputes is counted by step_memory's
    walk, which follows the recompute's plan op by op.)
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
    memory: step_memory.StepMemory  # at micro_batch (at 1 if it does not fit)
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
    device: str
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
                  mixed_precision=None, processes=1, reserve_bytes=0, device="cuda", nested_plans=False,
                  planner_layers=24):
    """Will a GPT training step fit, with which technique? A TrainingPlan (print it for the table).

    model: a GPTConfig, a GPT-2 preset ("gpt2", "gpt2-medium", "gpt2-large",
    "gpt2-xl") or a dict of GPTConfig's fields. seq_len: tokens per example
    (default the model's block_size). effective_batch_size: examples per
    optimizer step, over all processes (= micro-batch x accumulation steps x
    processes). device_memory: a GPU preset (GPUS), bytes, or a size such as
    "24GiB". dtype, mixed_precision: see the module docstring. processes:
    data-parallel processes, each holding the whole model (distributed.py).
    reserve_bytes: memory to keep free (CUDA context, allocator). device:
    "cuda" (CuPy) or "cpu" (NumPy), where the arrays live. nested_plans: let
    the planner recompute some blocks more than once (slower to plan and to
    walk). planner_layers: the planner may cut the chain every
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
    if isinstance(reserve_bytes, bool) or not isinstance(reserve_bytes, int) or not 0 <= reserve_bytes < memory_bytes:
        raise ValueError(f"reserve_bytes must be an integer from 0 to below the device memory ({memory_bytes}), "
                         f"got {reserve_bytes!r}")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    prec = precision(dtype, mixed_precision)
    parameters = sum(n for _, n in step_memory._parameters(config, 1))
    plan = TrainingPlan(config, name, seq_len, effective_batch_size, processes, memory_bytes, label,
                        memory_bytes - reserve_bytes, prec, device, parameters)
    walk = dict(itemsize=prec.itemsize, optimizer_bytes=prec.optimizer_bytes,
                accumulation_itemsize=prec.accumulation_itemsize, device=device)
    forward, halves = step_flops(config, 1, seq_len)
    profiles = {}
    for key, label_, checkpointing in STRATEGIES:
        profiles[key] = step_memory.profile_step(config, seq_len, **walk, **(checkpointing or {}))
        recomputed = profiles[key].at(1).recomputed_flops  # what its recomputes run, per example
        plan.rows.append(_row(plan, key, label_, checkpointing, profiles[key], 1 + recomputed / (3 * forward)))
    plan.rows.append(_planner_row(plan, walk, forward, halves, nested_plans, planner_layers, profiles["every"]))
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
def _planner_row(plan, walk, forward, halves, nested, planner_layers, every):
    """The plan that recomputes least within the device's memory, at the largest micro-batch one fits.

    The planner (schedules.plan_checkpoints) plans saved activations. It is
    given the device's memory less the rest of the step (parameters,
    gradients, optimizer state, buffers, what is in flight) as the every-block
    walk finds it; the plan it returns is walked, and if the whole step does
    not fit, its budget shrinks by the excess and it plans again. Its largest
    micro-batch is the one its least-memory plan fits.
    """
    config, T, f = plan.config, plan.seq_len, walk["itemsize"]
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
    profile = step_memory.profile_step(config, T, **walk, segments=least_segments)
    largest = max(profile.largest_batch(plan.usable_bytes), none.largest_micro_batch)
    per = plan.batch_per_process
    for plan_b in sorted((d for d in range(1, min(per, largest) + 1) if per % d == 0), reverse=True):
        if none.largest_micro_batch >= plan_b:  # nothing to checkpoint: the planner stores every block
            stored = Plan([(0, L, False)], 0, 0.0)
            return _fixed(plan, label, None, none.memory if none.micro_batch == plan_b else
                          step_memory.walk_step(config, plan_b, T, **walk), largest, plan_b, 1.0, stored)
        costs, after = costs_at(plan_b)
        at = every.at(plan_b)
        budget = plan.usable_bytes - (at.device_peak_bytes - at.highest["activations"])
        for _ in range(4):
            try:
                found = plan_checkpoints(costs, budget, nested, after)
            except ValueError:
                break
            segments = expand(found.segments)
            memory = step_memory.walk_step(config, plan_b, T, **walk, segments=segments)
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
        lines += ["", f"planner's plan (blocks; * = checkpointed): {describe(planner.plan.segments)}"]
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
              "and recomputes least.",
              "time: a step's FLOPs with the recomputation over a step's without (about three forwards); "
              "peaks are memory.py's count from the step_memory walk, exact for this engine "
              + ("(float32/float64)." if prec.runs_here else "at 2 bytes per element (an estimate).")]
    return "\n".join(lines)


# -- the command line: tinygrad-ckpt fit -------------------------------------------------------------
DESCRIPTION = """Will a GPT training step fit on a GPU, and with which technique? For no checkpointing,
every block, half blocks, sqrt(n), the selective policy and the planner: the peak of one
step by category, the largest micro-batch that fits, the accumulation steps for the
effective batch, the recompute time; then the recommendation and its TrainingArguments.

  tinygrad-ckpt fit --model gpt2-xl --memory a100-80gb --effective-batch-size 512 --processes 8
  tinygrad-ckpt fit --model gpt2 --n-layer 24 --memory 24GiB --seq-len 512
  tinygrad-ckpt fit --model gpt2-large --memory t4 --dtype bfloat16 --mixed-precision

GPUs: """ + ", ".join(GPUS) + """ (nominal sizes; see --reserve)."""

# The flag that sets each plan_training argument or GPTConfig field, for error messages.
FLAGS = {"seq_len": "--seq-len", "effective_batch_size": "--effective-batch-size", "processes": "--processes",
         "reserve_bytes": "--reserve", "device": "--device", "dtype": "--dtype", "mixed_precision": "--mixed-precision",
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
                          "(--mixed-precision) or every array 16-bit (--no-mixed-precision)")
    hw = parser.add_argument_group("device")
    hw.add_argument("--memory", default="a100-80gb",
                    help="a GPU (" + ", ".join(GPUS) + "), or a size: 24GiB, 16GB, bytes (default: %(default)s)")
    hw.add_argument("--reserve", default="0", metavar="SIZE",
                    help="memory to keep free: the CUDA context, the allocator's overheads (default: 0)")
    hw.add_argument("--device", default="cuda",
                    help="cuda (CuPy) or cpu (NumPy): where the arrays live (default: %(default)s)")
    plan = parser.add_argument_group("planner")
    plan.add_argument("--nested-plans", action="store_true",
                      help="let the planner recompute some blocks more than once")
    plan.add_argument("--planner-layers", type=int, default=24,
                      help="the planner cuts every ceil(n_layer / this) blocks (default: %(default)s)")


def run(args):
    """tinygrad-ckpt fit: plan_training from the flags, printed."""
    try:
        if args.dtype in ("float16", "bfloat16") and args.mixed_precision is None:
            raise ValueError(f"--dtype {args.dtype} is an estimate (this engine runs float32 and float64): add "
                             "--mixed-precision (float32 master weights and AdamW moments) or --no-mixed-precision "
                             "(every array 16-bit)")
        if args.model not in GPT2:
            raise ValueError(f"unknown model preset {args.model!r}: use one of {', '.join(GPT2)}")
        fields = {name: getattr(args, name) for name in MODEL_FLAGS if getattr(args, name) is not None}
        fields.update({"bias": False} if args.no_bias else {})
        fields.update({"tie_weights": False} if args.no_tie_weights else {})
        model = args.model if not fields else {**GPT2[args.model].__dict__, **fields}
        reserve = 0
        if args.reserve.strip() not in ("0", ""):
            if args.reserve.strip().lower() in GPUS:
                raise ValueError(f"--reserve {args.reserve!r}: give a size such as 2GiB, 500MB or bytes")
            try:
                reserve = device_memory_bytes(args.reserve)[0]
            except ValueError:
                raise ValueError(f"--reserve {args.reserve!r} is not a size such as 2GiB, 500MB or bytes") from None
        plan = plan_training(model, args.seq_len, args.effective_batch_size, args.memory, args.dtype,
                             args.mixed_precision, args.processes, reserve, args.device, args.nested_plans,
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
