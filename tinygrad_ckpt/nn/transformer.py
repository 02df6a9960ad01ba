"""A GPT (decoder-only transformer), written after nanoGPT's model.py.

The reference workload W2 is a stack of these (bench/workloads.py). The
pieces, from the inside out:

    CausalSelfAttention  each position attends to itself and earlier positions
    FeedForward          Linear(C, 4C) -> GELU -> Linear(4C, C)
    TransformerBlock     pre-LayerNorm: x + attn(ln_1(x)), then x + mlp(ln_2(x))
    GPT                  token + position embeddings -> blocks -> LayerNorm -> lm_head

Shapes use nanoGPT's names: B batch, T sequence length (time), C embedding
width (n_embd), nh heads, hs = C / nh the width of one head.

Initialisation is GPT-2's: weights N(0, 0.02^2), biases zero, and the two
projections that write into the residual stream (attention's and the
feed-forward's c_proj) N(0, (0.02 / sqrt(2 n_layer))^2), so the residual
stream's variance does not grow with depth.

`model.gradient_checkpointing_enable()` (Hugging Face's name; the switch is
checkpoint.ChainCheckpointing) makes forward run the blocks through
checkpoint_sequential: each block (by default) keeps
only its input, (B, T, C), and is recomputed in backward. With
split_blocks=True the chain is the blocks' halves instead (attention, then
feed-forward, each with its residual add): a recompute then holds half a
block's inside at a time, which lowers the peak, most of all with a
selective policy, whose block recompute would otherwise hold both halves.

The encoder (encoder.py) is these blocks with causal=False: attention
without the mask, as in BERT.

What does not live here: the layers (layers.py), checkpointing (checkpoint.py),
the training loop (train.py), the encoder (encoder.py).
"""

import math
from dataclasses import dataclass

import numpy

from .. import backend, random
from .. import functional as F
from ..checkpoint import ChainCheckpointing
from ..tape import no_grad
from ..tensor import Tensor
from .layers import GELU, Dropout, Embedding, LayerNorm, Linear, Sequential
from .module import Module


@dataclass
class GPTConfig:
    block_size: int = 128  # longest sequence (context length) the position embedding covers
    vocab_size: int = 256  # number of token ids (256: one per byte)
    n_layer: int = 4  # number of transformer blocks
    n_head: int = 4  # attention heads per block; must divide n_embd
    n_embd: int = 256  # embedding width C, the residual stream's width
    dropout: float = 0.1  # dropout probability on embeddings, attention weights and residual branches
    bias: bool = True  # biases in the Linear and LayerNorm layers (GPT-2 has them)
    tie_weights: bool = True  # lm_head shares the token embedding matrix (GPT-2 does)


