"""The tape: a list of op records in forward order, walked in reverse by backward.

While gradients are recorded, every differentiable op appends one `Node` to
the active tape: the op, where its inputs' gradients go (the records that
produced them, or the leaf tensors), its outputs and the arrays it saved for
backward. `loss.backward()` walks that list from the end, hands
each record the gradient of its outputs, and adds the gradients it returns
into its inputs (added, never assigned: a tensor used twice gets both).
Each record drops its saved arrays as soon as its backward has run; a
second backward through it is refused, unless it saved nothing (as in
PyTorch: `c = b + 1` may be backpropagated twice).

    >>> from tinygrad_ckpt import Tensor
    >>> with recording(Tape()) as tape:
    ...     x = Tensor([1.0, 2.0], requires_grad=True)
    ...     y = (x + x) * x
    >>> print(tape)              # the records, oldest first
    Tape: 2 records, 16 B of activations saved for backward
      #0   Add              -> (2,)               saved 0 B
      #1   Mul              -> (2,)               saved 16 B

Lifetime, decided on purpose: the tape holds its records by *weak*
reference, and a record is owned by the tensors it produced and by the
records that used them. A record lives exactly as long as some tensor
computed from it, as PyTorch's graph does, so
a forward that is never backpropagated (an evaluation loop with gradients on,
a loss that is dropped) frees itself; nothing piles up on the tape. And a
record does not keep its input tensors (only their records), so an
intermediate array that no op saved is freed as soon as the forward is done
with it, as in PyTorch.

Tapes nest. `no_grad()` makes "no tape" active (nothing is recorded);
`recording(Tape())` makes a fresh tape active, which is how a checkpoint
segment re-runs its forward on a short-lived tape during backward.

Where leaf gradients go is decided by the backward call, not by the walk:
one call (`backward()`, `backward(inputs=[...])`, `autograd.grad(...)`) is
a `GradientTask`, and every walk it starts, a checkpoint's inner walk
included, delivers leaf gradients by its rules: into every leaf's .grad,
into the named inputs' only, or into a dict that grad() returns. A call for
some inputs first prunes the graph, as PyTorch does: a record that cannot
reach them does not run.

Gradient hooks (`Tensor.register_hook`): a computed tensor's hooks live on
its record, per output, so they outlive the tensor, as PyTorch's do on its
grad_fn; the walk calls them with the tensor's whole gradient just before
the record's backward runs. A leaf's hooks live on the leaf; the task calls
them once, with the leaf's whole gradient of this call, when the walk ends.
A hook gets its gradient read-only, as PyTorch's register_hook docstring
asks ("The hook should not modify its argument"): the array may be another
record's gradient too (Add hands one array to both its inputs). One that
writes to it is refused, by name; it returns the new gradient instead.

Checks the walk makes, each raising before it runs a record's backward,
each one line in the walk and living with its own concept:
  * a saved array whose tensor was modified in place since it was saved
    (versions.py): PyTorch's "modified by an inplace operation" error;
  * a record whose saved arrays a first backward already freed: PyTorch's
    "Trying to backward through the graph a second time", naming the call
    and the record (a call for some inputs walks such a record rather than
    prune it: its edges are gone, so where it led is unknown);
  * a gradient of the wrong shape or dtype from a backward
    (`validate_gradients`, PyTorch's validate_outputs);
  * in anomaly mode, a gradient that is NaN or infinite (anomaly.py).

What does not live here: how an op is written and what it saves
(function.py), checkpointing (checkpoint.py, recompute.py), in-place
versions (versions.py), anomaly mode (anomaly.py), the public faces
(`autograd.grad`, `detect_anomaly`: autograd.py).
"""

import itertools
import weakref
from contextlib import contextmanager

import numpy

from . import anomaly, backend, memory, observe, versions


