"""Does our autocast save what PyTorch's does? Saved bytes of one GPT step, ours and torch's, per precision.

W2 at 2 blocks without dropout (workloads.QUICK's, the model `bench --compare`
runs), the same weights in both libraries (compare.py's Ours and Torch
runners), one forward in float32, under bfloat16 autocast and under float16
autocast. Saved bytes are what the graph holds for backward at the end of
the forward, counted as compare.py counts them: ours from memory.py's
"activations" category, PyTorch's through saved_tensors_hooks (by storage,
parameters left out).

Three columns:
  ours          this engine under autocast.py, whose policy is the lists of
                the header PyTorch's CUDA autocast uses (aten/src/ATen/autocast_mode.h).
  torch cpu     torch.autocast("cpu", dtype): PyTorch's CPU lists, which
                differ from its CUDA ones; the op table printed first shows
                how, by running each op (this machine's PyTorch has no CUDA).
  torch, cuda lists   the same torch model with the CUDA lists' FLOAT32 entries
                this model meets written out as casts (softmax's input
                .float(), as autocast on CUDA casts it), still under CPU autocast.

    python benchmarks/mixed_precision_vs_torch.py      # about a minute on 2 cores; needs torch and ml_dtypes
"""

import os

# BLAS reads these when NumPy loads: set them before importing it.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")

from dataclasses import replace  # noqa: E402

from tinygrad_ckpt import autocast as amp  # noqa: E402
from tinygrad_ckpt.bench import compare, workloads  # noqa: E402
from tinygrad_ckpt.bench.report import MIB  # noqa: E402

import peers  # noqa: E402  (benchmarks/peers.py, beside this script: the peers' models)

# -- configuration ------------------------------------------------------------------------
SIZE = replace(workloads.W2, n_layer=2, dropout=0.0)
PRECISIONS = ("float32", "bfloat16", "float16")
# The ops this model runs, as torch names them, and the class of ours that runs each (autocast.py's policy).
OPS = (("linear", "Linear"), ("matmul", "MatMul"), ("layer_norm", "LayerNorm"), ("softmax", "Softmax"),
       ("gelu", "GELU"), ("cross_entropy", "CrossEntropy"), ("mean", "Mean"))


class OursAutocast(compare.Ours):
    """compare.py's runner for this engine, its forward under autocast(dtype) (float32: as it is)."""

    def __init__(self, precision):
        super().__init__("W2", SIZE, "float32", 0.0)
        self.precision = precision

    def forward(self):
        with amp.autocast(self.precision, enabled=self.precision != "float32"):
            return super().forward()


class TorchAutocast(peers.Torch):
    """peers.py's PyTorch runner, its forward under torch.autocast("cpu", dtype); cuda_lists: softmax in float32."""

    def __init__(self, weights, precision, cuda_lists=False):
        super().__init__("W2", SIZE, weights, "float32", 0.0)
        self.precision, self.cuda_lists = precision, cuda_lists
        if cuda_lists:
            self.torch = _SoftmaxInFloat32(self.torch)

    def forward(self):
        torch = self.torch
        dtype = getattr(torch, self.precision)
        with torch.autocast("cpu", dtype=dtype, enabled=self.precision != "float32"):
            return super().forward()


class _SoftmaxInFloat32:
    """The torch module, but softmax casts its input to float32 first, as CUDA autocast's FP32_SET_OPT_DTYPE list does."""

    def __init__(self, torch):
        self._torch = torch

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def softmax(self, x, dim):
        return self._torch.softmax(x.float(), dim=dim)


def torch_cpu_dtypes(torch, precision):
    """{torch op name: the dtype its output has} under torch.autocast("cpu"), each op given 16-bit inputs."""
    F = torch.nn.functional
    low = getattr(torch, precision)
    x, w = torch.randn(4, 8, dtype=low), torch.randn(8, 8)
    with torch.autocast("cpu", dtype=low):
        out = {"linear": F.linear(x.float(), w), "matmul": x.float() @ w, "layer_norm": F.layer_norm(x, (8,)),
               "softmax": torch.softmax(x, -1), "gelu": F.gelu(x),
               "cross_entropy": F.cross_entropy(x, torch.zeros(4, dtype=torch.long)), "mean": x.mean()}
    return {name: str(t.dtype).removeprefix("torch.") for name, t in out.items()}


