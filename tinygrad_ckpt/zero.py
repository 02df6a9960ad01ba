"""ZeRO: N data-parallel ranks each keep 1/N of what they would all hold the same copy of.

    mpiexec -n 4 tinygrad-ckpt train --zero-stage 2

Data parallelism (distributed.py) gives every rank the whole model, its
gradients, the accumulation buffers and AdamW's two moments: N identical
copies. ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", section 5) keeps one copy across the
ranks instead, each rank owning a shard. Stage 1 shards the optimizer state;
stage 2 the gradients too (here: the accumulation buffers, where the
gradients are summed); stage 3 the parameters as well. The names are
DeepSpeed's (`zero_optimization.stage` in its configuration:
TrainingArguments.zero_stage here).

The layout. The trainable parameters of each dtype become views into one flat
array, padded with zeros to N equal shards of S = ceil(P / N) elements; rank
r owns elements [r S, (r + 1) S). The optimizer is built over the rank's
shards only (one Parameter a dtype, a view into the flat array), so AdamW's
moments are S elements, not P: stage 1's saving. AdamW and SGD are
elementwise, so stepping a shard does what stepping the whole parameters
does to those elements, bit for bit; the padding has a zero gradient, and
stays zero (a zero weight, decayed, moved by 0 / (0 + eps)).

One optimizer step, stage 1:

  micro-batches   as data parallelism: each rank adds its gradients into
                  full-size accumulation buffers (views into one padded flat
                  array per dtype); no communication.
  reduce-scatter  each rank receives the sum, over the ranks, of its own
                  shard of the buffers: the first half of an all-reduce.
  write_grads     its shard's gradient: that sum / the global item count.
  clip            the global norm: the ranks' squared norms of their shards,
                  summed (one number all-reduced; the padding adds 0).
  step            the optimizer steps the rank's shards.
  all-gather      every rank's updated shards to every rank: the second half
                  of the all-reduce. So stage 1 sends what data parallelism
                  sends, 2 P elements a step (the paper's 2 Psi, section 7).

Stage 2: the accumulation buffers are the rank's shards only, so each
micro-batch's gradients must reach their owners as soon as its backward
ends. They go chunk by chunk: for r = 0 .. N-1, the S elements of the flat
layout that rank r owns are gathered from the leaf gradients into one
array, summed over the ranks into rank r (an MPI reduce), which adds them
into its buffer; and every leaf gradient whose elements have all been
gathered is freed there and then. So beside the leaf gradients lives one
chunk of S elements at most: a full-size copy of them to reduce-scatter
(4 N S bytes beside the 4 Psi of the leaf gradients) would lift stage 2's
peak above stage 1's. The N reduces send what one reduce-scatter sends, N S
elements a rank. DeepSpeed reduces in buckets during the backward, freeing
each gradient as it goes; here the leaf gradients come out of the backward
whole, and the chunks are the buckets. The price, with accumulation: the
gradients are sent every micro-batch instead of once a step.

Stage 3: each rank keeps only its shard of the parameters. The groups are
one per (unit, dtype): a unit is each item of each ModuleList or Sequential
(GPT's blocks), and the root with the rest (embeddings, final norm, head),
as FSDP wraps each block and then the root (stage3_units). FlatShards keeps
each group's S elements of this rank and nothing more; every parameter's
.data is an Unfetched (shape and dtype, no values: any read raises) except
while its unit is gathered. Per micro-batch (Stage3Hooks, ShardedAccumulator):

  forward         a unit's forward pre-hook all-gathers its groups (N S
                  elements each) and points its parameters at views of them;
                  its forward hook frees them. The root's stays gathered for
                  the whole forward. An op's saved weight is packed into a
                  small handle (saved_tensors_hooks), not kept.
  backward        the first unpack of a unit's handle all-gathers it again,
                  kept until its last handle is unpacked. With checkpointing,
                  the checkpoint's own hooks drop what a segment saves; its
                  recompute calls the blocks again (the plain path:
                  early_stop=False, set by the Trainer), whose pre-hooks gather.
  gradients       a post-accumulate-grad hook on each parameter reduces the
                  gradient's slices to their owners the moment backward adds
                  it, and sets .grad = None: one parameter's gradient at a time.
  step            as stage 2 (write_grads, total_norm, the optimizer on the
                  shards), and no all-gather: the shards are the parameters;
                  the next forward gathers.

So a micro-batch sends 3 P elements (all-gather in forward, in backward,
the reductions: the paper's 3 Psi), with checkpointing no more (the
recompute's gather replaces the backward's), and a tied weight's gradient
once for each use. Evaluation, sampling and saving read the whole model:
GatheredParameters gathers every unit (a rank whose micro-batch is empty at
an epoch's end still runs one example with its loss times 0, to gather and
reduce with the others: train.py).

What ZeRO does not shard: activations (checkpointing is for those), frozen
parameters and buffers (BatchNorm's statistics), and, in stages 1 and 2, the
parameters. What does not live here: MPI and the checks that the ranks agree
(distributed.py), the loop (train.py), the checkpoints: each process's
shard of the optimizer state and the manifest that names them (zero_checkpoint.py).
"""

