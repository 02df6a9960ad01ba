"""plan_kind: plan_training's table for the other model kinds (the MLP, the CNN, the LSTM language model,
the encoder), each strategy in float32 and in 16-bit mixed precision.

The same rows as the GPT's (plan.py): the largest micro-batch that fits,
the micro-batch and accumulation steps for the effective batch, the peak by
category and the recompute's FLOPs, each read from the step run on the meta
device by fit.estimate_step with the kind's model and loss (kinds.py). The
strategies are those every chain model takes (no checkpointing, every link
of its chain, sqrt(n) segments); the 16-bit rows are the same strategies
under autocast (TrainingArguments bf16 / fp16). The recommendation is the
GPT's (plan.recommend), from the rows in the precision asked.
"""

import numpy

from .. import autocast, meta
from ..data import CharTokenizer, load_text
from ..kinds import KINDS, batch_shapes
from ..schedules import minimum_budget, plan_checkpoints
from ..tensor import Tensor
from . import progress
from .batch_sizes import profile
from .inputs import DEFAULT_RESERVE, GPUS, device_memory_bytes, positive_int, precision
from .plan import PLANNER, StrategyFit, TrainingPlan, _largest_divisor, _ratio, _row, recommend
from .step import estimate_step

# The planner's search grows quickly with the time steps and with the budget (schedules.plan_checkpoints: at
# 256 steps, seconds to tens of seconds a plan): the LSTM gets the planner's rows up to this many steps.
PLANNER_STEPS = 64
STRATEGIES = (("none", "no checkpointing", None), ("every", "every {link}", "every"), ("sqrt", "sqrt(n) segments", "sqrt"))


def kind_step(kind, sizes, batch_size, checkpointing=None, autocast_dtype=None, vocab_size=None, device="cuda"):
    """fit.estimate_step of `kind` (a name of kinds.KINDS) at `sizes`, a micro-batch of batch_size: a StepMemory.

    checkpointing: None or gradient_checkpointing_kwargs' segments ("every",
    "sqrt", ...); autocast_dtype: None, "bfloat16" or "float16" (mixed precision)."""
    k = KINDS[kind]
    shapes = batch_shapes(k.example(sizes, vocab_size), batch_size)
    args = dict(bf16=autocast_dtype == "bfloat16", fp16=autocast_dtype == "float16", gradient_checkpointing=bool(checkpointing),
                gradient_checkpointing_kwargs=dict(segments=checkpointing) if checkpointing else None)
    step = estimate_step(k.build(sizes, vocab_size, device="meta"), shapes, k.loss, args, device)
    progress.ran()
    return step


def text_vocab_size():
    """The embedded text's vocabulary: the LSTM language model's, as `train --model lstm` reads it."""
    return CharTokenizer.from_text(load_text()).vocab_size


