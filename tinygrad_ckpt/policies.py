"""Checkpoint policies: which ops of a checkpointed segment keep their results.

A plain checkpoint recomputes the whole segment in backward. A policy, as in
JAX (`jax.checkpoint_policies`) and Megatron-LM's selective recomputation
(Korthikanti et al. 2022), decides op by op instead:

    "save"       keep the op's outputs (and the arrays its backward needs) from
                 the forward; the recompute does not run it again
    "recompute"  keep nothing; the recompute runs it again
    "offload"    as "save", but kept arrays wait in host memory between forward
                 and backward (PyTorch's `save_on_cpu`). On CuPy that frees GPU
                 memory; on NumPy the arrays already live in host memory, so
                 there is nothing to offload to and "offload" is "save".

A policy is any callable op name -> decision, for example

    def my_policy(op):                     # op: "Linear", "Softmax", "GELU", ...
        return "save" if op == "Linear" else "recompute"

    y = checkpoint(block, x, policy=my_policy)

Ready-made: `nothing_saveable` (full recompute), `everything_saveable`,
`save_matmuls` (JAX's "dots saveable": keep MatMul and Linear results,
recompute elementwise ops, softmax, dropout, layer norm), `offload_matmuls`,
and `selective_attention`, the transformer block's: keep the projections'
(Linear) outputs, recompute the attention core (q @ k^T, mask, softmax,
dropout, @ v) and the cheap elementwise ops, which is where long sequences
put most of their activation memory. `SaveOnly(*names)` builds more.
Wherever a policy is taken, a ready-made one may also be given by its name
("selective_attention"): see `resolve`.

How it works, through the `Tape.run(op, ctx, arrays, options)` seam:
  forward   the segment runs on checkpoint.SegmentTape, which hands each op
            to `Stash.forward`. A kept op runs normally (so it saves what its
            backward needs); the stash then keeps its outputs and saved
            arrays. An array that is one of the op's inputs is not kept but
            noted by position: in the recompute that input exists anyway. The
            kept arrays go into the Checkpoint record's save_for_backward,
            so they count as saved activations and are freed after backward.
  backward  the segment runs again on a `ReplayTape`: each op is checked
            against the forward's sequence; a recomputed op runs, a kept op
            does not: its outputs and saved arrays come from the stash.
            So "save_matmuls" never recomputes a matmul.

What does not live here: checkpointing itself (checkpoint.py).
"""

from . import backend, memory, tape

SAVE, RECOMPUTE, OFFLOAD = "save", "recompute", "offload"


class SaveOnly:
    """Policy: keep the results of the named ops, recompute every other op.

    offload=True keeps them in host memory instead (see the module docstring).
    """

    def __init__(self, *names, offload=False):
        self.names = frozenset(names)
        self.offload = offload

    def __call__(self, op):
        if op in self.names:
            return OFFLOAD if self.offload else SAVE
        return RECOMPUTE

    def __repr__(self):
        return f"SaveOnly({', '.join(sorted(self.names))}{', offload=True' if self.offload else ''})"


nothing_saveable = SaveOnly()  # full recompute, as a plain checkpoint
save_matmuls = SaveOnly("MatMul", "Linear")  # JAX's dots_saveable
offload_matmuls = SaveOnly("MatMul", "Linear", offload=True)
selective_attention = SaveOnly("Linear")  # recompute the attention core, keep the projections


def everything_saveable(op):
    """Policy: keep everything (recompute nothing; useful to see the replay alone)."""
    return SAVE


BY_NAME = {"nothing_saveable": nothing_saveable, "everything_saveable": everything_saveable,
           "save_matmuls": save_matmuls, "offload_matmuls": offload_matmuls,
           "selective_attention": selective_attention}


def resolve(policy):
    """A policy from itself (a callable), None, or a ready-made one's name.

    Names let a policy be given where only plain data fits: a command line,
    TrainingArguments.gradient_checkpointing_kwargs (saved with a run).
    """
    if policy is None or callable(policy):
        return policy
    if isinstance(policy, str) and policy in BY_NAME:
        return BY_NAME[policy]
    raise ValueError(
        f"unknown checkpoint policy {policy!r}: give a callable op name -> 'save'/'recompute'/'offload', "
        f"or one of {', '.join(sorted(BY_NAME))}"
    )


def decide(policy, op):
    decision = policy(op)
    if decision not in (SAVE, RECOMPUTE, OFFLOAD):
        raise ValueError(
            f"checkpoint policy {policy!r} returned {decision!r} for op {op}; a policy "
            "returns 'save', 'recompute' or 'offload'"
        )
    return decision


