"""The strategy bench: checkpointing and accumulation strategies, side by side, measured.

What `tinygrad-ckpt bench` runs (command.py reads the flags and writes the
files). On the reference workloads (workloads.py):

  W1  a deep MLP, a chain of Linear + GELU layers: checkpointing a chain
  W2  a GPT stack: checkpointing a transformer, and the selective policy
  W3  gradient accumulation: one effective batch, split into micro-batches

For every row, one training step (forward, backward, AdamW step) is run
with the memory timeline on; it is also the warm-up. Then `repeats` more
steps are timed. A row reports:

  * the peak of live bytes (memory.py) and how it splits into categories at
    that moment: parameters, gradients, optimizer state, accumulation
    buffers, saved activations, other;
  * the peak of saved activations over the step, measured, next to the
    analytic count (activations.py): they agree to the byte;
  * the step time as a ratio to the row's baseline (no checkpointing, or the
    unsplit batch) in the same run: the median of the timed steps. Absolute
    times are in the JSON only, next to the machine they were measured on;
  * the recompute in FLOPs (ops/flops.py over the timeline's recompute
    events), as the theoretical slowdown (3F + R) / 3F: a training step is
    about three forwards (backward of a matmul is two matmuls), and R is
    what checkpointing does again: at most one more forward F with one
    level of checkpoints, more with a nested plan, which recomputes some
    layers more than once; beside it, R for the same strategy with a full
    recompute (early_stop=False: every op of a segment again), one more
    step counted: what early stop and the skipped ops save (recompute.py).

A strategy that cannot save anything at a size says so in its row: sqrt(n)
segments on 2 blocks round to one segment, the whole stack, recomputed at
once in backward.

Mixed precision: at the size of W1 and of W2 whose timelines are drawn
(BenchConfig.timeline_*, so the explorer page shows them), beside the
plain float32 step ("none"), the same step as TrainingArguments(bf16=True)
and fp16=True run it: the forward and the loss under autocast
(autocast.py; its casts are Cast records on the tape, their copies counted
by memory.py), float32 parameters, gradients and AdamW state, and for
float16 the loss scaled by a GradScaler (grad_scaler.py), the gradients
unscaled before the step, a step with inf or NaN skipped. These rows have
no analytic count (activations.py counts float32). On NumPy they are
slower than float32, not faster: it has no 16-bit BLAS, so each 16-bit
matrix product runs in float32 and is rounded (ops/matmul.py), and the
casts are work of their own.

`collect(config, progress)` measures a set and returns every figure;
`render(results)` makes the Markdown tables of them.

What does not live here: the command and its files (command.py), the
workloads' definitions (workloads.py), drawing (plots.py), the formulas
(activations.py), checkpointing (checkpoint.py, schedules.py, policies.py).
"""

import gc
import statistics
import time
import tracemalloc
from dataclasses import dataclass

import numpy

from .. import activations, autocast, backend, memory, optim, policies
from .. import functional as F
from ..accumulate import GradientAccumulator
from ..grad_scaler import GradScaler
from ..ops.flops import op_flops
from ..schedules import measure_layers, minimum_budget, plan_checkpoints, predict, segment_bounds
from ..tensor import Tensor
from . import workloads
from .report import markdown_table, mib


# -- what one run measures ------------------------------------------------------------
@dataclass(frozen=True)
class BenchConfig:
    """Which sizes of the workloads (workloads.Sizes), and what else the bench measures at them."""

    sizes: workloads.Sizes
    budgets: tuple  # budget-plan rows: fractions of the no-checkpoint activation peak
    tradeoff_w1_depth: int  # trade-off curves: budget plans over tradeoff_fractions
    tradeoff_w2_blocks: int
    tradeoff_fractions: tuple
    timeline_w1_depth: int  # which sizes get a memory timeline (the plots, the explorer page)
    timeline_w2_blocks: int
    repeats: int = 5  # timed steps per row (median), after one warm-up step


FULL = BenchConfig(
    sizes=workloads.FULL, budgets=(0.5, 0.25),
    tradeoff_w1_depth=32, tradeoff_w2_blocks=8, tradeoff_fractions=(0.9, 0.75, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2),
    timeline_w1_depth=64, timeline_w2_blocks=8,  # the largest: the explorer page shows them event by event
)
QUICK = BenchConfig(
    sizes=workloads.QUICK, budgets=(0.5, 0.25),
    tradeoff_w1_depth=16, tradeoff_w2_blocks=4, tradeoff_fractions=(0.75, 0.5),
    timeline_w1_depth=8, timeline_w2_blocks=4,
)
TINY = BenchConfig(
    sizes=workloads.TINY, budgets=(0.5, 0.25),
    tradeoff_w1_depth=4, tradeoff_w2_blocks=2, tradeoff_fractions=(0.75, 0.5),
    timeline_w1_depth=4, timeline_w2_blocks=2, repeats=2,
)
SETS = {"full": FULL, "quick": QUICK, "tiny": TINY}

