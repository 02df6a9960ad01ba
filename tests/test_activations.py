"""The analytic activation counts (activations.py) against memory.py's measurement.

Each formula is compared, to the byte, with the rise of memory.py's
"activations" over a forward (and, for checkpointed chains, with the
highest point of the timeline over forward and backward). The measurement
and the formula are reached independently: one by weak references to live
buffers, the other by counting shapes by hand from the ops' documented saves.
"""

import numpy
import pytest

from tinygrad_ckpt import Tensor, activations, backend, memory, policies
import tinygrad_ckpt.functional as F
from tinygrad_ckpt.checkpoint import checkpoint_sequential
from tinygrad_ckpt.nn.mlp import MLP
from tinygrad_ckpt.nn.transformer import GPT, GPTConfig, TransformerBlock
from tinygrad_ckpt.schedules import revolve, segment_bounds

F32 = numpy.float32


def _saved_by_forward(fn):
    """Bytes of activations a forward leaves saved (fn's output kept alive meanwhile)."""
    before = memory.current()["activations"]
    out = fn()
    saved = memory.current()["activations"] - before
    del out
    return saved


def _peak_over_step(loss_fn):
    """Highest saved-activation bytes over one forward and backward (timeline points)."""
    before = memory.current()["activations"]
    with memory.timeline() as events:
        loss_fn().backward()
    return max(e["activations"] for e in events) - before


def _device():
    return backend.get_default_device()


# (s, b, h, a): a few small sizes, heads dividing h; s != hs so shapes cannot coincide
BLOCK_SIZES = [(8, 3, 16, 2), (16, 2, 32, 4), (5, 1, 12, 3)]


@pytest.mark.parametrize("s, b, h, a", BLOCK_SIZES)
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_one_transformer_block_saves_exactly_the_formula(s, b, h, a, dropout):
    rng = numpy.random.default_rng(0)
    block = TransformerBlock(GPTConfig(n_embd=h, n_head=a, dropout=dropout, block_size=s), rng=rng, device=_device())
    x = Tensor(rng.standard_normal((b, s, h), dtype=F32), requires_grad=True)
    assert _saved_by_forward(lambda: block(x)) == activations.gpt_block(s, b, h, a, dropout=dropout > 0)


def test_the_block_formula_next_to_the_published_counts():
    s, b, h, a = 128, 8, 256, 4  # W2
    sbh, as2b = s * b * h, a * s * s * b
    # Without dropout: PyTorch's 4(16sbh + as^2 b), plus two layer norms' mean
    # and rstd (2 x 8sb), the causal mask (s^2 bools) and the 0-d scale (4 B).
    assert activations.gpt_block(s, b, h, a, dropout=False) == activations.pytorch_w2_block(s, b, h, a) + 16 * s * b + s * s + 4
    # With dropout: Korthikanti et al.'s 16-bit count doubled, except that the
    # three masks stay 1 byte per element (2sbh + as^2 b less than doubling).
    doubled = 2 * activations.korthikanti_block(s, b, h, a) - 2 * sbh - as2b
    assert activations.gpt_block(s, b, h, a, dropout=True) == doubled + 16 * s * b + s * s + 4


@pytest.mark.parametrize("b, h", [(4, 8), (5, 16), (3, 33)])
def test_one_mlp_layer_saves_8bh(b, h):
    rng = numpy.random.default_rng(1)
    layer = MLP(h, h, h, n_layers=1, rng=rng, device=_device()).blocks[0]  # Linear + GELU
    x = Tensor(rng.standard_normal((b, h), dtype=F32), requires_grad=True)
    assert _saved_by_forward(lambda: layer(x)) == activations.mlp_layer(b, h) == 8 * b * h


