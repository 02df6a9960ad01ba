"""Checkpoint schedules: where to cut a chain of layers into checkpointed segments.

A chain of n layers, run by `checkpoint_sequential` (checkpoint.py). Each
segment is either stored (run normally: its layers keep what they save until
backward) or checkpointed (keeps only its input; recomputed in backward; with
an inner plan of its own, some of its layers are recomputed more than once).
The ways to choose, and where tutorial 5 (tutorials/05_gradient_checkpointing.md)
explains each:

  segments=k         k segments of nearly equal length (`segment_bounds`).
  segments='sqrt'    about sqrt(n) segments, Chen et al. 2016 ("Why sqrt(n)").
  plan_checkpoints   measured layers (`measure_layers`) and a budget in bytes
                     -> the plan that recomputes least within it, by dynamic
                     programming over the chain ("A memory budget: the planner").
  revolve(n, slots)  Griewank's nested plan for n equal layers with `slots`
                     checkpoints held at once (Griewank & Walther 2000); the
                     planner weighs these below what single-level plans reach
                     ("Below one level: recompute twice (revolve)").

The cost model, which `predict` computes and the planner minimises against:
per layer, in_bytes (its input's buffer) and held_bytes (what it keeps for
backward when run normally, its input included if it saves it), and what
recomputing it costs: its forward's seconds times the share of its forward
a checkpoint's recompute runs again (recompute.py skips what backward does
not need, and stops early at the end of a segment: a segment's last layer
costs less than the others). Walking the plan in forward order with P the
bytes held so far, a stored segment adds its layers' held bytes to P; a
checkpointed segment adds its input's bytes, and its recompute, during
backward, holds P plus its layers' held bytes (or its inner plan's walk). The predicted peak is the largest of P at the
end of the forward plus `after_bytes` (what the model saves behind the
chain: its head and loss) and every recompute's peak. These are
saved-activation bytes, the "activations" memory.py counts; `walk` states
the rules exactly. A budget below the smallest peak of any plan is a
ValueError that states that minimum (`minimum_budget`).

What does not live here: checkpointing itself (checkpoint.py), an op's
FLOP count (ops/flops.py).
"""

import math
import numbers
import time
from dataclasses import dataclass

import numpy

from . import backend, memory, tape
from .ops.flops import op_flops
from .recompute import recompute_shares
from .tensor import Tensor


@dataclass
class LayerCost:
    """What one layer of a chain costs when run normally (see `measure_layers`)."""

    name: str
    input_bytes: int  # its input's buffer: what a checkpoint starting here saves
    saved_bytes: int  # what it keeps for backward, apart from its input's buffer
    saves_input: bool  # whether it also keeps its input's buffer
    output_bytes: int
    seconds: float = 1.0  # forward time
    flops: int = 0  # forward FLOPs, counted from shapes (ops/flops.py)
    recompute_share: float = 1.0  # the share of its forward a recompute runs, inside a segment
    last_share: float = 1.0  # ... and as a segment's last layer, where the recompute stops early
    # Its output's buffers that it saves itself and that the next layer keeps as its input (an LSTM
    # step's new h, which the next layer of the same step also saves): counted once, with the next
    # layer's input, and so left out of saved_bytes. They are apart only in a checkpoint's recompute,
    # whose last layer saves a fresh copy of its output (see `walk`).
    shared_output_bytes: int = 0

    @property
    def held_bytes(self):
        """Bytes it holds between its forward and its backward when not checkpointed."""
        return self.saved_bytes + (self.input_bytes if self.saves_input else 0)

    def recompute_seconds(self, last=False):
        """What recomputing it costs: inside a checkpointed segment, or as its last layer."""
        return self.seconds * (self.last_share if last else self.recompute_share)


@dataclass
class Plan:
    """Segments of a chain, each (start, stop, checkpointed), with what they cost."""

    segments: list
    peak_bytes: int  # predicted peak of saved activations
    recompute_seconds: float  # predicted extra forward time in backward

    @property
    def boundaries(self):
        """[0, ..., n]: segment i is layers[b[i]:b[i+1]]."""
        return [s for s, _, _ in self.segments] + ([self.segments[-1][1]] if self.segments else [0])

    def __str__(self):
        return (f"Plan({describe(self.segments)}; * = checkpointed; predicted peak "
                f"{memory.format_bytes(self.peak_bytes)}, recompute {self.recompute_seconds * 1e3:.1f} ms)")


