"""The saved-activations report: which op saved which arrays for backward.

Run a function on its inputs and list, record by record, every array an op
kept with `ctx.save_for_backward` (shape, dtype, bytes), and the total. JAX's
`jax.ad_checkpoint.print_saved_residuals` answers the same question without
running anything: it traces the function's VJP with `make_jaxpr` and lists
the residuals of that trace, abstract shapes and dtypes (jax 0.11.0,
jax/_src/ad_checkpoint.py, `saved_residuals`). Here the function runs, so
the bytes are the ones memory.py measures, and the backward shows what a
checkpoint recomputes.

    >>> import numpy
    >>> from tinygrad_ckpt import Tensor, nn
    >>> model = nn.Sequential(nn.Linear(4, 3, rng=numpy.random.default_rng(0)), nn.GELU())
    >>> x = Tensor(numpy.ones((2, 4), dtype=numpy.float32))
    >>> report = saved_activations(lambda x: model(x).sum(), x)
    >>> report.total                       # activation bytes, as memory.py counts them
    56
    >>> print(report)                      # the table
    saved for backward by <lambda>:
      #  op      slot  shape   dtype    bytes  charged  note
      0  Linear  0     (2, 4)  float32  32 B   32 B     input
      1  GELU    0     (2, 3)  float32  24 B   24 B
    total: 56 B (56 bytes) in 2 saved arrays; memory.py measured 56 B of activations
    recomputed in backward: nothing (forward: 114 FLOP)

Bytes are counted the way memory.py counts them, so the report's total is
the rise in `memory.current()["activations"]` that the forward causes (the
report measures that too and shows both):

  * by buffer, not by array: a view is charged to the buffer it looks into
    (attention's q, k and v are views of one (B, T, 3C) array, so they cost
    that buffer once), and a buffer saved by two ops is charged to the first
    and marked "shared" at the second;
  * parameters are listed but not charged: Linear saves its weight, which is
    already counted under "parameters".

The report also runs one backward (on the output, or on the sum of its
elements), so it sees what a checkpointed function recomputes: the ops that
ran again in the "recompute" phase, each with its FLOPs (an op whose record
a recompute rebuilt without running it, recompute.py, costs nothing and is
not listed). `compare(before, after)`
puts two reports side by side: the arrays only one of them saves, and what
the other pays in recomputation instead. The backward puts gradients into
the leaves' `.grad`, as any backward does; zero them before training on.

FLOPs are counted from shapes by `op_flops` (ops/flops.py, beside the ops;
also importable from here): for comparing costs, not for predicting time.

Why this sits beside the techniques and not among the instruments (bench/):
it is the tape made visible, a tool a learner calls on a function of their
own (as JAX users call print_saved_residuals on theirs) to see what a policy
or a checkpoint changes, and the tutorials teach with it. The bench measures
through memory.py, not through this report.

What does not live here: the accounting itself (memory.py), the analytic
formulas for whole layers (activations.py), an op's FLOP count (ops/flops.py).
"""

import gc
from dataclasses import dataclass

from . import backend, memory, tape
from .ops.flops import op_flops  # the report prices what a checkpoint recomputes
from .tensor import Tensor


# -- the report ------------------------------------------------------------------
@dataclass
class SavedArray:
    """One array one op saved for backward."""

    record: int  # the op's record number on the tape (forward order)
    op: str  # the op's class name, e.g. "Linear"
    slot: int  # position in the op's ctx.save_for_backward(...) call
    shape: tuple
    dtype: str
    nbytes: int  # this array's own bytes (a view's are less than its buffer's)
    buffer_nbytes: int  # the bytes of the buffer it lives in
    charged: int  # bytes this entry adds to the total: the buffer's, once, if it is an activation
    note: str  # "", "input", "parameter (counted under parameters)", "shared with #3", "view of ..."


