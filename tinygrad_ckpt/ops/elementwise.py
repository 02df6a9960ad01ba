"""Elementwise ops: binary arithmetic with broadcasting, and unary functions.

Each op is one class with `forward` and `backward` a few lines apart; the
derivative is in its docstring. All arrays come from the same module `xp`
(NumPy or CuPy), taken from the inputs.

Broadcasting: `a + b` with shapes (3, 4) and (4,) works as in NumPy, and the
gradient for b must come back with shape (4,). The adjoint of broadcasting is
summing, done once, in `unbroadcast`.

What each op saves, and why, is said in its docstring: an op saves only what
its backward reads, and skips saving for inputs that need no gradient.

16-bit inputs (float16, bfloat16). NumPy rounds to 16 bits after every
operation, so a formula of ten operations is rounded ten times, and the
exact GELU's erfc overflows float16 on the way (NaN at |x| about 4). The
activations below, and their gradients, compute in float32 and round once
at the end, as PyTorch's kernels do (their "opmath" type): `wide` on the
way in, `narrow` on the way out. What they save stays in the input's dtype.
One NumPy ufunc (exp, tanh, log) already rounds once, so Exp and Tanh's
forward need neither.
"""

import numpy

from ..autocast import is_16bit
from ..backend import array_module, as_array, on_cpu, unbroadcast
from ..function import Function
from . import special


def wide(x):
    """x in float32 if it is 16-bit (float16, bfloat16), else x itself: where a 16-bit formula is computed."""
    return x.astype(numpy.float32) if is_16bit(x.dtype) else x


def narrow(out, dtype):
    """A result computed by `wide`'s rule, rounded once to `dtype` (no copy when it is already that dtype)."""
    out = as_array(out)
    return out if out.dtype == dtype else out.astype(dtype)


def check_broadcast(op, a, b):
    """A clear error naming the op, instead of NumPy's from deep inside."""
    try:
        numpy.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(
            f"{op}: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be broadcast together "
            "(trailing dimensions must be equal or 1)"
        ) from None


# -- binary ------------------------------------------------------------------
class Add(Function):
    """out = a + b;  da = g, db = g.  Saves nothing (only the shapes)."""

    @staticmethod
    def forward(ctx, a, b):
        check_broadcast("add", a, b)
        ctx.shapes = a.shape, b.shape
        return a + b

    @staticmethod
    def backward(ctx, g):
        sa, sb = ctx.shapes
        need_a, need_b = ctx.needs_input_grad
        return unbroadcast(g, sa) if need_a else None, unbroadcast(g, sb) if need_b else None


class Sub(Function):
    """out = a - b;  da = g, db = -g.  Saves nothing."""

    @staticmethod
    def forward(ctx, a, b):
        check_broadcast("sub", a, b)
        ctx.shapes = a.shape, b.shape
        return a - b

    @staticmethod
    def backward(ctx, g):
        sa, sb = ctx.shapes
        need_a, need_b = ctx.needs_input_grad
        return unbroadcast(g, sa) if need_a else None, unbroadcast(-g, sb) if need_b else None


class Mul(Function):
    """out = a * b;  da = g * b, db = g * a.

    Saves b only if a needs a gradient, and a only if b does: x * mask keeps
    the mask, not x.
    """

    @staticmethod
    def forward(ctx, a, b):
        check_broadcast("mul", a, b)
        ctx.shapes = a.shape, b.shape
        need_a, need_b = ctx.needs_input_grad
        ctx.save_for_backward(a if need_b else None, b if need_a else None)
        return a * b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_arrays
        sa, sb = ctx.shapes
        need_a, need_b = ctx.needs_input_grad
        da = unbroadcast(g * b, sa) if need_a else None
        db = unbroadcast(g * a, sb) if need_b else None
        return da, db


class Div(Function):
    """out = a / b;  da = g / b, db = -g * (a / b) / b.  Saves a and b.

    (a / b) / b, not a / b**2, as PyTorch: b**2 would overflow (or vanish)
    where a / b / b is still a number.
    """

    @staticmethod
    def forward(ctx, a, b):
        check_broadcast("div", a, b)
        ctx.shapes = a.shape, b.shape
        ctx.save_for_backward(a, b)
        return a / b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_arrays
        sa, sb = ctx.shapes
        need_a, need_b = ctx.needs_input_grad
        da = unbroadcast(g / b, sa) if need_a else None
        db = unbroadcast(-g * (a / b / b), sb) if need_b else None
        return da, db


