"""Activation checkpointing: keep a segment's inputs, recompute its inside in backward.

The trade (Chen et al. 2016, "Training Deep Nets with Sublinear Memory
Cost"; HIPS autograd 1.9.1's `checkpoint` states it, but traces the function
again during the forward and keeps that trace, so it saves no memory):
normally every op of a segment keeps what its backward needs on the tape
until backward reaches it. A checkpointed segment keeps only its inputs.
When backward reaches it, it runs the segment's forward again, on a
short-lived tape of its own, backpropagates through that tape, and drops
it. Memory for time: at most one extra forward of the segment.

    y = checkpoint(block, x)     # the tape gets ONE record, "Checkpoint", saving x

Built only from tape primitives (tape.py, function.py):

  forward   `fn` runs on a SegmentTape (recompute.py), which records nothing
            and saves nothing, but notes each op and which tensors from
            outside the segment need a gradient: parameters, and tensors
            the code reads from its closure. Then one `Checkpoint` record
            goes on the active tape; its inputs are the segment's tensor
            arguments and those outside tensors, and its
            `ctx.save_for_backward` holds the arguments (and the outside
            tensors that are not parameters), so their bytes are what the
            tape shows as saved.
  backward  the tape first checks that nothing the segment read was
            modified in place since (their versions, as for any record:
            tape.check_versions). The record puts back the random
            generators' states and runs `fn` again on detached copies of its
            inputs, on a RecomputeTape (memory phase "recompute"; anomaly
            mode checks it as any forward). That tape runs only what the
            segment's backward needs and stops as soon as it has it
            (recompute.py: PyTorch's early stop, and more). Then it calls
            that tape's `backward` with the incoming gradients, as part of
            the same backward call, so parameters get their gradients by
            that call's rules (`backward(inputs=...)`, `autograd.grad`);
            the inputs' gradients are returned to the outer tape.
            Everything recomputed is freed when the record's backward returns.

What `fn` may take and return, as PyTorch's non-reentrant checkpoint and
`jax.checkpoint` allow: tensors anywhere inside tuples, lists and dicts
(nested), positional or keyword, beside values of any other kind; it may
return the same kinds of structure, with non-tensor values, tensors that
need no gradient, or no tensor at all. The keywords `use_reentrant`,
`preserve_rng_state`, `determinism_check`, `debug`, `early_stop` and
`policy` are the checkpoint's (PyTorch's names, and policies.py's);
every other keyword goes to `fn`.

Parameters, when no input requires grad: `Function.apply` records an op
only if one of its inputs requires grad, and decides that before the op's
forward runs. A segment's parameters are known only once its forward has
run. So `checkpoint()` runs the forward first, then applies the
`Checkpoint` op with those parameters among its inputs: the segment is
recorded whenever a parameter inside needs a gradient, even if its input (a
batch of data) does not. (PyTorch 2.13's reentrant checkpoint gives such
parameters no gradient and warns "None of the inputs have
requires_grad=True. Gradients will be None", torch/utils/checkpoint.py; its
non-reentrant one gives them their gradient, as this one does.) An output
that depends on nothing needing a gradient comes back with
requires_grad=False, as it would without the checkpoint.

Recomputing must give the same values as the forward did:
  * random ops: the generators the segment drew from (seen through
    `random.generator`) have their states saved at the segment's first draw
    and restored for the recompute, so dropout masks match; afterwards the
    caller's generators are put back where the forward left them, as if
    nothing had been recomputed.
  * stateful layers: `is_recomputing()` is True while a segment runs again;
    BatchNorm1d does not update its running statistics then.
  * `determinism_check="default"` (PyTorch's name and default): the recompute
    must run the same ops as the forward, in the same order, on inputs and
    saving arrays of the same shapes and dtypes, and return outputs of the
    same shapes and dtypes; else a CheckpointError names the op, and with
    debug=True shows both op sequences side by side. "values" also
    recomputes in full and compares the outputs' values with the forward's
    (it keeps a copy of them: a debugging aid). "none" checks nothing and
    recomputes in full.

Nesting: a checkpoint inside a checkpointed segment is a checkpoint in the
segment's forward too (which keeps nothing anyway), and runs again, whole,
when the outer segment is recomputed: its own record is real then.

`ChainCheckpointing` (at the end) is the on/off switch a model that runs a
chain of layers inherits: `model.gradient_checkpointing_enable()`.

What does not live here: what a recompute runs and skips (recompute.py),
which segments to cut a chain into (schedules.py), which ops a policy keeps
instead of recomputing (policies.py).
"""