import numpy

from . import autograd, backend, memory, tape
from .accumulate import GradientAccumulator
from .grad_scaler import GradScaler
from .nn.module import Parameter
from .tensor import Tensor

STAGES = (0, 1, 2, 3)  # TrainingArguments.zero_stage; 0: plain data parallelism


class Unfetched(backend.ReadsRefused):
    """A stage-3 parameter's .data between gathers: its shape and dtype, and no values at all.

    Every read of values raises, naming the parameter (never zeros: a
    stand-in that read back zeros would train on them silently). The meta
    device's arrays are not used: they compute on, without values, and would
    fail only at the loss's .item(), far from the parameter.
    """

    __slots__ = ("shape", "dtype", "device", "name", "__weakref__")

    def __init__(self, shape, dtype, device, name=None):
        self.shape, self.dtype, self.device, self.name = tuple(shape), dtype, device, name

    size = property(lambda self: int(numpy.prod(self.shape, dtype=numpy.int64)))
    ndim = property(lambda self: len(self.shape))
    nbytes, base = 0, None  # it holds nothing, and is no view

    def refusal(self, what):
        name = f"{self.name!r}" if self.name else f"of shape {self.shape}"
        return RuntimeError(
            f"{what} of the parameter {name}: under ZeRO stage 3 this process holds only its shard of it, and "
            "its values exist only while its unit is gathered (during the unit's forward, or inside "
            "`with zero.GatheredParameters(layout):`). Call the module (module(x), not module.forward(x)), "
            "or gather the parameters first")

    def __getattr__(self, attribute):
        if attribute.startswith("__"):  # Python's own probes (copy, pickle): not a read of values
            raise AttributeError(attribute)
        raise self.refusal(f".{attribute}")

    def __array__(self, *args, **kwargs):
        raise self.refusal("numpy.asarray()")

    def __array_ufunc__(self, *args, **kwargs):
        raise self.refusal("a NumPy operation")

    def __array_function__(self, *args, **kwargs):
        raise self.refusal("a NumPy function")

    def _arithmetic(self, *args):
        raise self.refusal("arithmetic")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _arithmetic
    __matmul__ = __rmatmul__ = __pow__ = __neg__ = __iadd__ = __isub__ = __imul__ = __itruediv__ = _arithmetic

    def __getitem__(self, index):
        raise self.refusal("indexing")

    def __setitem__(self, index, value):
        raise self.refusal("writing")

    def __repr__(self):
        return f"Unfetched(shape={self.shape}, dtype={self.dtype})"


