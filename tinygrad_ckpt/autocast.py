"""Autocast: inside `with autocast("bfloat16"):` each op runs in the dtype its policy gives.

    >>> import numpy
    >>> from tinygrad_ckpt import Tensor, nn
    >>> import tinygrad_ckpt.functional as F
    >>> layer = nn.Linear(4, 3, rng=numpy.random.default_rng(0))   # float32 weights
    >>> with autocast("float16"):             # or "bfloat16" (the bf16 extra: ml_dtypes)
    ...     logits = layer(Tensor(numpy.ones((2, 4), dtype=numpy.float32)))
    ...     loss = F.cross_entropy(logits, Tensor(numpy.array([0, 2])), reduction="sum")
    >>> logits.dtype, loss.dtype              # Linear in float16, the loss in float32
    (dtype('float16'), dtype('float32'))
    >>> loss.backward()                       # outside: backward follows the forward's dtypes by itself
    >>> layer.weight.grad.dtype               # a float32 parameter gets a float32 gradient
    dtype('float32')

Mixed precision's forward, as PyTorch's `torch.autocast`. The parameters
stay float32 (the "master weights"); an op that should run in 16 bits gets
16-bit copies of its floating inputs first. Those copies are made by the
ordinary `Cast` op (ops/elementwise.py), run from the one place every op
runs, `Function.apply`: so each cast is a record on the tape like any other,
its output is what the op saves (counted by memory.py, shown in timelines),
and its backward casts the gradient back, so a float32 parameter gets a
float32 gradient.

The policy, by op class name (PyTorch 2.13, aten/src/ATen/autocast_mode.h,
the lists AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32,
AT_FORALL_FP32_SET_OPT_DTYPE and AT_FORALL_PROMOTE):

  LOWER     the matrix products (PyTorch: matmul, linear, bmm, addmm, ...):
            in the 16-bit dtype, where the speed is.
  FLOAT32   layer norm, the loss, exp, log and pow (PyTorch's FP32 list:
            layer_norm, nll_loss, exp, log, pow), softmax, log-softmax and
            the sum (its FP32_SET_OPT_DTYPE list: softmax, log_softmax, sum;
            cross-entropy is log_softmax then nll_loss there): in float32,
            where 16 bits lose too much (a sum of many terms, an
            exponential's range).
  WIDEST    ops with several floating inputs (add, mul, where, cat, ...):
            all in the widest of their dtypes. PyTorch needs no list for
            most of these (its binary ops promote by themselves; its
            AT_FORALL_PROMOTE list is for those that would not); this
            engine's ops refuse mixed dtypes (function.py), so autocast
            promotes for them: a float32 residual plus a bfloat16 attention
            output is a float32 sum.
  (others)  run in the dtype their input has (GELU, reshape, dropout, max).

These are the lists of the header PyTorch's CUDA autocast uses; this
project applies them on every device.

Where this project differs from PyTorch, and why:
  * Mean is in FLOAT32 (PyTorch lists only sum). ml_dtypes' bfloat16 adds
    in bfloat16: 10,000 bfloat16 ones sum to 256, and their mean is 0.0256
    (measured, ml_dtypes 0.7, NumPy 2.4). NumPy's float16 depends on the
    layout: down a strided axis it adds in float16 (10,000 ones sum to
    2048), along a contiguous one its pairwise sum accumulates in float32,
    and its mean of float16 always does. PyTorch's kernels add in float32
    inside. (tests/test_claims.py checks each of these.)
  * Casts are not cached. PyTorch casts each float32 weight once per autocast
    region and reuses the copy; here a weight used twice is cast twice (two
    records, two copies saved). Simpler, and the copies are plainly seen.
  * Only float32 and 16-bit inputs are cast; float64 stays as it is, as
    PyTorch leaves double tensors alone under autocast.

Which 16-bit dtype: float16 runs everywhere but has a small range (largest
65504), so its gradients need loss scaling (grad_scaler.py). bfloat16 has
float32's exponent range (largest about 3.4e38) with 8 bits of precision:
no scaler needed. NumPy has no bfloat16: it comes from `ml_dtypes` (the
`bf16` extra), imported only when asked for. On the GPU, CuPy runs float16
natively; bfloat16 needs a CuPy that takes ml_dtypes' bfloat16 (cupy/cupy
pull request 9494, merged in 2026 and called experimental there; CuPy 13
has none), and is a clear error otherwise.

What does not live here: the casting op (ops/elementwise.py Cast), where
ops run (function.py), loss scaling (grad_scaler.py), the Trainer's
fp16/bf16 switches (train.py).
"""

from contextlib import contextmanager

import numpy

from . import backend

