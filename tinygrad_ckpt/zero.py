"""ZeRO: N data-parallel ranks each keep 1/N of what they would all hold the same copy of.

    mpiexec -n 4 tinygrad-ckpt train --zero-stage 2

Data parallelism (distributed.py) gives every rank the whole model, its
gradients, the accumulation buffers and AdamW's two moments: N identical
copies. ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", section 5) keeps one copy across the
ranks instead, each rank owning a shard. Stage 1 shards the optimizer state;
stage 2 the gradients too (here: the accumulation buffers, where the
gradients are summed); stage 3 would shard the parameters as well, and is
not built yet. The names are DeepSpeed's (`zero_optimization.stage` in its
configuration: TrainingArguments.zero_stage here).

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

What ZeRO does not shard: activations (checkpointing is for those), frozen
parameters and buffers (BatchNorm's statistics), and, in stages 1 and 2, the
parameters. What does not live here: MPI and the checks that the ranks agree
(distributed.py), the loop (train.py), the checkpoints: each process's
shard of the optimizer state and the manifest that names them (zero_checkpoint.py).
"""

import numpy

from . import backend, memory
from .accumulate import GradientAccumulator
from .grad_scaler import GradScaler
from .nn.module import Parameter
from .tensor import Tensor

STAGES = (0, 1, 2)  # TrainingArguments.zero_stage; 0: plain data parallelism


class FlatShards:
    """The trainable parameters as views into one padded flat array per (dtype, device); this rank's shards.

    groups: [(flat array, the indices of its parameters, shard size S)];
    shards: this rank's Parameter of each group, a view of S elements.
    """

    def __init__(self, parameters, rank, world_size):
        self.parameters, self.rank, self.world_size = [], rank, world_size
        for p in parameters:  # each once (a tied weight is listed twice), as the optimizer takes them
            if all(p is not q for q in self.parameters):
                self.parameters.append(p)
        by_kind = {}
        for i, p in enumerate(self.parameters):
            by_kind.setdefault((p.dtype, p.device), []).append(i)
        self.groups, self.shards = [], []
        for (dtype, device), members in by_kind.items():
            S = -(-sum(self.parameters[i].data.size for i in members) // world_size)  # ceil(P / N)
            flat = backend.module_for(device).zeros(S * world_size, dtype=dtype)
            for i, view in zip(members, self.views(flat, members)):
                view[...] = self.parameters[i].data
                self.parameters[i].data = view  # the parameter now lives in the flat array
            memory.track(flat, "parameters")
            self.groups.append((flat, members, S))
            self.shards.append(Parameter(flat[rank * S : (rank + 1) * S]))

    def views(self, flat, members):
        """Views of `flat` shaped as the parameters `members`, in order (the padding is what is left)."""
        views, offset = [], 0
        for i in members:
            p = self.parameters[i]
            views.append(flat[offset : offset + p.data.size].reshape(p.shape))
            offset += p.data.size
        return views

    def padding(self):
        """Each group's padding: the elements past the last parameter (zeros, always)."""
        return [flat[sum(self.parameters[i].data.size for i in members):] for flat, members, _ in self.groups]


class ShardedAccumulator(GradientAccumulator):
    """GradientAccumulator's contract over FlatShards; `reduce_scatter_()` once per optimizer step.

    Stage 1: full-size buffers (views into one padded flat array per group),
    summed into this rank's shards by `reduce_scatter_`. Stage 2: shard-sized
    buffers, into which `accumulate` reduces each micro-batch's gradients,
    one shard-sized chunk to each owner. Either way `write_grads` gives each shard Parameter its
    gradient, the mean over the global items.
    """

    def __init__(self, shards, comm, stage, gradient_accumulation_steps=1, dtype=None):
        if stage not in (1, 2):
            raise ValueError(f"ShardedAccumulator: stage must be 1 or 2, got {stage!r}")
        self.layout, self.comm, self.stage = shards, comm, stage
        self.parameters = shards.parameters
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.dtype = dtype
        self.flats, self.buffers = [], []  # stage 1: the full flat arrays and their views; stage 2: the shards
        for flat, members, S in shards.groups:
            xp = backend.module_of(flat)
            buf = xp.zeros(S * (shards.world_size if stage == 1 else 1), dtype=flat.dtype if dtype is None else dtype)
            memory.track(buf, "accumulation")
            self.flats.append(buf)
            self.buffers += shards.views(buf, members) if stage == 1 else [buf]
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
