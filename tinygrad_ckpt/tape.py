"""The tape: a list of op records in forward order, walked in reverse by backward.

While gradients are recorded, every differentiable op appends one `Node` to
the active tape: the op, where its inputs' gradients go (the records that
produced them, or the leaf tensors), its outputs and the arrays it saved for
backward. `loss.backward()` walks that list from the end, hands
each record the gradient of its outputs, and adds the gradients it returns
into its inputs (added, never assigned: a tensor used twice gets both).
Each record drops its saved arrays as soon as its backward has run.

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

Checks the walk makes, each raising before it runs a record's backward:
  * a saved array whose tensor was modified in place since it was saved
    (its version moved on; see tensor.py): PyTorch's "modified by an
    inplace operation" error, naming the record, the shape and the versions;
  * a record whose saved arrays a first backward already freed;
  * in anomaly mode (`autograd.detect_anomaly()`), a gradient that is NaN or
    infinite, naming the record and the line of code that created it. The
    mode's switch and its checks live here, because the walk and
    `Function.apply` read them on every op; a normal run pays one flag test.

What does not live here: how an op is written (function.py), checkpointing
(checkpoint.py), the public switch of anomaly mode (autograd.py).
"""

import itertools
import os
import sys
import traceback
import weakref
from contextlib import contextmanager

from . import backend, memory


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

    __slots__ = ("op", "ctx", "edges", "_inputs", "input_shapes", "outputs", "shapes", "dtypes",
                 "tape", "index", "stack", "__weakref__")

    def __init__(self, op, ctx, inputs, outputs):
        self.op = op  # the Function subclass; its backward is op.backward
        self.ctx = ctx
        self.edges = tuple(_edge(t) for t in inputs)  # strong: the graph backward walks
        self._inputs = tuple(weakref.ref(t) for t in inputs)
        self.input_shapes = tuple(t.shape for t in inputs)
        # Weak: the outputs own this record, not the other way round.
        self.outputs = tuple(weakref.ref(t) for t in outputs)
        self.shapes = tuple(t.shape for t in outputs)
        self.dtypes = tuple(t.dtype for t in outputs)
        for t in outputs:
            t._node = self
            t._recorded_version = t._version_counter.value  # what this record computed
        # `stack`, where the record was created, is set in anomaly mode only (see there).

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
        arrays = self.ctx.saved_arrays or ()
        return sum(a.nbytes for a in arrays if a is not None and memory.category(a) != "parameters")

    @property
    def saved_parameters(self):
        """How many parameters this record keeps for backward (listed, not charged)."""
        arrays = self.ctx.saved_arrays or ()
        return sum(1 for a in arrays if a is not None and memory.category(a) == "parameters")

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

    def __init__(self):
        self.number = next(_numbers)
        self.records = []  # weakref.ref(Node), oldest first
        self.count = 0  # records ever appended, to number them
        self._next_prune = 1024

    def append(self, node):
        node.tape, node.index = self, self.count
        self.count += 1
        self.records.append(weakref.ref(node))
        if len(self.records) >= self._next_prune:  # forget dead references now and then
            self.records = [r for r in self.records if r() is not None]
            self._next_prune = 2 * len(self.records) + 1024

    def run(self, op, ctx, arrays, options):
        """Run one op's forward. A checkpoint policy's tape overrides this."""
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

    def backward(self, tensors, grads, retain_graph=False):
        """Reverse-mode sweep: add d(tensors)/d(leaf) * grads into every leaf's .grad.

        `tensors` may also be gradient edges (`get_gradient_edge(t)`), as in
        PyTorch: then the tensors themselves, and their arrays, may be gone.
        """
        pending = {}  # (record, output index) -> gradient array not yet handed to that record
        if anomaly_mode:
            for g in grads:
                _check_finite_start(g)
        # Gradient arrays placed somewhere (a .grad or a pending sum): never taken
        # over or written in place. Weak, by id: an id alone could be reused by a
        # new array once the old one is freed, and would force a needless copy.
        seen = {id(g): weakref.ref(g) for g in grads}
        for t, g in zip(tensors, grads):
            _deliver(t if isinstance(t, tuple) else _edge(t), g, pending, seen)
        tensors = None  # the edges are all the walk needs
        with memory.phase("backward" if memory.tracker.phase != "recompute" else "recompute"):
            for ref in reversed(self.records):
                node = ref()
                if node is None:
                    continue
                out_grads = [pending.pop((node, i), None) for i in range(len(node.shapes))]
                if all(g is None for g in out_grads):
                    continue  # this record does not lead to what we differentiate
                if node.freed:
                    _raise_freed(node)
                if node.ctx.saved_versions:
                    check_versions(node)
                out_grads = [g if g is not None else _zeros(node, i, out_grads) for i, g in enumerate(out_grads)]
                in_grads = node.op.run_backward(node.ctx, out_grads)
                if anomaly_mode:
                    check_gradients(node, out_grads, in_grads)
                if not retain_graph:
                    node.ctx.free()
                for edge, g in zip(node.edges, in_grads):
                    if g is not None and (edge[0] is not None or edge[1] is not None):
                        _deliver(edge, g, pending, seen)
                # Drop this record's gradients now, not when the next record's
                # backward reassigns the names: else they outlive their use.
                out_grads = in_grads = g = None
                if not retain_graph:
                    # Let go of the records behind this one too: one that no
                    # gradient is pending for is freed now, not when the loss
                    # is dropped, so memory falls during backward as in PyTorch.
                    node.release_graph()
                memory.tracker.event(node.name, kind="backward", tape=self.number, record=node.index)
        for record, _ in pending:  # a gradient that found no live record to go to
            if record.freed:
                _raise_freed(record)
        if not retain_graph:  # freed records will never be walked again
            self.records = [r for r in self.records if r() is not None and not r().freed]


