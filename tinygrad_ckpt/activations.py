"""The analytic count: how many bytes a layer saves for backward, as a formula.

The formulas here are derived op by op from what each op of this engine
saves (ops/, each op's docstring), so they can be checked against
memory.py's measurement to the byte (tests/test_activations.py does), and
the benchmarks print them beside the measured figures.

Names, as in Korthikanti et al. (2022), "Reducing Activation Recomputation
in Large Transformer Models": s sequence length, b batch, h hidden width
(d_model), a attention heads. Every float array here is float32 (4 bytes;
the GPT's formulas take `itemsize=8` for float64); dropout masks and the
causal mask are bool (1 byte per element), token ids and positions int64.

The transformer block, with dropout (what Korthikanti et al. count as
sbh(34 + 5as/h) for 16-bit activations) is, on this engine in float32,

    66 sbh + 9 as^2 b + 16 sb + s^2 + 4        bytes per block,

and without dropout 64 sbh + 4 as^2 b + 16 sb + s^2 + 4, that is
4(16 sbh + as^2 b) (what PyTorch measures on W2 without dropout) plus the
layer norms' per-row statistics, the causal mask and one scalar. The
derivation is in `gpt_block`, line by line.

Why this sits beside the techniques and not among the instruments (bench/):
the formulas are the theory of what checkpointing saves, which tutorial 6
teaches and the tests check against memory.py's count; the bench only
prints them beside its measurements.

What does not live here: measuring (memory.py, saved.py), the cost model a
checkpoint planner uses for measured layers (schedules.py), the rest of a
training step's memory (fit/, which runs the step on the meta device).
"""

from .schedules import LayerCost, walk  # the one cost model: formulas in, bytes out

F32 = 4  # bytes per float32 element
BOOL = 1  # bytes per bool element (dropout masks, the causal mask)
INT64 = 8  # bytes per token id (NumPy's default integer)


# -- W1: the MLP -----------------------------------------------------------------
def mlp_layer(b, h):
    """Bytes one Linear(h, h) + GELU layer saves for a batch of b rows.

        Linear  saves its input x (b, h) for dweight        4bh
                and its weight: a parameter, not an activation
        GELU    saves its input, Linear's output (b, h)      4bh
                                                     total   8bh
    """
    return 2 * F32 * b * h


def mlp(n_layers, b, h):
    """Bytes the whole W1 model (n_layers of Linear + GELU, a Linear head, MSE) saves.

    The first Linear saves the batch itself (4bh: memory.py counts it while
    it is saved); then n_layers layers of 8bh (the first layer's 4bh input
    included), the head's input 4bh, and the MSE loss's (pred - target),
    saved by the square, 4bh (Sub and Mean save nothing).
    """
    return n_layers * mlp_layer(b, h) + F32 * b * h + F32 * b * h


# -- W2: the GPT block -------------------------------------------------------------
def gpt_block(s, b, h, a, dropout=True, itemsize=F32):
    """Bytes one pre-LayerNorm transformer block saves for backward (see the module docstring).

    Per op, in forward order (nn/transformer.py), bytes:
        ln_1 (LayerNorm)   its input x                 4sbh
                           mean and rstd per row       8sb
        c_attn (Linear)    its input ln_1(x)           4sbh
        q @ k^T (MatMul)   q and k: views of the (b, s, 3h) qkv buffer,
                           charged once, whole         12sbh (v included)
        * 1/sqrt(hs) (Mul) the scalar, a 0-d array     4
        masked_fill        the causal mask (s, s)      s^2
        softmax            its output (b, a, s, s)     4as^2b
        attn_dropout       its mask                    as^2b       (dropout)
        att @ v (MatMul)   att: the dropout's output   4as^2b      (dropout; else
                           softmax's output, shared)
                           v: in the qkv buffer        0
        reshape            y (transposed heads) is copied: saves nothing
        c_proj (Linear)    its input y                 4sbh
        resid_dropout      its mask                    sbh         (dropout)
        + (Add)            nothing
        ln_2               its input, mean, rstd       4sbh + 8sb
        c_fc (Linear)      its input ln_2(x)           4sbh
        GELU               its input (b, s, 4h)        16sbh
        c_proj (Linear)    its input GELU(..)          16sbh
        dropout            its mask                    sbh         (dropout)
        + (Add)            nothing
    """
    return gpt_attention_sublayer(s, b, h, a, dropout, itemsize) + gpt_feed_forward_sublayer(s, b, h, dropout, itemsize)


def gpt_attention_sublayer(s, b, h, a, dropout=True, itemsize=F32):
    """The block's first half, x + attn(ln_1(x)): ln_1 down to resid_dropout above."""
    f, sbh, as2b = itemsize, s * b * h, a * s * s * b
    layer_norm = f * sbh + 2 * f * s * b
    attention = f * sbh + 3 * f * sbh + f + BOOL * s * s + f * as2b + f * sbh
    if dropout:
        attention += BOOL * as2b + f * as2b + BOOL * sbh
    return layer_norm + attention


def gpt_feed_forward_sublayer(s, b, h, dropout=True, itemsize=F32):
    """The block's second half, x + mlp(ln_2(x)): ln_2 down to the last dropout above."""
    f, sbh = itemsize, s * b * h
    layer_norm = f * sbh + 2 * f * s * b
    feed_forward = f * sbh + 4 * f * sbh + 4 * f * sbh
    if dropout:
        feed_forward += BOOL * sbh
    return layer_norm + feed_forward


