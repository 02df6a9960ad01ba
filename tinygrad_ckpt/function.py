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
record (a Node) to that tape. Inside `autocast()` it first casts the floating
inputs to the dtype the op runs in (autocast.py): the casts are Cast ops,
recorded like any other. It also remembers, for each saved array that is
an input's or an output's array, that tensor's version, so that backward can
refuse to run on an array changed in place since (versions.check_versions).

Saved-tensor hooks (PyTorch's `torch.autograd.graph.saved_tensors_hooks`;
the public face is autograd.py): while a (pack, unpack) pair is pushed, every
array an op saves is handed to `pack` as a Tensor, once the record is made,
and the record keeps whatever pack returns instead of the array; when
backward reaches the record, `unpack` turns it back into a tensor. Memory
accounting sees what pack returns: the tensors in it (directly, or inside
tuples, lists and dicts) that are on the saved array's device count as saved
activations, the array itself no longer does (one moved to the host, as
`save_on_cpu` does on a GPU, is not device memory). pack gets a tensor that
shares the saved array's memory and version counter but not its record
(PyTorch passes the tensor itself and warns that pack must not keep it, to
avoid a reference cycle). Only the innermost pair applies; a checkpoint's
recompute pushes "no hooks", so the caller's hooks never pack what the
recompute saves for its own short-lived backward. PyTorch 2.13's
non-reentrant checkpoint does not push "no hooks": its recompute runs under
saved-tensor hooks of its own (`_recomputation_hook` in
torch/utils/checkpoint.py), which pack what it saves into the forward's
handles; being innermost, they too keep the caller's hooks out.
What the hooks must keep: pack must not change its tensor in place (it is
the array backward reads; PyTorch refuses that too), and unpack must give
back a tensor of the saved array's shape and device, and of its dtype or
another floating one. Each is an error naming the hook and the record,
before the op's backward could fail with NumPy's message instead.

0-d results: NumPy hands back a scalar (numpy.float64), not a 0-d array, from
most operations on 0-d arrays. `run_forward` and `run_backward` are the one
place where what ops return becomes arrays again, so an op need not care
(only one that updates a 0-d intermediate in place makes it an array first,
as GELU and Softmax do).

