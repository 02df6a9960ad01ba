"""The layers: Linear, Embedding, LayerNorm, BatchNorm1d/2d, Flatten, Dropout, activations, containers.

Each layer owns its Parameters, draws their initial values from an explicit
numpy Generator (`rng`; the package's default generator when None, see
random.py), and calls one function of F in `forward`. Values are drawn on the
host in float64 and then cast and copied to the device, so the same seed
gives the same model in float32 and float64, on CPU and GPU. On the meta
device nothing is drawn and nothing is made on the host: parameters and
buffers are arrays with a shape and no values (tests/test_nn_meta.py).

Sizes and options are checked where they are given, as PyTorch's layers
check them (`size`: an int or a NumPy integer, at least 1).

Initialisation follows PyTorch unless `init_std` is given: Linear is
U(-1/sqrt(in_features), 1/sqrt(in_features)) for weight and bias, Embedding
is N(0, 1). With `init_std`, weights are N(0, init_std^2) and biases zero
(GPT-2's scheme, used by transformer.py).

What does not live here: Module and Parameter (module.py), the image
layers (conv.py), the models (mlp.py, transformer.py, cnn.py), the ops the
layers call (ops/, functional.py).
"""

import math
import numbers

import numpy

from .. import autocast, backend
from .. import functional as F
from .. import random
from ..checkpoint import ChainCheckpointing, is_recomputing
from ..tensor import Tensor
from .module import Module, Parameter


def _parameter(draw, shape, dtype, device):
    """A Parameter of the values draw() makes on the host; on a device that holds no values
    (the meta device) nothing is drawn: an empty array of the shape."""
    device = backend.get_default_device() if device is None else device
    if not backend.holds_values(device):
        return Parameter(backend.module_for(device).empty(shape, dtype))
    return Parameter(draw(), dtype=dtype, device=device)


def _buffer(value, shape, dtype, device):
    """A buffer (a Tensor saved with the model, not trained) filled with `value`; on the meta
    device an empty array of the shape, nothing made on the host."""
    device = backend.get_default_device() if device is None else device
    if not backend.holds_values(device):
        return Tensor(backend.module_for(device).empty(shape, dtype), device=device)
    return Tensor(numpy.full(shape, value, dtype=dtype), device=device)


def size(layer, name, value):
    """A layer's size argument (features, channels, ...) as an int, checked where it is given:
    an int or a NumPy integer, at least 1. (PyTorch accepts 0 for Linear and Conv2d and makes
    empty weights; here a size of 0 is refused, as PyTorch's LSTM refuses it.)"""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{layer}: {name} should be of type int, got: {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{layer}: {name} must be greater than zero, got {value}")
    return int(value)


def _uniform(rng, shape, bound, dtype, device):
    return _parameter(lambda: rng.uniform(-bound, bound, size=shape), shape, dtype, device)


def _normal(rng, shape, std, dtype, device):
    return _parameter(lambda: rng.standard_normal(shape) * std, shape, dtype, device)


def _constant(value, shape, dtype, device):
    return _parameter(lambda: numpy.full(shape, value, dtype=dtype), shape, dtype, device)


class Linear(Module):
    """y = x @ weight.T + bias, weight of shape (out_features, in_features) as in PyTorch."""

    def __init__(self, in_features, out_features, bias=True, dtype=numpy.float32, device=None, rng=None, init_std=None):
        super().__init__()
        in_features, out_features = size("Linear", "in_features", in_features), size("Linear", "out_features", out_features)
        rng = random.generator(rng)
        self.in_features, self.out_features = in_features, out_features
        if init_std is None:  # PyTorch's default
            bound = 1 / math.sqrt(in_features)
            self.weight = _uniform(rng, (out_features, in_features), bound, dtype, device)
            self.bias = _uniform(rng, (out_features,), bound, dtype, device) if bias else None
        else:
            self.weight = _normal(rng, (out_features, in_features), init_std, dtype, device)
            self.bias = _constant(0.0, (out_features,), dtype, device) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """A lookup table: row i of weight (num_embeddings, embedding_dim) for each index i."""

    def __init__(self, num_embeddings, embedding_dim, dtype=numpy.float32, device=None, rng=None, init_std=None):
        super().__init__()
        num_embeddings = size("Embedding", "num_embeddings", num_embeddings)
        embedding_dim = size("Embedding", "embedding_dim", embedding_dim)
        rng = random.generator(rng)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        std = 1.0 if init_std is None else init_std  # PyTorch draws N(0, 1)
        self.weight = _normal(rng, (num_embeddings, embedding_dim), std, dtype, device)

    def forward(self, indices):
        """indices: integers of any shape (Tensor or array) -> (*indices.shape, embedding_dim)."""
        indices = indices.data if isinstance(indices, Tensor) else indices
        indices = indices if hasattr(indices, "dtype") else numpy.asarray(indices)
        if indices.dtype.kind not in "iu":
            raise TypeError(f"Embedding: indices must be integers, got dtype {indices.dtype}")
        if backend.device_of(indices) == "cpu" and indices.size and (indices.min() < 0 or indices.max() >= self.num_embeddings):
            bad = indices[(indices < 0) | (indices >= self.num_embeddings)][0]
            raise ValueError(f"Embedding: index {int(bad)} is out of range for {self.num_embeddings} embeddings (use 0..{self.num_embeddings - 1})")
        # The indices go to the table's device: one explicit copy of a small integer array.
        return F.embedding(backend.to_device(indices, self.weight.device), self.weight)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}"


