"""GradScaler: loss scaling for float16 training, with PyTorch's semantics and defaults.

    >>> import numpy
    >>> from tinygrad_ckpt import Tensor
    >>> from tinygrad_ckpt.nn import Parameter
    >>> from tinygrad_ckpt.optim import SGD
    >>> w = Parameter(numpy.ones(2, dtype=numpy.float32))
    >>> optimizer, scaler = SGD([w], lr=0.5), GradScaler()
    >>> scaler.scale((w * Tensor([3.0, 4.0])).sum()).backward()
    >>> w.grad.data                   # the gradients, times the scale 2**16
    array([196608., 262144.], dtype=float32)
    >>> scaler.unscale_(optimizer)    # p.grad /= scale (clip after this); was any inf or NaN?
    False
    >>> w.grad.data
    array([3., 4.], dtype=float32)
    >>> scaler.step(optimizer), w.data      # stepped: w - 0.5 * grad
    (True, array([-0.5, -1. ], dtype=float32))
    >>> scaler.update()
    >>> optimizer.zero_grad()
    >>> scaler.scale((w * Tensor([float("inf"), 1.0])).sum()).backward()
    >>> scaler.step(optimizer), w.data      # a gradient is inf: the step is skipped ...
    (False, array([-0.5, -1. ], dtype=float32))
    >>> scaler.update(); scaler.get_scale()  # ... and the scale halved (doubled after 2000 good steps)
    32768.0

In float16 training the forward runs under `autocast("float16")`
(autocast.py) and the parameters stay float32.

Why: float16's smallest normal number is about 6.1e-5; below it a value
becomes subnormal and loses precision bit by bit, and below about 3e-8 (half
the smallest subnormal, 2**-24) it rounds to zero. Small gradients land
there. Multiplying the loss by a large power of two moves every gradient up
the same number of binades (a binade: the numbers between two neighbouring
powers of two), out of that range; dividing the float32
gradients by it again afterwards gives them back. Where nothing overflows or
is subnormal (float32, bfloat16) a power of two only moves the exponent, so
the unscaled gradients are bit for bit those of the unscaled loss
(tests/test_amp.py proves it for float32 and bfloat16). In float16 they are
not: without the scale the small ones would have underflowed, so the scaled
run is the more accurate one, not an identical one. Too large a scale
overflows to inf: that step is skipped and the scale halved.

bfloat16 needs no scaler: its exponent range is float32's (smallest normal
about 1.2e-38), so gradients that fit float32 fit it too.

Defaults and rules as PyTorch 2.13's torch/amp/grad_scaler.py: init_scale
2**16, growth_factor 2, backoff_factor 0.5, growth_interval 2000. As
there, the state of a step is kept per optimizer (READY, then UNSCALED after
unscale_, then STEPPED after step, until update() makes every optimizer
READY again): unscale_(opt0) then step(opt1) unscales and checks opt1's own
gradients. step() skips the optimizer when its gradients held inf or NaN;
update() changes the scale once per iteration, from every optimizer's check:
times backoff_factor if any found inf or NaN, times growth_factor after
growth_interval good iterations in a row. Calling them out of order is
PyTorch's RuntimeError: unscale_ twice, unscale_ after step, step twice,
update() with no inf check since the last update(). Gradients are unscaled
by multiplying with 1/scale in float32 (PyTorch's inv_scale), exact for a
power of two. Unlike PyTorch's, unscale_ returns whether it found inf or
NaN and step() whether it stepped (PyTorch's returns None and
optimizer.step()'s value): a teaching loop prints them.

The Trainer (train.py, fp16=True) scales each micro-batch's loss, unscales
the accumulated gradients once after GradientAccumulator.write_grads, before
clipping, and lets its own non-finite-step skip do what step() does here.

What does not live here: autocast (autocast.py), the optimizers (optim.py).
"""

import math
import numbers

import numpy

from . import backend
from .autocast import is_16bit
from .tensor import Tensor

# Where one optimizer is within an iteration (PyTorch's OptState).
READY, UNSCALED, STEPPED = "ready", "unscaled", "stepped"

# What state_dict() holds: PyTorch's keys (state_problem says what each must be).
STATE_FIELDS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


