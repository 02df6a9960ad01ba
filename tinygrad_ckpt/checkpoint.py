"""Activation checkpointing: keep a segment's inputs, recompute its inside in backward.

    >>> import numpy
    >>> from tinygrad_ckpt import Tensor
    >>> from tinygrad_ckpt.tape import Tape, recording
    >>> x = Tensor(numpy.ones((2, 3), dtype=numpy.float32), requires_grad=True)
    >>> with recording(Tape()) as tape:
    ...     y = checkpoint(lambda t: (t * t).exp().sum(), x)
    >>> print(tape)              # ONE record, "Checkpoint", saving x (6 float32 = 24 B)
    Tape: 1 records, 24 B of activations saved for backward
      #0   Checkpoint       -> ()                 saved 24 B
    >>> y.backward()             # re-runs the segment on a fresh tape, then backpropagates it
    >>> x.grad.shape
    (2, 3)

The trade (Chen et al. 2016, "Training Deep Nets with Sublinear Memory
Cost"): normally every op of a segment keeps what its backward needs until
backward reaches it; a checkpointed segment keeps only its inputs, and pays
for it with at most one more forward of the segment. Tutorial 5 teaches it.

This file is the plain path, built only from tape primitives (tape.py, function.py):

  forward   `fn` runs on a `_ForwardTape`, which records nothing and keeps
            nothing, but learns which tensors from outside the segment need
            a gradient (parameters, tensors read from a closure). One
            `Checkpoint` record goes on the active tape, with those tensors
            among its inputs; it saves the segment's tensor arguments.
  backward  the record puts the random generators back where the segment
            found them (dropout masks match), runs `fn` again on detached
            copies of its inputs on a fresh tape (memory phase "recompute"),
            and backpropagates through that tape as part of the same
            backward call; the inputs' gradients go back to the outer tape.

Refinements are layered on it, each in a file of its own and each giving
the same gradients (tests/test_equivalence.py): the planned recompute,
recompute.py, chosen once where the segment is made (the default; a full
recompute without a policy, `early_stop=False`, is the plain path itself):
it runs again only what backward needs and stops early (PyTorch's early
stop), and replays what a policy kept (policies.py); the determinism check
(determinism.py); saved-tensor hooks (function.py, autograd.py).

Takes: `fn`, and tensors anywhere in its arguments (inside tuples, lists,
dicts; positional or keyword), beside values of any other kind; `fn` may
return the same kinds of structure. The keywords `use_reentrant`,
`preserve_rng_state`, `determinism_check`, `debug`, `early_stop` and
`policy` are the checkpoint's; every other keyword goes to `fn`. A
parameter inside makes the segment recorded even if no input requires grad
(as PyTorch 2.13's non-reentrant checkpoint does, torch/utils/checkpoint.py;
its reentrant one gives such parameters no gradient). `is_recomputing()` is
True while a segment runs again (BatchNorm1d then leaves its statistics
alone). Raises CheckpointError when the recompute does not match.

`ChainCheckpointing` (at the end) is the on/off switch a model that runs a
chain of layers inherits: `model.gradient_checkpointing_enable()`.

What does not live here: which segments to cut a chain into (schedules.py).
"""

from contextlib import contextmanager

import numpy

from . import autocast, backend, determinism, function, memory, policies, random, recompute, tape
from . import functional as F
from .determinism import CHECKS, CheckpointError
from .function import Function
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
        raise TypeError(f"determinism_check must be one of {', '.join(map(repr, CHECKS))}, "
                        f"got {type(determinism_check).__name__}")
    if use_reentrant:
        raise ValueError(
            "use_reentrant=True asks for PyTorch's reentrant checkpoint: an autograd Function whose backward "
            "runs backward again on the recomputed segment, which cannot see autograd.grad() or "
            "backward(inputs=...), gives parameters no gradient when no input requires one, and always "
            "recomputes the whole segment. This engine's checkpoint is the non-reentrant kind (it records the "
            "segment: every backward works through it, and it stops recomputing early). Pass "
            "use_reentrant=False, or leave it out.")
    if determinism_check not in CHECKS:
        raise ValueError(f"determinism_check must be one of {', '.join(map(repr, CHECKS))}, "
                         f"got {determinism_check!r}")
    return dict(preserve_rng_state=bool(preserve_rng_state), determinism_check=determinism_check,
                debug=bool(debug), early_stop=bool(early_stop))


