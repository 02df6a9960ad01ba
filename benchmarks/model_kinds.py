"""For each model kind, what does checkpointing save and cost?

The CNN on images, the LSTM language model, the encoder (BERT's kind) and
the GPT, each with no checkpointing, with every link of its chain
checkpointed (a CNN stage, an LSTM time step, a transformer block) and with
sqrt(n) segments: part 1 on real arrays at two sizes a kind (saved
activations, step peak, the meta device's figures beside them, CPU time,
FLOPs), part 2 at full sizes on the meta device (a CNN at 224 x 224, an
LSTM over 1024 steps, a BERT-base-sized encoder over 512 tokens, GPT-2
medium over 1024: the largest micro-batch that fits a 16 GB V100). The
measuring is tinygrad_ckpt/bench/kinds.py, whose docstring defines every
column; `tinygrad-ckpt bench --kinds` runs the same and writes kinds.md and
kinds.json. This script runs the full set with BLAS on THREADS threads (set
before NumPy loads), the setting benchmarks/README.md's figures were taken with.

    python benchmarks/model_kinds.py                 # 12 minutes on 2 cores at load average 6 (2026-12-02)
    python benchmarks/model_kinds.py --kinds LSTM    # one kind, or several
"""

import argparse
import os

THREADS = "1"  # a shared 2-core machine: one BLAS thread is the steadier (benchmarks/README.md)
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = THREADS

from tinygrad_ckpt.bench import kinds  # noqa: E402

REPEATS = 5  # timed steps per strategy, after one warm-up


def say(line):
    print(line, flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description="For each model kind, what does checkpointing save and cost?")
    parser.add_argument("--kinds", nargs="+", choices=kinds.KINDS, default=list(kinds.KINDS), metavar="KIND",
                        help=f"the kinds to measure, of {', '.join(kinds.KINDS)} (default: all)")
    chosen = parser.parse_args(argv).kinds
    measured, full, budget = kinds.SETS["full"]
    print(f"{os.cpu_count()} CPUs, load average at the start {os.getloadavg()[0]:.1f}; BLAS {THREADS} thread(s)")
    kinds.part1([s for s in measured if s.kind in chosen], REPEATS, say)
    print()
    kinds.part2([s for s in full if s.kind in chosen], budget, say)
    print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
