"""Checkpoint policies: which ops of a checkpointed segment keep their results.

What a policy adds to the plain path (checkpoint.py, which recomputes the
whole segment): it decides op by op which results to keep from the forward
instead, as JAX's policies do (`jax.checkpoint_policies`); tutorial 5 sets
them beside Megatron-LM's selective recomputation, which chooses whole
modules. Cost: the kept arrays are saved activations until backward; every
op they spare is one the recompute does not run.

    "save"       keep the op's outputs (and the arrays its backward needs) from
                 the forward; the recompute does not run it again
    "recompute"  keep nothing; the recompute runs it again
    "offload"    as "save", but kept arrays wait in host memory between forward
                 and backward, moved there and back by `save_on_cpu`'s hooks
                 (autograd.py). On CuPy that frees GPU memory; on NumPy the
                 arrays already live in host memory, so "offload" is "save".

A policy is any callable op name -> decision, for example

    >>> import numpy
    >>> from tinygrad_ckpt import Tensor, nn
    >>> from tinygrad_ckpt.checkpoint import checkpoint
    >>> from tinygrad_ckpt.tape import Tape, recording
    >>> def my_policy(op):                 # op: "Linear", "Softmax", "GELU", ...
    ...     return "save" if op == "Linear" else "recompute"
    >>> block = nn.Sequential(nn.Linear(4, 4, rng=numpy.random.default_rng(0)), nn.GELU())
    >>> x = Tensor(numpy.ones((2, 4), dtype=numpy.float32), requires_grad=True)
    >>> with recording(Tape()) as tape:
    ...     y = checkpoint(block, x, policy=my_policy)
    >>> print(tape)                        # x (32 B) and the kept Linear output (2*4 float32, 32 B)
    Tape: 1 records, 64 B of activations saved for backward
      #0   Checkpoint       -> (2, 4)             saved 64 B

Ready-made: `nothing_saveable` (full recompute), `everything_saveable`,
`save_matmuls` (JAX's "dots saveable": keep MatMul and Linear results,
recompute elementwise ops, softmax, dropout, layer norm), `offload_matmuls`,
and `selective_attention`, the transformer block's: keep the projections'
(Linear) outputs, recompute the attention core (q @ k^T, mask, softmax,
dropout, @ v) and the cheap elementwise ops, which is where long sequences
put most of their activation memory. `SaveOnly(*names)` builds more.
Wherever a policy is taken, a ready-made one may also be given by its name
("selective_attention"): see `resolve`.

How it works, through the `Tape.run(op, ctx, arrays, options)` seam (a
policy takes the planned path, recompute.py, even with early_stop=False):
  forward   the segment runs on recompute.SegmentTape, which asks `decide`
            about each op. A kept op's outputs and saved arrays go into the
            `Stash`: an array that is one of the op's inputs is not kept but
            noted by position (in the recompute that input exists anyway).
            The kept arrays go into the Checkpoint record's
            save_for_backward, so they count as saved activations and are
            freed after backward.
  backward  recompute.RecomputeTape replays a kept op (`_Kept.replay`): its
            outputs and saved arrays come from the stash, and it is not run.
            A checkpoint nested inside the segment is never kept: it runs again.

What does not live here: checkpointing itself (checkpoint.py), what the
recompute runs and skips (recompute.py).
"""

from . import backend, function, memory
from .autograd import save_on_cpu
from .tensor import Tensor

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
    raise (ValueError if isinstance(policy, str) else TypeError)(
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
    """What a segment's policy kept from its forward, op by op (recompute.SegmentTape asks it).

    arrays: the kept arrays (counted as saved activations), handed over to
    the Checkpoint record at the end of the forward. Offloaded arrays are
    packed by save_on_cpu's hooks (autograd.py) and stay here, in host
    memory; on NumPy there is no host to move to, and "offload" is "save".
    """

    def __init__(self, policy, segment_name):
        self.policy = policy
        self.segment_name = segment_name
        self.arrays = []

    def keep_op(self, name, ctx, arrays, options, out, decision):
        """Keep what an op the policy saves produced: its outputs and what it saved."""
        return _Kept(self, name, ctx, arrays, options, out, decision == OFFLOAD)

    def keep(self, a, offload):
        """A reference to array `a` that the replay can resolve."""
        if offload and backend.device_of(a) != "cpu":
            packed, _ = function.pack_saved(_OFFLOAD.pack_hook, Tensor(a, device=backend.device_of(a)))
            return ("packed", packed)
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
    """One op the policy kept: its ctx facts, outputs and saved arrays, by reference."""

    def __init__(self, stash, name, ctx, arrays, options, out, offload):
        self.name = name
        outs = out if isinstance(out, tuple) else (out,)
        self.multiple = isinstance(out, tuple)
        self.needs_input_grad = ctx.needs_input_grad
        self.facts = ctx.facts()
        self.outputs = [stash.keep(o, offload) for o in outs]
        self.saved = [None if a is None else where_in_call(a, arrays, options, outs) or stash.keep(a, offload)
                      for a in ctx.saved_arrays or ()]

    def output(self, k, stashed):
        """Its output k, from what was kept."""
        return _resolve(self.outputs[k], None, None, None, stashed)

    def replay(self, ctx, input_array, options, output, stashed):
        """Stand in for the op's forward: its outputs, and its ctx as the forward left it.

        input_array(i): the op's input i in the recompute; options: its options
        there; output(k): its output k, as the recompute fetched it (self.output);
        stashed: the record's kept arrays.
        """
        if tuple(ctx.needs_input_grad) != tuple(self.needs_input_grad):
            raise RuntimeError(
                f"checkpoint policy replay: {self.name} needs gradients for other inputs than in the "
                "forward; the segment's inputs changed requires_grad between forward and backward"
            )
        outs = [output(k) for k in range(len(self.outputs))]
        ctx.__dict__.update(self.facts)
        ctx.save_for_backward(*(None if r is None else _resolve(r, input_array, options, outs, stashed)
                                for r in self.saved))
        return tuple(outs) if self.multiple else outs[0]


def where_in_call(a, arrays, options, outs):
    """Where array `a`, which an op saved, is in the op's call: ('input', i), ('option', key) or
    ('output', j) if it is one of those; else None (the op made it). The stash and recompute.py's
    notes keep this reference instead of the array, where the call has it anyway."""
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


def _resolve(ref, input_array, options, outs, stashed):
    kind = ref[0]
    if kind == "input":
        return input_array(ref[1])
    if kind == "option":
        return options[ref[1]]
    if kind == "output":
        return outs[ref[1]]
    if kind == "stash":
        return stashed[ref[1]]
    return function.unpack_saved(_OFFLOAD.unpack_hook, ref[1])  # "packed": an offloaded array comes back


_OFFLOAD = save_on_cpu()  # the one way arrays move to the host and back (autograd.py)
