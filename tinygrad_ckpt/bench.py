"""`tinygrad-ckpt bench`: checkpointing and accumulation strategies, side by side, measured.

    tinygrad-ckpt bench --quick                  # a smaller set: under two minutes on 2 cores
    tinygrad-ckpt bench --output-dir bench-out   # the full set (it says how long it took)

It runs the reference workloads (copied below from the project's
WORKLOADS.md, so that figures can be compared across versions):

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
  * the recompute in FLOPs (saved.op_flops over the timeline's recompute
    events), as the theoretical slowdown (3F + R) / 3F: a training step is
    about three forwards (backward of a matmul is two matmuls), and R is
    what checkpointing does again, at most one more forward F.

Output, in --output-dir: bench.md (the tables printed on the terminal),
bench.json (every figure, the machine, the threads), and PNG plots drawn by
plots.py with matplotlib (the optional `plot` extra); without matplotlib
the tables and JSON are still written, and the run says how to get plots.

Threads: BLAS reads its thread count when NumPy loads, before this module
runs. With threadpoolctl installed, bench limits the BLAS pool to --threads
itself (and reports what threadpoolctl says); without it, it reports the
environment variables and asks for them to be set, as the scripts in
benchmarks/ do before they import NumPy.

What does not live here: drawing (plots.py), the formulas (activations.py),
checkpointing (checkpoint.py, schedules.py, policies.py).
"""

import argparse
import gc
import json
import os
import platform
import statistics
import tempfile
import time
import tracemalloc
from dataclasses import asdict, dataclass

import numpy

from . import activations, backend, memory, optim, policies, random
from . import functional as F
from .accumulate import GradientAccumulator
from .nn.mlp import MLP
from .nn.transformer import GPT, GPTConfig
from .saved import op_flops
from .schedules import measure_layers, minimum_budget, plan_checkpoints, predict, segment_bounds
from .tensor import Tensor


# -- the workloads (WORKLOADS.md), and the three sets this command runs ------------
@dataclass
class BenchConfig:
    """Which workloads, at which sizes."""

    w1_depths: tuple  # W1: layers of Linear(width, width) + GELU, then a Linear head; MSE loss
    w1_width: int
    w1_batch: int
    w2_blocks: tuple  # W2: pre-LN GPT blocks, causal attention, MLP 4x GELU; cross-entropy
    w2_d_model: int
    w2_heads: int
    w2_seq: int
    w2_batch: int
    w2_vocab: int
    w2_dropout: float
    w3_blocks: int  # W3: the W2 model; one effective batch split into micro-batch x steps
    w3_effective_batch: int
    w3_splits: tuple
    budgets: tuple  # budget-plan rows: fractions of the no-checkpoint activation peak
    tradeoff_w1_depth: int  # trade-off curves: budget plans over tradeoff_fractions
    tradeoff_w2_blocks: int
    tradeoff_fractions: tuple
    timeline_w1_depth: int  # which sizes get a memory-timeline plot
    timeline_w2_blocks: int
    repeats: int = 5  # timed steps per row (median), after one warm-up step