LEARNING_RATE = 1e-4  # small: the step is measured, the model need not learn
# The figure the summary quotes beside its measurements, and where it is from.
HF_GUIDE = "transformers v4.47.1, perf_train_gpu_one"
HF_GUIDE_URL = "https://huggingface.co/docs/transformers/v4.47.1/perf_train_gpu_one"
F32 = 4
# The mixed-precision rows (at the timelines' sizes), by their names in the tables; float32's is "none".
PRECISION_ROWS = {"bfloat16": "bf16 autocast", "float16": "fp16 autocast, loss scaled"}


def precision_rows():
    """(the PRECISION_ROWS this process can run, why bfloat16's is left out or None).

    NumPy has no bfloat16: it needs ml_dtypes (autocast.bfloat16). Without
    it the set runs without that row, and the command says so before the
    first row, instead of stopping at it.
    """
    try:
        autocast.bfloat16()
    except ImportError as e:
        return {k: v for k, v in PRECISION_ROWS.items() if k != "bfloat16"}, str(e)
    return dict(PRECISION_ROWS), None


# -- one training step per strategy --------------------------------------------------
def checkpointing(model, segments, policy, split_blocks=False, early_stop=True):
    """Switch the model's block checkpointing to `segments` (None: off), as a user would."""
    if segments is None:
        model.gradient_checkpointing_disable()
    elif split_blocks:
        model.gradient_checkpointing_enable(segments=segments, policy=policy, split_blocks=True, early_stop=early_stop)
    else:
        model.gradient_checkpointing_enable(segments=segments, policy=policy, early_stop=early_stop)


def full_recompute_flops(step):
    """The FLOPs the recompute of one step counts (ops/flops.py over its recompute events)."""
    with memory.timeline() as events:
        step()
    return sum(op_flops(e["op"], e["input_shapes"], e["output_shapes"]) for e in events
               if e["phase"] == "recompute" and "output_shapes" in e)


def gpt_embed(model, idx):
    """GPT.forward up to the blocks (the planner measures the blocks on this). (B, T) -> (B, T, C)."""
    T = idx.shape[1]
    pos = backend.module_for(model.wpe.weight.device).arange(T)  # (T,)
    return model.drop(model.wte(idx) + model.wpe(pos))


def _timed(forward_backward, optimizer, scaler=None):
    """Run one training step: (forward + backward seconds, step seconds, step CPU seconds).

    CPU seconds (all threads of this process) count work done, not waiting
    for a busy CPU, so on a shared machine they are the steadier figure.
    scaler: float16's GradScaler; it unscales, steps unless a gradient
    overflowed, and updates its scale, as the Trainer does.
    """
    start, cpu = time.perf_counter(), time.process_time()
    forward_backward()
    middle = time.perf_counter()
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)
        scaler.update()
    optimizer.zero_grad()
    return middle - start, time.perf_counter() - start, time.process_time() - cpu


def mixed_precision_step(loss, optimizer, dtype):
    """(step, scaler): one training step as TrainingArguments(bf16=True) / fp16=True runs it.

    loss(): the float32 model's loss, run under autocast(dtype); float16
    scales it before backward (GradScaler), unscales the gradients after,
    and skips a step whose gradients overflowed (the scaler then halves its
    scale); bfloat16's scaler is a pass-through.
    """
    scaler = GradScaler(enabled=dtype == "float16")

    def forward_backward():
        with autocast.autocast(dtype):
            value = loss()  # float32: the loss is on the policy's float32 list
        scaler.scale(value).backward()
        scaler.unscale_(optimizer)  # once, after backward, as the Trainer does before clipping

    def step():
        with numpy.errstate(over="ignore", invalid="ignore"):  # an overflow is the scaler's to handle
            return _timed(forward_backward, optimizer, scaler)

    return step, scaler


