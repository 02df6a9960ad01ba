"""Activation checkpointing: keep a segment's inputs, recompute its inside in backward.

The trade (Chen et al. 2016, "Training Deep Nets with Sublinear Memory
Cost"; HIPS autograd's `checkpoint` is the same idea in a dozen lines):
normally every op of a segment keeps what its backward needs on the tape
until backward reaches it. A checkpointed segment keeps only its inputs.
When backward reaches it, it runs the segment's forward once more, on a
short-lived tape of its own, backpropagates through that tape, and drops
it. Memory for time: one extra forward of the segment.

    y = checkpoint(block, x)     # the tape gets ONE record, "Checkpoint", saving x

Built only from tape primitives (tape.py, function.py):

  forward   `fn` runs on a SegmentTape, which records nothing and saves
            nothing, but notices which parameters (leaf tensors that require
            grad) the segment reads. Then one `Checkpoint` record goes on the
            active tape; its `ctx.save_for_backward` holds the segment's
            tensor inputs, so their bytes are what the tape shows as saved.
  backward  the tape first checks that no input and no parameter of the
            segment was modified in place since the segment's forward began
            (their versions, as for any record: tape.check_versions). The
            record puts back the random generators' states, re-runs `fn` on
            detached copies of the inputs on a fresh `Tape()` (memory phase
            "recompute"; anomaly mode checks it as any forward), and calls
            that tape's `backward` with the incoming gradients. Parameters
            get their `.grad` from that inner backward directly; the inputs'
            gradients are returned to the outer tape. Everything recomputed
            is freed when the record's backward returns.

Parameters, when no input requires grad: `Function.apply` records an op
only if one of its inputs requires grad, and decides that before the op's
forward runs. A segment's parameters are known only once its forward has
run. So `checkpoint()` runs the forward first (on the SegmentTape, which
lists the parameters it sees), then applies the `Checkpoint` op with those
parameters among its inputs: the segment is recorded whenever a parameter
inside needs a gradient, even if its input (a batch of data) does not.
(PyTorch's reentrant checkpoint silently gives such parameters no gradient.)
An output that depends on nothing needing a gradient comes back with
requires_grad=False, as it would without the checkpoint.

Recomputing must give the same values as the forward did:
  * random ops: the generators the segment drew from (seen through
    `random.generator`) have their states saved at the segment's first draw
    and restored for the recompute, so dropout masks match; afterwards the
    caller's generators are put back where the forward left them, as if
    nothing had been recomputed.
  * stateful layers: `is_recomputing()` is True while a segment runs again;
    BatchNorm1d does not update its running statistics then.
  * a recompute whose outputs differ in shape or dtype is an error naming
    the segment; `check_values=True` also compares values.

Nesting: a checkpoint inside a checkpointed segment runs inline while the
outer segment runs its forward (nothing is kept then anyway) and becomes a
real checkpoint when the outer segment is recomputed.

`ChainCheckpointing` (at the end) is the on/off switch a model that runs a
chain of layers inherits: `model.gradient_checkpointing_enable()`.

What does not live here: which segments to cut a chain into (schedules.py),
which ops a policy keeps instead of recomputing (policies.py).
"""

from contextlib import contextmanager

import numpy

from . import backend, memory, policies, random, tape
from .function import Function
from .policies import ReplayTape, Stash
from .schedules import segment_bounds
from .tensor import Tensor

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
    try:
        with memory.phase("recompute"):
            yield
    finally:
        _recomputing -= 1