import warnings
from contextlib import contextmanager

import numpy

from . import backend, function, memory, policies, random, tape
from .function import Function
from .policies import Stash
from .recompute import CheckpointError, RecomputeTape, SegmentTape, StopRecompute, full_plan, make_plan
from .schedules import segment_bounds
from .tensor import Tensor

__all__ = ["checkpoint", "checkpoint_sequential", "is_recomputing", "CheckpointError", "ChainCheckpointing"]

_recomputing = 0  # how many segments are re-running their forward right now


def is_recomputing():
    """True while a checkpointed segment re-runs its forward during backward.

    Stateful layers ask this so they do not update their state twice
    (BatchNorm1d's running statistics).
    """
    return _recomputing > 0


@contextmanager
def _recompute():
    global _recomputing
    _recomputing += 1
    depth = function.push_no_saved_tensors_hooks()  # what the recompute saves is its own
    try:
        with memory.phase("recompute"):
            yield
    finally:
        function.pop_saved_tensors_hooks(depth)
        _recomputing -= 1


DETERMINISM_CHECKS = ("default", "values", "none")
OPTIONS = ("preserve_rng_state", "determinism_check", "debug", "early_stop")  # with use_reentrant: PyTorch's


def check_options(use_reentrant=None, preserve_rng_state=True, determinism_check="default", debug=False,
                  early_stop=True):
    """Check the checkpoint's own keywords, each by type before value; a clear error for each bad one.

    Returns them as a dict.
    """
    if use_reentrant is not None and not isinstance(use_reentrant, (bool, numpy.bool_)):
        raise TypeError(f"use_reentrant must be False (or None), got {type(use_reentrant).__name__}")
    for name, value in (("preserve_rng_state", preserve_rng_state), ("debug", debug), ("early_stop", early_stop)):
        if not isinstance(value, (bool, numpy.bool_)):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    if not isinstance(determinism_check, str):
        raise TypeError(f"determinism_check must be one of {', '.join(map(repr, DETERMINISM_CHECKS))}, "
                        f"got {type(determinism_check).__name__}")
    if use_reentrant:
        raise ValueError(
            "use_reentrant=True asks for PyTorch's reentrant checkpoint: an autograd Function whose backward "
            "runs backward again on the recomputed segment, which cannot see autograd.grad() or "
            "backward(inputs=...), gives parameters no gradient when no input requires one, and always "
            "recomputes the whole segment. This engine's checkpoint is the non-reentrant kind (it records the "
            "segment: every backward works through it, and it stops recomputing early). Pass "
            "use_reentrant=False, or leave it out.")
    if determinism_check not in DETERMINISM_CHECKS:
        raise ValueError(f"determinism_check must be one of {', '.join(map(repr, DETERMINISM_CHECKS))}, "
                         f"got {determinism_check!r}")
    return dict(preserve_rng_state=bool(preserve_rng_state), determinism_check=determinism_check,
                debug=bool(debug), early_stop=bool(early_stop))


