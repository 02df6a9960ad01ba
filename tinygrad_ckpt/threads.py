"""How many threads BLAS may use, for a block of code: `limited_threads(n)`, the one thread limiter.

NumPy's BLAS (OpenBLAS in the wheels) starts one thread per core when NumPy
loads and splits each large enough matrix product among them. For a small
product, such as a GPT forward on one sequence (what sampling runs, once per
character), the split costs more than it gives; and on a busy machine a
thread that finds no free core is waited for by the others, so a product
can take many times longer than on one thread. `tinygrad-ckpt train`
samples 300 characters after training: on a 2-core machine kept busy by
other processes that took 90 s on BLAS's default two threads, and 4.5 s on
one (benchmarks/README.md, "On a busy machine").

    >>> from tinygrad_ckpt.threads import limited_threads
    >>> with limited_threads(1) as info:
    ...     info["requested"]
    1

Inside the block, threadpoolctl (a dependency) holds every BLAS and OpenMP
pool the process has loaded at n threads, and PyTorch's intra-op pool too
if torch was imported; the limits are lifted when the block ends. The
environment variables (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS) set a
process's default instead, and only before NumPy loads, which is why the
scripts in benchmarks/ set them first.

What does not live here: which code runs with how many threads (the command
line and the instruments choose: cli.py, bench/, testing/verify.py), the
description of the machine (bench/machine.py).
"""

import argparse
import os
import sys
from contextlib import contextmanager

from threadpoolctl import threadpool_info, threadpool_limits

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def thread_count(text):
    """The type of train's, verify's and bench's --threads: an integer of at least 1, or argparse's error saying so."""
    if not text.strip().isdecimal() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an integer of at least 1, got {text!r}")
    return int(text)


@contextmanager
def limited_threads(n):
    """Run the block with every thread pool at n threads; yields what is known of them.

    n: an int of at least 1, or None to leave every pool as it is (the
    block still gets the report). Yields {"requested", "environment",
    "threadpoolctl", "torch", "summary"}: the pools threadpoolctl found and
    their thread counts, PyTorch's intra-op thread count (None if torch is
    not imported), and one line saying it all, with a warning if a pool is
    not at n. Costs one look at the loaded libraries (about a millisecond):
    wrap a loop, not each product in it.
    """
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"threads must be an integer of at least 1, got {n!r}")
    info = {"requested": n, "environment": {k: os.environ.get(k) for k in THREAD_VARIABLES},
            "threadpoolctl": None, "torch": None}
    torch = sys.modules.get("torch")  # only a library that is already imported has threads to limit
    torch_before = torch.get_num_threads() if torch is not None else None
    limiter = threadpool_limits(limits=n) if n is not None else None
    try:
        pools = [{k: p.get(k) for k in ("internal_api", "num_threads", "version")} for p in threadpool_info()]
        info["threadpoolctl"] = pools
        parts = ["threadpoolctl: " + (", ".join(f"{p['internal_api']} {p['num_threads']}" for p in pools)
                                      or "no pools found")]
        wrong = [p for p in pools if n is not None and p["num_threads"] != n]
        if wrong:
            parts.append(f"WARNING: {len(wrong)} pool(s) not at {n} threads")
        if torch is not None:
            if n is not None:
                torch.set_num_threads(n)
            info["torch"] = torch.get_num_threads()
            parts.append(f"torch intra-op {info['torch']}")
        info["summary"] = f"{n if n is not None else 'not limited'} ({'; '.join(parts)})"
        yield info
    finally:
        if limiter is not None:
            limiter.restore_original_limits()
        if torch is not None:
            torch.set_num_threads(torch_before)
