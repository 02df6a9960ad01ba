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

`Function.apply(*tensors, **options)` runs the op on tensors: it checks that
the inputs share a device and a dtype, runs forward through the active tape,
wraps the result in Tensors and, if any input requires grad, appends one
record (a Node) to that tape.

What does not live here: the tape and the backward walk (tape.py), the ops
themselves (ops/).
"""

from . import backend, memory, tape


class Context:
    """What one op run keeps between its forward and its backward."""

    def __init__(self, op, needs_input_grad):
        self.op = op
        # One bool per input: backward may skip (and forward need not save for)
        # the gradients nobody asked for, e.g. the dropout mask's.
        self.needs_input_grad = needs_input_grad
        self.saved_arrays = ()

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
    def apply(cls, *inputs, **options):
        from .tensor import Tensor

        op = cls.__name__
        _check_inputs(op, inputs)
        active = tape.active()
        needs_input_grad = tuple(t.requires_grad for t in inputs) if active is not None else ()
        ctx = Context(op, needs_input_grad)
        arrays = [t.data for t in inputs]
        if active is None:
            out = cls.forward(ctx, *arrays, **options)
        else:
            out = active.run(cls, ctx, arrays, options)
        outs = out if isinstance(out, tuple) else (out,)
        requires_grad = any(needs_input_grad)
        outs = [backend.as_array(o) for o in outs]
        # device=: outputs stay where the op ran, whatever the default device is
        tensors = tuple(Tensor(o, requires_grad=requires_grad, device=backend.device_of(o)) for o in outs)
        node = None
        if requires_grad:
            node = tape.Node(cls, ctx, inputs, tensors)
            active.append(node)
        if memory.tracker.events is None:
            pass  # no timeline is being recorded
        elif node is not None and node.index >= 0:  # on a tape (a checkpointed segment's forward keeps none)
            memory.tracker.event(op, inputs=arrays, outputs=outs, tape=node.tape.number, record=node.index,
                                 saved=node.activation_nbytes, saved_parameters=node.saved_parameters)
        else:
            memory.tracker.event(op, inputs=arrays, outputs=outs)
        return tensors if isinstance(out, tuple) else tensors[0]


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