# -- the public functions ----------------------------------------------------
def checkpoint(function, *args, use_reentrant=None, preserve_rng_state=True, determinism_check="default",
               debug=False, early_stop=True, policy=None, check_values=None, **kwargs):
    """function(*args, **kwargs), keeping only its tensor arguments for backward.

    Tensors anywhere in args and kwargs (inside tuples, lists, dicts) are the
    segment's inputs; everything else is passed through as is. It returns
    what `function` returns, the same structure, with each tensor that
    needs a gradient recorded on the tape. Tensors `function` reads from its
    closure that need a gradient are taken as inputs too.

    use_reentrant: False or None (True is an error: see check_options).
    preserve_rng_state: replay the random generators (see the module
    docstring). determinism_check: "default", "values" or "none"; debug:
    show the op sequences when the check fails. early_stop: stop the
    recompute once backward has what it needs, and skip what it does not
    need (False: recompute everything). policy: see policies.py (None:
    keep nothing). check_values=True is the old name of
    determinism_check="values".
    """
    if check_values is not None:
        warnings.warn("checkpoint(check_values=True) is now determinism_check='values'", DeprecationWarning,
                      stacklevel=2)
        if check_values:
            determinism_check = "values"
    options = check_options(use_reentrant, preserve_rng_state, determinism_check, debug, early_stop)
    if not callable(function):
        raise TypeError(f"checkpoint: the first argument must be the function to run, got {type(function).__name__}")
    if tape.active() is None:
        return function(*args, **kwargs)  # no gradients wanted: nothing to keep
    segment = _Segment(function, args, kwargs, policy, options)
    # 1. Run function keeping nothing; learn what it read and what it returned.
    template, outputs = segment.forward()
    # 2. One record, whose inputs are the tensor arguments and the outside tensors that need a gradient.
    wanted = [o for o, needed in zip(outputs, segment.out_requires_grad) if needed]
    if not wanted or not (segment.outer or any(t.requires_grad for t in segment.inputs)):
        return _unflatten(template, iter(o.detach() for o in outputs))  # nothing to differentiate
    recorded = iter(Checkpoint.apply(*segment.inputs, *segment.outer, segment=segment,
                                     outputs=tuple(o.data for o in wanted)))
    segment.drop_forward_tensors()
    # An output that depends on nothing needing a gradient: cut from the record, as without checkpoint.
    return _unflatten(template, iter(next(recorded) if needed else o.detach()
                                     for o, needed in zip(outputs, segment.out_requires_grad)))


def checkpoint_sequential(functions, segments, input, *extra, use_reentrant=None, policy=None, **options):
    """Run `functions` one after the other on `input`, checkpointing segments of them.

    segments: an int (that many segments of nearly equal length), 'sqrt'
    (round(sqrt(n)) segments, Chen et al.), 'every' (one per function), a
    list of boundaries such as [0, 8, 16, 24] (segment i is
    functions[b[i]:b[i+1]]; 0 and n may be left out), or a Plan from
    schedules.plan_checkpoints, which also says which segments are stored
    instead of checkpointed, and which carry a plan of their own for their
    recompute (nested, as schedules.revolve makes them). Every segment of an
    int, 'sqrt', 'every' or list is checkpointed (PyTorch's
    checkpoint_sequential runs the last one normally; ask the planner if
    that pays). A policy applies to the outermost segments only. options:
    checkpoint()'s preserve_rng_state, determinism_check, debug, early_stop.
    Everything after `input` is passed by keyword.
    """
    if extra:
        raise TypeError(
            f"checkpoint_sequential takes 3 positional arguments (functions, segments, input), got "
            f"{3 + len(extra)}; the rest are keywords: checkpoint_sequential(functions, segments, input, *, "
            f"use_reentrant=None, policy=None, {', '.join(OPTIONS)}). To run several inputs through the chain, "
            "pass them as one tuple and let the first function unpack it")
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise TypeError(f"checkpoint_sequential: unknown keyword(s) {', '.join(sorted(unknown))}; it takes "
                        f"use_reentrant, policy, {', '.join(OPTIONS)}")
    options = check_options(use_reentrant, **options)
    if callable(functions) or not hasattr(functions, "__iter__"):
        raise TypeError(f"checkpoint_sequential: functions must be a list of callables (the layers in order), got "
                        f"{type(functions).__name__}; for one function, use checkpoint(function, input)")
    functions = list(functions)
    for i, f in enumerate(functions):
        if not callable(f):
            raise TypeError(f"checkpoint_sequential: functions[{i}] is a {type(f).__name__}, not a callable")
    return _run_segments(functions, segment_bounds(len(functions), segments), input, {**options, "policy": policy})