What does not live here: the tape and the backward walk (tape.py), the ops
themselves (ops/).
"""

from . import anomaly, autocast, backend, memory, observe, tape, versions


class Context:
    """What one op run keeps between its forward and its backward."""

    # Class defaults: one op run sets only what differs.
    counted = True  # False while a checkpoint segment's forward only notes what each op saves
    computed = True  # False for an op a checkpoint's recompute did not run (its outputs are placeholders)
    packed = None  # what saved_tensors_hooks' pack returned, per saved array (None: no hooks)
    packed_arrays = ()  # the arrays in it that count as saved activations
    packed_meta = None  # per saved array, (shape, dtype, device) as pack was given it: what unpack must give back
    unpack_hook = None

    def __init__(self, op, needs_input_grad):
        self.op = op
        # One bool per tensor input (see the module docstring for the rule).
        self.needs_input_grad = needs_input_grad
        self.saved_arrays = ()
        # Per saved array that is some tensor's: (version counter, version then,
        # what it is, (dtype, shape)), checked by versions.check_versions.
        # Function.apply adds the saved arrays that are the op's inputs' or
        # outputs'; an op may add more in forward (a checkpoint: its recompute
        # reads every input and parameter of its segment, as they were before
        # the segment ran).
        self.saved_versions = ()

    def save_for_backward(self, *arrays):
        """Keep `arrays` for backward. Bytes are counted as saved activations.

        An entry may be None, for an array this run does not need (see Mul).
        """
        if not any(self.needs_input_grad):
            return  # no backward will run: keep nothing
        arrays = tuple(backend.as_array(a) if a is not None else None for a in arrays)
        if self.counted:
            for a in arrays:
                if a is not None:
                    memory.track(a, "activations")
        self.saved_arrays = arrays

    def free(self):
        """Drop the saved arrays (after backward, or when a checkpoint discards them)."""
        saved_some = any(a is not None for a in self.saved_arrays or ()) or any(p is not None for p in self.packed or ())
        if self.counted:
            for a in self.held_arrays():
                memory.release(a, "activations")
        if saved_some:
            # Freed (saved_arrays None): a second backward through this record is refused, so the
            # facts its backward would read go too (a checkpoint's segment holds its input tensors).
            op, needs_input_grad = self.op, self.needs_input_grad
            vars(self).clear()
            self.op, self.needs_input_grad, self.saved_arrays = op, needs_input_grad, None
        else:
            self.saved_arrays = ()  # saved nothing, lost nothing: it may be walked again, as in PyTorch
        self.saved_versions = ()
        self.packed, self.packed_arrays, self.packed_meta = None, (), None

    def __del__(self):
        # A record that dies without a backward (its output was dropped) lets go
        # of its holds too; else a buffer that outlives it, such as the input
        # batch, would stay counted as activations.
        if self.saved_arrays or self.packed:
            self.free()

    def held_arrays(self):
        """The arrays this record holds now: the saved arrays, and any a pack hook returned."""
        return [a for a in self.saved_arrays or () if a is not None] + list(self.packed_arrays)

    def facts(self):
        """What the op's forward left on ctx for its backward (shapes, axes), without the saved arrays.

        A checkpoint's recompute gives them to a record it rebuilds without
        running the op (recompute.py), or to an op a policy kept (policies.py).
        """
        return {k: v for k, v in vars(self).items() if k not in _BOOKKEEPING}

    @property
    def saved_nbytes(self):
        return sum(a.nbytes for a in self.held_arrays())

    # -- saved_tensors_hooks (see the module docstring) ----------------------------
    def pack(self, hooks, tensors):
        """Hand each saved array to the pack hook; keep what it returns instead (Function.apply calls this)."""
        pack_hook, self.unpack_hook = hooks
        packed, counted = [], []
        for a in self.saved_arrays:
            if a is None:
                packed.append(None)
                continue
            p, arrays = pack_saved(pack_hook, _alias(a, tensors))
            packed.append(p)
            counted += arrays
            memory.release(a, "activations")
        self.packed_meta = tuple(None if a is None else _metadata(a) for a in self.saved_arrays)
        self.saved_arrays, self.packed, self.packed_arrays = (), packed, tuple(counted)

    def unpack(self, node=None):
        """The saved arrays back from what pack kept, for this record's backward (`node`: named in errors)."""
        what = node.describe() if node is not None else self.op
        meta = self.packed_meta or (None,) * len(self.packed)
        arrays = tuple(None if p is None else unpack_saved(self.unpack_hook, p, what, i, m)
                       for i, (p, m) in enumerate(zip(self.packed, meta)))
        for a in arrays:
            if a is not None:
                memory.track(a, "activations")
        self.saved_arrays = arrays

    def repack(self):
        """After a backward that retains the graph: drop the unpacked arrays, keep the packed form."""
        for a in self.saved_arrays or ():
            if a is not None:
                memory.release(a, "activations")
        self.saved_arrays = ()


# What a Context keeps for the engine, not for the op's backward (see Context.facts).
_BOOKKEEPING = ("op", "needs_input_grad", "saved_arrays", "saved_versions", "counted", "computed")