def plan_kind(kind, sizes=None, effective_batch_size=8, device_memory="a100-80gb", dtype="float32",
              mixed_precision=None, processes=1, reserve_bytes=None, vocab_size=None):
    """Will a training step of a model kind fit? A TrainingPlan (print it for the table).

    kind: "mlp", "cnn", "lstm" or "encoder" (kinds.KINDS); sizes: its size
    fields (kinds.KINDS[kind].sizes' names), the rest its defaults; vocab_size:
    the LSTM's (default: the embedded text's). dtype: "float32", or "bfloat16" /
    "float16" with mixed_precision=True: the precision the recommendation is
    for; the table has float32 rows and 16-bit rows (bfloat16, or float16 if
    asked or if there is no bfloat16). The rest as plan_training's.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown model kind {kind!r}: use one of {', '.join(KINDS)}")
    k = KINDS[kind]
    unknown = sorted(set(sizes or {}) - set(k.sizes))
    if unknown:
        raise ValueError(f"{', '.join(unknown)} {'does' if len(unknown) == 1 else 'do'} not apply to model {kind}, "
                         f"which takes {', '.join(k.sizes)}")
    sizes = {**k.sizes, **(sizes or {})}
    if kind == "lstm":
        vocab_size = text_vocab_size() if vocab_size is None else vocab_size
        positive_int("vocab_size", vocab_size)
    elif vocab_size is not None:
        raise ValueError(f"vocab_size does not apply to model {kind}, which takes {', '.join(k.sizes)}")
    positive_int("effective_batch_size", effective_batch_size)
    positive_int("processes", processes)
    if effective_batch_size % processes:
        raise ValueError(f"effective_batch_size ({effective_batch_size}) must be a multiple of processes ({processes})")
    asked = precision(dtype, mixed_precision)
    if asked.dtype != "float32":
        raise ValueError(f"model {kind} is planned in float32 and in 16-bit mixed precision: give dtype float32, or "
                         f"bfloat16 / float16 with mixed_precision=True, not {asked.description}")
    half = asked.autocast or ("bfloat16" if _has_bfloat16() else "float16")
    memory_bytes, label = device_memory_bytes(device_memory)
    if reserve_bytes is None:
        preset = isinstance(device_memory, str) and device_memory.strip().lower() in GPUS
        reserve_bytes = DEFAULT_RESERVE if preset else 0
    model = k.build(sizes, vocab_size, device="meta")
    parameters = sum(p.data.size for p in model.parameters())
    described = ", ".join(f"{name} {','.join(map(str, v)) if isinstance(v, tuple) else v}" for name, v in sizes.items())
    plan = TrainingPlan(None, kind, sizes.get("block_size"), effective_batch_size, processes, memory_bytes, label,
                        memory_bytes - reserve_bytes, asked, parameters,
                        headline=f"{kind}: {described}" + (f", vocabulary {vocab_size}" if kind == "lstm" else "")
                        + f", {parameters:,} parameters; recommended in {asked.dtype if not asked.autocast else half} "
                        "(--dtype)" + ("" if kind != "lstm" or sizes["block_size"] <= PLANNER_STEPS else
                                       f"; no planner rows past {PLANNER_STEPS} time steps (its search grows with them)"))
    with progress.shown(4 * len(STRATEGIES), f"fit {kind}"):
        for autocast_dtype in (None, half):
            rows = plan.rows if autocast_dtype == asked.autocast else plan.other_rows
            for key, name, segments in STRATEGIES:
                p = profile(lambda b: kind_step(kind, sizes, b, segments, autocast_dtype, vocab_size))
                name = name.format(link=k.chain[:-1]) + (f", {autocast_dtype} mixed" if autocast_dtype else ", float32")
                rows.append(_row(plan, key, name, None if segments is None else dict(segments=segments), p,
                                 _ratio(p.at(1))))
            if kind == "lstm" and sizes["block_size"] <= PLANNER_STEPS:
                every = next(r for r in rows if r.key == "every")
                rows.append(_lstm_planner_row(plan, sizes, vocab_size, autocast_dtype, every))
    plan.recommendation = recommend(plan)
    return plan


def lstm_costs(sizes, vocab_size, batch, autocast_dtype=None):
    """A schedules.LayerCost per time step of the LSTM language model's LSTM at a micro-batch of `batch`: its
    measure_time_steps, run on the meta device (under autocast for a 16-bit row)."""
    model = KINDS["lstm"].build(sizes, vocab_size, device="meta")
    x = Tensor(meta.empty((batch, sizes["block_size"], sizes["n_embd"]), numpy.float32), requires_grad=True)
    with autocast.autocast(autocast_dtype or "bfloat16", enabled=autocast_dtype is not None):
        return model.lstm.measure_time_steps(x, repeats=1, cost="flops")


def _lstm_planner_row(plan, sizes, vocab_size, autocast_dtype, every):
    """The planner's row (plan.py's, for the GPT) for the LSTM's time steps: at the largest micro-batch that
    divides the batch and at which the least-memory plan fits, the plan that recomputes least within the
    memory less the rest of the step (as the every-step row holds it); if the step is over, the budget shrinks
    by the excess and the planner plans again. Its largest micro-batch is that plan's. Single-level plans
    (--nested-plans' default): a nested plan recomputes a step many times, and its run takes as long."""
    def run(b, found):
        return kind_step("lstm", sizes, b, found.segments, autocast_dtype, vocab_size)

    label = PLANNER[1] + (f", {autocast_dtype} mixed" if autocast_dtype else ", float32")
    costs = lstm_costs(sizes, vocab_size, 1, autocast_dtype)
    found = plan_checkpoints(costs, minimum_budget(costs, False), False)  # the least memory, single-level
    p = profile(lambda b: run(b, found))
    micro = _largest_divisor(plan.batch_per_process, p.largest_batch(plan.usable_bytes))
    if micro:
        at = kind_step("lstm", sizes, micro, "every", autocast_dtype, vocab_size)
        budget = plan.usable_bytes - (at.device_peak_bytes - at.highest["activations"])
        costs = lstm_costs(sizes, vocab_size, micro, autocast_dtype)
        for _ in range(4):
            try:
                planned = plan_checkpoints(costs, budget, False)
            except ValueError:
                break
            excess = run(micro, planned).device_peak_bytes - plan.usable_bytes
            if excess <= 0:
                found, p = planned, profile(lambda b: run(b, planned))
                break
            budget -= excess
    largest = p.largest_batch(plan.usable_bytes)
    micro = _largest_divisor(plan.batch_per_process, largest)
    return StrategyFit(PLANNER[0], label, dict(segments=found.segments), largest, micro,
                       plan.batch_per_process // micro if micro else 0, p.at(micro or 1), _ratio(p.at(1)), found)


def _has_bfloat16():
    try:
        autocast.bfloat16()
    except ImportError:
        return False
    return True