class CausalSelfAttention(Module):
    """Multi-head self-attention where position t sees only positions <= t.

    causal=False: every position sees every position, as in BERT's encoder (encoder.py).
    """

    def __init__(self, config, rng=None, dtype=numpy.float32, device=None, causal=True):
        super().__init__()
        if config.n_embd % config.n_head != 0:
            raise ValueError(f"n_embd ({config.n_embd}) must be divisible by n_head ({config.n_head})")
        init = random.generator(rng)
        C = config.n_embd
        # q, k and v for all heads in one matmul
        self.c_attn = Linear(C, 3 * C, bias=config.bias, dtype=dtype, device=device, rng=init, init_std=0.02)
        self.c_proj = Linear(C, C, bias=config.bias, dtype=dtype, device=device, rng=init,
                             init_std=0.02 / math.sqrt(2 * config.n_layer))
        self.attn_dropout = Dropout(config.dropout, rng=rng)
        self.resid_dropout = Dropout(config.dropout, rng=rng)
        self.n_head, self.n_embd, self.causal = config.n_head, C, causal

    def forward(self, x):
        B, T, C = x.shape  # batch, sequence length, embedding width
        nh, hs = self.n_head, C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)  # (B, T, 3C) -> three views (B, T, C)
        q = q.reshape(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.reshape(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.reshape(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)

        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, T)
        if self.causal:
            xp = backend.module_of(x.data)
            future = xp.triu(xp.ones((T, T), dtype=bool), k=1)  # (T, T): True where key position > query position
            att = att.masked_fill(future, float("-inf"))
        att = att.softmax(axis=-1)  # each row: weights over the positions it may see
        att = self.attn_dropout(att)
        y = att @ v  # (B, nh, T, T) @ (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, C)  # heads side by side again: (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class FeedForward(Module):
    """The block's MLP: Linear(C, 4C) -> GELU -> Linear(4C, C) -> dropout."""

    def __init__(self, config, rng=None, dtype=numpy.float32, device=None):
        super().__init__()
        init = random.generator(rng)
        C = config.n_embd
        self.c_fc = Linear(C, 4 * C, bias=config.bias, dtype=dtype, device=device, rng=init, init_std=0.02)
        self.gelu = GELU(approximate="tanh")  # GPT-2's form, not PyTorch's default (erf)
        self.c_proj = Linear(4 * C, C, bias=config.bias, dtype=dtype, device=device, rng=init,
                             init_std=0.02 / math.sqrt(2 * config.n_layer))
        self.dropout = Dropout(config.dropout, rng=rng)

    def forward(self, x):
        # (B, T, C) -> (B, T, 4C) -> (B, T, C)
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class TransformerBlock(Module):
    """Pre-LayerNorm block: attention, then feed-forward, each added to the residual stream.

    causal=False: attention without the mask (the encoder's blocks, encoder.py).
    """

    def __init__(self, config, rng=None, dtype=numpy.float32, device=None, causal=True):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias, dtype=dtype, device=device)
        self.attn = CausalSelfAttention(config, rng=rng, dtype=dtype, device=device, causal=causal)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias, dtype=dtype, device=device)
        self.mlp = FeedForward(config, rng=rng, dtype=dtype, device=device)

    def forward(self, x):
        x = self.attention_sublayer(x)  # x + attn(ln_1(x))
        x = self.feed_forward_sublayer(x)  # x + mlp(ln_2(x))
        return x

    # The two halves are methods of their own so that checkpointing can cut
    # a block between them (GPT.gradient_checkpointing_enable(split_blocks=True)).
    def attention_sublayer(self, x):
        return x + self.attn(self.ln_1(x))  # (B, T, C)

    def feed_forward_sublayer(self, x):
        return x + self.mlp(self.ln_2(x))  # (B, T, C)