class Node:
    """One record on the tape: one op run, with what its backward needs.

    `edges` says where each input's gradient goes, as PyTorch's
    `grad_fn.next_functions` does: `(record, i)` for an input computed by
    another op (output i of that record), `(None, tensor)` for a leaf that
    requires grad (its .grad), `(None, None)` for an input that needs none.
    The record does not hold its input tensors: that would keep every
    intermediate array alive until backward, even one no op saved (a
    softmax's input, a dropout's output). `inputs` gives them back while
    they are alive (None once freed).
    """

    __slots__ = ("op", "ctx", "edges", "_inputs", "input_shapes", "input_dtypes", "outputs", "shapes", "dtypes",
                 "tape", "index", "stack", "hooks", "__weakref__")

    def __init__(self, op, ctx, inputs, outputs):
        self.op = op  # the Function subclass; its backward is op.backward
        self.ctx = ctx
        self.edges = tuple(_edge(t) for t in inputs)  # strong: the graph backward walks
        self._inputs = tuple(weakref.ref(t) for t in inputs)
        self.input_shapes = tuple(t.shape for t in inputs)
        self.input_dtypes = tuple(t.dtype for t in inputs)  # what each input's gradient must be
        # Weak: the outputs own this record, not the other way round.
        self.outputs = tuple(weakref.ref(t) for t in outputs)
        self.shapes = tuple(t.shape for t in outputs)
        self.dtypes = tuple(t.dtype for t in outputs)
        for t in outputs:
            t._node = self
            t._recorded_version = t._version_counter.value  # what this record computed
        self.hooks = None  # {output index: [hook, ...]} once register_hook is called (module docstring)
        # `stack`, where the record was created, is set in anomaly mode only (see there).

    @classmethod
    def rebuilt(cls, op, ctx, edges, input_meta, shapes, dtypes, hooks=None, stack=None):
        """A record made without running its op: a checkpoint's recompute rebuilds the
        records whose forward it skips from what the segment's forward noted (recompute.py).
        input_meta: (shape, dtype) per input; stack: where the forward created it (anomaly mode)."""
        node = cls.__new__(cls)
        node.op, node.ctx, node.edges, node._inputs = op, ctx, tuple(edges), ()
        node.input_shapes = tuple(m[0] for m in input_meta)
        node.input_dtypes = tuple(m[1] for m in input_meta)
        node.outputs, node.shapes, node.dtypes = (), tuple(shapes), tuple(dtypes)
        node.hooks = hooks
        if stack is not None:
            node.stack = stack
        return node

    @property
    def inputs(self):
        """The input tensors that are still alive (None for a freed intermediate)."""
        return tuple(r() for r in self._inputs)

    def release_graph(self):
        """Let go of the records behind this one (after its backward has run)."""
        self.edges = self._inputs = ()

    @property
    def name(self):
        return self.op.__name__

    def describe(self):
        """How error messages name this record: 'Exp (record #3 on the tape)'."""
        if self.index < 0:
            return f"{self.name} (in {self.tape.label}, not kept on a tape)"
        return f"{self.name} (record #{self.index} on {self.tape.label})"

    @property
    def freed(self):
        return self.ctx.saved_arrays is None

    @property
    def activation_nbytes(self):
        """Bytes this record keeps for backward, parameters left out (they live anyway)."""
        return sum(a.nbytes for a in self.ctx.held_arrays() if memory.category(a) != "parameters")

    @property
    def saved_parameters(self):
        """How many parameters this record keeps for backward (listed, not charged)."""
        return sum(1 for a in self.ctx.held_arrays() if memory.category(a) == "parameters")

    def __repr__(self):
        shapes = ", ".join(str(s) for s in self.shapes)
        if self.freed:
            return f"#{self.index:<3} {self.name:<16} -> {shapes:<18} freed"
        params = self.saved_parameters
        also = f" (+{params} parameter{'s' if params > 1 else ''})" if params else ""
        return f"#{self.index:<3} {self.name:<16} -> {shapes:<18} saved {memory.format_bytes(self.activation_nbytes)}{also}"


_numbers = itertools.count()