def describe(segments):
    """'[0:8]* [8:10]': * marks a checkpointed segment, (...) its inner plan if nested."""
    parts = []
    for a, b, how in segments:
        inner = f"({describe(how)})" if isinstance(how, list) else ""
        parts.append(f"[{a}:{b}]{'*' if how else ''}{inner}")
    return " ".join(parts)


# -- fixed schedules -----------------------------------------------------------
def segment_bounds(n, segments):
    """[(start, stop, checkpointed), ...] for n layers (see checkpoint_sequential).

    Also accepts such a list itself (checked), e.g. [(0, n, False)] for no checkpointing.
    """
    if isinstance(segments, Plan):
        segments = segments.segments
    if isinstance(segments, (list, tuple)) and segments and all(isinstance(s, tuple) and len(s) == 3 for s in segments):
        return _checked(segments, 0, n)
    if isinstance(segments, str):
        if segments not in ("sqrt", "every"):
            raise ValueError(f"segments must be 'sqrt', 'every', an int, a list of boundaries or a Plan, "
                             f"got {segments!r}")
        segments = max(1, round(math.sqrt(n))) if segments == "sqrt" else n
    if isinstance(segments, numbers.Integral) and not isinstance(segments, (bool, numpy.bool_)):
        segments = int(segments)
        if n == 0:
            return []
        if not 1 <= segments <= n:
            raise ValueError(f"segments must be between 1 and the number of layers ({n}), got {segments}")
        size, extra = divmod(n, segments)
        bounds, start = [], 0
        for i in range(segments):
            stop = start + size + (1 if i < extra else 0)
            bounds.append((start, stop, True))
            start = stop
        return bounds
    if isinstance(segments, (list, tuple)) and all(isinstance(b, numbers.Integral) for b in segments):
        cuts = [int(b) for b in segments]
        cuts = ([0] if not cuts or cuts[0] != 0 else []) + cuts
        cuts = cuts + ([n] if cuts[-1] != n else [])
        if any(b <= a for a, b in zip(cuts, cuts[1:])) or cuts[-1] != n:
            raise ValueError(
                f"segment boundaries must increase strictly from 0 to the number of layers ({n}), "
                f"got {list(segments)}"
            )
        return [(a, b, True) for a, b in zip(cuts, cuts[1:])]
    raise TypeError(
        f"segments must be an int, 'sqrt', 'every', a list of boundaries or a Plan, got {segments!r}"
    )


def _checked(segments, start, stop):
    """Explicit segments covering layers start..stop, each (a, b, stored/checkpointed/inner plan)."""
    stops = [start] + [b for _, b, _ in segments]
    if [a for a, _, _ in segments] != stops[:-1] or stops[-1] != stop or any(b <= a for a, b, _ in segments):
        raise ValueError(f"segments {list(segments)} do not cover layers {start}..{stop} one after the other")
    out = []
    for a, b, how in segments:
        if isinstance(how, (list, tuple)):  # checkpointed, with a plan of its own for the recompute
            if not how or not all(isinstance(s, tuple) and len(s) == 3 for s in how):
                raise ValueError(f"the inner plan of segment ({a}, {b}) must be a list of (start, stop, how), got {how!r}")
            out.append((a, b, _checked(how, a, b)))
        else:
            out.append((a, b, bool(how)))
    return out


def sqrt_segments(n):
    """Chen et al.'s segmentation of n layers: round(sqrt(n)) checkpointed segments."""
    return segment_bounds(n, "sqrt")


