"""The meta device: arrays with a shape, a dtype and a layout, and no data.

To know what a training step will hold, run the same code on arrays that
have no data. PyTorch runs its code on such tensors (its "meta" device,
FakeTensor) and JAX on such values (`jax.eval_shape`), but both answer
only what an operation gives back: shapes and dtypes. Neither counts bytes
that way: JAX's answer about memory is the compiler's, the memory analysis
of the compiled computation (`jax.jit(f).lower(*args).compile()
.memory_analysis()`, jax/_src/stages.py). Here the engine runs eagerly, one
op after another, so the count of its arrays as they come and go is the
step's memory: the meta device is a third array module beside NumPy and
CuPy that also counts, plugged in through the backend's seam as the strict
CuPy stand-in is:

    >>> from tinygrad_ckpt import Tensor, meta, nn
    >>> layer = nn.Linear(256, 256, device="meta")    # parameters with no values: nothing drawn
    >>> with meta.counting() as count:                # counts the meta arrays made inside
    ...     x = Tensor(meta.empty((4, 256), "float32"))
    ...     layer(x).sum().backward()
    >>> count.live                    # x 4*256*4 + weight.grad 256*256*4 + bias.grad 256*4 bytes
    267264
    >>> layer.weight.grad.data.sum().item()           # a question about values is refused
    Traceback (most recent call last):
    tinygrad_ckpt.backend.NeedsValues: .item(): a meta tensor has no values; ...

`count.peak` is the highest live bytes; fit's `estimate_step` runs a
whole Trainer step this way.

Every array the engine makes passes through this module (an op's scratch
arrays too: the `tmp` in `tmp = a * b; return tmp + c`), so its count of
live bytes is the device's, by construction. memory.py counts meta arrays
by category exactly as it counts real ones.

What an array is here: shape, dtype, strides and, for a view, the array
that owns its memory (`base`), following NumPy's rules, because a view
costs nothing and a copy costs its bytes:

  * a slice, a transpose, `[..., None]` and `broadcast_to` are views;
  * a reshape is a view where NumPy can do it without copying (asked of
    NumPy itself, on a stand-in array with the same strides and no data),
    else a copy: heads merged back after a transpose copy unless T, nh
    or hs is 1;
  * every other result is new memory, laid out as NumPy lays it out
    (elementwise results follow their inputs' order, as NumPy's "K" order).

dtypes follow NumPy's promotion: each elementwise function asks NumPy's
ufunc which dtype it would return (`ufunc.resolve_dtypes`).

What needs values cannot run here, and says so (`NeedsValues`, as
PyTorch's meta tensors refuse `.item()`): float(), bool(), int(), .item(),
.tolist(), indexing with a boolean mask, and a copy to the host (`get()`,
backend.to_host, Tensor.numpy(), .to("cpu")). No value is ever made up: a
zero read back would be a wrong answer that flows into the next one (a
branch taken, a step skipped). Code that runs a whole training step here
asks backend.holds_values instead of reading: the Trainer logs no loss,
the loss scaler finds no overflow (there are no values to overflow, so the
step is taken, as a finite step is), and clipping computes the norm's
arrays and scales nothing (scaling in place allocates nothing either way).
Random draws make nothing to draw from: on the meta device `random`
functions of the engine return arrays without values.

Every op checks its operands' shapes as NumPy would (broadcasting,
matmul's inner axes, concatenation, reshape): a step that could not run on
the CPU cannot be sized here (tests/test_meta_shapes.py draws op calls and
runs them on both devices). What only values decide (an integer index out
of range, a mask's count of True) is not checked.

`like` says which device the meta device stands in for: "cuda" (the
default: a GPU, where a host array brought over is a copy, and CuPy's
einsum and batched matmul may copy their operands, counted here as a
bound) or "cpu" (NumPy: some ops work in pieces, and a host array brought
over is the device's own, counted from then on for as long as it lives).

What does not live here: the accounting by category (memory.py), the
questions asked of a step (fit/).
"""

import builtins
import math
import numbers
import sys
import weakref
import array as _array
from collections import namedtuple
from contextlib import contextmanager

import numpy
from numpy.lib.stride_tricks import as_strided

from . import backend

dtype = numpy.dtype
bool_, int8, int32, int64, uint8 = numpy.bool_, numpy.int8, numpy.int32, numpy.int64, numpy.uint8
float16, float32, float64 = numpy.float16, numpy.float32, numpy.float64
newaxis, pi, e, inf, nan = None, numpy.pi, numpy.e, numpy.inf, numpy.nan

