"""Gradient accumulation with explicit buffers: GradientAccumulator.

What lives here: the accumulator, and nothing else. The loop that uses it is
in train.py (Trainer); the optimizers are in optim.py.
"""

import numbers

from . import backend, memory
from .tensor import Tensor


class GradientAccumulator:
    """Train with a large batch that does not fit: add up the gradients of small ones.

    You want an effective batch of 128 examples but only 16 fit in memory.
    Run 8 micro-batches of 16, each forward then backward at once (so each
    micro-batch's activations are freed before the next one starts), add
    their gradients into buffers, and take one optimizer step with the total.
    Done right, the step is the same as the step of the batch of 128.

        acc = GradientAccumulator(model.parameters(), gradient_accumulation_steps=8)
        for batch in micro_batches:
            logits, _ = model(batch["input_ids"])                  # (B, T, vocab)
            loss = F.cross_entropy(logits, batch["labels"], reduction="sum")
            loss.backward()                      # p.grad = d(sum of this micro-batch's losses)/dp
            num_items = int((batch["labels"] != -100).sum())       # tokens that count
            acc.accumulate(num_items)            # buffer += p.grad; p.grad = None; count items
            if acc.sync_gradients:               # this micro-batch ends a group: step now
                acc.write_grads()                # p.grad = buffer / items in the whole group
                clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                acc.zero_grad()                  # buffers to 0, counts to 0, p.grad = None

    This is nanoGPT's loop (backward each micro-step, then clip, step, zero),
    with the buffers made visible.

    The normalisation, which is the part that is easy to get wrong. The
    big-batch loss is the mean over all N items (samples, or tokens whose
    label is not ignored) of the effective batch:

        L = (1/N) * sum over all items of loss_i,    N = n_1 + ... + n_k

    so the gradient to hand the optimizer is (sum of per-item gradients) / N.
    That is why each micro-batch backpropagates the SUM of its per-item
    losses (reduction="sum"), tells `accumulate` how many items it had, and
    `write_grads` divides once, by the total. The common shortcut, averaging
    each micro-batch (reduction="mean") and dividing by the number of
    micro-batches k, computes

        (1/k) * sum over micro-batches j of (1/n_j) * sum of loss_i in j

    a "mean of means", which weights an item in a small micro-batch more than
    one in a big micro-batch. It equals L only when every n_j is the same;
    it is wrong for a short last batch, and for padded sequences, where the
    number of non-ignored tokens differs from batch to batch.

    The short last group. An epoch of 100 examples with micro-batches of 16
    and gradient_accumulation_steps=2 makes groups of 32, 32, 32 and 4 examples.
    The last group has one micro-batch (of 4) instead of two. Pass
    `end_of_data=True` to `accumulate` for the last micro-batch of the data:
    `sync_gradients` is then True, and the step taken with it is the exact mean
    gradient over the items that group has (divided by its own count, 4), so
    it is a smaller batch, not a down-weighted one. (Accelerate flushes the
    last group silently at the end of the dataloader; with its usual loss /
    gradient_accumulation_steps scaling that step is also scaled down by the
    fraction of the group that was there.) If you would rather drop a short
    last group, call `zero_grad()` instead of `write_grads()` and step.

    Buffers. One per parameter, allocated once here and reused by every
    group (zeroed in place), counted as "accumulation" in memory.py.
    They may have their own `dtype`: float64 buffers for float32 parameters
    let you measure how much rounding error a long float32 accumulation adds.
    They cost one more gradient-sized array per parameter than PyTorch,
    which adds into p.grad itself; here the buffer is a thing you can see.
    When a buffer has the parameter's dtype, `write_grads` divides it in
    place and hands it over as p.grad, so no third copy is made.

    Data parallel training (several processes, each with its own
    micro-batches) fits between `accumulate` and `write_grads`: sum
    `buffers` and `items` across processes once per optimizer step, then
    every process divides by the global item count.

    Attributes you may read: `buffers` (list of arrays, one per parameter, in
    the order of `parameters`), `items` and `micro_batches` (counted in the
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
