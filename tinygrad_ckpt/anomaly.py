"""Anomaly mode: the first NaN or infinity, forward or backward, named with its op and its line of code.

Switched by `autograd.detect_anomaly()` (the public face, with PyTorch's
names). Off, the engine pays one test of the `enabled` flag per op
(Function.apply) and per record walked (the walk in tape.py). On, every
record keeps the stack that created it (`capture_stack`), every op's forward
outputs are checked (`check_outputs`) and every gradient a backward returns
(`check_gradients`; with `loss_scaling`, an overflow in a scaled loss's
backward is left to the GradScaler); an error names the record and the innermost line of
user code that created it (`origin`), which the version check's hint uses
too (versions.py).

What does not live here: the walk (tape.py), the public switch (autograd.py).
"""

import os
import sys
import traceback

from . import backend

enabled = False  # switched by autograd.detect_anomaly(); read by Function.apply and the walk
loss_scaling = False  # detect_anomaly(loss_scaling=True): backward's overflow is the GradScaler's (check_gradients)


def set_enabled(mode):
    """Switch anomaly mode on or off; returns the previous setting."""
    global enabled
    previous, enabled = enabled, bool(mode)
    return previous


def set_loss_scaling(mode):
    """Say whether the backward is of a scaled loss (GradScaler); returns the previous setting."""
    global loss_scaling
    previous, loss_scaling = loss_scaling, bool(mode)
    return previous


def capture_stack():
    """The call stack of the op being run, outermost first (source lines read only if shown)."""
    stack = traceback.StackSummary.extract(traceback.walk_stack(sys._getframe(1)), lookup_lines=False)
    stack.reverse()
    return stack


_PACKAGE = os.path.dirname(os.path.abspath(__file__))
# The plumbing between a line of model code and an op: never "where" an op was created.
_PLUMBING = {"tensor.py", "function.py", "tape.py", "anomaly.py", "versions.py", "functional.py", "checkpoint.py", "policies.py",
             "autograd.py", "backend.py", "random.py"}


def _in_package(frame):
    return os.path.abspath(frame.filename).startswith(_PACKAGE + os.sep)


def _is_plumbing(frame):
    folder, name = os.path.split(os.path.abspath(frame.filename))
    return (folder == _PACKAGE and name in _PLUMBING) or folder == os.path.join(_PACKAGE, "ops")


def origin(stack):
    """Where a record was created: the innermost line of user code, then the whole forward call."""
    frames = list(stack)
    while frames and _is_plumbing(frames[-1]):  # down to the line that called the op
        frames.pop()
    if not frames:
        return "the record was created inside the engine (no caller outside it)"
    user = next((f for f in reversed(frames) if not _in_package(f)), frames[-1])
    trace = "".join(traceback.StackSummary.from_list(frames[-_TRACE_FRAMES:]).format())
    return (f"The record was created at {user.filename}, line {user.lineno}, in {user.name}:\n"
            f"    {(user.line or '').strip()}\n"
            f"Traceback of the forward call that created it (most recent call last, up to {_TRACE_FRAMES} "
            f"frames):\n{trace.rstrip()}")


_TRACE_FRAMES = 8  # enough for a model's layers and the line that called the model


def _nonfinite(a):
    """'nan', 'inf' or None, for an array (None too for a non-float one or None).

    One explicit copy of a boolean to the host: anomaly mode waits for the GPU.
    """
    if a is None or not backend.is_inexact(a.dtype):
        return None
    xp = backend.module_of(a)
    if bool(backend.to_host(backend.as_array(xp.isfinite(a).all()))):
        return None
    return "nan" if bool(backend.to_host(backend.as_array(xp.isnan(a).any()))) else "inf"


def check_outputs(op, node, input_arrays, outputs):
    """Anomaly mode: raise at an op whose forward output is NaN, or infinite from finite inputs.

    An infinity that came in through an input (a -inf attention mask filled
    in by masked_fill) is the caller's intent, not an anomaly; a NaN never is.
    """
    for j, out in enumerate(outputs):
        bad = _nonfinite(out)
        if bad is None:
            continue
        carried = [(i, k) for i, k in ((i, _nonfinite(a)) for i, a in enumerate(input_arrays)) if k]
        if bad == "inf" and carried:
            continue
        where = node.describe() if node is not None else f"{op} (not recorded: no input requires grad)"
        came_in = "".join(f"; its input {i} already held {k} values" for i, k in carried)
        stack = node.stack if node is not None else capture_stack()
        raise RuntimeError(f"anomaly mode: Function {where} returned {bad} values in its output {j} "
                           f"during forward{came_in}.\n{origin(stack)}")


def check_gradients(node, out_grads, in_grads):
    """Anomaly mode: raise at a record whose backward returned a NaN or infinite gradient.

    With loss_scaling on (the backward of a GradScaler's scaled loss), an
    infinite gradient is an overflow the scaler will find and skip, and a NaN
    made from one (inf - inf, inf * 0) is its consequence: neither is an
    anomaly, as PyTorch's anomaly mode never flags inf. A NaN returned from
    finite gradients still is.
    """
    for i, g in enumerate(in_grads):
        bad = _nonfinite(g)
        if bad is None:
            continue
        received = [k for k in map(_nonfinite, out_grads) if k]
        if loss_scaling and (bad == "inf" or received):
            continue
        came_in = f"; the gradient it received already held {received[0]} values" if received else ""
        stack = getattr(node, "stack", None)
        where = (origin(stack) if stack is not None else
                 "The record was created before anomaly mode was switched on: run the forward in "
                 "detect_anomaly() too, to see where.")
        raise RuntimeError(f"anomaly mode: Function {node.describe()} returned {bad} values in its output {i} "
                           f"during backward (the gradient of its input {i}){came_in}.\n{where}")


def check_start(g):
    bad = _nonfinite(g)
    if bad is not None:
        raise RuntimeError(f"anomaly mode: the gradient passed to backward() holds {bad} values")