def _run_segments(functions, segments, x, options):
    for start, stop, how in segments:
        run = _Chain(functions, start, stop, how if isinstance(how, list) else None, options)
        x = checkpoint(run, x, **options) if how else run(x)
    return x


class _Chain:
    """functions[start:stop] applied in turn, or by their inner plan; named for error messages.

    An inner plan only matters when the segment is recomputed: in the
    outer forward its checkpoints keep nothing anyway.
    """

    def __init__(self, functions, start, stop, inner=None, options=None):
        self.functions, self.start, self.stop = functions, start, stop
        self.inner, self.options = inner, options
        self.name = f"layers[{start}:{stop}]"

    def __call__(self, x):
        if self.inner is not None:
            return _run_segments(self.functions, self.inner, x, {**self.options, "policy": None})
        for f in self.functions[self.start:self.stop]:
            x = f(x)
        return x


# -- the record ----------------------------------------------------------------
class Checkpoint(Function):
    """One checkpointed segment on the tape. Saves the segment's tensor inputs only.

    Its inputs (for the tape) are the segment's tensor arguments, then the
    tensors from outside it that need a gradient (parameters, and tensors
    its code read from its closure). It saves the arguments and the
    closure's computed tensors (parameters live anyway), and what a policy
    kept. Its backward runs the segment again (recompute.py) and returns the
    arguments' and the computed tensors' gradients; the parameters have had
    theirs from the inner backward, by the rules of the backward call. The
    versions it checks are those of everything the segment read, as the
    segment's forward found them.
    """

    is_checkpoint = True  # recompute.py: a checkpoint inside a segment is run again, never rebuilt

    @staticmethod
    def forward(ctx, *arrays, segment, outputs):
        # The segment has already run (checkpoint() ran it first, to learn what
        # it reads): keep its inputs, and what a policy kept; hand on its outputs.
        n = len(segment.inputs)
        computed = [a for a, t in zip(arrays[n:], segment.outer) if not t.is_leaf]
        ctx.segment = segment
        ctx.save_for_backward(*arrays[:n], *computed, *segment.stash_arrays())
        ctx.saved_versions = segment.versions(arrays)
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        segment = ctx.segment
        saved = ctx.saved_arrays
        n, c = len(segment.inputs), sum(not t.is_leaf for t in segment.outer)
        inputs = segment.stand_ins(saved[:n])
        outer_arrays = segment.outer_arrays(saved[n:n + c])
        try:
            fresh = segment.recompute(segment.plan(), inputs, outer_arrays, saved[n + c:])
        except tape.PlaceholderRead:  # its code read a value the plan skipped: recompute it in full
            segment.full = True
            inputs = segment.stand_ins(saved[:n])
            fresh = segment.recompute(segment.plan(), inputs, outer_arrays, saved[n + c:])
        # Start the inner backward from the outputs' gradient edges in the recompute.
        output_edges = fresh.output_edges()
        segment.watch_outputs_inside(ctx, output_edges)
        pairs = [(e, backend.as_array(g)) for e, g in zip(output_edges, grads) if e != (None, None)]
        leftover = {}
        fresh.close()
        if pairs:
            # The stand-ins collect the inputs' gradients, those the backward call wants (the others' records are pruned).
            task = tape.current_task()
            wanted = [t for t, x in zip(inputs, segment.inputs) if task is None or task.reaches(tape.get_gradient_edge(x))]
            leftover = fresh.backward([e for e, _ in pairs], [g for _, g in pairs], own_leaves=wanted)
        in_grads = []
        for t in inputs:
            g = t.grad.data if t.requires_grad and t.grad is not None else None
            if g is not None:
                memory.release(g, "gradients")  # it is handed on, not kept as a .grad
            in_grads.append(g)
        for t, edge in zip(segment.outer, segment.outer_edges):
            # A parameter has had its gradient in the inner backward; a computed tensor's comes back here.
            in_grads.append(None if t.is_leaf else leftover.get(edge))
        return tuple(in_grads)