def _raise_freed(node):
    raise RuntimeError(
        f"backward through {node.name} a second time: its saved arrays were freed by "
        "the first backward. Pass retain_graph=True to the first backward() if you "
        "need to backpropagate twice."
    )


# -- saved arrays modified in place ---------------------------------------------
def check_versions(node):
    """Raise if a tensor whose array `node` saved was modified in place since (PyTorch's check).

    `node.ctx.saved_versions` holds (version counter, version when saved, what,
    array) per saved array that is some tensor's (see Function.apply): one
    integer compare each.
    """
    for counter, version, what, array in node.ctx.saved_versions:
        if counter.value != version:
            if isinstance(what, tuple):  # ("input", i) or ("output", j) of this op
                what = f"{what[0]} {what[1]} of {node.describe()}"
            else:  # said by the op itself (a checkpoint's segment inputs)
                what = f"{what}, in {node.describe()}"
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an "
                f"inplace operation: [{array.dtype} tensor of shape {tuple(array.shape)}], which is "
                f"{what}, is at version {counter.value}; expected version {version} instead. "
                f"Hint: {_version_hint(node)}"
            )


def _version_hint(node):
    if getattr(node, "stack", None) is None:
        return ("enable anomaly mode to see the line of code that created this record, with "
                "tinygrad_ckpt.autograd.detect_anomaly(). Or write the in-place operation out of place "
                "(y = y * 2, not y.mul_(2)), or change a clone (y2 = y.clone(); y2.mul_(2)).")
    return f"{_origin(node.stack)}\nThe variable in question was changed there or anywhere later."


def raise_changed_since_recorded(op, inputs):
    """Raise for the input computed by a record that was changed in place since.

    In-place methods are not recorded on the tape (PyTorch records them), so
    such a tensor's record computed other values than it now holds: the
    gradient through it would be wrong. Function.apply (and backward())
    test every computed input with one integer compare, and call this.
    """
    for i, t in enumerate(inputs):
        if t._node is not None and t._version_counter.value != t._recorded_version:
            which = "the tensor" if len(inputs) == 1 else f"input {i}"
            raise RuntimeError(
                f"{op}: {which} (shape {t.shape}) was modified by an inplace operation after "
                f"{t._node.describe()} computed it (version {t._recorded_version} -> "
                f"{t._version_counter.value}). In-place operations are not recorded on the tape, so "
                "the gradient through this tensor would be wrong. Write the in-place operation out "
                "of place (y = y * 2, not y.mul_(2)), or change a clone (y2 = y.clone(); y2.mul_(2))."
            )


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


def _deliver(edge, g, pending, seen):
    """Add gradient `g` along `edge`: into a leaf's .grad, or a record's pending sum."""
    record, t = edge
    if record is None:  # a leaf: accumulate into .grad, as PyTorch does
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
    else:
        entry = pending.get(edge)
        total = g if entry is None else backend.as_array(entry + g)  # out of place: g may be shared; 0-d stays an array
        memory.track(total)
        pending[edge] = total
        seen[id(total)] = weakref.ref(total)


def _placed(g, seen):
    """True if this very array (not a freed one with the same id) was placed before."""
    ref = seen.get(id(g))
    return ref is not None and ref() is g


def _zeros(node, i, out_grads):
    """The gradient of an output nobody used: zeros of its shape, where the others' are."""
    xp = backend.array_module(*(g for g in out_grads if g is not None))
    return xp.zeros(node.shapes[i], dtype=node.dtypes[i])


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


