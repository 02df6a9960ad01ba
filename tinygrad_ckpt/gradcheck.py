"""Finite-difference gradient checks: the test that an op's backward is its forward's derivative.

For each input element x_i, the central difference

    (f(x + eps e_i) - f(x - eps e_i)) / (2 eps)

approximates d f / d x_i with error O(eps^2). `gradcheck` compares that,
for a random projection of the output, with what backward computes. Run it
in float64: in float32 the rounding error of f swamps the difference.

Why this sits in the package and not among the test aids (testing/):
checking a gradient is what a user does to an op or a module of their own,
as tutorial 1 shows (PyTorch has torch.autograd.gradcheck for the same use);
the tests use it too.

What does not live here: the ops whose derivatives it checks (ops/).
"""

import numpy

from . import backend
from .tape import no_grad
from .tensor import Tensor


class GradcheckError(AssertionError):
    """Analytic and numerical gradients disagree; the message says where."""


def gradcheck(fn, inputs, *, eps=1e-6, atol=1e-5, rtol=1e-4, seed=0):
    """Check d fn(*inputs) / d input for every input that requires grad.

    fn returns a Tensor (any shape); it is reduced to a scalar by a fixed
    random projection, so every output element is checked. Returns True, or
    raises GradcheckError naming the input, the element and both values.
    """
    for i, t in enumerate(inputs):
        if t.requires_grad and t.dtype != numpy.float64:
            raise TypeError(f"gradcheck: input {i} is {t.dtype}; use float64 (float32 rounding swamps the differences)")
    out = fn(*inputs)
    weights = numpy.random.default_rng(seed).standard_normal(out.shape)
    weights_t = Tensor(backend.to_device(weights, out.device), device=out.device)

    for t in inputs:
        t.grad = None
    (out * weights_t).sum().backward()

    for i, t in enumerate(inputs):
        if not t.requires_grad:
            continue
        analytic = t.grad.numpy() if t.grad is not None else numpy.zeros(t.shape)
        numeric = numpy.zeros(t.shape)
        host = t.numpy().copy()
        for index in numpy.ndindex(*t.shape):
            values = []
            for step in (eps, -eps):
                shifted = host.copy()
                shifted[index] += step
                t.data[...] = backend.to_device(shifted, t.device)
                with no_grad():
                    values.append(float((fn(*inputs).numpy() * weights).sum()))
            numeric[index] = (values[0] - values[1]) / (2 * eps)
        t.data[...] = backend.to_device(host, t.device)
        bad = ~numpy.isclose(analytic, numeric, atol=atol, rtol=rtol)
        if bad.any():
            where = tuple(int(k) for k in numpy.argwhere(bad)[0])
            raise GradcheckError(
                f"gradient of input {i} (shape {t.shape}) is wrong at index {where}: "
                f"backward gives {analytic[where]:.8g}, finite differences give {numeric[where]:.8g} "
                f"({int(bad.sum())} of {bad.size} elements differ beyond atol={atol}, rtol={rtol})"
            )
    return True