FULL = BenchConfig(
    w1_depths=(8, 16, 32, 64), w1_width=1024, w1_batch=256,
    w2_blocks=(2, 4, 8), w2_d_model=256, w2_heads=4, w2_seq=128, w2_batch=8, w2_vocab=256, w2_dropout=0.1,
    w3_blocks=4, w3_effective_batch=32, w3_splits=((32, 1), (16, 2), (8, 4), (4, 8), (2, 16)),
    budgets=(0.5, 0.25),
    tradeoff_w1_depth=32, tradeoff_w2_blocks=8, tradeoff_fractions=(0.9, 0.75, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2),
    timeline_w1_depth=16, timeline_w2_blocks=4,
)
# The same workloads at their smallest sizes: what the README shows.
QUICK = BenchConfig(
    w1_depths=(8, 16), w1_width=1024, w1_batch=256,
    w2_blocks=(2,), w2_d_model=256, w2_heads=4, w2_seq=128, w2_batch=8, w2_vocab=256, w2_dropout=0.1,
    w3_blocks=2, w3_effective_batch=32, w3_splits=((32, 1), (8, 4), (2, 16)),
    budgets=(0.5, 0.25),
    tradeoff_w1_depth=16, tradeoff_w2_blocks=2, tradeoff_fractions=(0.75, 0.5),
    timeline_w1_depth=8, timeline_w2_blocks=2,
)
# Toy sizes for the test suite (--tiny, hidden): the figures mean nothing.
TINY = BenchConfig(
    w1_depths=(2, 4), w1_width=32, w1_batch=8,
    w2_blocks=(2,), w2_d_model=16, w2_heads=2, w2_seq=8, w2_batch=2, w2_vocab=16, w2_dropout=0.1,
    w3_blocks=2, w3_effective_batch=4, w3_splits=((4, 1), (2, 2), (1, 4)),
    budgets=(0.5, 0.25),
    tradeoff_w1_depth=4, tradeoff_w2_blocks=2, tradeoff_fractions=(0.75, 0.5),
    timeline_w1_depth=4, timeline_w2_blocks=2, repeats=2,
)

DESCRIPTION = """Measure checkpointing and accumulation strategies side by side on the reference
workloads (W1 deep MLP, W2 GPT stack, W3 accumulation): peak memory by category,
saved activations measured beside the analytic count, step time relative to no
checkpointing. Prints Markdown tables; writes bench.json, bench.md and PNG plots.

  tinygrad-ckpt bench --quick      the smaller set, under two minutes on 2 cores
  tinygrad-ckpt bench              the full set (it says how long it took)"""

LEARNING_RATE = 1e-4  # small: the step is measured, the model need not learn
F32 = 4


# -- one training step per strategy --------------------------------------------------
def checkpointing(model, segments, policy):
    """Switch the model's block checkpointing to `segments` (None: off), as a user would."""
    if segments is None:
        model.gradient_checkpointing_disable()
    else:
        model.gradient_checkpointing_enable(segments=segments, policy=policy)


def gpt_embed(model, idx):
    """GPT.forward up to the blocks (the planner measures the blocks on this). (B, T) -> (B, T, C)."""
    T = idx.shape[1]
    pos = backend.module_for(model.wpe.weight.device).arange(T)  # (T,)
    return model.drop(model.wte(idx) + model.wpe(pos))


def _timed(forward_backward, optimizer):
    """Run one training step; (seconds for forward + backward, seconds for the whole step)."""
    start = time.perf_counter()
    forward_backward()
    middle = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad()
    return middle - start, time.perf_counter() - start


