"""autocast.py's table against PyTorch 2.13's lists: every op has a place, the place PyTorch gives its op,
and under autocast each op's result has the dtype its list says (PyTorch's CUDA autocast result dtype).

The lists below are the names in PyTorch 2.13's aten/src/ATen/autocast_mode.h (the header ships in the
wheel: torch/include/ATen/autocast_mode.h), the ones its CUDA autocast registers (autocast_mode.cpp).
These tests need no torch; the last one, which runs torch's CPU autocast beside ours, skips without it.
"""

import importlib
import pkgutil

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygrad_ckpt
import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, backend, nn, tape
from tinygrad_ckpt.autocast import POLICY, autocast, bfloat16
from tinygrad_ckpt.checkpoint import checkpoint
from tinygrad_ckpt.function import Function
from tinygrad_ckpt.nn.lstm import lstm_cell
from tinygrad_ckpt.ops import elementwise, movement
from tinygrad_ckpt.testing import strict_cupy

from .conftest import examples
from .helpers import TORCH_SKIP

pytest.importorskip("ml_dtypes", reason="bfloat16 on the CPU needs ml_dtypes: pip install -e \".[bf16]\"")
F32 = numpy.dtype(numpy.float32)
LOW = {"float16": numpy.dtype(numpy.float16), "bfloat16": bfloat16()}

# -- PyTorch 2.13's lists (autocast_mode.h), the names only --------------------------------------
LOWER_PRECISION_FP = {
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv",
    "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention"}
FP32 = {
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "sinh",
    "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm",
    "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp"}  # and the upsample ops
FP32_SET_OPT_DTYPE = {"prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm",
                      "linalg_matrix_norm", "sum"}
PROMOTE = {"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
           "tensordot", "scatter_add"}
# On no list, yet promoting by themselves: PyTorch's type promotion (float32 with float16 is float32).
TYPE_PROMOTING = {"add", "sub", "mul", "div", "where", "cat", "stack"}
# Where this engine places an op elsewhere on purpose; autocast.py's docstring says why.
DIFFERS = {"Mean": "float32"}


def pytorchs_list(torch_op):
    """The list PyTorch's CUDA autocast puts torch_op on, by the names above."""
    if torch_op in LOWER_PRECISION_FP:
        return "lower"
    if torch_op in FP32 | FP32_SET_OPT_DTYPE:
        return "float32"
    if torch_op in PROMOTE | TYPE_PROMOTING:
        return "promote"
    return "none"


def function_subclasses():
    """Every Function subclass the package defines, after importing every module of it (nn/ and models too)."""
    for module in pkgutil.walk_packages(tinygrad_ckpt.__path__, "tinygrad_ckpt."):
        if not module.name.endswith("__main__"):  # __main__ runs the command line
            importlib.import_module(module.name)
    found, todo = set(), [Function]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("tinygrad_ckpt."):  # not the tests' own ops
                found.add(sub)
    return found


def test_every_function_subclass_has_a_place_in_autocasts_table():
    ops = {cls.__name__: cls for cls in function_subclasses()}
    missing = sorted(f"{name} ({cls.__module__})" for name, cls in ops.items() if name not in POLICY)
    assert not missing, (f"autocast.py's POLICY has no place for {', '.join(missing)}: add each, with its list "
                         "('lower', 'float32', 'promote' or 'none') and the PyTorch op it follows")
    # ... and nothing in the table that is no op: only lstm_cell, which nn/lstm.py builds from several
    assert set(POLICY) - set(ops) == {"lstm_cell"}
    assert {where for where, _ in POLICY.values()} == {"lower", "float32", "promote", "none"}


@pytest.mark.parametrize("op", sorted(POLICY))
def test_each_op_is_on_the_list_pytorch_puts_its_op_on(op):
    where, torch_op = POLICY[op]
    expected = DIFFERS.get(op, pytorchs_list(torch_op))
    assert where == expected, (f"{op} follows PyTorch's {torch_op}, which autocast_mode.h puts on "
                               f"{pytorchs_list(torch_op)!r}; the table says {where!r}")


def test_each_difference_from_pytorchs_lists_is_explained_in_autocasts_docstring():
    from tinygrad_ckpt import autocast as module

    for op in DIFFERS:
        assert f"{op} is on the float32 list (PyTorch's mean is on none" in " ".join(module.__doc__.split())


