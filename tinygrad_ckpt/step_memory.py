"""The memory of one GPT training step, predicted buffer by buffer, with no arrays allocated.

activations.py counts the bytes the model saves for backward. A training
step holds more than that: the parameters, AdamW's two moments, the
accumulation buffers, the gradients as backward makes them, and whatever is
in flight at each moment (a layer's output before the next op saves it, the
gradient travelling back through the graph, the logits). Its peak is where
all of these together are highest, which may be at the end of the forward,
inside some block's backward, inside a recompute, or at the optimizer step.

This module walks one step of `Trainer` (train.py) on nn/transformer.py's
GPT the way the engine runs it, but with arrays that are sizes only
(`_Array`: nbytes and, for a view, the array it looks into). Every place
where the engine makes an array that memory.py sees, this walk makes one of
the same size at the same moment, and drops it when the engine's would be
freed; and a private `memory.MemoryTracker` does the counting, the same
class that counts the real step. So the figures are memory.py's figures:
tests/test_fit.py runs the real step for many small configurations and finds
the peak, its split by category and the highest saved activations equal to
the byte.

The walk mirrors, in small, each part of the engine it stands for:

    _Tensor, _apply, _Ctx     tensor.py, function.py (Function.apply, save_for_backward)
    _Tape.backward, _deliver  tape.py (the reverse walk, pending sums, leaf .grad)
    _Linear, _LayerNorm, ...  ops/: what each forward saves and returns, what each
                              backward returns (a new array, a view, or its input)
    _SegmentTape, _Note,      checkpoint.py, recompute.py and policies.py: a segment's
    _Stash, _checkpoint       first run saves nothing (or what a policy keeps) and
                              notes each op; its record saves the input
    _RecomputeTape            the recompute, by recompute.make_plan's own plan of the
                              notes: ops run, replayed, rebuilt or skipped, and the
                              early stop
    _Model                    nn/transformer.py's GPT, line by line
    _train_step               Trainer.compute_loss, backward, accumulate, the optimizer step

The walk depends on how NumPy shares memory, which it states where it does:
a slice and a transpose are views; reshaping heads back together, (B, nh,
T, hs) -> (B, T, nh * hs) after a transpose, copies unless T, nh or hs is 1;
everything an op computes is a new array. CuPy's reshape follows the same
rule (a view where the strides allow one, else a copy).

Four things it adds to what memory.py measures:

  * a device bound (StepMemory.device_peak_bytes): memory.py sees an array
    once it becomes a Tensor or is saved. Each op also makes scratch arrays
    it frees inside itself (a GELU's pieces, LayerNorm's xhat, the
    cross-entropy's exp of the logits, AdamW's temporaries), and a backward
    makes its gradients before it hands them on (one added into a tied
    weight's .grad is never counted). Each op of the walk states these, from
    its code in ops/, and the bound is the highest of memory.py's count plus
    them. On the CPU it holds tracemalloc's peak, Python objects aside
    (tests/test_fit.py); on a GPU an allocator adds its rounding and cache.
  * copies: a run of identical blocks or segments is walked as three, and
    the others counted as copies of the second (`_run_segments`), exactly;
    so a step of GPT-2 XL's 48 blocks walks in a few tens of milliseconds.
  * every batch size from two walks (`StepProfile`): every array is
    a + b * batch bytes, so the bytes at each check are affine in the batch.
  * the recompute's FLOPs (StepMemory.recomputed_flops): each op of a block
    carries its forward FLOPs (ops/flops.py), counted when a recompute runs
    it; tests/test_fit.py checks them against the ops a real step ran.

What does not live here: the saved-activation formulas (activations.py), the
strategies and the table a user reads (fit.py), the measuring (memory.py).
"""

import math
import weakref
from array import array
from collections import namedtuple
from dataclasses import dataclass, field

import numpy

from . import memory, policies
from .ops.flops import op_flops
from .ops.nn import BLOCK_ELEMENTS
from .recompute import KEEP, REBUILD, RUN, make_plan
from .schedules import Plan, segment_bounds

INT64 = 8  # token ids, positions and clamped targets are int64 arrays
BOOL = 1  # dropout masks, the causal mask and the valid-target mask


# -- arrays and tensors, sizes only ------------------------------------------------
class _Array:
    """An array as memory.py sees it: its bytes, and the array it is a view of (or None)."""

    __slots__ = ("nbytes", "base", "__weakref__")

    def __init__(self, nbytes, base=None):
        self.nbytes = nbytes
        self.base = base


class _ParamArray(_Array):
    """A parameter's array. Parameters live through the whole step and are always counted as
    parameters (an op saving a weight does not change that), so the walk counts their bytes
    once, in bulk, and does not track them one by one."""

    __slots__ = ()


def _view(a, nbytes=None):
    """A view of a (a slice, transpose or reshape that shares its memory)."""
    return _Array(a.nbytes if nbytes is None else nbytes, a)


class _Ledger(memory.MemoryTracker):
    """memory.py's tracker, keeping more: each category's highest value, the state at every
    check (if asked), open regions' highest points, and the bytes of copies not walked."""

    def __init__(self, record=False):
        super().__init__()
        self.highest = dict(self.current)
        # the bytes at every peak check, one column per category (compact: a deep step has thousands)
        self.points = [array("q") for _ in memory.CATEGORIES] if record else None
        self.regions = []  # open _Regions, innermost last
        self.copies = dict.fromkeys(memory.CATEGORIES, 0)  # bytes held by copies of walked units
        self.device_peak = 0  # the highest of the checks and of `scratch` moments, plus `constant`
        self.scratch_points = array("q") if record else None  # every `scratch` moment's bytes (without `constant`)
        self.constant = 0  # bytes alive through the whole step that memory.py never sees

    def _update_peak(self):
        super()._update_peak()
        self._checked(self.current)

    def _checked(self, state):
        for c, v in state.items():
            if v > self.highest[c]:
                self.highest[c] = v
        for r in self.regions:
            r.checked(state)
        self.point(state)
        total = sum(state.values()) + self.constant
        if total > self.device_peak:
            self.device_peak = total

    def point(self, state):
        if self.points is not None:
            for column, c in zip(self.points, memory.CATEGORIES):
                column.append(state[c])

    def scratch(self, extra):
        """A moment inside an op: the counted bytes and `extra` bytes it holds that memory.py does not see."""
        value = self.total() + extra
        if value + self.constant > self.device_peak:
            self.device_peak = value + self.constant
        for r in self.regions:
            r.scratch(value)
        if self.scratch_points is not None:
            self.scratch_points.append(value)

    def repeat(self, region, times):
        """The walked unit `region` happens `times` more times, one after the other: check its
        highest point in the last of them (the first, if it loses bytes) and hold their bytes."""
        net = {c: self.current[c] - region.start[c] for c in memory.CATEGORIES}
        if region.best is not None:
            # A straight line of copies: the highest point is in the first or the last.
            for j in sorted({1, times}):
                state = {c: region.best[c] + j * net[c] for c in memory.CATEGORIES}
                total = sum(state.values())
                if total > self.peak_total:
                    self.peak_total, self.peak = total, state
                for r in self.regions:
                    r.checked(state)
                if self.points is not None:  # every check of the unit, shifted by j copies
                    for column, c in zip(self.points, memory.CATEGORIES):
                        column.extend([v + j * net[c] for v in column[region.first_point:region.last_point]])
            for c in memory.CATEGORIES:
                top = region.own[c] + max(0, times * net[c])
                self.highest[c] = max(self.highest[c], top)
                for r in self.regions:
                    r.own[c] = max(r.own[c], top)
        net_total = sum(net.values())
        if region.device_best is not None:
            for j in sorted({1, times}):
                value = region.device_best + j * net_total
                self.device_peak = max(self.device_peak, value + self.constant)
                for r in self.regions:
                    r.scratch(value)
                if self.scratch_points is not None:
                    self.scratch_points.extend(v + j * net_total for v in
                                               self.scratch_points[region.first_scratch:region.last_scratch])
        for c in memory.CATEGORIES:
            self.current[c] += times * net[c]
            self.copies[c] += times * net[c]