class LayerNorm(Module):
    """Normalise each row over its last axis, then scale by weight and shift by bias."""

    def __init__(self, normalized_shape, eps=1e-5, bias=True, dtype=numpy.float32, device=None):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = size("LayerNorm", "normalized_shape", normalized_shape)
        self.normalized_shape, self.eps = normalized_shape, eps
        self.weight = _constant(1.0, (normalized_shape,), dtype, device)
        self.bias = _constant(0.0, (normalized_shape,), dtype, device) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}"


class _BatchNorm(Module):
    """Normalise each channel (axis 1) over every other axis, as BatchNorm1d and BatchNorm2d do
    (PyTorch 2.13's torch/nn/modules/batchnorm.py, its arguments and buffers).

    Training: normalise with the batch's mean and (biased) variance, and move
    the running statistics towards them:
        running = (1 - momentum) * running + momentum * batch statistic
    (the running variance takes the unbiased batch variance, as in PyTorch).
    num_batches_tracked counts the training batches; momentum=None uses it
    for PyTorch's cumulative average: after the n-th batch the factor is 1/n,
    so the running statistics are the plain mean of every batch's. An empty
    batch (N = 0) gives an empty output, counts, and leaves the statistics
    as they were, as PyTorch's does.
    Evaluation: normalise with the running statistics.
    track_running_stats=False keeps no running statistics (the three
    buffers are None) and normalises with the batch's, in evaluation too.
    reset_running_stats() puts them back to mean 0, variance 1, count 0.

    Composed from elementwise and reduce ops, so its backward comes for free;
    it saves more than a fused op would, which is fine for a layer the
    reference workloads do not use.
    """

    _buffers = ("running_mean", "running_var", "num_batches_tracked")
    ndims = ()  # the numbers of axes a subclass takes (N, C first)
    expected = ""  # and those shapes in words, for its error message

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 dtype=numpy.float32, device=None):
        super().__init__()
        name = type(self).__name__
        num_features = size(name, "num_features", num_features)
        if momentum is not None and (isinstance(momentum, bool) or not isinstance(momentum, numbers.Real)
                                     or not 0 <= momentum <= 1):
            raise ValueError(f"{name}: momentum must be a number in [0, 1], or None for a cumulative average, "
                             f"got {momentum!r}")
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.track_running_stats = bool(track_running_stats)
        self.weight = _constant(1.0, (num_features,), dtype, device) if affine else None
        self.bias = _constant(0.0, (num_features,), dtype, device) if affine else None
        if self.track_running_stats:
            self.running_mean = _buffer(0.0, (num_features,), dtype, device)
            self.running_var = _buffer(1.0, (num_features,), dtype, device)
            self.num_batches_tracked = _buffer(0, (), numpy.int64, device)
        else:
            self._buffers = ()
            self.running_mean = self.running_var = self.num_batches_tracked = None

    def reset_running_stats(self):
        """Running mean 0, running variance 1, no batches counted (nothing to do without running statistics)."""
        if self.track_running_stats:
            self.running_mean.fill_(0.0)
            self.running_var.fill_(1.0)
            self.num_batches_tracked.fill_(0)

    def forward(self, x):
        C, name = self.num_features, type(self).__name__
        if x.ndim not in self.ndims or x.shape[1] != C:
            raise ValueError(f"{name}({C}) expects input {self.expected.format(C=C)}, got shape {x.shape}")
        axes = (0,) + tuple(range(2, x.ndim))  # every axis but the channels
        shape = (1, C) + (1,) * (x.ndim - 2)  # a per-channel value, broadcastable to x
        if self.training and self.track_running_stats and not is_recomputing():
            self.num_batches_tracked.add_(1)  # once per training forward (a checkpoint's recompute is not one)
        if x.numel() == 0:  # an empty batch: nothing to normalise, no statistics
            out = x.reshape(x.shape)  # a new (empty) tensor, as PyTorch returns one
        else:
            if self.training or not self.track_running_stats:  # the batch's statistics
                n = x.numel() // C  # values per channel
                if n < 2:  # PyTorch's error too (in evaluation without running statistics as well)
                    raise ValueError(f"{name} needs more than one value per channel to normalise with the "
                                     f"batch's statistics, got input shape {x.shape}")
                mean = x.mean(axis=axes, keepdims=True)  # (1, C, 1...)
                centered = x - mean
                var = (centered * centered).mean(axis=axes, keepdims=True)  # biased: what we normalise with
                if self.training and self.track_running_stats:
                    self._update_running_stats(mean.data.reshape(C), var.data.reshape(C) * (n / (n - 1)))
            else:  # evaluation: the running statistics
                centered = x - Tensor(self.running_mean.data.reshape(shape), device=x.device)
                var = Tensor(self.running_var.data.reshape(shape), device=x.device)
            out = centered / (var + self.eps).sqrt()
        if self.weight is not None:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        # Under autocast a 16-bit input comes out 16-bit, as from PyTorch's batch_norm (autocast.py)
        return out.to(dtype=x.dtype) if autocast.get_dtype() is not None and autocast.is_16bit(x.dtype) else out

    def _update_running_stats(self, mean, var):
        """running = (1 - momentum) * running + momentum * batch, in place (mean, var: arrays (C,));
        with momentum None the factor is 1 / num_batches_tracked.

        Not while a checkpointed segment recomputes its forward: that forward
        already updated them once (PyTorch updates them twice).
        """
        if is_recomputing():
            return
        if self.momentum is None:
            count = self.num_batches_tracked
            m = 1.0 / float(count.item()) if backend.holds_values(count.device) else 1.0  # meta: no values
        else:
            m = self.momentum
        self.running_mean.mul_(1 - m).add_(mean, alpha=m)
        self.running_var.mul_(1 - m).add_(var, alpha=m)

    def extra_repr(self):
        tracked = "" if self.track_running_stats else ", track_running_stats=False"
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}{tracked}"