# -- each op's result dtype under autocast is its list's ---------------------------------------
def one(n, c, h):
    return [(n, c)]


def two(n, c, h):
    return [(n, c), (n, c)]


def image(n, c, h):
    return [(n, c, 2 * h, 2 * h)]


# op -> (input shapes from the sizes (n, c, h), a call on tensors of those shapes returning the op's output)
CALLS = {
    "MatMul": (lambda n, c, h: [(n, c), (c, h)], lambda a, b: a @ b),
    "Linear": (lambda n, c, h: [(n, c), (h, c), (h,)], F.linear),
    "Conv2d": (lambda n, c, h: [(n, c, h + 1, h + 1), (2, c, 2, 2), (2,)], F.conv2d),
    "lstm_cell": (lambda n, c, h: [(n, c), (n, h), (n, h), (4 * h, c), (4 * h, h)], lambda *t: lstm_cell(*t)[1]),
    "Exp": (one, lambda x: x.exp()),
    "Log": (one, lambda x: x.log()),
    "Pow": (two, lambda a, b: a ** b),
    "PowScalar": (one, lambda x: x ** 1.7),
    "Softplus": (one, F.softplus),
    "LayerNorm": (lambda n, c, h: [(n, c), (c,), (c,)], lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b)),
    "CrossEntropy": (one, lambda x: F.cross_entropy(x, numpy.arange(x.shape[0]) % x.shape[1])),
    "Softmax": (one, lambda x: x.softmax(axis=-1)),
    "LogSoftmax": (one, lambda x: x.log_softmax(axis=-1)),
    "Sum": (one, lambda x: x.sum(axis=0)),
    "Mean": (one, lambda x: x.mean(axis=0)),
    "Add": (two, lambda a, b: a + b),
    "Sub": (two, lambda a, b: a - b),
    "Mul": (two, lambda a, b: a * b),
    "Div": (two, lambda a, b: a / b),
    "Where": (two, lambda a, b: F.where(a.data > 1, a, b)),
    "Cat": (two, lambda a, b: F.cat([a, b])),
    "Stack": (two, lambda a, b: F.stack([a, b])),
    "Neg": (one, lambda x: -x),
    "Abs": (one, abs),
    "Sqrt": (one, lambda x: x.sqrt()),
    "Tanh": (one, lambda x: x.tanh()),
    "Sigmoid": (one, lambda x: x.sigmoid()),
    "ReLU": (one, lambda x: x.relu()),
    "GELU": (one, F.gelu),
    "GELUErf": (one, lambda x: F.gelu(x, approximate="none")),
    "LeakyReLU": (one, F.leaky_relu),
    "ReLU6": (one, F.relu6),
    "Hardswish": (one, F.hardswish),
    "SiLU": (one, F.silu),
    "Mish": (one, F.mish),
    "Max": (one, lambda x: x.max(axis=-1)),
    "Dropout": (one, lambda x: F.dropout(x, 0.5, rng=numpy.random.default_rng(0))),
    "MaxPool2d": (image, lambda x: F.max_pool2d(x, 2)),
    "AvgPool2d": (image, lambda x: F.avg_pool2d(x, 2)),
    "Reshape": (one, lambda x: x.reshape(-1)),
    "Permute": (one, lambda x: x.permute(1, 0)),
    "Expand": (one, lambda x: x.reshape(1, *x.shape).expand(3, *x.shape)),
    "GetItem": (one, lambda x: x[0]),
    "Split": (one, lambda x: x.split(1, dim=0)[0]),
    "Pad": (one, lambda x: F.pad(x, (1, 1))),
    "Clone": (one, lambda x: x.clone()),
    "ToDevice": (one, lambda x: movement.ToDevice.apply(x, device="cpu")),
    "Cast": (one, lambda x: elementwise.Cast.apply(x, dtype=numpy.dtype(numpy.float64))),
    "Checkpoint": (one, lambda x: checkpoint(lambda t: t.tanh(), x)),
}


def rule(where, low, dtypes):
    """The dtype the list says the op's result has, for inputs of `dtypes` under autocast(low); None: as without."""
    if where == "lower":
        return low
    if where == "float32":
        return F32
    if where == "promote":
        return dtypes[0] if len(set(dtypes)) == 1 else F32  # float16 with bfloat16 is float32 too
    return None


