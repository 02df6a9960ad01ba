"""GradScaler: loss scaling for float16 training, with PyTorch's semantics and defaults.

    scaler = GradScaler()
    with autocast("float16"):
        logits, _ = model(input_ids)
        loss = F.cross_entropy(logits, targets, reduction="sum")
    scaler.scale(loss).backward()     # the gradients, times the scale
    scaler.unscale_(optimizer)        # p.grad /= scale; are they all finite?
    clip_grad_norm_(model.parameters(), 1.0)   # clipping sees the true gradients
    scaler.step(optimizer)            # skipped if a gradient is inf or NaN
    scaler.update()                   # halve the scale after an overflow, double it after 2000 good steps

Why: float16's smallest normal number is about 6e-5, and small gradients
round to zero in it. Multiplying the loss by a large power of two moves
every gradient up the same number of binades, out of that range; dividing
the float32 gradients by it again afterwards gives them back. A power of
two only moves the exponent, so with no overflow the unscaled gradients are
bit for bit those of the unscaled loss (tests/test_amp.py proves it). Too
large a scale overflows to inf: that step is skipped and the scale halved.

bfloat16 needs no scaler: its exponent range is float32's (smallest normal
about 1.2e-38), so gradients that fit float32 fit it too.

Defaults, as PyTorch 2.13's torch/amp/grad_scaler.py: init_scale 2**16,
growth_factor 2, backoff_factor 0.5, growth_interval 2000. As there, the
finite check happens in unscale_ (once per optimizer step), step() skips
the optimizer when it found inf or NaN, and update() changes the scale:
times backoff_factor after a skipped step, times growth_factor after
growth_interval good steps in a row. Gradients are unscaled by multiplying
with 1/scale in float32 (PyTorch's inv_scale), exact for a power of two.

The Trainer (train.py, fp16=True) scales each micro-batch's loss, unscales
the accumulated gradients once after GradientAccumulator.write_grads, before
clipping, and lets its own non-finite-step skip do what step() does here.

What does not live here: autocast (autocast.py), the optimizers (optim.py).
"""

import math

import numpy

from . import backend
from .autocast import is_16bit


class GradScaler:
    """Scale the loss up before backward, the gradients down before the step (see the module docstring).

    enabled=False makes every method a pass-through (scale(loss) is loss,
    step() just steps), as PyTorch's does, so one loop serves both.
    """

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, enabled=True):
        if not (isinstance(init_scale, (int, float)) and math.isfinite(init_scale) and init_scale > 0):
            raise ValueError(f"GradScaler: init_scale must be a finite number > 0, got {init_scale!r}")
        if not growth_factor > 1.0:
            raise ValueError(f"GradScaler: growth_factor must be > 1 (the scale grows), got {growth_factor!r}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"GradScaler: backoff_factor must be in (0, 1) (the scale shrinks), got {backoff_factor!r}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
            raise ValueError(f"GradScaler: growth_interval must be an integer >= 1, got {growth_interval!r}")
        self.enabled = bool(enabled)
        self.growth_factor, self.backoff_factor, self.growth_interval = float(growth_factor), float(backoff_factor), growth_interval
        self._scale = float(init_scale)
        self._growth_tracker = 0  # good steps in a row since the scale last changed
        self.found_inf = None  # after unscale_: True if a gradient was inf or NaN; None before it

    def get_scale(self):
        """The scale the next scale(loss) multiplies by (1.0 when disabled)."""
        return self._scale if self.enabled else 1.0

    def scale(self, loss):
        """loss * scale, a new Tensor: backpropagate it instead of the loss."""
        if not self.enabled:
            return loss
        return loss * self._scale

    def unscale_(self, optimizer):
        """Divide every gradient of the optimizer's parameters by the scale, in place; note whether all are finite.

        Once per optimizer step, after the last backward and before clipping
        (or after GradientAccumulator.write_grads). Returns found_inf.
        """
        if not self.enabled:
            return False
        if self.found_inf is not None:
            raise RuntimeError("unscale_() has already been called on this optimizer step; call update() after "
                               "the step, before unscaling the next one")
        inv_scale = 1.0 / self._scale  # exact for a power of two
        found_inf = False
        for p in optimizer.params:
            if p.grad is None:
                continue
            g = p.grad.data
            if is_16bit(g.dtype):
                raise ValueError(f"GradScaler: a parameter's gradient is {g.dtype}; unscale float32 gradients (keep "
                                 "the parameters float32 and run the forward under autocast, which casts)")
            xp = backend.module_of(g)
            g *= g.dtype.type(inv_scale)
            finite = backend.as_array(xp.isfinite(g).all())
            if backend.holds_values(p.device):  # the meta device has no values to overflow: the step is taken
                found_inf = found_inf or not bool(backend.to_host(finite))
        self.found_inf = found_inf
        return found_inf

    def step(self, optimizer):
        """optimizer.step() unless unscale_ found inf or NaN (it unscales first if not yet done). Returns whether it stepped."""
        if not self.enabled:
            optimizer.step()
            return True
        if self.found_inf is None:
            self.unscale_(optimizer)
        if self.found_inf:
            return False
        optimizer.step()
        return True

    def update(self, new_scale=None):
        """After the step: back off after a skipped step, grow after growth_interval good ones; or set new_scale."""
        if not self.enabled:
            return
        if new_scale is not None:
            self._scale = float(new_scale)
        elif self.found_inf:
            self._scale *= self.backoff_factor
            self._growth_tracker = 0
        elif self.found_inf is not None:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                with numpy.errstate(over="ignore"):  # PyTorch keeps the scale in float32
                    grown = float(numpy.float32(self._scale * self.growth_factor))
                if math.isfinite(grown):  # as its kernel does: a scale that would overflow float32 stays
                    self._scale = grown
                self._growth_tracker = 0
        self.found_inf = None

    def state_dict(self):
        """What a checkpoint keeps, PyTorch's keys: the scale and the good steps in a row, and the factors."""
        if not self.enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval, "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state):
        """Restore what state_dict() returned."""
        if not self.enabled:
            return
        self._scale = float(state["scale"])
        self.growth_factor, self.backoff_factor = float(state["growth_factor"]), float(state["backoff_factor"])
        self.growth_interval, self._growth_tracker = int(state["growth_interval"]), int(state["_growth_tracker"])
