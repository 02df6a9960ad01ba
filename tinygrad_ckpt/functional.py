"""The functional face of the ops, imported as F (as torch.nn.functional is).

Functions here take Tensors and call one op's `apply`, adding only argument
handling: flattening (B, T, C) logits for cross-entropy, drawing a dropout
mask from a generator, defaulting layer-norm's weight and bias.
"""

import numbers

import numpy

from . import backend, random
from .ops import conv, elementwise, matmul, movement, nn, pool
from .tensor import Tensor


def linear(x, weight, bias=None):
    """x @ weight.T + bias (weight is (out_features, in_features))."""
    return matmul.Linear.apply(x, weight) if bias is None else matmul.Linear.apply(x, weight, bias)


def relu(x):
    return elementwise.ReLU.apply(x)


def gelu(x, approximate="tanh"):
    """GELU: x Phi(x), Phi the standard normal's CDF; approximate='tanh' (the default here) or 'none'.

    'none' is exact (with erf), PyTorch's default. 'tanh' is GPT-2's
    approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), within
    5e-4 of it, and the default here because this package's models and
    their recorded results use it: the default differs from PyTorch's, so
    F.gelu(x) here is F.gelu(x, approximate='tanh') there.
    """
    if approximate == "tanh":
        return elementwise.GELU.apply(x)
    if approximate == "none":
        return elementwise.GELUErf.apply(x)
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def leaky_relu(x, negative_slope=0.01):
    """x where x > 0, negative_slope * x elsewhere."""
    return elementwise.LeakyReLU.apply(x, negative_slope=negative_slope)


def relu6(x):
    """min(max(x, 0), 6)."""
    return elementwise.ReLU6.apply(x)


def hardswish(x):
    """x * relu6(x + 3) / 6."""
    return elementwise.Hardswish.apply(x)


def silu(x):
    """x * sigmoid(x)."""
    return elementwise.SiLU.apply(x)


def softplus(x, beta=1.0, threshold=20.0):
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (as PyTorch)."""
    return elementwise.Softplus.apply(x, beta=beta, threshold=threshold)


def mish(x):
    """x * tanh(softplus(x))."""
    return elementwise.Mish.apply(x)


def tanh(x):
    return elementwise.Tanh.apply(x)


def sigmoid(x):
    return elementwise.Sigmoid.apply(x)


def softmax(x, axis=-1):
    return nn.Softmax.apply(x, axis=axis)


def log_softmax(x, axis=-1):
    return nn.LogSoftmax.apply(x, axis=axis)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Layer norm over the last axis; `normalized_shape` must be (C,)."""
    if isinstance(normalized_shape, numbers.Integral):  # a NumPy integer too
        normalized_shape = (int(normalized_shape),)
    normalized_shape = tuple(int(n) for n in normalized_shape)
    if normalized_shape != x.shape[-1:]:
        raise ValueError(
            f"layer_norm normalises over the last axis only: normalized_shape {normalized_shape} "
            f"does not match the input's last axis, shape {x.shape}"
        )
    xp = backend.array_module(x.data)
    weight = weight if weight is not None else Tensor(xp.ones(normalized_shape, dtype=x.dtype), device=x.device)
    bias = bias if bias is not None else Tensor(xp.zeros(normalized_shape, dtype=x.dtype), device=x.device)
    return nn.LayerNorm.apply(x, weight, bias, eps=eps)