like = "cuda"  # the device the meta device stands in for: "cuda" or "cpu" (see the module docstring)


NeedsValues = backend.NeedsValues  # a question about values, asked of an array that has none


def _needs_values(what, array=None):
    if array is not None:
        return backend.no_values(what, array)
    return NeedsValues(f"{what}: a meta tensor has no values (it has a shape and a dtype). Code run on "
                       "device='meta' sizes a step: it may not read or branch on values.")


# -- the count of live bytes -------------------------------------------------------
class Count:
    """Live bytes of meta arrays, their highest point, and (if asked) the live bytes after every allocation."""

    def __init__(self, points=False):
        self.live = 0  # bytes
        self.peak = 0
        self.points = _array.array("q") if points else None

    def reset_peak(self):
        """The peak, and the points (if kept), start again from the live bytes now."""
        self.peak = self.live
        if self.points is not None:
            self.points = _array.array("q", [self.live])

    def adopt(self, array):
        """Count `array`, made before this count began, as live in it from now on and as freed from it when it
        is freed (ZeRO's flat arrays replace a model's parameters: fit/sharded.py)."""
        if array.base is None and array._count is not self:
            array._count = self
            self.live += array.nbytes
            self.peak = builtins.max(self.peak, self.live)


count = Count()


@contextmanager
def counting(points=False, stands_in_for=None):
    """A fresh Count for the meta arrays made inside (arrays made before are not in it).

    points: keep the live bytes after every allocation (Count.points).
    stands_in_for: "cuda" or "cpu" for the meta device inside (see `like`).
    """
    global count, like
    previous = count, like
    count = Count(points)
    like = stands_in_for or like
    try:
        yield count
    finally:
        count, like = previous


# -- the array -------------------------------------------------------------------------
def _contiguous(shape, dtype):
    """The bytes and the strides of a new (C-contiguous) array; asked again and again, so kept."""
    key = (shape, dtype)
    answer = _CONTIGUOUS.get(key)
    if answer is None:
        strides, step = [], dtype.itemsize
        for n in reversed(shape):
            strides.append(step)
            step *= builtins.max(n, 1)
        answer = _CONTIGUOUS[key] = math.prod(shape) * dtype.itemsize, tuple(reversed(strides))
    return answer


_CONTIGUOUS = {}
_VIEWS = {}  # (shape, strides, dtype, the view asked) -> the view's (shape, strides), None: a copy (ndarray._view)


