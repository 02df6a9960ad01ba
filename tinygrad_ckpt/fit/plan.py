"""plan_training: for each way of checkpointing, the largest micro-batch that fits, the accumulation that
makes the effective batch, the time the recomputation costs; and the recommendation.

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
    costs, as recomputed FLOPs over the step's (about three forwards), both
    counted from the op events of the run;

and recommends, in the terms of Hugging Face's guide "Methods and tools for
efficient training on a single GPU" (transformers v4.39 docs,
docs/source/en/perf_train_gpu_one.md): no technique needed, gradient
accumulation, gradient checkpointing, both, or "does not fit even with both"
and by how much, with the TrainingArguments line that does it.
"""

import math
from dataclasses import dataclass, field

from .. import activations
from ..nn.transformer import GPT, GPTConfig
from ..schedules import LayerCost, Plan, minimum_budget, plan_checkpoints
from ..zero import STAGES as ZERO_STAGES
from . import progress
from .batch_sizes import profile_gpt
from .inputs import DEFAULT_RESERVE, GPUS, Precision, device_memory_bytes, format_size, model_config, positive_int, precision
from .step import StepMemory, gpt_step
from .table import render

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
    processes: int = None  # the processes its TrainingArguments run on (mpiexec -n), where not the plan's


@dataclass
class TrainingPlan:
    """plan_training's (and plan_kind's) answer: the inputs, a StrategyFit per strategy, the recommendation."""

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
    headline: str = None  # a model kind's (fit/kinds.py): what it is, in place of the GPT's config
    other_rows: list = field(default_factory=list)  # a kind's rows in the other precision: shown, not recommended from
    zero_stage: int = None  # plan_training's zero_stage: every row is one process's step of that stage (fit/sharded.py)
    stage_rows: list = field(default_factory=list)  # with zero_stage: the recommended strategy at each ZeRO stage

    @property
    def batch_per_process(self):
        return self.effective_batch_size // self.processes

    def row(self, key):
        return next(r for r in self.rows if r.key == key)

    def __str__(self):
        return render(self)


def plan_training(model="gpt2", seq_len=None, effective_batch_size=8, device_memory="a100-80gb", dtype="float32",
                  mixed_precision=None, processes=1, reserve_bytes=None, nested_plans=False,
                  planner_layers=24, zero_stage=None):
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
    quickly with the number of places it may cut. zero_stage: 0, 1, 2 or 3
    (zero.STAGES): every row is then one process's step of
    `processes` under that ZeRO stage (TrainingArguments.zero_stage), run on
    the meta device (fit/sharded.py); the plan adds a row per stage, and
    where nothing fits, the recommendation names the stage and the number
    of processes that make one example fit (see `zero_rescue`).

    Raises ValueError naming the field for bad input.
    """
    name = model if isinstance(model, str) else "custom GPT"
    config = model_config(model)
    seq_len = config.block_size if seq_len is None else seq_len
    positive_int("seq_len", seq_len)
    if seq_len > config.block_size:
        raise ValueError(f"seq_len ({seq_len}) is longer than the position table (block_size {config.block_size})")
    positive_int("effective_batch_size", effective_batch_size)
    positive_int("processes", processes)
    if effective_batch_size % processes:
        raise ValueError(f"effective_batch_size ({effective_batch_size}) must be a multiple of processes "
                         f"({processes}): "
                         "each process takes the same share")
    positive_int("planner_layers", planner_layers)
    if zero_stage is not None and zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero_stage must be one of {', '.join(map(str, ZERO_STAGES))} (zero.py's stages), got "
                         f"{zero_stage!r}")
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
    if zero_stage is not None:
        plan.zero_stage = zero_stage
        run.update(processes=processes, zero_stage=zero_stage)
    profiles = {}
    with progress.shown(2 * len(STRATEGIES) + 3, f"fit {name}"):  # each strategy at two micro-batches; the planner
        for key, label_, checkpointing in STRATEGIES:
            if zero_stage == 3 and _stage3_refuses(checkpointing):
                continue  # not a row: train.py refuses it at stage 3
            profiles[key] = profile_gpt(config, seq_len, checkpointing=checkpointing, **run)
            plan.rows.append(_row(plan, key, label_, checkpointing, profiles[key], _ratio(profiles[key].at(1))))
        plan.rows.append(_planner_row(plan, run, nested_plans, planner_layers, profiles["every"]))
    plan.recommendation = recommend(plan)
    if zero_stage is not None:
        _add_stages(plan, run, profiles)
    elif plan.recommendation.verdict == VERDICTS[4]:  # not even with both: the stage and processes that fit
        least = min(plan.rows, key=lambda r: r.memory.device_peak_bytes)
        plan.recommendation = zero_rescue(plan, run, least, plan.recommendation) or plan.recommendation
    return plan


def _ratio(step):
    """The time a step takes with its recomputation, relative: (3F + recomputed FLOPs) / 3F, F its forward's."""
    return 1 + step.recomputed_flops / (3 * step.forward_flops)


