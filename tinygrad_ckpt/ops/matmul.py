"""Matrix multiplication: batched `a @ b`, and the fused linear layer.

These are the expensive ops: on the reference workloads most of a step's
time is spent here, in BLAS (NumPy) or cuBLAS (CuPy). Checkpoint policies
that "save matmul outputs" refer to these two ops.

16-bit inputs (autocast.py): NumPy has no 16-bit BLAS. Its own float16
matmul loop gives the float32 result rounded, 15 times slower than BLAS on
a (64, 256) @ (256, 96) product, and ml_dtypes' bfloat16 matmul returns
float32, unrounded (NumPy 2.4, ml_dtypes 0.7, measured). So on the CPU
every product of 16-bit arrays goes through `_mm`: both cast to float32, one
BLAS call, the result rounded to 16 bits once: the numbers a GPU's tensor
cores give (16-bit inputs, float32 sums), and a float32 scratch the size of
the inputs and the result for the length of the call. On CuPy, cuBLAS runs
float16 (and bfloat16) itself, with float32 sums.
"""

import numpy

from ..autocast import is_16bit
from ..function import Function
from .elementwise import unbroadcast


def _mm(a, b):
    """a @ b in a's dtype; 16-bit arrays on the CPU in float32, rounded once (see the module docstring)."""
    if not is_16bit(a.dtype):
        return a @ b
    dtype = a.dtype
    if isinstance(a, numpy.ndarray):  # NumPy: no 16-bit BLAS
        a, b = a.astype(numpy.float32), b.astype(numpy.float32)
    return (a @ b).astype(dtype, copy=False)  # NumPy: rounded once; cuBLAS: already 16-bit, no copy


def _row_sum(g2):
    """g2 (N, out) summed over its rows; 16-bit sums added in float32 (ml_dtypes adds bfloat16 in bfloat16)."""
    if is_16bit(g2.dtype):
        return g2.sum(axis=0, dtype=numpy.float32).astype(g2.dtype)
    return g2.sum(axis=0)


def _swap(x):
    """Transpose the last two axes (a view, no copy)."""
    return x.swapaxes(-1, -2)


def _fold(a, b):
    """a (..., k) @ b (k, n) as one 2-D GEMM, with the leading axes of a folded into rows.

    The same numbers as `a @ b`, in one BLAS call: NumPy's matmul makes one
    call per matrix of the stack, and each call pays BLAS's thread start-up
    again.
    """
    if a.ndim <= 2:
        return _mm(a, b)
    return _mm(a.reshape(-1, a.shape[-1]), b).reshape(*a.shape[:-1], b.shape[-1])


class MatMul(Function):
    """out = a @ b over the last two axes, broadcasting the leading (batch) axes.

        da = g @ b^T,  db = a^T @ g   (each summed back over broadcast batch axes)

    Saves a if b needs a gradient, b if a does.
    """

    @staticmethod
    def forward(ctx, a, b):
        if a.shape[-1] != b.shape[-2]:
            raise ValueError(
                f"matmul: inner dimensions differ: {tuple(a.shape)} @ {tuple(b.shape)} "
                f"({a.shape[-1]} != {b.shape[-2]})"
            )
        ctx.shapes = a.shape, b.shape
        need_a, need_b = ctx.needs_input_grad
        ctx.save_for_backward(a if need_b else None, b if need_a else None)
        return _fold(a, b) if b.ndim == 2 else _mm(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_arrays
        sa, sb = ctx.shapes
        need_a, need_b = ctx.needs_input_grad
        da = None
        if need_a:
            da = _fold(g, b.T) if b.ndim == 2 else unbroadcast(_mm(g, _swap(b)), sa)
        db = None
        if need_b:
            if len(sb) == 2 and len(sa) > 2:
                # A shared 2-D b: fold the batch into the rows, one GEMM, no
                # (batch, K, N) temporary to sum afterwards.
                db = _mm(a.reshape(-1, sa[-1]).T, g.reshape(-1, g.shape[-1]))
            else:
                db = unbroadcast(_mm(_swap(a), g), sb)
        return da, db


class Linear(Function):
    """out = x @ weight^T + bias, PyTorch's layout: weight is (out_features, in_features).

        dx = g @ weight,  dweight = g^T @ x,  dbias = g summed over all but the last axis

    One record instead of three (matmul, transpose, add). Saves x and weight;
    weight is a parameter, so it costs no activation memory.
    """

    @staticmethod
    def forward(ctx, x, weight, bias=None):
        if x.shape[-1] != weight.shape[-1]:
            raise ValueError(
                f"linear: input has {x.shape[-1]} features (shape {tuple(x.shape)}) but the "
                f"weight of shape {tuple(weight.shape)} expects {weight.shape[-1]}"
            )
        ctx.has_bias = bias is not None
        need = ctx.needs_input_grad
        # dweight needs x; dx needs weight; dbias needs neither.
        ctx.save_for_backward(x if need[1] else None, weight if need[0] else None)
        out = _fold(x, weight.T)
        if bias is not None:
            out += bias
        return out

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_arrays
        need = ctx.needs_input_grad
        g2 = g.reshape(-1, g.shape[-1])  # (N, out): all leading axes are rows
        dx = _fold(g, weight) if need[0] else None
        dweight = _mm(g2.T, x.reshape(-1, x.shape[-1])) if need[1] else None
        if not ctx.has_bias:
            return dx, dweight
        dbias = _row_sum(g2) if need[2] else None
        return dx, dweight, dbias