# -- the public functions ----------------------------------------------------
def checkpoint(function, *args, use_reentrant=None, preserve_rng_state=True, determinism_check="default",
               debug=False, early_stop=True, policy=None, **kwargs):
    """function(*args, **kwargs), keeping only its tensor arguments for backward.

    Tensors anywhere in args and kwargs (inside tuples, lists, dicts) are the
    segment's inputs; everything else is passed through as is. It returns
    what `function` returns, the same structure, with each tensor its ops
    made that needs a gradient recorded on the tape; a tensor it returns as
    it is (an input, a parameter) comes back as that very tensor. Tensors
    `function` reads from its closure that need a gradient are taken as
    inputs too.

    use_reentrant: False or None (True is an error: see check_options).
    preserve_rng_state: replay the random generators (see the module
    docstring). determinism_check: "default", "values" or "none"; debug:
    show the op sequences when the check fails. early_stop: stop the
    recompute once backward has what it needs, and skip what it does not
    need (recompute.py; False: everything again, by the plain path if there
    is no policy). policy: see policies.py (None: keep nothing). Raises
    CheckpointError in backward when the recompute does not match the forward.
    """
    options = check_options(use_reentrant, preserve_rng_state, determinism_check, debug, early_stop)
    if not callable(function):
        raise TypeError(f"checkpoint: the first argument must be the function to run, got {type(function).__name__}")
    if tape.active() is None:
        return function(*args, **kwargs)  # no gradients wanted: nothing to keep
    segment = _Segment(function, args, kwargs, options)
    # What runs it: the segment itself (the plain path), or, by default, the planned recompute layered on
    # it (recompute.py). Chosen once, here.
    path = recompute.choose(segment, policy, options)
    # 1. Run function keeping nothing; learn what it read and what it returned.
    template, outputs = segment.forward(path)
    # 2. One record, whose inputs are the tensor arguments and the outside tensors that need a gradient,
    #    and whose outputs are those the segment's ops made that need one.
    wanted = [o for o, r in zip(outputs, segment.recorded) if r]
    if wanted and (segment.outer or any(t.requires_grad for t in segment.inputs)):
        recorded = iter(Checkpoint.apply(*segment.inputs, *segment.outer, segment=segment, path=path,
                                         outputs=tuple(o.data for o in wanted)))
        segment.drop_forward_tensors()
    else:  # nothing to differentiate
        recorded, segment.recorded = None, [False] * len(outputs)
    # Each output: the record's; or the very tensor fn was given or read, returned as it is (as without
    # the checkpoint); or, depending on nothing that needs a gradient, cut from the record.
    return _unflatten(template, iter(next(recorded) if r else o.detach() if inside else o
                                     for o, r, inside in zip(outputs, segment.recorded, segment.made_inside)))