class Tape:
    """Records in forward order (held weakly; see the module docstring).

    `number` tells tapes apart (each new tape gets the next one): memory
    timelines name a record by (tape number, index), since a checkpoint's
    recompute numbers its records on a fresh tape from 0 again.
    """

    label = "the tape"  # how error messages name it; a checkpoint's recompute tape says whose it is
    replays_hooks = False  # True on a checkpoint's recompute tape: register_hook does nothing there

    def __init__(self):
        self.number = next(_numbers)
        self.records = []  # weakref.ref(Node), oldest first
        self.count = 0  # records ever appended, to number them
        self._next_prune = 1024

    def append(self, node):
        node.tape, node.index = self, self.count
        self.count += 1
        self.records.append(weakref.ref(node))
        # Forget dead references, so a forward never backpropagated leaves nothing behind; after the list
        # doubles, so appending stays O(1) on a long forward (benchmarks/lesson_speed.py: what it buys).
        if len(self.records) >= self._next_prune:
            self.records = [r for r in self.records if r() is not None]
            self._next_prune = 2 * len(self.records) + 1024

    def run(self, op, ctx, arrays, options):
        """Run one op's forward. A checkpoint's tapes override this (recompute.py)."""
        return op.run_forward(ctx, arrays, options)

    def nodes(self):
        """The live records, oldest first."""
        return [n for n in (r() for r in self.records) if n is not None]

    def __len__(self):
        return len(self.nodes())

    def __repr__(self):
        nodes = self.nodes()
        saved = sum(n.activation_nbytes for n in nodes if not n.freed)
        lines = [f"Tape: {len(nodes)} records, {memory.format_bytes(saved)} of activations saved for backward"]
        lines += ["  " + repr(n) for n in nodes]
        return "\n".join(lines)

    def backward(self, tensors, grads, retain_graph=False, own_leaves=()):
        """Reverse-mode sweep: d(tensors)/d(leaf) * grads, delivered as the backward call decides.

        Called from `Tensor.backward` and `autograd.grad` (through
        `run_backward`, which makes the call's GradientTask), and by a
        checkpoint's record for its inner walk, which joins the running task.
        `tensors` may also be gradient edges (`get_gradient_edge(t)`), as in
        PyTorch: then the tensors themselves, and their arrays, may be gone.
        own_leaves: leaves whose gradients this walk adds to their own .grad,
        whatever the task says (a checkpoint's stand-ins for its inputs).
        Returns the gradients left for records of other tapes, {edge: array}:
        a checkpoint's inner walk hands them on to the outer record (a tensor
        the segment read from outside it).
        """
        global _task
        task = _task if _task is not None else GradientTask()  # a walk started directly: a plain backward
        previous, _task = _task, task
        outer_pruning = task.pruning  # an inner walk prunes its own graph; the outer walk's comes back after
        task.depth += 1
        try:
            pending = self._walk(tensors, grads, retain_graph, task, {id(t) for t in own_leaves})
        finally:
            task.depth -= 1
            task.pruning = outer_pruning
            _task = previous
        for record, _ in pending:  # a gradient that found no live record to go to
            if record.freed:
                _raise_freed(record, task)
        if not retain_graph:  # freed records will never be walked again
            self.records = [r for r in self.records if r() is not None and not r().freed]
        return pending


    def _walk(self, tensors, grads, retain_graph, task, own):
        """backward's loop: each record, newest first, gets its outputs' gradients and hands on its inputs'."""
        pending = {}  # (record, output index) -> gradient array not yet handed to that record
        if anomaly.enabled:
            for g in grads:
                anomaly.check_start(g)
        # Gradient arrays placed somewhere (a .grad or a pending sum): never taken
        # over or written in place. Weak, by id: an id alone could be reused by a
        # new array once the old one is freed, and would force a needless copy.
        seen = {id(g): weakref.ref(g) for g in grads}
        edges = [t if isinstance(t, tuple) else _edge(t) for t in tensors]
        tensors = None  # the edges are all the walk needs
        task.pruning = task.prune(edges, own) if task.only is not None else None
        for e, g in zip(edges, grads):
            _deliver(e, g, pending, seen, task, own)
        with memory.phase("backward" if memory.tracker.phase != "recompute" else "recompute"):
            for ref in reversed(self.records):
                node = ref()
                if node is None:
                    continue
                out_grads = [pending.pop((node, i), None) for i in range(len(node.shapes))]
                if all(g is None for g in out_grads):
                    continue  # this record does not lead to what we differentiate
                if node.hooks:
                    out_grads = run_tensor_hooks(node, out_grads)
                if task.watched:
                    task.capture_outputs(node, out_grads, seen)
                if task.pruning is not None and not task.reaches((node, None)):
                    continue  # it cannot reach the inputs asked for: not run, as PyTorch prunes the graph
                if node.freed:
                    _raise_freed(node, task)
                if node.ctx.packed is not None:
                    node.ctx.unpack(node)  # saved_tensors_hooks: the saved arrays come back (function.py)
                if node.ctx.saved_versions:
                    versions.check_versions(node)
                out_grads = [g if g is not None else _zeros(node, i, out_grads) for i, g in enumerate(out_grads)]
                in_grads = validate_gradients(node, node.op.run_backward(node.ctx, out_grads))
                if anomaly.enabled:
                    anomaly.check_gradients(node, out_grads, in_grads)
                if not retain_graph:
                    node.ctx.free()
                elif node.ctx.packed is not None:
                    node.ctx.repack()  # keep the packed form for the next backward, drop the arrays
                for edge, g in zip(node.edges, in_grads):
                    if g is not None and (edge[0] is not None or edge[1] is not None):
                        _deliver(edge, g, pending, seen, task, own)
                # Drop this record's gradients now, not when the next record's
                # backward reassigns the names: else they outlive their use.
                out_grads = in_grads = g = None
                if node.freed:
                    # Let go of the records behind this one too: one that no
                    # gradient is pending for is freed now, not when the loss
                    # is dropped, so memory falls during backward as in PyTorch.
                    # (A record that saved nothing keeps its edges: a second
                    # backward may walk through it, as in PyTorch.)
                    node.release_graph()
                if observe.observers:
                    memory.tracker.event(node.name, "backward", tape=self.number, record=node.index)
        if task.depth == 1:
            task.finish(seen)
        return pending