# -- measuring a chain ---------------------------------------------------------
def measure_layers(layers, x, repeats=2, cost="time", reads=()):
    """Run the chain once on sample input x, layer by layer; a LayerCost per layer.

    Each layer runs on a fresh tape on a detached copy of its input (with the
    same requires_grad it has in the chain), and the arrays its records saved
    are counted by buffer, as memory.py counts them; parameters (leaf
    tensors that require grad) are not activations and are left out. Its
    forward time is the best of `repeats` runs, and its FLOPs are counted.

    x: a Tensor, or a tuple of Tensors that each layer takes as its
    arguments and returns (a recurrent network's state from one time step to
    the next). A layer "saves its input" when it saves every one of those
    buffers; one that saves only some counts them among its own bytes, so a
    checkpoint's recompute is predicted one copy of them high, never low.
    reads: tensors the layers read besides their input (the sequence whose
    steps they take in turn), which live apart from the chain: left out of
    every layer's bytes, as parameters are.

    cost: what the planner will minimise. "time": each layer's measured
    seconds. "flops": the chain's measured seconds shared out in proportion
    to the layers' FLOPs, so equal layers cost exactly the same and the
    plan is the same on every run (timing noise would otherwise pick among
    equally good plans). Either way a recompute costs the share of a
    layer's forward FLOPs that a checkpoint's recompute runs again
    (recompute.recompute_shares), inside a segment and at its end.
    """
    if cost not in ("time", "flops"):
        raise ValueError(f"measure_layers: cost must be 'time' or 'flops', got {cost!r}")
    apart = {id(backend.storage(t.data)) for t in reads}
    costs, shared = [], {}
    for i, layer in enumerate(layers):
        seconds = math.inf
        for _ in range(repeats):
            inputs = _detached(x)
            recorded = tape.Tape()
            start = time.perf_counter()
            with tape.recording(recorded):
                y = layer(*inputs)
            seconds = min(seconds, time.perf_counter() - start)
        nodes = recorded.nodes()
        left_out = apart | {id(backend.storage(t.data)) for n in nodes for t in n.inputs
                            if t is not None and t.is_leaf and t.requires_grad and not any(t is a for a in inputs)}
        saved = {}
        for n in nodes:
            for a in n.ctx.saved_arrays or ():
                if a is not None:
                    base = backend.storage(a)
                    if id(base) not in left_out:
                        saved[id(base)] = base.nbytes
        in_ids = {id(backend.storage(t.data)): backend.storage(t.data).nbytes for t in inputs}
        if costs:  # what the previous layer saved of its output and this one saves too: counted here, once
            again = sum(nbytes for k, nbytes in shared.items() if k in saved)
            costs[-1].saved_bytes -= again
            costs[-1].shared_output_bytes = again
        saves_input = all(k in saved for k in in_ids)
        if saves_input:
            for k in in_ids:
                saved.pop(k)
        flops = sum(op_flops(n.name, n.input_shapes, n.shapes) for n in nodes)
        name = getattr(layer, "name", None) or type(layer).__name__
        inside, last = recompute_shares(layer, _detached(x))
        outputs = y if isinstance(y, tuple) else (y,)
        out_ids = {id(backend.storage(t.data)) for t in outputs}
        shared = {k: b for k, b in saved.items() if k in out_ids}  # its outputs it saves itself
        costs.append(LayerCost(f"{i}:{name}", sum(in_ids.values()), sum(saved.values()), saves_input,
                               sum(t.data.nbytes for t in outputs), seconds, flops, inside, last))
        x = tuple(_detached(y)) if isinstance(y, tuple) else y
    if cost == "flops":
        total_seconds, total_flops = sum(c.seconds for c in costs), sum(c.flops for c in costs)
        for c in costs:
            c.seconds = total_seconds * (c.flops / total_flops if total_flops else 1 / len(costs))
    return costs


def _detached(x):
    """Fresh leaves over x's arrays (a Tensor or a tuple of them), each as requires_grad as it was: a tuple."""
    return tuple(Tensor(t.data, requires_grad=t.requires_grad, device=t.device)
                 for t in (x if isinstance(x, tuple) else (x,)))


# -- predicting and planning -----------------------------------------------------
def predict(costs, segments, after_bytes=0):
    """(predicted peak saved-activation bytes, recompute seconds) of a segmentation.

    after_bytes: what is saved behind the chain (a model's head and loss):
    held at the end of the forward beside the chain's bytes, freed before
    the chain's backward (and so before any of its recomputes).
    """
    P, peak, recompute = walk(costs, segment_bounds(len(costs), segments))
    return max(peak, P + after_bytes), recompute


