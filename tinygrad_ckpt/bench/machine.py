"""The machine a figure was measured on: what it is and how busy it is.

A timing means little without these beside it, and the instruments share
one of each: `describe()` (CPU, core count, NumPy and its BLAS) and
`load_average()` (with `busy()`, its reading).

What does not live here: timing itself (strategies.py, compare.py); how
many threads BLAS runs, the one thread limiter (tinygrad_ckpt/threads.py,
a floor below, since the command line and verify use it too).
"""

import os
import platform

import numpy


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