def cross_entropy(logits, targets, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """Cross-entropy of logits (..., C) against integer targets (...), or class probabilities (..., C).

    reduction: 'mean' (over the targets that count), 'sum', or 'none': one
    loss per target, of the targets' shape, 0 where the target is ignored.
    Targets equal to `ignore_index` (padding) do not count, in the sum or in
    the mean's denominator. With every target ignored, the mean is NaN
    (0 / 0) and the sum 0, and the gradient is zero either way, as in PyTorch.
    Targets that are not an integer array or Tensor (a list, floats) are a
    TypeError; a target out of 0..C-1 is a ValueError (checked on the host).

    As PyTorch 2.13's (aten/src/ATen/native/LossNLL.cpp), with the classes on the last axis:
    weight (C,): each target's loss times its class's weight; the mean divides by the counted
    targets' weights. label_smoothing e in [0, 1]: the target is (1 - e) onehot + e / C, so the
    loss is (1 - e) the plain loss + e / C sum_c -weight[c] log p[c], the second term reduced as the
    first. Class probabilities q (floats of the logits' shape, a Tensor or an array): loss =
    -sum_c weight[c] q[c] log p[c] per row, the mean over the rows, differentiable in q as well.
    """
    if not isinstance(logits, Tensor):
        raise TypeError(f"cross_entropy: logits must be a Tensor, got a {type(logits).__name__}; wrap it: Tensor(logits)")
    if logits.ndim == 0:
        raise ValueError("cross_entropy: logits must have an axis of classes, got a 0-d tensor")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    C = logits.shape[-1]
    weight = _class_weights(weight, C, logits)
    raw = targets.data if isinstance(targets, Tensor) else targets
    if hasattr(raw, "dtype") and raw.dtype.kind == "f" and tuple(raw.shape) == logits.shape:
        if ignore_index >= 0:
            raise ValueError("cross_entropy: ignore_index is not supported for floating point target")
        return _cross_entropy_probabilities(logits, targets, weight, reduction, label_smoothing)
    targets = raw
    if isinstance(targets, numpy.generic):  # one NumPy integer: an array, so its range is checked
        targets = numpy.asarray(targets)
    if not hasattr(targets, "dtype"):
        raise TypeError(f"cross_entropy: targets must be an integer array or Tensor of class indices, got a "
                        f"{type(targets).__name__}; pass numpy.array(targets)")
    if targets.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy: targets must be integers (class indices), got dtype {targets.dtype}; pass "
                        f"targets.astype(numpy.int64) (or class probabilities: floats of the logits' shape {logits.shape})")
    if tuple(targets.shape) != logits.shape[:-1]:
        raise ValueError(f"cross_entropy: targets of shape {tuple(targets.shape)} do not match logits of shape {logits.shape}")
    if isinstance(targets, numpy.ndarray):
        # Checked while on the host, where it is free; then copied to the device once.
        # (Targets already on a GPU are not checked: that would wait for the GPU.)
        _check_class_range(targets, C, ignore_index)
        targets = backend.to_device(targets, logits.device)
    flat, targets = logits.reshape(-1, C) if logits.ndim != 2 else logits, targets.reshape(-1)  # (N, C), (N,)
    loss = nn.CrossEntropy.apply(flat, targets=targets, weight=weight, ignore_index=ignore_index, reduction=reduction)
    if label_smoothing:
        smooth = _smoothing_term(flat, targets, weight, ignore_index, reduction)
        loss = loss * (1 - label_smoothing) + smooth * (label_smoothing / C)
    return loss.reshape(logits.shape[:-1]) if reduction == "none" and logits.ndim != 2 else loss  # (N,) -> the targets' shape


def _class_weights(weight, C, logits):
    """cross_entropy's weight as an array (C,) on the logits' device (None stays None)."""
    if weight is None:
        return None
    weight = weight.data if isinstance(weight, Tensor) else numpy.asarray(weight, dtype=logits.dtype)
    if tuple(weight.shape) != (C,):
        raise ValueError(f"cross_entropy: weight tensor should be defined either for all {C} classes or no classes "
                         f"but got weight tensor of shape: {list(weight.shape)}")
    return backend.to_device(weight, logits.device)


def _smoothing_term(logits, targets, weight, ignore_index, reduction):
    """Label smoothing's second term: sum_c -weight[c] log p[n, c] per row (0 where ignored), reduced as the loss is:
    the mean divides by the same denominator, the counted rows' weights (PyTorch's)."""
    logp = log_softmax(logits, axis=-1)  # (N, C)
    if weight is not None:
        logp = logp * Tensor(weight, device=logits.device)
    valid = targets != ignore_index
    smooth = where(valid, -logp.sum(axis=-1), 0.0)  # (N,)
    if reduction == "none":
        return smooth
    if reduction == "sum":
        return smooth.sum()
    counted = valid if weight is None else weight[backend.array_module(targets).where(valid, targets, 0)] * valid
    with numpy.errstate(invalid="ignore"):  # nothing counted: NaN, as the loss
        return smooth.sum() / Tensor(counted.sum(dtype=logits.dtype), device=logits.device)


