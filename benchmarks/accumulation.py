"""Does gradient accumulation keep memory at micro-batch size, and what does it cost? (W3)

The W2 model with 4 blocks, one effective batch of 32 sequences, split into
micro-batch x steps = 32 x 1, 16 x 2, 8 x 4, 4 x 8, 2 x 16. For each split:
the peak of live memory by category over one optimizer step, the peak of
saved activations beside the analytic count for one micro-batch, the step
time as a ratio to 32 x 1 (median of 5 after a warm-up), and the largest
gradient difference from 32 x 1 (dropout off for that check), relative to
the largest gradient.

    python benchmarks/accumulation.py

About ten minutes on 2 busy cores; `tinygrad-ckpt bench` runs the same rows.
"""

import os

# BLAS reads these when NumPy loads: set them before importing it.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")

from dataclasses import replace  # noqa: E402

from tinygrad_ckpt.bench import strategies, workloads  # noqa: E402

# -- configuration: W3 as tinygrad_ckpt/bench/workloads.py defines it ---------------
CONFIG = replace(strategies.FULL, sizes=replace(workloads.FULL, w3=workloads.W3), repeats=5)


def main():
    rows = strategies.bench_w3(CONFIG, lambda what, count=True: print(what, flush=True))
    print(strategies.table(rows, "W3: accumulation (micro-batch x steps)", "blocks", {rows[0]["size"]: rows[0]},
                      ("max grad diff", lambda r: f"{r['max_grad_difference']:.1e}")))


if __name__ == "__main__":
    main()