def measure(step, repeats, policy=None):
    """Memory of one step (its timeline: also the warm-up), then the median time of `repeats` steps.

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
    times = [step() for _ in range(repeats)]
    forward = sum(op_flops(e["op"], e["input_shapes"], e["output_shapes"]) for e in events
                  if e["phase"] == "forward" and "output_shapes" in e)
    recompute = sum(op_flops(e["op"], e["input_shapes"], e["output_shapes"]) for e in events
                    if e["phase"] == "recompute" and "output_shapes" in e
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
        "forward_backward_seconds": statistics.median(t[0] for t in times),
        "step_seconds": statistics.median(t[1] for t in times),
        # For the timeline plots: categories and phase per event, and whether it
        # is an op running forward ("op") or a record's backward ("backward").
        "events": [{**{k: v for k, v in e.items() if k not in ("input_shapes", "output_shapes")},
                    "record": "op" if "output_shapes" in e else "backward"} for e in events],
    }


# -- the chain strategies (W1 and W2) ------------------------------------------------
def _strategies(config, fractions, with_selective):
    """(name, how) for the rows of a chain workload; `how` is resolved by `_segments_for`.

    With `fractions`: only budget plans at those fractions (a trade-off curve).
    """
    if fractions is not None:
        return [(f"budget {round(f * 100)}%", ("budget", f)) for f in fractions]
    rows = [("none", None), ("every layer", "every"), ("sqrt(n)", "sqrt")]
    rows += [(f"budget {round(f * 100)}%", ("budget", f)) for f in config.budgets]
    if with_selective:
        rows.append(("selective", "selective"))
    return rows


def _segments_for(how, n, costs):
    """(segments, policy, plan or None) for a strategy; ValueError if a budget cannot be met."""
    if how is None:
        return None, None, None
    if how == "selective":
        return "every", policies.selective_attention, None
    if isinstance(how, tuple):  # ("budget", fraction of the no-checkpoint peak)
        budget = int(how[1] * predict(costs, [(0, n, False)])[0])
        plan = plan_checkpoints(costs, budget)
        return plan, None, plan
    return how, None, None


def _predicted_chain(how, n, segments, block_input, block_held, before, after, selective_kept=0, selective_extra=0):
    """The analytic activation peak of a chain strategy (activations.chain_peak)."""
    bounds = [(0, n, False)] if segments is None else segment_bounds(n, segments)
    inputs, held = [block_input] * n, [block_held] * n
    if how == "selective":
        inputs = [i + selective_kept for i in inputs]
        held = [h + selective_extra for h in held]
    return activations.chain_peak(before, inputs, held, after, bounds)


def bench_w1(config, depth, progress, fractions=None):
    """W1 at one depth: a row per strategy (or per budget fraction, for the trade-off curve)."""
    b, h = config.w1_batch, config.w1_width
    rng = numpy.random.default_rng(0)
    model = MLP(h, h, h, n_layers=depth, rng=rng)
    x = Tensor(rng.standard_normal((b, h), dtype=numpy.float32))  # (b, h)
    y = Tensor(rng.standard_normal((b, h), dtype=numpy.float32))  # a fixed random target
    optimizer = optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    costs = measure_layers(list(model.blocks), x)  # what the budget planner needs: bytes and seconds per layer
    # saved per layer 8bh, of which its input 4bh; the head's input and the loss's difference after
    formulas = dict(block_input=F32 * b * h, block_held=activations.mlp_layer(b, h), before=0, after=2 * F32 * b * h)
    rows = []
    for name, how in _strategies(config, fractions, with_selective=False):
        row = {"workload": "W1", "size": depth, "strategy": name}
        progress(f"W1 depth {depth}, {name}")
        try:
            segments, policy, plan = _segments_for(how, depth, costs)
        except ValueError:
            rows.append(_infeasible(row, how, depth, costs))
            continue

        checkpointing(model, segments, policy)

        def forward_backward():
            F.mse_loss(model(x), y).backward()

        row.update(measure(lambda: _timed(forward_backward, optimizer), config.repeats, policy))
        row["predicted_activation_bytes"] = _predicted_chain(how, depth, segments, **formulas)
        if plan is not None:
            row.update(plan=str(plan), planner_predicted_bytes=plan.peak_bytes)
        rows.append(row)
    return rows


def _w2_model(config, n_layer, rng):
    gpt_config = GPTConfig(block_size=config.w2_seq, vocab_size=config.w2_vocab, n_layer=n_layer,
                           n_head=config.w2_heads, n_embd=config.w2_d_model, dropout=config.w2_dropout)
    return GPT(gpt_config, rng=rng)


def _w2_formulas(config, batch):
    s, b, h, a, V = config.w2_seq, batch, config.w2_d_model, config.w2_heads, config.w2_vocab
    dropout = config.w2_dropout > 0
    return dict(
        block_input=F32 * s * b * h, block_held=activations.gpt_block(s, b, h, a, dropout),
        before=activations.gpt_embedding(s, b, h, dropout), after=activations.gpt_head(s, b, h, V),
        selective_kept=activations.selective_kept(s, b, h), selective_extra=activations.selective_extra(s, b, h),
    )


def bench_w2(config, n_layer, progress, fractions=None):
    """W2 with n_layer blocks: a row per strategy (or per budget fraction, for the trade-off curve)."""
    rng = numpy.random.default_rng(0)
    model = _w2_model(config, n_layer, rng)
    idx = rng.integers(0, config.w2_vocab, (config.w2_batch, config.w2_seq))  # (B, T) token ids
    targets = rng.integers(0, config.w2_vocab, (config.w2_batch, config.w2_seq))  # (B, T)
    optimizer = optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    costs = measure_layers(list(model.blocks), gpt_embed(model, idx))  # for the budget planner
    formulas = _w2_formulas(config, config.w2_batch)
    rows = []
    for name, how in _strategies(config, fractions, with_selective=True):
        row = {"workload": "W2", "size": n_layer, "strategy": name}
        progress(f"W2 {n_layer} blocks, {name}")
        try:
            segments, policy, plan = _segments_for(how, n_layer, costs)
        except ValueError:
            rows.append(_infeasible(row, how, n_layer, costs))
            continue

        checkpointing(model, segments, policy)

        def forward_backward():
            model(idx, targets)[1].backward()

        row.update(measure(lambda: _timed(forward_backward, optimizer), config.repeats, policy))
        row["predicted_activation_bytes"] = _predicted_chain(how, n_layer, segments, **formulas)
        if plan is not None:
            row.update(plan=str(plan), planner_predicted_bytes=plan.peak_bytes)
        rows.append(row)
    return rows


def _infeasible(row, how, n, costs):
    least = minimum_budget(costs)
    full = predict(costs, [(0, n, False)])[0]
    row.update(infeasible=True, note=f"no single-level plan fits {round(how[1] * 100)}%: the least any "
               f"plan reaches is {memory.format_bytes(least)} ({least / full:.0%} of no checkpointing)")
    return row


# -- W3: accumulation --------------------------------------------------------------------
def bench_w3(config, progress):
    """One effective batch, split into micro-batch x steps: a row per split, gradients compared."""
    rng = numpy.random.default_rng(0)
    model = _w2_model(config, config.w3_blocks, rng)
    N, T = config.w3_effective_batch, config.w2_seq
    idx = rng.integers(0, config.w2_vocab, (N, T))
    targets = rng.integers(0, config.w2_vocab, (N, T))
    optimizer = optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    params = list(model.parameters())
    initial = [p.data.copy() for p in params]
    reference = None
    rows = []
    for micro, steps in config.w3_splits:
        if micro * steps != N:
            raise ValueError(f"W3 split {micro} x {steps} does not make the effective batch {N}")
        progress(f"W3 {micro} x {steps}")
        accumulator = GradientAccumulator(model.parameters(), gradient_accumulation_steps=steps) if steps > 1 else None
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

        row = {"workload": "W3", "size": config.w3_blocks, "strategy": f"{micro} x {steps}", "micro_batch": micro, "steps": steps}
        # Gradients equal across splits: at the initial weights (the timed steps
        # move them), with dropout off (eval mode: each split draws its masks in
        # another order), on the same batch. Relative to the largest gradient.
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
        row.update(measure(step, config.repeats))
        row["predicted_activation_bytes"] = activations.gpt(
            config.w3_blocks, T, micro, config.w2_d_model, config.w2_heads, config.w2_vocab, config.w2_dropout > 0)
        rows.append(row)
        del accumulator
    return rows


# -- tables ----------------------------------------------------------------------------
def _mib(n):
    return "—" if n is None else f"{n / 2**20:.1f}"


def _ratio(row, baseline, key="step_seconds"):
    if baseline is None or row.get(key) is None or not baseline.get(key):
        return "—"
    return f"{row[key] / baseline[key]:.2f}"


CATEGORY_COLUMNS = ("parameters", "gradients", "optimizer", "accumulation", "activations", "other")


def table(rows, title, size_name, baselines, extra=None):
    """A Markdown table of rows; `baselines` maps a size to its baseline row."""
    head = [size_name, "strategy", "peak MiB", "params", "grads", "optim", "accum", "act", "other",
            "act peak MiB", "predicted", "step ×", "fwd+bwd ×", "theory ×"]
    if extra:
        head.append(extra[0])
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        base = baselines.get(r["size"])
        if r.get("infeasible"):
            cells = [str(r["size"]), r["strategy"], f"— ({r['note']})"] + [""] * (len(head) - 3)
        else:
            cats = [_mib(r["peak_by_category"][c]) for c in CATEGORY_COLUMNS]
            theory = f"{r['theory_ratio']:.2f}" if r.get("theory_ratio") else "—"
            cells = [str(r["size"]), r["strategy"], _mib(r["peak_bytes"]), *cats,
                     _mib(r["activation_peak_bytes"]), _mib(r["predicted_activation_bytes"]),
                     _ratio(r, base), _ratio(r, base, "forward_backward_seconds"), theory]
            if extra:
                cells.append(extra[1](r))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(results):
    """The seed's summary table: when accumulation and checkpointing are needed, with measured figures."""
    lines = ["### When accumulation and checkpointing are needed (measured in this run)", "",
             "| technique | activation peak (measured) | step time (measured) | seed says | theory |",
             "|---|---|---|---|---|"]
    for workload, label in (("W1", "layer"), ("W2", "block")):
        rows = [r for r in results["rows"] if r["workload"] == workload and not r.get("infeasible")]
        if not rows:
            continue
        size = max(r["size"] for r in rows)
        base = next(r for r in rows if r["size"] == size and r["strategy"] == "none")
        for r in rows:
            if r["size"] != size or r["strategy"] == "none":
                continue
            time_ratio = r["step_seconds"] / base["step_seconds"]
            fb_ratio = r["forward_backward_seconds"] / base["forward_backward_seconds"]
            lines.append(
                f"| checkpointing, {workload} {size} {label}s, {r['strategy']} "
                f"| {_mib(base['activation_peak_bytes'])} → {_mib(r['activation_peak_bytes'])} MiB "
                f"({r['activation_peak_bytes'] / base['activation_peak_bytes']:.0%}) "
                f"| {time_ratio - 1:+.0%} per step ({fb_ratio - 1:+.0%} forward+backward) "
                f"| about +20% | {r['theory_ratio'] - 1:+.0%} (one extra forward: +33%) |"
            )
    w3 = [r for r in results["rows"] if r["workload"] == "W3"]
    if w3:
        base, last = w3[0], w3[-1]
        lines.append(
            f"| accumulation, W3, {base['strategy']} → {last['strategy']} "
            f"| {_mib(base['activation_peak_bytes'])} → {_mib(last['activation_peak_bytes'])} MiB "
            f"(+ {_mib(last['peak_by_category']['accumulation'])} MiB of accumulation buffers) "
            f"| {last['step_seconds'] / base['step_seconds'] - 1:+.0%} per optimizer step "
            f"| keeps memory at micro-batch size | same FLOPs; activations ∝ micro-batch |"
        )
    return "\n".join(lines)