class ndarray(backend.ReadsRefused):
    """A shape, a dtype, strides and, for a view, the array owning the memory (`base`). No data."""

    __slots__ = ("shape", "dtype", "strides", "base", "offset", "nbytes", "contiguous", "_count", "__weakref__")
    __array_ufunc__ = None  # NumPy's operators defer to ours
    __hash__ = None

    def __init__(self, shape, dtype, strides=None, base=None, offset=0):
        shape = self.shape = shape if type(shape) is tuple else tuple(int(n) for n in shape)
        dtype = self.dtype = dtype if isinstance(dtype, numpy.dtype) else numpy.dtype(dtype)
        nbytes, contiguous = _contiguous(shape, dtype)
        self.nbytes = nbytes
        if strides is None:
            self.strides, self.contiguous = contiguous, True
        else:
            self.strides = strides = tuple(strides)
            self.contiguous = strides == contiguous or all(
                s == c or n == 1 for s, c, n in zip(strides, contiguous, shape))
        self.base = base
        self.offset = offset  # a view's first byte, counted from its base's (backend.address)
        if base is None:  # new memory: counted until the array is freed
            self._count = count
            count.live += nbytes
            if count.live > count.peak:
                count.peak = count.live
            if count.points is not None:
                count.points.append(count.live)
        else:
            self._count = None

    def __del__(self):
        if self._count is not None:
            self._count.live -= self.nbytes

    # -- what it is ------------------------------------------------------------
    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: math.prod(self.shape))
    itemsize = property(lambda self: self.dtype.itemsize)
    T = property(lambda self: self.transpose())

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __repr__(self):
        return f"meta.ndarray(shape={self.shape}, dtype={self.dtype})"

    # -- values: none (bool(), float(), int(), .item(), .tolist(): backend.ReadsRefused) ----
    def refusal(self, what):
        return _needs_values(what, self)

    def __array__(self, *args, **kwargs):
        raise _needs_values("numpy.asarray()", self)

    def __array_function__(self, func, types, args, kwargs):
        raise TypeError(f"numpy.{func.__name__} was applied to a meta array: use the array module of the "
                        f"inputs, xp = backend.array_module(array); xp.{func.__name__}(...)")

    def get(self, stream=None):
        """The explicit copy to the host (CuPy's name): there are no values to copy."""
        raise _needs_values("a copy to the host (.get())", self)

    # -- views, as NumPy makes them ----------------------------------------------
    def _layout(self):
        """A NumPy array with this array's shape and strides over one element: views and
        reshapes may be asked of it (they never read), nothing else."""
        return as_strided(numpy.zeros(1, self.dtype), self.shape, self.strides, writeable=False)

    def _view(self, asked, ask):
        """The view NumPy makes: ask(a NumPy array of this layout, _layout). A step asks the same few views
        again and again, so each answer is kept by layout and question (`asked`, hashable); None, kept too,
        where NumPy would copy (a reshape it cannot make a view of raises ValueError). The layout's answer
        gives the view's offset in bytes too, as where its first element moved to."""
        key = (self.shape, self.strides, self.dtype, asked)
        layout = _VIEWS.get(key, _VIEWS)
        if layout is _VIEWS:
            try:
                layout = self._layout()
                view = ask(layout)
                moved = view.__array_interface__["data"][0] - layout.__array_interface__["data"][0]
                layout = _VIEWS[key] = (view.shape, view.strides, moved)
            except ValueError:
                if asked[0] != "reshape":
                    raise
                layout = _VIEWS[key] = None
        if layout is None:
            return None
        return ndarray(layout[0], self.dtype, layout[1], self.base if self.base is not None else self,
                       self.offset + layout[2])

    def reshape(self, *shape, order="C"):
        shape = shape[0] if len(shape) == 1 and not isinstance(shape[0], numbers.Integral) else shape
        shape = _resolve_shape(tuple(int(n) for n in shape), self.size)
        view = self._view(("reshape", shape, order), lambda a: a.reshape(shape, order=order, copy=False))
        return ndarray(shape, self.dtype) if view is None else view  # None: NumPy would copy

    def transpose(self, *axes):
        if len(axes) == 1 and not isinstance(axes[0], numbers.Integral):
            axes = axes[0]
        axes = None if axes is None or len(axes) == 0 else tuple(axes)
        return self._view(("transpose", axes), lambda a: a.transpose(axes))

    def swapaxes(self, axis1, axis2):
        return self._view(("swapaxes", axis1, axis2), lambda a: a.swapaxes(axis1, axis2))

    def squeeze(self, axis=None):
        return self._view(("squeeze", axis), lambda a: a.squeeze(axis))

    def __getitem__(self, index):
        if _is_basic(index):  # ints, slices, None, Ellipsis: its repr names it (slices are not hashable)
            return self._view(("getitem", repr(index)), lambda a: a[index])
        return ndarray(_advanced_shape(self.shape, index), self.dtype)

    def __setitem__(self, index, value):
        target = self[index].shape if _is_basic(index) else _advanced_shape(self.shape, index)
        _check_fits(value, target, self.dtype, "assigning into a meta array")

    # -- copies ----------------------------------------------------------------
    def copy(self, order="C"):
        return ndarray(self.shape, self.dtype)

    def astype(self, dtype, copy=True):
        if not copy and self.dtype == numpy.dtype(dtype):
            return self
        return ndarray(self.shape, dtype, _keep_order([self], self.shape, numpy.dtype(dtype).itemsize))

    def fill(self, value):
        pass

    # -- reductions ------------------------------------------------------------------
    def sum(self, axis=None, dtype=None, out=None, keepdims=False):
        return _reduce(self, "sum", axis, dtype, out, keepdims)

    def mean(self, axis=None, dtype=None, out=None, keepdims=False):
        return _reduce(self, "mean", axis, dtype, out, keepdims)

    def max(self, axis=None, out=None, keepdims=False):
        return _reduce(self, "max", axis, None, out, keepdims)

    def min(self, axis=None, out=None, keepdims=False):
        return _reduce(self, "min", axis, None, out, keepdims)

    def argmax(self, axis=None, out=None):
        return _reduce(self, "argmax", axis, None, out, False)

    def any(self, axis=None, out=None, keepdims=False):
        return _reduce(self, "any", axis, None, out, keepdims)

    def all(self, axis=None, out=None, keepdims=False):
        return _reduce(self, "all", axis, None, out, keepdims)

    # -- operators: NumPy's ufuncs on shapes and dtypes ---------------------------
    def __neg__(self):
        return _ufunc(numpy.negative, self)

    def __pos__(self):
        return _ufunc(numpy.positive, self)

    def __abs__(self):
        return _ufunc(numpy.absolute, self)

    def __invert__(self):
        return _ufunc(numpy.invert, self)

    def __matmul__(self, other):
        return matmul(self, other)

    def __rmatmul__(self, other):
        return matmul(other, self)