def _cross_entropy_probabilities(logits, targets, weight, reduction, label_smoothing):
    """-sum_c weight[c] q[c] log p[c] per row, q the (smoothed) class probabilities; composed, so q takes a gradient too."""
    C = logits.shape[-1]
    q = targets if isinstance(targets, Tensor) else Tensor(targets.astype(logits.dtype), device=logits.device)
    if label_smoothing:
        q = q * (1 - label_smoothing) + label_smoothing / C
    terms = log_softmax(logits, axis=-1) * q  # (..., C)
    if weight is not None:
        terms = terms * Tensor(weight, device=logits.device)
    loss = -terms.sum(axis=-1)  # (...)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    with numpy.errstate(invalid="ignore"):  # no rows: NaN, as in PyTorch
        return loss.sum() / (logits.numel() // C if logits.numel() else float("nan"))


def _check_class_range(targets, classes, ignore_index):
    bad = targets[(targets != ignore_index) & ((targets < 0) | (targets >= classes))]
    if bad.size:
        raise ValueError(
            f"cross_entropy: target {int(bad.flat[0])} is out of range for {classes} classes "
            f"(use 0..{classes - 1}, or {ignore_index} to ignore a position)"
        )


def dropout(x, p=0.5, training=True, rng=None):
    """Zero each element with probability p and scale the rest by 1 / (1 - p).

    The mask is drawn from `rng` (a numpy.random.Generator; the package's
    default generator if None) on the host and copied to x's device once, so
    the same seed gives the same mask on CPU and GPU.
    """
    if not 0 <= p < 1:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not training or p == 0:
        return x
    generator = random.generator(rng)
    if backend.holds_values(x.device):
        keep = numpy.asarray(generator.random(x.shape, dtype=numpy.float32) >= p)  # 0-d: an array too
        keep = backend.to_device(keep, x.device)
    else:  # the meta device: a mask with no values, nothing drawn
        keep = backend.module_for(x.device).empty(x.shape, dtype=numpy.bool_)
    return nn.Dropout.apply(x, keep=keep, p=p)


def mse_loss(input, target, reduction="mean"):
    """Mean (or sum) of squared differences."""
    if input.shape != target.shape:
        raise ValueError(f"mse_loss: input shape {input.shape} and target shape {target.shape} differ")
    sq = (input - target) ** 2
    if reduction == "mean":
        return sq.mean()
    if reduction == "sum":
        return sq.sum()
    raise ValueError(f"mse_loss: reduction must be 'mean' or 'sum', got {reduction!r}")


def where(condition, a, b):
    """a where the boolean condition holds, b elsewhere.

    One of a, b may be a Python number; it is promoted with the other as in
    arithmetic (tensor.promote_types: int tensor and 0.5 give float32).
    """
    condition = condition.data if isinstance(condition, Tensor) else condition
    if not isinstance(a, Tensor):
        b, a = b._with(a)
    elif not isinstance(b, Tensor):
        a, b = a._with(b)
    condition = backend.to_device(condition, a.device)  # a NumPy condition is copied over once
    return elementwise.Where.apply(a, b, condition=condition)


def cat(tensors, axis=0):
    return movement.Cat.apply(*tensors, axis=axis)


def stack(tensors, axis=0):
    return movement.Stack.apply(*tensors, axis=axis)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution of input (N, C, H, W) with weight (out_channels, C/groups, kh, kw), as PyTorch's.

    stride, padding (zeros, on both sides), dilation: an int or a pair (height, width).
    Returns (N, out_channels, OH, OW), OH = (H + 2 padding - dilation (kh - 1) - 1) // stride + 1.
    padding='valid' is 0; padding='same' (stride 1 only) keeps H and W, as PyTorch's: the
    dilation (k - 1) padded pixels are split evenly, the odd one at the end (bottom, right).
    """
    if isinstance(padding, str) and padding not in ("valid", "same"):
        raise ValueError(f"conv2d: invalid padding string {padding!r}, should be one of 'same', 'valid' "
                         "(or an int, or a pair of ints)")
    if padding == "valid":
        padding = 0
    elif padding == "same":
        if conv.pair("conv2d", "stride", stride, 1) != (1, 1):
            raise ValueError(f"conv2d: padding='same' is not supported for strided convolutions (stride={stride})")
        totals = [d * (k - 1) for k, d in zip(weight.shape[2:], conv.pair("conv2d", "dilation", dilation, 1))]
        if any(t % 2 for t in totals):  # uneven: one more row (column) after than before
            input = pad(input, (totals[1] // 2, totals[1] - totals[1] // 2, totals[0] // 2, totals[0] - totals[0] // 2))
            padding = 0
        else:
            padding = (totals[0] // 2, totals[1] // 2)
    inputs = (input, weight) if bias is None else (input, weight, bias)
    return conv.Conv2d.apply(*inputs, stride=stride, padding=padding, dilation=dilation, groups=groups)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """The largest value of each kernel_size window of input (N, C, H, W); stride defaults to kernel_size.

    ceil_mode=True rounds the output size up (a last, partial window); return_indices=True returns
    (output, indices) too, each largest element's row * W + column in its image, as PyTorch's.
    """
    return pool.MaxPool2d.apply(input, kernel_size=kernel_size, stride=stride, padding=padding, dilation=dilation,
                                ceil_mode=ceil_mode, return_indices=return_indices)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """The mean of each kernel_size window of input (N, C, H, W); stride defaults to kernel_size.

    count_include_pad=False leaves the zero padding out of the mean; divisor_override divides every
    window's sum by that number instead; ceil_mode as max_pool2d's (see ops/pool.py's AvgPool2d).
    """
    return pool.AvgPool2d.apply(input, kernel_size=kernel_size, stride=stride, padding=padding, ceil_mode=ceil_mode,
                                count_include_pad=count_include_pad, divisor_override=divisor_override)


def pad(input, pad, mode="constant", value=0.0):
    """`value` around the input, PyTorch's argument order: pad = (left, right) for the last axis, then
    (top, bottom) for the one before it, and so on: (1, 1, 2, 0) pads the last axis by one on each side
    and the axis before it by two at the start.

    mode 'reflect' (the mirror image, the edge itself not repeated), 'replicate' (the edge repeated) and
    'circular' (the other end wraps round) copy input pixels instead, as PyTorch 2.13's F.pad does, with
    its limits: 1 to 3 trailing axes, of an input with 1 or 2 axes more; a reflection shorter than the
    axis, a wrap at most as long. They are numpy.pad's 'reflect', 'edge' and 'wrap' applied to the
    pixels' positions, then one gather (x[rows, columns]), whose backward adds each copy's gradient back
    to its pixel.
    """
    pad = tuple(pad)
    if len(pad) % 2 or len(pad) // 2 > input.ndim:
        raise ValueError(f"pad: the padding {pad} must be pairs (before, after), at most one for each of the "
                         f"input's {input.ndim} axes, got {len(pad)} numbers")
    pairs = [tuple(pad[i:i + 2]) for i in range(0, len(pad), 2)][::-1]  # one pair per padded axis, in axis order
    if mode == "constant":
        return movement.Pad.apply(input, widths=[(0, 0)] * (input.ndim - len(pairs)) + pairs, value=value)
    if mode not in PAD_MODES:
        raise ValueError(f"pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', got {mode!r}")
    k = len(pairs)
    if not 1 <= k <= 3 or input.ndim not in (k + 1, k + 2):
        raise NotImplementedError(f"Padding size {len(pad)} is not supported for {input.ndim}D input tensor "
                                  f"(mode {mode!r} pads the last 1, 2 or 3 axes of an input with 1 or 2 more)")
    positions = []
    for axis, (before, after) in zip(range(input.ndim - k, input.ndim), pairs):
        n = input.shape[axis]
        if min(before, after) < 0 or (mode == "reflect" and max(before, after) >= n) or (
                mode == "circular" and max(before, after) > n):
            raise ValueError(f"pad: mode {mode!r} needs padding (before, after) of at least 0 and "
                             f"{'less than' if mode == 'reflect' else 'at most'} the axis, but got padding "
                             f"{(before, after)} at dimension {axis} of input {list(input.shape)}")
        positions.append(numpy.pad(numpy.arange(n), (before, after), mode=PAD_MODES[mode]))  # which pixel each copies
    grid = [backend.to_device(p, input.device) for p in numpy.ix_(*positions)]  # an open mesh: broadcast together
    return movement.GetItem.apply(input, index=(slice(None),) * (input.ndim - k) + tuple(grid))


PAD_MODES = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}  # PyTorch's name: numpy.pad's


def embedding(indices, weight):
    """Rows of weight (num_embeddings, dim) at integer indices: weight[indices]."""
    indices = indices.data if isinstance(indices, Tensor) else indices
    indices = backend.to_device(indices, weight.device)  # NumPy indices are copied over once
    return movement.GetItem.apply(weight, index=indices)
