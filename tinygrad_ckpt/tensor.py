"""Tensor: an array, its gradient, and the record of the op that made it.

Names and meanings follow PyTorch: `.data` is the backend array (NumPy or
CuPy), `.grad` a Tensor or None, `.requires_grad`, `.shape`, `.dtype`,
`.device`, `.numpy()`, `.item()`, `.detach()`, `.to(...)`,
`backward(gradient, retain_graph, create_graph, inputs)` and
`register_hook(hook)` (the walk keeps and calls the hooks: tape.py). The arithmetic methods are sugar: each calls one op's `apply`
(ops/), so everything differentiable happens in the ops, and here there is
only plumbing.

In-place methods (`add_`, `sub_`, `mul_`, `copy_`, `zero_`, `fill_`, `t[i] = v`)
write into `.data` and bump the tensor's version, a counter shared with its
views (reshape, transpose, basic indexing, `detach()`), as in PyTorch. Every
array an op saves for backward remembers its tensor's version, and backward
refuses to use one that moved on (versions.check_versions): a change in place can
never silently give a wrong gradient. In-place methods are not recorded on
the tape (PyTorch records them), so, with gradients on:
  * on a leaf that requires grad (a parameter) they are an error, as in
    PyTorch: update parameters under `no_grad()`, as the optimizers do;
  * a source that requires grad (`buf.add_(y)`) is an error: its gradient
    would be lost;
  * on a computed tensor they are allowed, but an op that then reads it, or
    `backward()` from it, is an error: its record computed other values.
Writing through `.data` (`p.data[...] = ...`) is the escape hatch: no check,
no version bump, as `.data` is in PyTorch.

Python numbers in arithmetic follow PyTorch's type promotion: the tensor's
dtype, unless the number is of a higher kind (bool < integer < float): an
integer tensor plus 0.5 is a float32 tensor (the default float dtype), a
bool tensor plus 1 is int64. True division of integers gives float32.

What does not live here: derivatives (ops/), the backward walk (tape.py).
"""

import numbers

import numpy

from . import autocast, backend, memory, tape, versions
from .ops import elementwise, matmul, movement, nn, reduce
from .ops.axes import normalize_axes, normalize_axis

_FLOAT_DEFAULT = numpy.float32