# -- the public functions ----------------------------------------------------
def checkpoint(fn, *args, preserve_rng_state=True, policy=None, check_values=False, **kwargs):
    """fn(*args, **kwargs), keeping only the tensor arguments for backward.

    fn returns a Tensor or a tuple of Tensors. Tensor arguments are the
    segment's inputs (positional or keyword, not inside lists); anything
    else is passed through as is. policy: see policies.py (None recomputes
    everything). check_values: also compare the recomputed outputs' values
    with the forward's (keeps a copy of the outputs; a debugging aid).
    """
    active = tape.active()
    if active is None or isinstance(active, (SegmentTape, ReplayTape)):
        # No gradients wanted, or inside a segment that is running its forward
        # (which keeps nothing anyway) or replaying a policy: just run fn.
        return fn(*args, **kwargs)
    segment = _Segment(fn, args, kwargs, preserve_rng_state, policy, check_values)
    inputs = [a for a in args if isinstance(a, Tensor)] + [v for v in kwargs.values() if isinstance(v, Tensor)]
    # 1. Run fn keeping nothing; learn which parameters and generators it used.
    outputs = segment.forward(inputs)
    # 2. One record whose inputs (for the tape) are all that needs a gradient.
    needs_grad = [t for t in inputs if t.requires_grad] + segment.params
    if not needs_grad or not any(segment.out_requires_grad):
        return outputs  # no output depends on anything that needs a gradient: nothing to record
    for i, o in enumerate(outputs if segment.multiple else (outputs,)):
        if o.dtype.kind != "f":
            raise TypeError(
                f"checkpoint: segment '{segment.name}' returned output {i} of dtype {o.dtype}; the "
                "outputs of a segment that needs gradients must be floating point (compute "
                "integer results outside the checkpointed function)"
            )
    out_arrays = tuple(o.data for o in outputs) if segment.multiple else outputs.data
    recorded = Checkpoint.apply(
        *needs_grad, segment=segment, inputs=[t.data for t in inputs], outputs=out_arrays,
    )
    if not segment.multiple:
        return recorded
    # An output that depends on nothing needing a gradient: cut from the record, as without checkpoint.
    return tuple(o if needed else o.detach() for o, needed in zip(recorded, segment.out_requires_grad))