def measure_memory(step, policy=None):
    """Run one step with the timeline on (it is also the warm-up); its memory and FLOPs.

    `policy`: the checkpoint policy in use; ops it saves are replayed, not
    recomputed, so their recompute-phase events cost no FLOPs.
    """
    gc.collect()
    memory.reset_peak()
    before = memory.current()
    tracing = not tracemalloc.is_tracing()
    if tracing:
        tracemalloc.start()  # the independent measure: every NumPy buffer, temporaries too
    with memory.timeline() as events:
        step()
    if tracing:
        traced_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    peak, by_category = memory.peak()
    forward = sum(op_flops(e["op"], e["input_shapes"], e["output_shapes"]) for e in events
                  if e["phase"] == "forward" and e["kind"] == "op")
    recompute = sum(op_flops(e["op"], e["input_shapes"], e["output_shapes"]) for e in events
                    if e["phase"] == "recompute" and "output_shapes" in e  # a rebuilt record ran nothing
                    and (policy is None or policy(e["op"]) == policies.RECOMPUTE))
    return {
        "peak_bytes": peak,
        "peak_by_category": by_category,
        "peak_rise_bytes": peak - sum(before.values()),
        "tracemalloc_peak_rise_bytes": traced_peak if tracing else None,
        "activation_peak_bytes": max(e["activations"] for e in events) - before["activations"],
        "forward_flops": forward,
        "recompute_flops": recompute,
        "theory_ratio": 1 + recompute / (3 * forward) if forward else None,
        # For the timelines (plots.py, explorer.py): every event as memory.py
        # recorded it, and what was live before the step.
        "before": before,
        "events": events,
    }


def time_in_turn(timed, repeats, progress, what):
    """Time each row's step `repeats` times, one step per row per round; medians into the rows.

    timed: [(row, prepare, step)]; prepare() (untimed) switches the model to
    the row's strategy. Taking the rows in turn, round after round, means a
    change in the machine's load touches every row alike, so the ratios
    between rows hold up better than if each row were timed in one go.
    """
    samples = {id(row): [] for row, _, _ in timed}
    for k in range(repeats):
        progress(f"{what}: timing round {k + 1}/{repeats}", count=False)
        for row, prepare, step in timed:
            prepare()
            samples[id(row)].append(step())
    for row, _, _ in timed:
        times = samples[id(row)]
        row["forward_backward_seconds"] = statistics.median(t[0] for t in times)
        row["step_seconds"] = statistics.median(t[1] for t in times)
        row["step_cpu_seconds"] = statistics.median(t[2] for t in times)
        row["repeats"] = len(times)


# -- the chain strategies (W1 and W2) ------------------------------------------------
def _strategies(config, fractions, with_selective):
    """(name, how) for the rows of a chain workload; `how` is resolved by `_segments_for`.

    `fractions`: budget plans for a trade-off curve, added after the usual rows.
    """
    rows = [("none", None), ("every layer", "every"), ("sqrt(n)", "sqrt")]
    rows += [(f"budget {round(f * 100)}%", ("budget", f)) for f in config.budgets]
    if with_selective:
        rows += [("selective", "selective"), ("selective, half blocks", "selective halves")]
    rows += [(f"budget {round(f * 100)}%", ("budget", f)) for f in fractions if f not in config.budgets]
    return rows


def _segments_for(how, n, costs, after):
    """(segments, policy, plan or None, split_blocks) for a strategy; ValueError if a budget cannot be met.

    A budget is a fraction of the no-checkpoint peak of the blocks and what
    the model saves behind them (`after`: the head and the loss), which the
    planner is told about.
    """
    if how is None:
        return None, None, None, False
    if how in ("selective", "selective halves"):
        return "every", policies.selective_attention, None, how == "selective halves"
    if isinstance(how, tuple):  # ("budget", fraction of the no-checkpoint peak)
        budget = int(how[1] * predict(costs, [(0, n, False)], after)[0])
        plan = plan_checkpoints(costs, budget, after_bytes=after)
        return plan, None, plan, False
    return how, None, None, False