# -- anomaly mode -----------------------------------------------------------------
# Switched by autograd.detect_anomaly(). Off, the engine pays one test of this
# flag per op and per record walked; on, every op's outputs and every gradient
# are checked, and every record keeps the stack that created it.
anomaly_mode = False


def set_anomaly_enabled(mode):
    """Switch anomaly mode on or off; returns the previous setting."""
    global anomaly_mode
    previous, anomaly_mode = anomaly_mode, bool(mode)
    return previous


def capture_stack():
    """The call stack of the op being run, outermost first (source lines read only if shown)."""
    stack = traceback.StackSummary.extract(traceback.walk_stack(sys._getframe(1)), lookup_lines=False)
    stack.reverse()
    return stack


_PACKAGE = os.path.dirname(os.path.abspath(__file__))
# The plumbing between a line of model code and an op: never "where" an op was created.
_PLUMBING = {"tensor.py", "function.py", "tape.py", "functional.py", "checkpoint.py", "policies.py",
             "autograd.py", "backend.py", "random.py"}


def _in_package(frame):
    return os.path.abspath(frame.filename).startswith(_PACKAGE + os.sep)


def _is_plumbing(frame):
    folder, name = os.path.split(os.path.abspath(frame.filename))
    return (folder == _PACKAGE and name in _PLUMBING) or folder == os.path.join(_PACKAGE, "ops")


def _origin(stack):
    """Where a record was created: the innermost line of user code, then the whole forward call."""
    frames = list(stack)
    while frames and _is_plumbing(frames[-1]):  # down to the line that called the op
        frames.pop()
    if not frames:
        return "the record was created inside the engine (no caller outside it)"
    user = next((f for f in reversed(frames) if not _in_package(f)), frames[-1])
    trace = "".join(traceback.StackSummary.from_list(frames[-_TRACE_FRAMES:]).format())
    return (f"The record was created at {user.filename}, line {user.lineno}, in {user.name}:\n"
            f"    {(user.line or '').strip()}\n"
            f"Traceback of the forward call that created it (most recent call last, up to {_TRACE_FRAMES} "
            f"frames):\n{trace.rstrip()}")


_TRACE_FRAMES = 8  # enough for a model's layers and the line that called the model


def _nonfinite(a):
    """'nan', 'inf' or None, for an array (None too for a non-float one or None).

    One explicit copy of a boolean to the host: anomaly mode waits for the GPU.
    """
    if a is None or a.dtype.kind not in "fc":
        return None
    xp = backend.module_of(a)
    if bool(backend.to_host(backend.as_array(xp.isfinite(a).all()))):
        return None
    return "nan" if bool(backend.to_host(backend.as_array(xp.isnan(a).any()))) else "inf"


def check_outputs(op, node, input_arrays, outputs):
    """Anomaly mode: raise at an op whose forward output is NaN, or infinite from finite inputs.

    An infinity that came in through an input (a -inf attention mask filled
    in by masked_fill) is the caller's intent, not an anomaly; a NaN never is.
    """
    for j, out in enumerate(outputs):
        bad = _nonfinite(out)
        if bad is None:
            continue
        carried = [(i, k) for i, k in ((i, _nonfinite(a)) for i, a in enumerate(input_arrays)) if k]
        if bad == "inf" and carried:
            continue
        where = node.describe() if node is not None else f"{op} (not recorded: no input requires grad)"
        came_in = "".join(f"; its input {i} already held {k} values" for i, k in carried)
        stack = node.stack if node is not None else capture_stack()
        raise RuntimeError(f"anomaly mode: Function {where} returned {bad} values in its output {j} "
                           f"during forward{came_in}.\n{_origin(stack)}")


def check_gradients(node, out_grads, in_grads):
    """Anomaly mode: raise at a record whose backward returned a NaN or infinite gradient."""
    for i, g in enumerate(in_grads):
        bad = _nonfinite(g)
        if bad is None:
            continue
        received = [k for k in map(_nonfinite, out_grads) if k]
        came_in = f"; the gradient it received already held {received[0]} values" if received else ""
        stack = getattr(node, "stack", None)
        origin = (_origin(stack) if stack is not None else
                  "The record was created before anomaly mode was switched on: run the forward in "
                  "detect_anomaly() too, to see where.")
        raise RuntimeError(f"anomaly mode: Function {node.describe()} returned {bad} values in its output {i} "
                           f"during backward (the gradient of its input {i}){came_in}.\n{origin}")


def _check_finite_start(g):
    bad = _nonfinite(g)
    if bad is not None:
        raise RuntimeError(f"anomaly mode: the gradient passed to backward() holds {bad} values")
