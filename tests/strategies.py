"""The tests' hypothesis strategies live in the package, where users can draw from them too:
tinygrad_ckpt/testing/strategies.py. Re-exported here for the op tests."""

from tinygrad_ckpt.testing.strategies import (
    EDGES, arrays, away_from_zero, broadcast_pairs, edge_arrays, nonscalar_shapes, shapes,
)

__all__ = ["EDGES", "arrays", "away_from_zero", "broadcast_pairs", "edge_arrays", "nonscalar_shapes", "shapes"]
