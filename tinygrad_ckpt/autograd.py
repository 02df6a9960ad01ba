"""Autograd utilities with PyTorch's names (torch.autograd): anomaly mode.

    with tinygrad_ckpt.autograd.detect_anomaly():
        loss = model(x, y)          # every op's outputs are checked for NaN and inf
        loss.backward()             # and every gradient backward computes

In anomaly mode every record on the tape keeps the stack that created it, and
the first op whose forward output is NaN (or infinite where its inputs were
finite), or whose backward returns a NaN or infinite gradient, raises a
RuntimeError naming the op, its record number on the tape and the line of
user code that created the record, then the whole forward call that did. A
checkpointed segment's recompute is a forward too, and is checked the same
way. An in-place change caught by backward names that line as well.

PyTorch 2.13's `torch.autograd.detect_anomaly` (torch/autograd/anomaly_mode.py)
records each forward op's traceback and checks what backward computes for NaN
only; this one checks forward outputs too, and infinities. An infinity that
reaches an op through an input (a -inf attention mask filled in by
masked_fill) is taken as intended; a NaN never is.

The checks copy one boolean per array to the host (on a GPU, a wait each)
and capture a stack per record: slow, for debugging. Off, the engine pays a
test of one flag per op.

What does not live here: the checks themselves, which the tape and
Function.apply run (tape.py), and the rest of the engine.
"""

from . import tape


class set_detect_anomaly:
    """Switch anomaly mode on or off now; as a context manager, put it back on exit (PyTorch's name).

        set_detect_anomaly(True)                 # on, from here on
        with set_detect_anomaly(False): ...      # off inside the block only
    """

    def __init__(self, mode):
        self.previous = tape.set_anomaly_enabled(mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        tape.set_anomaly_enabled(self.previous)


class detect_anomaly:
    """Anomaly mode inside the block (see the module docstring); the previous setting after it."""

    def __enter__(self):
        self.previous = tape.set_anomaly_enabled(True)
        return self

    def __exit__(self, *exc):
        tape.set_anomaly_enabled(self.previous)


def is_anomaly_enabled():
    """True while anomaly mode is on."""
    return tape.anomaly_mode
