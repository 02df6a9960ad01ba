"""What fit sees of a step as it runs, as an observer (observe.py): the bytes by category at every check
memory.py makes, and the FLOPs of the ops the op events name (each op event moves the progress bar)."""

from array import array

from .. import memory, meta, observe, policies
from ..ops.flops import op_flops
from . import progress


class _Recorder(observe.Observer):
    """From the step's start (train()'s reset_peak): the bytes by category at every check, and the FLOPs
    of the ops the forward runs and of those a recompute runs (which a policy says to recompute)."""

    def __init__(self, policy):
        self.checks = self.start = None
        self.policy = policy
        self.forward_flops = self.recomputed_flops = 0

    def on_reset_peak(self):
        self.start = dict(memory.tracker.current)
        self.checks = array("q", self.start.values())  # one row of CATEGORIES a check, row after row
        meta.count.reset_peak()  # the device's bytes from here on: the step's, not the model's making (ZeRO's shards)

    def on_track(self, buffer, category, new):
        if self.checks is not None:
            self.checks.extend(memory.tracker.current.values())

    def on_op(self, event):
        if "outputs" not in event:  # a mark, or a record's backward
            return
        progress.op()
        op, phase = event["op"], event["phase"]
        shapes = [a.shape for a in event["inputs"]], [o.shape for o in event["outputs"]]
        if phase == "forward":
            self.forward_flops += op_flops(op, *shapes)
        elif phase == "recompute" and (self.policy is None or self.policy(op) == policies.RECOMPUTE):
            self.recomputed_flops += op_flops(op, *shapes)
