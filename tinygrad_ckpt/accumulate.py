"""Gradient accumulation with explicit buffers: GradientAccumulator.

What lives here: the accumulator, and nothing else. The loop that uses it is
in train.py (Trainer); the optimizers are in optim.py.
"""

import numbers

from . import backend, memory
from .tensor import Tensor


class GradientAccumulator:
    """Gradients of micro-batches added into buffers, for one optimizer step with their mean.

    >>> import numpy
    >>> from tinygrad_ckpt import Tensor
    >>> from tinygrad_ckpt.nn import Parameter
    >>> w = Parameter(numpy.zeros(1, dtype=numpy.float32))
    >>> acc = GradientAccumulator([w], gradient_accumulation_steps=2)
    >>> for batch in ([1.0, 2.0, 3.0], [6.0]):       # micro-batches of 3 items and 1
    ...     (w * Tensor(batch)).sum().backward()      # the SUM of this micro-batch's losses
    ...     acc.accumulate(len(batch))                # buffer += w.grad; count the items
    False
    True
    >>> acc.sync_gradients                            # the 2nd micro-batch ended the group
    True
    >>> acc.write_grads()                             # w.grad = buffer / the group's 4 items
    4
    >>> w.grad.data                                   # the mean over all 4: (1 + 2 + 3 + 6) / 4
    array([3.], dtype=float32)
    >>> acc.zero_grad()                               # after the optimizer step: buffers and counts to 0

    In a training loop, clip and step the optimizer between `write_grads`
    and `zero_grad` (train.py's Trainer does).

    The contract: each micro-batch backpropagates the SUM of its per-item
    losses and passes its item count to `accumulate`; `write_grads` divides
    once, by the items of the whole group. The step is then the step of the
    big batch's mean loss, whatever the micro-batch sizes (averaging each
    micro-batch and dividing by their number is not: tutorial 4, "The
    pitfall: a mean of means", tutorials/04_gradient_accumulation.md).

    A short last group: pass `end_of_data=True` with the data's last
    micro-batch. The group ends there (`sync_gradients` is True) and
    `write_grads` divides by that group's own item count: the step is the
    exact mean over the items it has, a smaller batch, not a down-weighted
    one. To drop a short group instead, call `zero_grad()` without stepping.

    Buffers: one per parameter, allocated once here and zeroed in place by
    every group, counted as "accumulation" in memory.py: one more
    parameter-sized array than PyTorch, which adds into p.grad itself.
    `dtype` gives them their own dtype (float64 buffers for float32
    parameters measure the rounding a long float32 accumulation adds). When
    a buffer has the parameter's dtype, `write_grads` divides it in place and
    hands it over as p.grad: no third copy is made.

    Data parallel training (distributed.py) fits between `accumulate` and
    `write_grads`: sum `buffers` and `items` across processes once per
    optimizer step, then every process divides by the global item count.

    Attributes you may read: `buffers` (one array per parameter, in the
    order of `parameters`), `items` and `micro_batches` (counted in the
    current group), `sync_gradients` (did the last `accumulate` end a group).
    """

    def __init__(self, parameters, gradient_accumulation_steps=1, dtype=None):
        if isinstance(gradient_accumulation_steps, bool) or not isinstance(gradient_accumulation_steps, numbers.Integral):
            raise TypeError(f"gradient_accumulation_steps must be an int, got {gradient_accumulation_steps!r}")
        if gradient_accumulation_steps < 1:
            raise ValueError(
                f"gradient_accumulation_steps must be at least 1 (1 = no accumulation), got {gradient_accumulation_steps}"
            )
        self.parameters = list(parameters)
        if not self.parameters:
            raise ValueError("GradientAccumulator: no parameters given (did you pass an exhausted generator?)")
        self.gradient_accumulation_steps = int(gradient_accumulation_steps)
        self.buffers = []
        for p in self.parameters:
            xp = backend.array_module(p.data)
            buf = xp.zeros(p.shape, dtype=p.dtype if dtype is None else dtype)
            memory.track(buf, "accumulation")
            self.buffers.append(buf)
        self.items = 0  # items (samples or counted tokens) summed into the buffers so far
        self.micro_batches = 0  # micro-batches in the current group
        self.sync_gradients = False  # True after the micro-batch that ends a group
        self.written = False  # write_grads() has divided the buffers in this group

    def accumulate(self, num_items, end_of_data=False):
        """Add each parameter's .grad into its buffer, drop the .grad, count `num_items`.

        Call once per micro-batch, right after its backward. `num_items` is the
        number of items whose losses were summed in that backward (samples, or
        non-ignored tokens). Returns (and sets) `sync_gradients`: True when
        this micro-batch ends a group, because it is the
        gradient_accumulation_steps-th of the group or because `end_of_data`
        says the data ended (a short last group).
        """
        if self.sync_gradients or self.written:
            raise RuntimeError(
                "accumulate() after a group ended: call write_grads(), step the optimizer, "
                "then zero_grad() before the next micro-batch"
            )
        if num_items < 0:
            raise ValueError(f"num_items must be >= 0, got {num_items}")
        for p, buf in zip(self.parameters, self.buffers):
            if p.grad is None:
                continue  # a parameter this micro-batch did not use: its gradient is zero
            buf += p.grad.data  # in place: the buffer is never reallocated
            p.grad = None  # free this micro-batch's gradient now
        self.items += int(num_items)
        self.micro_batches += 1
        self.sync_gradients = self.micro_batches == self.gradient_accumulation_steps or bool(end_of_data)
        memory.tracker.mark("GradientAccumulator.accumulate")  # a timeline shows the .grad go into the buffers
        return self.sync_gradients

    def write_grads(self):
        """Set every p.grad to (its buffer) / (items in the group), the mean gradient.

        This is the one place the normalisation happens. Returns the item
        count it divided by.
        """
        if self.items <= 0:
            raise ValueError(
                "write_grads(): no items were counted in this group (every label ignored, or "
                "accumulate() never called), so there is no mean gradient to take"
            )
        if self.written:
            raise RuntimeError("write_grads() twice in one group: call zero_grad() after the optimizer step")
        for p, buf in zip(self.parameters, self.buffers):
            if buf.dtype == p.dtype:
                buf /= self.items  # in place: the buffer itself becomes p.grad until zero_grad()
                p.grad = Tensor(buf, device=p.device)
            else:
                grad = (buf / self.items).astype(p.dtype)
                p.grad = Tensor(grad, device=p.device)
                memory.track(grad, "gradients")
        self.written = True
        memory.tracker.mark("GradientAccumulator.write_grads")
        return self.items

    def zero_grad(self):
        """Start a new group: buffers to zero (in place), counts to zero, p.grad = None."""
        for p, buf in zip(self.parameters, self.buffers):
            p.grad = None
            buf.fill(0)
        self.items = 0
        self.micro_batches = 0
        self.sync_gradients = False
        self.written = False
        memory.tracker.mark("GradientAccumulator.zero_grad")