class Pow(Function):
    """out = a ** b;  da = g * b * a**(b-1), db = g * out * log(a).  Saves a, b, out.

    As PyTorch (pow_backward_self, pow_backward_exponent), two limits the
    formulas miss: da = 0 where b == 0 (a**0 is 1 for every a, 0 included,
    where b * a**(b-1) would be 0 * inf), and db = 0 where a == 0 and b >= 0
    (0**b is 0 or 1 there, flat in b, where out * log(a) would be 0 * -inf):
    `0 ** x` has a gradient of 0, not NaN. The masked-out values may divide
    by zero; no warning is given for values that are thrown away.
    """

    @staticmethod
    def forward(ctx, a, b):
        check_broadcast("pow", a, b)
        ctx.shapes = a.shape, b.shape
        out = a**b
        ctx.save_for_backward(a, b, out)
        return out

    @staticmethod
    def backward(ctx, g):
        a, b, out = ctx.saved_arrays
        sa, sb = ctx.shapes
        xp = array_module(a)
        need_a, need_b = ctx.needs_input_grad
        zero = g.dtype.type(0)
        with numpy.errstate(divide="ignore", invalid="ignore"):
            da = unbroadcast(xp.where(b == 0, zero, g * b * a ** (b - 1)), sa) if need_a else None
            db = unbroadcast(g * xp.where((a == 0) & (b >= 0), zero, out * xp.log(a)), sb) if need_b else None
        return da, db


class Where(Function):
    """out = condition ? a : b;  da = g where condition, db = g elsewhere.

    `condition` is a boolean array (not differentiable). Saves it (1 byte per element).
    """

    @staticmethod
    def forward(ctx, a, b, condition):
        ctx.shapes = a.shape, b.shape
        ctx.save_for_backward(condition)
        return array_module(a, b, condition).where(condition, a, b)

    @staticmethod
    def backward(ctx, g):
        (condition,) = ctx.saved_arrays
        sa, sb = ctx.shapes
        need_a, need_b = ctx.needs_input_grad
        xp, zero = array_module(g), g.dtype.type(0)  # g has the output's shape: a, b and condition broadcast together
        da = unbroadcast(xp.where(condition, g, zero), sa) if need_a else None
        db = unbroadcast(xp.where(condition, zero, g), sb) if need_b else None
        return da, db


# -- unary -------------------------------------------------------------------
class Neg(Function):
    """out = -x;  dx = -g.  Saves nothing."""

    @staticmethod
    def forward(ctx, x):
        return -x

    @staticmethod
    def backward(ctx, g):
        return -g


