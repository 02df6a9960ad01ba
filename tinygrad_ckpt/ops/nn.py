"""Neural-network ops: softmax, log-softmax, layer norm, cross-entropy, dropout.

Each could be composed from elementwise and reduce ops, but then the tape
would hold every intermediate (x - max, exp, sum, ...) for backward. Written
as one op with a hand-derived backward, each saves one array the size of its
input, or less: that is the difference between this engine's activation
memory and a naive one, and why the saved-bytes figures match PyTorch's.

Softmax and log-softmax of 16-bit inputs compute in float32 and round once,
forward and backward, as PyTorch's kernels do (elementwise.py's `wide` and
`narrow`); they save their output in the input's dtype. (einsum, which
Softmax's backward uses, refuses ml_dtypes' bfloat16 outright.)
"""

import numpy

from ..backend import array_module, as_array, on_cpu
from ..function import Function
from .axes import normalize_axis
from .elementwise import narrow, wide


class Softmax(Function):
    """out = exp(x - max) / sum(exp(x - max))  along axis;  dx = out * (g - sum(g * out)).

    Saves out (the input is not needed).
    """

    @staticmethod
    def forward(ctx, x, axis=-1):
        xp = array_module(x)
        axis = ctx.axis = normalize_axis("softmax", axis, x.ndim)
        w = wide(x)
        out = as_array(w - w.max(axis=axis, keepdims=True))  # minus the max: exp cannot overflow
        xp.exp(out, out=out)  # in place: one array for the whole op
        out /= out.sum(axis=axis, keepdims=True)
        out = narrow(out, x.dtype)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_arrays
        dtype, g, out = g.dtype, wide(g), wide(out)
        if g.ndim and ctx.axis == g.ndim - 1:  # rows along the last axis, as in attention:
            # sum(g * out) per row as a contraction, without an array of products
            s = array_module(g).einsum("...i,...i->...", g, out)[..., None]
        else:
            s = (g * out).sum(axis=ctx.axis, keepdims=True)
        dx = g - s  # one new array
        dx *= out
        return narrow(dx, dtype)


class LogSoftmax(Function):
    """out = x - logsumexp(x)  along axis;  dx = g - exp(out) * sum(g).  Saves out."""

    @staticmethod
    def forward(ctx, x, axis=-1):
        xp = array_module(x)
        axis = ctx.axis = normalize_axis("log_softmax", axis, x.ndim)
        w = wide(x)
        shifted = w - w.max(axis=axis, keepdims=True)
        out = narrow(shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True)), x.dtype)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_arrays
        wg = wide(g)
        return narrow(wg - array_module(g).exp(wide(out)) * wg.sum(axis=ctx.axis, keepdims=True), g.dtype)