class Tensor:
    __slots__ = ("data", "grad", "requires_grad", "_node", "_version_counter", "_recorded_version",
                 "_hooks", "_post_accumulate_grad_hooks", "__weakref__")
    __array_ufunc__ = None  # NumPy's operators defer to ours: numpy.float64(0.5) * t is a Tensor

    def __init__(self, data, requires_grad=False, dtype=None, device=None):
        source = data if isinstance(data, Tensor) else None
        if source is not None:
            data = data.data
        if not backend.is_array(data):
            python_values = not hasattr(data, "dtype")
            data = numpy.asarray(data)
            if dtype is None and python_values and data.dtype.kind == "f":
                dtype = _FLOAT_DEFAULT  # Python floats become float32, as in PyTorch
        if dtype is not None and data.dtype != numpy.dtype(dtype):
            data = data.astype(dtype)
        if device is None and isinstance(data, numpy.ndarray):
            # Host data goes to the default device: 'cpu' unless backend.set_default_device
            # changed it (as torch.set_default_device). Engine code that wraps an array it
            # computed passes device=, so a CPU result stays on the CPU whatever the default.
            device = backend.get_default_device()
        if device is not None:
            data = backend.to_device(data, device)
        if requires_grad and not autocast.is_float(data.dtype):  # bfloat16 (ml_dtypes) is kind 'V', yet a float
            raise TypeError(
                f"only floating-point tensors can require grad, got dtype {data.dtype}; "
                "pass dtype=numpy.float32 (or float64)"
            )
        self.data = data
        self.grad = None
        self.requires_grad = requires_grad
        self._node = None  # the tape record that produced this tensor; None for a leaf
        self._hooks = None  # a leaf's gradient hooks (register_hook); a computed tensor's live on its record
        self._post_accumulate_grad_hooks = None  # a leaf's (register_post_accumulate_grad_hook)
        # The same memory as `source` (no copy was made): the same version counter.
        shared = source is not None and data is source.data
        self._version_counter = source._version_counter if shared else versions.VersionCounter()
        memory.track(data)

    # -- what it is ----------------------------------------------------------
    @property
    def shape(self):
        return tuple(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def ndim(self):
        return self.data.ndim

    @property
    def device(self):
        return backend.device_of(self.data)

    @property
    def grad_fn(self):
        """The tape record that produced this tensor (None for a leaf), as in PyTorch."""
        return self._node

    @property
    def is_leaf(self):
        return self._node is None

    @property
    def _version(self):
        """How many in-place changes this tensor's memory has had (PyTorch's `_version`)."""
        return self._version_counter.value

    def size(self, dim=None):
        if dim is not None and self.ndim == 0:
            raise IndexError(f"size: a 0-d tensor has no axis {dim}")
        return self.shape if dim is None else self.shape[normalize_axis("size", dim, self.ndim)]

    def numel(self):
        return int(self.data.size)

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")  # PyTorch's words
        return self.shape[0]

    def __bool__(self):
        """The truth of a tensor of one value, as in PyTorch and NumPy (`if loss > 0:`).

        Several values, or none, are ambiguous: RuntimeError with PyTorch's
        words (ATen's is_nonzero). Without this, Python would ask len() and
        every tensor of several values would be true. A meta tensor has no
        value to test: NeedsValues.
        """
        n = self.numel()
        if n != 1:
            raise RuntimeError(f"Boolean value of Tensor with {'no values' if n == 0 else 'more than one value'} "
                               f"is ambiguous (shape {self.shape}); reduce it first, e.g. with .max() or .sum()")
        return bool(self._host("bool()").item())

    def __repr__(self):
        grad = ", requires_grad=True" if self.requires_grad else ""
        node = f", grad_fn={self._node.name}" if self._node is not None else ""
        dev = "" if self.device == "cpu" else f", device='{self.device}'"
        if not backend.holds_values(self.device):  # PyTorch's "tensor(..., device='meta', size=(2, 3))"
            return f"Tensor(..., device='meta', shape={self.shape}, dtype={self.dtype}{grad}{node})"
        return f"Tensor({self._host('repr()')!r}{dev}{grad}{node})"

    def _values(self, what):
        """self.data, for code that reads the values; an error if a checkpoint's recompute skipped them."""
        if tape.is_placeholder(self.data):
            tape.raise_placeholder_read(what)
        return self.data

    def _host(self, what):
        """A host copy of the values, for `what` (numpy(), item(), ...); the meta device has none: NeedsValues."""
        return backend.to_host(self._values(what), what)

    # -- moving and converting ---------------------------------------------
    def numpy(self):
        """A host NumPy array (a copy if the tensor is on the GPU)."""
        return self._host("numpy()")

    def item(self):
        if self.data.size != 1:
            raise ValueError(f"item() needs a tensor with one element, this one has shape {self.shape}")
        return self._host("item()").item()

    def tolist(self):
        return self._host("tolist()").tolist()

    def detach(self):
        """The same array, cut from the tape (shares memory and the version counter, as in PyTorch)."""
        return Tensor(self, device=self.device)

    def clone(self):
        """A copy of the values in new memory, on the tape (gradients flow back to self)."""
        return movement.Clone.apply(self)

    def to(self, device=None, dtype=None):
        """A copy on another device and/or dtype (self if nothing changes)."""
        if isinstance(device, (type, numpy.dtype)):
            device, dtype = None, device
        if (device is None or device == self.device) and (dtype is None or numpy.dtype(dtype) == self.dtype):
            return self
        if dtype is not None and numpy.dtype(dtype) != self.dtype:
            out = elementwise.Cast.apply(self, dtype=numpy.dtype(dtype))
        else:
            out = self
        if device is not None and device != out.device:
            out = movement.ToDevice.apply(out, device=device)
        return out

    def float(self):
        return self.to(dtype=numpy.float32)

    def double(self):
        return self.to(dtype=numpy.float64)

    def cpu(self):
        return self.to("cpu")

    def cuda(self):
        return self.to("cuda")

    # -- gradients -------------------------------------------------------------
    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """Add d(self)/d(leaf) into every leaf's .grad (PyTorch semantics).

        inputs: a tensor or a sequence of tensors: only they accumulate a
        gradient (into .grad; a computed tensor too), nothing else is touched.
        retain_graph: keep the saved arrays for another backward (default:
        create_graph). create_graph=True is not supported: see autograd.grad.
        """
        _no_create_graph(create_graph, "backward()")
        if not self.requires_grad:
            raise RuntimeError(
                "backward() on a tensor that does not require grad: no input of the "
                "computation had requires_grad=True (or it ran under no_grad())"
            )
        grad = _gradient_for(self, gradient, "backward()")
        if self._node is not None and self._version != self._recorded_version:
            versions.raise_changed_since_recorded("backward()", [self])
        if inputs is not None:
            inputs = _differentiated(inputs, "backward(inputs=...)")
        tape.run_backward([self], [grad], retain_graph=bool(retain_graph), inputs=inputs)

    def register_hook(self, hook):
        """Call hook(grad) with this tensor's gradient in every backward; a Tensor it returns replaces it.

        As PyTorch's: on a computed tensor it runs when the gradient reaches
        the op that made the tensor (even if the tensor itself is gone), on
        a leaf before the gradient is added to .grad; returns a handle whose
        remove() takes the hook off. Inside a checkpointed segment, the hooks
        registered in its forward run in its recomputed backward.
        """
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        return tape.register_hook(self, hook)

    def register_post_accumulate_grad_hook(self, hook):
        """Call hook(tensor) after a gradient has been added into this leaf's .grad; returns a handle (remove()).

        PyTorch's name (torch/_tensor.py, 2.13), with one difference said
        plainly: PyTorch calls the hook "after all gradients for a tensor have
        been accumulated", once a backward; here a leaf without gradient hooks
        gets each contribution added as the walk reaches it (tape.py), and the
        hook runs after each (a tied weight's: twice). The hook may read and change .grad (set it to None:
        ZeRO stage 3 sends it away, zero.py).
        """
        if self._node is not None or not self.requires_grad:
            raise RuntimeError("register_post_accumulate_grad_hook: only a leaf that requires grad has a .grad "
                               "to accumulate into; this tensor " +
                               ("is computed by an op" if self._node is not None else "does not require grad"))
        if not callable(hook):
            raise TypeError(f"register_post_accumulate_grad_hook takes a callable hook(tensor), got {type(hook).__name__}")
        if self._post_accumulate_grad_hooks is None:
            self._post_accumulate_grad_hooks = []
        self._post_accumulate_grad_hooks.append(hook)
        return tape.RemovableHandle(self._post_accumulate_grad_hooks, hook)

    # -- in place (bumps the version counter; see the module docstring) ---------
    def _write(self, *sources):
        """Check that an in-place write into self is allowed (from `sources`), before it is made."""
        self._values("an in-place operation")
        for s in sources:
            if isinstance(s, Tensor):
                s._values("an in-place operation")
        if not tape.is_grad_enabled():
            return
        if self.requires_grad and self._node is None:
            raise RuntimeError(
                "a leaf Variable that requires grad is being used in an in-place operation. "
                "Update parameters under no_grad() (as the optimizers do), or write to .data."
            )
        for s in sources:
            if isinstance(s, Tensor) and s.requires_grad:
                raise RuntimeError(
                    f"an in-place operation takes a tensor of shape {s.shape} that requires grad, but "
                    "in-place operations are not recorded on the tape, so its gradient would be lost; "
                    "write it out of place (y = y + x, not y.add_(x)), or pass x.detach()"
                )

    def _bump(self):
        self._version_counter.value += 1
        return self

    def zero_(self):
        self._write()
        self.data[...] = 0
        return self._bump()

    def fill_(self, value):
        self._write(value)
        self.data[...] = _raw(value)
        return self._bump()

    def copy_(self, src):
        """Copy src's values in; an array on another device (NumPy included) is transferred explicitly."""
        self._write(src)
        src = src.data if isinstance(src, Tensor) else src
        if not isinstance(src, (int, float, numpy.generic)):
            src = backend.to_device(src, self.device)
        self.data[...] = src
        return self._bump()

    def add_(self, other, alpha=1.0):
        self._write(other)
        other = other.data if isinstance(other, Tensor) else other
        if alpha == 1.0:
            self.data += other
        else:
            self.data += alpha * other
        return self._bump()

    def sub_(self, other, alpha=1.0):
        return self.add_(other, alpha=-alpha)

    def mul_(self, other):
        self._write(other)
        self.data *= other.data if isinstance(other, Tensor) else other
        return self._bump()

    def __setitem__(self, index, value):
        """self[index] = value, in place (value: a number, an array or a Tensor)."""
        self._write(value)
        value = value.data if isinstance(value, Tensor) else value
        if not isinstance(value, (numbers.Number, numpy.generic)):
            value = backend.to_device(value if backend.is_array(value) else numpy.asarray(value), self.device)
        self.data[_raw_index(index, self.device)] = value
        self._bump()

    # -- arithmetic (each line is one op) ---------------------------------------
    def _lift(self, x):
        """A Python number or array as a constant tensor of our dtype and device."""
        if isinstance(x, Tensor):
            return x
        xp = backend.array_module(self.data)
        return Tensor(xp.asarray(x, dtype=self.dtype), device=self.device)

    def _with(self, other, true_division=False):
        """self and other as two tensors, a Python number promoted as in PyTorch (promote_types).

        true_division: integers become float32 first, as in PyTorch (1 / 2 is 0.5).
        Two tensors of different dtypes stay so: the op refuses them.
        """
        if isinstance(other, Tensor):
            return (_float(self), _float(other)) if true_division else (self, other)
        dtype = promote_types(self.dtype, other)
        if true_division and dtype.kind in "biu":
            dtype = numpy.dtype(_FLOAT_DEFAULT)
        a = self if dtype == self.dtype else self.to(dtype=dtype)
        return a, a._lift(other)

    def __add__(self, other):
        return elementwise.Add.apply(*self._with(other))

    def __radd__(self, other):
        a, b = self._with(other)
        return elementwise.Add.apply(b, a)

    def __sub__(self, other):
        _no_bool_subtraction(self, other)
        return elementwise.Sub.apply(*self._with(other))

    def __rsub__(self, other):
        _no_bool_subtraction(self, other)
        a, b = self._with(other)
        return elementwise.Sub.apply(b, a)

    def __mul__(self, other):
        return elementwise.Mul.apply(*self._with(other))

    def __rmul__(self, other):
        a, b = self._with(other)
        return elementwise.Mul.apply(b, a)

    def __truediv__(self, other):
        return elementwise.Div.apply(*self._with(other, true_division=True))

    def __rtruediv__(self, other):
        a, b = self._with(other, true_division=True)
        return elementwise.Div.apply(b, a)

    def __pow__(self, exponent):
        if isinstance(exponent, Tensor):
            return elementwise.Pow.apply(self, exponent)
        dtype = promote_types(self.dtype, exponent)
        base = self if dtype == self.dtype else self.to(dtype=dtype)
        if isinstance(exponent, numpy.generic):
            exponent = exponent.item()  # a Python number: NumPy would make float32 ** float64 float64
        out = elementwise.PowScalar.apply(base, exponent=exponent)
        # NumPy makes bool ** True int8: cast that back. A floating result stays: under autocast pow is float32
        return out if out.dtype == dtype or autocast.is_float(out.dtype) else out.to(dtype=dtype)

    def __rpow__(self, base):
        a, b = self._with(base)
        out = elementwise.Pow.apply(b, a)
        # NumPy makes True ** bools int8: cast that back. A floating result stays: under autocast pow is float32
        return out if out.dtype == a.dtype or autocast.is_float(out.dtype) else out.to(dtype=a.dtype)

    def __neg__(self):
        return elementwise.Neg.apply(self)

    def __matmul__(self, other):
        return _matmul(self, self._lift(other))

    def __rmatmul__(self, other):
        return _matmul(self._lift(other), self)

    # Comparisons give boolean tensors (no gradient), as in PyTorch.
    def __lt__(self, other):
        return Tensor(self._values("a comparison") < _raw(other), device=self.device)

    def __le__(self, other):
        return Tensor(self._values("a comparison") <= _raw(other), device=self.device)

    def __gt__(self, other):
        return Tensor(self._values("a comparison") > _raw(other), device=self.device)

    def __ge__(self, other):
        return Tensor(self._values("a comparison") >= _raw(other), device=self.device)

    def abs(self):
        return elementwise.Abs.apply(self)

    __abs__ = abs

    def exp(self):
        return elementwise.Exp.apply(self)

    def log(self):
        return elementwise.Log.apply(self)

    def tanh(self):
        return elementwise.Tanh.apply(self)

    def sigmoid(self):
        return elementwise.Sigmoid.apply(self)

    def relu(self):
        return elementwise.ReLU.apply(self)

    def gelu(self):
        return elementwise.GELU.apply(self)

    def sqrt(self):
        return elementwise.Sqrt.apply(self)

    def masked_fill(self, mask, value):
        """`value` where the boolean `mask` is True, self elsewhere."""
        mask = backend.to_device(_raw(mask), self.device)  # a NumPy mask is copied over once
        return elementwise.Where.apply(self._lift(value), self, condition=mask)

    # -- reductions --------------------------------------------------------
    def sum(self, axis=None, keepdims=False):
        return reduce.Sum.apply(self, axis=axis, keepdims=keepdims)

    def mean(self, axis=None, keepdims=False):
        return reduce.Mean.apply(self, axis=axis, keepdims=keepdims)

    def max(self, axis=None, keepdims=False):
        return reduce.Max.apply(self, axis=axis, keepdims=keepdims)

    def min(self, axis=None, keepdims=False):
        """-max(-x): the gradient goes to the minima, shared between ties (reduce.Max)."""
        axes = normalize_axes("min", axis, self.ndim)  # errors name min, not max
        if self.numel() == 0:
            raise ValueError(f"min of an empty tensor of shape {self.shape}")
        return -reduce.Max.apply(-self, axis=axes, keepdims=keepdims)

    def argmax(self, axis=None):
        axis = None if axis is None else normalize_axis("argmax", axis, self.ndim)
        return Tensor(self._values("argmax()").argmax(axis=axis), device=self.device)

    def softmax(self, axis=-1):
        return nn.Softmax.apply(self, axis=axis)

    def log_softmax(self, axis=-1):
        return nn.LogSoftmax.apply(self, axis=axis)

    # -- movement ------------------------------------------------------------
    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return movement.Reshape.apply(self, shape=tuple(shape))

    view = reshape

    def permute(self, *axes):
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        return movement.Permute.apply(self, axes=tuple(axes))

    def transpose(self, dim0=-2, dim1=-1):
        dim0, dim1 = normalize_axis("transpose", dim0, self.ndim), normalize_axis("transpose", dim1, self.ndim)
        axes = list(range(self.ndim))
        if axes:  # a 0-d tensor: transpose(0, -1) is itself, as in PyTorch
            axes[dim0], axes[dim1] = axes[dim1], axes[dim0]
        return movement.Permute.apply(self, axes=tuple(axes))

    def unsqueeze(self, dim):
        """A new axis of size 1 at dim, an axis of the result (-1: last)."""
        dim = normalize_axis("unsqueeze", dim, self.ndim + 1)
        return movement.Reshape.apply(self, shape=self.shape[:dim] + (1,) + self.shape[dim:])

    def squeeze(self, dim=None):
        """Without the axes of size 1 (all of them, or those among dim; others are kept, as in PyTorch)."""
        dims = normalize_axes("squeeze", dim, self.ndim)
        return movement.Reshape.apply(self, shape=tuple(n for i, n in enumerate(self.shape) if n != 1 or i not in dims))

    def expand(self, *shape):
        """A view repeated along axes of size 1 to `shape` (-1 keeps an axis), as in PyTorch."""
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return movement.Expand.apply(self, shape=tuple(shape))

    @property
    def T(self):
        return movement.Permute.apply(self, axes=tuple(reversed(range(self.ndim))))

    def __getitem__(self, index):
        return movement.GetItem.apply(self, index=_raw_index(index, self.device))

    def split(self, split_size_or_sections, dim=0):
        """Views of consecutive pieces along dim, as in PyTorch: pieces of split_size_or_sections
        (the last one smaller if it does not divide), or of each size in a list. One record for all."""
        if self.ndim == 0:
            raise ValueError("split: a 0-d tensor has no axis to split")
        dim = normalize_axis("split", dim, self.ndim)
        n = self.shape[dim]
        if isinstance(split_size_or_sections, int):
            if split_size_or_sections < 1:
                raise ValueError(f"split: split_size must be a positive integer, got {split_size_or_sections}")
            sizes = [min(split_size_or_sections, n - i) for i in range(0, n, split_size_or_sections)] or [0]
        else:
            sizes = [int(s) for s in split_size_or_sections]
        return movement.Split.apply(self, sizes=tuple(sizes), axis=dim)


def _matmul(a, b):
    """NumPy's matmul rules: 1-D operands get a unit dimension, removed after."""
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: both operands need at least 1 dimension, got shapes {a.shape} and {b.shape}")
    out = matmul.MatMul.apply(a.reshape(1, -1) if a.ndim == 1 else a, b.reshape(-1, 1) if b.ndim == 1 else b)
    if a.ndim == 1 and b.ndim == 1:
        return out.reshape(())
    if a.ndim == 1:
        return out.reshape(out.shape[:-2] + out.shape[-1:])  # (..., 1, m) -> (..., m)
    if b.ndim == 1:
        return out.reshape(out.shape[:-1])  # (..., n, 1) -> (..., n)
    return out


def _float(t):
    """t, or t as float32 if it holds integers or bools (bfloat16 is kind 'V', yet a float: it stays)."""
    return t if t.dtype.kind == "c" or autocast.is_float(t.dtype) else t.to(dtype=_FLOAT_DEFAULT)


def _no_bool_subtraction(tensor, other):
    if tensor.dtype.kind == "b" or isinstance(other, (bool, numpy.bool_)):
        raise TypeError("subtraction with a bool is not supported (as in PyTorch and NumPy); "
                        "to invert a mask use ~, to compare two use ^")


def promote_types(dtype, number):
    """The dtype of `tensor op number` for a tensor of `dtype`, by PyTorch's rule.

    Kinds rank bool < integer < float. A number of a kind above the tensor's
    gives that kind's default dtype (int64, float32); else the tensor's dtype
    wins (float16 + 2.5 is float16, int32 + 7 is int32). NumPy scalars count as
    numbers of their kind, as in PyTorch. Arrays (not numbers) take `dtype`.
    """
    dtype = numpy.dtype(dtype)
    if isinstance(number, (bool, numpy.bool_)):
        kind = 0
    elif isinstance(number, (numbers.Integral, numpy.integer)):
        kind = 1
    elif isinstance(number, (numbers.Real, numpy.floating)):
        kind = 2
    else:
        return dtype
    own = 0 if dtype.kind == "b" else 1 if dtype.kind in "iu" else 2
    if kind <= own:
        return dtype
    return numpy.dtype(numpy.int64) if kind == 1 else numpy.dtype(_FLOAT_DEFAULT)


def _raw(x):
    """A Tensor's array, for code that reads its values (see Tensor._values); anything else as it is."""
    return x._values("reading a tensor's values") if isinstance(x, Tensor) else x


def _raw_index(index, device):
    """Tensors inside an index become their (integer) arrays, on `device`."""
    if isinstance(index, tuple):
        return tuple(_raw_index(i, device) for i in index)
    index = _raw(index)
    return backend.to_device(index, device) if isinstance(index, numpy.ndarray) else index


def _no_create_graph(create_graph, where):
    if create_graph:
        raise NotImplementedError(
            f"{where}: create_graph=True (higher-order gradients) is not supported. Backward here is written "
            "over raw arrays, not recorded on a tape, so that every byte saved for it stays visible and "
            "counted; a gradient of a gradient would need backward itself to be recorded, as PyTorch does. "
            "Use PyTorch or JAX for Hessian-vector products and the like.")


def _gradient_for(t, gradient, where):
    """The array of the gradient with respect to t: given, or ones for a one-element output."""
    if gradient is None:
        if t.data.size != 1:
            raise RuntimeError(
                f"{where} on a tensor of shape {t.shape} needs a gradient argument "
                "of the same shape; implicit gradients exist only for scalar outputs "
                "(reduce with .sum() or .mean() first)"
            )
        return backend.array_module(t.data).ones(t.shape, dtype=t.dtype)
    grad = gradient.data if isinstance(gradient, Tensor) else gradient
    if tuple(grad.shape) != t.shape:
        raise ValueError(f"{where}: gradient has shape {tuple(grad.shape)}, expected {t.shape}")
    return grad


def _differentiated(inputs, where):
    """inputs as a list of tensors that require grad (a Tensor alone, or a sequence of them)."""
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    if not inputs:
        raise ValueError(f"{where}: inputs is empty; pass the tensors to differentiate with respect to")
    for i, t in enumerate(inputs):
        if not isinstance(t, Tensor):
            raise TypeError(f"{where}: inputs[{i}] is a {type(t).__name__}, not a Tensor")
        if not t.requires_grad:
            raise RuntimeError(f"{where}: inputs[{i}] (shape {t.shape}) does not require grad; "
                               "one of the differentiated Tensors does not require grad")
    return inputs


# -- constructors --------------------------------------------------------------
def tensor(data, requires_grad=False, dtype=None, device=None):
    """A new leaf tensor holding a copy of `data` (PyTorch's torch.tensor, which always copies).

    Changing `data` afterwards never changes the tensor, nor a gradient that
    used it. `Tensor(array)` and `from_numpy(array)` share the array's memory
    instead, as torch.Tensor and torch.from_numpy do.
    """
    if isinstance(data, Tensor):
        data = data.data
    if backend.is_array(data):
        data = data.copy()
    return Tensor(data, requires_grad=requires_grad, dtype=dtype, device=device)


def from_numpy(array):
    """A CPU tensor that shares `array`'s memory, as torch.from_numpy: no copy.

    Writing into the array changes the tensor and the tensor the array; a
    write into it after a forward that saved it for backward is not seen by
    the version check (it bypasses the tensor), so the gradient would use
    the new values. Use tensor(array) for a copy.
    """
    if not isinstance(array, numpy.ndarray):
        raise TypeError(f"from_numpy: expected a numpy.ndarray, got {type(array).__name__}; "
                        "use tensor(data) for other data")
    return Tensor(array, device="cpu")


def zeros(*shape, dtype=_FLOAT_DEFAULT, device=None, requires_grad=False):
    shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    device = device or backend.get_default_device()
    xp = backend.module_for(device)
    return Tensor(xp.zeros(shape, dtype=dtype), requires_grad=requires_grad, device=device)


def ones(*shape, dtype=_FLOAT_DEFAULT, device=None, requires_grad=False):
    shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    device = device or backend.get_default_device()
    xp = backend.module_for(device)
    return Tensor(xp.ones(shape, dtype=dtype), requires_grad=requires_grad, device=device)


def randn(*shape, rng, dtype=_FLOAT_DEFAULT, device=None, requires_grad=False):
    """Standard normal values from an explicit numpy.random.Generator.

    Values are drawn on the host and copied once to `device`, so the same seed
    gives the same tensor on CPU and GPU.
    """
    if not isinstance(rng, numpy.random.Generator):
        raise TypeError(f"randn needs rng=numpy.random.default_rng(seed), got {type(rng).__name__}")
    shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    host = rng.standard_normal(shape, dtype=numpy.float64).astype(dtype)
    return Tensor(host, requires_grad=requires_grad, device=device)