class BatchNorm1d(_BatchNorm):
    """Batch norm of input (N, C) or (N, C, L): each channel over the batch (and length) axes (see _BatchNorm)."""

    ndims, expected = (2, 3), "(N, {C}) or (N, {C}, L)"


class BatchNorm2d(_BatchNorm):
    """Batch norm of images (N, C, H, W): each channel over the batch and both image axes (see _BatchNorm)."""

    ndims, expected = (4,), "(N, {C}, H, W)"


class Flatten(Module):
    """x.reshape: axes start_dim..end_dim made one, (N, C, H, W) -> (N, C H W) by default, as torch.nn.Flatten."""

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        start, end = self.start_dim % x.ndim, self.end_dim % x.ndim
        if start > end:
            raise ValueError(f"Flatten: start_dim {self.start_dim} comes after end_dim {self.end_dim} for a {x.ndim}-D input")
        flat = math.prod(x.shape[start:end + 1])  # not -1, which an empty batch leaves undetermined
        return x.reshape(x.shape[:start] + (flat,) + x.shape[end + 1:])  # a view where NumPy can make one

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Dropout(Module):
    """Zero each element with probability p in training mode (scaling the rest by 1/(1-p)).

    The mask is drawn from `rng` (the default generator when None); in
    evaluation mode this is the identity.
    """

    def __init__(self, p=0.5, rng=None):
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"Dropout probability must be in [0, 1), got {p}")
        self.p, self.rng = p, rng

    def forward(self, x):
        return F.dropout(x, self.p, self.training, self.rng)

    def extra_repr(self):
        return f"p={self.p}"