def _binary(ufunc, reflected=False):
    def method(self, other):
        if not _is_operand(other):
            return NotImplemented  # e.g. a Tensor: let its reflected operator run
        return _ufunc(ufunc, other, self) if reflected else _ufunc(ufunc, self, other)

    return method


def _inplace(ufunc):
    def method(self, other):
        if not _is_operand(other):
            return NotImplemented
        _ufunc(ufunc, self, other, out=self)
        return self

    return method


for _name, _uf in (("add", numpy.add), ("sub", numpy.subtract), ("mul", numpy.multiply),
                   ("truediv", numpy.true_divide), ("floordiv", numpy.floor_divide), ("mod", numpy.remainder),
                   ("pow", numpy.power), ("and", numpy.bitwise_and), ("or", numpy.bitwise_or),
                   ("xor", numpy.bitwise_xor)):
    setattr(ndarray, f"__{_name}__", _binary(_uf))
    setattr(ndarray, f"__r{_name}__", _binary(_uf, reflected=True))
    setattr(ndarray, f"__i{_name}__", _inplace(_uf))
for _name, _uf in (("eq", numpy.equal), ("ne", numpy.not_equal), ("lt", numpy.less), ("le", numpy.less_equal),
                   ("gt", numpy.greater), ("ge", numpy.greater_equal)):
    setattr(ndarray, f"__{_name}__", _binary(_uf))


# -- the rules: shapes, dtypes, layouts ------------------------------------------------
def _is_operand(x):
    return isinstance(x, (ndarray, numbers.Number, numpy.generic))


def _operand_dtype(x):
    """What NumPy's promotion sees: an array's dtype, a NumPy scalar's, or a Python number's type (weak)."""
    if type(x) is float or type(x) is int:  # the common case, before the slower isinstance checks
        return type(x)
    if isinstance(x, ndarray):
        return x.dtype
    if isinstance(x, numpy.generic):
        return x.dtype
    if isinstance(x, bool):
        return numpy.dtype(bool)
    if isinstance(x, numbers.Number):
        return type(x) if type(x) in (int, float, complex) else numpy.asarray(x).dtype
    if isinstance(x, numpy.ndarray):
        raise TypeError("a NumPy (host) array was mixed with a meta array: copy it over first, "
                        "backend.to_device(array, 'meta')")
    raise TypeError(f"a meta array cannot be combined with {type(x).__name__}")


def _shape(x):
    return x.shape if isinstance(x, ndarray) else ()


# (ufunc, each input's (shape, dtype), or a scalar's dtype) -> the result's shape and dtype, asked of NumPy
# once: a step runs the same few thousand calls again and again.
_UFUNCS = {}


def _ufunc(ufunc, *inputs, out=None):
    """Run `ufunc` on shapes: NumPy's broadcasting, NumPy's dtype, a new array in NumPy's order (or `out`)."""
    key = (ufunc,) + tuple((x.shape, x.dtype) if type(x) is ndarray else _operand_dtype(x) for x in inputs)
    answer = _UFUNCS.get(key)
    if answer is None:
        shape = _broadcast(*map(_shape, inputs))
        dtypes = tuple(x[1] if type(x) is tuple else x for x in key[1:])
        answer = _UFUNCS[key] = shape, ufunc.resolve_dtypes(dtypes + (None,))[-1]
    shape, result = answer
    if out is not None:
        if type(out) is not ndarray:
            raise TypeError("out= must be a meta array")
        _check_fits(shape, out.shape, out.dtype, f"numpy.{ufunc.__name__}(..., out=)", result)
        return out
    arrays = [x for x in inputs if type(x) is ndarray]
    return ndarray(shape, result, _keep_order(arrays, shape, result.itemsize))


def _broadcast(*shapes):
    try:
        return numpy.broadcast_shapes(*shapes)
    except ValueError:
        raise ValueError(f"operands could not be broadcast together with shapes {' '.join(map(str, shapes))}") from None