class FlatShards:
    """The trainable parameters as views into one padded flat array per group; this rank's shards.

    A group is a (dtype, device) at stages 1 and 2, a (unit, dtype, device)
    at stage 3 (`units`: lists of parameters, stage3_units(model)).
    groups: [(flat array, the indices of its parameters, shard size S)];
    shards: this rank's Parameter of each group, a view of S elements. At
    stage 3 no flat array is kept (groups hold None): the shard is a copy of
    the rank's S elements, and the parameters hold no values (Unfetched)
    except between `gather_(g)` and `free_(g)`, which point them at views
    of the group's whole flat array, all-gathered (`gathered[g]`).
    """

    def __init__(self, parameters, rank, world_size, units=None, comm=None, names=None):
        self.parameters, self.rank, self.world_size, self.comm = [], rank, world_size, comm
        for p in parameters:  # each once (a tied weight is listed twice), as the optimizer takes them
            if all(p is not q for q in self.parameters):
                self.parameters.append(p)
        unit_of = {id(p): u for u, unit in enumerate(units or [self.parameters]) for p in unit}
        by_kind = {}
        for i, p in enumerate(self.parameters):
            by_kind.setdefault((unit_of[id(p)], p.dtype, p.device), []).append(i)
        self.groups, self.shards, self.units = [], [], [[] for _ in units or [()]]  # units: their groups
        self.names = names or {}  # id(parameter) -> its name, for Unfetched's errors
        for (unit, dtype, device), members in by_kind.items():
            S = -(-sum(self.parameters[i].data.size for i in members) // world_size)  # ceil(P / N)
            flat = backend.module_for(device).zeros(S * world_size, dtype=dtype)
            for i, view in zip(members, self.views(flat, members)):
                view[...] = self.parameters[i].data
                self.parameters[i].data = view  # the parameter now lives in the flat array
            memory.track(flat, "parameters")
            if units and comm is not None:  # stage 3: the whole array exists only now: rank 0's, everywhere
                comm.broadcast_(flat)
            self.units[unit].append(len(self.groups))
            self.groups.append((None if units else flat, members, S))
            self.shards.append(Parameter(flat[rank * S : (rank + 1) * S].copy() if units else
                                         flat[rank * S : (rank + 1) * S]))
        self.gathered = [None] * len(self.groups)  # stage 3: each group's whole flat array while gathered
        self.pinned = 0  # stage 3: GatheredParameters blocks entered (the forward hooks free nothing then)
        if units:
            for g in range(len(self.groups)):
                self.free_(g)

    def gather_(self, g):
        """Stage 3: group g's whole flat array, all-gathered from every rank's shard (a new array, counted
        as parameters); its parameters' .data become views of it. Nothing to do if it is gathered already."""
        if self.gathered[g] is None:
            self.gathered[g] = full = self.all_gather(g)
            for i, view in zip(self.groups[g][1], self.views(full, self.groups[g][1])):
                self.parameters[i].data = view
        return self.gathered[g]

    def all_gather(self, g):
        """Group g's whole flat array from every rank's shard: one all-gather of N S elements."""
        S, shard = self.groups[g][2], self.shards[g].data
        full = backend.module_of(shard).empty(S * self.world_size, dtype=shard.dtype)
        full[self.rank * S : (self.rank + 1) * S] = shard
        memory.track(full, "parameters")
        return self.comm.all_gather_(full)

    def free_(self, g):
        """Stage 3: group g's parameters hold no values again (Unfetched); the whole array goes when nothing
        else holds it (a record that saved a view of it keeps it: checkpointing's recompute does)."""
        for i in self.groups[g][1]:
            p = self.parameters[i]
            p.data = Unfetched(p.shape, p.dtype, backend.device_of(self.shards[g].data), self.names.get(id(p)))
        self.gathered[g] = None

    def views(self, flat, members):
        """Views of `flat` shaped as the parameters `members`, in order (the padding is what is left)."""
        views, offset = [], 0
        for i in members:
            p = self.parameters[i]
            views.append(flat[offset : offset + p.data.size].reshape(p.shape))
            offset += p.data.size
        return views

    def padding(self):
        """Each group's padding: the elements past the last parameter (zeros, always); at stage 3, the part of
        it in this rank's shard (the shard is all that is kept)."""
        used = [sum(self.parameters[i].data.size for i in members) for _, members, _ in self.groups]
        return [flat[n:] if flat is not None else shard.data[max(0, n - self.rank * S):]
                for (flat, _, S), shard, n in zip(self.groups, self.shards, used)]


def stage3_units(model):
    """[(module, its parameters)]: each item of each ModuleList or Sequential, then the root with the rest.

    FSDP's wrap-by-block: PyTorch 2.13's torch.distributed.fsdp.fully_shard
    applied to each transformer block and then to the root, whose own group
    holds what no block holds (embeddings, final norm, head). A parameter
    goes to the innermost unit holding it; only trainable parameters are
    sharded (a frozen one stays whole on every process); a unit with none
    is left out.
    """
    from .nn.layers import ModuleList  # Sequential is one

    modules = [model] + [item for m in model.modules() if isinstance(m, ModuleList) for item in m]
    owner = {}
    for u, module in enumerate(modules):  # outer before inner (modules() walks depth first): inner wins
        for p in module.parameters():
            if p.requires_grad:
                owner[id(p)] = u
    units = [(module, [p for p in module.parameters() if owner.get(id(p)) == u]) for u, module in enumerate(modules)]
    return [(module, params) for module, params in units[1:] + units[:1] if params]


class Stage3Hooks:
    """Stage 3 on a model: gather each unit for its forward, free it after, gather it again for backward.

    layout: FlatShards(..., units=[the parameters of each unit of `units`]).
    A forward pre-hook on each unit's module gathers its groups (one
    all-gather of N S elements each) and a forward hook frees them; the
    root's hooks also push, for the whole forward, saved_tensors_hooks whose
    pack turns an array that lives in a gathered group (a weight an op saves
    for backward) into a small handle, so the saved weights do not keep every
    unit alive, and whose unpack gathers that group again when backward
    needs it. A group gathered for backward is kept from its first unpack to
    its last (`pending`: the handles not unpacked yet), so each unit is
    gathered once for backward. Communication per micro-batch, with P
    elements of parameters: P all-gathered in forward, P again in backward,
    P reduced (ZeRO's 3 Psi, the paper's section 7).

    With activation checkpointing, the checkpoint's hooks are innermost:
    they drop what the segment saves, so nothing reaches this pack, and the
    recompute runs the units' forwards again, whose pre-hooks gather again.
    Per micro-batch then: the forward's gather, the recompute's gather, and
    the backward gathers of what is saved outside the checkpointed segments
    (here: the root's head), beside the reductions of the gradients.

    Every process runs the same forward and walks the same graph in the same
    order, so they call the same collectives in the same order.
    """

    def __init__(self, model, units, layout):
        self.model, self.layout = model, layout
        self.pending = [0] * len(layout.groups)  # handles of group g not yet unpacked
        self.for_backward = [None] * len(layout.groups)  # group g's array gathered again for backward
        self.saving = None  # the saved_tensors_hooks pushed for the forward
        self.handles = []
        for (module, _), groups in zip(units, layout.units):
            root = module is model
            self.handles.append(module.register_forward_pre_hook(lambda m, args, g=groups, r=root: self.before(g, r)))
            self.handles.append(module.register_forward_hook(lambda m, args, out, g=groups, r=root: self.after(g, r)))

    def before(self, groups, root):
        if root:
            self.start_forward()
        if root and tape.is_grad_enabled():
            self.saving = autograd.saved_tensors_hooks(self.pack, self.unpack)
            self.saving.__enter__()
        for g in groups:
            self.layout.gather_(g)

    def after(self, groups, root):
        if not self.layout.pinned:  # inside GatheredParameters they stay
            for g in groups:
                self.layout.free_(g)
        if root and self.saving is not None:
            self.saving.__exit__(None, None, None)
            self.saving = None

    def start_forward(self):
        """A new forward: what one that raised left behind (its hooks pushed, its units gathered) goes
        first, and the count of handles starts again (a forward never backpropagated leaves none pending)."""
        if self.saving is not None:
            self.saving.__exit__(None, None, None)
            self.saving = None
        if not self.layout.pinned:
            for g, full in enumerate(self.layout.gathered):
                if full is not None:
                    self.layout.free_(g)
        self.pending, self.for_backward = [0] * len(self.layout.groups), [None] * len(self.layout.groups)

    def pack(self, t):
        array = t.data
        full = backend.storage(array)
        g = next((g for g, a in enumerate(self.layout.gathered) if a is full), None)
        if g is None:
            return t  # an activation: kept as it is
        self.pending[g] += 1
        offset = backend.address(array) - backend.address(full)
        return ("zero3", g, offset, array.shape, array.strides)

    def unpack(self, packed):
        if not (isinstance(packed, tuple) and packed[:1] == ("zero3",)):
            return packed
        _, g, offset, shape, strides = packed
        full = self.layout.gathered[g]
        if full is None:  # gathered for backward: once for all of this group's handles
            if self.for_backward[g] is None:
                self.for_backward[g] = self.layout.all_gather(g)
            full = self.for_backward[g]
            self.pending[g] -= 1
            if self.pending[g] <= 0:
                self.pending[g], self.for_backward[g] = 0, None  # the views handed out keep it while used
        return Tensor(backend.view_at(full, offset, shape, strides))

    def remove(self):
        for handle in self.handles:
            handle.remove()


class GatheredParameters:
    """`with GatheredParameters(layout):` every stage-3 parameter whole, on every process, then sharded again.

    DeepSpeed's deepspeed.zero.GatheredParameters (runtime/zero/
    partition_parameters.py) for evaluation, sampling and saving or loading
    the whole model. All processes enter it together (it all-gathers).
    On exit each process copies its own elements back into its shard, so a
    change made inside (loading a checkpoint, the broadcast of rank 0's
    initial values) must be made alike on every process (DeepSpeed asks for
    a modifier_rank instead, and broadcasts that rank's values).
    """

    def __init__(self, layout):
        self.layout = layout

    def __enter__(self):
        self.layout.pinned += 1
        for g in range(len(self.layout.groups)):
            self.layout.gather_(g)
        return self.layout

    def __exit__(self, *exc):
        layout = self.layout
        layout.pinned -= 1
        if not layout.pinned:
            for g, ((_, _, S), shard) in enumerate(zip(layout.groups, layout.shards)):
                shard.data[...] = layout.gathered[g][layout.rank * S : (layout.rank + 1) * S]
                layout.free_(g)


class ShardedAccumulator(GradientAccumulator):
    """GradientAccumulator's contract over FlatShards; `reduce_scatter_()` once per optimizer step.

    Stage 1: full-size buffers (views into one padded flat array per group),
    summed into this rank's shards by `reduce_scatter_`. Stage 2: shard-sized
    buffers, into which `accumulate` reduces each micro-batch's gradients,
    one shard-sized chunk to each owner. Stage 3: shard-sized buffers, into
    which each gradient is reduced as backward makes it (`reduce_gradient_`,
    a post-accumulate-grad hook). Every way, `write_grads` gives each shard
    Parameter its gradient, the mean over the global items.
    """

    def __init__(self, shards, comm, stage, gradient_accumulation_steps=1, dtype=None):
        if stage not in (1, 2, 3):
            raise ValueError(f"ShardedAccumulator: stage must be 1, 2 or 3, got {stage!r}")
        self.layout, self.comm, self.stage = shards, comm, stage
        self.parameters = shards.parameters
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.dtype = dtype
        self.flats, self.buffers = [], []  # stage 1: the full flat arrays and their views; stages 2, 3: the shards
        for (_, members, S), shard in zip(shards.groups, shards.shards):
            xp = backend.module_of(shard.data)
            buf = xp.zeros(S * (shards.world_size if stage == 1 else 1), dtype=shard.dtype if dtype is None else dtype)
            memory.track(buf, "accumulation")
            self.flats.append(buf)
            self.buffers += shards.views(buf, members) if stage == 1 else [buf]
        self.handles = []
        if stage == 3:  # each gradient to its owners the moment backward adds it into .grad
            for g, (_, members, _) in enumerate(shards.groups):
                starts = numpy.cumsum([0] + [self.parameters[i].data.size for i in members])
                for i, start in zip(members, starts):
                    def hook(p, g=g, start=int(start)):
                        self.reduce_gradient_(p, g, start)
                    self.handles.append(self.parameters[i].register_post_accumulate_grad_hook(hook))
        self.summed = [None] * len(self.flats)  # stage 1: this rank's shard of the sum, after reduce_scatter_
        self.items, self.micro_batches, self.sync_gradients, self.written = 0, 0, False, False

    def accumulate(self, num_items, end_of_data=False):
        if self.stage == 2 and not (self.sync_gradients or self.written):  # this micro-batch's gradients, now
            for (_, members, S), buf in zip(self.layout.groups, self.flats):
                self.reduce_chunks_(members, S, buf)
        return super().accumulate(num_items, end_of_data)  # stage 2: every .grad is None, so it only counts

    def reduce_chunks_(self, members, S, buf):
        """Stage 2: the leaf gradients of one group, summed over the ranks into each owner's shard buffer `buf`.

        Chunk r (elements [r S, (r + 1) S) of the flat layout) is gathered
        from the gradients' slices that fall in it and reduced to rank r; a
        gradient whose last element is in chunk r is freed once it is copied.
        """
        xp = backend.module_of(buf)
        ends = numpy.cumsum([self.parameters[i].data.size for i in members])  # each parameter's end in the layout
        for r in range(self.layout.world_size):
            chunk = xp.zeros(S, dtype=buf.dtype)
            memory.track(chunk, "gradients")  # the one chunk beside the leaf gradients
            for i, stop in zip(members, ends):
                p, start = self.parameters[i], stop - self.parameters[i].data.size
                lo, hi = max(start, r * S), min(stop, (r + 1) * S)
                if p.grad is not None and lo < hi:
                    chunk[lo - r * S : hi - r * S] = p.grad.data.reshape(-1)[lo - start : hi - start]
                if stop <= (r + 1) * S:
                    p.grad = None  # every element copied: freed now, as GradientAccumulator.accumulate frees it
            self.comm.reduce_(chunk, root=r)
            if r == self.layout.rank:
                buf += chunk
            del chunk  # before the next one is made: one chunk at a time

    def reduce_gradient_(self, p, g, start):
        """Stage 3: p's gradient, elements [start, start + size) of group g's layout, summed over the ranks
        into each owner's shard buffer; then p.grad = None, so one parameter's gradient lives at a time.

        Rank r owns [r S, (r + 1) S): the part of the gradient in it is
        reduced to r (an MPI reduce of that slice, in place: no copy), which
        adds it into its buffer. The reduces of all the parameters send P
        elements, what one reduce-scatter of the flat gradient would.
        """
        S, grad = self.layout.groups[g][2], p.grad.data.reshape(-1)
        buf, stop = self.flats[g], start + grad.size
        for r in range(start // S, -(-stop // S)):
            lo, hi = max(start, r * S), min(stop, (r + 1) * S)
            part = self.comm.reduce_(grad[lo - start : hi - start], root=r)
            if r == self.layout.rank:
                buf[lo - r * S : hi - r * S] += part
        p.grad = None

    def reduce_scatter_(self):
        """Stage 1: this rank's shard of the sum over the ranks of each flat buffer (stage 2 has it already)."""
        if self.stage == 1:
            self.summed = [self.comm.reduce_scatter(flat) for flat in self.flats]
            for shard in self.summed:
                memory.track(shard, "gradients")

    def write_grads(self):
        if self.items <= 0 or self.written:
            return super().write_grads()  # its errors
        for shard, summed, buf in zip(self.layout.shards, self.summed, self.flats):
            grad = (summed if self.stage == 1 else buf) / self.items
            shard.grad = Tensor(grad.astype(shard.dtype, copy=False), device=shard.device)
            memory.track(shard.grad.data, "gradients")
        self.written = True
        return self.items

    def zero_grad(self):
        for buf in self.flats:
            buf[...] = 0
        for shard in self.layout.shards:
            shard.grad = None
        self.summed = [None] * len(self.flats)
        self.items, self.micro_batches, self.sync_gradients, self.written = 0, 0, False, False


class ShardedGradScaler(GradScaler):
    """GradScaler whose overflow check covers every rank's shards, as PyTorch's FSDP ShardedGradScaler
    (torch/distributed/fsdp/sharded_grad_scaler.py, 2.13): each rank unscales its own shards, and
    one all-reduce tells all of them whether any rank found an inf or a NaN, so all skip alike."""

    def __init__(self, comm, **kwargs):
        super().__init__(**kwargs)
        self.comm = comm

    def unscale_(self, optimizer):
        found_inf = super().unscale_(optimizer)
        if not self.enabled:
            return found_inf
        found_inf = self.comm.any_(bool(found_inf))
        self._state_of(optimizer)["found_inf"] = found_inf
        return found_inf


def total_norm(parameters, comm):
    """The L2 norm of the gradients of every rank's shards together (clipping's norm, for the whole model).

    Each rank's sum of squares, summed across the ranks, then the square root:
    not each rank's own norm, which would clip each shard by a part of the
    whole (llm.c pull request 524 shows that trap). The padding adds 0.
    """
    squares = 0.0
    for p in parameters:
        if p.grad is not None:
            g = p.grad.data
            square = backend.as_array(backend.module_of(g).vdot(g, g))
            if not backend.holds_values(backend.device_of(square)):
                return None  # the meta device (fit): the square is made, as get_total_norm's; no number to give
            squares += float(backend.to_host(square))
    return float(comm.all_reduce_(numpy.array([squares]))[0] ** 0.5)
