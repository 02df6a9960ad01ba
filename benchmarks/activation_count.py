"""Does the analytic activation count match what the engine saves, on W1 and W2?

For one W1 layer (Linear + GELU), one W2 block (with and without dropout)
and the whole models, print the formula of tinygrad_ckpt/activations.py next
to memory.py's measurement (the rise of saved activations over one forward),
and, for the block, the published counts for comparison: Korthikanti et al.
(2022) for 16-bit activations with dropout, sbh(34 + 5as/h), and the fit of
PyTorch's measurement on W2 without dropout, 4(16sbh + as^2 b).

    python benchmarks/activation_count.py

Forward passes only: a few seconds.
"""

import os

# BLAS reads these when NumPy loads: set them before importing it.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")

import numpy  # noqa: E402

from tinygrad_ckpt import Tensor, activations, memory  # noqa: E402
from tinygrad_ckpt import functional as F  # noqa: E402
from tinygrad_ckpt.bench import workloads  # noqa: E402
from tinygrad_ckpt.nn.mlp import MLP  # noqa: E402
from tinygrad_ckpt.nn.transformer import GPT, GPTConfig, TransformerBlock  # noqa: E402

# -- configuration: the reference sizes (tinygrad_ckpt/bench/workloads.py) ----------
W1, W2 = workloads.W1, workloads.W2
W1_WIDTH, W1_BATCH, W1_DEPTHS = W1.width, W1.batch, workloads.W1_DEPTHS
W2_D_MODEL, W2_HEADS, W2_SEQ, W2_BATCH, W2_VOCAB, W2_BLOCKS = (W2.n_embd, W2.n_head, W2.seq, W2.batch, W2.vocab,
                                                               workloads.W2_BLOCKS)


def saved_by(forward):
    """Bytes of saved activations one forward leaves (its output kept meanwhile)."""
    before = memory.current()["activations"]
    out = forward()
    saved = memory.current()["activations"] - before
    del out
    return saved


def row(what, predicted, measured, *extra):
    mark = "exact" if predicted == measured else f"off by {measured - predicted} B"
    print(f"| {what} | {predicted:,} | {measured:,} | {mark} |" + "".join(f" {e} |" for e in extra))


def main():
    rng = numpy.random.default_rng(0)
    s, b, h, a = W2_SEQ, W2_BATCH, W2_D_MODEL, W2_HEADS
    print("| what | predicted bytes | measured bytes | | Korthikanti 16-bit | PyTorch fit, no dropout |")
    print("|---|---|---|---|---|---|")
    for dropout in (0.1, 0.0):
        block = TransformerBlock(GPTConfig(n_embd=h, n_head=a, dropout=dropout, block_size=s), rng=rng)
        x = Tensor(rng.standard_normal((b, s, h), dtype=numpy.float32), requires_grad=True)
        row(f"W2 block, dropout {dropout}", activations.gpt_block(s, b, h, a, dropout > 0), saved_by(lambda: block(x)),
            f"{activations.korthikanti_block(s, b, h, a):,}", f"{activations.pytorch_w2_block(s, b, h, a):,}")
    for n_layer in W2_BLOCKS:
        model = GPT(GPTConfig(block_size=s, vocab_size=W2_VOCAB, n_layer=n_layer, n_head=a, n_embd=h, dropout=0.1), rng=rng)
        idx = rng.integers(0, W2_VOCAB, (b, s))
        targets = rng.integers(0, W2_VOCAB, (b, s))
        row(f"W2 model, {n_layer} blocks", activations.gpt(n_layer, s, b, h, a, W2_VOCAB),
            saved_by(lambda: model(idx, targets)[1]), "", "")
    layer = MLP(W1_WIDTH, W1_WIDTH, W1_WIDTH, n_layers=1, rng=rng).blocks[0]
    x = Tensor(rng.standard_normal((W1_BATCH, W1_WIDTH), dtype=numpy.float32), requires_grad=True)
    row("W1 layer (Linear + GELU)", activations.mlp_layer(W1_BATCH, W1_WIDTH), saved_by(lambda: layer(x)), "", "")
    y = Tensor(rng.standard_normal((W1_BATCH, W1_WIDTH), dtype=numpy.float32))
    for depth in W1_DEPTHS:
        model = MLP(W1_WIDTH, W1_WIDTH, W1_WIDTH, n_layers=depth, rng=rng)
        row(f"W1 model, depth {depth}", activations.mlp(depth, W1_BATCH, W1_WIDTH),
            saved_by(lambda: F.mse_loss(model(x.detach()), y)), "", "")


if __name__ == "__main__":
    main()