class Abs(Function):
    """out = |x|;  dx = g * sign(x).  Saves x.

    As PyTorch's: sign(0) = 0 (the middle of the kink's two slopes), and
    sign(NaN) = 0 too, where NumPy's sign gives NaN.
    """

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return array_module(x).abs(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_arrays
        xp = array_module(x)
        return g * xp.where(x != x, x.dtype.type(0), xp.sign(x))


class PowScalar(Function):
    """out = x ** p for a Python number p;  dx = g * p * x**(p-1), and 0 for p = 0.  Saves x.

    p = 0: x**0 is 1 everywhere, so dx is 0, also at x = 0 where the formula
    gives 0 * inf = NaN (PyTorch's pow_backward says the same). x**-0.5 is
    1 / sqrt(x), as PyTorch computes it (its rsqrt): IEEE pow differs at -0.0
    and -inf, and x**-0.5 is what the gradient of x**0.5 reads.
    """

    @staticmethod
    def forward(ctx, x, exponent):
        ctx.exponent = exponent
        ctx.save_for_backward(x)
        return _power(x, exponent)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_arrays
        p = ctx.exponent
        if p == 0:
            return array_module(g).zeros_like(g)
        if p == 2:
            return g * 2 * x
        return g * (p * _power(x, p - 1))


def _power(x, p):
    """x ** p, with x ** -0.5 as 1 / sqrt(x) (see PowScalar)."""
    return 1 / array_module(x).sqrt(x) if p == -0.5 else x**p


class Sqrt(Function):
    """out = sqrt(x);  dx = g / (2 * out).  Saves out.

    Not x ** 0.5: IEEE pow gives sqrt(-inf) as +inf, sqrt gives NaN, as
    PyTorch's sqrt does. At 0, dx is inf (the slope of sqrt there).
    """

    @staticmethod
    def forward(ctx, x):
        out = array_module(x).sqrt(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_arrays
        return g / (2 * out)


class Exp(Function):
    """out = exp(x);  dx = g * out.  Saves out (x is not needed)."""

    @staticmethod
    def forward(ctx, x):
        out = array_module(x).exp(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_arrays
        return g * out


class Log(Function):
    """out = log(x);  dx = g / x.  Saves x."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return array_module(x).log(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_arrays
        return g / x


class Tanh(Function):
    """out = tanh(x);  dx = g * (1 - out**2).  Saves out."""

    @staticmethod
    def forward(ctx, x):
        out = array_module(x).tanh(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_arrays
        w = wide(out)
        return narrow(wide(g) * (1 - w * w), g.dtype)


class Sigmoid(Function):
    """out = 1 / (1 + exp(-x));  dx = g * out * (1 - out).  Saves out."""

    @staticmethod
    def forward(ctx, x):
        xp = array_module(x)
        # tanh form: never overflows, unlike 1 / (1 + exp(-x)) for very negative x.
        out = narrow(0.5 * (xp.tanh(0.5 * wide(x)) + 1), x.dtype)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_arrays
        w = wide(out)
        return narrow(wide(g) * w * (1 - w), g.dtype)


class ReLU(Function):
    """out = max(x, 0);  dx = g where x > 0, 0 where x <= 0.  Saves x <= 0 as a boolean mask (1 byte per element).

    Picked with `where`, not multiplied by the mask: -inf * 0 would be NaN.
    At x = 0 the gradient is 0, and a NaN passes through with gradient g,
    as in PyTorch.
    """

    @staticmethod
    def forward(ctx, x):
        off = x <= 0
        ctx.save_for_backward(off)
        return array_module(x).where(off, x.dtype.type(0), x)

    @staticmethod
    def backward(ctx, g):
        (off,) = ctx.saved_arrays
        return array_module(g).where(off, g.dtype.type(0), g)


_SQRT_2_OVER_PI = 0.7978845608028654


class GELU(Function):
    """GELU with the tanh approximation, as GPT-2 uses:

        out = 0.5 x (1 + t),  t = tanh(u),  u = sqrt(2/pi) (x + 0.044715 x^3)
        dx  = g * 0.5 [(1 + t) + k (1 - t^2)],  k = sqrt(2/pi) x (1 + 3 * 0.044715 x^2)
            = g * 0.5 (1 + t) (1 + k (1 - t))        (as 1 - t^2 = (1 - t)(1 + t))

    Saves x only; backward recomputes t, which is cheaper in memory than
    saving it (one array instead of two).

    Fused in place (`*=`, `out=`), not written as the formula, which on W2's
    step takes a tenth more time and 16 MB more on its 96 MB peak (tracemalloc)
    (one piece: 7 MB; benchmarks/lesson_speed.py): forward makes one new
    array, its result; backward two scratch arrays besides it, `piece`
    elements at a time on the CPU, where they stay in cache (PyTorch 2.13's
    CPU `gelu_backward` allocates its result only: tests/test_claims.py).
    A 16-bit x is computed in float32 (the module docstring), a piece at a
    time in backward. (`as_array`: for a 0-d x, NumPy returns a scalar from `x * x`.)
    """

    piece = 1 << 15  # elements: 128 KiB of float32 per scratch array; on a GPU one piece (a launch per step costs)

    @staticmethod
    def forward(ctx, x):
        xp = array_module(x)
        ctx.save_for_backward(x)
        w = wide(x)  # a float32 copy of a 16-bit x; x itself otherwise
        with numpy.errstate(over="ignore"):  # x^3 overflows from |x| ~ 1e13 (float32) on: u = +-inf, t = +-1, right
            out = as_array(w * w)
            out *= 0.044715 * _SQRT_2_OVER_PI
            out += _SQRT_2_OVER_PI
            out *= w  # u = sqrt(2/pi) (x + 0.044715 x^3)
        xp.tanh(out, out=out)  # t
        out += 1
        out *= 0.5  # before x: 0.5 (1 + t) x stays finite for the largest x, (1 + t) x would overflow
        out *= w  # 0.5 x (1 + t)
        return narrow(out, x.dtype)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_arrays
        xp = array_module(x)
        dx = xp.empty(x.shape, dtype=x.dtype)
        flat_x, flat_g, flat_dx = x.reshape(-1), g.reshape(-1), dx.reshape(-1)  # views
        piece = GELU.piece if on_cpu(x) else max(x.size, 1)
        for i in range(0, x.size, piece):
            # 16-bit pieces are widened here, a piece at a time; dx rounds once, when the piece is written
            _gelu_backward(xp, wide(flat_x[i:i + piece]), wide(flat_g[i:i + piece]), flat_dx[i:i + piece])
        return dx


def _gelu_backward(xp, x, g, dx):
    """dx[...] = g * dgelu/dx for one piece of the flat arrays (see GELU)."""
    k = x * x
    t = k * (0.044715 * _SQRT_2_OVER_PI)
    t += _SQRT_2_OVER_PI
    t *= x
    xp.tanh(t, out=t)  # t = tanh(u), as in forward
    k *= 3 * 0.044715 * _SQRT_2_OVER_PI
    k += _SQRT_2_OVER_PI
    k *= x  # k = sqrt(2/pi) x (1 + 3 * 0.044715 x^2)
    t *= -1
    t += 1  # 1 - t
    k *= t
    k += 1  # 1 + k (1 - t)
    t *= -1
    t += 2  # 1 + t
    k *= t
    k *= g
    k *= 0.5
    dx[...] = k


class GELUErf(Function):
    """The exact GELU (PyTorch's default, approximate='none'), with Phi the standard normal's CDF:

        out = x Phi(x),  Phi(x) = erfc(-x / sqrt(2)) / 2
        dx  = g (Phi(x) + x phi(x)),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)

    Saves x only. erfc, not 1 + erf: for very negative x, 1 + erf(x / sqrt(2))
    cancels to 0 where erfc keeps the tiny value (special.py: how erfc is
    computed without SciPy).
    """

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        w = wide(x)
        with numpy.errstate(invalid="ignore"):  # x = -inf: -inf * 0 is NaN, as in PyTorch
            return narrow(w * (0.5 * special.erfc(w * -_SQRT_HALF)), x.dtype)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_arrays
        xp = array_module(x)
        w = wide(x)
        with numpy.errstate(over="ignore", invalid="ignore"):  # huge x: x * x is inf, exp(-inf) 0; x = +-inf: NaN
            return narrow(wide(g) * (0.5 * special.erfc(w * -_SQRT_HALF) + w * (_RSQRT_2PI * xp.exp(-0.5 * w * w))),
                          g.dtype)


_SQRT_HALF, _RSQRT_2PI = 0.7071067811865476, 0.3989422804014327  # 1 / sqrt(2), 1 / sqrt(2 pi)


def _sigmoid(x):
    """1 / (1 + exp(-x)): no cancellation in either tail (exp(-x) overflowing gives 0, correctly)."""
    x = as_array(x)  # (a 0-d x * beta is a NumPy scalar)
    with numpy.errstate(over="ignore"):
        return 1 / (1 + array_module(x).exp(-x))


def _clamp(x, low, high):
    """x limited to [low, high]; a NaN stays NaN (both comparisons are False for it)."""
    x = as_array(x)
    xp = array_module(x)
    return xp.where(x < low, x.dtype.type(low), xp.where(x > high, x.dtype.type(high), x))


class LeakyReLU(Function):
    """out = x where x > 0, negative_slope * x elsewhere;  dx = g there, negative_slope * g elsewhere.

    Saves x > 0 as a boolean mask (1 byte per element). A NaN takes the
    negative side's slope, as in PyTorch.
    """

    @staticmethod
    def forward(ctx, x, negative_slope=0.01):
        positive = x > 0
        ctx.slope = negative_slope
        ctx.save_for_backward(positive)
        return array_module(x).where(positive, x, narrow(wide(x) * negative_slope, x.dtype))

    @staticmethod
    def backward(ctx, g):
        (positive,) = ctx.saved_arrays
        return array_module(g).where(positive, g, narrow(wide(g) * ctx.slope, g.dtype))


class ReLU6(Function):
    """out = min(max(x, 0), 6);  dx = g where 0 < x < 6, 0 elsewhere (at 0 and 6 too, as PyTorch's hardtanh).

    Saves where the gradient is 0 as a boolean mask (1 byte per element); a NaN passes with gradient g.
    """

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward((x <= 0) | (x >= 6))
        return _clamp(x, 0, 6)

    @staticmethod
    def backward(ctx, g):
        (off,) = ctx.saved_arrays
        return array_module(g).where(off, g.dtype.type(0), g)


class Hardswish(Function):
    """out = x relu6(x + 3) / 6;  dx = 0 where x <= -3, g (x / 3 + 1/2) where -3 < x < 3, g where x >= 3.

    PyTorch's pieces, with its choices at the kinks; a NaN passes with
    gradient g. Saves x.
    """

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        w = wide(x)
        with numpy.errstate(over="ignore"):  # PyTorch's order: inf where x * 6 overflows, as there
            return narrow(w * _clamp(w + 3, 0, 6) / 6, x.dtype)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_arrays
        xp = array_module(x)
        middle = narrow(wide(g) * (wide(x) / 3 + 0.5), g.dtype)
        return xp.where(x <= -3, g.dtype.type(0), xp.where(x < 3, middle, g))


class SiLU(Function):
    """out = x sigmoid(x);  dx = g s (1 + x (1 - s)), s = sigmoid(x).  Saves x (s is recomputed)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        w = wide(x)
        return narrow(w * _sigmoid(w), x.dtype)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_arrays
        w = wide(x)
        s = _sigmoid(w)
        return narrow(wide(g) * s * (1 + w * (1 - s)), g.dtype)


class Softplus(Function):
    """out = log(1 + exp(beta x)) / beta, and x where beta x > threshold (PyTorch's: the two agree there);
    dx = g sigmoid(beta x), and g where beta x > threshold.  Saves x.

    log1p: log(1 + e) would round to 0 for e below 1e-16, where log1p keeps it.
    """

    @staticmethod
    def forward(ctx, x, beta=1.0, threshold=20.0):
        xp = array_module(x)
        ctx.beta, ctx.threshold = beta, threshold
        ctx.save_for_backward(x)
        w = wide(x)
        with numpy.errstate(over="ignore"):  # exp overflows only where x itself is picked
            return narrow(xp.where(w * beta > threshold, w, xp.log1p(xp.exp(w * beta)) / beta), x.dtype)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_arrays
        w, wg = wide(x), wide(g)
        return narrow(array_module(x).where(w * ctx.beta > ctx.threshold, wg, wg * _sigmoid(w * ctx.beta)), g.dtype)


class Mish(Function):
    """out = x tanh(softplus(x)), softplus(x) = log(1 + exp(x));
    dx = g (t + x s (1 - t^2)), t = tanh(softplus(x)), s = sigmoid(x) (the derivative of softplus).

    Saves x (t and s are recomputed).
    """

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        w = wide(x)
        return narrow(w * _tanh_softplus(w), x.dtype)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_arrays
        w = wide(x)
        t = _tanh_softplus(w)
        return narrow(wide(g) * (t + w * _sigmoid(w) * (1 - t * t)), g.dtype)


def _tanh_softplus(x):
    """tanh(log(1 + exp(x))); exp overflowing to inf gives tanh(inf) = 1, the right limit."""
    xp = array_module(x)
    with numpy.errstate(over="ignore"):
        return xp.tanh(xp.log1p(xp.exp(x)))


class Cast(Function):
    """out = x as another dtype;  dx = g cast back.  Saves nothing."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = x.dtype
        return x.astype(dtype)

    @staticmethod
    def backward(ctx, g):
        return g.astype(ctx.dtype)
