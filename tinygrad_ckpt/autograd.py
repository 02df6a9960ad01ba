"""Autograd utilities with PyTorch's names (torch.autograd): grad, saved-tensor hooks, anomaly mode.

    >>> from tinygrad_ckpt import Tensor
    >>> x = Tensor([1.0, 2.0], requires_grad=True)
    >>> w = Tensor([3.0, 4.0], requires_grad=True)
    >>> dx, dw = grad((x * w).sum(), [x, w])     # the gradients ...
    >>> dx.data, dw.data, x.grad                 # ... and .grad untouched
    (array([3., 4.], dtype=float32), array([1., 2.], dtype=float32), None)

`grad(outputs, inputs, grad_outputs=None, retain_graph=None,
create_graph=False, allow_unused=False)` has PyTorch's signature and
meaning: it returns d(outputs)/d(inputs) and adds nothing to any `.grad`
(`Tensor.backward(inputs=[...])` is its in-place twin: only those tensors
accumulate). Both see through checkpointed segments: a segment's recompute
delivers its parameters' gradients by the rules of the call that runs it
(tape.GradientTask), as with PyTorch's non-reentrant checkpoint. Not
supported: `create_graph=True`
(gradients of gradients). Backward here is a walk over raw arrays, not a
recorded computation, so that every byte it saves stays visible; asking for
it is an error that says so.

    >>> packed = []
    >>> def pack(t):
    ...     packed.append(t.shape)
    ...     return t
    >>> with saved_tensors_hooks(pack, lambda t: t):   # every tensor an op saves goes through pack
    ...     loss = (x * w).sum()
    >>> packed                                          # Mul saved both its inputs
    [(2,), (2,)]
    >>> loss.backward()                                 # ... and they come back through unpack

`saved_tensors_hooks(pack_hook, unpack_hook)` and `save_on_cpu()` have
PyTorch's names and meaning (torch.autograd.graph): the choke point is
`Context.save_for_backward` (function.py explains what pack receives and how
memory is counted). `save_on_cpu()` packs each saved array into host memory
and unpacks it onto its device for backward; on NumPy the arrays are already
in host memory, so it keeps them as they are. Tutorial 5 builds PyTorch's
non-reentrant checkpoint from saved_tensors_hooks.

    >>> with detect_anomaly():     # every op's outputs are checked for NaN and inf, and every gradient
    ...     Tensor([float("nan")], requires_grad=True) * 2
    Traceback (most recent call last):
    RuntimeError: anomaly mode: Function Mul (record #...) returned nan values in its output 0 during forward; ...

In anomaly mode every record on the tape keeps the stack that created it, and
the first op whose forward output is NaN (or infinite where its inputs were
finite), or whose backward returns a NaN or infinite gradient, raises a
RuntimeError naming the op, its record number on the tape and the line of
user code that created the record, then the whole forward call that did. A
checkpointed segment's recompute is a forward too, and is checked the same
way. An in-place change caught by backward names that line as well.

An infinity that reaches an op through an input (a -inf attention mask
filled in by masked_fill) is taken as intended; a NaN never is. (PyTorch's
own detect_anomaly checks less: tutorial 1 compares them.)
`detect_anomaly(loss_scaling=True)` leaves an overflow in the backward of a
GradScaler's scaled loss to the scaler, which skips that step.

The checks copy one boolean per array to the host (on a GPU, a wait each)
and capture a stack per record: slow, for debugging. Off, the engine pays a
test of one flag per op.

What does not live here: the backward walk (tape.py), the anomaly checks
(anomaly.py), where saved arrays are packed (function.py), checkpointing
(checkpoint.py).
"""

from . import anomaly, backend, function, tape
from .tensor import Tensor, _differentiated, _gradient_for, _no_create_graph