class GradScaler:
    """Scale the loss up before backward, the gradients down before the step (see the module docstring).

    enabled=False makes every method a pass-through (scale(loss) is loss,
    step() just steps), as PyTorch's does, so one loop serves both.
    """

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, enabled=True):
        state = {"scale": init_scale, "growth_factor": growth_factor, "backoff_factor": backoff_factor,
                 "growth_interval": growth_interval, "_growth_tracker": 0}
        problem = state_problem(state, scale_name="init_scale")
        if problem is not None:
            raise ValueError(f"GradScaler: {problem}")
        self.enabled = bool(enabled)
        self.growth_factor, self.backoff_factor, self.growth_interval = float(growth_factor), float(backoff_factor), growth_interval
        self._scale = float(init_scale)
        self._growth_tracker = 0  # good iterations in a row since the scale last changed
        # id(optimizer) -> {"stage": READY | UNSCALED | STEPPED, "found_inf": True, False, or None (nothing checked)}
        self._per_optimizer_states = {}

    def _state_of(self, optimizer):
        return self._per_optimizer_states.setdefault(id(optimizer), {"stage": READY, "found_inf": None})

    def get_scale(self):
        """The scale the next scale(loss) multiplies by (1.0 when disabled)."""
        return self._scale if self.enabled else 1.0

    def scale(self, outputs):
        """outputs * scale, a new Tensor: backpropagate it instead of the loss.

        outputs may also be a list or tuple of Tensors (nested too): each is
        scaled, in a container of the same type, as PyTorch 2.13's scale()
        does (there any other iterable gives a lazy map; here it is refused).
        """
        if not self.enabled:
            return outputs
        if isinstance(outputs, Tensor):
            return outputs * self._scale
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise ValueError(f"outputs must be a Tensor or an iterable of Tensors (a list or a tuple here), "
                         f"got a {type(outputs).__name__}")

    def unscale_(self, optimizer):
        """Divide every gradient of the optimizer's parameters by the scale, in place; note whether all are finite.

        Once per optimizer per iteration, after its last backward and before
        clipping (or after GradientAccumulator.write_grads). Returns True if
        a gradient was inf or NaN, False if none was, None if no parameter
        of the optimizer has a gradient (nothing was checked).
        """
        if not self.enabled:
            return False
        state = self._state_of(optimizer)
        if state["stage"] == UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] == STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = 1.0 / self._scale  # exact for a power of two
        found_inf = None
        for p in optimizer.params:
            if p.grad is None:
                continue
            g = p.grad.data
            if is_16bit(g.dtype):
                raise ValueError(f"GradScaler: a parameter's gradient is {g.dtype}; unscale float32 gradients (keep "
                                 "the parameters float32 and run the forward under autocast, which casts)")
            xp = backend.module_of(g)
            g *= g.dtype.type(inv_scale)
            finite = backend.as_array(xp.isfinite(g).all())  # made on every device: the meta device counts it
            # The meta device has no values to overflow: its step is taken, as a finite step is.
            finite = bool(backend.to_host(finite)) if backend.holds_values(p.device) else True
            found_inf = bool(found_inf) or not finite
        state["stage"], state["found_inf"] = UNSCALED, found_inf
        return found_inf

    def step(self, optimizer):
        """optimizer.step() unless its gradients held inf or NaN (unscaling them first if unscale_ was not called).

        Returns whether it stepped. Once per optimizer per iteration: a
        second step() before update() is a RuntimeError, as in PyTorch.
        """
        if not self.enabled:
            optimizer.step()
            return True
        state = self._state_of(optimizer)
        if state["stage"] == STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] == READY:
            self.unscale_(optimizer)
        if state["found_inf"] is None:
            raise RuntimeError("No inf checks were recorded for this optimizer: none of its parameters has a "
                               "gradient. Call scaler.scale(loss).backward() before scaler.step(optimizer)")
        state["stage"] = STEPPED
        if state["found_inf"]:
            return False
        optimizer.step()
        return True

    def update(self, new_scale=None):
        """End the iteration: back off if any optimizer's gradients held inf or NaN, grow after growth_interval
        good iterations in a row; or set new_scale. Every optimizer is READY again afterwards.

        Without new_scale, at least one optimizer must have been checked
        (step() or unscale_) since the last update(), or it is PyTorch's
        "No inf checks were recorded" error.
        """
        if not self.enabled:
            return
        if new_scale is not None:
            if isinstance(new_scale, bool) or not isinstance(new_scale, numbers.Real) or not (
                    math.isfinite(new_scale) and new_scale > 0):
                raise ValueError(f"GradScaler.update: new_scale must be a finite number > 0, got {new_scale!r}")
            self._scale = float(new_scale)
        else:
            found = [s["found_inf"] for s in self._per_optimizer_states.values() if s["found_inf"] is not None]
            if not found:
                raise RuntimeError("No inf checks were recorded prior to update(): call scaler.step(optimizer) "
                                   "(or scaler.unscale_(optimizer)) after backward and before update()")
            if any(found):
                self._scale *= self.backoff_factor
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self.growth_interval:
                    with numpy.errstate(over="ignore"):  # PyTorch keeps the scale in float32
                        grown = float(numpy.float32(self._scale * self.growth_factor))
                    if math.isfinite(grown):  # as its kernel does: a scale that would overflow float32 stays
                        self._scale = grown
                    self._growth_tracker = 0
        self._per_optimizer_states = {}

    def state_dict(self):
        """What a checkpoint keeps, PyTorch's keys: the scale and the good steps in a row, and the factors.

        {} when disabled, as PyTorch's. Call it after update(), between iterations.
        """
        if not self.enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval, "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state):
        """Restore what state_dict() returned; all of it is checked first (ValueError naming the field).

        The {} a disabled scaler saves is PyTorch's RuntimeError. A disabled
        scaler loads nothing.
        """
        if not self.enabled:
            return
        if isinstance(state, dict) and len(state) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved from a disabled "
                               "instance of GradScaler.")
        problem = state_problem(state)
        if problem is not None:
            raise ValueError(f"GradScaler.load_state_dict: {problem}")
        self._scale = float(state["scale"])
        self.growth_factor, self.backoff_factor = float(state["growth_factor"]), float(state["backoff_factor"])
        self.growth_interval, self._growth_tracker = int(state["growth_interval"]), int(state["_growth_tracker"])


