"""`around_ops`: run the instruments' code around every op call of the engine.

Every op runs through two calls, Function.run_forward and
Function.run_backward (function.py). While `around_ops(wrap)` is active both
go through `wrap(name, phase, call)`: name is the op's class name
("Linear"), phase "forward", "recompute" (a checkpoint's forward run again
in backward) or "backward", and call() runs the op and returns what it
returns. On exit the two calls are put back as they were.

Two instruments use it: bench --profile times each op (profile.py), and
bench --compare reads memory at the boundaries of the ops (array_peak.py).
The engine itself knows nothing of them.
"""

from contextlib import contextmanager

from .. import memory
from ..function import Function


@contextmanager
def around_ops(wrap):
    """Route every op's forward and backward through wrap(name, phase, call) inside the block."""
    forward, backward = Function.__dict__["run_forward"], Function.__dict__["run_backward"]

    def run_forward(cls, ctx, arrays, options):
        phase = "recompute" if memory.tracker.phase == "recompute" else "forward"
        return wrap(cls.__name__, phase, lambda: forward.__func__(cls, ctx, arrays, options))

    def run_backward(cls, ctx, grads):
        return wrap(cls.__name__, "backward", lambda: backward.__func__(cls, ctx, grads))

    Function.run_forward, Function.run_backward = classmethod(run_forward), classmethod(run_backward)
    try:
        yield
    finally:
        Function.run_forward, Function.run_backward = forward, backward