class _Region:
    """The checks between open() and close(): the highest one (first of equals), each category's highest."""

    def __init__(self, ledger):
        self.ledger, self.start = ledger, dict(ledger.current)
        self.best, self.best_total, self.own = None, -1, dict(ledger.current)
        self.device_best = None
        self.first_point = self.last_point = len(ledger.points[0]) if ledger.points is not None else 0
        self.first_scratch = self.last_scratch = len(ledger.scratch_points) if ledger.scratch_points is not None else 0
        ledger.regions.append(self)

    def checked(self, state):
        total = sum(state.values())
        if total > self.best_total:
            self.best, self.best_total = dict(state), total
        for c, v in state.items():
            if v > self.own[c]:
                self.own[c] = v
        self.scratch(total)

    def scratch(self, value):
        if self.device_best is None or value > self.device_best:
            self.device_best = value

    def close(self):
        self.ledger.regions.remove(self)
        if self.ledger.points is not None:
            self.last_point = len(self.ledger.points[0])
            self.last_scratch = len(self.ledger.scratch_points)


class _Tensor:
    """tensor.Tensor: its array is tracked when it is made; .grad; the record that made it."""

    __slots__ = ("data", "requires_grad", "node", "grad", "__weakref__")

    def __init__(self, data, requires_grad=False):
        _walk.ledger.track(data)
        self.data, self.requires_grad, self.node, self.grad = data, requires_grad, None, None

    @classmethod
    def parameter(cls, data):
        """An nn.Parameter (counted in bulk by _train_step, not tracked here)."""
        t = cls.__new__(cls)
        t.data, t.requires_grad, t.node, t.grad = data, True, None, None
        return t

    @property
    def nbytes(self):
        return self.data.nbytes


class _Ctx:
    """function.Context: save_for_backward holds arrays as activations; free() lets them go."""

    counted = True  # False in a segment's first forward: what an op saves is noted, not counted
    computed = True  # False for an op a recompute did not run (placeholders, or a policy's replay)

    def __init__(self, needs_input_grad):
        self.needs_input_grad = needs_input_grad
        self.saved = ()

    def save_for_backward(self, *arrays):
        if not any(self.needs_input_grad):
            return
        if self.counted:
            for a in arrays:
                if a is not None and not isinstance(a, _ParamArray):  # a saved weight stays "parameters"
                    _walk.ledger.track(a, "activations")
        self.saved = arrays

    def free(self):
        if self.counted:
            for a in self.saved:
                if a is not None and not isinstance(a, _ParamArray):
                    _walk.ledger.release(a, "activations")
        self.saved = None

    def __del__(self):
        if self.saved:
            self.free()


_CTX_OWN = ("needs_input_grad", "saved", "counted", "computed")  # the rest of a ctx: its forward's facts


class _Node:
    """tape.Node: the op, its ctx, where its inputs' gradients go, its outputs' count."""

    __slots__ = ("op", "ctx", "edges", "n_out", "run", "__weakref__")

    def __init__(self, op, ctx, inputs, outputs):
        self.op, self.ctx, self.n_out, self.run = op, ctx, len(outputs), None
        self.edges = tuple(_edge(t) for t in inputs)
        for i, t in enumerate(outputs):
            t.node = (self, i)


def _edge(t):
    """Where t's gradient goes: (record, output index), or (None, leaf), or (None, None)."""
    if t.node is not None:
        return t.node
    return (None, t if t.requires_grad else None)


# -- tapes --------------------------------------------------------------------------
class _Tape:
    """tape.Tape: records in forward order; backward walks them in reverse (tape.py)."""

    def __init__(self):
        self.records = []

    def run(self, op, ctx, arrays, options):
        return op.forward(ctx, *arrays, **options)

    def append(self, node, inputs=()):
        self.records.append(weakref.ref(node))

    def backward(self, edges, grads):
        """tape.Tape.backward from gradient edges (or tensors), one gradient array each."""
        pending, seen = {}, weakref.WeakSet(grads)
        for e, g in zip(edges, grads):
            _deliver(e if isinstance(e, tuple) else _edge(e), g, pending, seen)
        edges = None
        run = region = None  # the repeated unit whose records are being walked, and its region
        for ref in reversed(self.records):
            node = ref()
            if node is None:
                continue
            if node.run is not run:
                if region is not None:
                    region.close()
                    _walk.ledger.repeat(region, run.times)
                run, region = node.run, (_Region(_walk.ledger) if node.run is not None else None)
            out_grads = [pending.pop((node, i), None) for i in range(node.n_out)]
            if all(g is None for g in out_grads):
                continue
            copies = _walk.copies
            if node.run is not None:  # a record of the unit standing for run.times more
                _walk.copies = copies * (node.run.times + 1)
            in_grads = node.op.backward(node.ctx, *out_grads)
            _walk.copies = copies
            # The new gradient arrays exist now, with the saved ones and the op's scratch: memory.py
            # sees each only once it is delivered (and a copy, a sum or an added one never).
            ledger = _walk.ledger
            made = {id(g): g.nbytes for g in in_grads
                    if g is not None and g.base is None and id(g) not in ledger.buffers}
            unseen = sum(made.values())
            ledger.scratch(unseen + node.op.scratch_backward(node.ctx))
            node.ctx.free()
            for edge, g in zip(node.edges, in_grads):
                if g is not None and (edge[0] is not None or edge[1] is not None):
                    if _deliver(edge, g, pending, seen, unseen) and id(g) in made:
                        unseen -= made.pop(id(g))
                    ledger.scratch(unseen)
            out_grads = in_grads = g = made = None
            node.edges = ()
        if region is not None:
            region.close()
            _walk.ledger.repeat(region, run.times)
        self.records = []


def _deliver(edge, g, pending, seen, unseen=0):
    """tape._deliver: into a leaf's .grad (a copy if g is a view or was placed), or a pending sum.

    Returns whether g itself is now held (and counted), not a copy or a sum of it. unseen: the
    bytes of this record's gradients not counted yet (g among them, if it is new)."""
    record, leaf = edge
    if record is None:
        adopted = False
        if leaf.grad is None:
            owned = g if (g.base is None and g not in seen) else _Array(g.nbytes)
            leaf.grad = _Tensor(owned)
            _walk.ledger.track(owned, "gradients")
            adopted = owned is g
        # else: leaf.grad += g, in place
        seen.add(g)
        return adopted
    entry = pending.get(edge)
    total = g if entry is None else _Array(g.nbytes)  # entry + g: a new array
    _walk.ledger.track(total)
    if entry is not None:
        _walk.ledger.scratch(unseen)  # entry, the sum and g, all at once, until the entry goes
    pending[edge] = total
    seen.add(total)
    return total is g


class _Note:
    """recompute.OpNote, sizes only: one op of a segment's forward, as recompute.make_plan reads it.

    inputs: per input array its origin (("op", j, k), ("input", 0), ("outer", c), or None for a
    constant the code makes); saved: per saved array ("input", i), ("option", key), ("output", k)
    or ("new",); facts: what the op's forward left on its ctx for backward (sizes, flags).
    """

    __slots__ = ("op", "name", "inputs", "saved", "needs_input_grad", "node", "kept", "facts", "out_nbytes", "multiple")

    def __init__(self, op, ctx, arrays, options, outs, multiple, origins, kept):
        self.op, self.name, self.inputs, self.kept = op, op.name, origins, kept
        self.saved = [None if a is None else policies.where_in_call(a, arrays, options, outs) or ("new",) for a in ctx.saved]
        self.needs_input_grad = tuple(ctx.needs_input_grad)
        self.node = None  # True once the op made a record (make_plan asks whether it did)
        self.facts = {k: v for k, v in vars(ctx).items() if k not in _CTX_OWN}
        self.out_nbytes, self.multiple = [o.nbytes for o in outs], multiple

    @property
    def nested(self):
        return self.op is _Checkpoint