def walk(costs, segments, P=0, input_held=False):
    """Walk a plan as forward and backward run it: the cost model.

        stored segment [a, b)         P += held_a + ... + held_{b-1}
        checkpointed segment [a, b)   P += in_a (the record saves its input);
                                      its recompute holds
                                      P + in_a + held_a + ... + held_{b-1}
                                      + shared_{b-1}
                                      (less in_a if layer a saves its input:
                                      the same buffer, counted once)
        nested segment [a, b)         P += in_a; its recompute is its inner
                                      plan, walked from P + in_a with that
                                      input counted already; it costs the
                                      inner plan's forward plus its recompute

    shared_{b-1} (LayerCost.shared_output_bytes): what the segment's last
    layer saves of its own output. Everywhere else that buffer is the next
    layer's input and counted there; in a recompute it is a fresh copy,
    while the next layer's, freed by then, no longer counts.

    A checkpointed segment's recompute costs its layers' recompute shares,
    the last one's share as a segment's last layer (`segment_recompute`).
    Its bytes do not depend on how much it runs: a record the recompute
    rebuilds without running its op saves the same arrays a run would.

    Backward walks the segments in reverse, so when a segment is recomputed
    the later ones are freed and the earlier ones still hold their bytes.
    P: bytes held before the plan; input_held: its first layer's input buffer
    is among them already (an inner plan's, saved by the outer checkpoint).
    Returns (P at the end of its forward, the highest recompute peak,
    recompute seconds).
    """
    peak, recompute = 0, 0.0
    for a, b, how in segments:
        first = costs[a]
        counted = input_held and a == segments[0][0]  # this buffer is in P already
        if not how:  # stored
            P += sum(c.held_bytes for c in costs[a:b]) - (first.input_bytes if counted and first.saves_input else 0)
            continue
        base = P + (0 if counted else first.input_bytes)  # the record saves its input
        fresh = costs[b - 1].shared_output_bytes  # the recomputed last layer's output (see above)
        if isinstance(how, list):  # recomputed by running its inner plan
            inner_end, inner_peak, inner_recompute = walk(costs, how, base, input_held=True)
            peak = max(peak, inner_end + (fresh if not how[-1][2] else 0), inner_peak)  # its last part stored
            recompute += inner_recompute + _inner_forward(costs, how)
        else:
            held = sum(c.held_bytes for c in costs[a:b])
            peak = max(peak, base + held - (first.input_bytes if first.saves_input else 0) + fresh)
            recompute += segment_recompute(costs, a, b)
        P = base
    return P, peak, recompute


def segment_recompute(costs, a, b):
    """What recomputing checkpointed layers a..b-1 costs: each layer's share, the last one's as the last."""
    return sum(c.recompute_seconds() for c in costs[a:b - 1]) + costs[b - 1].recompute_seconds(last=True)


def _inner_forward(costs, segments):
    """What running an inner plan's forward costs inside the outer recompute.

    A checkpointed part runs its whole forward (a checkpoint's forward, which
    its own recompute repeats later); a stored part is recomputed as any
    layers are, its last layer, if it ends the plan, as a segment's last.
    """
    cost = 0.0
    for k, (a, b, how) in enumerate(segments):
        if how:
            cost += sum(c.seconds for c in costs[a:b])
        elif k == len(segments) - 1:
            cost += segment_recompute(costs, a, b)
        else:
            cost += sum(c.recompute_seconds() for c in costs[a:b])
    return cost


