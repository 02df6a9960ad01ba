"""Optimizers, in order of increasing complexity: SGD, then AdamW; and get_total_norm, clip_grad_norm_.

An optimizer holds a list of parameters and, in `step()`, changes each one
in place from its `.grad`, with exactly PyTorch's update formulas. Updates go
through the Tensor in-place methods (`add_`, `mul_`, `sub_`) under
`no_grad()`, as in PyTorch (an in-place change of a parameter is an error
with gradients on), so every parameter's version is bumped: a backward that
would use a parameter saved before the step refuses to run.

Optimizer state (momentum, Adam's two moments) is one array per parameter,
allocated next to it on its device (no host round trip) and counted as
"optimizer" memory: for AdamW, twice the parameters' bytes. It is allocated
when the optimizer is built, so build the optimizer after `model.to(device)`.
`step()` never reads a value back to the host; `lr` is a plain attribute that
a scheduler may set before each step.

What does not live here: gradient accumulation (accumulate.py), learning-rate
schedules and the training loop (train.py).
"""

import math

import numpy

from . import backend, memory
from .tape import no_grad


class Optimizer:
    """The parameters, zero_grad, and saving/restoring state for resuming.

    A subclass names its hyperparameters in `hyper_names` and the attributes
    holding its per-parameter state arrays in `state_names`; `state_dict()`
    and `load_state_dict()` use those lists.
    """

    hyper_names = ("lr",)
    state_names = ()

    def __init__(self, params, lr):
        self.params, seen = [], set()
        for p in params:  # each parameter once, in order (a tied weight may be listed twice)
            if id(p) not in seen:
                seen.add(id(p))
                self.params.append(p)
        if not self.params:
            raise ValueError(f"{type(self).__name__} got an empty parameter list; pass model.parameters()")
        for i, p in enumerate(self.params):
            if not getattr(p, "requires_grad", False):
                raise ValueError(f"{type(self).__name__}: parameter {i} (shape {p.shape}) does not require grad, so it would never change")
        if lr < 0:
            raise ValueError(f"{type(self).__name__}: learning rate must be >= 0, got {lr}")
        self.lr = lr

    def _zeros_like_params(self):
        """One zero array per parameter, on its device, counted as optimizer memory."""
        arrays = []
        for p in self.params:
            state = backend.module_of(p.data).zeros_like(p.data)
            memory.track(state, "optimizer")
            arrays.append(state)
        return arrays

    def zero_grad(self, set_to_none=True):
        """Forget the gradients. None (the default) frees their memory; zeros keeps it."""
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        memory.tracker.mark(f"{type(self).__name__}.zero_grad")  # a timeline shows the gradients go

    def step(self):
        raise NotImplementedError  # abstract: each optimizer defines it

    def state_dict(self):
        """Hyperparameters, step counts and host copies of the state arrays."""
        return {
            "type": type(self).__name__,
            "hyper": {name: getattr(self, name) for name in self.hyper_names},
            "steps": list(self.steps),
            "state": {name: [backend.to_host(a, f"{type(self).__name__}.state_dict()").copy() for a in getattr(self, name)]
                      for name in self.state_names},
        }

    def load_state_dict(self, state):
        """Restore `state_dict()`'s output, copying into the existing state arrays in place."""
        name = type(self).__name__
        if state["type"] != name:
            raise ValueError(f"cannot load a {state['type']} state into {name}")
        if len(state["steps"]) != len(self.params) or set(state["state"]) != set(self.state_names):
            raise ValueError(
                f"{name} state does not fit this optimizer: it has {len(state['steps'])} parameters and state "
                f"{sorted(state['state'])}, this one has {len(self.params)} parameters and state {sorted(self.state_names)}"
            )
        for key in self.state_names:
            for i, (saved, ours) in enumerate(zip(state["state"][key], getattr(self, key))):
                if tuple(saved.shape) != tuple(ours.shape):
                    raise ValueError(f"{name} state {key}[{i}] has shape {tuple(saved.shape)}, the parameter has {tuple(ours.shape)}")
        for key in self.state_names:
            for saved, ours in zip(state["state"][key], getattr(self, key)):
                ours[...] = backend.to_device(saved, backend.device_of(ours))
        for key, value in state["hyper"].items():
            setattr(self, key, tuple(value) if isinstance(value, list) else value)
        self.steps = list(state["steps"])


class SGD(Optimizer):
    """Stochastic gradient descent, with optional momentum and (coupled) weight decay.

        d = g + weight_decay * p
        buf = momentum * buf + d;  d = buf        (if momentum; buf starts at zero)
        p = p - lr * d
    """

    hyper_names = ("lr", "momentum", "weight_decay")

    def __init__(self, params, lr, momentum=0.0, weight_decay=0.0):
        super().__init__(params, lr)
        self.momentum, self.weight_decay = momentum, weight_decay
        self.steps = [0] * len(self.params)
        self.state_names = ("momentum_buffer",) if momentum else ()
        self.momentum_buffer = self._zeros_like_params() if momentum else []

    @no_grad()
    def step(self):
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue  # no gradient this step: leave it alone, as PyTorch does
            self.steps[i] += 1
            d = p.grad.data
            if self.weight_decay:
                d = d + self.weight_decay * p.data
            if self.momentum:
                buf = self.momentum_buffer[i]
                buf *= self.momentum
                buf += d
                d = buf
            p.sub_(d, alpha=self.lr)
        memory.tracker.mark("SGD.step")


