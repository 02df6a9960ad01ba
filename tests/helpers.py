"""One helper every op test goes through: finite differences in float64; how to get PyTorch for the optional checks;
a time limit for a test that would otherwise hang."""

import signal
from contextlib import contextmanager

import pytest

from tinygrad_ckpt import Tensor
from tinygrad_ckpt.gradcheck import gradcheck

# Central differences with eps=1e-6 in float64 are accurate to about 1e-8 on
# these magnitudes; the stated tolerance leaves two orders of margin.
ATOL, RTOL = 1e-6, 1e-5

# The reason an optional PyTorch comparison gives when it skips: how to install it (the
# `compare` extra leaves it out, since the CPU build comes from PyTorch's own index).
TORCH_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
TORCH_SKIP = f"PyTorch is not installed, so this comparison with it is skipped (a CPU build: {TORCH_INSTALL})"


def check_grad(fn, *arrays, eps=1e-6):
    """gradcheck `fn` on float64 tensors made from `arrays` (all require grad).

    fn's output is used twice (out + out), so the check also covers the path
    where two gradients meet in one pending sum before reaching the op.
    """
    inputs = [Tensor(a, requires_grad=True, dtype="float64") for a in arrays]
    assert gradcheck(lambda *xs: _used_twice(fn(*xs)), inputs, eps=eps, atol=ATOL, rtol=RTOL)


def _used_twice(out):
    return out + out


class TookTooLong(Exception):
    """Raised by time_limit when its seconds are up."""


@contextmanager
def time_limit(seconds, what):
    """Inside, a test that would hang or never end fails instead: SIGALRM raises TookTooLong(what) in the main thread."""
    if not hasattr(signal, "setitimer"):
        pytest.skip("needs signal.setitimer (POSIX)")

    def stop(signum, frame):
        raise TookTooLong(f"{what} after {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