def positive(shape, dtype, seed):
    """Values in [0.5, 2) (log, sqrt and pow need no care), rounded to dtype."""
    return Tensor(numpy.random.default_rng(seed).uniform(0.5, 2, shape).astype(F32).astype(dtype), requires_grad=True)


def test_every_op_in_the_table_has_a_call_here():
    assert set(CALLS) == set(POLICY)


@pytest.mark.parametrize("low", sorted(LOW))
@pytest.mark.parametrize("op", sorted(POLICY))
@settings(max_examples=examples(4))
@given(sizes=st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 3)), data=st.data())
def test_each_ops_result_under_autocast_has_its_lists_dtype(op, low, sizes, data):
    """lower: the 16-bit dtype; float32: float32; promote: the widest input's; none: what it is without autocast."""
    where, torch_op = POLICY[op]
    shapes, call = CALLS[op]
    shapes = shapes(*sizes)
    floats = [F32, *LOW.values()]
    if where == "none":  # one dtype for every input: these ops refuse a mix, with or without autocast
        dtypes = [data.draw(st.sampled_from(floats))] * len(shapes)
    else:
        dtypes = [data.draw(st.sampled_from(floats)) for _ in shapes]
    inputs = [positive(shape, dtype, seed) for seed, (shape, dtype) in enumerate(zip(shapes, dtypes))]
    with tape.recording(tape.Tape()) as recorded, autocast(low):
        out = call(*inputs)
    ran = {record.op.__name__ for record in recorded.nodes()}
    assert op in ran or op == "lstm_cell", f"the call for {op} ran {sorted(ran)}"
    expected = rule(where, LOW[low], dtypes) or call(*inputs).dtype
    assert out.dtype == expected, (f"{op} (on the {where!r} list, as PyTorch's {torch_op}): inputs "
                                   f"{[d.name for d in dtypes]} gave {out.dtype} under autocast({low!r}), its list "
                                   f"says {expected}")


