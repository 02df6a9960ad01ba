"""The image layers: Conv2d, MaxPool2d, AvgPool2d.

Conv2d owns its Parameters with PyTorch's names and layout, weight
(out_channels, in_channels / groups, kh, kw) and bias (out_channels,), and
PyTorch's default initialisation: both uniform in +-1/sqrt(fan_in), where
fan_in = in_channels / groups * kh * kw (what kaiming_uniform_ with
a = sqrt(5) comes to). Values are drawn on the host in float64 from `rng`,
then cast and copied, as layers.py's are.

What does not live here: the ops (ops/conv.py, ops/pool.py, reached
through functional.py), BatchNorm2d and Flatten (layers.py), the CNN
(cnn.py).
"""

import math

import numpy

from .. import functional as F
from .. import random
from ..ops.conv import pair
from .layers import _uniform
from .module import Module


class Conv2d(Module):
    """out = conv2d(x, weight, bias): (N, in_channels, H, W) -> (N, out_channels, OH, OW), as torch.nn.Conv2d.

    padding: an int, a pair, 'valid' or 'same' (see F.conv2d).
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 dtype=numpy.float32, device=None, rng=None):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv2d: in_channels ({in_channels}) and out_channels ({out_channels}) must both be "
                             f"divisible by groups ({groups})")
        rng = random.generator(rng)
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = pair("Conv2d", "kernel_size", kernel_size, 1)
        self.stride, self.padding, self.dilation = stride, padding, dilation
        fan_in = in_channels // groups * self.kernel_size[0] * self.kernel_size[1]
        bound = 1 / math.sqrt(fan_in)  # PyTorch's default, for weight and bias
        self.weight = _uniform(rng, (out_channels, in_channels // groups, *self.kernel_size), bound, dtype, device)
        self.bias = _uniform(rng, (out_channels,), bound, dtype, device) if bias else None

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, bias={self.bias is not None}")


class MaxPool2d(Module):
    """The largest value of each window: F.max_pool2d (stride defaults to kernel_size)."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1):
        super().__init__()
        self.kernel_size, self.stride, self.padding, self.dilation = kernel_size, stride, padding, dilation

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, dilation={self.dilation}"


class AvgPool2d(Module):
    """The mean of each window, zero padding counted: F.avg_pool2d (stride defaults to kernel_size)."""

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"