def plan_checkpoints(costs, budget, nested=True, after_bytes=0):
    """The plan that recomputes least with a predicted peak <= budget bytes.

    costs: a list of LayerCost (measure_layers). Among plans that recompute
    the same layers, the one with the lowest peak wins. nested: also weigh
    revolve's nested plans (recomputing some layers more than once), which
    reach lower peaks; False keeps to single-level plans. after_bytes: what
    the model saves behind the chain (see `predict`); it counts against the
    budget at the end of the forward, so a plan that stores the last layers
    may lose to one that checkpoints them. A budget below the smallest
    reachable peak is a ValueError that states the minimum; a budget that
    is not a number of bytes is a TypeError.
    """
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise TypeError(f"plan_checkpoints: budget must be a number of bytes, got {budget!r} "
                        f"({type(budget).__name__}); pass an int, e.g. 2 * 1024**3 for 2 GiB")
    if math.isnan(budget):
        raise ValueError("plan_checkpoints: budget is NaN; pass a number of bytes, e.g. 2 * 1024**3 for 2 GiB")
    if not costs:
        return Plan([], after_bytes, 0.0)
    candidates = []
    single = _best_plan(costs, budget, _cost_units(costs), after_bytes)
    if single is not None:
        candidates.append(Plan(single, *predict(costs, single, after_bytes)))
    if nested:
        candidates += [p for p in revolve_plans(costs, after_bytes) if p.peak_bytes <= budget]
    if not candidates:
        least = minimum_budget(costs, nested, after_bytes)
        raise ValueError(
            f"no checkpoint plan fits a budget of {budget} bytes ({memory.format_bytes(budget)}): "
            f"the smallest peak of saved activations any {'' if nested else 'single-level '}plan for "
            f"these {len(costs)} layers reaches is {least} bytes ({memory.format_bytes(least)}). "
            "Raise the budget, or use a smaller batch."
        )
    # Cheapest first; compared in rounded units, as the planner does, so that
    # plans recomputing the same layers tie and the lower peak wins.
    total = sum(c.seconds for c in costs) or 1.0
    return min(candidates, key=lambda p: (round(p.recompute_seconds / total * 1e9), p.peak_bytes))


def minimum_budget(costs, nested=True, after_bytes=0):
    """The smallest peak of saved activations any plan reaches (bytes); nested=False: single-level plans."""
    if not costs:
        return after_bytes
    least = predict(costs, _best_plan(costs, math.inf, [(0, 0)] * len(costs), after_bytes), after_bytes)[0]
    if nested:
        least = min([least] + [p.peak_bytes for p in revolve_plans(costs, after_bytes)])
    return least


# -- the single-level planner's dynamic programming ---------------------------------
def _cost_units(costs):
    """Recompute costs as integers (1e-9 of the forward's total), so sums of the same layers compare equal.

    Per layer: (inside a segment, as a segment's last layer).
    """
    total = sum(c.seconds for c in costs) or 1.0
    return [(round(c.recompute_seconds() / total * 1e9), round(c.recompute_seconds(last=True) / total * 1e9))
            for c in costs]


def _best_plan(costs, budget, units, after_bytes=0):
    """Segments minimising (recompute units, then peak) with peak <= budget, or None.

    Forward dynamic programming over positions 0..n. A state at position i is
    (P, C, M, segment, parent): bytes held by the segments so far, their
    recompute cost, the highest recompute peak so far; at the end, the peak
    is max(P + after_bytes, M). The future depends
    only on P, so a state is dropped when another has P no larger and
    (C, M) no larger in lexicographic order; what is left at each position is
    a staircase with at most one state per distinct P.
    """
    n = len(costs)
    held, cost = [0], [0]  # prefix sums: held bytes, recompute units inside a segment
    for c, (inside, _) in zip(costs, units):
        held.append(held[-1] + c.held_bytes)
        cost.append(cost[-1] + inside)
    states = [[] for _ in range(n + 1)]
    states[0] = [(0, 0, 0, None, None)]
    for i in range(n):
        first = costs[i]
        for state in _prune(states[i]):
            P, C, M = state[0], state[1], state[2]
            if P + first.held_bytes <= budget:  # store layer i
                states[i + 1].append((P + first.held_bytes, C, M, (i, i + 1, False), state))
            if P + first.input_bytes > budget:
                continue
            base = P + first.input_bytes - (first.input_bytes if first.saves_input else 0)
            for j in range(i + 1, n + 1):  # checkpoint layers[i:j]
                peak = base + held[j] - held[i]
                if peak > budget:
                    break  # longer segments only hold more
                peak += costs[j - 1].shared_output_bytes  # the recomputed last layer's output (see walk)
                if peak > budget:
                    continue
                recomputed = cost[j - 1] - cost[i] + units[j - 1][1]  # layers i..j-2, then the last
                states[j].append((P + first.input_bytes, C + recomputed, max(M, peak), (i, j, True), state))
    final = [s for s in _prune(states[n]) if max(s[0] + after_bytes, s[2]) <= budget]
    if not final:
        return None
    return _segments(min(final, key=lambda s: (s[1], max(s[0] + after_bytes, s[2]))))