def korthikanti_block(s, b, h, a):
    """Korthikanti et al.'s count for 16-bit activations with dropout: sbh(34 + 5as/h)."""
    return s * b * h * 34 + 5 * a * s * s * b


def pytorch_w2_block(s, b, h, a):
    """The fit of PyTorch's measurement on W2 without dropout: 4(16sbh + as^2 b)."""
    return 4 * (16 * s * b * h + a * s * s * b)


def gpt_embedding(s, b, h, dropout=True):
    """Bytes saved before the blocks: token ids (8sb), positions (8s), the dropout mask (sbh)."""
    return INT64 * s * b + INT64 * s + (BOOL * s * b * h if dropout else 0)


def gpt_head(s, b, h, vocab, itemsize=F32):
    """Bytes saved after the blocks: ln_f, lm_head's input, and cross-entropy.

        ln_f            input 4sbh, mean and rstd 8sb
        lm_head         its input 4sbh (the tied weight is a parameter)
        cross_entropy   log-probabilities 4sb*vocab, clamped targets 8sb, valid mask sb
    """
    f = itemsize
    return f * s * b * h + 2 * f * s * b + f * s * b * h + f * s * b * vocab + INT64 * s * b + BOOL * s * b


def gpt(n_layer, s, b, h, a, vocab, dropout=True, itemsize=F32):
    """Bytes the whole W2 model saves for backward (no checkpointing)."""
    return (gpt_embedding(s, b, h, dropout) + n_layer * gpt_block(s, b, h, a, dropout, itemsize)
            + gpt_head(s, b, h, vocab, itemsize))


def gpt_chain(n_layer, s, b, h, a, dropout=True, split_blocks=False, selective=False, itemsize=F32):
    """(inputs, held) per layer of the chain a checkpointed GPT runs, for chain_peak and a planner.

    The chain is GPT.checkpoint_chain(): the blocks, or (split_blocks) their
    halves. inputs[i]: what a checkpoint starting at layer i saves, its input
    (B, T, C), and with the selective policy also its Linear outputs (kept
    from the forward); held[i]: what layer i holds when run normally, with the
    selective policy also the c_proj output its replay holds until its
    backward ends. With the selective policy this holds for segments of one
    layer each ('every'): a longer segment keeps all its layers' Linear
    outputs from its start, which a per-layer cost cannot say
    (fit.gpt_step runs any plan).
    """
    x = itemsize * s * b * h
    if split_blocks:
        held = [gpt_attention_sublayer(s, b, h, a, dropout, itemsize),
                gpt_feed_forward_sublayer(s, b, h, dropout, itemsize)]
        kept, extra = selective_kept_sublayers(s, b, h, itemsize), selective_extra(s, b, h, itemsize) // 2
    else:
        held = [gpt_block(s, b, h, a, dropout, itemsize)]
        kept, extra = [selective_kept(s, b, h, itemsize)], selective_extra(s, b, h, itemsize)
    n, k = n_layer * len(held), len(held)
    inputs = [x + (kept[i % k] if selective else 0) for i in range(n)]
    return inputs, [held[i % k] + (extra if selective else 0) for i in range(n)]


def selective_kept(s, b, h, itemsize=F32):
    """Bytes policies.selective_attention keeps per checkpointed block: the Linear outputs.

        qkv 12sbh + attention c_proj 4sbh + c_fc 16sbh + feed-forward c_proj 4sbh = 36sbh
    (the Linears' inputs are the segment's own arrays, and their weights parameters,
    so nothing else is kept). They wait, with the block's input, for backward.
    """
    return sum(selective_kept_sublayers(s, b, h, itemsize))


def selective_kept_sublayers(s, b, h, itemsize=F32):
    """The same, per half of a block: (attention: qkv + c_proj 16sbh, feed-forward: c_fc + c_proj 20sbh)."""
    return 4 * itemsize * s * b * h, 5 * itemsize * s * b * h


def selective_extra(s, b, h, itemsize=F32):
    """Bytes a selectively recomputed block holds beyond a plain one: the two c_proj outputs.

    A plain block saves neither (dropout keeps a mask, the residual add
    nothing); the replay holds them, 4sbh each, until the block's backward ends
    (with split blocks, each half holds its own one until its backward ends).
    """
    return 2 * itemsize * s * b * h


# -- a checkpointed chain ------------------------------------------------------------
def chain_peak(before, inputs, held, after, segments):
    """Predicted peak of saved activations of a chain cut into segments.

    before: bytes saved ahead of the chain (kept until the end of backward);
    inputs[i]: bytes of layer i's input buffer; held[i]: bytes layer i keeps
    when run normally (its input included, as every layer here saves it);
    after: bytes saved behind the chain (freed as backward starts);
    segments: as schedules.segment_bounds gives them, nested ones included.

    The chain itself is walked by schedules.py's cost model, with these
    formulas for the sizes: a checkpointed segment holds its input until
    backward reaches it, then recomputes and holds its layers' bytes; later
    segments are freed by then, earlier ones are not.
    """
    costs = [LayerCost(f"{i}", i_bytes, h_bytes - i_bytes, True, i_bytes) for i, (i_bytes, h_bytes)
             in enumerate(zip(inputs, held))]
    held_at_end, recompute_peak, _ = walk(costs, segments)
    return max(before + recompute_peak, before + held_at_end + after)  # in a recompute, or at the end of the forward
