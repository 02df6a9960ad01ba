"""A small convolutional network for 32x32 images (CIFAR-10's size), in nanoGPT's style.

    stages      [Conv 3x3 -> BatchNorm2d -> ReLU] x convs_per_stage -> MaxPool 2x2, one stage per width:
                each sets the channels to its width and halves the image, (B, C, S, S) -> (B, width, S/2, S/2)
    head        global average pool -> flatten -> Linear(widths[-1], n_classes)

Shapes: B batch, C channels, S the image's side. With the defaults,
(B, 3, 32, 32) -> (B, 16, 16, 16) -> (B, 32, 8, 8) -> (B, 64, 4, 4) ->
(B, 64) -> (B, 10) logits.

`model.gradient_checkpointing_enable()` (checkpoint.ChainCheckpointing, as
the GPT's and MLP's) runs the stages through checkpoint_sequential: each
checkpointed stage keeps only its input and runs again in backward. The
BatchNorm layers move their running statistics once per step all the same
(layers.py: not during a recompute).

What does not live here: the layers (conv.py, layers.py), checkpointing
(checkpoint.py), the training loop (train.py).
"""

from dataclasses import dataclass

import numpy

from .. import functional as F
from .. import random
from ..checkpoint import ChainCheckpointing
from ..tensor import Tensor
from .conv import AvgPool2d, Conv2d, MaxPool2d
from .layers import BatchNorm2d, Flatten, Linear, ReLU, Sequential
from .module import Module


@dataclass
class CNNConfig:
    image_size: int = 32  # side S of the square input images; halved by each stage, so divisible by 2 ** len(widths)
    in_channels: int = 3  # channels of the input images (3: red, green, blue)
    n_classes: int = 10  # number of classes the head scores
    widths: tuple = (16, 32, 64)  # output channels of each stage; one stage per width
    convs_per_stage: int = 2  # Conv -> BatchNorm -> ReLU units in each stage, before its pooling


def conv_bn_relu(in_channels, out_channels, rng, dtype, device):
    """Conv 3x3 (padding 1: the image keeps its size; no bias, BatchNorm's shift is one) -> BatchNorm2d -> ReLU."""
    return Sequential(Conv2d(in_channels, out_channels, 3, padding=1, bias=False, dtype=dtype, device=device, rng=rng),
                      BatchNorm2d(out_channels, dtype=dtype, device=device), ReLU())


class CNN(ChainCheckpointing, Module):
    """Images (B, in_channels, S, S) -> class logits (B, n_classes), and the loss if targets are given."""

    def __init__(self, config, rng=None, dtype=numpy.float32, device=None):
        super().__init__()
        S, stages = config.image_size, len(config.widths)
        if S % 2**stages:
            raise ValueError(f"CNN: image_size {S} must be divisible by 2 ** {stages} (each of the {stages} stages halves it)")
        self.config = config
        rng = random.generator(rng)
        blocks, channels = [], config.in_channels
        for width in config.widths:
            units = []
            for _ in range(config.convs_per_stage):
                units.append(conv_bn_relu(channels, width, rng, dtype, device))
                channels = width
            blocks.append(Sequential(*units, MaxPool2d(2)))
        self.stages = Sequential(*blocks)
        self.pool = AvgPool2d(S // 2**stages)  # global average: one value per channel
        self.flatten = Flatten()
        self.head = Linear(channels, config.n_classes, dtype=dtype, device=device, rng=rng)

    def checkpoint_chain(self):
        """The layers checkpointing cuts into segments: the stages."""
        return list(self.stages)

    def forward(self, x, targets=None):
        """x: (B, in_channels, S, S); targets: integer class ids (B,) or None. Returns (logits, loss or None)."""
        S = self.config.image_size
        if x.ndim != 4 or x.shape[1:] != (self.config.in_channels, S, S):
            raise ValueError(f"CNN: expected images (B, {self.config.in_channels}, {S}, {S}), got shape {x.shape}")
        x = self.run_chain(x)  # the stages, checkpointed if switched on: (B, widths[-1], S / 2^stages, same)
        x = self.flatten(self.pool(x))  # (B, widths[-1], 1, 1) -> (B, widths[-1])
        logits = self.head(x)  # (B, n_classes)
        if targets is None:
            return logits, None
        targets = targets.data if isinstance(targets, Tensor) else targets
        return logits, F.cross_entropy(logits, targets)
