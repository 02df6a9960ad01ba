"""A step that cannot run on the CPU cannot be sized on the meta device.

Drawn op calls (arithmetic with broadcasting, matmul, concatenation,
reshapes and other movements, reductions, indexing, convolution, pooling,
padding, normalisation, losses) run on both devices, forward and, where the
output is a float, backward: the CPU raises if and only if the meta device
does, and where neither does, every output and every input's gradient has
the same shape and dtype on both. The shapes drawn are often wrong on
purpose (a related shape with one axis changed, an axis out of range).
"""

import warnings

import numpy
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tinygrad_ckpt import Tensor, meta
from tinygrad_ckpt import functional as F

from .conftest import examples

dims = st.integers(0, 3)
axes = st.integers(-4, 4)
dtypes = st.sampled_from([numpy.float32, numpy.float64, numpy.int64])


def shapes(min_ndim=0, max_ndim=4):
    return st.lists(dims, min_size=min_ndim, max_size=max_ndim).map(tuple)


@st.composite
def related(draw, shape):
    """A shape near `shape`: leading axes dropped or added, some axes 1, some changed (so some do not fit)."""
    out = list(shape[draw(st.integers(0, len(shape))):])
    for i, n in enumerate(out):
        out[i] = draw(st.sampled_from([n, n, n, 1, draw(dims)]))
    return tuple(draw(st.lists(dims, max_size=1)) + out)


def array(shape, dtype=numpy.float32, seed=0):
    values = numpy.random.default_rng(seed).standard_normal(shape) + 2.0
    return values.astype(dtype)


def outcome(call, arrays, device):
    """('ok', shapes and dtypes of the outputs and the inputs' gradients) or ('raised', the error)."""
    try:
        tensors = [Tensor(a, device=device, requires_grad=a.dtype.kind == "f") for a in arrays]
        with numpy.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's "Mean of empty slice"
            out = call(*tensors)
            outs = list(out) if isinstance(out, (list, tuple)) else [out]
            seen = [(o.shape, o.dtype) for o in outs]
            differentiable = [o for o in outs if o.requires_grad]
            if differentiable:
                total = differentiable[0].sum()
                for o in differentiable[1:]:
                    total = total + o.sum()
                total.backward()
            seen += [None if t.grad is None else (t.grad.shape, t.grad.dtype) for t in tensors]
        return "ok", seen
    except meta.NeedsValues:
        raise  # an op asking for values it does not need: a failure of the meta device, never a match
    except Exception as e:  # noqa: BLE001 (any error the CPU raises, the meta device must raise too)
        return "raised", e


KINDS = (IndexError, TypeError, ValueError, RuntimeError, NotImplementedError)


def runs_alike(call, *arrays):
    cpu, on_meta = outcome(call, arrays, "cpu"), outcome(call, arrays, "meta")
    assert cpu[0] == on_meta[0], f"the CPU: {cpu[1]!r}; the meta device: {on_meta[1]!r}"
    if cpu[0] == "ok":
        assert cpu[1] == on_meta[1]
    else:  # the same kind of error (NumPy's AxisError is both an IndexError and a ValueError)
        kinds = {k for k in KINDS if isinstance(cpu[1], k)}
        assert any(isinstance(on_meta[1], k) for k in kinds), f"the CPU: {cpu[1]!r}; the meta device: {on_meta[1]!r}"
    return cpu[0]


# -- each family of op calls, drawn -------------------------------------------------------------
def arithmetic(draw):
    a = draw(shapes())
    b = draw(related(a))
    op = draw(st.sampled_from(["add", "sub", "mul", "truediv", "where", "masked_fill", "mse_loss", "pow"]))
    calls = {
        "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
        "truediv": lambda x, y: x / y, "pow": lambda x, y: x ** y,
        "where": lambda x, y: F.where(x > 2.0, x, y),
        "masked_fill": lambda x, y: y.masked_fill(x > 2.0, 0.5),
        "mse_loss": lambda x, y: F.mse_loss(x, y),
    }
    return calls[op], [array(a, draw(dtypes)), array(b, draw(dtypes), 1)]