class GELU(Module):
    """GELU: approximate='tanh' (GPT-2's, this package's default) or 'none' (exact, erf; PyTorch's default). See F.gelu."""

    def __init__(self, approximate="tanh"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self):
        return "" if self.approximate == "tanh" else f"approximate={self.approximate!r}"  # the default: GELU()


class Tanh(Module):
    def forward(self, x):
        return F.tanh(x)


class ReLU(Module):
    def forward(self, x):
        return F.relu(x)


class LeakyReLU(Module):
    """x where x > 0, negative_slope * x elsewhere."""

    def __init__(self, negative_slope=0.01):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        return F.leaky_relu(x, self.negative_slope)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}"


class ReLU6(Module):
    """min(max(x, 0), 6)."""

    def forward(self, x):
        return F.relu6(x)


class SiLU(Module):
    """x * sigmoid(x) (also called swish)."""

    def forward(self, x):
        return F.silu(x)


class Hardswish(Module):
    """x * relu6(x + 3) / 6."""

    def forward(self, x):
        return F.hardswish(x)


class Softplus(Module):
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold."""

    def __init__(self, beta=1.0, threshold=20.0):
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, x):
        return F.softplus(x, self.beta, self.threshold)

    def extra_repr(self):
        return f"beta={self.beta}, threshold={self.threshold}"


class Mish(Module):
    """x * tanh(softplus(x))."""

    def forward(self, x):
        return F.mish(x)


# -- containers ----------------------------------------------------------------
class ModuleList(Module):
    """A list of modules whose parameters are found; children are named "0", "1", ..."""

    def __init__(self, modules=()):
        super().__init__()
        self.layers = []
        for module in modules:
            self.append(module)

    def append(self, module):
        if not isinstance(module, Module):
            raise TypeError(f"{type(self).__name__} holds Modules, got {type(module).__name__}")
        self.layers.append(module)
        return self

    def named_children(self):
        for i, module in enumerate(self.layers):
            yield str(i), module

    def __getitem__(self, index):
        if isinstance(index, slice):
            return ModuleList(self.layers[index])
        return self.layers[index]

    def __iter__(self):
        return iter(self.layers)

    def __len__(self):
        return len(self.layers)

    def forward(self, *args):
        # A container, not a layer: no forward by design (PyTorch's ModuleList is the same).
        raise NotImplementedError("ModuleList has no forward: iterate over it, or use Sequential")


class Sequential(ChainCheckpointing, ModuleList):
    """Modules applied one after the other: forward(x) = m_n(...m_1(x)).

    gradient_checkpointing_enable(segments, policy) checkpoints them as a chain.
    """

    def __init__(self, *modules):
        super().__init__(modules)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Sequential(*self.layers[index])
        return self.layers[index]

    def checkpoint_chain(self):
        """The layers checkpointing cuts into segments: the modules, in order."""
        return list(self.layers)

    def forward(self, x):
        return self.run_chain(x)  # one module after the other, checkpointed if switched on
