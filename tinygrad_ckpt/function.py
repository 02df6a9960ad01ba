"""Function and Context: how one differentiable op is written and run.

An op is a subclass of `Function` with two static methods side by side:

    forward(ctx, *arrays, **options) -> array (or tuple of arrays)
    backward(ctx, grad) -> one gradient array (or None) per input array

`forward` sees raw backend arrays (NumPy or CuPy), never Tensors, and keeps
what its backward will need with `ctx.save_for_backward(...)`. That call is
the only way an op keeps arrays for backward: it is where saved bytes are
counted (memory.py), where a checkpoint segment drops them, and what a tape
record frees after its backward has run. Non-array facts (shapes, axes) are
plain attributes on ctx.

The one rule for gradients nobody asked for: `ctx.needs_input_grad` holds
one bool per tensor input (all False under no_grad). `forward` need not
save what only a False input's gradient would read, and `backward` returns
None for every False input without computing it (and None for a True one
that gets its gradient another way: a checkpoint's parameters). An op with
one tensor input need not look: its backward runs only when that input
needs a gradient.

`Function.apply(*tensors, **options)` runs the op on tensors: it checks that
the inputs share a device and a dtype, runs forward through the active tape,
wraps the result in Tensors and, if any input requires grad, appends one
record (a Node) to that tape. It also remembers, for each saved array that is
an input's or an output's array, that tensor's version, so that backward can
refuse to run on an array changed in place since (tape.check_versions).

0-d results: NumPy hands back a scalar (numpy.float64), not a 0-d array, from
most operations on 0-d arrays. `run_forward` and `run_backward` are the one
place where what ops return becomes arrays again, so an op need not care
(only one that updates a 0-d intermediate in place makes it an array first,
as GELU and Softmax do).

What does not live here: the tape and the backward walk (tape.py), the ops
themselves (ops/).
"""

from . import backend, memory, tape


class Context:
    """What one op run keeps between its forward and its backward."""

    def __init__(self, op, needs_input_grad):
        self.op = op
        # One bool per tensor input (see the module docstring for the rule).
        self.needs_input_grad = needs_input_grad
        self.saved_arrays = ()
        # Per saved array that is some tensor's: (version counter, version then,
        # what it is, the array), checked by tape.check_versions. Function.apply
        # adds the saved arrays that are the op's inputs' or outputs'; an op may
        # add more in forward (a checkpoint: its recompute reads every input and
        # parameter of its segment, as they were before the segment ran).
        self.saved_versions = ()

    def save_for_backward(self, *arrays):
        """Keep `arrays` for backward. Bytes are counted as saved activations.

        An entry may be None, for an array this run does not need (see Mul).
        """
        if not any(self.needs_input_grad):
            return  # no backward will run: keep nothing
        arrays = tuple(backend.as_array(a) if a is not None else None for a in arrays)
        for a in arrays:
            if a is not None:
                memory.track(a, "activations")
        self.saved_arrays = arrays

    def free(self):
        """Drop the saved arrays (after backward, or when a checkpoint discards them)."""
        for a in self.saved_arrays:
            if a is not None:
                memory.release(a, "activations")
        self.saved_arrays = None  # None, not (): marks 'freed' for a second backward
        self.saved_versions = ()

    def __del__(self):
        # A record that dies without a backward (its output was dropped) lets go
        # of its holds too; else a buffer that outlives it, such as the input
        # batch, would stay counted as activations.
        if self.saved_arrays:
            self.free()

    @property
    def saved_nbytes(self):
        return sum(a.nbytes for a in self.saved_arrays or () if a is not None)