def checkpoint_sequential(functions, segments, input, *extra, xs=None, use_reentrant=None, policy=None, **options):
    """Run `functions` one after the other on `input`, checkpointing segments of them.

    functions: a list of callables, or an nn.Sequential (any ChainCheckpointing
    model: its checkpoint_chain(), the layers in order), as PyTorch's takes one.

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

    xs: a Tensor read beside the chain, one entry per function along its
    first axis (an LSTM's input at each time step, as jax.lax.scan's xs).
    Then `input` is the first carry (a tensor, or a tuple or list of them),
    function i is called f(xs[i], carry) -> (y_i, carry) (input first, as an
    RNN cell; jax.lax.scan's f is (carry, x) -> (carry, y)), a checkpointed
    segment keeps its slice of xs beside its carry, and the result is
    (the y_i stacked along a new first axis, the last carry).
    """
    if extra:
        raise TypeError(
            f"checkpoint_sequential takes 3 positional arguments (functions, segments, input), got "
            f"{3 + len(extra)}; the rest are keywords: checkpoint_sequential(functions, segments, input, *, "
            f"xs=None, use_reentrant=None, policy=None, {', '.join(OPTIONS)}). To run several inputs through the chain, "
            "pass them as one tuple and let the first function unpack it")
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise TypeError(f"checkpoint_sequential: unknown keyword(s) {', '.join(sorted(unknown))}; it takes "
                        f"xs, use_reentrant, policy, {', '.join(OPTIONS)}")
    options = check_options(use_reentrant, **options)
    if isinstance(functions, ChainCheckpointing):  # an nn.Sequential, as PyTorch's takes one: its layers in order
        functions = functions.checkpoint_chain()
    if callable(functions) or not hasattr(functions, "__iter__"):
        raise TypeError(f"checkpoint_sequential: functions must be a list of callables (the layers in order), got "
                        f"{type(functions).__name__}; for one function, use checkpoint(function, input)")
    functions = list(functions)
    for i, f in enumerate(functions):
        if not callable(f):
            raise TypeError(f"checkpoint_sequential: functions[{i}] is a {type(f).__name__}, not a callable")
    if xs is not None and not (isinstance(xs, Tensor) and xs.ndim >= 1 and xs.shape[0] == len(functions)):
        raise ValueError(f"checkpoint_sequential: xs must be a Tensor with one entry per function along its first "
                         f"axis ({len(functions)}), got {getattr(xs, 'shape', type(xs).__name__)}")
    return _run_segments(functions, segment_bounds(len(functions), segments), input, {**options, "policy": policy},
                         xs)


def _run_segments(functions, segments, x, options, xs=None):
    """x through each segment of functions in turn, checkpointed where it says; with xs, (ys, x)."""
    if xs is None:
        for start, stop, how in segments:
            run = _Chain(functions, start, stop, how if isinstance(how, list) else None, options)
            x = checkpoint(run, x, **options) if how else run(x)
        return x
    pieces = xs.split([stop - start for start, stop, _ in segments]) if len(segments) > 1 else [xs]  # views
    ys = []
    for (start, stop, how), piece in zip(segments, pieces):
        run = _Chain(functions, start, stop, how if isinstance(how, list) else None, options, "steps")
        y, x = checkpoint(run, piece, x, **options) if how else run(piece, x)
        ys.append(y)
    return (ys[0] if len(ys) == 1 else F.cat(ys, axis=0)), x


class _Chain:
    """functions[start:stop] applied in turn, or by their inner plan; named for error messages.

    run(x) -> x; for a chain that reads a sequence beside it (checkpoint_sequential's
    xs), run(xs, x) -> (ys, x), the slice of the sequence first. An inner plan only
    matters when the segment is recomputed: in the outer forward its checkpoints
    keep nothing anyway.
    """

    def __init__(self, functions, start, stop, inner=None, options=None, unit="layers"):
        self.functions, self.start, self.stop = functions, start, stop
        self.inner, self.options = inner, options
        self.name = f"{unit}[{start}:{stop}]"

    def __call__(self, *args):
        *xs, x = args  # xs: [] or [the slice of the sequence read beside the chain]
        if self.inner is not None:
            return _run_segments(self.functions, self.inner, x, {**self.options, "policy": None}, *xs)
        if not xs:
            for f in self.functions[self.start:self.stop]:
                x = f(x)
            return x
        ys = []
        for f, x_t in zip(self.functions[self.start:self.stop], xs[0].split(1, dim=0)):  # one record for the views
            y, x = f(x_t.squeeze(0), x)
            ys.append(y)
        return F.stack(ys), x


