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

from .. import autocast
from ..data import CharTokenizer, load_text
from ..kinds import KINDS
from . import progress
from .batch_sizes import profile
from .inputs import DEFAULT_RESERVE, GPUS, device_memory_bytes, positive_int, precision
from .plan import TrainingPlan, _ratio, _row, recommend
from .step import estimate_step

STRATEGIES = (("none", "no checkpointing", None), ("every", "every {link}", "every"), ("sqrt", "sqrt(n) segments", "sqrt"))


def kind_step(kind, sizes, batch_size, checkpointing=None, autocast_dtype=None, vocab_size=None, device="cuda"):
    """fit.estimate_step of `kind` (a name of kinds.KINDS) at `sizes`, a micro-batch of batch_size: a StepMemory.

    checkpointing: None or gradient_checkpointing_kwargs' segments ("every",
    "sqrt", ...); autocast_dtype: None, "bfloat16" or "float16" (mixed precision)."""
    k = KINDS[kind]
    shapes = {name: ((batch_size, *shape), dtype) for name, (shape, dtype, _) in k.example(sizes, vocab_size).items()}
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
    plan = TrainingPlan(None, kind, None, effective_batch_size, processes, memory_bytes, label,
                        memory_bytes - reserve_bytes, asked, parameters,
                        headline=f"{kind}: {described}" + (f", vocabulary {vocab_size}" if kind == "lstm" else "")
                        + f", {parameters:,} parameters; recommended in {asked.dtype if not asked.autocast else half} "
                        "(--dtype)")
    with progress.shown(4 * len(STRATEGIES), f"fit {kind}"):
        for autocast_dtype in (None, half):
            rows = plan.rows if autocast_dtype == asked.autocast else plan.other_rows
            for key, name, segments in STRATEGIES:
                p = profile(lambda b: kind_step(kind, sizes, b, segments, autocast_dtype, vocab_size))
                name = name.format(link=k.chain[:-1]) + (f", {autocast_dtype} mixed" if autocast_dtype else ", float32")
                rows.append(_row(plan, key, name, None if segments is None else dict(segments=segments), p,
                                 _ratio(p.at(1))))
    plan.recommendation = recommend(plan)
    return plan


def _has_bfloat16():
    try:
        autocast.bfloat16()
    except ImportError:
        return False
    return True
