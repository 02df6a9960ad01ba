"""Collects every tutorial (tutorials/NN_*.md) as tests: see harness.py for what is run and checked."""

from harness import sybil

pytest_collect_file = sybil.pytest()