def matmul(draw):
    a = draw(shapes(1, 4))
    b = list(draw(related(a)))
    if len(b) >= 2 and draw(st.booleans()):  # the inner axes usually agree
        b[-2] = a[-1]
    elif len(b) == 1 and draw(st.booleans()):
        b[0] = a[-1]
    return (lambda x, y: x @ y), [array(a), array(tuple(b), seed=1)]


def concatenation(draw):
    first = draw(shapes())
    others = [draw(st.sampled_from([first, draw(related(first))])) for _ in range(draw(st.integers(0, 2)))]
    axis, stack = draw(axes), draw(st.booleans())
    call = (lambda *xs: F.stack(xs, axis=axis)) if stack else (lambda *xs: F.cat(xs, axis=axis))
    return call, [array(s, seed=i) for i, s in enumerate([first] + others)]


def movement(draw):
    shape = draw(shapes())
    op = draw(st.sampled_from(["reshape", "permute", "transpose", "unsqueeze", "squeeze", "expand", "split", "T"]))
    if op == "reshape":
        target = draw(st.lists(st.sampled_from([-1, 0, 1, 2, 3, 4, 6]), max_size=4))
        call = lambda x: x.reshape(*target)  # noqa: E731
    elif op == "permute":
        order = draw(st.lists(axes, min_size=max(len(shape) - 1, 0), max_size=len(shape) + 1))
        call = lambda x: x.permute(*order)  # noqa: E731
    elif op == "transpose":
        a, b = draw(axes), draw(axes)
        call = lambda x: x.transpose(a, b)  # noqa: E731
    elif op in ("unsqueeze", "squeeze"):
        axis = draw(axes)
        call = lambda x: getattr(x, op)(axis)  # noqa: E731
    elif op == "expand":
        target = draw(st.lists(st.sampled_from([-1, 1, 2, 3]), max_size=4))
        call = lambda x: x.expand(*target)  # noqa: E731
    elif op == "split":
        size, axis = draw(st.integers(0, 3)), draw(axes)
        call = lambda x: x.split(size, axis)  # noqa: E731
    else:
        call = lambda x: x.T  # noqa: E731
    return call, [array(shape)]


def reduction(draw):
    shape = draw(shapes())
    op = draw(st.sampled_from(["sum", "mean", "max", "min", "argmax", "softmax", "log_softmax"]))
    axis = draw(st.one_of(st.none(), axes, st.lists(axes, max_size=3).map(tuple)))
    keepdims = draw(st.booleans())
    if op in ("softmax", "log_softmax"):
        axis = draw(axes)
        return (lambda x: getattr(x, op)(axis)), [array(shape)]
    if op == "argmax":
        axis = draw(st.one_of(st.none(), axes))
        return (lambda x: x.argmax(axis)), [array(shape)]
    return (lambda x: getattr(x, op)(axis=axis, keepdims=keepdims)), [array(shape)]


@st.composite
def basic_indices(draw, ndim):
    item = st.one_of(st.integers(-4, 4), st.builds(slice, st.none() | st.integers(-4, 4), st.none() | st.integers(-4, 4),
                                                  st.sampled_from([None, 1, 2, -1])),
                     st.none(), st.just(Ellipsis))
    return tuple(draw(st.lists(item, max_size=ndim + 1)))


def indexing(draw):
    shape = draw(shapes())
    index = draw(basic_indices(len(shape)))
    if draw(st.booleans()):  # integer-array indexing in range (an out-of-range index is a value: not checked)
        rows = draw(st.lists(st.integers(0, max(shape[0] - 1, 0)), max_size=3)) if shape and shape[0] else []
        index = numpy.array(rows, dtype=numpy.int64)
        return (lambda w: F.embedding(index, w)), [array(shape)]
    return (lambda x: x[index]), [array(shape)]


