"""An encoder (BERT's kind): the GPT's blocks without the causal mask, and a classification head.

    token + position embeddings -> blocks (causal=False) -> LayerNorm -> mean over T -> head

Every position attends to every other, before and after it, so the whole
sequence informs each position; the head reads the mean of the positions
and scores num_classes labels. The blocks are transformer.py's
TransformerBlock with causal=False (the mask is the only difference), so
checkpointing them is the GPT's: `model.gradient_checkpointing_enable(
segments, policy)` runs the blocks through checkpoint_sequential
(ChainCheckpointing). Its small generated task is data.majority_token_task.

Shapes as in transformer.py: B batch, T sequence length, C n_embd.

What does not live here: the blocks (transformer.py), the layers
(layers.py), the task's data (data.py).
"""

from dataclasses import dataclass

import numpy

from .. import backend, random
from .. import functional as F
from ..checkpoint import ChainCheckpointing
from ..tensor import Tensor
from .layers import Dropout, Embedding, LayerNorm, Linear, Sequential
from .module import Module
from .transformer import TransformerBlock


@dataclass
class EncoderConfig:
    block_size: int = 32  # longest sequence the position embedding covers
    vocab_size: int = 16  # number of token ids
    num_classes: int = 16  # number of labels the head scores
    n_layer: int = 2  # number of transformer blocks
    n_head: int = 2  # attention heads per block; must divide n_embd
    n_embd: int = 32  # embedding width C, the residual stream's width
    dropout: float = 0.0  # dropout probability on embeddings, attention weights and residual branches
    bias: bool = True  # biases in the Linear and LayerNorm layers


class Encoder(ChainCheckpointing, Module):
    """Token ids (B, T) -> class logits (B, num_classes), and the loss if targets (B,) are given.

    Initialised as the GPT (GPT-2's scheme); `rng` draws the weights and,
    if given, the dropout masks.
    """

    def __init__(self, config, rng=None, dtype=numpy.float32, device=None):
        super().__init__()
        self.config = config
        init = random.generator(rng)
        C = config.n_embd
        self.wte = Embedding(config.vocab_size, C, dtype=dtype, device=device, rng=init, init_std=0.02)  # token embedding
        self.wpe = Embedding(config.block_size, C, dtype=dtype, device=device, rng=init, init_std=0.02)  # position embedding
        self.drop = Dropout(config.dropout, rng=rng)
        self.blocks = Sequential(*[TransformerBlock(config, rng=rng, dtype=dtype, device=device, causal=False)
                                   for _ in range(config.n_layer)])
        self.ln_f = LayerNorm(C, bias=config.bias, dtype=dtype, device=device)
        self.head = Linear(C, config.num_classes, dtype=dtype, device=device, rng=init, init_std=0.02)

    def checkpoint_chain(self):
        """The layers checkpointing cuts into segments: the blocks."""
        return list(self.blocks)

    def forward(self, idx, targets=None):
        """idx: integer (B, T); targets: integer (B,) class labels (arrays or Tensors).

        Returns (logits (B, num_classes), mean cross-entropy loss or None).
        """
        idx = idx.data if isinstance(idx, Tensor) else idx
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"Encoder: sequence of length {T} is longer than block_size {self.config.block_size}")
        pos = backend.module_for(self.wpe.weight.device).arange(T)  # (T,)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        x = self.run_chain(x)  # the blocks, checkpointed if switched on: (B, T, C)
        x = self.ln_f(x).mean(axis=1)  # (B, C): every position's say, equally
        logits = self.head(x)  # (B, num_classes)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits, targets)  # host targets: range-checked there, then copied over