def render(results):
    """All tables as Markdown."""
    load = results.get("load_average", {}).get("start")
    out = [f"## tinygrad-ckpt bench ({results['set']} set)", "",
           f"machine: {results['machine']['description']}; BLAS threads: {results['threads']['summary']}"
           + (f"; load average at start {load:.1f}" if load is not None else ""), "",
           "MiB = 2^20 bytes. Category columns: live bytes at the moment of the step's peak. "
           "act peak: the highest saved-activation bytes over the step; predicted: activations.py. "
           "step ×, fwd+bwd ×: median time / the baseline's, same run. theory ×: (3F + recompute FLOPs) / 3F.", ""]
    rows = results["rows"]
    for workload, title, size_name in (("W1", "W1: deep MLP (width %d, batch %d)", "depth"),
                                       ("W2", "W2: GPT stack (d_model %d, %d heads, seq %d, batch %d)", "blocks")):
        wrows = [r for r in rows if r["workload"] == workload]
        if not wrows:
            continue
        c = results["config"]
        title = title % ((c["w1_width"], c["w1_batch"]) if workload == "W1" else
                         (c["w2_d_model"], c["w2_heads"], c["w2_seq"], c["w2_batch"]))
        baselines = {r["size"]: r for r in wrows if r["strategy"] == "none"}
        out += [table(wrows, title, size_name, baselines), ""]
    for curve in results["tradeoff"]:
        baselines = {curve["size"]: curve["baseline"]}
        out += [table(curve["rows"], f"Trade-off: budget plans, {curve['workload']} size {curve['size']}",
                      "size", baselines, ("plan", lambda r: r.get("plan", ""))), ""]
    w3 = [r for r in rows if r["workload"] == "W3"]
    if w3:
        c = results["config"]
        out += [table(w3, f"W3: accumulation, the W2 model with {c['w3_blocks']} blocks, effective batch "
                      f"{c['w3_effective_batch']} (micro-batch x steps)", "blocks", {w3[0]["size"]: w3[0]},
                      ("max grad diff", lambda r: f"{r['max_grad_difference']:.1e}")), ""]
    out += [summary(results), ""]
    return "\n".join(out)