@dataclass
class Recomputed:
    """One op run again during backward (the price of not saving)."""

    op: str
    output_shapes: list
    flops: int


class SavedActivations:
    """What one forward of `fn` saved, and what its backward recomputed."""

    def __init__(self, name, entries, measured, forward_flops, recomputed):
        self.name = name
        self.entries = entries  # [SavedArray], forward order
        self.measured = measured  # rise of memory.current()["activations"] over the forward
        self.forward_flops = forward_flops
        self.recomputed = recomputed  # [Recomputed], in the order backward ran them

    @property
    def total(self):
        """Activation bytes the saved arrays hold (each buffer once; parameters excluded)."""
        return sum(e.charged for e in self.entries)

    @property
    def recompute_flops(self):
        return sum(r.flops for r in self.recomputed)

    def __str__(self):
        fmt = memory.format_bytes
        rows = [("#", "op", "slot", "shape", "dtype", "bytes", "charged", "note")]
        for e in self.entries:
            rows.append((str(e.record), e.op, str(e.slot), str(e.shape), e.dtype, fmt(e.nbytes), fmt(e.charged), e.note))
        lines = [f"saved for backward by {self.name}:"] + _table(rows)
        lines.append(
            f"total: {fmt(self.total)} ({self.total} bytes) in {len(self.entries)} saved arrays"
            f"; memory.py measured {fmt(self.measured)} of activations"
        )
        if self.recomputed:
            share = self.recompute_flops / self.forward_flops if self.forward_flops else 0.0
            lines.append(
                f"recomputed in backward: {len(self.recomputed)} ops, {_flops(self.recompute_flops)} "
                f"({share:.0%} of the forward's {_flops(self.forward_flops)})"
            )
        else:
            lines.append(f"recomputed in backward: nothing (forward: {_flops(self.forward_flops)})")
        return "\n".join(lines)

    __repr__ = __str__


def saved_activations(fn, *inputs, name=None, policy=None):
    """Run `fn(*inputs)` and its backward on a fresh tape; report what was saved.

    `fn` returns a Tensor (a loss, or any output: backward then starts from a
    gradient of ones). See the module docstring for how bytes are charged.
    policy: the checkpoint policy `fn` uses, if any (policies.py). The ops it
    keeps are replayed from what they kept, not run, in the recompute: they
    are left out of the recompute and its FLOPs.
    """
    for i, x in enumerate(inputs):
        if not isinstance(x, Tensor):
            raise TypeError(f"saved_activations: input {i} is a {type(x).__name__}; pass Tensors (wrap arrays with Tensor(...))")
    leaves = {id(backend.storage(x.data)) for x in inputs}
    record = tape.Tape()
    gc.collect()  # earlier garbage (a failed backward's records, in its traceback's cycle) is not freed mid-measure
    before = memory.current()["activations"]
    with memory.timeline() as forward_events, tape.recording(record):
        out = fn(*inputs)
    if not isinstance(out, Tensor):
        raise TypeError(f"saved_activations: fn returned a {type(out).__name__}; it must return one Tensor (e.g. the loss)")
    measured = memory.current()["activations"] - before
    entries = _entries(record.nodes(), leaves)
    recomputed = []
    if out.requires_grad:
        grad = backend.array_module(out.data).ones(out.shape, dtype=out.dtype)
        with memory.timeline() as backward_events:
            out.backward(grad)
        recomputed = [
            Recomputed(e["op"], e["output_shapes"], op_flops(e["op"], e["input_shapes"], e["output_shapes"]))
            for e in backward_events
            if e["phase"] == "recompute" and "output_shapes" in e and (policy is None or policy(e["op"]) == "recompute")
        ]
    forward_flops = sum(op_flops(e["op"], e["input_shapes"], e["output_shapes"]) for e in forward_events if "output_shapes" in e)
    return SavedActivations(name or getattr(fn, "__name__", "fn"), entries, measured, forward_flops, recomputed)