class AdamW(Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter, 2019), as torch.optim.AdamW.

        p = p * (1 - lr * weight_decay)           decay the weight, not the gradient
        m = beta1 * m + (1 - beta1) * g           first moment
        v = beta2 * v + (1 - beta2) * g^2         second moment
        p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

    t counts this parameter's steps; the two (1 - beta^t) factors correct the
    moments' bias towards their zero start.
    """

    hyper_names = ("lr", "betas", "eps", "weight_decay")
    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, lr)
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"AdamW: betas must be in [0, 1), got {betas}")
        self.betas, self.eps, self.weight_decay = tuple(betas), eps, weight_decay
        self.steps = [0] * len(self.params)
        self.exp_avg = self._zeros_like_params()
        self.exp_avg_sq = self._zeros_like_params()

    @no_grad()
    def step(self):
        beta1, beta2 = self.betas
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            self.steps[i] += 1
            t = self.steps[i]
            g, m, v = p.grad.data, self.exp_avg[i], self.exp_avg_sq[i]
            if self.weight_decay:
                p.mul_(1 - self.lr * self.weight_decay)
            m *= beta1
            m += (1 - beta1) * g
            v *= beta2
            v += (1 - beta2) * (g * g)
            denom = backend.module_of(v).sqrt(v)
            denom /= math.sqrt(1 - beta2**t)
            denom += self.eps
            p.sub_(m / denom, alpha=self.lr / (1 - beta1**t))
        memory.tracker.mark("AdamW.step")


def get_total_norm(tensors, *, error_if_nonfinite=False):
    """The L2 norm of all `tensors` together, as if flattened into one vector, as a Python float.

        norm = sqrt(sum over tensors of sum(t^2))

    As torch.nn.utils.get_total_norm (PyTorch 2.13). A NaN or infinite norm is
    returned as it is, or, with error_if_nonfinite=True, raises RuntimeError
    with PyTorch's message. No tensors: 0.0. The float is a host
    synchronisation (on a GPU it waits for the arrays to be computed).
    On the meta device the norm's arrays are made as on a real one, and
    None is returned: there are no values, and no number is made up.
    """
    tensors = list(tensors)
    if not tensors:
        return 0.0
    xp = backend.array_module(*(t.data for t in tensors))
    total = backend.as_array(xp.sqrt(sum(xp.vdot(t.data, t.data) for t in tensors)))  # vdot flattens: sum(t * t)
    if not backend.holds_values(backend.device_of(total)):
        return None  # the meta device: the norm's arrays were made, and there is no number to give
    norm = float(backend.to_host(total))
    if error_if_nonfinite and not math.isfinite(norm):
        raise RuntimeError(
            "The total norm of order 2.0 for gradients from `parameters` is non-finite, so it cannot be "
            "clipped. To disable this error and scale the gradients by the non-finite norm anyway, set "
            "`error_if_nonfinite=False`"
        )
    return norm


@no_grad()
def clip_grad_norm_(parameters, max_norm, *, error_if_nonfinite=False):
    """Scale all gradients by one factor so that their global L2 norm is at most max_norm.

        norm = get_total_norm(grads);  if norm > max_norm: g *= max_norm / (norm + 1e-6)

    Returns the norm before clipping as a Python float, as PyTorch 2.13's
    torch.nn.utils.clip_grad_norm_ does (there a 0-d tensor), non-finite
    norms included. A NaN or infinite norm raises RuntimeError with
    error_if_nonfinite=True; with False (the default, as in PyTorch) the
    gradients are scaled by the non-finite norm anyway, which turns them
    into NaN (or zeros), as PyTorch does: test the returned norm before
    stepping (the Trainer skips such a step). That float is the one host
    synchronisation of a training step, accepted here because callers log it.

    On the meta device there is no norm to compare: None (get_total_norm),
    and nothing is scaled (scaling in place allocates nothing either way).
    """
    parameters = list(parameters)
    norm = get_total_norm((p.grad for p in parameters if p.grad is not None), error_if_nonfinite=error_if_nonfinite)
    clip_grads_with_norm_(parameters, max_norm, norm)
    return norm


def clip_grads_with_norm_(parameters, max_norm, total_norm):
    """clip_grad_norm_'s second half, given the norm: g *= max_norm / (total_norm + 1e-6) where that is below 1.

    As torch.nn.utils.clip_grads_with_norm_ (PyTorch 2.13): for a norm
    computed elsewhere, such as summed across the ranks that each hold a
    shard of the gradients (zero.py). total_norm None (the meta device):
    nothing is scaled.
    """
    if total_norm is None:
        return
    coef = max_norm / (total_norm + 1e-6)
    if coef < 1 or math.isnan(coef):  # PyTorch multiplies by min(coef, 1), and min(nan, 1) is nan
        with no_grad(), numpy.errstate(invalid="ignore"):  # inf * 0 is NaN here on purpose, as in PyTorch
            for p in parameters:
                if p.grad is not None:
                    p.grad.mul_(coef)
