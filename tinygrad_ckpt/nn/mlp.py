"""MLP: a deep stack of Linear -> activation blocks and a final Linear.

The reference workload W1 is `MLP(1024, 1024, 1024, n_layers=N)`
(bench/workloads.py): a chain where every block's output is the next
block's only input, the simplest place to see what activation
checkpointing saves.

    x -> [Linear -> GELU] x n_layers -> Linear -> out

`model.gradient_checkpointing_enable()` (Hugging Face's name; the switch is
checkpoint.ChainCheckpointing) makes forward run the blocks through
checkpoint_sequential: each segment keeps only its input and is recomputed
in backward.

What does not live here: the layers (layers.py), checkpointing (checkpoint.py).
"""

import numpy

from .. import random
from ..checkpoint import ChainCheckpointing
from .layers import GELU, Linear, ReLU, Sequential, Tanh
from .module import Module


def _activation(name):
    if name == "gelu":
        return GELU()
    if name == "relu":
        return ReLU()
    if name == "tanh":
        return Tanh()
    raise ValueError(f"MLP: unknown activation {name!r}; use 'gelu', 'relu' or 'tanh'")


class MLP(ChainCheckpointing, Module):
    """n_layers blocks of Linear -> activation, then a Linear head.

    self.blocks: Sequential of blocks, each Sequential(Linear, activation)
    self.head:   the final Linear (hidden_features -> out_features)
    gradient_checkpointing_enable(segments, policy) checkpoints the blocks.
    """

    def __init__(self, in_features, hidden_features, out_features, n_layers, activation="gelu",
                 dtype=numpy.float32, device=None, rng=None):
        super().__init__()
        if n_layers < 0:
            raise ValueError(f"MLP: n_layers must be >= 0, got {n_layers}")
        rng = random.generator(rng)
        blocks = []
        for i in range(n_layers):
            width_in = in_features if i == 0 else hidden_features
            linear = Linear(width_in, hidden_features, dtype=dtype, device=device, rng=rng)
            blocks.append(Sequential(linear, _activation(activation)))
        self.blocks = Sequential(*blocks)
        self.head = Linear(hidden_features if n_layers else in_features, out_features, dtype=dtype, device=device, rng=rng)

    def checkpoint_chain(self):
        """The layers checkpointing cuts into segments: the blocks."""
        return list(self.blocks)

    def forward(self, x):
        # x: (..., in_features) -> (..., out_features)
        x = self.run_chain(x)  # the blocks, checkpointed if switched on: (..., hidden_features)
        return self.head(x)