def checkpoint_sequential(functions, segments, input, preserve_rng_state=True, policy=None):
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
    that pays). A policy applies to the outermost segments only.
    """
    functions = list(functions)
    return _run_segments(functions, segment_bounds(len(functions), segments), input,
                         dict(preserve_rng_state=preserve_rng_state, policy=policy))


def _run_segments(functions, segments, x, options):
    for start, stop, how in segments:
        run = _Chain(functions, start, stop, how if isinstance(how, list) else None, options)
        x = checkpoint(run, x, **options) if how else run(x)
    return x


class _Chain:
    """functions[start:stop] applied in turn, or by their inner plan; named for error messages.

    An inner plan only matters when the segment is recomputed: its forward
    runs inside checkpoint(), where nested checkpoints run inline.
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

    Its inputs (for the tape) are the segment's inputs that require grad and
    the parameters the segment read; its backward re-runs the segment (see
    the module docstring) and returns the inputs' gradients, and None for the
    parameters, which the inner backward has already given their `.grad`.
    The versions it has checked are those of all the segment's inputs and
    parameters from before its forward, as the recompute reads them all.
    """

    @staticmethod
    def forward(ctx, *needs_grad, segment, inputs, outputs):
        # The segment has already run (checkpoint() ran it first, to learn its
        # parameters): keep its inputs, and what a policy kept, hand on its outputs.
        ctx.segment = segment
        ctx.save_for_backward(*inputs, *segment.stash_arrays())
        ctx.saved_versions = segment.versions(inputs)
        ctx.n_inputs = len(inputs)
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        segment = ctx.segment
        saved = ctx.saved_arrays
        inputs = segment.recompute_inputs(saved[: ctx.n_inputs])
        fresh = segment.recompute_tape(saved[ctx.n_inputs:])
        fresh.label = f"the recompute of checkpoint segment '{segment.name}'"
        with _recompute(), segment.replaying_rng(), tape.recording(fresh):
            outputs = segment.call(inputs)
        outputs = segment.check_outputs(outputs, fresh)
        # Start the inner backward from the outputs' gradient edges, and drop the
        # recomputed outputs: their records are all it needs, and an output no op
        # saved (the segment's last GELU's) is freed instead of held meanwhile.
        pairs = [(tape.get_gradient_edge(o), backend.as_array(g)) for o, g in zip(outputs, grads) if o.requires_grad]
        outputs = None
        if pairs:
            fresh.backward([e for e, _ in pairs], [g for _, g in pairs])
        in_grads = []
        for t in inputs:
            if not t.requires_grad:
                continue
            g = t.grad.data if t.grad is not None else None
            if g is not None:
                memory.release(g, "gradients")  # it is handed on, not kept as a .grad
            in_grads.append(g)
        return tuple(in_grads) + (None,) * len(segment.params)


class _Segment:
    """Everything a Checkpoint record needs to run its segment again.

    It keeps no tensor inputs itself (the record's save_for_backward does):
    only where they go in the arguments, and their version counters and
    versions for the in-place check.
    """

    def __init__(self, fn, args, kwargs, preserve_rng_state, policy, check_values):
        self.fn = fn
        self.name = getattr(fn, "name", None) or getattr(fn, "__qualname__", None) or type(fn).__name__
        # The arguments with each tensor replaced by a placeholder.
        self.args = tuple(_TENSOR if isinstance(a, Tensor) else a for a in args)
        self.kwargs = {k: _TENSOR if isinstance(v, Tensor) else v for k, v in kwargs.items()}
        self.preserve_rng_state = preserve_rng_state
        policy = policies.resolve(policy)
        self.stash = Stash(policy, self.name) if policy is not None else None
        self.check_values = check_values
        self.inputs = []  # per tensor input: (its version counter, its version, requires_grad)
        self.params = []  # leaf tensors requiring grad that fn read (not its inputs)
        self.generators = []  # (generator, its state before the segment's first draw)

    def call(self, inputs):
        """fn with `inputs` in the places of the tensor arguments."""
        it = iter(inputs)
        args = tuple(next(it) if a is _TENSOR else a for a in self.args)
        kwargs = {k: next(it) if v is _TENSOR else v for k, v in self.kwargs.items()}
        return self.fn(*args, **kwargs)

    def forward(self, inputs):
        """Run fn once, keeping nothing (except what a policy keeps)."""
        self.inputs = [(t._version_counter, t._version, t.requires_grad) for t in inputs]
        watch = SegmentTape(self, inputs)
        observed = []
        if self.preserve_rng_state:
            random._observers.append(observed)
        try:
            with tape.recording(watch):
                outputs = self.call(inputs)
        finally:
            if self.preserve_rng_state:
                random._observers.pop()  # ours: observers nest like the segments
        self.generators = observed
        self.params = list(watch.params.values())
        self.param_versions = [p._version for p in self.params]
        self.multiple = isinstance(outputs, (tuple, list))
        outs = tuple(outputs) if self.multiple else (outputs,)
        for i, o in enumerate(outs):
            if not isinstance(o, Tensor):
                raise TypeError(
                    f"checkpoint: segment '{self.name}' returned {type(o).__name__} as output {i}; "
                    "a checkpointed function must return a Tensor or a tuple of Tensors"
                )
        self.out_meta = [(o.shape, o.dtype) for o in outs]
        self.out_requires_grad = [o.requires_grad for o in outs]
        if self.check_values:
            self.out_values = [o.data.copy() for o in outs]
            for v in self.out_values:
                memory.track(v)
        # Plain tensors (cut from the stand-in records the SegmentTape made).
        outs = tuple(o.detach() for o in outs)
        return outs if self.multiple else outs[0]

    def stash_arrays(self):
        return self.stash.hand_over() if self.stash is not None else ()

    def versions(self, arrays):
        """The record's saved_versions: every input and parameter, as the segment's forward found them.

        (counter, version, what, array) entries, checked by tape.check_versions.
        """
        entries = [(counter, version, f"input {i} of checkpoint segment '{self.name}'", (a.dtype, a.shape))
                   for i, ((counter, version, _), a) in enumerate(zip(self.inputs, arrays))]
        entries += [(p._version_counter, version, f"a parameter read by checkpoint segment '{self.name}' "
                     "(call backward before optimizer.step())", (p.dtype, p.shape))
                    for p, version in zip(self.params, self.param_versions)]
        return tuple(entries)

    def recompute_inputs(self, arrays):
        """Detached copies of the inputs (the tape has checked their versions)."""
        return [Tensor(a, requires_grad=requires_grad, device=backend.device_of(a))
                for (_, _, requires_grad), a in zip(self.inputs, arrays)]

    def recompute_tape(self, stash_arrays):
        """A fresh tape, or one that replays what the policy kept."""
        if self.stash is None:
            return tape.Tape()
        return ReplayTape(self.stash, stash_arrays)

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

    def check_outputs(self, outputs, fresh):
        """The recompute must give what the forward gave (shapes, dtypes; values if asked)."""
        if isinstance(fresh, ReplayTape):
            fresh.finish()
        outs = tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)
        if len(outs) != len(self.out_meta):
            raise RuntimeError(
                f"checkpoint: the recompute of segment '{self.name}' returned {len(outs)} outputs, "
                f"its forward returned {len(self.out_meta)}; the segment must compute the same "
                "thing each time it runs"
            )
        for i, (o, (shape, dtype)) in enumerate(zip(outs, self.out_meta)):
            if not isinstance(o, Tensor) or o.shape != shape or o.dtype != dtype:
                got = f"shape {o.shape}, dtype {o.dtype}" if isinstance(o, Tensor) else type(o).__name__
                raise RuntimeError(
                    f"checkpoint: the recompute of segment '{self.name}' returned output {i} with "
                    f"{got}, but its forward returned shape {shape}, dtype {dtype}; the segment "
                    "must compute the same thing each time it runs (does it depend on state that "
                    "changed between forward and backward?)"
                )
        if self.check_values:
            for i, (o, before) in enumerate(zip(outs, self.out_values)):
                # Compared on the host (an explicit copy: this is a debugging aid).
                # rtol 1e-5: a recompute runs the same ops on the same arrays, so
                # values agree to the last bits; this only allows for reordered sums.
                now, before = backend.to_host(o.data), backend.to_host(before)
                if not numpy.allclose(now, before, rtol=1e-5, atol=1e-8, equal_nan=True):
                    worst = float(abs(now - before).max())
                    raise RuntimeError(
                        f"checkpoint: the recompute of segment '{self.name}' gave other values for "
                        f"output {i} than its forward (largest difference {worst:.3g}); is it random "
                        "without preserve_rng_state=True, or does it read state that changed?"
                    )
        return outs


_TENSOR = object()  # placeholder for a tensor argument in _Segment.args


# -- the tape a segment's forward runs on ---------------------------------------
class SegmentTape(tape.Tape):
    """Records nothing and saves nothing, but notices the parameters the segment reads.

    Every op of the segment still passes through `run` and `append`: `run`
    clears the op's needs_input_grad, so its save_for_backward keeps nothing
    (unless the segment's policy keeps it: policies.Stash), and `append`
    looks at the record's inputs and throws the record away at once.
    """

    def __init__(self, segment, inputs):
        super().__init__()
        self.segment = segment
        self.label = f"the forward of checkpoint segment '{segment.name}'"
        self.input_ids = {id(t) for t in inputs}
        self.params = {}  # id -> leaf tensor that requires grad, in the order first read

    def run(self, op, ctx, arrays, options):
        if self.segment.stash is not None:
            return self.segment.stash.forward(op, ctx, arrays, options)
        ctx.needs_input_grad = (False,) * len(arrays)  # so the op saves nothing
        return op.run_forward(ctx, arrays, options)

    def append(self, node):
        node.tape, node.index = self, -1
        for t in node.inputs:
            if id(t) in self.input_ids or not t.requires_grad:
                continue
            if t.is_leaf:
                self.params.setdefault(id(t), t)
            elif t._node.tape is not self:
                raise RuntimeError(
                    f"checkpoint: segment '{self.segment.name}' reads a tensor of shape {t.shape} that "
                    "requires grad and was computed outside the segment, without taking it as an "
                    "argument; its gradient would be lost. Pass it to checkpoint() as an argument."
                )
        node.release_graph()  # keep no record: the segment's intermediates are freed as in no_grad


# -- the switch of a model that runs a chain of layers ------------------------------
class ChainCheckpointing:
    """`gradient_checkpointing_enable` / `_disable` for a model whose forward runs a chain of layers.

    One switch, Hugging Face's names, for every such model (MLP, GPT,
    nn.Sequential): a subclass says what its chain is, `checkpoint_chain()`
    (a list of callables, each the next one's input), and its forward runs it
    with `self.run_chain(x)`: layer by layer, or through checkpoint_sequential
    when checkpointing is on. The state is two attributes, None when off.
    """

    checkpoint_segments = None  # None: off; else what checkpoint_sequential takes (see enable)
    checkpoint_policy = None  # a policy (policies.py), or None: recompute everything

    def checkpoint_chain(self):
        raise NotImplementedError(f"{type(self).__name__} must say which layers it chains: define checkpoint_chain()")

    def gradient_checkpointing_enable(self, segments="every", policy=None):
        """Checkpoint the chain: segments 'every' (one per layer), 'sqrt', an int,
        boundaries or a schedules.Plan (see checkpoint_sequential); policy: see
        policies.py, a callable or a ready-made one's name. A bad value is an
        error here, not in forward, and changes nothing."""
        self._set_checkpointing(len(self.checkpoint_chain()), segments, policy)

    def gradient_checkpointing_disable(self):
        self.checkpoint_segments = self.checkpoint_policy = None

    def _set_checkpointing(self, n_layers, segments, policy):
        """Check segments (for a chain of n_layers) and policy, then switch on; nothing changes if either is bad."""
        segment_bounds(n_layers, segments)
        policy = policies.resolve(policy)
        self.checkpoint_segments, self.checkpoint_policy = segments, policy

    def run_chain(self, x):
        """x through the chain: layer by layer, or checkpointed when the switch is on."""
        layers = self.checkpoint_chain()
        if self.checkpoint_segments is not None:
            return checkpoint_sequential(layers, self.checkpoint_segments, x, policy=self.checkpoint_policy)
        for layer in layers:
            x = layer(x)
        return x