class GPT(ChainCheckpointing, Module):
    """Token ids (B, T) -> next-token logits (B, T, vocab_size), and the loss if targets are given.

    `rng` draws the initial weights and, if given, the dropout masks (the
    package's default generator when None).
    """

    checkpoint_split_blocks = False  # set by gradient_checkpointing_enable(split_blocks=True)

    def __init__(self, config, rng=None, dtype=numpy.float32, device=None):
        super().__init__()
        self.config = config
        init = random.generator(rng)
        C = config.n_embd
        self.wte = Embedding(config.vocab_size, C, dtype=dtype, device=device, rng=init, init_std=0.02)  # token embedding
        self.wpe = Embedding(config.block_size, C, dtype=dtype, device=device, rng=init, init_std=0.02)  # position embedding
        self.drop = Dropout(config.dropout, rng=rng)
        self.blocks = Sequential(*[TransformerBlock(config, rng=rng, dtype=dtype, device=device) for _ in range(config.n_layer)])
        self.ln_f = LayerNorm(C, bias=config.bias, dtype=dtype, device=device)
        self.lm_head = Linear(C, config.vocab_size, bias=False, dtype=dtype, device=device, rng=init, init_std=0.02)
        if config.tie_weights:
            # One matrix both reads tokens in and scores them out; it is found
            # (and saved, and updated) once, under its first name, wte.weight.
            self.lm_head.weight = self.wte.weight

    def gradient_checkpointing_enable(self, segments="every", policy=None, split_blocks=False,
                                      gradient_checkpointing_kwargs=None, **checkpoint_options):
        """Checkpoint the blocks: segments 'every' (one per block), 'sqrt', an int,
        boundaries or a schedules.Plan (see checkpoint_sequential); policy: see
        policies.py, a callable or a name (policies.selective_attention,
        'selective_attention', recomputes only the attention core and the elementwise ops).
        split_blocks: the chain is the blocks' halves (2 n_layer of them; segments count halves).
        gradient_checkpointing_kwargs and keywords: these again, and checkpoint()'s own
        (use_reentrant=False, preserve_rng_state, ...), as ChainCheckpointing's.
        A bad value is an error here, not in forward, and changes nothing."""
        kwargs = self._checkpointing_kwargs(segments, gradient_checkpointing_kwargs, checkpoint_options)
        segments, policy = kwargs.pop("segments", segments), kwargs.pop("policy", policy)
        split_blocks = kwargs.pop("split_blocks", split_blocks)
        if not isinstance(split_blocks, (bool, numpy.bool_)):
            raise TypeError(f"split_blocks must be True or False, got {split_blocks!r}")
        self._set_checkpointing(len(self.blocks) * (2 if split_blocks else 1), segments, policy, kwargs)
        self.checkpoint_split_blocks = bool(split_blocks)

    def gradient_checkpointing_disable(self):
        super().gradient_checkpointing_disable()
        self.checkpoint_split_blocks = False

    def checkpoint_chain(self):
        """The layers checkpoint_sequential runs: the blocks, or their halves with split_blocks."""
        if not self.checkpoint_split_blocks:
            return list(self.blocks)
        return [half for block in self.blocks for half in (block.attention_sublayer, block.feed_forward_sublayer)]

    def forward(self, idx, targets=None):
        """idx, targets: integer (B, T) (arrays or Tensors); targets of -100 are ignored.

        Returns (logits (B, T, vocab_size), mean cross-entropy loss or None).
        """
        idx = idx.data if isinstance(idx, Tensor) else idx
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"GPT: sequence of length {T} is longer than block_size {self.config.block_size}")
        pos = backend.module_for(self.wpe.weight.device).arange(T)  # (T,)
        tok_emb = self.wte(idx)  # (B, T, C)
        pos_emb = self.wpe(pos)  # (T, C), broadcast over the batch
        x = self.drop(tok_emb + pos_emb)  # (B, T, C)
        x = self.run_chain(x)  # the blocks, checkpointed if switched on: (B, T, C)
        x = self.ln_f(x)
        logits = self.lm_head(x)  # (B, T, vocab_size)
        if targets is None:
            return logits, None
        targets = targets.data if isinstance(targets, Tensor) else targets
        loss = F.cross_entropy(logits, backend.to_device(targets, logits.device), ignore_index=-100)
        return logits, loss

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, rng=None):
        """Extend idx (B, T) by max_new_tokens sampled tokens; returns a NumPy (B, T + max_new_tokens).

        Runs without recording. Call model.eval() first (dropout stays on in
        training mode, as in nanoGPT). Sampling happens on the host: one small
        device-to-host copy of the last position's logits per token.
        """
        weight = self.lm_head.weight
        if not backend.holds_values(weight.device):  # sampling reads the logits' values
            raise backend.no_values("generate()", weight.data)
        rng = random.generator(rng)
        idx = backend.to_host(idx.data if isinstance(idx, Tensor) else idx)
        with no_grad():
            for _ in range(max_new_tokens):
                context = idx[:, -self.config.block_size:]  # crop to the last block_size tokens
                logits, _ = self(context)
                logits = backend.to_host(logits.data[:, -1, :]).astype(numpy.float64) / temperature  # (B, vocab)
                if top_k is not None:
                    kth = numpy.sort(logits, axis=-1)[:, -min(top_k, logits.shape[-1])][:, None]
                    logits = numpy.where(logits < kth, -numpy.inf, logits)
                probs = numpy.exp(logits - logits.max(axis=-1, keepdims=True))
                probs /= probs.sum(axis=-1, keepdims=True)
                u = rng.random((len(probs), 1))  # inverse-CDF sampling, one uniform per row
                next_token = (probs.cumsum(axis=-1) < u).sum(axis=-1)  # (B,)
                next_token = numpy.minimum(next_token, probs.shape[-1] - 1)  # guard against rounding at 1.0
                idx = numpy.concatenate([idx, next_token[:, None].astype(idx.dtype)], axis=1)
        return idx
