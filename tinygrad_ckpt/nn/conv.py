"""The image layers: Conv2d, MaxPool2d, AvgPool2d.

Conv2d owns its Parameters with PyTorch's names and layout, weight
(out_channels, in_channels / groups, kh, kw) and bias (out_channels,), and
PyTorch's default initialisation: both uniform in +-1/sqrt(fan_in), where
fan_in = in_channels / groups * kh * kw (what kaiming_uniform_ with
a = sqrt(5) comes to). Values are drawn on the host in float64 from `rng`,
then cast and copied, as layers.py's are.

Arguments are checked where they are given, as PyTorch's modules check
them: a bad kernel_size, stride, padding, dilation or groups is an error at
construction, naming the argument, not at the first forward. NumPy
integers are taken wherever ints are.

What does not live here: the ops (ops/conv.py, ops/pool.py, reached
through functional.py), BatchNorm2d and Flatten (layers.py), the CNN
(cnn.py).
"""

import math
import numbers

import numpy

from .. import functional as F
from .. import random
from ..ops.conv import pair
from ..ops.pool import pool_options
from .layers import _uniform, size
from .module import Module


class Conv2d(Module):
    """out = conv2d(x, weight, bias): (N, in_channels, H, W) -> (N, out_channels, OH, OW), as torch.nn.Conv2d.

    padding: an int, a pair, 'valid' or 'same' (see F.conv2d). padding_mode: what the padding holds,
    'zeros' (the default), or copies of the input's pixels, 'reflect', 'replicate' or 'circular': then,
    as PyTorch 2.13's Conv2d does, F.pad in that mode and a convolution without padding.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 padding_mode="zeros", dtype=numpy.float32, device=None, rng=None):
        super().__init__()
        in_channels, out_channels = size("Conv2d", "in_channels", in_channels), size("Conv2d", "out_channels", out_channels)
        if isinstance(groups, bool) or not isinstance(groups, numbers.Integral) or groups <= 0:
            raise ValueError(f"Conv2d: groups must be a positive integer, got {groups!r}")
        groups = int(groups)
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv2d: in_channels ({in_channels}) and out_channels ({out_channels}) must both be "
                             f"divisible by groups ({groups})")
        self.kernel_size = pair("Conv2d", "kernel_size", kernel_size, 1)
        strides = pair("Conv2d", "stride", stride, 1)  # checked; stride is kept as given, for repr
        pair("Conv2d", "dilation", dilation, 1)
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"Conv2d: invalid padding string {padding!r}, should be one of 'same', 'valid' "
                                 "(or an int, or a pair of ints)")
            if padding == "same" and strides != (1, 1):
                raise ValueError(f"Conv2d: padding='same' is not supported for strided convolutions (stride={stride}); "
                                 "pad with an int instead, e.g. padding=kernel_size // 2")
        else:
            pair("Conv2d", "padding", padding, 0)
        if padding_mode not in PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {PADDING_MODES}, but got padding_mode={padding_mode!r}")
        self.padding_mode = padding_mode
        rng = random.generator(rng)
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.stride, self.padding, self.dilation = _plain(stride), _plain(padding), _plain(dilation)
        fan_in = in_channels // groups * self.kernel_size[0] * self.kernel_size[1]
        bound = 1 / math.sqrt(fan_in)  # PyTorch's default, for weight and bias
        self.weight = _uniform(rng, (out_channels, in_channels // groups, *self.kernel_size), bound, dtype, device)
        self.bias = _uniform(rng, (out_channels,), bound, dtype, device) if bias else None

    def forward(self, x):
        if self.padding_mode == "zeros":
            return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        return F.conv2d(F.pad(x, self._pads(), mode=self.padding_mode), self.weight, self.bias, self.stride, 0,
                        self.dilation, self.groups)

    def _pads(self):
        """The padding as F.pad takes it, (left, right, top, bottom): 'same' splits dilation (k - 1), the odd one after."""
        if self.padding == "same":
            (th, tw) = [d * (k - 1) for k, d in zip(self.kernel_size, pair("Conv2d", "dilation", self.dilation, 1))]
            return tw // 2, tw - tw // 2, th // 2, th - th // 2
        ph, pw = (0, 0) if self.padding == "valid" else pair("Conv2d", "padding", self.padding, 0)
        return pw, pw, ph, ph

    def extra_repr(self):
        mode = "" if self.padding_mode == "zeros" else f", padding_mode={self.padding_mode}"
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, bias={self.bias is not None}"
                + mode)


PADDING_MODES = ("zeros", "reflect", "replicate", "circular")  # Conv2d's padding_mode, as PyTorch's


class MaxPool2d(Module):
    """The largest value of each window: F.max_pool2d (stride defaults to kernel_size), PyTorch's arguments.

    return_indices=True: forward returns (output, indices).
    """

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__()
        pool_options("MaxPool2d", kernel_size, stride, padding, dilation)  # checked here, not at the first forward
        self.kernel_size, self.stride = _plain(kernel_size), _plain(stride)
        self.padding, self.dilation = _plain(padding), _plain(dilation)
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                            self.return_indices)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}" + (", ceil_mode=True" if self.ceil_mode else ""))


class AvgPool2d(Module):
    """The mean of each window: F.avg_pool2d (stride defaults to kernel_size), PyTorch's arguments."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        super().__init__()
        pool_options("AvgPool2d", kernel_size, stride, padding, 1)  # checked here, not at the first forward
        self.kernel_size, self.stride, self.padding = _plain(kernel_size), _plain(stride), _plain(padding)
        self.ceil_mode, self.count_include_pad, self.divisor_override = ceil_mode, count_include_pad, divisor_override

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                            self.divisor_override)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


def _plain(value):
    """An argument as it was given, NumPy integers made Python ints (so repr shows 3, not np.int64(3))."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    return value
