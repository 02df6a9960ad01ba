"""The determinism check: a checkpoint's recompute must compute what its forward did.

A checkpointed segment runs twice, once in forward and again in backward, and
its backward uses the second run's arrays as if they were the first's. If
the code took another path the second time (it read state that changed, or
drew random numbers without preserve_rng_state=True), the gradient would be
silently wrong. So, with determinism_check="default" (PyTorch's name and
default), the recompute must call the same ops in the same order, each saving
arrays of the same shapes and dtypes, and return outputs of the same shapes
and dtypes; "values" also compares the outputs' values (a copy is kept: a
debugging aid); "none" checks nothing.

The plain recompute (checkpoint.py) checks each op as it runs, against
`op_record` entries its forward kept; the planned one (recompute.py) against
its notes. A mismatch is one CheckpointError naming the op; with debug=True
it shows both op sequences side by side.

Costs: one short tuple per op of the segment's forward, and one compare per
op of the recompute.

What does not live here: running the segment (checkpoint.py, recompute.py).
"""

import numpy

from . import backend, memory, tape

CHECKS = ("default", "values", "none")


class CheckpointError(RuntimeError):
    """The recompute of a checkpointed segment did not do what its forward did (PyTorch's name)."""


def op_record(op, ctx):
    """(op name, the shape and dtype of each array it saved): what the check compares, per op."""
    return op.__name__, saved_meta(ctx.saved_arrays)


def saved_meta(arrays):
    return tuple(None if a is None else (tuple(a.shape), a.dtype) for a in arrays)


def describe(meta):
    """Shapes and dtypes for a message: '(2, 2) float64, nothing'."""
    return ", ".join("nothing" if m is None else f"{m[0]} {m[1]}" for m in meta) or "nothing"


def mismatch(name, what, forward_ops, ran, debug):
    """Raise the check's error: segment `name`'s recompute `what`; with debug, both op sequences."""
    message = (f"checkpoint: the recompute of segment '{name}' {what}; the segment must compute the "
               "same thing each time it runs (does it depend on state that changed between forward and "
               "backward, or on random numbers without preserve_rng_state=True?)")
    if debug:
        message += "\n" + side_by_side(forward_ops, ran)
    else:
        message += ". Pass debug=True to see the forward's and the recompute's ops side by side."
    raise CheckpointError(message)


def side_by_side(forward, recompute):
    """The two op sequences in two columns, the first difference marked."""
    rows = [f"  {'#':>3}  {'forward':<20} recompute"]
    for i in range(max(len(forward), len(recompute))):
        f = forward[i] if i < len(forward) else "-"
        r = recompute[i] if i < len(recompute) else "(not reached)"
        mark = "   <- differs" if i < len(recompute) and f != r else ""
        rows.append(f"  {i:>3}  {f:<20} {r}{mark}")
    return "\n".join(rows)


class CheckedTape(tape.Tape):
    """The plain recompute's tape (checkpoint.py): records as any fresh tape does, and checks each op
    against what the segment's forward ran (segment.ops: op_record per op)."""

    def __init__(self, segment):
        super().__init__()
        self.label = f"the recompute of checkpoint segment '{segment.name}'"
        self.segment, self.ran = segment, []

    def run(self, op, ctx, arrays, options):
        out = op.run_forward(ctx, arrays, options)
        if self.segment.checks:
            j, ops = len(self.ran), self.segment.ops
            self.ran.append(op.__name__)
            name, saved = op_record(op, ctx)
            if j >= len(ops) or name != ops[j][0]:
                expected = ops[j][0] if j < len(ops) else "nothing more"
                self.segment.mismatch(f"ran {name} as op #{j}, where its forward ran {expected}", self.ran)
            if saved != ops[j][1]:
                self.segment.mismatch(f"ran {name} (op #{j}), which saved {describe(saved)} for backward, "
                                      f"where its forward saved {describe(ops[j][1])}", self.ran)
        return out

    def check_all_ran(self):
        if len(self.ran) != len(self.segment.ops):
            self.segment.mismatch(f"ran {len(self.ran)} ops, where its forward ran {len(self.segment.ops)}", self.ran)


def remember_outputs(segment, outs):
    """What check_outputs compares the recompute's outputs with: shapes and dtypes; a copy, for "values"."""
    segment.out_meta = [(o.shape, o.dtype) for o in outs]
    if segment.determinism_check == "values":
        segment.out_values = [o.data.copy() for o in outs]
        for v in segment.out_values:
            memory.track(v)


def check_outputs(segment, outs):
    """The recompute must return what the forward did: as many tensors, the same shapes and dtypes (values if asked)."""
    if len(outs) != len(segment.out_meta):
        segment.mismatch(f"returned {len(outs)} tensors, its forward returned {len(segment.out_meta)}", [])
    for i, (o, (shape, dtype)) in enumerate(zip(outs, segment.out_meta)):
        if o.shape != shape or o.dtype != dtype:
            segment.mismatch(f"returned output {i} with shape {o.shape}, dtype {o.dtype}, but its forward "
                             f"returned shape {shape}, dtype {dtype}", [])
    if segment.determinism_check == "values":
        for i, (o, before) in enumerate(zip(outs, segment.out_values)):
            # Compared on the host (an explicit copy: this is a debugging aid).
            # rtol 1e-5: a recompute runs the same ops on the same arrays, so
            # values agree to the last bits; this only allows for reordered sums.
            now, before = backend.to_host(o.data), backend.to_host(before)
            if not numpy.allclose(now, before, rtol=1e-5, atol=1e-8, equal_nan=True):
                worst = float(abs(now - before).max())
                raise CheckpointError(
                    f"checkpoint: the recompute of segment '{segment.name}' gave other values for "
                    f"output {i} than its forward (largest difference {worst:.3g}); is it random "
                    "without preserve_rng_state=True, or does it read state that changed?"
                )
