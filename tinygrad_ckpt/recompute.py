"""The planned recompute (the default): run again only what backward needs, and stop early.

A layer on the plain path (checkpoint.py, which runs the whole segment
again): `choose` picks it once, as a segment is made, and its
`PlannedRecompute` takes over the segment's forward tape and recompute. It
adds early stop, PyTorch's (the recompute stops as soon as backward has
everything it needs), and more: an op whose arrays exist already is not run
but its record rebuilt, and an op whose result nothing needs is skipped. A
policy's kept ops (policies.py) are replayed through it. Cost: one note per
op of the forward (a few small tuples, no arrays). It gives the plain
path's gradients, to the bit (tests/test_equivalence.py). Tutorial 5 shows
it at work. In three steps:

  forward   the segment runs on a `SegmentTape`, which keeps nothing but a
            note per op (`OpNote`): where each input array came from (an
            earlier op, a segment input, a tensor from outside, a constant
            the code made), what the op saved, by reference (its input i,
            an option, its output k, or a new array), the shapes and dtypes
            of what it saved and returned, and its record's ctx (the facts
            its backward reads: shapes, axes) and hooks.
  plan      `make_plan` walks the notes from the end: which ops' backward
            runs (their outputs lead to the segment's outputs), and for
            each op whether the recompute must RUN it (a later op needs its
            result, or it saved a new array or its output), may REBUILD its
            record from the note without running it (it saved only its
            inputs), KEEP what a policy kept (policies.py), or SKIP it. The
            last op that must be reached is the stop.
  backward  the segment's code runs again on a `RecomputeTape` up to the
            stop and no further: PyTorch's early stop. Ops before it are
            run, replayed or rebuilt as planned (a skipped or rebuilt op
            hands placeholders on: tape.placeholder); the records after it
            are rebuilt from the notes. A segment that needs nothing run
            again is not called at all.

Placeholders and what may read them: the code around a skipped op still
runs, and could read the placeholder's values (`.item()`, a comparison)
and feed them into an op that does run. Reading them through a Tensor raises
tape.PlaceholderRead, and the checkpoint then recomputes the segment in
full (`full_plan`); writing through `.data` is unchecked, as everywhere.

The determinism check (determinism.py) holds up to the stop: each op the
recompute reaches must be the forward's, on inputs and saving arrays of the
same shapes and dtypes; what comes after the stop is neither run nor checked.

What does not live here: checkpointing itself and its record (checkpoint.py),
what a policy keeps (policies.py), the walk (tape.py).
"""

import weakref

from . import backend, determinism, function, memory, tape
from .determinism import describe, saved_meta
from .ops.flops import op_flops
from .policies import RECOMPUTE, Stash, decide, resolve, where_in_call

RUN, KEEP, REBUILD, SKIP = "run", "keep", "rebuild", "skip"


class StopRecompute(BaseException):
    """Raised by the recompute tape at the stop. A BaseException, so that `except Exception` in a segment's code lets it pass."""


def choose(segment, policy, options):
    """What runs a checkpointed segment, chosen once as it is made: the segment itself (the plain path,
    checkpoint.py) for a full recompute without a policy, else a PlannedRecompute layered on it."""
    policy = resolve(policy)
    # Recompute in full (no early stop, nothing skipped): asked for, or needed to compare values.
    full = not options["early_stop"] or options["determinism_check"] != "default"
    return segment if full and policy is None else PlannedRecompute(segment, policy, full)