class Function:
    """Base class of every differentiable op (see the module docstring)."""

    @staticmethod
    def forward(ctx, *arrays, **options):
        raise NotImplementedError  # abstract: each op defines it

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError  # abstract: each op defines it

    @classmethod
    def run_forward(cls, ctx, arrays, options):
        """forward on raw arrays; its result as an array (or a tuple of arrays), 0-d ones included."""
        out = cls.forward(ctx, *arrays, **options)
        if isinstance(out, tuple):
            return tuple([backend.as_array(o) for o in out])
        return backend.as_array(out)

    @classmethod
    def run_backward(cls, ctx, grads):
        """backward for the gradients of the outputs; always a tuple, one array or None per input."""
        in_grads = cls.backward(ctx, *grads)
        if not isinstance(in_grads, tuple):
            in_grads = (in_grads,)
        return tuple([backend.as_array(g) for g in in_grads])  # as_array(None) is None

    @classmethod
    def apply(cls, *inputs, **options):
        from .tensor import Tensor

        op = cls.__name__
        _check_inputs(op, inputs)
        active = tape.active()
        if active is None:
            needs_input_grad = (False,) * len(inputs)
        else:
            needs_input_grad = tuple(t.requires_grad for t in inputs)
            for t in inputs:  # one integer compare per computed input: was it changed in place since?
                if t._node is not None and t._version_counter.value != t._recorded_version:
                    tape.raise_changed_since_recorded(op, inputs)
        ctx = Context(op, needs_input_grad)
        arrays = [t.data for t in inputs]
        if active is None:
            out = cls.run_forward(ctx, arrays, options)
        else:
            out = active.run(cls, ctx, arrays, options)
        outs = out if isinstance(out, tuple) else (out,)
        requires_grad = any(needs_input_grad)
        # device=: outputs stay where the op ran, whatever the default device is
        tensors = tuple(Tensor(o, requires_grad=requires_grad, device=backend.device_of(o)) for o in outs)
        _share_versions_of_views(tensors, inputs)
        node = None
        if requires_grad:
            if ctx.saved_arrays:
                ctx.saved_versions += _versions_of_saved(ctx.saved_arrays, inputs, tensors)
            node = tape.Node(cls, ctx, inputs, tensors)
            if tape.anomaly_mode:
                node.stack = tape.capture_stack()
            active.append(node)
        if tape.anomaly_mode:
            tape.check_outputs(op, node, arrays, outs)
        if memory.tracker.events is None:
            pass  # no timeline is being recorded
        elif node is not None and node.index >= 0:  # on a tape (a checkpointed segment's forward keeps none)
            memory.tracker.event(op, inputs=arrays, outputs=outs, tape=node.tape.number, record=node.index,
                                 saved=node.activation_nbytes, saved_parameters=node.saved_parameters)
        else:
            memory.tracker.event(op, inputs=arrays, outputs=outs)
        return tensors if isinstance(out, tuple) else tensors[0]


def _share_versions_of_views(outputs, inputs):
    """An output that is (a view of) an input's memory shares its version counter, as in PyTorch.

    Then an in-place change through either is seen by both (a reshape's output
    and its input are one buffer). NumPy and CuPy point a view's `base` at the
    array that owns the memory.
    """
    for o in outputs:
        owner = o.data if o.data.base is None else o.data.base
        for t in inputs:
            if t.data is owner or t.data.base is owner:
                o._version_counter = t._version_counter
                break


def _versions_of_saved(saved, inputs, outputs):
    """Per saved array that is (a view of) an input's or an output's: (counter, version now, what, array).

    `what` is ("input", i) or ("output", j).
    """
    entries = []
    tensors = inputs + outputs
    for a in saved:
        if a is None:
            continue
        owner = a if a.base is None else a.base
        for k, t in enumerate(tensors):
            if t.data is owner or t.data.base is owner:
                what = ("input", k) if k < len(inputs) else ("output", k - len(inputs))
                entries.append((t._version_counter, t._version_counter.value, what, a))
                break
    return tuple(entries)


def _check_inputs(op, inputs):
    """One device and one dtype per op: a clear error instead of NumPy's upcast."""
    if len(inputs) < 2:
        return
    try:
        backend.array_module(*(t.data for t in inputs))
    except RuntimeError as e:
        raise RuntimeError(f"{op}: {e}") from None
    dtypes = {t.dtype for t in inputs}
    if len(dtypes) > 1:
        names = " and ".join(sorted(str(d) for d in dtypes))
        raise TypeError(
            f"{op}: inputs have different dtypes ({names}); convert one with "
            ".to(dtype) so float32 work is not silently done in float64"
        )