class Function:
    """Base class of every differentiable op (see the module docstring)."""

    mixes_dtypes = False  # True for a record whose inputs may differ in dtype (a checkpoint's: whatever its code reads)

    @staticmethod
    def forward(ctx, *arrays, **options):
        raise NotImplementedError  # abstract: each op defines it

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError  # abstract: each op defines it

    @classmethod
    def run_forward(cls, ctx, arrays, options):
        """forward on raw arrays; its result as an array (or a tuple of arrays), 0-d ones included."""
        if observe.runners:  # an instrument goes around the op (observe.py): a profile's clock
            phase = "recompute" if memory.tracker.phase == "recompute" else "forward"
            out = observe.run(cls.__name__, phase, lambda: cls.forward(ctx, *arrays, **options))
        else:
            out = cls.forward(ctx, *arrays, **options)
        if isinstance(out, tuple):
            return tuple([backend.as_array(o) for o in out])
        return backend.as_array(out)

    @classmethod
    def run_backward(cls, ctx, grads):
        """backward for the gradients of the outputs; always a tuple, one array or None per input."""
        if observe.runners:
            in_grads = observe.run(cls.__name__, "backward", lambda: cls.backward(ctx, *grads))
        else:
            in_grads = cls.backward(ctx, *grads)
        if not isinstance(in_grads, tuple):
            in_grads = (in_grads,)
        return tuple([backend.as_array(g) for g in in_grads])  # as_array(None) is None

    @classmethod
    def apply(cls, *inputs, **options):
        from .tensor import Tensor

        op = cls.__name__
        if autocast.get_dtype() is not None:  # inside autocast(): the inputs first cast to this op's dtype
            inputs = autocast.cast_inputs(op, inputs)
        _check_inputs(op, inputs, cls.mixes_dtypes)
        active = tape.active()
        if active is None:
            needs_input_grad = (False,) * len(inputs)
        else:
            needs_input_grad = tuple(t.requires_grad for t in inputs)
            for t in inputs:  # one integer compare per computed input: was it changed in place since?
                if t._node is not None and t._version_counter.value != t._recorded_version:
                    versions.raise_changed_since_recorded(op, inputs)
        ctx = Context(op, needs_input_grad)
        arrays = [t.data for t in inputs]
        if active is None:
            out = cls.run_forward(ctx, arrays, options)
        else:
            out = active.run(cls, ctx, arrays, options)
        outs = out if isinstance(out, tuple) else (out,)
        requires_grad = any(needs_input_grad)
        # device=: outputs stay where the op ran, whatever the default device is
        # (an integer output, such as max pooling's indices, takes no gradient: it does not require one)
        tensors = tuple(Tensor(o, requires_grad=requires_grad and autocast.is_float(o.dtype), device=backend.device_of(o))
                        for o in outs)
        _share_versions_of_views(tensors, inputs)
        node = None
        if requires_grad:
            if ctx.saved_arrays:
                ctx.saved_versions += _versions_of_saved(ctx.saved_arrays, inputs, tensors)
                if _saved_hooks and _saved_hooks[-1] is not None:
                    ctx.pack(_saved_hooks[-1], inputs + tensors)
            node = tape.Node(cls, ctx, inputs, tensors)
            if anomaly.enabled:
                node.stack = anomaly.capture_stack()
            active.append(node)
        if ctx.computed:  # an op a recompute skipped computed nothing: nothing to check or to count
            if anomaly.enabled:
                anomaly.check_outputs(op, node, arrays, outs)
            if not observe.observers:
                pass  # nobody watches (observe.py)
            elif node is not None and node.index >= 0:  # on a tape (a checkpointed segment's forward keeps none)
                memory.tracker.event(op, "op", tape=node.tape.number, record=node.index, saved=node.activation_nbytes,
                                     saved_parameters=node.saved_parameters, inputs=arrays, outputs=outs)
            else:
                memory.tracker.event(op, "op", inputs=arrays, outputs=outs)
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
    """Per saved array that is (a view of) an input's or an output's: (counter, version now, what, (dtype, shape)).

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
                entries.append((t._version_counter, t._version_counter.value, what, (a.dtype, tuple(a.shape))))
                break
    return tuple(entries)


def _check_inputs(op, inputs, mixes_dtypes=False):
    """One device and one dtype per op: a clear error instead of NumPy's upcast."""
    if len(inputs) < 2:
        return
    try:
        backend.array_module(*(t.data for t in inputs))
    except RuntimeError as e:
        raise RuntimeError(f"{op}: {e}") from None
    if mixes_dtypes:
        return
    dtypes = {t.dtype for t in inputs}
    if len(dtypes) > 1:
        names = " and ".join(sorted(str(d) for d in dtypes))
        raise TypeError(
            f"{op}: inputs have different dtypes ({names}); convert one with "
            ".to(dtype) so float32 work is not silently done in float64"
        )


# -- saved-tensor hooks: the stack, and packing one array --------------------------
_saved_hooks = []  # (pack, unpack) pairs, innermost last; None on top: no hooks (a recompute)


def push_saved_tensors_hooks(pack_hook, unpack_hook):
    """Make (pack, unpack) the hooks in force; returns the depth to give pop_saved_tensors_hooks."""
    _saved_hooks.append((pack_hook, unpack_hook))
    return len(_saved_hooks) - 1


def push_no_saved_tensors_hooks():
    """Inside a checkpoint's recompute: what ops save there is not packed by the caller's hooks."""
    _saved_hooks.append(None)
    return len(_saved_hooks) - 1


def pop_saved_tensors_hooks(depth):
    """The hooks in force before the push that returned `depth`.

    By depth, not by popping one: hooks pushed since and never popped (a
    block entered in a hook and left open) go too, so they can never pack
    the saved arrays of later ops, and popping twice cannot pop another's.
    """
    del _saved_hooks[depth:]