class _SegmentTape(_Tape):
    """recompute.SegmentTape: a segment's first forward; nothing saved (but what a policy keeps),
    no record kept, and a note per op."""

    def __init__(self, segment, x):
        super().__init__()
        self.segment, self.input = segment, x
        self.notes, self.outer = [], []  # the notes; the tensors from outside that need a gradient
        self.produced = {}  # id(output array) -> (op index, output index, a weak reference to it)

    def origin(self, a):
        made = self.produced.get(id(a))
        if made is not None and made[2]() is a:
            return ("op", made[0], made[1])
        return ("input", 0) if a is self.input.data else None

    def run(self, op, ctx, arrays, options):
        stash = self.segment.stash
        keeps = stash is not None and op is not _Checkpoint and stash.decide(op) == policies.SAVE
        ctx.counted = False  # noted, not kept
        out = op.forward(ctx, *arrays, **options)
        outs = out if isinstance(out, tuple) else (out,)
        kept = stash.keep_op(ctx, arrays, options, outs, isinstance(out, tuple)) if keeps else None
        note = _Note(op, ctx, arrays, options, outs, isinstance(out, tuple), [self.origin(a) for a in arrays], kept)
        ctx.saved = ()
        for k, o in enumerate(outs):
            self.produced[id(o)] = (len(self.notes), k, weakref.ref(o))
        self.notes.append(note)
        return out

    def append(self, node, inputs):
        note = self.notes[-1]
        note.node = True
        for i, t in enumerate(inputs):
            if t.requires_grad and t.node is None and t is not self.input:  # a parameter
                if t not in self.outer:
                    self.outer.append(t)
                note.inputs[i] = ("outer", self.outer.index(t))
        node.edges = ()  # no record is kept


class _Stash:
    """policies.Stash: the outputs and saved arrays of the ops the segment's policy keeps."""

    def __init__(self, policy):
        self.policy, self.arrays = policy, []

    def decide(self, op):
        decision = policies.decide(self.policy, op.name)
        if decision not in (policies.SAVE, policies.RECOMPUTE):
            raise ValueError(f"step_memory models the policies 'save' and 'recompute', not {decision!r} (op {op.name})")
        return decision

    def keep_op(self, ctx, arrays, options, outs, multiple):
        """policies._Kept: references to what the op made and saved (an input is noted, not kept)."""
        kept_out = [self.keep(o) for o in outs]
        kept_saved = [None if a is None else policies.where_in_call(a, arrays, options, outs) or self.keep(a) for a in ctx.saved]
        facts = {k: v for k, v in vars(ctx).items() if k not in _CTX_OWN}
        return _Kept(kept_out, kept_saved, multiple, facts)

    def keep(self, a):
        for k, b in enumerate(self.arrays):
            if b is a:
                return ("stash", k)
        _walk.ledger.track(a, "activations")
        self.arrays.append(a)
        return ("stash", len(self.arrays) - 1)

    def hand_over(self):
        arrays, self.arrays = self.arrays, None
        for a in arrays:
            _walk.ledger.release(a, "activations")
        return tuple(arrays)


_Kept = namedtuple("_Kept", "outputs saved multiple facts")  # policies._Kept: references into the stash


def _replay(kept, ctx, input_array, options, stashed):
    """policies._Kept.replay: a kept op's outputs and saved arrays, from the stash; nothing runs."""
    outs = [stashed[r[1]] for r in kept.outputs]
    ctx.__dict__.update(kept.facts)
    ctx.save_for_backward(*(None if r is None else _resolve(r, input_array, options, outs, stashed)
                            for r in kept.saved))
    ctx.computed = False
    return tuple(outs) if kept.multiple else outs[0]


def _resolve(ref, input_array, options, outs, stashed):
    kind, key = ref
    if kind == "input":
        return input_array(key)
    return {"option": options, "output": outs, "stash": stashed}[kind][key]


class _Stop(BaseException):
    """recompute.StopRecompute: the recompute has run every op it must."""


class _RecomputeTape(_Tape):
    """recompute.RecomputeTape: runs the segment's code again as its plan says (recompute.make_plan).

    Up to the plan's stop, an op is RUN, replayed from the stash (KEEP), or, not run, hands on
    placeholders (each a 0-d array of the model's dtype, which memory.py counts) with its record
    REBUILT from its note (saving its inputs) or SKIPPED. At the op after the stop it raises _Stop;
    `finish` then rebuilds the records after the stop from the notes, with the outputs held for them.
    """

    def __init__(self, segment, inputs, stashed):
        super().__init__()
        self.segment, self.notes, self.plan = segment, segment.notes, segment.plan
        self.inputs, self.stashed = inputs, stashed
        self.position = 0
        self.by_position = {}  # op index -> its record here
        self.held = {}  # (op index, output index) -> an array a record rebuilt after the stop needs

    def run(self, op, ctx, arrays, options):
        j = self.position
        if j > self.plan.stop:
            raise _Stop
        self.position += 1
        note, action = self.notes[j], self.plan.actions[j]
        if action == RUN:
            out = op.forward(ctx, *arrays, **options)
        elif action == KEEP:
            out = _replay(note.kept, ctx, lambda i: arrays[i], options, self.stashed)
        else:
            if action == REBUILD:
                ctx.__dict__.update(note.facts)
                ctx.save_for_backward(*(None if r is None else _resolve(r, lambda i: arrays[i], options, (), ())
                                        for r in note.saved))
            else:  # SKIP: no backward reaches it
                ctx.needs_input_grad = (False,) * len(arrays)
            # tape.placeholder: a broadcast view of one 0-d array of the model's dtype
            outs = tuple(_view(_Array(_walk.itemsize), n) for n in note.out_nbytes)
            out = outs if note.multiple else outs[0]
            ctx.computed = False
        for k in self.plan.hold.get(j, ()):
            self.held[(j, k)] = (out if isinstance(out, tuple) else (out,))[k]
        return out

    def append(self, node, inputs):
        super().append(node, inputs)
        self.by_position[self.position - 1] = node

    def finish(self):
        """Rebuild the records after the stop (their arrays: the held outputs, inputs, parameters)."""
        for j in self.plan.rebuilt:
            note = self.notes[j]
            ctx = _Ctx(note.needs_input_grad)
            if self.plan.actions[j] == KEEP:
                _replay(note.kept, ctx, lambda i, note=note: self.value(note.inputs[i]), {}, self.stashed)
            else:
                ctx.__dict__.update(note.facts)
                ctx.save_for_backward(*(None if r is None else self.value(note.inputs[r[1]]) for r in note.saved))
            node = _Node(note.op, ctx, (), ())
            node.edges = tuple(self.edge(o) if needs else (None, None)
                               for needs, o in zip(note.needs_input_grad, note.inputs))
            node.n_out = len(note.out_nbytes)
            _Tape.append(self, node)
            self.by_position[j] = node
        self.held = {}

    def value(self, origin):
        """The array a value of this origin has in the recompute, for a record rebuilt after the stop."""
        if origin[0] == "op":
            j, k = origin[1], origin[2]
            if self.plan.actions[j] == KEEP:
                return self.stashed[self.notes[j].kept.outputs[k][1]]
            return self.held[(j, k)]
        if origin[0] == "input":
            return self.inputs[0].data
        return self.segment.outer[origin[1]].data

    def edge(self, origin):
        """Where a gradient for a value of this origin goes, in the recompute."""
        if origin is None:
            return (None, None)
        if origin[0] == "op":
            return (self.by_position[origin[1]], origin[2])
        if origin[0] == "input":
            return _edge(self.inputs[0])
        return (None, self.segment.outer[origin[1]])

    def output_edges(self):
        """The segment output's gradient edge; then the tape lets go of all but its records."""
        edges = [self.edge(origin) for origin, requires_grad in self.segment.out_origins if requires_grad]
        self.by_position = self.inputs = self.stashed = None
        return edges


