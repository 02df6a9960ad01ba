"""The reference workloads W1, W2 and W3, in code: the one place that defines them.

Every measurement in the repository (`tinygrad-ckpt bench`, `bench --compare`,
the scripts in benchmarks/) runs these, so figures can be compared across
versions and with other libraries. benchmarks/README.md describes them for
readers.

  W1  DeepMLP        a chain: n_layers x (Linear(width, width) + GELU, tanh
                     approximation), then a final Linear(width, width); MSE loss
                     against a random target. Depths 8, 16, 32, 64; width 1024;
                     batch 256. Where checkpointing a plain chain is seen.
  W2  GPTStack       a GPT: n_layer pre-LayerNorm blocks (causal self-attention,
                     MLP 4x with GELU), dropout 0.1; cross-entropy on next
                     tokens. 2, 4 or 8 blocks; d_model 256, 4 heads, sequence
                     128, batch 8, vocabulary 256. Where a transformer's
                     checkpointing and the selective policy are seen.
  W3  Accumulation   the W2 model with 4 blocks; one effective batch of 32
                     sequences, split into micro-batch x steps as 32 x 1,
                     16 x 2, 8 x 4, 4 x 8 and 2 x 16. Where accumulation is seen.

All float32. A workload builds its model and its batch from a NumPy
Generator, so a seed gives the same run in every tool.

`Sizes` says which sizes one run measures; FULL (the reference sizes),
QUICK (small ones: `--quick`) and TINY (toy sizes for the test
suite: the figures mean nothing) are the three sets.

What does not live here: measuring (strategies.py, compare.py), the analytic
activation counts of these models (activations.py), the models (nn/).
"""

from dataclasses import dataclass, replace

import numpy

from .. import functional as F
from ..nn.mlp import MLP
from ..nn.transformer import GPT, GPTConfig
from ..tensor import Tensor


@dataclass(frozen=True)
class DeepMLP:
    """W1: n_layers x (Linear(width, width) + GELU(tanh)), a final Linear(width, width), MSE loss."""

    n_layers: int = 32  # the depth of a one-size run (bench --compare); the full sweep is W1_DEPTHS
    width: int = 1024
    batch: int = 256

    def model(self, rng, dtype=numpy.float32, device=None):
        """The MLP, its weights drawn from `rng` (a NumPy Generator)."""
        return MLP(self.width, self.width, self.width, n_layers=self.n_layers, dtype=dtype, device=device, rng=rng)

    def data(self, rng, dtype=numpy.float32):
        """(x, target): two (batch, width) arrays of standard normal values."""
        shape = (self.batch, self.width)
        return rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)

    def loss(self, model, batch):
        """The step's loss: MSE of the model's output against the target (a 0-d Tensor), on the model's device."""
        device = model.head.weight.device
        x, target = batch
        return F.mse_loss(model(Tensor(x, device=device)), Tensor(target, device=device))


@dataclass(frozen=True)
class GPTStack:
    """W2: a GPT of n_layer pre-LayerNorm blocks, causal attention, MLP 4x GELU; cross-entropy."""

    n_layer: int = 4  # the block count of a one-size run (bench --compare); the full sweep is W2_BLOCKS
    n_embd: int = 256  # d_model
    n_head: int = 4
    seq: int = 128
    batch: int = 8
    vocab: int = 256
    dropout: float = 0.1

    def config(self):
        return GPTConfig(block_size=self.seq, vocab_size=self.vocab, n_layer=self.n_layer, n_head=self.n_head,
                         n_embd=self.n_embd, dropout=self.dropout)

    def model(self, rng, dtype=numpy.float32, device=None):
        """The GPT, its weights (and, through `rng`, its dropout masks) drawn from `rng`."""
        return GPT(self.config(), rng=rng, dtype=dtype, device=device)

    def data(self, rng, batch=None):
        """(idx, targets): integer (batch, seq) token ids and the next token of each, from one random stream."""
        tokens = rng.integers(0, self.vocab, size=(batch or self.batch, self.seq + 1))
        return tokens[:, :-1].copy(), tokens[:, 1:].copy()

    def loss(self, model, batch):
        """The step's loss: mean cross-entropy of the next-token logits (a 0-d Tensor)."""
        idx, targets = batch
        return model(idx, targets)[1]