# -- machine, threads, files ---------------------------------------------------------------
def machine():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
        blas = f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # older NumPy: no dict mode
        blas = "unknown"
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": numpy.__version__, "blas": blas,
            "description": f"{cpu}, {os.cpu_count()} CPUs, {platform.system()}, NumPy {numpy.__version__} ({blas})"}


def _load():
    """The 1-minute load average (None where the system does not say)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def limit_threads(n):
    """Limit BLAS to n threads if we can; returns (a context to run in, what we know of the threads)."""
    from contextlib import nullcontext

    env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        ok = env["OPENBLAS_NUM_THREADS"] == str(n) or env["OMP_NUM_THREADS"] == str(n)
        summary = (f"{n} (from the environment)" if ok else
                   f"not limited: BLAS uses its default (usually one per core: {os.cpu_count()} here); "
                   f"set OMP_NUM_THREADS={n} OPENBLAS_NUM_THREADS={n} before running, or pip install threadpoolctl")
        return nullcontext(), {"requested": n, "environment": env, "threadpoolctl": None, "summary": summary}
    context = threadpool_limits(limits=n)
    info = [{k: p.get(k) for k in ("internal_api", "num_threads", "version")} for p in threadpool_info()]
    return context, {"requested": n, "environment": env, "threadpoolctl": info,
                     "summary": f"{n} (threadpoolctl: " + ", ".join(f"{p['internal_api']} {p['num_threads']}" for p in info) + ")"}


def write_atomic(path, text):
    """Write text to path via a temporary file in the same folder and os.replace."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


