"""The machine a figure was measured on: what it is, how busy it is, how many threads run.

A timing means little without these beside it, and the instruments share
one of each: `describe()` (CPU, core count, NumPy and its BLAS),
`load_average()`, and `limited_threads(n)`, the one thread limiter.

Threads: BLAS reads its thread count when NumPy loads, before any of this
runs. With threadpoolctl installed, `limited_threads` limits every BLAS and
OpenMP pool in the process to n (and PyTorch's intra-op pool, if torch has
been imported), and says what threadpoolctl reports; without it, it limits
nothing and says how to: set the environment variables before Python
starts, as the scripts in benchmarks/ do before they import NumPy.

What does not live here: timing itself (strategies.py, compare.py).
"""

import os
import platform
import sys
from contextlib import contextmanager

import numpy

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def describe():
    """{cpu, cpu_count, platform, python, numpy, blas, description}: the machine, for a results file."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
        blas = f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # older NumPy: no dict mode
        blas = "unknown"
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": numpy.__version__, "blas": blas,
            "description": f"{cpu}, {os.cpu_count()} CPUs, {platform.system()}, NumPy {numpy.__version__} ({blas})"}


def load_average():
    """The 1-minute load average, or None where the system does not say."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def busy(load=None):
    """True when the load average is above half the CPUs: timings are then slower and noisier."""
    load = load_average() if load is None else load
    return load is not None and load > (os.cpu_count() or 1) / 2


@contextmanager
def limited_threads(n):
    """Run the block with every thread pool at n threads; yields what is known of them.

    Yields {"requested", "environment", "threadpoolctl", "torch", "summary"}:
    the pools threadpoolctl found and their thread counts, PyTorch's intra-op
    thread count (None if torch is not imported), and one line saying it all,
    with a warning if a pool is not at n. The limits are lifted when the block ends.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"threads must be an int of at least 1, got {n!r}")
    info = {"requested": n, "environment": {k: os.environ.get(k) for k in THREAD_VARIABLES},
            "threadpoolctl": None, "torch": None}
    torch = sys.modules.get("torch")  # only a library that is already imported has threads to limit
    torch_before = torch.get_num_threads() if torch is not None else None
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        limiter = None
    else:
        limiter = threadpool_limits(limits=n)
    try:
        parts = []
        if limiter is None:
            env = info["environment"]
            if env["OPENBLAS_NUM_THREADS"] == str(n) or env["OMP_NUM_THREADS"] == str(n):
                parts.append("from the environment")
            else:
                parts.append(f"not limited: BLAS uses its default (usually one per core: {os.cpu_count()} here); set "
                             f"OMP_NUM_THREADS={n} OPENBLAS_NUM_THREADS={n} before running, or pip install threadpoolctl")
        else:
            pools = [{k: p.get(k) for k in ("internal_api", "num_threads", "version")} for p in threadpool_info()]
            info["threadpoolctl"] = pools
            parts.append("threadpoolctl: " + (", ".join(f"{p['internal_api']} {p['num_threads']}" for p in pools)
                                              or "no pools found"))
            wrong = [p for p in pools if p["num_threads"] != n]
            if wrong:
                parts.append(f"WARNING: {len(wrong)} pool(s) not at {n} threads")
        if torch is not None:
            torch.set_num_threads(n)
            info["torch"] = torch.get_num_threads()
            parts.append(f"torch intra-op {info['torch']}")
        limited = limiter is not None or parts[0] == "from the environment"
        info["summary"] = f"{n} ({'; '.join(parts)})" if limited else "; ".join(parts)
        yield info
    finally:
        if limiter is not None:
            limiter.restore_original_limits()
        if torch is not None:
            torch.set_num_threads(torch_before)