def run_backward(tensors, grads, retain_graph=False, inputs=None, capture=False):
    """One backward call: a GradientTask, then the walk of the tape the tensors were recorded on.

    inputs: None (every leaf that requires grad gets its .grad) or the tensors
    that alone receive gradients; capture: return them ({id: array}) instead
    of adding them to .grad (autograd.grad). Returns the task.
    """
    task = GradientTask(inputs, capture)
    task.call = "autograd.grad()" if capture else "backward()" if inputs is None else "backward(inputs=...)"
    records = [t._node for t in tensors if t._node is not None]
    if any(r.index < 0 for r in records):
        raise RuntimeError(
            "backward inside a checkpointed function's forward: the segment's forward keeps no records "
            "(a checkpoint records the whole segment as one, checkpoint.py), so there is nothing to walk. "
            "Take the gradient outside the checkpoint, or do not checkpoint this function.")
    owner = records[0].tape if records else Tape()
    if any(r.tape is not owner for r in records):
        raise RuntimeError("backward: the outputs were recorded on different tapes; differentiate each "
                           "tape's outputs in a call of its own")
    global _task
    previous, _task = _task, task
    try:
        owner.backward(tensors, grads, retain_graph=retain_graph)
    finally:
        _task = previous
    return task


class GradientTask:
    """One backward call: which tensors receive gradients, and where.

    Every walk the call starts (a checkpoint's inner walk too) delivers leaf
    gradients through it, so `backward(inputs=...)` and `autograd.grad` see
    through checkpointed segments. Leaves with hooks, and the leaves grad()
    returns, are summed first and delivered once, when the call's outermost
    walk ends, so a hook sees the leaf's whole gradient, as in PyTorch.
    """

    def __init__(self, inputs=None, capture=False):
        self.only = None if inputs is None else {id(t): t for t in inputs}
        self.capture = capture
        self.captured = {}  # id(tensor) -> its gradient (capture=True)
        self.deferred = {}  # id(leaf) -> [leaf, summed gradient, whether that array is ours to keep]
        # Computed (non-leaf) tensors among `inputs`: their gradient is taken as it reaches their record.
        self.watched = {_edge(t): t for t in (inputs or ()) if t._node is not None}
        self.depth = 0  # walks of this call running now (a checkpoint's inner walk is the second)
        self.pruning = None  # while a walk for some inputs runs: what prune() found (None: every record runs)
        self.call = "backward()"  # how errors name the call: "backward()", "backward(inputs=...)", "autograd.grad()"

    def to_leaf(self, t, g, seen, own):
        """Gradient `g` for leaf `t`: into its .grad now, or summed until the call ends."""
        if id(t) in own:
            _accumulate(t, g, seen)
        elif self.only is not None and id(t) not in self.only:
            return  # not asked for (backward(inputs=...), grad())
        elif self.capture or t._hooks:
            entry = self.deferred.get(id(t))
            if entry is None:
                self.deferred[id(t)] = [t, g, g.base is None and not _placed(g, seen)]
            else:
                entry[1], entry[2] = backend.as_array(entry[1] + g), True  # out of place: g may be shared
            seen[id(g)] = weakref.ref(g)
        else:
            _accumulate(t, g, seen)

    def prune(self, edges, own):
        """(whether each record behind `edges` leads to an input asked for, the leaves asked for).

        PyTorch prunes its graph the same way before a backward(inputs=...) or
        grad(): a record that cannot reach the inputs never runs. The leaves
        asked for are the call's inputs and the walk's own leaves. A
        checkpoint with an output asked for runs too (its gradient is taken
        inside it). Walked depth first without recursion: a deep chain would
        pass Python's recursion limit.
        """
        wanted = set(self.only) | own
        leads = {}  # record -> whether its backward leads to what is wanted
        stack = [r for r, _ in edges if r is not None]
        while stack:
            r = stack[-1]
            if r in leads:
                stack.pop()
                continue
            behind = [e[0] for e in r.edges if e[0] is not None and e[0] not in leads]
            if behind:
                stack.extend(behind)
                continue
            stack.pop()
            # A record an earlier backward freed has let go of its edges (tape.Tape._walk): where it led is
            # unknown, so it is walked, and refuses with the freed error rather than giving no gradient.
            leads[r] = (r.freed
                        or any(id(e[1]) in wanted if e[0] is None else (leads[e[0]] or e in self.watched)
                               for e in r.edges if e != (None, None))
                        or (_takes_watched_inside(r) and any((r, i) in self.watched for i in range(len(r.shapes)))))
        return leads, wanted

    def reaches(self, edge):
        """Whether a gradient along `edge` (or into record edge[0], when edge[1] is None) is wanted by this call."""
        if self.pruning is None:
            return True
        leads, wanted = self.pruning
        record, t = edge
        if record is None:
            return t is not None and id(t) in wanted
        return leads.get(record, False) or edge in self.watched

    def wanted(self, stand_ins, inputs):
        """The stand-ins (a checkpoint's recompute) of the inputs whose gradient this call wants."""
        return [s for s, t in zip(stand_ins, inputs) if self.reaches(get_gradient_edge(t))]

    def capture_outputs(self, node, out_grads, seen):
        """The gradient of a watched computed tensor, whole, as it reaches its record."""
        for i, g in enumerate(out_grads):
            t = self.watched.get((node, i))
            if t is None or g is None or _takes_watched_inside(node):
                continue
            if self.capture:
                self.captured[id(t)] = g.copy() if id(t) not in self.captured else self.captured[id(t)] + g
            else:
                _accumulate(t, g.copy(), seen)  # a computed tensor's .grad, as backward(inputs=[it]) asks

    def finish(self, seen):
        """At the end of the call's outermost walk: hooks on leaves, then their gradients delivered."""
        deferred, self.deferred = self.deferred, {}
        for t, g, ours in deferred.values():
            if t._hooks:
                g = _call_hooks(t._hooks, g, f"a hook on a leaf tensor of shape {tuple(t.shape)}")
                ours = ours and g.base is None and not _placed(g, seen)  # a view: of the read-only gradient, say
            if self.capture:
                self.captured[id(t)] = g if ours else g.copy()
            else:
                _accumulate(t, g if ours else g.copy(), seen)