class _Walk:
    """The state of one walk: its ledger, and the stack of active tapes (None: no_grad)."""

    ledger = None
    tapes = None
    runs = []  # the repeated units being walked, innermost last
    stretch = True  # walk a run of identical units as three, and count the rest as copies
    device = "cpu"  # where the arrays live: "cpu" (NumPy) or "cuda" (CuPy); decides some scratch
    itemsize = 4
    recomputing = 0  # how many recomputes are running (nested ones count again)
    copies = 1  # how many units the records being walked back stand for (see _run_segments)
    recomputed_flops = 0  # FLOPs of the ops the recomputes ran, copies counted


_walk = _Walk()


def _apply(op, *inputs, flops=0, **options):
    """function.Function.apply: run forward on the active tape, wrap outputs, record if needed.

    flops: the op's forward FLOPs, added to the walk's count if it runs inside a recompute."""
    active = _walk.tapes[-1]
    needs = tuple(t.requires_grad for t in inputs) if active is not None else ()
    ctx = _Ctx(needs)
    arrays = [t.data for t in inputs]
    out = active.run(op, ctx, arrays, options) if active is not None else op.forward(ctx, *arrays, **options)
    outs = out if isinstance(out, tuple) else (out,)
    if ctx.computed:  # the op ran: its outputs exist, not yet counted, and its scratch
        if _walk.recomputing:
            _walk.recomputed_flops += flops * _walk.copies
        ledger = _walk.ledger
        made = sum(o.nbytes for o in outs if o.base is None and id(o) not in ledger.buffers)
        extra = made + op.scratch_forward(ctx, arrays)
        if extra:
            ledger.scratch(extra)
    requires_grad = any(needs)
    tensors = tuple(_Tensor(o, requires_grad) for o in outs)
    if requires_grad:
        node = _Node(op, ctx, inputs, tensors)
        node.run = next((r for r in reversed(_walk.runs) if r.tape is active), None)
        active.append(node, inputs)
    return tensors if isinstance(out, tuple) else tensors[0]


# -- the ops: what each forward saves and makes, what each backward returns -----------
# `new` arrays are new memory; a view shares its input's. Sizes in bytes.
class _Op:
    """An op of the walk. Besides its forward and backward, what each holds that memory.py does not
    see: scratch arrays made and freed inside it (bytes, an upper bound from the op's code in ops/)."""

    name = "Op"

    @staticmethod
    def scratch_forward(ctx, arrays):
        return 0

    @staticmethod
    def scratch_backward(ctx):
        return 0


class _Add(_Op):
    """ops.elementwise.Add: saves nothing; dx = g (the same array) where no broadcast is undone."""

    name = "Add"

    @staticmethod
    def forward(ctx, a, b, out_nbytes, b_broadcast=False):
        ctx.b_broadcast, ctx.b_nbytes = b_broadcast, b.nbytes  # a broadcast b's gradient is summed back: new
        return _Array(out_nbytes)

    @staticmethod
    def backward(ctx, g):
        return g, (_Array(ctx.b_nbytes) if ctx.b_broadcast else g)


class _Mul(_Op):
    """ops.elementwise.Mul by a constant: saves the constant; dx = g * b, new."""

    name = "Mul"

    @staticmethod
    def forward(ctx, a, b):
        need_a, need_b = ctx.needs_input_grad or (False, False)
        ctx.save_for_backward(a if need_b else None, b if need_a else None)
        return _Array(a.nbytes)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved
        return (_Array(g.nbytes) if b is not None else None), (_Array(b.nbytes) if a is not None else None)


class _Where(_Op):
    """ops.elementwise.Where (masked_fill): saves the condition; the gradient of b is new."""

    name = "Where"

    @staticmethod
    def forward(ctx, a, b, condition):
        ctx.needs = ctx.needs_input_grad
        ctx.save_for_backward(condition)
        return _Array(b.nbytes)

    @staticmethod
    def backward(ctx, g):
        return (_Array(g.nbytes) if ctx.needs[0] else None), (_Array(g.nbytes) if ctx.needs[1] else None)


class _GELU(_Op):
    name = "GELU"

    @staticmethod
    def forward(ctx, x):
        ctx.x_nbytes = x.nbytes
        ctx.save_for_backward(x)
        return _Array(x.nbytes)

    @staticmethod
    def backward(ctx, g):
        return (_Array(g.nbytes),)

    @staticmethod
    def scratch_backward(ctx):
        # two scratch arrays: pieces of 2**15 elements on the CPU, the whole of x on a GPU
        if _walk.device == "cpu":
            return 2 * min(ctx.x_nbytes, (1 << 15) * _walk.itemsize)
        return 2 * ctx.x_nbytes


class _Dropout(_Op):
    """ops.nn.Dropout: saves the boolean mask; dx = g * mask, new."""

    name = "Dropout"

    @staticmethod
    def forward(ctx, x, keep, p):
        ctx.keep_nbytes = keep.nbytes
        ctx.save_for_backward(keep)
        return _Array(x.nbytes)

    @staticmethod
    def backward(ctx, g):
        return (_Array(g.nbytes),)

    @staticmethod
    def scratch_forward(ctx, arrays):
        # the mask, if nothing saved it; on the CPU also the float32 draws it came from
        # (F.dropout draws on the host: on a GPU they are host memory)
        unsaved = 0 if ctx.saved else ctx.keep_nbytes
        return unsaved + (4 * ctx.keep_nbytes if _walk.device == "cpu" else 0)


class _Softmax(_Op):
    """ops.nn.Softmax: saves its output."""

    name = "Softmax"

    @staticmethod
    def forward(ctx, x, rows_nbytes):
        ctx.x_nbytes, ctx.rows_nbytes = x.nbytes, rows_nbytes
        out = _Array(x.nbytes)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        return (_Array(g.nbytes),)

    @staticmethod
    def scratch_forward(ctx, arrays):
        return 2 * ctx.rows_nbytes  # the row maxima and sums

    @staticmethod
    def scratch_backward(ctx):
        # the row sums of g * out (an einsum: on a GPU CuPy's may make the products too)
        return ctx.rows_nbytes + (ctx.x_nbytes if _walk.device != "cpu" else 0)


class _LayerNorm(_Op):
    """ops.nn.LayerNorm: saves x, weight, and mean and rstd per row; dx, dweight, dbias new."""

    name = "LayerNorm"

    @staticmethod
    def forward(ctx, x, weight, bias, rows_nbytes):
        ctx.w_nbytes, ctx.x_nbytes, ctx.rows_nbytes = weight.nbytes, x.nbytes, rows_nbytes
        ctx.save_for_backward(x, weight, _Array(rows_nbytes), _Array(rows_nbytes))
        return _Array(x.nbytes)

    @staticmethod
    def backward(ctx, g):
        return _Array(g.nbytes), _Array(ctx.w_nbytes), _Array(ctx.w_nbytes)

    @staticmethod
    def scratch_forward(ctx, arrays):
        # the variance and its square root per row; CuPy's einsum may also make the product x * x
        return 2 * ctx.rows_nbytes + (ctx.x_nbytes if _walk.device != "cpu" else 0)

    @staticmethod
    def scratch_backward(ctx):
        # xhat, two per-row means; on a GPU, einsum's products (two)
        return ctx.x_nbytes + 2 * ctx.rows_nbytes + (2 * ctx.x_nbytes if _walk.device != "cpu" else 0)


