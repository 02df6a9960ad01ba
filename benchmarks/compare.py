"""How does this engine compare with PyTorch, HIPS autograd and mygrad on W1 and W2, and with the floor?

The same models, the same initial weights, float32, 2 threads each: step time
(forward + backward), bytes saved for backward, and the step's peak memory,
without checkpointing, with a checkpoint every layer (block), and with
sqrt(n) segments; beside them the floor, the step's matrix products alone
on bare NumPy, timed in the same rounds. W1 at 16, 32 and 64 layers, W2
with 4 blocks at dropout 0.1 and 0 (workloads.FULL.compare). Every
library's loss and gradients are first checked against ours in float64.
See tinygrad_ckpt/bench/compare.py for how each figure is measured.

    pip install -e '.[compare]'                                    # autograd, mygrad, threadpoolctl
    pip install torch --index-url https://download.pytorch.org/whl/cpu   # PyTorch, CPU build
    python benchmarks/compare.py                # all installed peers (a missing one is reported)
    python benchmarks/compare.py --quick        # W1 N=16, W2 L=2 (workloads.QUICK.compare)
    python benchmarks/compare.py --workloads W2 --strategies none
    python benchmarks/compare.py --keep-freed-memory   # glibc keeps freed memory (tinygrad_ckpt/allocator.py)

Timings need a quiet machine: the run prints the load average, warns when it
rose above half the CPUs, and on a busy one BLAS's and PyTorch's waiting
threads slow every library, unevenly. The run says how long it took.
"""

import os

# BLAS reads these when NumPy loads: set them before importing it.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
os.environ.setdefault("MKL_NUM_THREADS", "2")

import argparse  # noqa: E402
import time  # noqa: E402

from tinygrad_ckpt.bench import compare, workloads  # noqa: E402
from tinygrad_ckpt.bench.command import allocator_setting  # noqa: E402

# -- configuration: the comparison's sizes, tinygrad_ckpt/bench/workloads.py ----------------
SIZES, QUICK_SIZES = workloads.FULL.compare, workloads.QUICK.compare
STRATEGIES = ("none", "every", "sqrt")
REPEATS = 5  # timed steps per row, after one warm-up
THREADS = 2


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="W1,W2", help="which of W1 and W2 (each at every size of the set)")
    parser.add_argument("--quick", action="store_true", help="the smaller sizes")
    parser.add_argument("--libraries", default=",".join(compare.LIBRARIES))
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--no-check", action="store_true", help="skip the float64 agreement check")
    parser.add_argument("--keep-freed-memory", action="store_true",
                        help="first ask glibc's malloc to keep what a step frees (the whole process, every library)")
    args = parser.parse_args(argv)
    setting = allocator_setting(args.keep_freed_memory)
    chosen = args.workloads.split(",")
    sizes = [s for s in (QUICK_SIZES if args.quick else SIZES) if workloads.name(s) in chosen]
    start = time.perf_counter()
    rows, notes = compare.compare(sizes, args.libraries.split(","), tuple(args.strategies.split(",")),
                                  repeats=args.repeats, threads=THREADS, check=not args.no_check,
                                  progress=lambda what: print(what, flush=True))
    notes.append(setting)
    notes.append(f"the comparison took {time.perf_counter() - start:.0f} s")
    print(compare.report(rows, notes))


if __name__ == "__main__":
    main()