def state_problem(state, scale_name="scale"):
    """What is wrong with a GradScaler state dict, in words naming the field; None if nothing is.

    The state one a scaler can reach: scale a finite number > 0,
    growth_factor > 1, backoff_factor in (0, 1), growth_interval an integer
    >= 1, _growth_tracker an integer in [0, growth_interval) (update() resets
    it at growth_interval; one past it would never grow the scale again).
    resume.verify_checkpoint uses it on a checkpoint's scaler before anything
    is restored.
    """
    if not isinstance(state, dict):
        return f"the state is a {type(state).__name__}, not a dict"
    missing = [k for k in STATE_FIELDS if k not in state]
    if missing:
        return f"the state has no {', '.join(map(repr, missing))} (a GradScaler state_dict() has {STATE_FIELDS})"
    unknown = sorted(map(str, set(state) - set(STATE_FIELDS)))
    if unknown:
        return f"the state has unknown key(s) {unknown} (a GradScaler state_dict() has {STATE_FIELDS})"

    def real(v):
        return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)

    def integer(v):
        return isinstance(v, (int, numpy.integer)) and not isinstance(v, bool)

    scale, growth, backoff = state["scale"], state["growth_factor"], state["backoff_factor"]
    interval, tracker = state["growth_interval"], state["_growth_tracker"]
    if not (real(scale) and scale > 0):
        return f"{scale_name} must be a finite number > 0, got {scale!r}"
    if not (real(growth) and growth > 1):
        return f"growth_factor must be a finite number > 1 (the scale grows), got {growth!r}"
    if not (real(backoff) and 0 < backoff < 1):
        return f"backoff_factor must be a number in (0, 1) (the scale shrinks), got {backoff!r}"
    if not (integer(interval) and interval >= 1):
        return f"growth_interval must be an integer >= 1, got {interval!r}"
    if not (integer(tracker) and 0 <= tracker < interval):
        return f"_growth_tracker must be an integer in [0, growth_interval={interval}), got {tracker!r}"
    return None