class PlannedRecompute:
    """The planned path of one segment: in place of the plain path's forward tape and recompute, it
    notes the forward's ops and runs the recompute as far as the plan says; it remembers and checks the
    outputs (determinism.py). The segment (checkpoint._Segment) still runs the code, holds its inputs
    and does the bookkeeping."""

    def __init__(self, segment, policy, full):
        self.segment, self.name, self.full = segment, segment.name, full
        self.determinism_check = segment.determinism_check
        self.stash = Stash(policy, segment.name) if policy is not None else None
        self.notes = self.out_origins = self.plan = None  # the forward's; the plan, at the first backward

    def forward_tape(self):
        return SegmentTape(self, self.segment.inputs)

    def kept_arrays(self):
        return self.stash.hand_over() if self.stash is not None else ()

    def mismatch(self, what, ran):
        """Raise the determinism check's error (determinism.py)."""
        determinism.mismatch(self.name, what, [n.name for n in self.notes], ran, self.segment.debug)

    def recompute(self, saved):
        """As the plain path's (checkpoint._Segment.recompute), but as far as the plan says, the rest rebuilt.

        saved: the record's saved arrays (inputs, computed outside tensors, what a policy kept).
        """
        try:
            return self.run_again(saved)
        except tape.PlaceholderRead:  # its code read a value the plan skipped: recompute it in full
            self.full, self.plan = True, None
            return self.run_again(saved)

    def run_again(self, saved):
        segment = self.segment
        if self.plan is None:
            self.plan = full_plan(self.notes) if self.full else make_plan(self.notes, self.out_origins)
        inputs = segment.stand_ins(saved)
        recompute_tape = RecomputeTape(self, inputs, saved)
        returned = False
        if self.plan.stop >= 0:  # -1: nothing to run, the segment is not called at all
            with segment.running_again(recompute_tape):
                try:
                    outputs, returned = segment.call(inputs), True
                except StopRecompute:
                    pass
        with memory.phase("recompute"):  # the rebuilt records are part of the recompute
            output_edges = recompute_tape.finish(returned)
        if returned and segment.checks:
            determinism.check_outputs(self, outputs)
        return inputs, recompute_tape, output_edges


# -- the forward: one note per op ------------------------------------------------------
class OpNote:
    """What the recompute needs to know about one op of the segment's forward (no arrays)."""

    __slots__ = ("op", "name", "device", "inputs", "input_meta", "saved", "saved_meta", "shapes", "dtypes",
                 "multiple", "needs_input_grad", "node", "kept")

    def __init__(self, op, ctx, arrays, options, out, origins, kept):
        outs = out if isinstance(out, tuple) else (out,)
        self.op, self.name = op, op.__name__
        self.device = backend.device_of(outs[0]) if outs else None
        self.inputs = origins  # per input array: ("op", j, k), ("input", s), ("outer", c) or None (a constant)
        self.input_meta = tuple((tuple(a.shape), a.dtype) for a in arrays)
        self.saved = tuple(None if a is None else where_in_call(a, arrays, options, outs) or ("new",)
                           for a in ctx.saved_arrays)
        self.saved_meta = tuple(None if a is None else (tuple(a.shape), a.dtype) for a in ctx.saved_arrays)
        self.shapes = tuple(tuple(o.shape) for o in outs)
        self.dtypes = tuple(o.dtype for o in outs)
        self.multiple = isinstance(out, tuple)
        self.needs_input_grad = tuple(ctx.needs_input_grad)
        self.node = None  # its record (ctx and hooks), if it made one
        self.kept = kept  # what a policy kept of it (policies._Kept), or None

    @property
    def nested(self):
        """A checkpoint inside the segment: always run again, never rebuilt (its segment is the forward's)."""
        return getattr(self.op, "is_checkpoint", False)


