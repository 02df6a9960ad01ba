"""Hypothesis strategies for shapes and float64 arrays, shared by the tests."""

import numpy
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp


def arrays(shape, low=-2.0, high=2.0):
    """float64 arrays of `shape` with values in [low, high]."""
    return hnp.arrays(numpy.float64, shape, elements=st.floats(low, high, allow_nan=False, width=64))


def away_from_zero(shape, low=0.5, high=2.0):
    """float64 arrays with |values| in [low, high] (for division, logs, kinks)."""
    magnitude = arrays(shape, low, high)
    signs = hnp.arrays(numpy.float64, shape, elements=st.sampled_from([-1.0, 1.0]))
    return st.tuples(magnitude, signs).map(lambda ms: ms[0] * ms[1])


# 0-d shapes included: every op meaningful on a scalar tensor is drawn one (tests/test_ops.py).
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3)
broadcast_pairs = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, min_side=1, max_side=3)
