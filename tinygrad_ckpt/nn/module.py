"""Parameter and Module: how a model holds its weights and finds them again.

A `Parameter` is a Tensor that requires grad and is counted as "parameters"
in the memory accounting. A `Module` is a plain Python object whose
attributes may be Parameters or other Modules: there is no registration
step and no `__setattr__` hook. `named_parameters()` simply walks
`vars(self)` in assignment order, recursing into child modules, so
assigning them is all a layer writes, and the names come out dotted as in
PyTorch (`blocks.0.attn.c_attn.weight`):

    >>> import numpy
    >>> from tinygrad_ckpt.nn import LayerNorm
    >>> class Scale(Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.weight = Parameter(numpy.ones(3, dtype=numpy.float32))
    ...         self.ln_1 = LayerNorm(3)
    >>> [name for name, _ in Scale().named_parameters()]
    ['weight', 'ln_1.weight', 'ln_1.bias']

Lists of modules go in a `ModuleList` or `Sequential` (layers.py), whose
children are named "0", "1", ...

Buffers are state that is saved with the model but not trained (BatchNorm's
running statistics). A module declares them by name in the class attribute
`_buffers`, e.g. `_buffers = ("running_mean", "running_var")`; they are plain
Tensors that `state_dict`, `load_state_dict` and `to` handle alongside the
parameters.

Forward hooks, as PyTorch's: `register_forward_pre_hook(hook)` calls
hook(module, args) before forward (a result that is not None replaces the
arguments), `register_forward_hook(hook)` calls hook(module, args, output)
after it (a result that is not None replaces the output); each returns a
handle whose remove() takes the hook off. ZeRO stage 3 (zero.py) gathers a
block's parameters in the one and frees them in the other.

What does not live here: the layers (layers.py), the optimizers (optim.py),
saving to disk (serialization.py).
"""

from .. import backend, memory
from ..tape import RemovableHandle, no_grad
from ..tensor import Tensor


class Parameter(Tensor):
    """A Tensor that is a model weight: requires grad, counted as "parameters".

    Its `.grad` is a plain Tensor (counted as "gradients"), as in PyTorch.
    """

    __slots__ = ()

    def __init__(self, data, dtype=None, device=None):
        super().__init__(data, requires_grad=True, dtype=dtype, device=device)
        memory.track(self.data, "parameters")

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()


class LoadStateDictError(RuntimeError):
    """load_state_dict found missing, unexpected or wrongly shaped entries.

    The lists are attributes too, so code can inspect them.
    """

    def __init__(self, module_name, missing, unexpected, mismatched):
        self.missing, self.unexpected, self.mismatched = missing, unexpected, mismatched
        lines = [f"error(s) loading a state_dict into {module_name}; nothing was copied:"]
        if missing:
            lines.append(f"  missing keys (in the model, not in the state_dict): {', '.join(missing)}")
        if unexpected:
            lines.append(f"  unexpected keys (in the state_dict, not in the model): {', '.join(unexpected)}")
        for name, got, want in mismatched:
            lines.append(f"  wrong shape for {name}: state_dict has {got}, the model has {want}")
        lines.append("  (pass strict=False to load only the matching keys; shapes must always match)")
        super().__init__("\n".join(lines))