def _row(plan, key, label, checkpointing, profile, ratio, plan_=None):
    largest = profile.largest_batch(plan.usable_bytes)
    micro = _largest_divisor(plan.batch_per_process, largest)
    return StrategyFit(key, label, checkpointing, min(largest, 1 << 40), micro,
                       plan.batch_per_process // micro if micro else 0, profile.at(micro or 1), ratio, plan_)


def _largest_divisor(n, most):
    """The largest divisor of n that is at most `most` (0 if most < 1)."""
    return max((d for d in range(1, min(n, most) + 1) if n % d == 0), default=0)


# -- the planner at the device's budget ----------------------------------------------------------
def _planner_row(plan, run, nested, planner_layers, every):
    """The plan that recomputes least within the device's memory, at the largest micro-batch one fits.

    The planner (schedules.plan_checkpoints) plans saved activations from
    their formulas (activations.py). It is given the device's memory less the
    rest of the step (parameters, gradients, optimizer state, buffers, what
    is in flight) as the every-block step holds it; the plan it returns is
    run, and if the whole step does not fit, its budget shrinks by the excess
    and it plans again. Its largest micro-batch is the one its least-memory
    plan fits. Every block is a plan too: measured by the same run, the row
    is the better of the two (a larger micro-batch, else less recompute, else
    less memory), so "every block" never beats it on every count. A GPT's
    blocks are alike, so each group of blocks costs the planner its number
    of blocks to recompute; what the plan's recomputation costs is counted in
    its run, as for the other rows.
    """
    return _better_than_every(plan, _planned(plan, run, nested, planner_layers, every))


def _planned(plan, run, nested, planner_layers, every):
    """The planner's own row (see _planner_row)."""
    config, T, f = plan.config, plan.seq_len, plan.precision.itemsize
    L = config.n_layer
    group = math.ceil(L / planner_layers)
    label = PLANNER if group == 1 else (PLANNER[0], f"{PLANNER[1]}, cuts every {group} blocks")
    none = plan.row("none")

    def costs_at(b):
        inputs, held = activations.gpt_chain(L, T, b, config.n_embd, config.n_head, config.dropout > 0, itemsize=f)
        costs = []
        for start in range(0, L, group):
            stop = min(start + group, L)
            costs.append(LayerCost(f"blocks {start}:{stop}", inputs[start], sum(held[start:stop]) - inputs[start], True,
                                   inputs[start], stop - start))
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
                return _fixed(plan, label, dict(segments=segments), memory, largest, plan_b, _ratio(memory), found)
            budget -= excess
    at_one = profile.at(1)
    return _fixed(plan, label, dict(segments=least_segments), at_one, largest, 0, _ratio(at_one),
                  Plan(least_segments, least.peak_bytes, least.recompute_seconds))


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
                          f"even one example with {least.label} needs {format_size(least.memory.device_peak_bytes)}, "
                          f"{format_size(short)} more than the {format_size(plan.usable_bytes)} usable", short)