_task = None  # the GradientTask of the backward call running now, if any


def current_task():
    """The GradientTask of the backward call running now (None outside backward)."""
    return _task


def _takes_watched_inside(node):
    """A checkpoint's record: an output of it that grad() asks for has its gradient taken inside its recompute,
    where the segment's other outputs' paths to it are (checkpoint.py)."""
    return getattr(node.op, "is_checkpoint", False)



def _raise_freed(node, task):
    """PyTorch's ERR_BACKWARD_TWICE (torch/csrc/autograd/saved_variable.cpp), naming the call and the record."""
    raise RuntimeError(
        f"{task.call}: Trying to backward through the graph a second time: it reached {node.describe()}, "
        "whose saved arrays an earlier backward freed. Saved intermediate values of the graph are freed when "
        "you call .backward() or autograd.grad(). Specify retain_graph=True (in the earlier call) if you need "
        "to backward through the graph a second time."
    )


# -- the gradients a backward returns ----------------------------------------------
def validate_gradients(node, grads):
    """Each input's gradient in its input's shape and dtype, or an error naming the op (PyTorch's validate_outputs).

    As in PyTorch, a gradient of a shape the input broadcasts to is summed
    down to it, and one of another float dtype is cast back (an unpack hook
    may have handed backward float64 arrays); any other shape is an error,
    so a wrong backward can never leave a leaf with a .grad of another shape.
    One tuple compare per gradient when all is well.
    """
    if len(grads) != len(node.input_shapes):
        raise RuntimeError(f"Function {node.name} returned an incorrect number of gradients (expected "
                           f"{len(node.input_shapes)}, got {len(grads)}): its backward returns one array (or None) "
                           "per input of its forward")
    checked = []
    for i, (g, shape, dtype) in enumerate(zip(grads, node.input_shapes, node.input_dtypes)):
        if g is not None and (not backend.is_array(g) or g.shape != shape or g.dtype != dtype):
            if not backend.is_array(g):
                raise TypeError(f"Function {node.name} returned a '{type(g).__name__}' as the gradient at index {i}; "
                                "its backward returns an array of the backend (or None) per input")
            if g.shape != shape:
                try:
                    broadcast = numpy.broadcast_shapes(shape, g.shape) == g.shape
                except ValueError:
                    broadcast = False
                if not broadcast:
                    raise RuntimeError(f"Function {node.name} returned an invalid gradient at index {i} - got "
                                       f"{list(g.shape)} but expected shape compatible with {list(shape)}")
                g = backend.unbroadcast(g, shape)
            if g.dtype != dtype:
                g = g.astype(dtype)
        checked.append(g)
    return tuple(checked)