# -- the command ----------------------------------------------------------------------------
def add_arguments(parser):
    parser.add_argument("--quick", action="store_true",
                        help="a smaller set (W1 depth 8 and 16, W2 2 blocks, three W3 splits): under two minutes on 2 cores")
    parser.add_argument("--output-dir", default="bench-out", metavar="DIR",
                        help="where bench.json, bench.md and the PNG plots go (default: bench-out)")
    parser.add_argument("--threads", type=int, default=2, help="BLAS threads (default 2; see the notes printed)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed steps per row, after one warm-up step (default 5; the median is reported)")
    parser.add_argument("--no-plots", action="store_true", help="write the tables and JSON only")
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # toy sizes, for the tests


def run(args):
    """Run the benchmark set, print the tables, write JSON, Markdown and plots."""
    config = TINY if args.tiny else QUICK if args.quick else FULL
    name = "tiny" if args.tiny else "quick" if args.quick else "full"
    if args.repeats is not None:
        if args.repeats < 1:
            raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
        config = BenchConfig(**{**asdict(config), "repeats": args.repeats})
    if args.threads < 1:
        raise ValueError(f"--threads must be at least 1, got {args.threads}")
    os.makedirs(args.output_dir, exist_ok=True)
    context, threads = limit_threads(args.threads)
    load = _load()
    if load is not None and load > (os.cpu_count() or 1) / 2:
        print(f"note: the machine is busy (load average {load:.1f} on {os.cpu_count()} CPUs): steps will be "
              "slower and noisier than on a quiet machine, and ratios less reliable", flush=True)
    count = _count_rows(config)
    print(f"tinygrad-ckpt bench: {name} set, {count} rows, {config.repeats} timed steps each after one warm-up; "
          f"BLAS threads: {threads['summary']}", flush=True)
    start = time.perf_counter()
    done = [0]

    def progress(what):
        done[0] += 1
        print(f"[{done[0]:>3}/{count}] {time.perf_counter() - start:6.0f} s  {what}", flush=True)

    random.manual_seed(0)  # the dropout masks
    with context:
        results = collect(config, progress)
    elapsed = time.perf_counter() - start
    results.update({"set": name, "elapsed_seconds": elapsed, "machine": machine(), "threads": threads,
                    "config": asdict(config), "load_average": {"start": load, "end": _load()}})
    text = render(results)
    print()
    print(text)
    json_path = os.path.join(args.output_dir, "bench.json")
    write_atomic(json_path, json.dumps(results, indent=1, default=_json_default) + "\n")
    write_atomic(os.path.join(args.output_dir, "bench.md"), text + "\n")
    written = [json_path, os.path.join(args.output_dir, "bench.md")]
    if args.no_plots:
        print("plots: skipped (--no-plots)")
    else:
        try:
            from . import plots
        except ImportError as e:
            print(f"plots: skipped, matplotlib is not installed ({e}); get them with "
                  "`pip install 'tinygrad_ckpt[plot]'` and run bench again")
        else:
            written += plots.draw_all(results, args.output_dir)
    print(f"wrote: {', '.join(written)}")
    print(f"the {name} set took {elapsed:.0f} s ({elapsed / 60:.1f} min) on {results['machine']['description']}")
    return 0