class _Linear(_Op):
    """ops.matmul.Linear: saves x (for dweight) and weight (for dx); dx, dweight, dbias new."""

    name = "Linear"

    @staticmethod
    def forward(ctx, x, weight, bias=None, out_nbytes=0):
        need = ctx.needs_input_grad or (False, False)
        ctx.has_bias, ctx.x_nbytes, ctx.w_nbytes = bias is not None, x.nbytes, weight.nbytes
        ctx.b_nbytes = bias.nbytes if bias is not None else 0
        ctx.save_for_backward(x if need[1] else None, weight if need[0] else None)
        return _Array(out_nbytes)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved
        dx = _Array(ctx.x_nbytes) if weight is not None else None
        dweight = _Array(ctx.w_nbytes) if x is not None else None
        if not ctx.has_bias:
            return dx, dweight
        return dx, dweight, (_Array(ctx.b_nbytes) if ctx.needs_input_grad[2] else None)


class _MatMul(_Op):
    """ops.matmul.MatMul: saves a if b needs a gradient and b if a does; da, db new."""

    name = "MatMul"

    @staticmethod
    def forward(ctx, a, b, out_nbytes):
        need_a, need_b = ctx.needs_input_grad or (False, False)
        ctx.a_nbytes, ctx.b_nbytes = a.nbytes, b.nbytes
        ctx.save_for_backward(a if need_b else None, b if need_a else None)
        return _Array(out_nbytes)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved
        return (_Array(ctx.a_nbytes) if b is not None else None), (_Array(ctx.b_nbytes) if a is not None else None)

    # CuPy's batched matmul may copy operands that are not contiguous (q, k and v are views into
    # qkv; a gradient may be a transposed view): counted on a GPU, as a bound.
    @staticmethod
    def scratch_forward(ctx, arrays):
        return 0 if _walk.device == "cpu" else sum(a.nbytes for a in arrays)

    @staticmethod
    def scratch_backward(ctx):
        return 0 if _walk.device == "cpu" else ctx.a_nbytes + ctx.b_nbytes


class _Reshape(_Op):
    """ops.movement.Reshape: a view, or a copy where the axes cannot be merged in place."""

    name = "Reshape"

    @staticmethod
    def forward(ctx, x, copies=False, back_copies=False):
        ctx.back_copies = back_copies
        return _Array(x.nbytes) if copies else _view(x)

    @staticmethod
    def backward(ctx, g):
        return (_Array(g.nbytes) if ctx.back_copies else _view(g)),


class _Permute(_Op):
    """ops.movement.Permute: a view both ways."""

    name = "Permute"

    @staticmethod
    def forward(ctx, x):
        return _view(x)

    @staticmethod
    def backward(ctx, g):
        return (_view(g),)


class _GetItem(_Op):
    """ops.movement.GetItem: a slice is a view and saves nothing; a lookup by index saves the index.

    Backward: zeros of the input's shape with g added in: new.
    """

    name = "GetItem"

    @staticmethod
    def forward(ctx, x, index=None, out_nbytes=None):
        ctx.x_nbytes = x.nbytes
        if index is None:  # a basic slice: a view
            return _view(x, out_nbytes)
        ctx.save_for_backward(index)
        return _Array(out_nbytes)

    @staticmethod
    def backward(ctx, g):
        return (_Array(ctx.x_nbytes),)