def convolution(draw):
    """Mostly calls that fit (channels a multiple of the groups, the weight's channels per group), some not."""
    groups = draw(st.integers(1, 2))
    n, c = draw(dims), draw(st.sampled_from([groups, 2 * groups, groups, draw(st.integers(1, 4))]))
    h, w = draw(st.integers(0, 6)), draw(st.integers(0, 6))
    out = groups * draw(st.integers(1, 2)) if draw(st.integers(0, 3)) else draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    weight_c = draw(st.sampled_from([c // groups or 1] * 3 + [draw(st.integers(1, 4))]))
    padding = draw(st.sampled_from([0, 1, 2, "same", "valid"]))
    stride = draw(st.sampled_from([1, 1, 1, 2] if padding == "same" else [1, 2]))  # 'same' refuses a stride
    dilation, bias = draw(st.integers(1, 2)), draw(st.booleans())
    image = draw(st.sampled_from([(n, c, h, w)] * 3 + [(c, h, w), (n, c, h, w, 1)]))
    arrays = [array(image), array((out, weight_c, kh, kw), seed=1)]
    if bias:
        arrays.append(array((draw(st.sampled_from([out, out, out + 1])),), seed=2))
    return (lambda x, k, *b: F.conv2d(x, k, *b, stride=stride, padding=padding, dilation=dilation,
                                      groups=groups)), arrays


def pooling(draw):
    shape = draw(st.sampled_from([(draw(dims), draw(st.integers(1, 3)), draw(st.integers(0, 6)), draw(st.integers(0, 6))),
                                  (draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 5)))]))
    kernel, stride = draw(st.integers(1, 4)), draw(st.sampled_from([None, 1, 2, 3]))
    padding, average = draw(st.integers(0, 2)), draw(st.booleans())
    if average:
        return (lambda x: F.avg_pool2d(x, kernel, stride, padding)), [array(shape)]
    dilation = draw(st.integers(1, 2))
    return (lambda x: F.max_pool2d(x, kernel, stride, padding, dilation)), [array(shape)]


def padding(draw):
    shape = draw(shapes())
    widths = tuple(draw(st.lists(st.integers(0, 2), max_size=5)))
    return (lambda x: F.pad(x, widths)), [array(shape)]


def normalisation_and_losses(draw):
    shape = draw(shapes(0, 3))
    op = draw(st.sampled_from(["layer_norm", "cross_entropy", "linear"]))
    if op == "layer_norm":
        normalized = draw(st.sampled_from([shape[-1:], draw(related(shape[-1:]))]))
        return (lambda x: F.layer_norm(x, normalized)), [array(shape)]
    if op == "linear":
        weight = (draw(dims), draw(st.sampled_from([shape[-1] if shape else 1, draw(dims)])))
        return (lambda x, w: F.linear(x, w)), [array(shape), array(weight, seed=1)]
    targets = numpy.zeros(draw(st.sampled_from([shape[:-1], draw(related(shape[:-1]))])), dtype=numpy.int64)
    return (lambda x: F.cross_entropy(x, targets)), [array(shape)]


FAMILIES = [arithmetic, matmul, concatenation, movement, reduction, indexing, convolution, pooling, padding,
            normalisation_and_losses]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.__name__)
@settings(max_examples=examples(60))
@given(data=st.data())
def test_an_op_call_raises_on_the_meta_device_iff_on_the_cpu_and_else_gives_the_same_shapes(family, data):
    call, arrays = family(data.draw)
    event(f"the CPU: {runs_alike(call, *arrays)}")  # --hypothesis-show-statistics: how many calls ran


@pytest.mark.parametrize("call, shapes", [
    (lambda x, y: F.cat([x, y], axis=0), [(2, 3), (2, 4)]),  # the other axes must agree
    (lambda x, y: F.cat([x, y], axis=0), [(2, 3), (3,)]),  # the same number of axes
    (lambda x, y: F.stack([x, y]), [(2, 3), (3, 2)]),  # stack: the same shape
    (lambda x, y: x @ y, [(4, 2, 3), (3, 3, 5)]),  # batch axes that do not broadcast
    (lambda x, y: x @ y, [(2, 3), (4, 5)]),  # the inner axes
    (lambda x, y: x + y, [(2, 3), (3, 2)]),  # broadcasting
    (lambda x: x.reshape(4, 2), [(2, 3)]),
    (lambda x: x.max(axis=0), [(0, 3)]),  # an empty reduction has no identity
    (lambda x: x.sum(axis=(0, 0)), [(2, 3)]),  # an axis twice
    (lambda x, k: F.conv2d(x, k), [(1, 2, 5, 5), (4, 3, 3, 3)]),  # channels
    (lambda x, k: F.conv2d(x, k), [(1, 2, 2, 2), (4, 2, 3, 3)]),  # a kernel larger than the image
    (lambda x: F.max_pool2d(x, 3), [(1, 1, 2, 2)]),
])
def test_a_call_that_fails_on_the_cpu_fails_on_the_meta_device(call, shapes):
    """Each of these fails on the CPU (checked here too), so its step cannot be sized on meta either."""
    arrays = [array(s, seed=i) for i, s in enumerate(shapes)]
    assert outcome(call, arrays, "cpu")[0] == "raised"
    runs_alike(call, *arrays)