def ours_dtype(op, precision):
    """The dtype autocast.py runs `op` (a class name) in, given 16-bit inputs."""
    low = amp.lower_dtype(precision)
    with amp.autocast(precision):
        dtype = amp.op_dtype(op, [low])
    return (dtype or low).name


def main():
    import torch

    print(f"torch {torch.__version__}; W2: {SIZE.n_layer} blocks, width {SIZE.n_embd}, {SIZE.n_head} heads, "
          f"sequence {SIZE.seq}, batch {SIZE.batch}, no dropout\n")
    print("The dtype each op's output has under autocast, its inputs 16-bit (linear, matmul: float32 inputs):")
    print(f"| op | {' | '.join(f'ours {p} | torch cpu {p}' for p in PRECISIONS[1:])} |")
    print("|---|" + "---|" * 2 * len(PRECISIONS[1:]))
    theirs = {p: torch_cpu_dtypes(torch, p) for p in PRECISIONS[1:]}
    for name, op in OPS:
        cells = [f"{ours_dtype(op, p)} | {theirs[p][name]}" for p in PRECISIONS[1:]]
        print(f"| {name} | {' | '.join(cells)} |")

    rows = []
    for precision in PRECISIONS:
        ours = OursAutocast(precision)
        weights = ours.weights()
        saved = {"ours": compare.memory_ours(ours)[0]}
        for label, cuda_lists in (("torch cpu", False), ("torch, cuda lists", True)):
            saved[label] = compare.memory_torch(TorchAutocast(weights, precision, cuda_lists))[0]
        rows.append((precision, saved))
        print(f"  measured {precision}", flush=True)

    print("\nSaved for backward at the end of the forward, bytes (x: over ours):")
    print("| precision | ours | torch cpu | torch, cuda lists |")
    print("|---|---|---|---|")
    for precision, saved in rows:
        o = saved["ours"]
        cells = [f"{saved[k]:,} ({saved[k] / o:.3f}x)" for k in ("torch cpu", "torch, cuda lists")]
        print(f"| {precision} | {o:,} ({o / MIB:.2f} MiB) | {' | '.join(cells)} |")

    B, T, nh, L = SIZE.batch, SIZE.seq, SIZE.n_head, SIZE.n_layer
    probs = L * B * nh * T * T  # the softmax outputs' elements, all blocks
    print(f"\nThe attention probabilities, (B, nh, T, T) per block: {probs:,} elements in all "
          f"({probs * 2 / MIB:.2f} MiB in 16 bits, {probs * 4 / MIB:.2f} MiB in float32).")
    base = rows[0][1]["ours"] - rows[0][1]["torch cpu"]  # what ours saves beyond torch without autocast
    print(f"float32: ours saves {base:,} bytes more than torch: small arrays of ours, in every precision (the "
          "position embedding's index array and cross-entropy's mask of the targets that count, 1,024 bytes each "
          "at this size, are among them).")
    for precision, saved in rows[1:]:
        extra, cuda = saved["ours"] - saved["torch cpu"], saved["ours"] - saved["torch, cuda lists"]
        print(f"{precision}: ours saves {extra:,} bytes more than torch cpu: {4 * probs:,} are 4 bytes per "
              "probability (ours keeps softmax's float32 output, 4 bytes, and the 16-bit copy the next matmul saves, "
              "2; torch cpu one 16-bit output that softmax and the matmul share, 2), and "
              f"{extra - 4 * probs:,} the small arrays. With softmax in float32 (the cuda lists): {cuda:,} bytes more.")
    print("\nlayer_norm differs in the op table but not here: its input is the float32 residual stream in both "
          "libraries (a float32 input plus a 16-bit one is float32), so it runs in float32 on either list. "
          "mean differs too, but this model takes no mean of its own (the loss is cross-entropy's, float32 in both).")

if __name__ == "__main__":
    main()