# -- functional gradients ------------------------------------------------------------
def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=False):
    """d(outputs)/d(inputs) as a tuple of Tensors, one per input; no .grad is touched (PyTorch's torch.autograd.grad).

    outputs: a tensor or a sequence; grad_outputs: the gradient of each
    output (None: ones, for one-element outputs only). inputs: a tensor or a
    sequence, each requiring grad (leaves or computed tensors). An input the
    outputs do not depend on is an error, or None with allow_unused=True.
    retain_graph: keep the saved arrays for another backward (default
    create_graph, so False); without it, a second call through the same
    records is an error naming this call and the record (PyTorch's "Trying
    to backward through the graph a second time"). create_graph=True is not
    supported (see the module docstring).
    """
    _no_create_graph(create_graph, "autograd.grad")
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    inputs = _differentiated(inputs, "autograd.grad")
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    grad_outputs = [grad_outputs] if isinstance(grad_outputs, Tensor) else list(grad_outputs)
    if len(grad_outputs) != len(outputs):
        raise ValueError(f"autograd.grad: {len(grad_outputs)} grad_outputs for {len(outputs)} outputs")
    pairs = []
    for i, (out, g) in enumerate(zip(outputs, grad_outputs)):
        if not isinstance(out, Tensor):
            raise TypeError(f"autograd.grad: outputs[{i}] is a {type(out).__name__}, not a Tensor")
        if not out.requires_grad:
            raise RuntimeError(f"autograd.grad: outputs[{i}] does not require grad; no input of its "
                               "computation required grad (or it ran under no_grad())")
        pairs.append((out, _gradient_for(out, g, f"autograd.grad: grad_outputs[{i}]")))
    task = tape.run_backward([o for o, _ in pairs], [g for _, g in pairs], retain_graph=bool(retain_graph),
                             inputs=inputs, capture=True)
    results = []
    for i, t in enumerate(inputs):
        g = task.captured.get(id(t))
        if g is None and not allow_unused:
            raise RuntimeError(
                f"autograd.grad: inputs[{i}] (shape {t.shape}) appears not to have been used in the graph "
                "of the outputs. Set allow_unused=True if this is the desired behavior.")
        results.append(None if g is None else Tensor(g, device=backend.device_of(g)))
    return tuple(results)


# -- saved-tensor hooks -------------------------------------------------------------------
class saved_tensors_hooks:
    """Inside the block, every array an op saves for backward is passed to pack_hook(tensor) and kept
    as whatever it returns; backward gets it back through unpack_hook(packed), which returns a Tensor.

    PyTorch's torch.autograd.graph.saved_tensors_hooks. Nested blocks: the
    innermost pair applies. See function.py for what pack receives.
    """

    def __init__(self, pack_hook, unpack_hook):
        self.pack_hook, self.unpack_hook = pack_hook, unpack_hook
        self.depths = []  # one per __enter__ not yet exited (one object may be entered again, nested)

    def __enter__(self):
        self.depths.append(function.push_saved_tensors_hooks(self.pack_hook, self.unpack_hook))
        return self

    def __exit__(self, *exc):
        if not self.depths:
            raise RuntimeError("saved_tensors_hooks: exited more times than it was entered; the hooks in force "
                               "are unchanged. Use it as `with saved_tensors_hooks(pack, unpack): ...`")
        function.pop_saved_tensors_hooks(self.depths.pop())


class save_on_cpu(saved_tensors_hooks):
    """Saved arrays wait in host memory between forward and backward (PyTorch's save_on_cpu).

    On a GPU each saved array is copied to the host when it is saved, and
    back to its device when backward needs it: GPU memory for two copies
    over the bus. On NumPy the array stays where it is (no copy), and so it
    does on the meta device, which has no values to copy: fit counts an
    offloaded array as kept, an upper bound for a GPU. The checkpoint
    policies' "offload" uses these same hooks (policies.py).
    """

    def __init__(self):
        super().__init__(_pack_to_cpu, _unpack_from_cpu)


def _pack_to_cpu(t):
    return (t.device, t.to("cpu") if backend.holds_values(t.device) else t)


def _unpack_from_cpu(packed):
    device, t = packed
    return t.to(device)


class set_detect_anomaly:
    """Switch anomaly mode on or off now; as a context manager, put it back on exit (PyTorch's name).

        set_detect_anomaly(True)                 # on, from here on
        with set_detect_anomaly(False): ...      # off inside the block only
    """

    def __init__(self, mode):
        self.previous = anomaly.set_enabled(mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        anomaly.set_enabled(self.previous)


class detect_anomaly:
    """Anomaly mode inside the block (see the module docstring); the previous setting after it.

    loss_scaling=True: the backward is of a GradScaler's scaled loss, whose
    float16 gradients may overflow; the scaler skips that step, so an
    infinite gradient in backward, and a NaN made from one, is not an
    anomaly. A NaN from finite gradients still is, and the forward is
    checked as ever. The Trainer sets it with fp16=True.
    """

    def __init__(self, loss_scaling=False):
        self.loss_scaling = loss_scaling

    def __enter__(self):
        self.previous = anomaly.set_enabled(True), anomaly.set_loss_scaling(self.loss_scaling)
        return self

    def __exit__(self, *exc):
        anomaly.set_enabled(self.previous[0])
        anomaly.set_loss_scaling(self.previous[1])


def is_anomaly_enabled():
    """True while anomaly mode is on."""
    return anomaly.enabled
