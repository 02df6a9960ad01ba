"""The peak of array bytes alone (bench/array_peak.py), the figure bench --compare sets beside PyTorch's.

What must hold: the arrays an op makes are counted to the byte, Python
objects are not, however many the step makes between its ops, and the
observer it uses (observe.py) is gone afterwards, even when the step fails.
"""

import tracemalloc

import numpy
import pytest

from tinygrad_ckpt import Tensor
from tinygrad_ckpt.bench.array_peak import array_peak
from tinygrad_ckpt import observe

ROWS = 256  # a (256, 256) float32 array: 256 KiB
ARRAY = ROWS * ROWS * 4
# Python objects made and freed between two op boundaries (the tensors and record of an op's call)
# can count as arrays: a few KiB here (array_peak.py's docstring).
SLACK = 16 * 1024


def test_arrays_are_counted_and_python_objects_are_not():
    x = Tensor(numpy.ones((ROWS, ROWS), dtype=numpy.float32))  # live before the step: not counted
    kept = []

    def step():
        a = x + x  # one new array
        kept.append([object() for _ in range(20_000)])  # Python objects between two ops: about 1 MiB
        b = a + x  # a second, while the first is alive: the arrays' peak is two
        kept.append([str(i) for i in range(20_000)])
        del a, b

    peak = array_peak(step)
    assert 2 * ARRAY <= peak < 2 * ARRAY + SLACK  # the two arrays (and the step's few short-lived objects)
    kept.clear()

    tracemalloc.start()  # the same step's whole peak counts the objects too
    step()
    whole = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert whole > peak + 512 * 1024


def test_a_temporary_inside_an_op_is_counted():
    # A backward that makes its result from a temporary as large as itself: both are live at its peak.
    x = Tensor(numpy.ones((ROWS, ROWS), dtype=numpy.float32), requires_grad=True)

    def step():
        (x * x).sum().backward()  # Mul's backward: g * other, for each of its two inputs
        x.grad = None

    assert 2 * ARRAY <= array_peak(step) < 2 * ARRAY + SLACK  # the gradients of Mul's two inputs, live together


def test_the_observer_is_removed_even_when_the_step_fails():
    def step():
        assert len(observe.observers) == 1
        Tensor(numpy.ones(3)) + 1
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        array_peak(step)
    assert observe.observers == [] and not tracemalloc.is_tracing()


def test_it_refuses_to_run_inside_a_tracemalloc_session():
    tracemalloc.start()
    try:
        with pytest.raises(RuntimeError, match="already tracing"):
            array_peak(lambda: None)
        assert tracemalloc.is_tracing()  # the caller's session is left running
    finally:
        tracemalloc.stop()