# -- the array module itself: meta against NumPy, call for call ----------------------------------------
array_dtypes = st.sampled_from([numpy.float16, numpy.float32, numpy.float64, numpy.int32, numpy.int64, numpy.bool_])


@st.composite
def module_calls(draw):
    """(a function of the array module and the arrays, the arrays' shapes and dtypes): NumPy's functions
    the engine calls on the meta device, with shapes that may not fit."""
    a = draw(shapes())
    b = draw(related(a))
    name = draw(st.sampled_from(["matmul", "concatenate", "stack", "where", "einsum", "vdot", "reshape", "sum",
                                 "max", "broadcast_to", "maximum", "transpose", "getitem", "astype"]))
    axis = draw(st.one_of(st.none(), axes, st.lists(axes, max_size=2).map(tuple)))
    target = tuple(draw(st.lists(st.sampled_from([-1, 0, 1, 2, 3, 6]), max_size=3)))
    subscripts = draw(st.sampled_from(["ij,jk->ik", "...ij,...jk->...ik", "bij,bkj->bik", "i,i->", "ij->ji"]))
    index = draw(basic_indices(len(a)))
    calls = {
        "matmul": lambda xp, x, y: xp.matmul(x, y),
        "concatenate": lambda xp, x, y: xp.concatenate([x, y], axis=axis if isinstance(axis, int) else 0),
        "stack": lambda xp, x, y: xp.stack([x, y], axis=axis if isinstance(axis, int) else 0),
        "where": lambda xp, x, y: xp.where(x > 1, x, y),
        "einsum": lambda xp, x, y: xp.einsum(subscripts, x, y) if "," in subscripts else xp.einsum(subscripts, x),
        "vdot": lambda xp, x, y: xp.vdot(x, y),
        "reshape": lambda xp, x, y: x.reshape(target),
        "sum": lambda xp, x, y: x.sum(axis=axis),
        "max": lambda xp, x, y: x.max(axis=axis),
        "broadcast_to": lambda xp, x, y: xp.broadcast_to(x, b),
        "maximum": lambda xp, x, y: xp.maximum(x, y),
        "transpose": lambda xp, x, y: x.transpose(axis) if isinstance(axis, tuple) and axis else x.T,
        "getitem": lambda xp, x, y: x[index],
        "astype": lambda xp, x, y: x.astype(y.dtype) + y,
    }
    return calls[name], [(a, draw(array_dtypes)), (b, draw(array_dtypes))]


@settings(max_examples=examples(150))
@given(call=module_calls())
def test_a_call_of_the_meta_module_raises_iff_numpy_s_does_and_else_gives_its_shape_and_dtype(call):
    """Below the ops: each NumPy function the engine calls on the meta device, against NumPy on real arrays."""
    function, specs = call
    outcomes = []
    for xp in (numpy, meta):
        try:
            with numpy.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                arrays = [xp.asarray(array(shape, dtype, seed)) for seed, (shape, dtype) in enumerate(specs)]
                out = function(xp, *arrays)
            outcomes.append(("ok", tuple(out.shape), numpy.dtype(out.dtype)))
        except meta.NeedsValues:
            raise
        except Exception as e:  # noqa: BLE001
            outcomes.append(("raised", e))
    real, on_meta = outcomes
    assert real[0] == on_meta[0], f"NumPy: {real[1:]!r}; the meta device: {on_meta[1:]!r}"
    if real[0] == "ok":
        assert real == on_meta
    event(f"NumPy: {real[0]}")