@pytest.mark.parametrize("n_layers", [1, 3])
def test_the_whole_mlp_with_its_loss(n_layers):
    rng = numpy.random.default_rng(2)
    b, h = 4, 16
    model = MLP(h, h, h, n_layers=n_layers, rng=rng, device=_device())
    x, y = (Tensor(rng.standard_normal((b, h), dtype=F32)) for _ in range(2))
    assert _saved_by_forward(lambda: F.mse_loss(model(x), y)) == activations.mlp(n_layers, b, h)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_the_whole_gpt_with_its_loss(dropout):
    rng = numpy.random.default_rng(3)
    L, s, b, h, a, V = 2, 16, 4, 32, 2, 32
    model = GPT(GPTConfig(block_size=s, vocab_size=V, n_layer=L, n_head=a, n_embd=h, dropout=dropout), rng=rng, device=_device())
    idx = Tensor(rng.integers(0, V, (b, s)))
    targets = rng.integers(0, V, (b, s))
    measured = _saved_by_forward(lambda: model(idx, targets)[1])
    assert measured == activations.gpt(L, s, b, h, a, V, dropout=dropout > 0)


@pytest.mark.parametrize("segments", [None, "every", "sqrt", 2, [(0, 2, True), (2, 4, False), (4, 6, True)],
                                      revolve(6, 0), revolve(6, 1)])
def test_checkpointed_mlp_chain_peak_is_predicted_exactly(segments):
    rng = numpy.random.default_rng(4)
    n, b, h = 6, 4, 16
    model = MLP(h, h, h, n_layers=n, rng=rng, device=_device())
    x, y = (Tensor(rng.standard_normal((b, h), dtype=F32)) for _ in range(2))

    def loss():
        out = model.blocks(x) if segments is None else checkpoint_sequential(list(model.blocks), segments, x)
        return F.mse_loss(model.head(out), y)

    bounds = segment_bounds(n, segments) if segments is not None else [(0, n, False)]
    inputs, held = [4 * b * h] * n, [activations.mlp_layer(b, h)] * n
    after = 4 * b * h + 4 * b * h  # the head's input and the loss's difference
    assert _peak_over_step(loss) == activations.chain_peak(0, inputs, held, after, bounds)


@pytest.mark.parametrize("strategy", ["none", "every", "sqrt", "selective", "halves", "selective halves"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_checkpointed_gpt_peak_is_predicted_exactly(strategy, dropout):
    rng = numpy.random.default_rng(5)
    L, s, b, h, a, V = 3, 16, 2, 32, 2, 32
    model = GPT(GPTConfig(block_size=s, vocab_size=V, n_layer=L, n_head=a, n_embd=h, dropout=dropout), rng=rng, device=_device())
    xp = backend.module_for(_device())
    idx, targets = xp.asarray(rng.integers(0, V, (b, s))), xp.asarray(rng.integers(0, V, (b, s)))
    segments = None if strategy == "none" else "sqrt" if strategy == "sqrt" else "every"
    policy = policies.selective_attention if strategy.startswith("selective") else None
    halves = strategy.endswith("halves")
    if halves:  # the chain GPT.checkpoint_chain() gives with split_blocks=True
        chain = [f for blk in model.blocks for f in (blk.attention_sublayer, blk.feed_forward_sublayer)]
    else:
        chain = list(model.blocks)

    def loss():  # GPT.forward, with its blocks run through checkpoint_sequential
        x = model.drop(model.wte(idx) + model.wpe(xp.arange(s)))
        x = model.blocks(x) if segments is None else checkpoint_sequential(chain, segments, x, policy=policy)
        return F.cross_entropy(model.lm_head(model.ln_f(x)), targets)

    d = dropout > 0
    if halves:
        per_half = [activations.gpt_attention_sublayer(s, b, h, a, d), activations.gpt_feed_forward_sublayer(s, b, h, d)]
        held = per_half * L
        inputs = [4 * s * b * h] * 2 * L
        if policy is not None:  # each half keeps its Linear outputs, and holds its c_proj output in the replay
            inputs = [i + activations.selective_kept_sublayers(s, b, h)[k % 2] for k, i in enumerate(inputs)]
            held = [k + activations.selective_extra(s, b, h) // 2 for k in held]
    else:
        inputs, held = [4 * s * b * h] * L, [activations.gpt_block(s, b, h, a, d)] * L
        if policy is not None:
            inputs = [i + activations.selective_kept(s, b, h) for i in inputs]
            held = [k + activations.selective_extra(s, b, h) for k in held]
    bounds = segment_bounds(len(chain), segments) if segments is not None else [(0, len(chain), False)]
    predicted = activations.chain_peak(activations.gpt_embedding(s, b, h, d), inputs, held, activations.gpt_head(s, b, h, V), bounds)
    assert _peak_over_step(loss) == predicted