def pack_saved(pack_hook, t):
    """(pack_hook(t), the arrays in it now counted as saved activations: its tensors on t's device).

    Run under no_grad. Whoever keeps the packed form releases those arrays' holds when done.
    A pack hook that changes t in place is refused, as in PyTorch (torch/csrc/autograd/saved_variable.cpp):
    t is the very array backward will read.
    """
    version = t._version
    packed = _run_hook(pack_hook, t)
    if t._version != version:
        raise RuntimeError(
            f"saved_tensors_hooks: the pack hook {tape.hook_name(pack_hook)} is modifying its input in place. "
            "Tensors provided as input to pack hook can not be modified by in-place operations as this can "
            "lead to unexpected side-effects (it is the array backward reads). Pack a copy: t.clone()")
    counted = [held.data for held in _tensors_in(packed) if held.device == t.device]
    for a in counted:
        memory.track(a, "activations")
    return packed, counted


def _run_hook(hook, value):
    """hook(value), under no_grad. Saved-tensor hooks the hook pushed and left are dropped after it."""
    depth = len(_saved_hooks)
    try:
        with tape.no_grad():
            return hook(value)
    finally:
        del _saved_hooks[depth:]


def unpack_saved(unpack_hook, packed, what="an op", position=0, expected=None):
    """unpack_hook(packed), under no_grad: the array for backward.

    what: the record (or op) whose saved array this is, and position: which
    of its saved arrays, both for the errors; expected: (shape, dtype, device)
    of the array pack was given, or None. The result must have that shape and
    device, and that dtype or another floating one (backward then computes in
    it and validate_gradients casts the gradient back, as PyTorch's
    validate_outputs does): anything else would fail inside the op's backward
    with NumPy's message, far from the hook. PyTorch checks only that unpack
    returns a Tensor; its wording for a tensor that comes back different is
    the non-reentrant checkpoint's (torch/utils/checkpoint.py,
    check_recomputed_tensors_match), used here.
    """
    from .tensor import Tensor  # imported here: tensor.py imports this module

    t = _run_hook(unpack_hook, packed)
    if not isinstance(t, Tensor):
        raise TypeError(f"saved_tensors_hooks: Output of saved tensor unpack_hook expected to be a Tensor but got "
                        f"result of type {type(t).__name__} (the unpack hook {tape.hook_name(unpack_hook)}, for the "
                        f"array {what} saved at position {position})")
    if expected is not None:
        got = _metadata(t.data)
        if got[0] != expected[0] or got[2] != expected[2] or not _same_kind(got[1], expected[1]):
            raise RuntimeError(
                f"saved_tensors_hooks: the unpack hook {tape.hook_name(unpack_hook)} returned a tensor with different "
                f"metadata than the array {what} saved at position {position}:\n"
                f"saved metadata: {_describe_metadata(expected)}\nunpacked metadata: {_describe_metadata(got)}\n"
                "An unpack hook gives back the tensor its pack hook was given: the same shape and device, and "
                "the same dtype (or another floating one)")
    return t.data


def _metadata(a):
    """(shape, dtype, device) of a saved array: what its unpacked tensor must match."""
    return tuple(a.shape), a.dtype, backend.device_of(a)


def _describe_metadata(meta):
    shape, dtype, device = meta
    return f"{{'shape': {shape}, 'dtype': {dtype}, 'device': {device!r}}}"


def _same_kind(got, saved):
    """The same dtype, or two floating ones (bfloat16 included)."""
    return got == saved or (backend.is_inexact(got) and backend.is_inexact(saved))


def _alias(a, tensors):
    """A Tensor of array `a` that shares the version counter of the input or output it belongs to."""
    from .tensor import Tensor  # imported here: tensor.py imports this module

    alias = Tensor(a, device=backend.device_of(a))
    owner = a if a.base is None else a.base
    for t in tensors:
        if t.data is owner or t.data.base is owner:
            alias._version_counter = t._version_counter
            break
    return alias


def _tensors_in(packed):
    """The Tensors in what a pack hook returned (itself, or inside tuples, lists, dicts)."""
    from .tensor import Tensor  # imported here: tensor.py imports this module

    if isinstance(packed, Tensor):
        return [packed]
    if isinstance(packed, (tuple, list)):
        return [t for p in packed for t in _tensors_in(p)]
    if isinstance(packed, dict):
        return [t for p in packed.values() for t in _tensors_in(p)]
    return []