class SegmentTape(tape.Tape):
    """The segment's forward: records nothing and keeps nothing, but notes every op.

    Every op passes through `run`, which runs it with the gradients it would
    need, so that it says what it saves, notes that, and drops it (or hands
    it to the policy's stash: policies.Stash). `append` sees the record the
    op made: it keeps its ctx and hooks for the note, learns the tensors
    from outside the segment that need a gradient (parameters, and tensors
    the code reads from its closure), and lets the record go at once.
    """

    def __init__(self, planned, inputs):
        super().__init__()
        self.planned = planned  # a PlannedRecompute: its policy's stash; the notes are left on it
        self.label = f"the forward of checkpoint segment '{planned.name}'"
        self.notes = []
        self.input_arrays = [t.data for t in inputs]
        self.input_ids = {id(t) for t in inputs}
        self.outer = {}  # id -> tensor from outside that needs a gradient, in the order first read
        self.produced = {}  # id(output array) -> (op index, output index, a weak reference to the array)

    def origin(self, a):
        """Where array `a`, an input of an op, came from (see OpNote.inputs)."""
        made = self.produced.get(id(a))
        if made is not None and made[2]() is a:  # weak: an intermediate is freed as soon as it is done with
            return ("op", made[0], made[1])
        for s, b in enumerate(self.input_arrays):
            if a is b:
                return ("input", s)
        return None

    def run(self, op, ctx, arrays, options):
        stash = self.planned.stash
        nested = getattr(op, "is_checkpoint", False)
        decision = RECOMPUTE if stash is None or nested else decide(stash.policy, op.__name__)
        ctx.counted = False  # noted, not kept: nothing here is counted as saved
        out = op.run_forward(ctx, arrays, options)
        kept = stash.keep_op(op.__name__, ctx, arrays, options, out, decision) if decision != RECOMPUTE else None
        note = OpNote(op, ctx, arrays, options, out, [self.origin(a) for a in arrays], kept)
        ctx.saved_arrays = ()
        j = len(self.notes)
        self.notes.append(note)
        for k, o in enumerate(out if isinstance(out, tuple) else (out,)):
            self.produced[id(o)] = (j, k, weakref.ref(o))
        return out

    def append(self, node):
        node.tape, node.index = self, -1
        note = self.notes[-1]
        note.node = node  # its ctx (the facts backward reads) and its hooks, registered later on its outputs
        for i, t in enumerate(node.inputs):
            if t is None or id(t) in self.input_ids or not t.requires_grad:
                continue
            if t.is_leaf or t._node.tape is not self:  # a parameter, or a tensor computed outside
                self.outer.setdefault(id(t), t)
                note.inputs[i] = ("outer", list(self.outer).index(id(t)))
        node.release_graph()  # keep no graph: the segment's intermediates are freed as under no_grad

    def learn(self, segment, outputs):
        """After the forward: the outside tensors on the segment; the notes, and where each output came
        from, on the planned recompute. Then it lets go of everything else (the records point back at this tape).
        """
        self.planned.out_origins = [(self.origin_of_output(o), o.requires_grad) for o in outputs]
        self.planned.notes, segment.outer = self.notes, list(self.outer.values())
        self.produced = self.outer = self.input_arrays = self.input_ids = self.notes = self.planned = None

    def origin_of_output(self, t):
        """Where a segment output came from; a tensor from outside that needs a gradient is one of its inputs."""
        where = self.origin(t.data)
        if where is None and id(t) in self.outer:
            where = ("outer", list(self.outer).index(id(t)))
        return where


# -- the plan --------------------------------------------------------------------------------
class RecomputePlan:
    """Per op: RUN, KEEP, REBUILD or SKIP; the stop; the outputs held for records rebuilt after it."""

    def __init__(self, actions, stop, hold, rebuilt):
        self.actions = actions
        self.stop = stop  # the last op the recompute reaches (-1: the segment is not called at all)
        self.hold = hold  # {op index: {output index}}: values a record rebuilt after the stop needs
        self.rebuilt = rebuilt  # the ops after the stop whose records are rebuilt (their backward runs)


def full_plan(notes):
    """Everything again, as a checkpoint without early stop does (what a policy kept is replayed)."""
    return RecomputePlan([KEEP if n.kept is not None else RUN for n in notes], len(notes) - 1, {}, [])