class LayerNorm(Function):
    """Normalise over the last axis, then scale and shift:

        xhat = (x - mean) * rstd,  rstd = 1 / sqrt(var + eps),  out = xhat * weight + bias
        dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),  dxhat = g * weight
        dweight = sum(g * xhat),  dbias = sum(g)   (sums over all rows)

    Saves x, weight and the per-row mean and rstd; xhat is recomputed in
    backward instead of being kept (one array, not two). PyTorch 2.13's
    native_layer_norm saves these and the bias too (tests/test_claims.py),
    a reference to the parameter, no new memory.

    Per-row sums of products (the variance, mean(dxhat * xhat)) and dweight
    are einsum contractions: the same sums, without an array of products.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps=1e-5):
        if weight.shape != x.shape[-1:]:
            raise ValueError(
                f"layer_norm: weight of shape {tuple(weight.shape)} does not match the last "
                f"axis of the input, shape {tuple(x.shape)}"
            )
        xp = array_module(x)
        C = x.shape[-1]
        mean = x.mean(axis=-1, keepdims=True)
        xhat = x - mean
        var = xp.einsum("...i,...i->...", xhat, xhat)[..., None] / C  # mean of squares, per row
        rstd = 1 / xp.sqrt(var + eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        xhat *= rstd
        xhat *= weight
        xhat += bias
        return xhat

    @staticmethod
    def backward(ctx, g):
        x, weight, mean, rstd = ctx.saved_arrays
        need_x, need_weight, need_bias = ctx.needs_input_grad
        xp = array_module(x)
        C = x.shape[-1]
        # Two new arrays (xhat, dx), each step in place after that.
        xhat = x - mean
        xhat *= rstd
        rows_g, rows_xhat = g.reshape(-1, C), xhat.reshape(-1, C)  # all leading axes are rows
        dweight = xp.einsum("ni,ni->i", rows_g, rows_xhat) if need_weight else None  # sum over rows of g * xhat
        dbias = rows_g.sum(axis=0) if need_bias else None
        if not need_x:
            return None, dweight, dbias
        dx = g * weight  # dxhat
        mean_dxhat_xhat = xp.einsum("...i,...i->...", dx, xhat)[..., None] / C
        dx -= dx.mean(axis=-1, keepdims=True)
        xhat *= mean_dxhat_xhat
        dx -= xhat
        dx *= rstd
        return dx, dweight, dbias


class CrossEntropy(Function):
    """loss_n = -w_n log softmax(logits_n)[target_n], w_n = weight[target_n] (1 without a weight), reduced:

        'mean'  sum_n loss_n / sum_n w_n   (over the targets that count)
        'sum'   sum_n loss_n,   'none'  the (N,) losses
        dlogits_n = w_n (softmax(logits_n) - onehot(target_n)) * g / sum_n w_n   (for 'mean'; zero on ignored rows)

    logits: (N, C); targets: (N,) integers, `ignore_index` marks rows that do
    not count (padding): w_n = 0 there, in the sum and the mean's
    denominator (PyTorch 2.13's nll_loss divides by the weights too).
    For 'none', g is (N,): dlogits row n is scaled by g[n]. Fusing
    log-softmax with the loss means one saved (N, C) array, the
    log-probabilities, plus the targets (and the (C,) weight, if any).

    With every row ignored the mean is 0 / 0 = NaN and the gradient is zero,
    as in PyTorch; the sum is 0. (Label smoothing and class-probability
    targets are composed in F.cross_entropy, as PyTorch composes them.)
    """

    @staticmethod
    def forward(ctx, logits, targets, weight=None, ignore_index=-100, reduction="mean"):
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        xp = array_module(logits, targets)
        n, classes = logits.shape
        if targets.shape != (n,):
            raise ValueError(f"cross_entropy: targets of shape {tuple(targets.shape)} do not match logits of shape {(n, classes)}")
        valid = targets != ignore_index  # (F.cross_entropy checks the range of host targets)
        logp = logits - logits.max(axis=1, keepdims=True)  # shifted: exp cannot overflow
        # log(sum(exp)) per row, a block of rows at a time: the exponentials never take an
        # array the size of the logits (the end of the forward, here, is often the step's peak).
        lse = xp.empty((n, 1), dtype=logp.dtype)
        rows = max(1, BLOCK_ELEMENTS // max(classes, 1)) if on_cpu(logits) else max(n, 1)
        for start in range(0, n, rows):
            lse[start:start + rows] = xp.exp(logp[start:start + rows]).sum(axis=1, keepdims=True)
        logp -= xp.log(lse, out=lse)  # in place: log-probabilities
        safe = xp.where(valid, targets, 0)
        weight = None if weight is None else weight.astype(logp.dtype, copy=False)
        w = _row_weights(valid, safe, weight)
        picked = logp[xp.arange(n), safe] * w
        ctx.reduction = reduction
        ctx.save_for_backward(logp, safe, valid, weight)
        if reduction == "none":
            return -picked  # (N,): 0 on ignored rows
        if reduction == "sum":
            return -picked.sum()
        with numpy.errstate(invalid="ignore"):  # no row counts: NaN, as in PyTorch, without a warning
            return -picked.sum() / w.sum(dtype=logits.dtype)  # in our dtype: no float64 upcast

    @staticmethod
    def backward(ctx, g):
        logp, safe, valid, weight = ctx.saved_arrays
        xp = array_module(logp)
        w = _row_weights(valid, safe, weight)
        grad = xp.exp(logp)
        grad[xp.arange(len(safe)), safe] -= 1
        if ctx.reduction == "mean":  # with no weight counted: g / 1, times all-zero w: a zero gradient, not NaN
            total = w.sum(dtype=g.dtype)
            g = g / xp.where(total == 0, 1, total)
        grad *= (w * g)[:, None]  # g is (N,) for 'none'
        return grad


def _row_weights(valid, safe, weight):
    """w_n: the weight of row n's class, 0 where the row is ignored; the mask itself without a weight."""
    return valid if weight is None else weight[safe] * valid


BLOCK_ELEMENTS = 1 << 15  # elements per block of rows (128 KiB of float32): CrossEntropy's exponentials


class Dropout(Function):
    """out = x * keep / (1 - p);  dx = g * keep / (1 - p).

    `keep` is a boolean mask drawn by the caller (functional.dropout), so the
    op itself is deterministic and a checkpoint can replay it. Saves the mask,
    1 byte per element, as Korthikanti et al. count it.
    """

    @staticmethod
    def forward(ctx, x, keep, p):
        ctx.scale = 1.0 / (1.0 - p)
        ctx.save_for_backward(keep)
        out = x * keep
        out *= x.dtype.type(ctx.scale)
        return out

    @staticmethod
    def backward(ctx, g):
        (keep,) = ctx.saved_arrays
        dx = g * keep
        dx *= g.dtype.type(ctx.scale)
        return dx