# -- the record ----------------------------------------------------------------
class Checkpoint(Function):
    """One checkpointed segment on the tape. Saves the segment's tensor inputs only.

    Its inputs (for the tape) are the segment's tensor arguments, then the
    tensors from outside it that need a gradient (parameters, and tensors
    its code read from its closure). It saves the arguments and the
    closure's computed tensors (parameters live anyway), and what a policy
    kept. Its backward runs the segment again and returns the arguments' and
    the computed tensors' gradients; the parameters have had theirs from the
    inner backward, by the rules of the backward call. The versions it
    checks are those of everything the segment read, as its forward found them.
    """

    is_checkpoint = True  # recompute.py: a checkpoint inside a segment is run again, never rebuilt
    mixes_dtypes = True  # token ids and float parameters, float32 inputs and float64 weights: whatever fn reads

    @staticmethod
    def forward(ctx, *arrays, segment, path, outputs):
        # The segment has already run (checkpoint() ran it first, to learn what
        # it reads): keep its inputs, and what a policy kept; hand on its outputs.
        n = len(segment.inputs)
        computed = [a for a, t in zip(arrays[n:], segment.outer) if not t.is_leaf]
        ctx.segment, ctx.path = segment, path
        ctx.save_for_backward(*arrays[:n], *computed, *path.kept_arrays())
        ctx.saved_versions = segment.versions(arrays)
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        segment = ctx.segment
        # 1. Recompute: run the segment again, on stand-ins for its inputs, on a short-lived tape of its own.
        inputs, recompute_tape, output_edges = ctx.path.recompute(ctx.saved_arrays)
        # 2. Backpropagate through it, from the outputs' gradients, as part of the same backward call
        #    (the stand-ins collect the gradients the call wants for the inputs).
        edges, grads = segment.gradients_in(ctx, output_edges, grads)
        leftover = recompute_tape.backward(edges, grads, own_leaves=tape.current_task().wanted(inputs, segment.inputs))
        # 3. Hand the inputs' gradients on to the outer tape.
        return segment.gradients_out(inputs, leftover)