def _predicted_chain(how, n, segments, block_input, block_held, before, after, selective_kept=(),
                     selective_extra=0, sublayer_held=()):
    """The analytic activation peak of a chain strategy (activations.chain_peak).

    selective_kept, sublayer_held: per half of a block (attention, feed-forward).
    """
    if how == "selective halves":  # the chain is 2n halves, each keeping its Linear outputs
        n *= 2
        inputs = [block_input + selective_kept[i % 2] for i in range(n)]
        held = [sublayer_held[i % 2] + selective_extra // 2 for i in range(n)]
    elif how == "selective":
        inputs, held = [block_input + sum(selective_kept)] * n, [block_held + selective_extra] * n
    else:
        inputs, held = [block_input] * n, [block_held] * n
    bounds = [(0, n, False)] if segments is None else segment_bounds(n, segments)
    return activations.chain_peak(before, inputs, held, after, bounds)


def bench_chain(config, workload, size, model, loss, costs, formulas, progress, fractions=()):
    """The rows of one chain workload at one size: memory one by one, then times in turn.

    loss(): the model's training loss on the workload's fixed batch; costs:
    schedules.measure_layers of its blocks (for the budget planner); formulas:
    the arguments of _predicted_chain.
    """
    optimizer = optim.AdamW(model.parameters(), lr=LEARNING_RATE)

    def step():
        return _timed(lambda: loss().backward(), optimizer)

    rows, timed = [], []
    for name, how in _strategies(config, fractions, with_selective=workload == "W2"):
        row = {"workload": workload, "size": size, "strategy": name}
        if isinstance(how, tuple):
            row["fraction"] = how[1]
        progress(f"{workload} size {size}, {name}: memory")
        try:
            segments, policy, plan, split = _segments_for(how, size, costs, formulas["after"])
        except ValueError:
            rows.append(_infeasible(row, how, size, costs, formulas["after"]))
            continue
        checkpointing(model, segments, policy, split)
        row.update(measure_memory(step, policy))
        if segments is not None:  # what the same strategy recomputes without early stop, for comparison
            checkpointing(model, segments, policy, split, early_stop=False)
            row["recompute_flops_full"] = full_recompute_flops(step)
            checkpointing(model, segments, policy, split)
        row["predicted_activation_bytes"] = _predicted_chain(how, size, segments, **formulas)
        if plan is not None:
            row.update(plan=str(plan), planner_predicted_bytes=plan.peak_bytes,
                       nested=any(isinstance(inner, list) for _, _, inner in plan.segments))
        if how == "sqrt" and len(segment_bounds(size, segments)) == 1:
            row["note"] = (f"sqrt({size}) rounds to 1 segment: the whole stack is one checkpoint, recomputed at "
                           "once in backward, so it saves nothing")
        rows.append(row)
        timed.append((row, lambda s=segments, p=policy, h=split: checkpointing(model, s, p, h), step))
    scalers = []
    timeline_size = config.timeline_w1_depth if workload == "W1" else config.timeline_w2_blocks
    for dtype, name in precision_rows()[0].items() if size == timeline_size else ():
        row = {"workload": workload, "size": size, "strategy": name, "precision": dtype,
               "predicted_activation_bytes": None}  # activations.py counts float32 only
        progress(f"{workload} size {size}, {row['strategy']}: memory")
        checkpointing(model, None, None)
        precise, scaler = mixed_precision_step(loss, optimizer, dtype)
        row.update(measure_memory(precise))
        rows.append(row)
        scalers.append((row, scaler))
        timed.append((row, lambda: checkpointing(model, None, None), precise))
    time_in_turn(timed, config.repeats, progress, f"{workload} size {size}")
    for row, scaler in scalers:
        if scaler.enabled:  # the scale after the timed steps: below 2**16 if a step overflowed (and was skipped)
            row["loss_scale"] = scaler.get_scale()
    checkpointing(model, None, None)
    return rows


def bench_w1(config, depth, progress, fractions=()):
    """W1 at one depth: a row per strategy (and per extra budget fraction)."""
    w1 = config.sizes.w1_at(depth)
    b, h = w1.batch, w1.width
    rng = numpy.random.default_rng(0)
    model = w1.model(rng)
    x, y = (Tensor(a) for a in w1.data(rng))  # (b, h) each: the batch and a fixed random target
    costs = measure_layers(list(model.blocks), x, cost="flops")  # for the budget planner: bytes and costs per layer
    # saved per layer 8bh, of which its input 4bh; the head's input and the loss's difference after
    formulas = dict(block_input=F32 * b * h, block_held=activations.mlp_layer(b, h), before=0, after=2 * F32 * b * h)
    return bench_chain(config, "W1", depth, model, lambda: F.mse_loss(model(x), y), costs, formulas, progress, fractions)


def bench_w2(config, n_layer, progress, fractions=()):
    """W2 with n_layer blocks: a row per strategy (and per extra budget fraction)."""
    w2 = config.sizes.w2_at(n_layer)
    rng = numpy.random.default_rng(0)
    model = w2.model(rng)
    idx, targets = w2.data(rng)  # (B, T) token ids, and the next token of each
    costs = measure_layers(list(model.blocks), gpt_embed(model, idx), cost="flops")  # for the budget planner
    s, b, h, a, V = w2.seq, w2.batch, w2.n_embd, w2.n_head, w2.vocab
    dropout = w2.dropout > 0
    formulas = dict(
        block_input=F32 * s * b * h, block_held=activations.gpt_block(s, b, h, a, dropout),
        before=activations.gpt_embedding(s, b, h, dropout), after=activations.gpt_head(s, b, h, V),
        selective_kept=activations.selective_kept_sublayers(s, b, h), selective_extra=activations.selective_extra(s, b, h),
        sublayer_held=(activations.gpt_attention_sublayer(s, b, h, a, dropout),
                       activations.gpt_feed_forward_sublayer(s, b, h, dropout)),
    )
    return bench_chain(config, "W2", n_layer, model, lambda: model(idx, targets)[1], costs, formulas, progress, fractions)


def _infeasible(row, how, n, costs, after):
    least = minimum_budget(costs, after_bytes=after)
    full = predict(costs, [(0, n, False)], after)[0]
    budget = int(how[1] * full)  # as _strategy computes it
    row.update(infeasible=True, note=infeasible_note(how[1], budget, least, full))
    return row


def infeasible_note(fraction, budget, least, full):
    """Why a budget row has no plan: the budget and the least any plan reaches, in bytes, each with its share
    of no checkpointing (two decimals where a whole percent would print them alike)."""
    digits = 0
    while digits < 2 and f"{budget / full:.{digits}%}" == f"{least / full:.{digits}%}":
        digits += 1
    return (f"no plan fits the budget of {round(fraction * 100)}% of no checkpointing ({memory.format_bytes(budget)}, "
            f"{budget / full:.{digits}%}): the least any plan reaches is {memory.format_bytes(least)} "
            f"({least / full:.{digits}%})")


# -- W3: accumulation --------------------------------------------------------------------
def bench_w3(config, progress):
    """One effective batch, split into micro-batch x steps: a row per split, gradients compared."""
    w3 = config.sizes.w3
    rng = numpy.random.default_rng(0)
    model = w3.model.model(rng)
    N, T = w3.effective_batch, w3.model.seq
    idx, targets = w3.model.data(rng, batch=N)  # (N, T) each
    optimizer = optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    params = list(model.parameters())
    initial = [p.data.copy() for p in params]

    def make_step(micro, steps):
        """(forward_backward, step, accumulator) for one split, with its own accumulation buffers."""
        accumulator = GradientAccumulator(params, gradient_accumulation_steps=steps) if steps > 1 else None
        # (micro, T) arrays of their own, as a data loader hands them over
        micro_batches = [(idx[k * micro:(k + 1) * micro].copy(), targets[k * micro:(k + 1) * micro].copy())
                         for k in range(steps)]

        def forward_backward():
            if accumulator is None:  # the unsplit batch: a plain mean loss
                model(idx, targets)[1].backward()
                return
            for micro_idx, micro_targets in micro_batches:
                logits, _ = model(micro_idx)  # (micro, T, vocab)
                # the SUM of this micro-batch's token losses; write_grads divides by all tokens once
                F.cross_entropy(logits, micro_targets, reduction="sum").backward()
                accumulator.accumulate(micro * T)
            accumulator.write_grads()

        def step():
            times = _timed(forward_backward, optimizer)
            if accumulator is not None:
                accumulator.zero_grad()
            return times

        return forward_backward, step, accumulator

    rows, reference = [], None
    for micro, steps in w3.splits:  # (micro x steps == N: workloads.Accumulation checks it)
        progress(f"W3 {micro} x {steps}: gradients and memory")
        row = {"workload": "W3", "size": w3.model.n_layer, "strategy": f"{micro} x {steps}", "micro_batch": micro,
               "steps": steps}
        forward_backward, step, accumulator = make_step(micro, steps)
        # Gradients equal across splits: at the initial weights, with dropout
        # off (eval mode: each split draws its masks in another order), on the
        # same batch; relative to the largest gradient.
        for p, w in zip(params, initial):
            p.data[...] = w
        model.eval()
        forward_backward()
        grads = [backend.to_host(p.grad.data).copy() for p in params]
        optimizer.zero_grad()
        if accumulator is not None:
            accumulator.zero_grad()
        model.train()
        reference = grads if reference is None else reference
        scale = max(float(numpy.abs(g).max()) for g in reference)
        row["max_grad_difference"] = max(float(numpy.abs(g - r).max()) for g, r in zip(grads, reference)) / scale
        row.update(measure_memory(step))  # only this split's buffers exist now
        gpt = w3.model
        row["predicted_activation_bytes"] = activations.gpt(
            gpt.n_layer, T, micro, gpt.n_embd, gpt.n_head, gpt.vocab, gpt.dropout > 0)
        rows.append(row)
        del forward_backward, step, accumulator
    # Times: every split's buffers at once now (memory is not measured any more).
    timed = [(row, lambda: None, make_step(row["micro_batch"], row["steps"])[1]) for row in rows]
    time_in_turn(timed, config.repeats, progress, "W3")
    return rows


# -- tables ----------------------------------------------------------------------------
def _ratio(row, baseline, key="step_seconds"):
    if baseline is None or row.get(key) is None or not baseline.get(key):
        return "—"
    return f"{row[key] / baseline[key]:.2f}"


CATEGORY_COLUMNS = ("parameters", "gradients", "optimizer", "accumulation", "activations", "other")


def table(rows, title, size_name, baselines, extra=None):
    """A Markdown table of rows; `baselines` maps a size to its baseline row."""
    head = [size_name, "strategy", "peak MiB", "params", "grads", "optim", "accum", "act", "other",
            "act peak MiB", "predicted", "step ×", "fwd+bwd ×", "cpu ×", "theory ×", "recomputed"]
    if extra:
        head.append(extra[0])
    cells_of_rows = []
    for r in rows:
        base = baselines.get(r["size"])
        if r.get("infeasible"):
            cells = [str(r["size"]), r["strategy"], f"— ({r['note']})"] + [""] * (len(head) - 3)
        else:
            cats = [mib(r["peak_by_category"][c]) for c in CATEGORY_COLUMNS]
            theory = f"{r['theory_ratio']:.2f}" if r.get("theory_ratio") else "—"
            strategy = r["strategy"] + (f" ({r['note']})" if r.get("note") else "")
            cells = [str(r["size"]), strategy, mib(r["peak_bytes"]), *cats,
                     mib(r["activation_peak_bytes"]), mib(r["predicted_activation_bytes"]),
                     _ratio(r, base), _ratio(r, base, "forward_backward_seconds"),
                     _ratio(r, base, "step_cpu_seconds"), theory, _recomputed(r)]
            if extra:
                cells.append(extra[1](r))
        cells_of_rows.append(cells)
    return "\n".join([f"### {title}", ""] + markdown_table(head, cells_of_rows))


def _recomputed(row):
    """The recompute's FLOPs as a share of the forward's, and (in full) without early stop."""
    if not row.get("forward_flops") or not row.get("recompute_flops"):
        return "—"
    share = f"{row['recompute_flops'] / row['forward_flops']:.0%}"
    if row.get("recompute_flops_full"):
        share += f" ({row['recompute_flops_full'] / row['forward_flops']:.0%} in full)"
    return share


def precision_table(rows):
    """The mixed-precision rows beside float32's plain step ("none") at the same size; None if there are none.

    Seconds here are absolute (the run's machine is in the header), beside
    the ratios: what a step costs on this machine in each precision.
    """
    lines = []
    for r in rows:
        if not r.get("precision"):
            continue
        base = next(b for b in rows if (b["workload"], b["size"], b["strategy"]) == (r["workload"], r["size"], "none"))
        if not lines or lines[-1][:2] != [r["workload"], str(r["size"])]:
            lines.append(_precision_cells(base, base, "float32"))
        lines.append(_precision_cells(r, base, r["precision"]))
    if not lines:
        return None
    head = ["workload", "size", "precision", "act peak MiB", "act × float32", "peak MiB", "params", "grads", "optim",
            "act", "other", "step s", "step ×", "cpu ×"]
    return "\n".join(["### Mixed precision: the plain step in float32, and under autocast (bf16=True, fp16=True)", "",
                      "Parameters, gradients and AdamW's state stay float32; saved activations hold the 16-bit "
                      "copies autocast makes (Cast records), the weights' among them. fp16: the loss scaled by a "
                      "GradScaler (final loss scale in brackets where a step overflowed). step s: median wall "
                      "seconds of a step. On NumPy 16 bits are slower, not faster: no 16-bit BLAS, so each 16-bit "
                      "matrix product runs in float32 and is rounded, and the casts are work of their own.", ""]
                     + markdown_table(head, lines))


def _precision_cells(r, base, precision):
    scale = f" (loss scale {r['loss_scale']:g})" if r.get("loss_scale", 2.0**16) != 2.0**16 else ""
    return [r["workload"], str(r["size"]), precision + scale, mib(r["activation_peak_bytes"], 2),
            f"{r['activation_peak_bytes'] / base['activation_peak_bytes']:.2f}", mib(r["peak_bytes"]),
            *[mib(r["peak_by_category"][c]) for c in ("parameters", "gradients", "optimizer", "activations", "other")],
            f"{r['step_seconds']:.3g}" if r.get("step_seconds") else "—", _ratio(r, base),
            _ratio(r, base, "step_cpu_seconds")]


def summary(results):
    """The summary table: when accumulation and checkpointing are needed, with measured figures.

    For each workload at its largest size: what each strategy does to the
    peak of saved activations and to the step's whole peak (which also holds
    parameters, gradients and optimizer state), and what it costs in time,
    beside what Hugging Face's guide says (HF_GUIDE: "gradient checkpointing
    slows down training by approximately 20%"; gradient accumulation raises
    the effective batch beyond what memory allows, and can slow training)
    and the FLOP count.
    """
    head = ["technique", "saved activations, peak", "whole step, peak", "step time", "CPU time",
            f"Hugging Face's guide ({HF_GUIDE})", "theory"]
    lines = []

    def change(base, row, key):
        return f"{mib(base[key])} → {mib(row[key])} MiB ({row[key] / base[key] - 1:+.0%})"

    def slower(base, row, key):
        return f"{row[key] / base[key] - 1:+.0%}" if row.get(key) and base.get(key) else "—"

    for workload, label in (("W1", "layers"), ("W2", "blocks")):
        rows = [r for r in results["rows"] if r["workload"] == workload and not r.get("infeasible")]
        if not rows:
            continue
        size = max(r["size"] for r in rows)
        base = next(r for r in rows if r["size"] == size and r["strategy"] == "none")
        for r in rows:
            if r["size"] != size or r["strategy"] == "none" or r.get("precision"):
                continue
            lines.append([
                f"checkpointing {r['strategy']}, {workload} {size} {label}" + (f" ({r['note']})" if r.get("note") else ""),
                change(base, r, "activation_peak_bytes"), change(base, r, "peak_bytes"),
                f"{slower(base, r, 'step_seconds')} (forward+backward {slower(base, r, 'forward_backward_seconds')})",
                slower(base, r, "step_cpu_seconds"),
                "about 20 % slower" if r["strategy"] == "every layer" else "", _theory(r),
            ])
    w3 = [r for r in results["rows"] if r["workload"] == "W3"]
    for r in w3[1:]:
        base = w3[0]
        lines.append([
            f"accumulation {base['strategy']} → {r['strategy']}, W3",
            change(base, r, "activation_peak_bytes"),
            f"{change(base, r, 'peak_bytes')}, of which {mib(r['peak_by_category']['accumulation'])} MiB buffers",
            slower(base, r, "step_seconds"), slower(base, r, "step_cpu_seconds"),
            "a larger effective batch than memory allows; can slow training", "same FLOPs; activations ∝ micro-batch",
        ])
    return "\n".join(["### When accumulation and checkpointing are needed (measured in this run)", ""]
                     + markdown_table(head, lines)
                     + ["", f"Hugging Face's guide: {HF_GUIDE_URL} (its figure is for gradient_checkpointing=True, "
                            "which checkpoints every layer)."])


def _theory(row):
    """The theory cell of a checkpointing row: the recompute's share, and what bounds it."""
    extra = f"{row['theory_ratio'] - 1:+.0%}"
    if row.get("nested"):
        return f"{extra} (a nested plan: some layers recomputed more than once, so more than one extra forward)"
    return f"{extra} (one level of checkpoints: at most one extra forward, +33%)"


def render(results):
    """All tables as Markdown."""
    load = results.get("load_average", {}).get("start")
    out = [f"## tinygrad-ckpt bench ({results['set']} set)", "",
           f"machine: {results['machine']['description']}; BLAS threads: {results['threads']['summary']}"
           + (f"; load average at start {load:.1f}" if load is not None else "")
           + (f"; {results['allocator']}" if "allocator" in results else ""), "",
           "MiB = 2^20 bytes. Category columns: live bytes at the moment of the step's peak. "
           "act peak: the highest saved-activation bytes over the step; predicted: activations.py. "
           "step ×, fwd+bwd ×, cpu ×: median wall time of the step, of its forward + backward, and the step's "
           "CPU time (all threads), over the baseline's, timed in turn in the same rounds. "
           "theory ×: (3F + recompute FLOPs) / 3F. recomputed: the recompute's FLOPs as a share of the "
           "forward's F, and (in full) the same strategy's without early stop.", ""]
    rows = results["rows"]
    for workload, title, size_name in (("W1", "W1: deep MLP (width %d, batch %d)", "depth"),
                                       ("W2", "W2: GPT stack (d_model %d, %d heads, seq %d, batch %d)", "blocks")):
        wrows = [r for r in rows if r["workload"] == workload]
        if not wrows:
            continue
        c = results["config"]["sizes"]
        title = title % ((c["w1"]["width"], c["w1"]["batch"]) if workload == "W1" else
                         (c["w2"]["n_embd"], c["w2"]["n_head"], c["w2"]["seq"], c["w2"]["batch"]))
        baselines = {r["size"]: r for r in wrows if r["strategy"] == "none"}
        out += [table(wrows, title, size_name, baselines), ""]
    precision = precision_table(rows)
    if precision:
        out += [precision, ""]
    for curve in results["tradeoff"]:
        baselines = {curve["size"]: curve["baseline"]}
        out += [table(curve["rows"], f"Trade-off: budget plans, {curve['workload']} size {curve['size']}",
                      "size", baselines, ("plan", lambda r: r.get("plan", ""))), ""]
    w3 = [r for r in rows if r["workload"] == "W3"]
    if w3:
        c = results["config"]["sizes"]["w3"]
        out += [table(w3, f"W3: accumulation, the W2 model with {c['model']['n_layer']} blocks, effective batch "
                      f"{c['effective_batch']} (micro-batch x steps)", "blocks", {w3[0]["size"]: w3[0]},
                      ("max grad diff", lambda r: f"{r['max_grad_difference']:.1e}")), ""]
    out += [summary(results), ""]
    return "\n".join(out)


def count_rows(config):
    """How many rows the set measures (the progress counter's total)."""
    extra = len([f for f in config.tradeoff_fractions if f not in config.budgets])
    w1 = len(config.sizes.w1_depths) * (3 + len(config.budgets)) + extra
    w2 = len(config.sizes.w2_blocks) * (5 + len(config.budgets)) + extra
    return w1 + w2 + len(config.sizes.w3.splits) + 2 * len(precision_rows()[0])


def collect(config, progress):
    """Every measurement of a set: {'rows': [...], 'tradeoff': [...], 'timelines': {...}}.

    The trade-off curve of a workload is measured with the rows of its size,
    in the same timing rounds, so its ratios share their baseline's conditions.
    """
    rows, tradeoff = [], []
    for workload, sizes, curve_size, bench in (("W1", config.sizes.w1_depths, config.tradeoff_w1_depth, bench_w1),
                                               ("W2", config.sizes.w2_blocks, config.tradeoff_w2_blocks, bench_w2)):
        if curve_size not in sizes:
            raise ValueError(f"{workload}: the trade-off size {curve_size} must be one of the sizes {sizes}")
        for size in sizes:
            fractions = config.tradeoff_fractions if size == curve_size else ()
            got = bench(config, size, progress, fractions)
            gc.collect()
            rows += [r for r in got if r.get("fraction") is None or r["fraction"] in config.budgets]
            if fractions:
                baseline = next(r for r in got if r["strategy"] == "none")
                curve = sorted((r for r in got if r.get("fraction") in fractions), key=lambda r: -r["fraction"])
                tradeoff.append({"workload": workload, "size": size, "rows": curve, "baseline": baseline})
    rows += bench_w3(config, progress)
    gc.collect()
    timelines = {}
    for workload, size in (("W1", config.timeline_w1_depth), ("W2", config.timeline_w2_blocks),
                           ("W3", config.sizes.w3.model.n_layer)):
        timelines[workload] = {"size": size, "strategies": {
            r["strategy"]: {"before": r["before"], "events": r["events"]} for r in rows
            if r["workload"] == workload and r["size"] == size and not r.get("infeasible")}}
    for r in rows + [r for curve in tradeoff for r in curve["rows"]]:
        r.pop("events", None)  # kept only for the timelines
        r.pop("before", None)
    return {"rows": rows, "tradeoff": tradeoff, "timelines": timelines}
