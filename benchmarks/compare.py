"""How does this engine compare with PyTorch, HIPS autograd and mygrad on W1 and W2?

The same models, the same initial weights, float32, 2 threads each: step time
(forward + backward), bytes saved for backward, and the step's peak memory,
without checkpointing, with a checkpoint every layer (block), and with
sqrt(n) segments. Every library's loss and gradients are first checked
against ours in float64. See tinygrad_ckpt/bench/compare.py for how each
figure is measured.

    pip install -e '.[compare]'                                    # autograd, mygrad, threadpoolctl
    pip install torch --index-url https://download.pytorch.org/whl/cpu   # PyTorch, CPU build
    python benchmarks/compare.py                # all installed peers (a missing one is reported)
    python benchmarks/compare.py --workloads W1 --strategies none

About three minutes on 2 quiet cores (measured). Timings need a quiet machine: the run
prints the load average, and on a busy one BLAS's and PyTorch's waiting
threads slow every library, unevenly.
"""

import os

# BLAS reads these when NumPy loads: set them before importing it.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
os.environ.setdefault("MKL_NUM_THREADS", "2")

import argparse  # noqa: E402

from tinygrad_ckpt.bench import compare, workloads  # noqa: E402

# -- configuration: W1 (32 layers) and W2 (4 blocks), tinygrad_ckpt/bench/workloads.py -------
W1, W2 = workloads.W1, workloads.W2
STRATEGIES = ("none", "every", "sqrt")
REPEATS = 5  # timed steps per row, after one warm-up
THREADS = 2


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="W1,W2")
    parser.add_argument("--libraries", default=",".join(compare.LIBRARIES))
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--no-check", action="store_true", help="skip the float64 agreement check")
    args = parser.parse_args(argv)
    sizes = {"W1": W1, "W2": W2}
    workloads = {w: sizes[w] for w in args.workloads.split(",")}
    rows, notes = compare.compare(workloads, args.libraries.split(","), tuple(args.strategies.split(",")),
                                  repeats=args.repeats, threads=THREADS, check=not args.no_check,
                                  progress=lambda what: print(what, flush=True))
    print(compare.report(rows, notes))


if __name__ == "__main__":
    main()