class _Segment:
    """Everything a Checkpoint record needs to run its segment again.

    It keeps no tensor arrays itself (the record's save_for_backward does):
    the arguments with their tensors taken out, the forward's notes (what
    each op read and saved: recompute.py), the outside tensors' version
    counters, and the parameters (which live anyway).
    """

    def __init__(self, fn, args, kwargs, policy, options):
        self.fn = fn
        self.name = getattr(fn, "name", None) or getattr(fn, "__qualname__", None) or type(fn).__name__
        self.args, self.kwargs = args, kwargs  # for the forward only (dropped after it)
        self.template, self.inputs = _flatten((args, kwargs))  # the arguments, tensors taken out
        self.preserve_rng_state = options["preserve_rng_state"]
        self.determinism_check, self.debug = options["determinism_check"], options["debug"]
        policy = policies.resolve(policy)
        self.stash = Stash(policy, self.name) if policy is not None else None
        # Recompute in full (no early stop, nothing skipped): asked for, or needed to compare values.
        self.full = not options["early_stop"] or self.determinism_check != "default"
        self.check_meta = self.determinism_check != "none"
        self.check_ops = self.determinism_check != "none"
        self.generators = []  # (generator, its state before the segment's first draw)
        self._plan = None

    def call(self, inputs):
        """fn with `inputs` in the places of the tensor arguments."""
        args, kwargs = _unflatten(self.template, iter(inputs))
        return self.fn(*args, **kwargs)

    def forward(self):
        """Run fn once, keeping nothing (except what a policy keeps); (output structure, output tensors)."""
        self.input_versions = [t._version for t in self.inputs]
        watch = SegmentTape(self, self.inputs)
        observed = []
        if self.preserve_rng_state:
            random._observers.append(observed)
        try:
            with tape.recording(watch):
                returned = self.fn(*self.args, **self.kwargs)  # the caller's own arguments
            self.args = self.kwargs = None
        finally:
            if self.preserve_rng_state:
                random._observers.pop()  # ours: observers nest like the segments
        self.generators = observed
        self.notes = watch.notes
        template, outputs = _flatten(returned)
        self.out_origins = [(watch.origin_of_output(o), o.requires_grad) for o in outputs]
        self.outer = list(watch.outer.values())
        self.outer_versions = [t._version for t in self.outer]
        self.outer_edges = [tape.get_gradient_edge(t) for t in self.outer]
        # The parameters are held (they live anyway); a computed tensor from outside is not: the record saves its array.
        self.params = [t if t.is_leaf else None for t in self.outer]
        watch.close()
        self.out_meta = [(o.shape, o.dtype) for o in outputs]
        self.out_requires_grad = [o.requires_grad for o in outputs]
        if self.determinism_check == "values":
            self.out_values = [o.data.copy() for o in outputs]
            for v in self.out_values:
                memory.track(v)
        self._outputs = outputs  # until the record is made: then only their arrays (the record's outputs)
        return template, outputs

    def drop_forward_tensors(self):
        self._outputs = None
        self.outer = [t if t.is_leaf else _Shape(t) for t in self.outer]  # no computed tensor from outside held

    def taken_inside(self, i):
        """Whether the gradient of the record's output i, when grad() asks for it, is taken inside the recompute.

        The record is one node for all the segment's outputs, so it has no edge
        from one output to another (y, z = checkpoint(fn, x) with z = 3 * y).
        An output an op of the segment made is a tensor of the recompute too,
        and there its gradient has every path: the outer walk leaves it alone.
        """
        origin = [o for o, requires_grad in self.out_origins if requires_grad][i]
        return origin is not None and origin[0] == "op"

    def watch_outputs_inside(self, ctx, output_edges):
        """The recompute's edges of the record's outputs that the backward call asks for, watched in its stead."""
        task = tape.current_task()
        if task is None or not task.watched:
            return
        for (node, i), t in list(task.watched.items()):
            if node is not None and node.ctx is ctx and self.taken_inside(i):
                task.watched[output_edges[i]] = t

    def stash_arrays(self):
        return self.stash.hand_over() if self.stash is not None else ()

    def versions(self, arrays):
        """The record's saved_versions: every input and outside tensor, as the segment's forward found them.

        (counter, version, what, (dtype, shape)) entries, checked by tape.check_versions.
        """
        entries = [(t._version_counter, v, f"input {i} of checkpoint segment '{self.name}'", (a.dtype, a.shape))
                   for i, (t, v, a) in enumerate(zip(self.inputs, self.input_versions, arrays))]
        # One text for all the parameters (a segment of a deep chain reads many; they live until backward).
        parameter = f"a parameter read by checkpoint segment '{self.name}' (call backward before optimizer.step())"
        computed = f"a tensor checkpoint segment '{self.name}' read from outside it"
        for t, v in zip(self.outer, self.outer_versions):
            entries.append((t._version_counter, v, parameter if t.is_leaf else computed,
                            tape.shared((t.dtype, t.shape))))
        return tuple(entries)

    def stand_ins(self, arrays):
        """Detached copies of the inputs (the tape has checked their versions), with their requires_grad."""
        return [Tensor(a, requires_grad=t.requires_grad, device=backend.device_of(a))
                for t, a in zip(self.inputs, arrays)]

    def outer_arrays(self, computed):
        """Per outside tensor, its array: a parameter's own, a computed tensor's as the record saved it."""
        computed = iter(computed)
        return [p.data if p is not None else next(computed) for p in self.params]

    def plan(self):
        """What the recompute runs (recompute.make_plan), made at the first backward."""
        if self.full:
            return full_plan(self.notes)
        if self._plan is None:
            self._plan = make_plan(self.notes, self.out_origins)
        return self._plan

    def recompute(self, plan, inputs, outer_arrays, stashed):
        """Run the segment's code again on a RecomputeTape, as far as the plan says; the tape."""
        fresh = RecomputeTape(self, plan, inputs, outer_arrays, stashed)
        returned, outputs = False, None
        if plan.stop >= 0:
            with _recompute(), self.replaying_rng(), tape.recording(fresh):
                try:
                    outputs = self.call(inputs)
                    returned = True
                except StopRecompute:
                    pass
        with memory.phase("recompute"):  # the rebuilt records are part of the recompute
            fresh.finish(returned)
        if returned:
            self.check_outputs(_flatten(outputs)[1])
        return fresh

    @contextmanager
    def replaying_rng(self):
        """Put the generators where the segment found them; afterwards, back where the caller has them."""
        if not self.preserve_rng_state:
            yield
            return
        callers = [(g, g.bit_generator.state) for g, _ in self.generators]
        for g, state in self.generators:
            g.bit_generator.state = state
        try:
            yield
        finally:
            for g, state in callers:
                g.bit_generator.state = state

    def mismatch(self, what, ran):
        """Raise the determinism check's error: the recompute `what` (with debug, both op sequences)."""
        message = (f"checkpoint: the recompute of segment '{self.name}' {what}; the segment must compute the "
                   "same thing each time it runs (does it depend on state that changed between forward and "
                   "backward, or on random numbers without preserve_rng_state=True?)")
        if self.debug:
            message += "\n" + _side_by_side([n.name for n in self.notes], ran)
        else:
            message += ". Pass debug=True to see the forward's and the recompute's ops side by side."
        raise CheckpointError(message)

    def check_outputs(self, outs):
        """The recompute must return what the forward did (shapes, dtypes; values if asked)."""
        if not self.check_meta:
            return
        if len(outs) != len(self.out_meta):
            self.mismatch(f"returned {len(outs)} tensors, its forward returned {len(self.out_meta)}", [])
        for i, (o, (shape, dtype)) in enumerate(zip(outs, self.out_meta)):
            if o.shape != shape or o.dtype != dtype:
                self.mismatch(f"returned output {i} with shape {o.shape}, dtype {o.dtype}, but its forward "
                              f"returned shape {shape}, dtype {dtype}", [])
        if self.determinism_check == "values":
            for i, (o, before) in enumerate(zip(outs, self.out_values)):
                # Compared on the host (an explicit copy: this is a debugging aid).
                # rtol 1e-5: a recompute runs the same ops on the same arrays, so
                # values agree to the last bits; this only allows for reordered sums.
                now, before = backend.to_host(o.data), backend.to_host(before)
                if not numpy.allclose(now, before, rtol=1e-5, atol=1e-8, equal_nan=True):
                    worst = float(abs(now - before).max())
                    raise CheckpointError(
                        f"checkpoint: the recompute of segment '{self.name}' gave other values for "
                        f"output {i} than its forward (largest difference {worst:.3g}); is it random "
                        "without preserve_rng_state=True, or does it read state that changed?"
                    )


