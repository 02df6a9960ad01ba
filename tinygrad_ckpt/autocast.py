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

The policy is the table POLICY below: every op the engine has, by name,
on one of four lists, each placed as PyTorch 2.13 places the PyTorch op it
stands for (or the nearest one) in `aten/src/ATen/autocast_mode.h`, the
lists its CUDA autocast registers (autocast_mode.cpp, `TORCH_LIBRARY_IMPL(aten,
Autocast, m)`; the header ships in the wheel, torch/include/ATen/):

  lower     AT_FORALL_LOWER_PRECISION_FP (matmul, linear, conv2d, lstm_cell,
            ...): every floating input cast to the 16-bit dtype, where the
            speed is.
  float32   AT_FORALL_FP32 (exp, log, pow, softplus, layer_norm, nll_loss,
            mse_loss, ...) and AT_FORALL_FP32_SET_OPT_DTYPE (softmax,
            log_softmax, sum): every floating input cast to float32, where 16
            bits lose too much (a sum of many terms, an exponential's range).
            Cross-entropy is log_softmax then nll_loss there.
  promote   several floating inputs (add, mul, where, cat, ...): all in the
            widest of their dtypes, float16 with bfloat16 in float32.
            PyTorch needs a list (AT_FORALL_PROMOTE) only for the few ops that
            would not promote by themselves; its binary ops and cat do. This
            engine's ops refuse mixed dtypes (function.py), so autocast
            promotes for them: a float32 residual plus a bfloat16 attention
            output is a float32 sum.
  none      on no list (gelu, relu, tanh, sqrt, max, reshape, dropout,
            max_pool2d, ...): nothing is cast; the op runs in the dtype its
            input has.

The result's dtype is then PyTorch's CUDA autocast result dtype, op by op
(tests/test_autocast_lists.py checks each, and fails on a Function subclass
that has no place in the table). `lstm_cell` is in the table though it is
no Function here: PyTorch runs it as one op, nn/lstm.py as several, so the
cell casts its input and state itself (`cast_inputs("lstm_cell", ...)`),
and its gates, sigmoids and state run in 16 bits, as PyTorch's do.
PyTorch's CPU autocast registers other lists (in autocast_mode.cpp: exp,
log, pow, softplus, layer_norm, softmax, sum and lstm_cell are on none of
them, so they run in their inputs' dtypes); these are the CUDA lists,
applied on every device.

Where this project differs from PyTorch, and why:
  * Mean is on the float32 list (PyTorch's mean is on none: its kernels add
    16-bit values in float32 inside, aten/src/ATen/AccumulateType.h's
    acc_type, and round the result). ml_dtypes'
    bfloat16 adds in bfloat16: 10,000 bfloat16 ones sum to 256, and their
    mean is 0.0256 (measured, ml_dtypes 0.7, NumPy 2.4). NumPy's float16
    depends on the layout: down a strided axis it adds in float16 (10,000
    ones sum to 2048), along a contiguous one its pairwise sum accumulates
    in float32, and its mean of float16 always does. (tests/test_claims.py
    checks each of these.)
  * Casts are not cached. PyTorch casts each float32 weight once per autocast
    region and reuses the copy; here a weight used twice is cast twice (two
    records, two copies saved). Simpler, and the copies are plainly seen.
  * Only float32 and 16-bit inputs are cast; float64 stays as it is, as
    PyTorch leaves double tensors alone under autocast.
  * BatchNorm is several ops here (nn/layers.py), whose mean makes it
    float32; PyTorch's batch_norm is on no CUDA list and keeps a 16-bit
    input 16-bit.

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

# The policy: every op, by name (function.py's Function subclasses, and lstm_cell) -> (its list, the
# PyTorch op whose place in autocast_mode.h it takes). See the module docstring for the lists.
POLICY = {
    # lower: AT_FORALL_LOWER_PRECISION_FP
    "MatMul": ("lower", "matmul"),
    "Linear": ("lower", "linear"),
    "Conv2d": ("lower", "conv2d"),
    "lstm_cell": ("lower", "lstm_cell"),  # nn/lstm.py: several ops here, one in PyTorch
    # float32: AT_FORALL_FP32 and AT_FORALL_FP32_SET_OPT_DTYPE
    "Exp": ("float32", "exp"),
    "Log": ("float32", "log"),
    "Pow": ("float32", "pow"),  # pow.Tensor_Tensor (and pow.Scalar: 2 ** x)
    "PowScalar": ("float32", "pow"),  # pow.Tensor_Scalar
    "Softplus": ("float32", "softplus"),
    "LayerNorm": ("float32", "layer_norm"),
    "CrossEntropy": ("float32", "nll_loss"),  # cross_entropy: log_softmax, then nll_loss
    "Softmax": ("float32", "softmax"),
    "LogSoftmax": ("float32", "log_softmax"),
    "Sum": ("float32", "sum"),
    "Mean": ("float32", "mean"),  # on no list in PyTorch: see "Where this project differs"
    # promote: the widest floating dtype of the inputs (PyTorch's type promotion)
    "Add": ("promote", "add"),
    "Sub": ("promote", "sub"),
    "Mul": ("promote", "mul"),
    "Div": ("promote", "div"),
    "Where": ("promote", "where"),
    "Cat": ("promote", "cat"),
    "Stack": ("promote", "stack"),
    # none: nothing cast, the op runs in its input's dtype
    "Neg": ("none", "neg"),
    "Abs": ("none", "abs"),
    "Sqrt": ("none", "sqrt"),
    "Tanh": ("none", "tanh"),
    "Sigmoid": ("none", "sigmoid"),
    "ReLU": ("none", "relu"),
    "GELU": ("none", "gelu"),  # approximate="tanh"
    "GELUErf": ("none", "gelu"),
    "LeakyReLU": ("none", "leaky_relu"),
    "ReLU6": ("none", "hardtanh"),  # relu6 is hardtanh(x, 0, 6)
    "Hardswish": ("none", "hardswish"),
    "SiLU": ("none", "silu"),
    "Mish": ("none", "mish"),
    "Max": ("none", "amax"),
    "Dropout": ("none", "dropout"),
    "MaxPool2d": ("none", "max_pool2d"),
    "AvgPool2d": ("none", "avg_pool2d"),
    "Reshape": ("none", "reshape"),
    "Permute": ("none", "permute"),
    "Expand": ("none", "expand"),
    "GetItem": ("none", "index"),
    "Split": ("none", "split"),
    "Pad": ("none", "constant_pad_nd"),
    "Clone": ("none", "clone"),
    "ToDevice": ("none", "_to_copy"),
    "Cast": ("none", "_to_copy"),  # the cast itself: casting its input first would never end
    "Checkpoint": ("none", "checkpoint"),  # torch.utils.checkpoint: no op; the ops inside are placed one by one
}
# The sets op_dtype reads (tutorial 11's exercise moves Softmax out of FLOAT32 and back).
LOWER = {op for op, (where, _) in POLICY.items() if where == "lower"}
FLOAT32 = {op for op, (where, _) in POLICY.items() if where == "float32"}
PROMOTE = {op for op, (where, _) in POLICY.items() if where == "promote"}

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
    if op in PROMOTE:
        floats = {numpy.dtype(d) for d in dtypes if is_float(d)}
        if len(floats) < 2 or numpy.float64 in floats:
            return None  # one dtype: nothing to do; float64 with float32 stays function.py's error
        widest = max(floats, key=lambda d: d.itemsize)
        return widest if widest.itemsize > 2 else numpy.dtype(numpy.float32)  # float16 with bfloat16: float32
    return None


def cast_inputs(op, inputs):
    """The op's input tensors, each floating one cast to the op's autocast dtype.

    Function.apply calls this for every op inside autocast; nn/lstm.py's
    lstm_cell for the cell (op "lstm_cell"), which is several ops here.

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
