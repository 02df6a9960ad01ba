"""The complementary error function erfc, for the exact GELU, from the array module's basic operations.

NumPy has no erf. SciPy's (and CuPy's cupyx.scipy.special.erf) would be a
new dependency for one function, and a function each array module must
provide under its own name (the strict stand-in, the shape-only module
too). Instead erfc is computed here from +, *, /, exp, abs and where, which
every array module has, with W. J. Cody's rational approximations ("Rational
Chebyshev approximation for the error function", Math. Comp. 23, 1969; the
coefficients of his CALERF, Netlib specfun), accurate to float64 rounding:
within a few units in the last place of the true value, a relative error
below 1e-15 where erfc is above float64's smallest normal number
(tests/test_activation_ops.py checks it against Python's math.erfc).

    |x| <= 0.46875:      erfc(x) = 1 - x A(x^2) / B(x^2)
    0.46875 < |x| <= 4:  erfc(|x|) = exp(-x^2) C(|x|) / D(|x|)
    |x| > 4:             erfc(|x|) = exp(-x^2) / |x| (1/sqrt(pi) - P(1/x^2) / (x^2 Q(1/x^2)))
    x < 0 (outer ranges): erfc(x) = 2 - erfc(|x|)

Each range is computed for every element and `where` picks; the ranges an
element is not in may overflow or divide by zero, and are thrown away.

What does not live here: the ops that use it (elementwise.GELUErf).
"""

import numpy

from ..autocast import is_16bit
from ..backend import array_module, as_array

# Coefficients, highest power first (the leading 1 of each denominator included).
_A = (1.85777706184603153e-1, 3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
      3.20937758913846947e03)
_B = (1.0, 2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03, 2.84423683343917062e03)
_C = (2.15311535474403846e-8, 5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
      2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03, 2.05107837782607147e03,
      1.23033935479799725e03)
_D = (1.0, 1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02, 1.62138957456669019e03,
      3.29079923573345963e03, 4.36261909014324716e03, 3.43936767414372164e03, 1.23033935480374942e03)
_P = (1.63153871373020978e-2, 3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
      1.60837851487422766e-2, 6.58749161529837803e-4)
_Q = (1.0, 2.56852019228982242e00, 1.87295284992346047e00, 5.27905102951428412e-1, 6.05183413124413191e-2,
      2.33520497626869185e-3)
_RSQRT_PI = 0.56418958354775628695  # 1 / sqrt(pi)


def _polynomial(t, coefficients):
    """c0 t^n + c1 t^(n-1) + ... + cn, by Horner's rule."""
    out = coefficients[0] * t + coefficients[1]
    for c in coefficients[2:]:
        out = out * t + c
    return out


def erfc(x):
    """1 - erf(x), elementwise, in x's dtype; erfc(-inf) = 2, erfc(inf) = 0, NaN stays NaN.

    A 16-bit x (float16, bfloat16) is computed in float32 and rounded once: the
    polynomials' terms overflow float16 (65504) from |x| of about 4 on.
    """
    x = as_array(x)  # a 0-d x times a number is a NumPy scalar
    if is_16bit(x.dtype):
        return erfc(x.astype(numpy.float32)).astype(x.dtype)
    xp = array_module(x)
    with numpy.errstate(all="ignore"):  # the ranges an element is not in are thrown away
        y = xp.abs(x)
        y = xp.where(y > 30, y.dtype.type(30), y)  # erfc(30) underflows to 0 already; keeps inf out (NaN stays)
        z = y * y
        small = 1 - x * (_polynomial(z, _A) / _polynomial(z, _B))
        r = 1 / z
        ratio = xp.where(y <= 4, _polynomial(y, _C) / _polynomial(y, _D),
                         (_RSQRT_PI - r * (_polynomial(r, _P) / _polynomial(r, _Q))) / y)
        # exp(-y^2) as exp(-h^2) exp(-(y - h)(y + h)), h = y rounded down to 1/16: y^2's rounding error,
        # multiplied by up to 900 in the exponent, would cost digits (Cody's device).
        h = (y * 16 // 1) / 16
        tail = ratio * (xp.exp(-h * h) * xp.exp(-(y - h) * (y + h)))
        return xp.where(y <= 0.46875, small, xp.where(x < 0, 2 - tail, tail))
