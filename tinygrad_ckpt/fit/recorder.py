"""What fit sees of a step as it runs: memory.py's tracker, keeping the bytes by category at every check,
and the FLOPs of the ops the op events name (and each op event moves the progress bar).

It reaches into the tracker (its `_update_peak` and the timeline's `_made`
and `_freed`), which a public way of watching the engine will replace.
"""

from array import array

from .. import memory, meta, policies
from ..ops.flops import op_flops
from . import progress


class _Recorder(memory.MemoryTracker):
    """memory.py's tracker, keeping from the step's start (train()'s reset_peak) the bytes by category at
    every check, and the FLOPs of the ops the forward runs and of those a recompute runs (which a policy
    says to recompute)."""

    def __init__(self, policy):
        super().__init__()
        self.checks = self.start = None
        self.policy = policy
        self.forward_flops = self.recomputed_flops = 0
        self.events = []  # the op events come to `event`, which keeps only their FLOPs

    def reset_peak(self):
        super().reset_peak()
        self.start = dict(self.current)
        self.checks = array("q", self.current.values())  # one row of CATEGORIES a check, row after row
        meta.count.reset_peak()

    def _update_peak(self):
        super()._update_peak()
        if self.checks is not None:
            self.checks.extend(self.current.values())

    def event(self, op, phase=None, inputs=None, outputs=None, kind=None, **rest):
        self._made, self._freed = [], {}  # what the tracker gathers for a timeline point: none is kept here
        if outputs is None:
            return
        progress.op()
        phase = phase or self.phase
        if phase == "forward":
            self.forward_flops += op_flops(op, [a.shape for a in inputs], [o.shape for o in outputs])
        elif phase == "recompute" and (self.policy is None or self.policy(op) == policies.RECOMPUTE):
            self.recomputed_flops += op_flops(op, [a.shape for a in inputs], [o.shape for o in outputs])
