"""What an op costs: its forward FLOPs, counted from the shapes of its arrays.

The cost of an op lives beside the ops, so that whoever prices a plan
(schedules.py, the recompute a checkpoint adds) or reports one (saved.py,
the bench) asks the ops, and none of them depends on the other.

Counted analytically: a matmul (m, k) @ (k, n) is 2mnk, a convolution
2k per output element (k = C/groups * kh * kw, a window), an elementwise op
one FLOP per output element, and the fused nn ops a small constant per
element, each counted from the op's forward formula. The counts are for
comparing costs, not for predicting time.

    >>> op_flops("MatMul", [(4, 3), (3, 5)], [(4, 5)])   # 2 * 4 * 5 * 3
    120
    >>> op_flops("Reshape", [(4, 3)], [(12,)])            # a view: no arithmetic
    0
    >>> op_flops("Conv2d", [(1, 3, 8, 8), (4, 3, 3, 3)], [(1, 4, 6, 6)])   # 2 * 144 outputs * 27
    7776

What does not live here: the ops themselves (the other files of ops/), the
memory an op keeps (function.py's save_for_backward counts it).
"""

# FLOPs per output element of the elementwise-like ops, from their forward
# formulas in this package (a transcendental such as exp or tanh counts as one):
#   GELU        x*x*x, *0.044715, +x, *sqrt(2/pi), tanh, +1, 0.5*x, *   -> 9
#   Dropout     x * mask, * 1/(1-p)                                      -> 2
#   Softmax     max, subtract, exp, sum, divide        (per input element) -> 5
#   LogSoftmax  max, subtract, exp, sum, subtract      (per input element) -> 5
#   CrossEntropy as LogSoftmax on the logits                               -> 5
#   LayerNorm   mean, subtract, square, mean, *rstd, *weight, +bias        -> 7
#   the activations, from their forward formulas:
#   LeakyReLU   compare, x*slope, pick                                    -> 2
#   ReLU6       two compares, pick                                         -> 2
#   Hardswish   x+3, clamp (2), *x, /6                                    -> 5
#   SiLU        -x, exp, +1, x / (.)                                      -> 4
#   Softplus    *beta, exp, log1p, /beta, compare and pick                 -> 5
#   Mish        exp, log1p, tanh, *x                                      -> 4
#   GELUErf     x/sqrt(2), erfc (a rational function and exp: ~30), *0.5, *x -> 33
# Pooling reads each window element once: one FLOP per input element (exact
# for stride = kernel_size, the usual case). Movement ops (Reshape, Permute,
# Expand, GetItem, Split, Cat, Stack, Pad, ToDevice) copy or view memory and
# count 0; reductions count one FLOP per input element. A
# Checkpoint record counts 0: the ops of its segment are counted themselves.
PER_ELEMENT = {"GELU": 9, "Dropout": 2, "LeakyReLU": 2, "ReLU6": 2, "Hardswish": 5, "SiLU": 4, "Softplus": 5,
               "Mish": 4, "GELUErf": 33}
PER_INPUT_ELEMENT = {"Softmax": 5, "LogSoftmax": 5, "CrossEntropy": 5, "LayerNorm": 7, "Sum": 1, "Mean": 1, "Max": 1,
                     "MaxPool2d": 1, "AvgPool2d": 1}
MOVEMENT = {"Reshape", "Permute", "Expand", "GetItem", "Split", "Cat", "Stack", "Pad", "ToDevice", "Checkpoint"}


def _size(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def op_flops(op, input_shapes, output_shapes):
    """Forward FLOPs of one run of `op` (its class name) with these array shapes.

    MatMul (..., m, k) @ (..., k, n): 2 * m * n * k per batch entry.
    Linear x (..., k), weight (n, k): 2 * k per output element, + 1 with a bias.
    Conv2d x (N, C, H, W), weight (O, C/groups, kh, kw): 2 * C/groups * kh * kw per output element, + 1 with a bias.
    Everything else: a constant per element (table above); 1 by default.
    """
    out = sum(_size(s) for s in output_shapes)
    if op in MOVEMENT:
        return 0
    if op == "MatMul":
        return 2 * out * input_shapes[0][-1]
    if op == "Linear":
        return 2 * out * input_shapes[0][-1] + (out if len(input_shapes) > 2 else 0)
    if op == "Conv2d":
        return 2 * out * _size(input_shapes[1][1:]) + (out if len(input_shapes) > 2 else 0)
    if op in PER_INPUT_ELEMENT:
        return PER_INPUT_ELEMENT[op] * _size(input_shapes[0])
    return PER_ELEMENT.get(op, 1) * out


def matrix_products(op, input_shapes, needs_input_grad):
    """The matrix products one run of `op` does, forward and backward: [(phase, a shape, b shape)].

    Each is `a @ b` in NumPy's matmul shapes, (..., m, k) @ (..., k, n), as
    the op runs it (matmul.py): Linear, and a MatMul whose b is a 2-D matrix,
    fold every leading axis of a into rows, one 2-D product. Backward has
    one product per input that needs a gradient (needs_input_grad). An op
    without matrix products: [].

    >>> matrix_products("Linear", [(8, 4), (3, 4), (3,)], (True, True, True))
    [('forward', (8, 4), (4, 3)), ('backward', (8, 3), (3, 4)), ('backward', (3, 8), (8, 4))]
    """
    if op == "Linear":  # x (..., k), weight (n, k): x @ weight^T; dx = g @ weight; dweight = g^T @ x
        x, weight = input_shapes[0], input_shapes[1]
        rows, k, n = _size(x[:-1]), x[-1], weight[0]
        grads = [((rows, n), (n, k)), ((n, rows), (rows, k))]
    elif op == "MatMul" and len(input_shapes[1]) == 2:  # a (..., k) @ b (k, n), folded
        a, (k, n) = input_shapes
        rows = _size(a[:-1])
        grads = [((rows, n), (n, k)), ((k, rows), (rows, n))]
    elif op == "MatMul":  # a (..., m, k) @ b (..., k, n); da = g @ b^T, db = a^T @ g
        a, b = input_shapes
        batch = _broadcast(a[:-2], b[:-2])
        (m, k), n = a[-2:], b[-1]
        g = batch + (m, n)
        return ([("forward", tuple(a), tuple(b))]
                + [("backward", g, tuple(b[:-2]) + (n, k))] * bool(needs_input_grad[0])
                + [("backward", tuple(a[:-2]) + (k, m), g)] * bool(needs_input_grad[1]))
    else:
        return []
    forward = ("forward", (rows, k), (k, n))
    return [forward] + [("backward",) + pair for pair, need in zip(grads, needs_input_grad) if need]


def product_flops(a, b):
    """FLOPs of a @ b for NumPy matmul shapes (..., m, k) @ (..., k, n): 2 m n k per batch entry."""
    batch = _broadcast(a[:-2], b[:-2])
    return 2 * _size(batch) * a[-2] * a[-1] * b[-1]


def _broadcast(s, t):
    """The broadcast of two batch shapes (NumPy's rule), as a tuple."""
    s, t = (1,) * (len(t) - len(s)) + tuple(s), (1,) * (len(s) - len(t)) + tuple(t)
    return tuple(max(i, j) for i, j in zip(s, t))