# -- ZeRO: a row per stage, and the stage and processes that make a model fit ----------------------
def _add_stages(plan, run, profiles):
    """plan.stage_rows: the strategy the recommendation rests on (the least-memory one if none fits), one row a
    ZeRO stage on plan.processes processes; and, where nothing fits, zero_rescue's answer as the recommendation."""
    rec = plan.recommendation
    base = rec.strategy or min(plan.rows, key=lambda r: r.memory.device_peak_bytes)
    for stage in ZERO_STAGES:
        label, checkpointing = _at_stage(plan, base, stage)
        profile = profile_gpt(plan.config, plan.seq_len, checkpointing=checkpointing, **{**run, "zero_stage": stage})
        plan.stage_rows.append(_row(plan, f"stage {stage}", f"ZeRO stage {stage}, {label}", checkpointing, profile,
                                    _ratio(profile.at(1))))  # stage 3 recomputes whole blocks
    if rec.verdict == VERDICTS[4]:
        plan.recommendation = zero_rescue(plan, run, base, rec) or rec


def _stage3_refuses(checkpointing):
    """Stage 3 gathers a block's parameters when the block is called, so its recompute must call whole blocks:
    train.py refuses half blocks there (a policy is kept: its recompute calls whole blocks too)."""
    return bool(checkpointing) and bool(checkpointing.get("split_blocks"))


def _at_stage(plan, row, stage):
    """(label, checkpointing) of `row`'s strategy at `stage`: every block's where stage 3 refuses it."""
    if stage == 3 and _stage3_refuses(row.checkpointing):
        every = plan.row("every")
        return f"{every.label} (stage 3 refuses {row.label})", every.checkpointing
    return row.label, row.checkpointing


def zero_rescue(plan, run, least, short, most=1024):
    """Where not one example fits (`short`: that recommendation, whose shortfall it keeps): the fewest
    processes (plan.processes, doubled up to `most`) at which some ZeRO stage fits a micro-batch of 1 with the
    least-memory strategy `least`, and the lowest such stage (stages 1 and 2 send what data parallelism
    sends, stage 3 half as much again); None if none does.

    Each candidate is run, one process's step on the meta device, as the rows are: no formula. Every process
    then takes micro-batches of 1, so the effective batch is a multiple of the processes.
    """
    n = max(2, plan.processes)
    while n <= most:
        for stage in ZERO_STAGES[1:]:
            label, checkpointing = _at_stage(plan, least, stage)
            step = gpt_step(plan.config, 1, plan.seq_len, checkpointing=checkpointing,
                            **{**run, "processes": n, "zero_stage": stage})
            if step.device_peak_bytes <= plan.usable_bytes:
                steps = -(-plan.effective_batch_size // n)
                row = StrategyFit(f"stage {stage}", f"ZeRO stage {stage} on {n} processes, {label}", checkpointing,
                                  1, 1, steps, step, _ratio(step))
                args = _arguments(plan, row, stage)
                batch = "" if steps * n == plan.effective_batch_size else (
                    f"; the effective batch becomes {steps * n}, a multiple of the {n} processes")
                return Recommendation(VERDICTS[4], row, args,
                                      f"{short.reason}; with ZeRO stage {stage} on {n} processes and {label}, one "
                                      f"example needs {format_size(step.device_peak_bytes)} a process, of "
                                      f"{format_size(plan.usable_bytes)} usable{batch}", short.shortfall_bytes,
                                      processes=n)
        n *= 2
    return None


def _examples(n):
    """'1 example fits', '3 examples fit'."""
    return "1 example fits" if n == 1 else f"{n} examples fit"


def _arguments(plan, row, zero_stage=None):
    """The TrainingArguments line (this engine's train.py) for a row at its micro-batch (and ZeRO stage)."""
    zero_stage = plan.zero_stage if zero_stage is None else zero_stage
    args = [f"per_device_train_batch_size={row.micro_batch}"]
    if zero_stage:
        args.insert(0, f"zero_stage={zero_stage}")
    if row.accumulation_steps > 1:
        args.append(f"gradient_accumulation_steps={row.accumulation_steps}")
    if plan.precision.autocast:
        args.append(f"{'bf16' if plan.precision.autocast == 'bfloat16' else 'fp16'}=True")
    if row.checkpointing is not None:
        args.append("gradient_checkpointing=True")
        kwargs = {k: v for k, v in row.checkpointing.items() if (k, v) != ("segments", "every")}
        if kwargs:
            args.append(f"gradient_checkpointing_kwargs={kwargs!r}")
    return f"TrainingArguments({', '.join(args)})"