def make_plan(notes, outputs, keep_outputs=False):
    """The plan for a segment whose forward made `notes`; outputs: (origin, requires_grad) per output.

    Walked from the last op to the first: an op's backward runs if a
    gradient reaches one of its outputs; it must RUN if a later op needs its
    result, or if it saved its output or a new array; else its record can be
    REBUILT from its note, or it is SKIPPED. An op must be reached (called by
    the segment's code) if it runs, or if what it saved includes an option
    or a constant that only the code can make again. Ops whose outputs are
    the segment's run if reached, so that what the code returns is real;
    keep_outputs: they always run (the plan of a layer inside a segment,
    whose result the next layer needs: schedules.measure_layers).
    """
    n = len(notes)
    reaches = [set() for _ in range(n)]  # per op: which of its outputs a gradient reaches
    for origin, requires_grad in outputs:
        if requires_grad and origin is not None and origin[0] == "op":
            reaches[origin[1]].add(origin[2])
    backward_runs = [False] * n
    for j in reversed(range(n)):
        if notes[j].node is None or not reaches[j]:
            continue
        backward_runs[j] = True
        for needs, origin in zip(notes[j].needs_input_grad, notes[j].inputs):
            if needs and origin is not None and origin[0] == "op":
                reaches[origin[1]].add(origin[2])
    returned = {o[1] for o, _ in outputs if o is not None and o[0] == "op"}
    if keep_outputs:
        actions, stop = _assign(notes, backward_runs, returned)
    else:
        actions, stop = _assign(notes, backward_runs, set())
        forced = {j for j in returned if j <= stop and actions[j] not in (RUN, KEEP)}
        if forced:
            actions, stop = _assign(notes, backward_runs, forced)
    hold, rebuilt = {}, [j for j in range(stop + 1, n) if backward_runs[j]]
    for j in rebuilt:
        for origin in _needed_inputs(notes[j], actions[j]):
            if origin is not None and origin[0] == "op" and actions[origin[1]] == RUN:
                hold.setdefault(origin[1], set()).add(origin[2])
    return RecomputePlan(actions, stop, hold, rebuilt)


def _assign(notes, backward_runs, forced):
    """One walk from the end: each op's action, and the last op that must be reached."""
    n = len(notes)
    actions, must_reach = [SKIP] * n, [False] * n
    wanted = [False] * n  # a later op needs this op's result
    for j in reversed(range(n)):
        note = notes[j]
        if note.kept is not None:
            action = KEEP
        elif wanted[j] or j in forced or (backward_runs[j] and (note.nested or _saves_own_arrays(note))):
            action = RUN
        elif backward_runs[j]:
            action = REBUILD
        else:
            action = SKIP
        actions[j] = action
        needed = _needed_inputs(note, action) if action == RUN or backward_runs[j] else []
        must_reach[j] = action == RUN or (backward_runs[j] and _needs_the_call(note))
        for origin in needed:
            if origin is None:
                must_reach[j] = True  # a constant the segment's code makes: only the call has it
            elif origin[0] == "op":
                wanted[origin[1]] = True
    return actions, max((j for j in range(n) if must_reach[j]), default=-1)


def _saves_own_arrays(note):
    """It saved its output or an array it made: only running it gives them back."""
    return any(ref is not None and ref[0] in ("output", "new") for ref in note.saved)


def _needs_the_call(note):
    """What it saved includes an option: only the segment's code passes it again."""
    return any(ref is not None and ref[0] == "option" for ref in note.saved)


def _needed_inputs(note, action):
    """The origins of the inputs whose values this op needs: all to run it, the saved ones to rebuild it."""
    if action == RUN:
        return list(note.inputs)
    return [note.inputs[ref[1]] for ref in note.saved if ref is not None and ref[0] == "input"]


def recompute_shares(fn, x):
    """What a checkpoint's recompute runs of fn(x) (fn(*x) for a tuple x), as shares of its forward's FLOPs.

    (inside, last): when fn is a layer inside a checkpointed segment (its
    result is needed by the next layer), and when it is the segment's last
    layer, where the recompute stops early. Counted from the plan of one
    traced forward (ops/flops.py), not measured. For the cost model of
    schedules.py.
    """
    traced = _Traced()
    inputs = x if isinstance(x, tuple) else (x,)
    forward_tape = SegmentTape(traced, list(inputs))  # the trace plays both the segment and its planned recompute
    with tape.recording(forward_tape):
        out = fn(*inputs)
    forward_tape.learn(traced, list(out) if isinstance(out, tuple) else [out])
    notes, origin = traced.notes, traced.out_origins
    total = sum(_flops(n) for n in notes)
    if not total:
        return 1.0, 1.0
    shares = []
    for keep_outputs in (True, False):
        plan = make_plan(notes, origin, keep_outputs)
        shares.append(sum(_flops(n) for n, a in zip(notes, plan.actions) if a == RUN) / total)
    return tuple(shares)


class _Traced:
    """The little a SegmentTape asks of its segment and planned recompute, for a trace that is no checkpoint."""

    name, stash = "a layer being measured", None