class _Shape:
    """What the record still needs of a computed tensor from outside once the forward is done."""

    is_leaf = False

    def __init__(self, t):
        self._version_counter, self.dtype, self.shape = t._version_counter, t.dtype, t.shape


def _side_by_side(forward, recompute):
    """The two op sequences in two columns, the first difference marked."""
    rows = [f"  {'#':>3}  {'forward':<20} recompute"]
    for i in range(max(len(forward), len(recompute))):
        f = forward[i] if i < len(forward) else "-"
        r = recompute[i] if i < len(recompute) else "(not reached)" if i >= len(recompute) else "-"
        mark = "   <- differs" if i < len(recompute) and f != r else ""
        rows.append(f"  {i:>3}  {f:<20} {r}{mark}")
    return "\n".join(rows)


# -- arguments and results as structures ---------------------------------------------
_TENSOR = object()  # where a tensor was, in a structure with its tensors taken out


def _flatten(value):
    """(the structure with each Tensor replaced by a placeholder, the Tensors in order).

    Tuples, lists and dicts are walked (nested); anything else is a leaf. A
    container with no tensor inside is kept as it is, the same object, so a
    list the function appends to is the caller's list in the recompute too.
    """
    tensors = []
    return _take_tensors(value, tensors), tensors


def _take_tensors(v, tensors):
    if isinstance(v, Tensor):
        tensors.append(v)
        return _TENSOR
    before = len(tensors)
    if isinstance(v, tuple) and hasattr(v, "_fields"):  # a namedtuple keeps its type
        out = type(v)(*(_take_tensors(x, tensors) for x in v))
    elif isinstance(v, (tuple, list)):
        out = type(v)(_take_tensors(x, tensors) for x in v)
    elif isinstance(v, dict):
        out = type(v)((k, _take_tensors(x, tensors)) for k, x in v.items())
    else:
        return v
    return out if len(tensors) > before else v