class Module:
    """Base class of every layer and model (see the module docstring).

    Subclasses call `super().__init__()`, assign Parameters and Modules as
    attributes, and define `forward`; calling the module calls forward.
    """

    _buffers = ()  # names of non-trained Tensor attributes saved in state_dict
    _forward_pre_hooks = _forward_hooks = ()  # none until registered (each instance gets its own list then)

    def __init__(self):
        self.training = True

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define forward()")  # abstract, as in PyTorch

    def __call__(self, *args, **kwargs):
        for hook in list(self._forward_pre_hooks):
            replaced = hook(self, args)
            args = args if replaced is None else replaced if isinstance(replaced, tuple) else (replaced,)
        output = self.forward(*args, **kwargs)
        for hook in list(self._forward_hooks):
            replaced = hook(self, args, output)
            output = output if replaced is None else replaced
        return output

    def register_forward_pre_hook(self, hook):
        """Call hook(module, args) before each forward; returns a handle whose remove() takes it off."""
        return self._add_hook("_forward_pre_hooks", hook, "forward pre hook")

    def register_forward_hook(self, hook):
        """Call hook(module, args, output) after each forward; returns a handle whose remove() takes it off."""
        return self._add_hook("_forward_hooks", hook, "forward hook")

    def _add_hook(self, kind, hook, what):
        if not callable(hook):
            raise TypeError(f"{what} must be callable, got {type(hook).__name__}")
        if kind not in vars(self):
            setattr(self, kind, [])  # this instance's own list, not the class's empty tuple
        getattr(self, kind).append(hook)
        return RemovableHandle(getattr(self, kind), hook)

    # -- finding children and parameters ---------------------------------------
    def named_children(self):
        """(name, module) for each direct child, in assignment order."""
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value
            elif isinstance(value, (list, tuple)) and any(isinstance(v, Module) for v in value):
                raise TypeError(
                    f"{type(self).__name__}.{name} is a plain {type(value).__name__} of modules, so its "
                    "parameters would not be found; use ModuleList(...) or Sequential(...)"
                )

    def children(self):
        for _, module in self.named_children():
            yield module

    def named_modules(self, prefix=""):
        """(dotted name, module) for self and every descendant, depth first."""
        yield prefix, self
        for name, child in self.named_children():
            yield from child.named_modules(prefix + name if not prefix else f"{prefix}.{name}")

    def modules(self):
        for _, module in self.named_modules():
            yield module

    def named_parameters(self):
        """(dotted name, Parameter) for every parameter, each shared one once.

        Order as in PyTorch: a module's own parameters (in assignment order),
        then its children's, depth first.

        A parameter reachable under two names (a tied embedding and output
        layer) is reported under the first, so an optimizer updates it once.
        """
        seen = set()
        for prefix, module in self.named_modules():
            for name, value in vars(module).items():
                if isinstance(value, Parameter) and id(value) not in seen:
                    seen.add(id(value))
                    yield (f"{prefix}.{name}" if prefix else name), value

    def parameters(self):
        for _, p in self.named_parameters():
            yield p

    def named_buffers(self):
        """(dotted name, Tensor) for every buffer declared in a `_buffers` list."""
        for prefix, module in self.named_modules():
            for name in module._buffers:
                yield (f"{prefix}.{name}" if prefix else name), getattr(module, name)

    # -- saving and loading ----------------------------------------------------
    def state_dict(self):
        """{dotted name: NumPy array} for every parameter and buffer.

        The arrays are host copies: a snapshot that later training steps do not
        change (PyTorch's shares memory with the model instead). A model on
        the meta device has no values to copy: NeedsValues, naming the entry.
        """
        state = {}
        for name, t in list(self.named_parameters()) + list(self.named_buffers()):
            state[name] = backend.to_host(t.data, f"state_dict() of {name!r}").copy()
        return state

    def load_state_dict(self, state, strict=True):
        """Copy `state` (name -> Tensor or NumPy array) into the parameters and buffers.

        Copies in place into the existing arrays, on their device and in their
        dtype, so an optimizer holding the parameters keeps working. Checks
        everything before copying anything: on a mismatch raises
        LoadStateDictError listing the missing, unexpected and wrongly shaped
        keys. With strict=False missing and unexpected keys are skipped (shapes
        must still match). Returns (missing, unexpected).
        """
        own = dict(list(self.named_parameters()) + list(self.named_buffers()))
        missing = [name for name in own if name not in state]
        unexpected = [name for name in state if name not in own]
        mismatched = []
        for name, t in own.items():
            if name in state and tuple(state[name].shape) != t.shape:
                mismatched.append((name, tuple(state[name].shape), t.shape))
        if mismatched or (strict and (missing or unexpected)):
            raise LoadStateDictError(type(self).__name__, missing, unexpected, mismatched)
        with no_grad():  # an in-place change of a parameter, as an optimizer step is
            for name, t in own.items():
                if name in state:
                    value = state[name].data if isinstance(state[name], Tensor) else state[name]
                    t.copy_(backend.to_device(value, t.device))
        return missing, unexpected

    # -- modes, gradients, devices ---------------------------------------------
    def train(self, mode=True):
        """Training mode (dropout drops, batch norm uses batch statistics) for self and children."""
        for module in self.modules():
            module.training = mode
        return self

    def eval(self):
        """Evaluation mode: dropout is the identity, batch norm uses running statistics."""
        return self.train(False)

    def zero_grad(self, set_to_none=True):
        """Forget the gradients. None (the default) frees their memory; zeros keeps it."""
        for p in self.parameters():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        memory.tracker.mark(f"{type(self).__name__}.zero_grad")  # a timeline shows the gradients go

    def to(self, device):
        """Move every parameter and buffer to `device`, in place; returns self.

        The Parameter objects stay the same (only their .data moves), so build
        the optimizer after moving the model: its state is allocated where the
        parameters are. A model on the meta device has no values to move:
        NeedsValues, naming the entry (use to_empty, as in PyTorch).
        """
        for name, t in list(self.named_parameters()) + list(self.named_buffers()):
            if not backend.holds_values(t.device) and backend.holds_values(device):
                raise backend.no_values(
                    f"Module.to({device!r}) of {name!r}", t.data,
                    f"A model built on device='meta' has nothing to copy: model.to_empty(device={device!r}) "
                    "makes its arrays there without values; then load a state_dict or initialise them.")
        for p in self.parameters():
            if p.device != device:
                p.data = backend.to_device(p.data, device)
                memory.track(p.data, "parameters")
                if p.grad is not None:
                    p.grad = Tensor(backend.to_device(p.grad.data, device), device=device)
                    memory.track(p.grad.data, "gradients")
        for _, b in self.named_buffers():
            b.data = backend.to_device(b.data, device)
            memory.track(b.data)
        return self

    def to_empty(self, *, device):
        """Every parameter and buffer as a new array on `device` whose values are not set; returns self.

        PyTorch's Module.to_empty: the way off the meta device, which has no
        values to copy. The arrays hold whatever the memory held, so load a
        state_dict (load_state_dict) or initialise them before use. The
        Parameter objects stay the same (build the optimizer after); their
        gradients are dropped.
        """
        xp = backend.module_for(device)
        for p in self.parameters():
            p.data, p.grad = xp.empty(p.shape, dtype=p.dtype), None
            memory.track(p.data, "parameters")
        for _, b in self.named_buffers():
            b.data = xp.empty(b.shape, dtype=b.dtype)
            memory.track(b.data)
        return self

    # -- printing ------------------------------------------------------------
    def extra_repr(self):
        """The layer's own settings, shown in repr (e.g. 'in_features=3, ...')."""
        return ""

    def __repr__(self):
        children = list(self.named_children())
        if not children:
            return f"{type(self).__name__}({self.extra_repr()})"
        lines = [f"{type(self).__name__}("]
        for name, child in children:
            lines.append("  (" + name + "): " + repr(child).replace("\n", "\n  "))
        return "\n".join(lines) + "\n)"