def get_gradient_edge(t):
    """Where the gradient of tensor t goes: (its record, which output), or (None, t) for a leaf.

    PyTorch's torch.autograd.graph.get_gradient_edge. An edge keeps t's
    record alive, not t: backward can start from it after t is dropped.
    """
    return _edge(t)


def _edge(t):
    """Where the gradient of tensor t goes (see Node): (its record, which output) or (None, leaf)."""
    node = t._node
    if node is None:
        return (None, t if t.requires_grad else None)
    if len(node.outputs) == 1:
        return (node, 0)
    return (node, next(i for i, o in enumerate(node.outputs) if o() is t))


def _deliver(edge, g, pending, seen, task, own=()):
    """Add gradient `g` along `edge`: to a leaf (as the task says), or to a record's pending sum."""
    record, t = edge
    if record is None:
        task.to_leaf(t, g, seen, own)
    else:
        entry = pending.get(edge)
        total = g if entry is None else backend.as_array(entry + g)  # out of place: g may be shared; 0-d stays an array
        memory.track(total)
        pending[edge] = total
        seen[id(total)] = weakref.ref(total)


def _accumulate(t, g, seen):
    """t.grad += g, as PyTorch's AccumulateGrad: the first gradient becomes .grad."""
    if t.grad is None:
        # Take `g` as the new .grad only if nothing else refers to it (it is
        # not a view, and no other tensor got it); else copy, so that a later
        # in-place update of one .grad can never change another.
        owned = g if (g.base is None and not _placed(g, seen)) else g.copy()
        from .tensor import Tensor  # imported here: tensor.py imports this module

        t.grad = Tensor(owned, device=t.device)  # a plain Tensor even for a Parameter, as in PyTorch
        memory.track(owned, "gradients")
    else:
        t.grad.data += g
    seen[id(g)] = weakref.ref(g)
    for hook in list(t._post_accumulate_grad_hooks or ()):  # Tensor.register_post_accumulate_grad_hook
        hook(t)