@dataclass(frozen=True)
class Accumulation:
    """W3: the W2 model; one effective batch split into micro-batch x steps."""

    model: GPTStack = GPTStack(n_layer=4)
    effective_batch: int = 32
    splits: tuple = ((32, 1), (16, 2), (8, 4), (4, 8), (2, 16))  # (micro-batch, steps), micro x steps = effective

    def __post_init__(self):
        for micro, steps in self.splits:
            if micro * steps != self.effective_batch:
                raise ValueError(f"W3 split {micro} x {steps} does not make the effective batch {self.effective_batch}")


W1, W2, W3 = DeepMLP(), GPTStack(), Accumulation()
W1_DEPTHS = (8, 16, 32, 64)
W2_BLOCKS = (2, 4, 8)


@dataclass(frozen=True)
class Sizes:
    """Which sizes of the workloads one run measures (FULL, QUICK, TINY).

    w1 and w2 hold the shapes (and the one size a one-size run uses);
    w1_depths and w2_blocks are the sizes a sweep measures; compare, the
    sizes `bench --compare` and `bench --profile` run, in order.
    """

    w1: DeepMLP
    w1_depths: tuple
    w2: GPTStack
    w2_blocks: tuple
    w3: Accumulation
    compare: tuple = ()

    def w1_at(self, n_layers):
        return replace(self.w1, n_layers=n_layers)

    def w2_at(self, n_layer):
        return replace(self.w2, n_layer=n_layer)



def name(size):
    """'W1' for a DeepMLP, 'W2' for a GPTStack."""
    return "W1" if isinstance(size, DeepMLP) else "W2"


def label(size):
    """How a table names one size: 'W1, N=32' or 'W2, L=4, dropout 0.1'."""
    if isinstance(size, DeepMLP):
        return f"W1, N={size.n_layers}"
    return f"W2, L={size.n_layer}, dropout {size.dropout:g}"


# The comparison runs W1 at three depths, so the ratios are seen across
# sizes, and W2 with dropout 0.1 (the reference) and 0 (what most current
# models train with).
FULL = Sizes(w1=W1, w1_depths=W1_DEPTHS, w2=W2, w2_blocks=W2_BLOCKS, w3=W3,
             compare=(replace(W1, n_layers=16), W1, replace(W1, n_layers=64), W2, replace(W2, dropout=0.0)))
# The same workloads at small sizes (`--quick`). W2 with 4 blocks, not 2: on 2 blocks sqrt(n) rounds to
# one segment (the whole stack recomputed at once), and every strategy needs a few blocks to mean something.
QUICK = Sizes(w1=replace(W1, n_layers=8), w1_depths=(8, 16), w2=replace(W2, n_layer=2), w2_blocks=(4,),
              w3=replace(W3, model=replace(W2, n_layer=2), splits=((32, 1), (8, 4), (2, 16))),
              compare=(replace(W1, n_layers=16), replace(W2, n_layer=2), replace(W2, n_layer=2, dropout=0.0)))
# Toy sizes for the test suite: seconds, and the figures mean nothing.
_TINY_GPT = GPTStack(n_layer=2, n_embd=16, n_head=2, seq=8, batch=2, vocab=16, dropout=0.1)
_TINY_MLP = DeepMLP(n_layers=4, width=32, batch=8)
TINY = Sizes(w1=_TINY_MLP, w1_depths=(2, 4), w2=_TINY_GPT, w2_blocks=(2,),
             w3=Accumulation(model=_TINY_GPT, effective_batch=4, splits=((4, 1), (2, 2), (1, 4))),
             compare=(_TINY_MLP, _TINY_GPT, replace(_TINY_GPT, dropout=0.0)))
SETS = {"full": FULL, "quick": QUICK, "tiny": TINY}