class _Split(_Op):
    """ops.movement.Split: views of equal pieces; saves nothing; dx = the pieces' gradients
    concatenated, new."""

    name = "Split"

    @staticmethod
    def forward(ctx, x, pieces):
        ctx.x_nbytes = x.nbytes
        return tuple(_view(x, x.nbytes // pieces) for _ in range(pieces))

    @staticmethod
    def backward(ctx, *grads):
        return (_Array(ctx.x_nbytes),)


class _CrossEntropy(_Op):
    """ops.nn.CrossEntropy: saves log-probabilities (N, V), clamped targets and the valid mask."""

    name = "CrossEntropy"

    @staticmethod
    def forward(ctx, logits, n_rows, itemsize):
        ctx.logits_nbytes, ctx.n_rows, ctx.f = logits.nbytes, n_rows, itemsize
        ctx.save_for_backward(_Array(logits.nbytes), _Array(INT64 * n_rows), _Array(BOOL * n_rows))
        return _Array(itemsize)  # the loss, a 0-d array

    @staticmethod
    def backward(ctx, g):
        return (_Array(ctx.logits_nbytes),)

    @staticmethod
    def scratch_forward(ctx, arrays):
        # exp of a block of rows of logp (ops/nn.py: all of them at once on a GPU), and its row sums;
        # row maxima, log-sum-exps and the picked values; on a GPU the targets' copy
        n = ctx.n_rows
        classes = ctx.logits_nbytes // (n * ctx.f)
        rows = min(n, max(1, BLOCK_ELEMENTS // max(classes, 1))) if _walk.device == "cpu" else n
        exps = rows * classes * ctx.f + rows * ctx.f
        return exps + 4 * n * ctx.f + (INT64 * n if _walk.device != "cpu" else 0)

    @staticmethod
    def scratch_backward(ctx):
        return INT64 * ctx.n_rows + 2 * ctx.n_rows * ctx.f  # arange(N), valid * scale


class _Checkpoint(_Op):
    """checkpoint.Checkpoint: saves the segment's input (and what its policy kept)."""

    name = "Checkpoint"

    @staticmethod
    def forward(ctx, x, segment, outputs):
        ctx.segment = segment
        ctx.save_for_backward(x, *segment.stash_arrays())
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        segment = ctx.segment
        saved = ctx.saved
        inputs = [_Tensor(saved[0], requires_grad=segment.input_requires_grad)]  # the stand-in
        fresh = _RecomputeTape(segment, inputs, saved[1:])
        if segment.plan.stop >= 0:  # else nothing need run again: the segment is not called
            _walk.tapes.append(fresh)
            _walk.recomputing += 1
            try:
                segment.fn(*inputs)
            except _Stop:
                pass
            finally:
                _walk.tapes.pop()
                _walk.recomputing -= 1
        fresh.finish()
        pairs = [(e, g) for e, g in zip(fresh.output_edges(), grads) if e != (None, None)]
        if pairs:
            fresh.backward([e for e, _ in pairs], [g for _, g in pairs])
        pairs = None
        in_grads = []
        for t in inputs:
            g = t.grad.data if t.requires_grad and t.grad is not None else None
            if g is not None:
                _walk.ledger.release(g, "gradients")
            in_grads.append(g)
        return tuple(in_grads)


class _Segment:
    """checkpoint._Segment, for one tensor input and one output: its forward's notes and plan."""

    def __init__(self, fn, policy):
        self.fn = fn
        self.stash = _Stash(policy) if policy is not None else None
        self.input_requires_grad = False
        self.input = self.notes = self.out_origins = self.outer = self.plan = None

    def stash_arrays(self):
        return self.stash.hand_over() if self.stash is not None else ()


def _checkpoint(fn, x, policy):
    """checkpoint.checkpoint(fn, x, policy=...) for a one-tensor segment."""
    if _walk.tapes[-1] is None:
        return fn(x)
    segment = _Segment(fn, policy)
    segment.input = x  # as checkpoint._Segment.inputs: held until the record goes
    segment.input_requires_grad = x.requires_grad
    watch = _SegmentTape(segment, x)
    _walk.tapes.append(watch)
    try:
        out = fn(x)
    finally:
        _walk.tapes.pop()
    segment.notes, segment.outer = watch.notes, watch.outer
    segment.out_origins = [(watch.origin(out.data), out.requires_grad)]
    segment.plan = make_plan(segment.notes, segment.out_origins)  # recompute.py's plan, on the walk's notes
    watch = None
    if not x.requires_grad:
        return _Tensor(out.data)  # cut from the segment's (discarded) records
    return _apply(_Checkpoint, x, segment=segment, outputs=out.data)


def _run_segments(functions, segments, x, policy):
    """checkpoint._run_segments: stored segments run inline, checkpointed ones through _checkpoint.

    A stored segment is walked layer by layer (the same ops, in the same
    order). A run of m >= 4 identical units (a unit: one or two consecutive
    segments, alike in length, layers and plan) is walked three times, the
    first, the second and the last; the other m - 3 are counted as copies of
    the second (`_Ledger.repeat`), in the forward here and in the backward
    when the tape reaches the second unit's records. The second unit has a
    unit like it on either side, as every copy has, so each copy holds and
    frees the same bytes at the same moments: this is exact, and tests
    check it against walking every copy.
    """
    pieces = []
    for start, stop, how in segments:
        pieces += [(start, stop, how)] if how else [(i, i + 1, False) for i in range(start, stop)]
    signatures = [_signature(functions, piece) for piece in pieces]
    active = _walk.tapes[-1]
    # Only on the outer tape: inside a segment every op is noted and planned (recompute.make_plan),
    # and its recompute runs them by position, so each is walked.
    stretch = _walk.stretch and not isinstance(active, (_SegmentTape, _RecomputeTape))
    for first, p, m in _runs(signatures):
        if m < 4 or not stretch:
            for piece in pieces[first:first + p * m]:
                x = _run_piece(functions, piece, x, policy)
            continue
        for piece in pieces[first:first + p]:  # the first unit: its input comes from before the run
            x = _run_piece(functions, piece, x, policy)
        _walk.runs.append(_Run(m - 3, _walk.tapes[-1]))
        region = _Region(_walk.ledger)
        try:  # the second unit, between two like it: standing for m - 2 of them
            for piece in pieces[first + p:first + 2 * p]:
                x = _run_piece(functions, piece, x, policy)
        finally:
            _walk.runs.pop()
        region.close()
        _walk.ledger.repeat(region, m - 3)
        for piece in pieces[first + (m - 1) * p:first + m * p]:  # the last: its gradient comes from after the run
            x = _run_piece(functions, piece, x, policy)
    return x


def _run_piece(functions, segment, x, policy):
    start, stop, how = segment
    run = _Chain(functions, start, stop, how if isinstance(how, list) else None)
    return _checkpoint(run, x, policy) if how else run(x)


class _Run:
    """A unit walked a second time, standing for `times` more copies; its records are on `tape`."""

    def __init__(self, times, tape):
        self.times, self.tape = times, tape


def _signature(functions, segment):
    """What makes two segments walk alike: their layers' kinds and their plan, relative to their start."""
    start, stop, how = segment
    return tuple(f.kind for f in functions[start:stop]), _relative(how, start)


def _relative(how, start):
    if not isinstance(how, list):
        return bool(how)
    return tuple((a - start, b - start, _relative(h, start)) for a, b, h in how)


def _runs(signatures):
    """[(first index, unit length p, repeats m)]: the list cut into runs of a repeated unit of 1 or 2."""
    out, i, n = [], 0, len(signatures)
    while i < n:
        best_p, best_m = 1, 1
        for p in (1, 2):
            m = 1
            while i + (m + 1) * p <= n and signatures[i + m * p:i + (m + 1) * p] == signatures[i:i + p]:
                m += 1
            if m >= 3 and p * m > best_p * best_m:
                best_p, best_m = p, m
        out.append((i, best_p, best_m))
        i += best_p * best_m
    return out


class _Chain:
    """checkpoint._Chain: functions[start:stop] in turn, or by an inner (nested) plan."""

    def __init__(self, functions, start, stop, inner=None):
        self.functions, self.start, self.stop, self.inner = functions, start, stop, inner

    def __call__(self, x):
        if self.inner is not None:
            return _run_segments(self.functions, self.inner, x, None)
        if self.stop - self.start == 1:
            return self.functions[self.start](x)
        return _run_segments(self.functions, [(self.start, self.stop, False)], x, None)


class _Layer:
    """One function of the chain GPT.checkpoint_chain() gives: a block, or half of one."""

    __slots__ = ("fn", "kind")

    def __init__(self, fn, kind):
        self.fn, self.kind = fn, kind

    def __call__(self, x):
        return self.fn(x)


# -- the GPT, as nn/transformer.py runs it ---------------------------------------------
class _Model:
    """GPT's forward on size-only tensors (nn/transformer.py, layers.py, functional.py)."""

    def __init__(self, config, batch, seq_len, itemsize, segments, policy, split_blocks):
        c = config
        self.B, self.T, self.C, self.nh, self.V = batch, seq_len, c.n_embd, c.n_head, c.vocab_size
        self.hs = c.n_embd // c.n_head
        self.f, self.bias, self.dropout = itemsize, c.bias, c.dropout > 0
        self.n_layer, self.segments, self.policy, self.split = c.n_layer, segments, policy, split_blocks
        # Reshaping (B, T, nh, hs) back to (B, T, C) copies unless an axis of the pair is 1 (NumPy's rule).
        self.heads_copy = seq_len > 1 and self.nh > 1 and self.hs > 1
        self.params = _parameters(c, itemsize)
        self.p = {name: _Tensor.parameter(_ParamArray(nbytes)) for name, nbytes in self.params}
        if c.tie_weights:
            self.p["lm_head.weight"] = self.p["wte.weight"]

    # layers.py and functional.py --------------------------------------------------
    # Each op of a block is given its FLOPs (ops/flops.py, on the shapes the real op sees), for the
    # count of what the recompute runs (StepMemory.recomputed_flops).
    def linear(self, x, name, out_features):
        w, b = self.p[f"{name}.weight"], self.p.get(f"{name}.bias")
        rows, k = (self.B, self.T), x.nbytes // (self.B * self.T * self.f)
        out = self.B * self.T * out_features * self.f
        flops = op_flops("Linear", [(*rows, k), (out_features, k)] + ([(out_features,)] if b is not None else []),
                         [(*rows, out_features)])
        if b is None:
            return _apply(_Linear, x, w, out_nbytes=out, flops=flops)
        return _apply(_Linear, x, w, b, out_nbytes=out, flops=flops)

    def layer_norm(self, x, name):
        w, b = self.p[f"{name}.weight"], self.p.get(f"{name}.bias")
        if b is None:  # F.layer_norm makes a zero bias each call
            b = _Tensor(_Array(self.C * self.f))
        x_shape = (self.B, self.T, self.C)
        return _apply(_LayerNorm, x, w, b, rows_nbytes=self.B * self.T * self.f,
                      flops=op_flops("LayerNorm", [x_shape, (self.C,), (self.C,)], [x_shape]))

    def drop(self, x):
        if not self.dropout:  # F.dropout returns x itself when p == 0
            return x
        keep = _Array(BOOL * x.nbytes // self.f)  # drawn on the host; tracked only if saved
        shape = (x.nbytes // self.f,)
        return _apply(_Dropout, x, keep=keep, p=None, flops=op_flops("Dropout", [shape], [shape]))

    def lift(self):  # Tensor._lift of a Python number: a 0-d tensor of our dtype
        return _Tensor(_Array(self.f))

    # nn/transformer.py ---------------------------------------------------------------
    def attention(self, x, i):
        B, T, C, nh, hs, f = self.B, self.T, self.C, self.nh, self.hs, self.f
        qkv = self.linear(x, f"blocks.{i}.attn.c_attn", 3 * C)  # (B, T, 3C)
        q, k, v = _apply(_Split, qkv, pieces=3)  # three views (B, T, C)
        # .reshape(B, T, nh, hs).transpose(1, 2): views; backward reshapes (B, T, nh, hs) -> (B, T, C)
        q = _apply(_Permute, _apply(_Reshape, q, back_copies=self.heads_copy))
        k = _apply(_Permute, _apply(_Reshape, k))  # its gradient arrives transposed twice: a view
        v = _apply(_Permute, _apply(_Reshape, v, back_copies=self.heads_copy))
        heads, scores = (B, nh, T, hs), (B, nh, T, T)
        att = _apply(_MatMul, q, _apply(_Permute, k), out_nbytes=math.prod(scores) * f,
                     flops=op_flops("MatMul", [heads, (B, nh, hs, T)], [scores]))
        att = _apply(_Mul, att, self.lift(), flops=op_flops("Mul", [scores, ()], [scores]))
        future = _Array(BOOL * T * T)  # xp.triu(...): tracked only if saved
        att = _apply(_Where, self.lift(), att, condition=future, flops=op_flops("Where", [(), scores], [scores]))
        att = _apply(_Softmax, att, rows_nbytes=B * nh * T * f, flops=op_flops("Softmax", [scores], [scores]))
        att = self.drop(att)
        y = _apply(_MatMul, att, v, out_nbytes=math.prod(heads) * f, flops=op_flops("MatMul", [scores, heads], [heads]))
        y = _apply(_Reshape, _apply(_Permute, y), copies=self.heads_copy)  # (B, T, C)
        return self.drop(self.linear(y, f"blocks.{i}.attn.c_proj", C))

    def feed_forward(self, x, i):
        # one expression, as FeedForward.forward: each intermediate goes as soon as the next op is done
        hidden = (self.B, self.T, 4 * self.C)
        return self.drop(self.linear(_apply(_GELU, self.linear(x, f"blocks.{i}.mlp.c_fc", 4 * self.C),
                                            flops=op_flops("GELU", [hidden], [hidden])),
                                     f"blocks.{i}.mlp.c_proj", self.C))

    def residual(self, x, y):
        shape = (self.B, self.T, self.C)
        return _apply(_Add, x, y, out_nbytes=x.nbytes, flops=op_flops("Add", [shape, shape], [shape]))

    def attention_sublayer(self, x, i):
        return self.residual(x, self.attention(self.layer_norm(x, f"blocks.{i}.ln_1"), i))

    def feed_forward_sublayer(self, x, i):
        return self.residual(x, self.feed_forward(self.layer_norm(x, f"blocks.{i}.ln_2"), i))

    def block(self, x, i):
        x = self.attention_sublayer(x, i)
        x = self.feed_forward_sublayer(x, i)
        return x

    def chain(self):
        """GPT.checkpoint_chain: the blocks, or their halves."""
        if not self.split:
            return [_Layer(lambda x, i=i: self.block(x, i), "block") for i in range(self.n_layer)]
        return [layer for i in range(self.n_layer)
                for layer in (_Layer(lambda x, i=i: self.attention_sublayer(x, i), "attention"),
                              _Layer(lambda x, i=i: self.feed_forward_sublayer(x, i), "feed_forward"))]

    def forward(self, idx):
        B, T, C, f = self.B, self.T, self.C, self.f
        pos = _Array(INT64 * T)  # xp.arange(T)
        tok_emb = _apply(_GetItem, self.p["wte.weight"], index=idx, out_nbytes=B * T * C * f)
        pos_emb = _apply(_GetItem, self.p["wpe.weight"], index=pos, out_nbytes=T * C * f)
        x = self.drop(_apply(_Add, tok_emb, pos_emb, out_nbytes=B * T * C * f, b_broadcast=True))
        if self.segments is not None:
            x = _run_segments(self.chain(), self.segments, x, self.policy)
        else:  # for block in self.blocks: x = block(x)
            x = _run_segments(self.chain(), [(0, self.n_layer, False)], x, None)
        x = self.layer_norm(x, "ln_f")
        logits = self.linear(x, "lm_head", self.V)
        return logits


def _parameters(config, itemsize):
    """(name, bytes) of every parameter, in model.parameters() order (a tied matrix once)."""
    C, V, bias = config.n_embd, config.vocab_size, config.bias
    out = [("wte.weight", V * C), ("wpe.weight", config.block_size * C)]
    for i in range(config.n_layer):
        for name, shape in ((f"blocks.{i}.ln_1", (C,)), (f"blocks.{i}.attn.c_attn", (3 * C, C)),
                            (f"blocks.{i}.attn.c_proj", (C, C)), (f"blocks.{i}.ln_2", (C,)),
                            (f"blocks.{i}.mlp.c_fc", (4 * C, C)), (f"blocks.{i}.mlp.c_proj", (C, 4 * C))):
            out.append((f"{name}.weight", math.prod(shape)))
            if bias:
                out.append((f"{name}.bias", shape[0]))
    out.append(("ln_f.weight", C))
    if bias:
        out.append(("ln_f.bias", C))
    if not config.tie_weights:
        out.append(("lm_head.weight", V * C))
    return [(name, n * itemsize) for name, n in out]


# -- the step ---------------------------------------------------------------------------
@dataclass
class StepMemory:
    """What one training step holds: its peak and the split of it by category, in bytes.

    peak_bytes: the highest live bytes over the step (memory.peak()[0] of the
    real step); at_peak: bytes by category at that moment (memory.peak()[1]);
    highest: each category's own highest value over the step (saved
    activations: the figure activations.chain_peak predicts, plus what lives
    before the chain); start: what lives before the step (parameters,
    optimizer state, accumulation buffers).

    device_peak_bytes: an upper bound of what the arrays of the step occupy
    at their highest: the counted bytes plus, at each op, the scratch arrays
    it makes inside itself and the arrays it has made but memory.py has not
    counted yet (a backward's gradients before they are delivered; one added
    into a tied weight's .grad is never counted), plus `constant_bytes`
    (arrays alive through the step that memory.py never sees: on the CPU the
    batch's labels). It is what an allocator must find room for, before its
    own overheads (rounding, caching, fragmentation, the CUDA context).

    recomputed_flops: the forward FLOPs of the ops the step's checkpoint
    recomputes run (ops/flops.py; what a recompute skips or replays from a
    policy's stash is not run): what checkpointing adds to the step's work.
    """

    peak_bytes: int
    at_peak: dict
    highest: dict
    start: dict
    device_peak_bytes: int = 0
    constant_bytes: int = 0
    recomputed_flops: int = 0
    points: list = field(default=None, repr=False)  # bytes at every check, one column per category, if asked
    scratch_points: list = field(default=None, repr=False)  # bytes at every scratch moment, if asked


def walk_step(config, batch_size, seq_len, itemsize=4, segments=None, policy=None, split_blocks=False,
              optimizer_bytes=None, accumulation_itemsize=None, device="cpu", record=False, stretch=True):
    """Walk one Trainer step (micro-batch forward, backward, accumulate; the optimizer step).

    config: a GPTConfig (or anything with its fields). batch_size: examples per
    micro-batch (per_device_train_batch_size); seq_len <= config.block_size.
    itemsize: 4 (float32) or 8 (float64), the model's dtype. segments: None (no
    checkpointing), or what GPT.gradient_checkpointing_enable takes ('every',
    'sqrt', an int, boundaries, a schedules.Plan); policy: None, a name or a
    callable (policies.py); split_blocks: checkpoint blocks' halves.
    optimizer_bytes: bytes of optimizer state per parameter element, default
    AdamW's two moments in the model's dtype (2 * itemsize; 0 for the
    Trainer's SGD, which has no momentum). accumulation_itemsize: bytes per
    element of the accumulation buffers (TrainingArguments.accumulation_dtype),
    default the model's. device: "cpu" (NumPy) or "cuda" (CuPy): where the
    arrays live, which decides some scratch (see StepMemory.device_peak_bytes).
    record: keep the bytes at every check (StepMemory.points and
    scratch_points). stretch: walk runs of identical units as three (see
    `_run_segments`); False walks every block.

    Every micro-batch of a step starts from the same state (the accumulator
    frees each micro-batch's gradients), so the peak does not depend on
    gradient_accumulation_steps; it is walked once. Returns a StepMemory.
    """
    chain_length = config.n_layer * (2 if split_blocks else 1)
    bounds = segment_bounds(chain_length, segments) if segments is not None else None
    if isinstance(segments, Plan):
        segments = segments.segments
    policy = policies.resolve(policy)
    if policy is not None and bounds is None:
        raise ValueError("a checkpoint policy applies to checkpointed segments; give segments too")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    _walk.ledger, _walk.tapes, _walk.runs, _walk.stretch = _Ledger(record), [_Tape()], [], stretch
    _walk.recomputing, _walk.copies, _walk.recomputed_flops = 0, 1, 0
    _walk.device, _walk.itemsize = device, itemsize
    try:
        return _train_step(config, batch_size, seq_len, itemsize, bounds, policy, split_blocks,
                           2 * itemsize if optimizer_bytes is None else optimizer_bytes,
                           accumulation_itemsize or itemsize)
    finally:
        _walk.ledger = _walk.tapes = None
        _walk.runs = []


def _train_step(config, batch, seq_len, itemsize, bounds, policy, split_blocks, optimizer_bytes, accumulation_itemsize):
    ledger = _walk.ledger
    model = _Model(config, batch, seq_len, itemsize, bounds, policy, split_blocks)
    params = [model.p[name] for name, _ in model.params]
    elements = sum(p.nbytes for p in params) // itemsize
    # What lives before the step: the parameters, the optimizer's state (AdamW: exp_avg and
    # exp_avg_sq, each parameter-sized), the GradientAccumulator's buffers (always there in the
    # Trainer). Never freed, never recategorised: counted in bulk.
    ledger.current["parameters"] += elements * itemsize
    ledger.current["optimizer"] += elements * optimizer_bytes
    ledger.current["accumulation"] += elements * accumulation_itemsize
    if _walk.device == "cpu":
        ledger.constant = INT64 * batch * seq_len  # the batch's labels (host memory, never a Tensor)
    ledger.reset_peak()
    ledger.highest = dict(ledger.current)
    ledger.device_peak = ledger.total() + ledger.constant
    start = dict(ledger.current)
    ledger.point(start)

    # Trainer.compute_loss: logits = model(input_ids); cross_entropy(logits, labels, reduction="sum")
    input_ids = _Array(INT64 * batch * seq_len)  # the batch, made by collate on the host
    loss = _compute_loss(model, input_ids)
    # loss.backward(): the seed gradient is ones of the loss's shape
    seed = _Array(itemsize)
    _walk.tapes[0].backward([loss], [seed])
    seed = loss = None  # backward returns (its argument list goes), then `del loss`
    # GradientAccumulator.accumulate: buffer += p.grad; p.grad = None
    for p in params:
        p.grad = None
    for c in memory.CATEGORIES:  # the gradients of the blocks counted as copies go too
        ledger.current[c] -= ledger.copies[c]
        ledger.copies[c] = 0
    # Trainer._optimizer_step: write_grads, clip, step (in place), zero_grad. With buffers of the
    # parameters' dtype, a buffer becomes p.grad itself; with another dtype, each p.grad is a new
    # cast copy: Tensor(grad) ("other", checked), then counted as gradients. The totals only rise,
    # so the highest check is the last parameter's; "other" is highest at the largest parameter.
    largest = max(p.nbytes for p in params)
    if accumulation_itemsize != itemsize:
        ledger.scratch(largest // itemsize * (accumulation_itemsize + itemsize))  # (buffer / items), then its cast copy
        sizes = [p.nbytes for p in params]
        last, largest = len(sizes) - 1, max(range(len(sizes) - 1), key=sizes.__getitem__, default=None)
        rest = _Array(sum(sizes) - sizes[last] - (sizes[largest] if largest is not None else 0))
        ledger.track(rest, "gradients")
        grads = [rest]
        for i in ([largest] if largest is not None else []) + [last]:
            grads.append(_Array(sizes[i]))
            ledger.track(grads[-1])
            ledger.track(grads[-1], "gradients")
    # optimizer.step(): AdamW holds sqrt(v), m / sqrt(v) and its scaled copy for one parameter at a
    # time; SGD the scaled gradient
    ledger.scratch((3 if optimizer_bytes else 1) * largest)
    if accumulation_itemsize != itemsize:
        grads = rest = None  # zero_grad
    input_ids = None  # the batch goes when the next one is made (or train() returns)
    return StepMemory(ledger.peak_total, dict(ledger.peak), dict(ledger.highest), start, ledger.device_peak,
                      ledger.constant, _walk.recomputed_flops, ledger.points, ledger.scratch_points)


class StepProfile:
    """One step's memory at every micro-batch size, from two walks.

    Every array of the step is a + b * batch bytes (activations grow with the
    batch; parameters, the causal mask and scalars do not), and the walk is the
    same for every batch size, so the bytes at each check are affine in the
    batch: walks at 1 and 2 give them all, exactly. `at(b)` is walk_step at b;
    `largest_batch(limit)` the largest micro-batch whose peak fits.
    """

    def __init__(self, one, two):
        p1, p2 = numpy.array(one.points, dtype=numpy.int64).T, numpy.array(two.points, dtype=numpy.int64).T
        s1, s2 = numpy.array(one.scratch_points, dtype=numpy.int64), numpy.array(two.scratch_points, dtype=numpy.int64)
        self._points = (2 * p1 - p2, p2 - p1)  # per check: bytes by category at batch 0, and per example
        self._scratch = (2 * s1 - s2, s2 - s1)
        self._constant = (2 * one.constant_bytes - two.constant_bytes, two.constant_bytes - one.constant_bytes)
        self._flops = (2 * one.recomputed_flops - two.recomputed_flops, two.recomputed_flops - one.recomputed_flops)
        self.start = one.start

    def at(self, batch_size):
        """The StepMemory of a micro-batch of batch_size examples."""
        points = self._points[0] + self._points[1] * batch_size
        totals = points.sum(axis=1)
        first = int(totals.argmax())  # memory.py keeps the first of equal peaks
        constant = int(self._constant[0] + self._constant[1] * batch_size)
        scratch = self._scratch[0] + self._scratch[1] * batch_size
        device = max(int(totals[first]) + constant, int(scratch.max()) + constant if len(scratch) else 0)
        split = dict(zip(memory.CATEGORIES, map(int, points[first])))
        highest = dict(zip(memory.CATEGORIES, map(int, points.max(axis=0))))
        flops = self._flops[0] + self._flops[1] * batch_size
        return StepMemory(int(totals[first]), split, highest, dict(self.start), device, constant, flops)

    def largest_batch(self, limit, device=True):
        """The largest micro-batch whose peak is at most `limit` bytes (0 if not even 1 fits).

        device: judge by the device bound (StepMemory.device_peak_bytes), else
        by memory.py's peak.
        """
        c0, c1 = self._constant
        if not device:
            c0 = c1 = 0
        rows = [(self._points[0].sum(axis=1) + c0, self._points[1].sum(axis=1) + c1)]
        if device and len(self._scratch[0]):
            rows.append((self._scratch[0] + c0, self._scratch[1] + c1))
        best = None
        for a, k in rows:  # a + k * batch <= limit at every check
            if (a + k > limit).any() and not (k > 0).any():
                return 0
            if (a[k <= 0] > limit).any():
                return 0
            grow = k > 0
            if grow.any():
                most = int(((limit - a[grow]) // k[grow]).min())
                best = most if best is None else min(best, most)
        return max(0, best) if best is not None else 1 << 40


def profile_step(config, seq_len, **kwargs):
    """A StepProfile: walk_step at micro-batches 1 and 2 (kwargs as walk_step's, without batch_size)."""
    return StepProfile(walk_step(config, 1, seq_len, record=True, **kwargs),
                       walk_step(config, 2, seq_len, record=True, **kwargs))


def _compute_loss(model, input_ids):
    logits = model.forward(input_ids)
    if _walk.device == "cpu":  # compute_loss's label checks: boolean arrays over the batch
        _walk.ledger.scratch(3 * BOOL * model.B * model.T)
    flat = _apply(_Reshape, logits)  # (B*T, V), a view
    loss = _apply(_CrossEntropy, flat, n_rows=model.B * model.T, itemsize=model.f)
    return loss