def _placed(g, seen):
    """True if this very array (not a freed one with the same id) was placed before."""
    ref = seen.get(id(g))
    return ref is not None and ref() is g


def _zeros(node, i, out_grads):
    """The gradient of an output nobody used: zeros of its shape, where the others' are."""
    xp = backend.array_module(*(g for g in out_grads if g is not None))
    return xp.zeros(node.shapes[i], dtype=node.dtypes[i])


# -- gradient hooks (Tensor.register_hook) -----------------------------------------
class RemovableHandle:
    """What register_hook returns: `handle.remove()` takes the hook off again (PyTorch's name)."""

    def __init__(self, hooks=None, hook=None):
        self.hooks, self.hook = hooks, hook

    def remove(self):
        """Take this hook off; by identity, so an equal hook registered beside it stays (list.remove uses ==)."""
        for i, h in enumerate(self.hooks or ()):
            if h is self.hook:
                del self.hooks[i]
                return


def register_hook(t, hook):
    """Call hook(grad) with t's whole gradient in every backward; its result, if not None, replaces it.

    On a computed tensor the hook goes on its record (for that output), so it
    runs even if t itself is gone by backward; on a leaf, on the leaf. While a
    checkpoint recomputes a segment, registering does nothing: the hooks its
    forward registered are the ones its backward runs (recompute.py).
    """
    if not callable(hook):
        raise TypeError(f"register_hook takes a callable hook(grad) -> Tensor or None, got {type(hook).__name__}")
    active = _stack[-1]
    if active is not None and active.replays_hooks:
        return RemovableHandle()
    if t._node is None:
        if t._hooks is None:
            t._hooks = []
        hooks = t._hooks
    else:
        node, i = _edge(t)
        if node.hooks is None:
            node.hooks = {}
        hooks = node.hooks.setdefault(i, [])
    hooks.append(hook)
    return RemovableHandle(hooks, hook)


def run_tensor_hooks(node, out_grads):
    """The record's hooks, per output, on the whole gradient of that output (None: nothing reached it)."""
    return [g if g is None or not node.hooks.get(i) else
            _call_hooks(node.hooks[i], g, f"a hook on output {i} of {node.describe()}")
            for i, g in enumerate(out_grads)]