_FITS = set()  # (shape, target shape, target dtype, value dtype) that _check_fits has let through


def _check_fits(value, target, target_dtype, what, value_dtype=None):
    """value (an array, a number, or a shape) broadcasts to `target` and casts to its dtype as NumPy allows."""
    shape = value if isinstance(value, tuple) else _shape(value)
    source = value_dtype if value_dtype is not None else (
        value.dtype if isinstance(value, (ndarray, numpy.generic)) else None)
    key = (shape, tuple(target), target_dtype, source)
    if key in _FITS:
        return
    if shape != target and _broadcast(shape, target) != tuple(target):
        raise ValueError(f"{what}: shape {shape} does not broadcast to {tuple(target)}")
    if source is not None and not numpy.can_cast(source, target_dtype, "same_kind"):
        raise TypeError(f"{what}: cannot cast {source} to {target_dtype} (NumPy's same_kind rule)")
    _FITS.add(key)


def _keep_order(arrays, shape, itemsize):
    """The strides NumPy gives a new array of `shape` made from `arrays` (its "K" order: the inputs' axis order).

    NumPy's iterator sorts the axes by the inputs' strides. Asked of NumPy itself,
    on stand-ins of at most two elements per axis with the inputs' strides.
    """
    if len(shape) < 2 or all(a.contiguous for a in arrays if a.shape == shape):
        return None  # C order, the common case
    key = (shape, itemsize) + tuple((a.shape, a.strides, a.dtype) for a in arrays)
    if key not in _ORDERS:
        _ORDERS[key] = _asked_order(arrays, shape, itemsize)
    return _ORDERS[key]


_ORDERS = {}  # (shape, itemsize, each input's layout) -> _keep_order's strides, asked of NumPy once


def _asked_order(arrays, shape, itemsize):
    small = tuple(min(n, 2) for n in shape)
    stand_ins = []
    for a in arrays:
        lead = len(shape) - a.ndim
        sub = tuple(1 if a.shape[i] == 1 else small[lead + i] for i in range(a.ndim))
        stand_ins.append(as_strided(numpy.zeros(1, a.dtype), sub, a.strides, writeable=False))
    it = numpy.nditer(stand_ins + [None], flags=["zerosize_ok", "refs_ok"], order="K",
                      op_flags=[["readonly"]] * len(stand_ins) + [["writeonly", "allocate"]],
                      op_dtypes=[a.dtype for a in stand_ins] + [numpy.dtype(numpy.uint8)])
    order = sorted(range(len(shape)), key=lambda i: -it.operands[-1].strides[i])
    strides, step = [0] * len(shape), itemsize
    for i in reversed(order):
        strides[i] = step
        step *= builtins.max(shape[i], 1)
    return tuple(strides)