class _Segment:
    """Everything a Checkpoint record needs to run its segment again: the plain path.

    It keeps no tensor arrays itself (the record's save_for_backward does):
    the arguments with their tensors taken out, and the outside tensors
    (parameters, which live anyway; for a computed one, its version counter).
    Its forward runs on a _ForwardTape, which keeps nothing; its recompute
    runs the whole segment again on a fresh tape. The planned recompute
    (recompute.PlannedRecompute) takes those two over, and leaves the rest
    to this; it holds the segment, never the reverse, so that a segment is
    freed with its record.
    """

    def __init__(self, fn, args, kwargs, options):
        self.fn = fn
        self.name = getattr(fn, "name", None) or getattr(fn, "__qualname__", None) or type(fn).__name__
        self.args, self.kwargs = args, kwargs  # for the forward only (dropped after it)
        self.template, self.inputs = _flatten((args, kwargs))  # the arguments, tensors taken out
        self.preserve_rng_state = options["preserve_rng_state"]
        self.determinism_check, self.debug = options["determinism_check"], options["debug"]
        self.checks = self.determinism_check != "none"
        self.generators = []  # (generator, its state before the segment's first draw)

    def call(self, inputs):
        """fn again, with `inputs` in the places of the tensor arguments; the tensors it returns, in order."""
        args, kwargs = _unflatten(self.template, iter(inputs))
        return _flatten(self.fn(*args, **kwargs))[1]

    def forward(self, path):
        """Run fn once on path's forward tape, keeping nothing (except what a policy keeps);
        (output structure, output tensors). path: this segment, or the refinement that runs it."""
        self.input_versions = [t._version for t in self.inputs]
        self.autocast = autocast.get_dtype()  # the recompute makes the same casts (autocast.py)
        forward_tape = path.forward_tape()
        with random.observing(self.preserve_rng_state) as self.generators, tape.recording(forward_tape):
            returned = self.fn(*self.args, **self.kwargs)  # the caller's own arguments
        self.args = self.kwargs = None
        template, outputs = _flatten(returned)
        # An output an op of the segment made (not an input or an outside tensor returned as it is).
        self.made_inside = [o._node is not None and o._node.tape is forward_tape for o in outputs]
        self.recorded = [o.requires_grad and inside for o, inside in zip(outputs, self.made_inside)]
        forward_tape.learn(self, outputs)  # the outside tensors (and what the path keeps of the forward)
        self.outer_versions = [t._version for t in self.outer]
        self.outer_edges = [tape.get_gradient_edge(t) for t in self.outer]
        determinism.remember_outputs(path, outputs)
        return template, outputs

    def recompute(self, saved):
        """Run the segment's code again on a fresh tape: (the stand-ins for its inputs, the tape,
        the gradient edges of its outputs that need one). saved: the record's saved arrays."""
        inputs = self.stand_ins(saved)
        recompute_tape = determinism.CheckedTape(self) if self.checks else tape.Tape()
        with self.running_again(recompute_tape):
            outputs = self.call(inputs)
        if self.checks:
            recompute_tape.check_all_ran()
            determinism.check_outputs(self, outputs)
        return inputs, recompute_tape, [tape.get_gradient_edge(o) for o, r in zip(outputs, self.recorded) if r]

    @contextmanager
    def running_again(self, recompute_tape):
        """Inside: the segment's code runs again, recording onto recompute_tape.

        The random generators are where the segment's forward found them
        (afterwards, back where the caller has them); is_recomputing() is True;
        what is saved is the recompute's own, packed by no saved-tensor hooks;
        autocast is as the forward had it (backward usually runs outside it).
        """
        global _recomputing
        callers = [(g, g.bit_generator.state) for g, _ in self.generators]
        for g, state in self.generators:
            g.bit_generator.state = state
        _recomputing += 1
        depth = function.push_no_saved_tensors_hooks()
        try:
            with memory.phase("recompute"), tape.recording(recompute_tape), autocast.restored(self.autocast):
                yield
        finally:
            function.pop_saved_tensors_hooks(depth)
            _recomputing -= 1
            for g, state in callers:
                g.bit_generator.state = state

    # -- the rest of what the planned recompute takes over --------------------------
    def forward_tape(self):
        return _ForwardTape(self)

    def kept_arrays(self):  # what the record saves beside the inputs: nothing more
        return ()

    # -- bookkeeping: the record's versions, stand-ins, the gradients in and out ------
    def drop_forward_tensors(self):
        self.outer = [t if t.is_leaf else _ComputedOutside(t) for t in self.outer]  # no computed tensor from outside held

    def versions(self, arrays):
        """The record's saved_versions: every input and outside tensor, as the segment's forward found them.

        (counter, version, what, (dtype, shape)) entries, checked by versions.check_versions.
        """
        entries = [(t._version_counter, v, f"input {i} of checkpoint segment '{self.name}'", (a.dtype, a.shape))
                   for i, (t, v, a) in enumerate(zip(self.inputs, self.input_versions, arrays))]
        # One text for all the parameters (a segment of a deep chain reads many; they live until backward).
        parameter = f"a parameter read by checkpoint segment '{self.name}' (call backward before optimizer.step())"
        computed = f"a tensor checkpoint segment '{self.name}' read from outside it"
        for t, v in zip(self.outer, self.outer_versions):
            entries.append((t._version_counter, v, parameter if t.is_leaf else computed, (t.dtype, t.shape)))
        return tuple(entries)

    def stand_ins(self, saved):
        """Detached copies of the inputs (the tape has checked their versions), with their requires_grad."""
        return [Tensor(a, requires_grad=t.requires_grad, device=backend.device_of(a))
                for t, a in zip(self.inputs, saved)]

    def gradients_in(self, ctx, output_edges, grads):
        """(edges, arrays): where the outputs' gradients enter the recompute, for its backward.

        The record is one node for all the segment's outputs, so it has no edge
        from one output to another (y, z = checkpoint(fn, x) with z = 3 * y).
        Each of its outputs is a tensor of the recompute too, and there its
        gradient has every path: the outer walk leaves a watched output's to this.
        """
        task = tape.current_task()
        for (node, i), t in list(task.watched.items()):
            if node is not None and node.ctx is ctx:
                task.watched[output_edges[i]] = t
        pairs = [(e, backend.as_array(g)) for e, g in zip(output_edges, grads) if e != (None, None)]
        return [e for e, _ in pairs], [g for _, g in pairs]

    def gradients_out(self, inputs, leftover):
        """The record's gradients: the stand-ins' (handed on, not kept as a .grad), then per outside tensor,
        a computed one's from `leftover` (a parameter has had its own in the recompute's walk)."""
        grads = [t.grad.data if t.requires_grad and t.grad is not None else None for t in inputs]
        for g in grads:
            if g is not None:
                memory.release(g, "gradients")
        return (*grads, *(None if t.is_leaf else leftover.get(edge) for t, edge in zip(self.outer, self.outer_edges)))

    def mismatch(self, what, ran):
        """Raise the determinism check's error (determinism.py)."""
        determinism.mismatch(self.name, what, [name for name, _ in self.ops], ran, self.debug)