def _call_hooks(hooks, g, what):
    """g through each hook in turn, under no_grad; a hook returns None (keep g) or the new gradient.

    A hook gets its gradient read-only and may not change it in place (PyTorch's register_hook: "The hook
    should not modify its argument"): the array may be another record's gradient too (Add hands the one
    array to both its inputs), or the caller's. On NumPy the write itself fails; CuPy has no read-only
    arrays, so there an in-place Tensor method is caught by the version counter after the hook.
    """
    from .tensor import Tensor  # imported here: tensor.py imports this module

    for hook in list(hooks):
        view = _read_only(g)
        arg = Tensor(view, device=backend.device_of(g))
        version = arg._version
        try:
            with no_grad():
                new = hook(arg)
        except ValueError as e:
            if "read-only" not in str(e):
                raise
            _raise_hook_wrote(what, hook)  # NumPy refused the write: say which hook tried
        if arg._version != version:
            _raise_hook_wrote(what, hook)
        if new is None or new is arg or new is view or (isinstance(new, Tensor) and new.data is view):
            continue  # the gradient it was given, unchanged
        if isinstance(new, Tensor):
            new = new.data
        elif backend.is_array(backend.as_array(new)):
            new = backend.as_array(new)
        else:
            raise TypeError(f"{what}: expected a Tensor, but the hook returned '{type(new).__name__}'; a hook returns "
                            "the new gradient as a Tensor, or None to keep it")
        if tuple(new.shape) != tuple(g.shape) or new.dtype != g.dtype:
            raise RuntimeError(
                f"{what} returned a gradient of shape {tuple(new.shape)} and dtype {new.dtype}, but the gradient "
                f"it was given has shape {tuple(g.shape)} and dtype {g.dtype}; a hook may change the values "
                "only (return None to keep them)")
        g = new
    return g


def _read_only(g):
    """A read-only view of gradient g for a hook (NumPy); g itself where arrays cannot be read-only (CuPy)."""
    if not isinstance(g, numpy.ndarray):
        return g
    view = g.view()
    view.flags.writeable = False
    return view


def hook_name(hook):
    """How errors name a hook: its qualified name, quoted ('unpack', 'Offload.unpack', '<lambda>')."""
    return repr(getattr(hook, "__qualname__", None) or type(hook).__name__)


def _raise_hook_wrote(what, hook):
    raise RuntimeError(
        f"{what} ({hook_name(hook)}) modified its gradient in place. The hook should not modify its argument (it may be "
        "shared: another record's gradient, or the one passed to backward), but it can return a new gradient "
        "which will be used in its place: return grad * 10, not grad.mul_(10)") from None


# -- placeholders: what a recompute hands on for an op it does not run --------------
# A checkpoint's recompute skips ops whose results backward does not need
# (recompute.py). The code of the segment still runs around them, so each
# skipped op hands on placeholder arrays of the right shape and dtype: a
# zero-stride broadcast of one NaN, read-only: no memory, where full arrays
# would raise the step's peak (benchmarks/lesson_speed.py). Reading their
# values through a Tensor (item(), numpy(), a comparison, an index...) raises
# PlaceholderRead, and the checkpoint then recomputes the segment in full.
_placeholder_bases = weakref.WeakValueDictionary()  # id(0-d base) -> base, for the placeholders alive


class PlaceholderRead(RuntimeError):
    """Raised when code reads the values of a tensor that a checkpoint's recompute did not compute."""


def placeholder(shape, dtype, device):
    xp = backend.module_for(device)
    base = xp.full((), numpy.nan if backend.is_inexact(dtype) else 0, dtype=dtype)
    _placeholder_bases[id(base)] = base
    return xp.broadcast_to(base, shape)


def is_placeholder(array):
    if not _placeholder_bases:
        return False
    base = backend.storage(array)
    return _placeholder_bases.get(id(base)) is base


def raise_placeholder_read(what):
    raise PlaceholderRead(
        f"{what}: this tensor was not computed: a checkpoint's recompute skipped the op that makes it, since "
        "backward does not need its result. (Inside the recompute the checkpoint then runs the segment in full; "
        "outside it, the values were never there: keep what you need from the forward's own tensors.)")


# -- which tape is active -----------------------------------------------------
_stack = [Tape()]  # the default tape at the bottom; None on top means no_grad


def active():
    """The tape ops record onto now, or None under no_grad()."""
    return _stack[-1]


def is_grad_enabled():
    return _stack[-1] is not None


@contextmanager
def recording(tape):
    """Record onto `tape` (or nothing, if None) inside the block."""
    _stack.append(tape)
    try:
        yield tape
    finally:
        _stack.pop()


def no_grad():
    """Run without recording: no records, nothing saved for backward."""
    return recording(None)


def enable_grad():
    """Record again inside a no_grad() block, onto the default tape."""
    return recording(_stack[0])