def _unflatten(template, tensors):
    """The structure back, with the next of `tensors` at each placeholder."""
    if template is _TENSOR:
        return next(tensors)
    if not _holds_tensors(template):
        return template  # the caller's own object
    if isinstance(template, tuple) and hasattr(template, "_fields"):
        return type(template)(*(_unflatten(x, tensors) for x in template))
    if isinstance(template, (tuple, list)):
        return type(template)(_unflatten(x, tensors) for x in template)
    if isinstance(template, dict):
        return type(template)((k, _unflatten(x, tensors)) for k, x in template.items())
    return template


def _holds_tensors(template):
    if template is _TENSOR:
        return True
    if isinstance(template, (tuple, list)):
        return any(_holds_tensors(x) for x in template)
    if isinstance(template, dict):
        return any(_holds_tensors(x) for x in template.values())
    return False


# -- the switch of a model that runs a chain of layers ------------------------------
class ChainCheckpointing:
    """`gradient_checkpointing_enable` / `_disable` for a model whose forward runs a chain of layers.

    One switch, Hugging Face's names, for every such model (MLP, GPT,
    nn.Sequential): a subclass says what its chain is, `checkpoint_chain()`
    (a list of callables, each the next one's input), and its forward runs it
    with `self.run_chain(x)`: layer by layer, or through checkpoint_sequential
    when checkpointing is on. The state is three attributes, None when off.
    """

    checkpoint_segments = None  # None: off; else what checkpoint_sequential takes (see enable)
    checkpoint_policy = None  # a policy (policies.py), or None: recompute everything
    checkpoint_options = None  # checkpoint()'s own keywords (preserve_rng_state, determinism_check, ...)

    def checkpoint_chain(self):
        raise NotImplementedError(f"{type(self).__name__} must say which layers it chains: define checkpoint_chain()")

    def gradient_checkpointing_enable(self, segments="every", policy=None, gradient_checkpointing_kwargs=None,
                                      **checkpoint_options):
        """Checkpoint the chain: segments 'every' (one per layer), 'sqrt', an int,
        boundaries or a schedules.Plan (see checkpoint_sequential); policy: see
        policies.py, a callable or a ready-made one's name.

        gradient_checkpointing_kwargs (Hugging Face's argument) and keywords:
        `segments` and `policy` again, and checkpoint()'s own keywords
        (use_reentrant=False, preserve_rng_state, determinism_check, debug,
        early_stop), so `gradient_checkpointing_kwargs={"use_reentrant": False}`
        works as pasted. A bad value is an error here, not in forward, and
        changes nothing.
        """
        kwargs = self._checkpointing_kwargs(segments, gradient_checkpointing_kwargs, checkpoint_options)
        segments, policy = kwargs.pop("segments", segments), kwargs.pop("policy", policy)
        self._set_checkpointing(len(self.checkpoint_chain()), segments, policy, kwargs)

    def gradient_checkpointing_disable(self):
        self.checkpoint_segments = self.checkpoint_policy = self.checkpoint_options = None

    @staticmethod
    def _checkpointing_kwargs(segments, gradient_checkpointing_kwargs, checkpoint_options):
        """One dict of the arguments, from Hugging Face's dict (also accepted in place of segments) and keywords."""
        if isinstance(segments, dict):  # model.gradient_checkpointing_enable({"use_reentrant": False})
            gradient_checkpointing_kwargs, segments = {**segments, **(gradient_checkpointing_kwargs or {})}, "every"
        if gradient_checkpointing_kwargs is not None and not isinstance(gradient_checkpointing_kwargs, dict):
            raise TypeError(f"gradient_checkpointing_kwargs must be a dict, got {type(gradient_checkpointing_kwargs).__name__}")
        return {**(gradient_checkpointing_kwargs or {}), **checkpoint_options}

    def _set_checkpointing(self, n_layers, segments, policy, options=None):
        """Check everything (segments for a chain of n_layers, policy, checkpoint options), then switch on."""
        segment_bounds(n_layers, segments)
        policy = policies.resolve(policy)
        unknown = set(options or {}) - {"use_reentrant", *OPTIONS}
        if unknown:
            raise TypeError(
                f"gradient_checkpointing_enable: unknown argument(s) {', '.join(sorted(unknown))}; it takes "
                "segments, policy, and checkpoint()'s use_reentrant, preserve_rng_state, determinism_check, "
                "debug and early_stop")
        options = check_options(**(options or {}))
        self.checkpoint_segments, self.checkpoint_policy, self.checkpoint_options = segments, policy, options

    def run_chain(self, x):
        """x through the chain: layer by layer, or checkpointed when the switch is on."""
        layers = self.checkpoint_chain()
        if self.checkpoint_segments is not None:
            return checkpoint_sequential(layers, self.checkpoint_segments, x, policy=self.checkpoint_policy,
                                         **(self.checkpoint_options or {}))
        for layer in layers:
            x = layer(x)
        return x
