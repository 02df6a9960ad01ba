"""Test aids, and the checks that checkpointing and accumulation change no gradient.

    equivalence.py  check_checkpoint, check_accumulation: run your model (or
                    function, or strategy) plainly and with the technique,
                    compare every gradient; an EquivalenceReport says how far
                    apart they are and whether that is within tolerance
    strategies.py   hypothesis strategies for property tests (shapes, layer
                    chains, GPT configurations, segment plans, policies,
                    padded batches, micro-batch splits); needs hypothesis
    verify.py       `tinygrad-ckpt verify`: the checks on every strategy the
                    package has, on a GPT and an MLP, as one table
    strict_cupy.py  a CPU stand-in for CuPy that refuses every implicit copy to
                    the host: `backend.set_cuda_module(strict_cupy)` makes
                    device='cuda' run on it, so the tests can prove the engine
                    never slips into NumPy on device arrays, without a GPU.

The checks are imported from here (`from tinygrad_ckpt.testing import
check_accumulation, check_checkpoint`); equivalence.py's docstrings run them.

Below this floor nothing imports it: the techniques know nothing of how they
are checked. The command line (cli.py) runs verify; the tests, tutorials 7
and 10 and the GPU benchmark's dry run import the rest. Importing it never
needs hypothesis; only `tinygrad_ckpt.testing.strategies` does.
"""

from .equivalence import (
    TOLERANCES, Difference, EquivalenceError, EquivalenceReport, check_accumulation, check_checkpoint,
)

__all__ = ["check_checkpoint", "check_accumulation", "EquivalenceReport", "EquivalenceError", "Difference",
           "TOLERANCES"]