# The policy: op class names (function.py's Function subclasses) -> the dtype they run in.
LOWER = {"MatMul", "Linear"}
FLOAT32 = {"LayerNorm", "Softmax", "LogSoftmax", "CrossEntropy", "Exp", "Log", "Pow", "PowScalar", "Sum", "Mean"}
WIDEST = {"Add", "Sub", "Mul", "Div", "Where", "Cat", "Stack"}

_stack = [None]  # the autocast dtype in force, innermost last; None: autocast is off


def get_dtype():
    """The 16-bit dtype of the autocast in force, or None outside autocast (or inside enabled=False)."""
    return _stack[-1]


@contextmanager
def autocast(dtype="bfloat16", enabled=True):
    """Inside the block, each op runs in the dtype the policy gives it (see the module docstring).

    dtype: "bfloat16" or "float16" (or the dtype itself). enabled=False
    switches autocast off inside an autocast block; blocks nest, and leaving
    one puts back what was in force. Raises ImportError for bfloat16 without
    ml_dtypes, ValueError for another dtype.
    """
    _stack.append(lower_dtype(dtype) if enabled else None)
    try:
        yield
    finally:
        _stack.pop()


@contextmanager
def restored(dtype):
    """Inside: the autocast state `dtype` (get_dtype()'s value when it was taken), whatever is in force now.

    A checkpoint's recompute runs under the state its forward ran under, so
    it makes the same casts (checkpoint.py).
    """
    _stack.append(dtype)
    try:
        yield
    finally:
        _stack.pop()


def lower_dtype(name):
    """numpy.float16, or ml_dtypes' bfloat16, for "float16" / "bfloat16" (or the dtypes themselves)."""
    text = getattr(name, "__name__", None) or str(name)
    if text in ("float16", "half"):
        return numpy.dtype(numpy.float16)
    if text == "bfloat16":
        return bfloat16()
    raise ValueError(f"autocast: dtype must be 'bfloat16' or 'float16', the 16-bit dtypes matrix products run "
                     f"in, got {name!r}")


def bfloat16():
    """ml_dtypes' bfloat16 as a NumPy dtype (NumPy has none of its own)."""
    try:
        import ml_dtypes
    except ImportError:
        raise ImportError("bfloat16 needs the ml_dtypes package (NumPy has no bfloat16): pip install -e \".[bf16]\" "
                          "(or pip install ml_dtypes); or use float16") from None
    return numpy.dtype(ml_dtypes.bfloat16)


def is_float(dtype):
    """True for floating dtypes, bfloat16 included; not complex ones (torch.is_floating_point's meaning)."""
    return backend.is_inexact(dtype) and numpy.dtype(dtype).kind != "c"


def is_16bit(dtype):
    """True for float16 and bfloat16."""
    return is_float(dtype) and numpy.dtype(dtype).itemsize == 2


def op_dtype(op, dtypes):
    """The dtype op (a class name) runs in under autocast, given its inputs' dtypes; None: as they are."""
    if op in LOWER:
        return _stack[-1]
    if op in FLOAT32:
        return numpy.dtype(numpy.float32)
    if op in WIDEST:
        floats = {numpy.dtype(d) for d in dtypes if is_float(d)}
        if len(floats) < 2 or numpy.float64 in floats:
            return None  # one dtype: nothing to do; float64 with float32 stays function.py's error
        widest = max(floats, key=lambda d: d.itemsize)
        return widest if widest.itemsize > 2 else numpy.dtype(numpy.float32)  # float16 with bfloat16: float32
    return None


def cast_inputs(op, inputs):
    """The op's input tensors, each floating one cast to the op's autocast dtype (Function.apply calls this).

    float64 inputs stay as they are, and so do integer ones (token ids).
    Each cast is `tensor.to(dtype)`: a Cast record on the tape.
    """
    dtype = op_dtype(op, [t.dtype for t in inputs])
    if dtype is None:
        return inputs
    cast = []
    for t in inputs:
        if t.dtype != dtype and is_float(t.dtype) and t.dtype != numpy.float64:
            _check_device(dtype, t.data)
            t = t.to(dtype=dtype)
        cast.append(t)
    return tuple(cast)


def _check_device(dtype, array):
    """A clear error where the array module cannot hold bfloat16 (CuPy before 14), instead of CuPy's own."""
    if dtype.name != "bfloat16" or isinstance(array, numpy.ndarray):
        return
    try:
        array.reshape(-1)[:0].astype(dtype)
    except (TypeError, ValueError, NotImplementedError):
        raise TypeError(f"autocast('bfloat16'): this GPU's array module ({type(array).__module__}) cannot hold "
                        "bfloat16 (CuPy takes ml_dtypes' bfloat16 only in releases with cupy/cupy pull request "
                        "9494, and needs ml_dtypes installed). Use float16 instead (fp16=True, --fp16), which "
                        "CuPy runs natively") from None
