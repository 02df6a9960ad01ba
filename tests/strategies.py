"""The tests' hypothesis strategies live in the package, where users can draw from them too:
tinygrad_ckpt/testing/strategies.py. Re-exported here for the op tests."""

from tinygrad_ckpt.testing.strategies import arrays, away_from_zero, broadcast_pairs, nonscalar_shapes, shapes

__all__ = ["arrays", "away_from_zero", "broadcast_pairs", "nonscalar_shapes", "shapes"]