def print_saved_activations(fn, *inputs, name=None, policy=None):
    """Print the report for `fn(*inputs)` (and return it)."""
    report = saved_activations(fn, *inputs, name=name, policy=policy)
    print(report)
    return report


def _entries(nodes, leaves):
    """One SavedArray per saved array of the live records, buffers charged once."""
    first_seen = {}  # id(buffer) -> record number that first saved it
    entries = []
    for node in nodes:
        for slot, a in enumerate(node.ctx.saved_arrays or ()):
            if a is None:
                continue
            base = backend.storage(a)
            key = id(base)
            category = memory.category(a)
            if category not in (None, "activations"):
                note, charged = f"{category[:-1] if category.endswith('s') else category} (counted under {category})", 0
            elif key in first_seen:
                note, charged = f"shared with #{first_seen[key]}", 0
            else:
                first_seen[key] = node.index
                charged = base.nbytes
                note = "input" if key in leaves else ""
                if base.nbytes != a.nbytes:
                    note = (note + ", " if note else "") + f"view of a {tuple(base.shape)} buffer"
            entries.append(
                SavedArray(node.index, node.name, slot, tuple(a.shape), str(a.dtype), int(a.nbytes), int(base.nbytes), int(charged), note)
            )
    return entries


# -- two reports side by side ------------------------------------------------
class Comparison:
    """What `after` saves instead of `before`, and what it recomputes instead."""

    def __init__(self, before, after):
        self.before, self.after = before, after
        self.only_before = _multiset_minus(before.entries, after.entries)
        self.only_after = _multiset_minus(after.entries, before.entries)

    def __str__(self):
        fmt = memory.format_bytes
        b, a = self.before, self.after
        lines = [f"{b.name} saves {fmt(b.total)}; {a.name} saves {fmt(a.total)} ({fmt(a.total - b.total)})"]
        lines.append(f"saved by {b.name} only (not saved by {a.name}, so recomputed or not needed):")
        lines += ["  " + _describe(e) for e in self.only_before] or ["  (none)"]
        lines.append(f"saved by {a.name} only:")
        lines += ["  " + _describe(e) for e in self.only_after] or ["  (none)"]
        extra = a.recompute_flops - b.recompute_flops
        share = extra / b.forward_flops if b.forward_flops else 0.0
        lines.append(
            f"recompute cost of {a.name}: {_flops(a.recompute_flops)} in {len(a.recomputed)} ops "
            f"({share:+.0%} of one forward of {b.name}, {_flops(b.forward_flops)})"
        )
        by_op = {}
        for r in a.recomputed:
            count, flops = by_op.get(r.op, (0, 0))
            by_op[r.op] = (count + 1, flops + r.flops)
        for op, (count, flops) in sorted(by_op.items(), key=lambda kv: -kv[1][1]):
            lines.append(f"  {op:<14} x{count:<4} {_flops(flops)}")
        return "\n".join(lines)

    __repr__ = __str__


def compare(before, after):
    """Compare two reports (e.g. plain and checkpointed): see `Comparison`."""
    return Comparison(before, after)


def _key(e):
    return (e.op, e.slot, e.shape, e.dtype)


def _multiset_minus(xs, ys):
    """Entries of xs with no counterpart (same op, slot, shape, dtype) left in ys."""
    left = {}
    for y in ys:
        left[_key(y)] = left.get(_key(y), 0) + 1
    out = []
    for x in xs:
        if left.get(_key(x)):
            left[_key(x)] -= 1
        else:
            out.append(x)
    return out


def _describe(e):
    note = f"  ({e.note})" if e.note else ""
    return f"#{e.record:<3} {e.op:<12} slot {e.slot} {str(e.shape):<18} {e.dtype:<8} {memory.format_bytes(e.charged):>10} charged{note}"


def _flops(n):
    for unit, scale in (("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} FLOP"


def _table(rows):
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
