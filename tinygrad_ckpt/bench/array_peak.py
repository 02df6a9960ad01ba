"""A step's peak of array bytes alone, Python objects left out: the figure that compares with PyTorch's.

bench --compare measures this engine's peak with tracemalloc, which counts
every allocation: NumPy's array buffers, and Python objects too (the tape's
records, the tensors, a checkpoint segment's notes). PyTorch's profiler
counts the storage of its tensors only: its memory timeline (torch 2.13,
torch/profiler/_memory_profiler.py) is built from the allocation events its
tensor allocator reports, and its autograd graph's nodes, C++ objects
(torch/csrc/autograd), report none. To compare like with like,
`array_peak` counts the arrays alone.

NumPy reports its buffers to tracemalloc under a domain of their own
(numpy.lib.tracemalloc_domain), so a snapshot gives the array bytes of a
moment exactly; but tracemalloc keeps one peak for all domains together.
So the step is cut at every op boundary, before and after each op's
forward, recompute and backward (an observer's run, observe.py). At each boundary the
arrays' bytes are read from a snapshot (exact), and the Python objects'
bytes are the rest. Between two boundaries the arrays' peak is taken as
the interval's peak less the larger of its two Python-object counts (and
never less than the arrays at either end). That is exact when the Python
bytes at the interval's peak are the larger end's, and otherwise off by no
more than the Python objects the interval made or freed: inside an op, a
few hundred bytes; between two ops, the tensors and record of an op's
call, a few KiB, which can count as arrays (tests/test_array_peak.py).

It is slow (a snapshot per boundary: seconds for a step of a few hundred
ops), so bench --compare runs it on a step of its own, after the timed ones.

What does not live here: the step's whole peak and the comparison
(compare.py), the engine's own accounting of its tensors (memory.py).
"""

import tracemalloc

import numpy

from ..observe import Observer

_ARRAYS = [tracemalloc.DomainFilter(True, numpy.lib.tracemalloc_domain)]


def array_peak(step):
    """Run step() (one forward and backward) and return its peak of NumPy array bytes, op by op.

    Counted above what was live before the step, as tracemalloc's own peak
    is. It starts and stops tracemalloc itself, so it refuses to run inside
    a tracemalloc session of the caller's (it would reset that one's peak).
    """
    if tracemalloc.is_tracing():
        raise RuntimeError("array_peak: tracemalloc is already tracing; stop it first (tracemalloc.stop()), "
                           "array_peak starts its own")
    peak, python_before = 0, None

    def boundary():
        nonlocal peak, python_before
        total, highest = tracemalloc.get_traced_memory()
        arrays = _array_bytes()
        python = total - arrays
        peak = max(peak, arrays)
        if python_before is not None:
            peak = max(peak, highest - max(python_before, python))
        python_before = python
        tracemalloc.reset_peak()  # after the snapshot is gone: its objects are not in the next interval

    class Boundaries(Observer):
        def run(self, name, phase, call):
            boundary()
            out = call()
            boundary()
            return out

    tracemalloc.start()
    try:
        boundary()
        with Boundaries():
            step()
        boundary()
    finally:
        tracemalloc.stop()
    return peak


def _array_bytes():
    """The bytes of NumPy's buffers that tracemalloc traces now."""
    return sum(trace.size for trace in tracemalloc.take_snapshot().filter_traces(_ARRAYS).traces)