def _json_default(x):
    if isinstance(x, (numpy.integer,)):
        return int(x)
    if isinstance(x, (numpy.floating,)):
        return float(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def _count_rows(config):
    w1 = len(config.w1_depths) * (3 + len(config.budgets))
    w2 = len(config.w2_blocks) * (4 + len(config.budgets))
    tradeoff = 2 * len(config.tradeoff_fractions)
    return w1 + w2 + tradeoff + len(config.w3_splits)


def collect(config, progress):
    """Every measurement of a set: {'rows': [...], 'tradeoff': [...], 'timelines': {...}}."""
    rows = []
    for depth in config.w1_depths:
        rows += bench_w1(config, depth, progress)
        gc.collect()
    for n_layer in config.w2_blocks:
        rows += bench_w2(config, n_layer, progress)
        gc.collect()
    tradeoff = []
    for workload, size in (("W1", config.tradeoff_w1_depth), ("W2", config.tradeoff_w2_blocks)):
        bench = bench_w1 if workload == "W1" else bench_w2
        curve = bench(config, size, progress, fractions=config.tradeoff_fractions)
        gc.collect()
        uniform = [r for r in rows if r["workload"] == workload and r["size"] == size and not r.get("infeasible")]
        baseline = next((r for r in uniform if r["strategy"] == "none"), None)
        tradeoff.append({"workload": workload, "size": size, "rows": curve, "baseline": baseline,
                         "uniform": [r["strategy"] for r in uniform]})
    rows += bench_w3(config, progress)
    gc.collect()
    timelines = {}
    for workload, size in (("W1", config.timeline_w1_depth), ("W2", config.timeline_w2_blocks)):
        timelines[workload] = {"size": size, "strategies": {
            r["strategy"]: r["events"] for r in rows
            if r["workload"] == workload and r["size"] == size and not r.get("infeasible")}}
    for r in rows:  # events are kept only for the timeline plots
        r.pop("events", None)
    for curve in tradeoff:
        for r in curve["rows"]:
            r.pop("events", None)
    return {"rows": rows, "tradeoff": tradeoff, "timelines": timelines}