# -- the bugs this table fixed -------------------------------------------------------------------
@pytest.mark.parametrize("low", sorted(LOW))
@settings(max_examples=examples(3))
@given(batch=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_a_16bit_cnn_computes_its_convolutions_in_16_bits(low, batch, seed):
    config = nn.CNNConfig(image_size=8, in_channels=2, n_classes=3, widths=(4, 6), convs_per_stage=1)
    model = nn.CNN(config, rng=numpy.random.default_rng(seed))
    images = Tensor(numpy.random.default_rng(seed + 1).standard_normal((batch, 2, 8, 8)).astype(numpy.float32))
    with tape.recording(tape.Tape()) as recorded, autocast(low):
        _, loss = model(images, numpy.arange(batch) % 3)
        convs = [record for record in recorded.nodes() if record.op.__name__ == "Conv2d"]
    assert len(convs) == 2
    for record in convs:  # the input, the weight (cast from float32) and the output: all 16-bit
        assert set(record.input_dtypes) == {LOW[low]}
        assert list(record.dtypes) == [LOW[low]]
    assert loss.dtype == F32
    loss.backward()
    assert all(p.grad.dtype == F32 for p in model.parameters())  # master weights: float32 gradients


@pytest.mark.parametrize("low", sorted(LOW))
@settings(max_examples=examples(3))
@given(batch=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_a_linear_then_a_conv2d_under_autocast_runs_and_is_float32s_within_16_bit_rounding(low, batch, seed):
    rng = numpy.random.default_rng(seed)
    linear, conv = nn.Linear(5, 2 * 4 * 4, rng=rng), nn.Conv2d(2, 3, 3, padding=1, rng=rng)
    x = Tensor(rng.standard_normal((batch, 5)).astype(numpy.float32))

    def forward():
        return conv(linear(x).reshape(batch, 2, 4, 4))

    with autocast(low):
        out = forward()
    assert out.dtype == LOW[low]
    out.to(dtype=numpy.float32).sum().backward()
    grads = [p.grad.data.copy() for p in (*linear.parameters(), *conv.parameters())]
    assert all(g.dtype == F32 for g in grads)
    for p in (*linear.parameters(), *conv.parameters()):
        p.grad = None
    reference = forward()
    reference.sum().backward()
    step = float(numpy.finfo(LOW[low]).eps)  # float16: 2^-10, bfloat16: 2^-7
    scale = numpy.abs(reference.data).max() + 1
    assert numpy.allclose(out.data.astype(F32), reference.data, atol=8 * step * scale)
    for g, p in zip(grads, (*linear.parameters(), *conv.parameters())):
        assert numpy.allclose(g, p.grad.data, atol=16 * step * (numpy.abs(p.grad.data).max() + 1))


@pytest.mark.parametrize("low", sorted(LOW))
def test_pow_softplus_and_mse_loss_are_float32_under_autocast_and_16_bit_without(low):
    x, y = positive((3, 4), LOW[low], 0), positive((3, 4), LOW[low], 1)
    results = {"x ** 1.7": lambda: x ** 1.7, "2 ** x": lambda: 2 ** x, "x ** y": lambda: x ** y,
               "softplus": lambda: F.softplus(x), "mse_loss": lambda: F.mse_loss(x, y)}
    for name, result in results.items():
        with autocast(low):
            assert result().dtype == F32, name  # PyTorch's pow, softplus and mse_loss: AT_FORALL_FP32
    for name in ("x ** 1.7", "2 ** x", "x ** y", "softplus"):
        assert results[name]().dtype == LOW[low], name  # outside autocast nothing is cast


@pytest.mark.parametrize("low", sorted(LOW))
@given(batch=st.integers(1, 3), hidden=st.integers(1, 4), seed=st.integers(0, 2**16))
@settings(max_examples=examples(3))
def test_the_lstm_cell_runs_in_16_bits_state_and_all(low, batch, hidden, seed):
    """A float32 state in, a 16-bit state out, and every op of the cell on 16-bit inputs, as PyTorch's lstm_cell."""
    cell = nn.LSTMCell(3, hidden, rng=numpy.random.default_rng(seed))
    x = Tensor(numpy.random.default_rng(seed + 1).standard_normal((batch, 3)).astype(numpy.float32))
    with tape.recording(tape.Tape()) as recorded, autocast(low):
        h, c = cell(x)
        h2, c2 = cell(x, (h, c))  # the 16-bit state goes back in, as PyTorch takes it
        records = [record for record in recorded.nodes() if record.op.__name__ != "Cast"]
        loss = (h2 * c2).to(dtype=numpy.float32).sum()
    assert {h.dtype, c.dtype, h2.dtype, c2.dtype} == {LOW[low]}
    for record in records:
        assert set(record.input_dtypes) == {LOW[low]}, record.op.__name__
    loss.backward()
    assert all(p.grad.dtype == F32 for p in cell.parameters())


@pytest.mark.parametrize("low", sorted(LOW))
def test_an_lstm_under_autocast_hands_back_a_16_bit_output_and_state(low):
    lstm = nn.LSTM(3, 4, num_layers=2, rng=numpy.random.default_rng(0))
    x = Tensor(numpy.random.default_rng(1).standard_normal((5, 2, 3)).astype(numpy.float32))
    with autocast(low):
        out, (h_n, c_n) = lstm(x)
        out2, _ = lstm(x, (h_n, c_n))  # its own 16-bit state back in
    assert {out.dtype, h_n.dtype, c_n.dtype, out2.dtype} == {LOW[low]}
    with pytest.raises(TypeError, match="h_0 is"):
        lstm(x, (h_n, c_n))  # outside autocast a 16-bit state against float32 parameters is refused


@pytest.mark.parametrize("low", sorted(LOW))
def test_a_16_bit_cnn_and_lstm_on_the_gpu_path_make_no_numpy_call(low):
    """On the strict CuPy stand-in (device 'cuda'), where a NumPy call on a device array fails the test: the
    convolutions' 16-bit products and float32 sums, the cell's casts, and the float32 gradients."""
    previous = backend.set_cuda_module(strict_cupy)
    try:
        rng = numpy.random.default_rng(0)
        cnn = nn.CNN(nn.CNNConfig(image_size=4, in_channels=2, n_classes=3, widths=(4,), convs_per_stage=1),
                     rng=rng, device="cuda")
        lstm = nn.LSTM(3, 4, rng=rng, device="cuda")
        images = Tensor(rng.standard_normal((2, 2, 4, 4)).astype(numpy.float32), device="cuda")
        sequence = Tensor(rng.standard_normal((5, 2, 3)).astype(numpy.float32), device="cuda")
        with autocast(low):
            logits, loss = cnn(images, backend.to_device(numpy.array([0, 2]), "cuda"))
            out, _ = lstm(sequence)
            loss = loss + out.sum()
        loss.backward()
        assert logits.dtype == out.dtype == LOW[low] and backend.device_of(out.data) == "cuda"
        assert {p.grad.dtype for p in (*cnn.parameters(), *lstm.parameters())} == {F32}
    finally:
        backend.set_cuda_module(previous)


# -- beside PyTorch's own autocast (skips without torch) -----------------------------------------
# The ops whose PyTorch op is on a CUDA list that PyTorch's CPU autocast does not register (autocast_mode.cpp,
# TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)): on the CPU torch keeps 16-bit inputs 16-bit (and lstm_cell's
# float32 state float32), where the CUDA lists, ours, give float32 (a 16-bit state). Mean: autocast.py's docstring.
CPU_DIFFERS = {"Exp", "Log", "Pow", "PowScalar", "Softplus", "LayerNorm", "Softmax", "LogSoftmax", "Sum", "Mean",
               "lstm_cell"}


def torch_calls(torch):
    tf = torch.nn.functional
    return {
        "MatMul": lambda a, b: a @ b, "Linear": tf.linear, "Conv2d": tf.conv2d,
        "lstm_cell": lambda x, h, c, w_ih, w_hh: torch.lstm_cell(x, (h, c), w_ih, w_hh)[1],
        "Exp": torch.exp, "Log": torch.log, "Pow": torch.pow, "PowScalar": lambda x: x ** 1.7, "Softplus": tf.softplus,
        "LayerNorm": lambda x, w, b: tf.layer_norm(x, (x.shape[-1],), w, b),
        "CrossEntropy": lambda x: tf.cross_entropy(x, torch.arange(x.shape[0]) % x.shape[1]),
        "Softmax": lambda x: x.softmax(-1), "LogSoftmax": lambda x: x.log_softmax(-1),
        "Sum": lambda x: x.sum(0), "Mean": lambda x: x.mean(0),
        "Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div,
        "Where": lambda a, b: torch.where(a > 1, a, b), "Cat": lambda a, b: torch.cat([a, b]),
        "Stack": lambda a, b: torch.stack([a, b]), "Tanh": torch.tanh, "Sigmoid": torch.sigmoid,
        "ReLU": torch.relu, "GELU": lambda x: tf.gelu(x, approximate="tanh"), "Sqrt": torch.sqrt,
        "Max": lambda x: x.amax(-1), "MaxPool2d": lambda x: tf.max_pool2d(x, 2),
        "AvgPool2d": lambda x: tf.avg_pool2d(x, 2),
    }


@pytest.mark.parametrize("low", sorted(LOW))
def test_the_result_dtypes_beside_torchs_cpu_autocast(low):
    """Equal to torch's CPU autocast where its CPU lists agree with the CUDA ones; where they do not
    (CPU_DIFFERS), torch's CPU result is the other dtype, as the comment above says."""
    torch = pytest.importorskip("torch", reason=TORCH_SKIP)
    torch_low = getattr(torch, low)
    for op, torch_call in torch_calls(torch).items():
        where = POLICY[op][0]
        shapes = CALLS[op][0](2, 3, 2)
        # lower: float32 inputs (parameters and data); promote: float32 and 16-bit; the others: 16-bit
        dtypes = [F32 if where == "lower" or (where == "promote" and i == 0) else LOW[low] for i in range(len(shapes))]
        inputs = [positive(shape, dtype, seed) for seed, (shape, dtype) in enumerate(zip(shapes, dtypes))]
        torch_inputs = [torch.from_numpy(t.data.astype(F32)).to(torch_low if d != F32 else torch.float32)
                        for t, d in zip(inputs, dtypes)]
        with autocast(low):
            ours = CALLS[op][1](*inputs).dtype.name
        with torch.autocast("cpu", dtype=torch_low):
            theirs = str(torch_call(*torch_inputs).dtype).removeprefix("torch.")
        if op in CPU_DIFFERS:
            assert ours != theirs, f"{op}: torch's CPU autocast now gives {theirs} as ours does: update CPU_DIFFERS"
        else:
            assert ours == theirs, f"{op} ({where} list): ours {ours}, torch's CPU autocast {theirs}"