def _flops(note):
    return op_flops(note.name, [m[0] for m in note.input_meta], note.shapes)


# -- the backward: the recompute tape ----------------------------------------------------
class RecomputeTape(tape.Tape):
    """Runs a segment's code again and follows the plan (see the module docstring).

    Records like a fresh Tape what it runs; an op it does not run hands on
    placeholders (or what a policy kept), and its record, if its backward
    runs, is rebuilt from its note. At the stop it raises StopRecompute;
    `finish` then rebuilds the records after it. Registering a hook does
    nothing here: the records get the hooks the forward registered.
    """

    replays_hooks = True

    def __init__(self, planned, inputs, saved):
        super().__init__()
        segment = self.segment = planned.segment
        self.planned, self.notes, self.plan = planned, planned.notes, planned.plan
        self.label = f"the recompute of checkpoint segment '{planned.name}'"
        self.inputs = inputs  # the stand-ins for the segment's inputs
        # The record's saved arrays: the inputs, the computed tensors from outside, what a policy kept.
        n, computed = len(inputs), iter(saved[len(inputs):])
        self.outer_arrays = [t.data if t.is_leaf else next(computed) for t in segment.outer]  # per outside tensor
        self.stashed = saved[n + sum(not t.is_leaf for t in segment.outer):]
        self.position = 0
        self.by_position = {}  # op index -> its record here (held until the rebuilt records point at them)
        self.held = {}  # (op index, output index) -> array a record rebuilt after the stop needs
        self.kept_outputs = {}  # (op index, output index) -> a kept output, once fetched
        self.ran = []  # the names of the ops the code called, for debug output

    def run(self, op, ctx, arrays, options):
        j = self.position
        self.ran.append(op.__name__)
        if j > self.plan.stop and not self.planned.full:
            raise StopRecompute  # every op that must be run again has been: what follows is neither run nor checked
        expected = self.notes[j].name if j < len(self.notes) else "nothing more"
        policy_kept = j < len(self.notes) and self.notes[j].kept is not None  # a replay needs the same op
        if expected != op.__name__ and (self.segment.checks or policy_kept):
            self.planned.mismatch(f"ran {op.__name__} as op #{j}, where its forward ran {expected}", self.ran)
        self.position += 1
        if expected != op.__name__ or j > self.plan.stop:  # determinism_check="none": run what the code runs
            return op.run_forward(ctx, arrays, options)
        note = self.notes[j]
        action = self.plan.actions[j]
        if self.segment.checks and action != RUN:  # what runs is checked by what it saves and returns
            self._check_inputs(note, arrays)
        if action == RUN:
            out = op.run_forward(ctx, arrays, options)
            if self.segment.checks:
                self._check_saved(note, ctx)
        elif action == KEEP:
            out = note.kept.replay(ctx, lambda i: arrays[i], options, lambda k: self.kept_output(j, k), self.stashed)
            ctx.computed = False
        else:
            if action == REBUILD:
                ctx.__dict__.update(note.node.ctx.facts())
                ctx.save_for_backward(*self._saved(note, lambda i: arrays[i], options))
                if self.segment.checks:
                    self._check_saved(note, ctx)
            else:
                ctx.needs_input_grad = (False,) * len(arrays)  # SKIP: no backward reaches it
            out = self._placeholders(note)
            ctx.computed = False
        for k in self.plan.hold.get(j, ()):
            self.held[(j, k)] = (out if isinstance(out, tuple) else (out,))[k]
        return out

    def append(self, node):
        super().append(node)
        j = self.position - 1
        self.by_position[j] = node
        if j < len(self.notes) and self.notes[j].node is not None and self.notes[j].name == node.name:
            node.hooks = self.notes[j].node.hooks

    # -- after the code has run (or stopped) ----------------------------------------
    def finish(self, returned):
        """Check that the code reached what it had to; rebuild the records after the stop. Returns the
        gradient edge of each segment output that requires grad (its record here), and lets go of what
        the records do not hold (they hold each other now, and point back at this tape)."""
        # Early stop checks only what comes before the stop: returning after it is no mismatch.
        if self.segment.checks and (self.position <= self.plan.stop or
                                       (returned and self.planned.full and self.position != len(self.notes))):
            self.planned.mismatch(f"ran {self.position} ops, where its forward ran {len(self.notes)}", self.ran)
        for j in self.plan.rebuilt:
            note = self.notes[j]
            ctx = function.Context(note.name, note.needs_input_grad)
            if self.plan.actions[j] == KEEP:
                note.kept.replay(ctx, lambda i, note=note: self._value(note.inputs[i]), {},
                                 lambda k, j=j: self.kept_output(j, k), self.stashed)
            else:
                ctx.__dict__.update(note.node.ctx.facts())
                ctx.save_for_backward(*self._saved(note, lambda i, note=note: self._value(note.inputs[i]), {}))
            edges = [self.edge(o) if needs else (None, None) for needs, o in zip(note.needs_input_grad, note.inputs)]
            node = tape.Node.rebuilt(note.op, ctx, edges, note.input_meta, note.shapes, note.dtypes, note.node.hooks,
                                     getattr(note.node, "stack", None))
            tape.Tape.append(self, node)
            self.by_position[j] = node
            # On the timeline as a record made (without shapes, so without FLOPs: nothing ran).
            memory.tracker.event(f"{note.name} (rebuilt)", kind="op", tape=self.number, record=node.index,
                                 saved=node.activation_nbytes, saved_parameters=node.saved_parameters)
        edges = [self.edge(origin) for (origin, _), r in zip(self.planned.out_origins, self.segment.recorded) if r]
        self.by_position = self.held = self.kept_outputs = self.inputs = self.outer_arrays = self.stashed = None
        return edges

    def edge(self, origin):
        """Where a gradient for a value of this origin goes, in the recompute."""
        if origin is None:
            return (None, None)
        if origin[0] == "op":
            return (self.by_position[origin[1]], origin[2])
        if origin[0] == "input":
            t = self.inputs[origin[1]]
            return (None, t if t.requires_grad else None)
        return self.segment.outer_edges[origin[1]]

    # -- helpers -------------------------------------------------------------------
    def kept_output(self, j, k):
        """Output k of op j, which a policy kept: from the stash (an offloaded one is fetched once)."""
        if (j, k) not in self.kept_outputs:
            self.kept_outputs[(j, k)] = self.notes[j].kept.output(k, self.stashed)
        return self.kept_outputs[(j, k)]

    def _value(self, origin):
        """The array a value of this origin has in the recompute, for a record rebuilt after the stop."""
        if origin[0] == "op":
            j, k = origin[1], origin[2]
            if self.plan.actions[j] == KEEP:
                return self.kept_output(j, k)
            return self.held[(j, k)]
        if origin[0] == "input":
            return self.inputs[origin[1]].data
        return self.outer_arrays[origin[1]]

    @staticmethod
    def _saved(note, input_array, options):
        """The arrays a rebuilt record saves: its inputs (or options) that the note names."""
        saved = []
        for ref in note.saved:
            if ref is None:
                saved.append(None)
            elif ref[0] == "input":
                saved.append(input_array(ref[1]))
            else:  # ("option", key): only rebuilt where the call passes its options
                saved.append(options[ref[1]])
        return saved

    @staticmethod
    def _placeholders(note):
        outs = tuple(tape.placeholder(s, d, note.device) for s, d in zip(note.shapes, note.dtypes))
        return outs if note.multiple else outs[0]

    def _check_inputs(self, note, arrays):
        got = tuple((tuple(a.shape), a.dtype) for a in arrays)
        if got != note.input_meta:
            self.planned.mismatch(
                f"ran {note.name} (op #{self.position - 1}) on inputs of {describe(got)}, where its forward "
                f"ran it on {describe(note.input_meta)}", self.ran)

    def _check_saved(self, note, ctx):
        got = saved_meta(ctx.saved_arrays)
        if got != note.saved_meta:
            self.planned.mismatch(
                f"ran {note.name} (op #{self.position - 1}), which saved {describe(got)} for backward, where its "
                f"forward saved {describe(note.saved_meta)}", self.ran)