def _resolve_shape(shape, size):
    """NumPy's reshape target: one -1 filled in; an error, in NumPy's words, if the sizes differ."""
    known = math.prod(n for n in shape if n != -1)
    if shape.count(-1) == 1 and known and size % known == 0:
        shape = tuple(size // known if n == -1 else n for n in shape)
    if math.prod(shape) != size or -1 in shape:
        raise ValueError(f"cannot reshape array of size {size} into shape {shape}")
    return shape


def _is_basic(index):
    """An index of ints, slices, None and Ellipsis only: NumPy returns a view."""
    items = index if isinstance(index, tuple) else (index,)
    return all(isinstance(i, (numbers.Integral, slice)) or i is None or i is Ellipsis for i in items)


def _advanced_shape(shape, index):
    """The shape of x[index] with integer index arrays: the broadcast index shape and x's remaining axes
    where all of the index is arrays (an embedding's lookup, a row's pick), else asked of NumPy on
    stand-ins that read one element."""
    items = index if isinstance(index, tuple) else (index,)
    if all(isinstance(i, ndarray) and i.dtype.kind in "iu" for i in items) and len(items) <= len(shape):
        return _broadcast(*(i.shape for i in items)) + tuple(shape[len(items):])
    stand_ins = []
    for i in items:
        if isinstance(i, ndarray):
            if i.dtype == numpy.bool_:
                raise _needs_values("indexing with a boolean mask (the result's size is the count of True)")
            i = numpy.broadcast_to(numpy.zeros((), i.dtype), i.shape)
        elif isinstance(i, (numpy.ndarray, list)):
            raise TypeError("a host index was used on a meta array: copy it over first, "
                            "backend.to_device(index, 'meta')")
        stand_ins.append(i)
    x = numpy.broadcast_to(numpy.zeros((), numpy.uint8), shape)
    return x[tuple(stand_ins)].shape


_REDUCED = {}  # (name, dtype, dtype=) -> the result's dtype, asked of NumPy once


def _reduced_dtype(name, source, requested):
    key = (name, source, requested)
    if key not in _REDUCED:
        tiny = numpy.zeros(1, source)
        kwargs = {"dtype": requested} if requested is not None else {}
        _REDUCED[key] = numpy.asarray(getattr(tiny, name)(**kwargs)).dtype
    return _REDUCED[key]


def _reduce(a, name, axis, dtype, out, keepdims):
    """A reduction's result (a new array in NumPy's order, or `out`): asked once per layout and arguments."""
    key = (a.shape, a.strides, a.dtype, name, axis, dtype, keepdims)
    if out is None and key in _REDUCTIONS:
        return ndarray(*_REDUCTIONS[key])
    result = _reduced(a, name, axis, dtype, out, keepdims)
    if out is None:
        _REDUCTIONS[key] = (result.shape, result.dtype, result.strides)
    return result


_REDUCTIONS = {}  # (layout, name, axis, dtype=, keepdims) -> the result's shape, dtype and strides


def _reduced(a, name, axis, dtype, out, keepdims):
    if a.ndim == 0 and isinstance(axis, numbers.Integral) and axis in (0, -1):
        axis = None  # NumPy reduces a 0-d array over axis 0 or -1 (not over a tuple of them)
    axes = range(a.ndim) if axis is None else (axis if isinstance(axis, tuple) else (axis,))
    listed = [_axis(i, a.ndim) for i in axes]
    axes = set(listed)
    if len(axes) != len(listed):
        raise ValueError("duplicate value in 'axis'")
    if name in ("max", "min", "argmax") and any(a.shape[i] == 0 for i in axes if i < a.ndim):  # no identity
        raise ValueError(f"attempt to get {name} of an empty sequence" if name == "argmax" else
                         f"zero-size array to reduction operation {dict(max='maximum', min='minimum')[name]} "
                         "which has no identity")
    shape = tuple(1 if i in axes else n for i, n in enumerate(a.shape) if keepdims or i not in axes)
    result = _reduced_dtype(name, a.dtype, dtype)
    if out is not None:
        _check_fits(shape, out.shape, out.dtype, f"{name}(..., out=)", result)
        return out
    kept = [i for i in range(a.ndim) if keepdims or i not in axes]
    source = _Layout(shape, tuple(0 if i in axes else a.strides[i] for i in kept), a.dtype)  # for NumPy's "K" order
    return ndarray(shape, result, _keep_order([source], shape, result.itemsize) if shape else None)


class _Layout(namedtuple("_Layout", "shape strides dtype")):
    """A shape, strides and dtype that are no array (nothing is counted): what _keep_order reads."""

    ndim = property(lambda self: len(self.shape))
    itemsize = property(lambda self: self.dtype.itemsize)
    contiguous = property(lambda self: all(s == c or n == 1 for s, c, n in zip(
        self.strides, _contiguous(self.shape, self.dtype)[1], self.shape)))


def _axis(i, ndim):
    if not -ndim <= i < ndim:
        raise numpy.exceptions.AxisError(i, ndim)
    return i % ndim


# -- creation ----------------------------------------------------------------------------
def _tuple(shape):
    return (int(shape),) if isinstance(shape, numbers.Integral) else tuple(int(n) for n in shape)


def empty(shape, dtype=float):
    return ndarray(_tuple(shape), dtype)


zeros = ones = empty


def full(shape, fill_value, dtype=None):
    return ndarray(_tuple(shape), dtype if dtype is not None else numpy.asarray(fill_value).dtype)


def empty_like(a, dtype=None):
    return ndarray(a.shape, a.dtype if dtype is None else dtype)


zeros_like = empty_like


def arange(start, stop=None, step=1, dtype=None):
    start, stop = (0, start) if stop is None else (start, stop)
    n = builtins.max(0, math.ceil((stop - start) / step))
    return ndarray((n,), dtype if dtype is not None else numpy.result_type(start, stop, step))


def triu(m, k=0):
    return ndarray(m.shape, m.dtype)


_stand_ins = {}  # id(host array) -> its meta array, while the host array lives (standing in for the CPU)


def asarray(a, dtype=None):
    """`a` on the meta device: a meta array as it is; host data as an array of its shape, no values kept.

    Standing in for a GPU, that is a copy, new memory. Standing in for the CPU,
    where a NumPy array is already on the device, it is the host array's
    stand-in: the same one each time, alive as long as the host array is.
    """
    if isinstance(a, ndarray):
        return a if dtype is None else a.astype(dtype, copy=False)
    host = numpy.asarray(a, dtype=dtype)
    if like == "cpu" and host is a:
        if id(a) not in _stand_ins:
            _stand_ins[id(a)] = ndarray(a.shape, a.dtype)
            weakref.finalize(a, _stand_ins.pop, id(a), None)
        return _stand_ins[id(a)]
    return ndarray(host.shape, host.dtype)


def has_stand_in(host):
    """True if the host array has been brought to the meta device standing in for the CPU (it is counted there)."""
    return id(host) in _stand_ins


# -- elementwise -------------------------------------------------------------------------
def _one_input(ufunc):
    def function(x, out=None):
        return _ufunc(ufunc, x, out=out)

    function.__name__ = ufunc.__name__
    return function


def _two_inputs(ufunc):
    def function(a, b, out=None):
        return _ufunc(ufunc, a, b, out=out)

    function.__name__ = ufunc.__name__
    return function


exp, log, log1p, tanh, sqrt, sign = map(_one_input, (numpy.exp, numpy.log, numpy.log1p, numpy.tanh, numpy.sqrt,
                                                     numpy.sign))
abs, isfinite, isnan = map(_one_input, (numpy.absolute, numpy.isfinite, numpy.isnan))  # noqa: A001
maximum = _two_inputs(numpy.maximum)


def where(condition, a, b):
    shape = numpy.broadcast_shapes(_shape(condition), _shape(a), _shape(b))
    result = numpy.result_type(*(numpy.dtype(_operand_dtype(x)) if isinstance(x, ndarray) else x for x in (a, b)))
    return ndarray(shape, result, _keep_order([x for x in (condition, a, b) if isinstance(x, ndarray)], shape,
                                              result.itemsize))


def copyto(dst, src, casting="same_kind", where=True):
    _check_fits(src, dst.shape, dst.dtype, "copyto")


class _Add:
    """add(a, b), and add.at(target, index, values): in place, nothing new."""

    def __call__(self, a, b, out=None):
        return _ufunc(numpy.add, a, b, out=out)

    def at(self, target, index, values):
        pass


add = _Add()


# -- products ----------------------------------------------------------------------------
def _cuda_copies(arrays):
    """CuPy's einsum and batched matmul may copy operands that are not C-contiguous: counted as scratch
    (a bound) when the meta device stands in for a GPU. The copies go when the call returns."""
    return [ndarray(a.shape, a.dtype) for a in arrays if like == "cuda" and not a.contiguous]


def matmul(a, b, out=None):
    key = ("matmul", a.shape, a.dtype, b.shape, b.dtype)
    if key not in _PRODUCTS:
        _PRODUCTS[key] = _matmul(a, b)
    copies = _cuda_copies([a, b])  # noqa: F841 (alive until the product is made)
    if out is not None:
        return out
    return ndarray(*_PRODUCTS[key])


_PRODUCTS = {}  # ("matmul" or einsum's subscripts, each operand's shape and dtype) -> the result's shape and dtype


def _matmul(a, b):
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("matmul: Input operand does not have enough dimensions")
    m = a.shape[-2:-1] if a.ndim > 1 else ()
    n = b.shape[-1:] if b.ndim > 1 else ()
    k_a, k_b = a.shape[-1], (b.shape[-2] if b.ndim > 1 else b.shape[0])
    if k_a != k_b:
        raise ValueError(f"matmul: mismatch in its core dimension ({k_a} is not {k_b}), shapes {a.shape} and {b.shape}")
    batch = numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return batch + m + n, numpy.matmul.resolve_dtypes((a.dtype, b.dtype, None))[-1]


def vdot(a, b):
    if a.size != b.size:
        raise ValueError("vectors have different lengths")
    return ndarray((), numpy.result_type(a.dtype, b.dtype))


def einsum(subscripts, *operands):
    """numpy.einsum with explicit output ("...i,...i->..."): the output's shape from the letters."""
    key = (subscripts,) + tuple((o.shape, o.dtype) for o in operands)
    if key not in _PRODUCTS:
        _PRODUCTS[key] = _einsum(subscripts, operands)
    copies = _cuda_copies(operands)  # noqa: F841
    products = ndarray(numpy.broadcast_shapes(*(o.shape for o in operands)), operands[0].dtype) \
        if like == "cuda" and len(operands) > 1 and operands[0].ndim == operands[1].ndim else None  # noqa: F841
    return ndarray(*_PRODUCTS[key])


def _einsum(subscripts, operands):
    if "->" not in subscripts:
        raise NotImplementedError("meta.einsum needs an explicit output ('ij,jk->ik')")
    inputs, output = subscripts.replace(" ", "").split("->")
    sizes, ellipsis = {}, []
    if len(inputs.split(",")) != len(operands):
        raise ValueError("einsum: the subscripts name another number of operands than given")
    for i, (letters, a) in enumerate(zip(inputs.split(","), operands)):
        dims = list(a.shape)
        if "..." in letters:
            before, after = letters.split("...")
            if len(before) + len(after) > len(dims):
                raise ValueError(f"einstein sum subscripts string contains too many subscripts for operand {i}")
            ellipsis.append(tuple(dims[len(before):len(dims) - len(after)]))
            letters, dims = before + after, dims[:len(before)] + dims[len(dims) - len(after):]
        elif len(letters) != len(dims):
            raise ValueError(f"einsum: operand {i} has {len(dims)} dimensions and its subscripts {letters!r} "
                             f"name {len(letters)}")
        for letter, n in zip(letters, dims):
            if sizes.get(letter, n) != n and 1 not in (n, sizes[letter]):
                raise ValueError(f"einsum: operands could not be broadcast together on {letter!r}")
            sizes[letter] = builtins.max(n, sizes.get(letter, n))
    broadcast = numpy.broadcast_shapes(*ellipsis) if ellipsis else ()
    shape = []
    for part in output.split("..."):
        shape.append(tuple(sizes[letter] for letter in part))
    shape = shape[0] + broadcast + shape[1] if "..." in output else shape[0]
    return shape, numpy.result_type(*(o.dtype for o in operands))


# -- shapes -------------------------------------------------------------------------------
def broadcast_to(a, shape):
    shape = _tuple(shape)
    return a._view(("broadcast_to", shape), lambda layout: numpy.broadcast_to(layout, shape))


def concatenate(arrays, axis=0):
    """NumPy's checks, in its words: one or more arrays, the same number of axes, the same sizes off `axis`."""
    if not arrays:
        raise ValueError("need at least one array to concatenate")
    shape = list(arrays[0].shape)
    if not shape:
        raise ValueError("zero-dimensional arrays cannot be concatenated")
    axis = _axis(axis, len(shape))
    for i, a in enumerate(arrays):
        if a.ndim != len(shape):
            raise ValueError(f"all the input arrays must have same number of dimensions, but the array at index 0 "
                             f"has {len(shape)} dimension(s) and the array at index {i} has {a.ndim} dimension(s)")
        for d, (n, m) in enumerate(zip(shape, a.shape)):
            if d != axis and n != m:
                raise ValueError(f"all the input array dimensions except for the concatenation axis must match "
                                 f"exactly, but along dimension {d}, the array at index 0 has size {n} and the "
                                 f"array at index {i} has size {m}")
    shape[axis] = builtins.sum(a.shape[axis] for a in arrays)
    return ndarray(shape, numpy.result_type(*(a.dtype for a in arrays)))


def stack(arrays, axis=0):
    if not arrays:
        raise ValueError("need at least one array to stack")
    if len({a.shape for a in arrays}) > 1:
        raise ValueError("all input arrays must have the same shape")
    shape = list(arrays[0].shape)
    shape.insert(_axis(axis, len(shape) + 1), len(arrays))
    return ndarray(shape, numpy.result_type(*(a.dtype for a in arrays)))


class _StrideTricks:
    """numpy.lib.stride_tricks, as far as the engine uses it (a convolution's windows)."""

    @staticmethod
    def as_strided(x, shape=None, strides=None, writeable=True):
        """A view of x with these shape and strides, as NumPy makes it (on a stand-in: nothing is read)."""
        shape, strides = (None if v is None else tuple(v) for v in (shape, strides))
        return x._view(("as_strided", shape, strides), lambda a: as_strided(a, shape, strides, writeable=False))


class lib:  # noqa: N801 (numpy.lib's name)
    stride_tricks = _StrideTricks


backend.set_device_module("meta", sys.modules[__name__])