def _prune(states):
    """The staircase: keep a state only if no state with P as small has (C, M) as small."""
    kept = []
    for s in sorted(states, key=lambda s: (s[0], s[1], s[2])):
        if not kept or (s[1], s[2]) < (kept[-1][1], kept[-1][2]):
            kept.append(s)
    return kept


def _segments(state):
    """Follow the parents back; merge neighbouring stored layers into one segment."""
    out = []
    while state[3] is not None:
        out.append(state[3])
        state = state[4]
    out.reverse()
    merged = []
    for a, b, c in out:
        if merged and not c and not merged[-1][2]:
            merged[-1] = (merged[-1][0], b, False)
        else:
            merged.append((a, b, c))
    return merged


# -- nested plans: revolve -----------------------------------------------------------
def revolve(n, slots):
    """Griewank's binomial schedule for n equal layers as a nested plan.

    slots: checkpoints that may be held at once besides the chain's input
    (0 <= slots). Peak: about (slots + 1) layer inputs and one layer's
    interior. Each plan level is: checkpoint the first k layers (recomputed
    later with this same plan, recursively), and go on with the rest, which
    holds one slot (its input) until its backward is done; k is chosen by
    `_revolve_table` to minimise the layers recomputed.
    """
    if n < 1 or slots < 0:
        raise ValueError(f"revolve needs at least one layer and slots >= 0, got n={n}, slots={slots}")
    return _revolve_segments(0, n, slots, _revolve_table(n, slots))


def revolve_recomputations(n, slots):
    """Layer forwards that revolve(n, slots) recomputes in backward (equal layers)."""
    return _revolve_table(n, slots)[n][slots][0]


def revolve_plans(costs, after_bytes=0):
    """revolve(n, slots) for every useful slot count, each priced with the measured costs.

    Each also with its last layer checkpointed instead of stored: one more
    layer recomputed, but its interior is no longer held at the end of the
    forward, where what the model saves behind the chain (after_bytes) joins it.
    """
    n = len(costs)
    most = max(n - 2, 0)  # with n - 2 slots every layer has its own checkpoint: none is recomputed twice
    table = _revolve_table(n, most)
    plans = []
    for slots in range(most + 1):
        segments = _revolve_segments(0, n, slots, table)
        last = segments[:-1] + [(n - 1, n, True)]
        plans += [Plan(s, *predict(costs, s, after_bytes)) for s in (segments, last)]
    return plans


def _revolve_table(n, slots):
    """table[t][m] = (layers recomputed, k) for t equal layers with m slots.

    t = 1: one layer, stored: nothing recomputed. Otherwise checkpoint the
    first k layers and go on with the other t - k:
      k = t - 1  the rest is one layer, stored (its interior holds its input):
                 (t - 1) + table[t - 1][m]
      k < t - 1  the rest keeps its input in a slot while it runs:
                 k + table[k][m] + table[t - k][m - 1]    (needs m >= 1)
    (the k layers are recomputed once, then backpropagated with the slots
    the rest has given back). A dynamic program over (layers, slots), the
    approach of Gruslys et al. 2016, "Memory-Efficient Backpropagation
    Through Time" (arXiv:1606.03401), which finds by dynamic programming the
    policy with the least recomputation for a memory budget.
    """
    table = [[(0, 0)] * (slots + 1) for _ in range(n + 1)]
    for t in range(2, n + 1):
        for m in range(slots + 1):
            best = ((t - 1) + table[t - 1][m][0], t - 1)
            if m >= 1:
                for k in range(1, t - 1):
                    cost = k + table[k][m][0] + table[t - k][m - 1][0]
                    if cost < best[0]:
                        best = (cost, k)
            table[t][m] = best
    return table


def _revolve_segments(start, stop, slots, table):
    """The segments of layers start..stop at one plan level (see revolve)."""
    segments = []
    while stop - start > 1:
        k = table[stop - start][slots][1]
        inner = _revolve_segments(start, start + k, slots, table)
        segments.append((start, start + k, inner if len(inner) > 1 else True))
        if stop - (start + k) > 1:
            slots -= 1  # the rest's input now holds a slot
        start += k
    segments.append((start, stop, False))  # the last layer, stored
    return segments
