"""MLP: a deep stack of Linear -> activation blocks and a final Linear.

This is workload W1 (WORKLOADS.md): `MLP(1024, 1024, 1024, n_layers=N)`, a
chain where every block's output is the next block's only input, the
simplest place to see what activation checkpointing saves.

    x -> [Linear -> GELU] x n_layers -> Linear -> out

`model.gradient_checkpointing_enable()` (Hugging Face's name) makes forward
run the blocks through checkpoint_sequential: each segment keeps only its
input and is recomputed in backward.

What does not live here: the layers (layers.py), checkpointing (checkpoint.py).
"""

import numpy

from .. import policies, random
from ..checkpoint import checkpoint_sequential
from ..schedules import segment_bounds
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


class MLP(Module):
    """n_layers blocks of Linear -> activation, then a Linear head.

    self.blocks: Sequential of blocks, each Sequential(Linear, activation)
    self.head:   the final Linear (hidden_features -> out_features)
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
        self.checkpoint_segments = None  # set by gradient_checkpointing_enable
        self.checkpoint_policy = None

    def gradient_checkpointing_enable(self, segments="every", policy=None):
        """Checkpoint the blocks: segments 'every' (one per block), 'sqrt', an int,
        boundaries or a schedules.Plan (see checkpoint_sequential); policy: see
        policies.py, a callable or a ready-made one's name."""
        segment_bounds(len(self.blocks), segments)  # a bad value fails here, not in forward
        self.checkpoint_segments, self.checkpoint_policy = segments, policies.resolve(policy)

    def gradient_checkpointing_disable(self):
        self.checkpoint_segments = self.checkpoint_policy = None

    def forward(self, x):
        # x: (..., in_features) -> (..., out_features)
        if self.checkpoint_segments is not None:
            x = checkpoint_sequential(self.blocks, self.checkpoint_segments, x, policy=self.checkpoint_policy)
        else:
            for block in self.blocks:
                x = block(x)  # (..., hidden_features)
        return self.head(x)