# -- the stash: what a policy kept from the forward ---------------------------
class Stash:
    """The ops a segment's forward ran, in order, with what the policy kept.

    entries: per op, its name (recomputed) or a _Kept. arrays: the kept arrays
    (counted as saved activations), handed over to the Checkpoint record at
    the end of the forward. Offloaded arrays stay here, in host memory.
    """

    def __init__(self, policy, segment_name):
        self.policy = policy
        self.segment_name = segment_name
        self.entries = []
        self.arrays = []

    def forward(self, op, ctx, arrays, options):
        """Run one op of the segment's forward, keeping what the policy says."""
        decision = decide(self.policy, op.__name__)
        if decision == RECOMPUTE:
            ctx.needs_input_grad = (False,) * len(arrays)  # so the op saves nothing
            self.entries.append(op.__name__)
            return op.run_forward(ctx, arrays, options)
        out = op.run_forward(ctx, arrays, options)  # saves what its backward needs
        self.entries.append(_Kept(self, op.__name__, ctx, arrays, options, out, decision == OFFLOAD))
        ctx.free()  # the stash holds what it keeps; the op's own holds go
        return out

    def keep(self, a, offload):
        """A reference to array `a` that the replay can resolve."""
        if offload and backend.device_of(a) != "cpu":
            return ("host", backend.to_host(a), backend.device_of(a))
        for k, b in enumerate(self.arrays):
            if b is a:
                return ("stash", k)
        memory.track(a, "activations")
        self.arrays.append(a)
        return ("stash", len(self.arrays) - 1)

    def hand_over(self):
        """The kept arrays, for the Checkpoint record to save (and count)."""
        arrays, self.arrays = self.arrays, None
        for a in arrays:
            memory.release(a, "activations")  # the record's save_for_backward holds them now
        return tuple(arrays)


class _Kept:
    """One op the policy kept: its ctx attributes, outputs and saved arrays, by reference."""

    def __init__(self, stash, name, ctx, arrays, options, out, offload):
        self.name = name
        self.multiple = isinstance(out, tuple)
        outs = out if self.multiple else (out,)
        self.needs_input_grad = ctx.needs_input_grad
        self.attrs = {k: v for k, v in vars(ctx).items() if k not in ("op", "needs_input_grad", "saved_arrays", "saved_versions")}
        self.outputs = [stash.keep(o, offload) for o in outs]
        self.saved = [None if a is None else _where(a, arrays, options, outs) or stash.keep(a, offload)
                      for a in ctx.saved_arrays or ()]

    def replay(self, ctx, arrays, options, stashed):
        """Stand in for the op's forward: its outputs, and its ctx as the forward left it."""
        if tuple(ctx.needs_input_grad) != tuple(self.needs_input_grad):
            raise RuntimeError(
                f"checkpoint policy replay: {self.name} needs gradients for other inputs than in the "
                "forward; the segment's inputs changed requires_grad between forward and backward"
            )
        outs = [_resolve(r, arrays, options, None, stashed) for r in self.outputs]
        ctx.__dict__.update(self.attrs)
        ctx.save_for_backward(*(None if r is None else _resolve(r, arrays, options, outs, stashed) for r in self.saved))
        return tuple(outs) if self.multiple else outs[0]


def _where(a, arrays, options, outs):
    """('input', i), ('option', key) or ('output', j) if `a` is one of those; else None."""
    for i, b in enumerate(arrays):
        if a is b:
            return ("input", i)
    for k, b in options.items():
        if a is b:
            return ("option", k)
    for j, b in enumerate(outs):
        if a is b:
            return ("output", j)
    return None


def _resolve(ref, arrays, options, outs, stashed):
    kind = ref[0]
    if kind == "input":
        return arrays[ref[1]]
    if kind == "option":
        return options[ref[1]]
    if kind == "output":
        return outs[ref[1]]
    if kind == "stash":
        return stashed[ref[1]]
    return backend.to_device(ref[1], ref[2])  # "host": an offloaded array comes back


# -- the tape a policy's recompute runs on --------------------------------------
class ReplayTape(tape.Tape):
    """Records the recompute like a fresh Tape, but replays the ops the policy kept."""

    def __init__(self, stash, stashed_arrays):
        super().__init__()
        self.stash = stash
        self.stashed = stashed_arrays
        self.position = 0

    def run(self, op, ctx, arrays, options):
        entries, i = self.stash.entries, self.position
        expected = _name(entries[i]) if i < len(entries) else "nothing more"
        if expected != op.__name__:
            raise RuntimeError(
                f"checkpoint: the recompute of segment '{self.stash.segment_name}' ran {op.__name__} "
                f"as op #{i}, where its forward ran {expected}; a segment with a policy must run "
                "the same ops in the same order each time"
            )
        self.position += 1
        if isinstance(entries[i], str):
            return op.run_forward(ctx, arrays, options)  # recomputed
        return entries[i].replay(ctx, arrays, options, self.stashed)  # kept: not run again

    def finish(self):
        if self.position != len(self.stash.entries):
            raise RuntimeError(
                f"checkpoint: the recompute of segment '{self.stash.segment_name}' ran "
                f"{self.position} ops, its forward ran {len(self.stash.entries)}; a segment with a "
                "policy must run the same ops in the same order each time"
            )


def _name(entry):
    return entry if isinstance(entry, str) else entry.name