class _ForwardTape(tape.Tape):
    """The plain path's forward: records nothing and keeps nothing, but learns what the record needs.

    Every op runs with the gradients it would need and drops what it saved
    (noting its name and the shapes it saved, for the determinism check); each
    record it makes tells which tensors from outside the segment need a
    gradient (parameters, and tensors the code reads from its closure), and
    is let go at once. Registering a hook does nothing here: the recompute
    runs the code again, hooks and all.
    """

    replays_hooks = True

    def __init__(self, segment):
        super().__init__()
        self.label = f"the forward of checkpoint segment '{segment.name}'"
        self.inputs = {id(t) for t in segment.inputs}
        self.ops = []  # determinism.op_record per op: what the determinism check compares
        self.outer = {}  # id -> tensor from outside that needs a gradient, in the order first read

    def run(self, op, ctx, arrays, options):
        ctx.counted = False  # nothing here is counted as saved
        out = op.run_forward(ctx, arrays, options)
        self.ops.append(determinism.op_record(op, ctx))
        ctx.saved_arrays = ()
        return out

    def append(self, node):
        node.tape, node.index = self, -1
        for t in node.inputs:
            if t is not None and t.requires_grad and id(t) not in self.inputs and (t.is_leaf or t._node.tape is not self):
                self.outer.setdefault(id(t), t)
        node.release_graph()  # keep no graph: the segment's intermediates are freed as under no_grad

    def learn(self, segment, outputs):
        """After the forward: the outside tensors, and the ops for the determinism check, on the segment."""
        segment.outer, segment.ops = list(self.outer.values()), self.ops

class _ComputedOutside:
    """What the record still needs of a computed tensor from outside once the forward is done:
    its version counter (checked in backward), dtype and shape; not its array (the record saves that)."""

    is_leaf = False

    def __init__(self, t):
        self._version_counter, self.dtype, self.shape = t._version_counter, t.dtype, t.shape


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
    A chain whose length is the input's (the LSTM's time steps) says what
    length segments are checked against: `checkpoint_chain_length`.
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
        self._set_checkpointing(self.checkpoint_chain_length(segments), segments, policy, kwargs)

    def checkpoint_chain_length(self, segments):
        """The length `segments` are checked against when switched on: the chain's (the LSTM's is the input's)."""
        return len(self.checkpoint_chain())

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
