"""Checkpointing as PyTorch's non-reentrant checkpoint and JAX's remat behave, in this engine's terms.

Ported behaviour, each test naming its source:
  * PyTorch 2.13's test/test_utils.py, TestCheckpoint: test_checkpoint_trigger,
    test_checkpoint_valid, test_checkpoint_non_tensor,
    test_checkpoint_non_tensor_inputs_outputs, test_checkpoint_no_tensors,
    test_checkpoint_partial_grad, test_checkpointing_without_reentrant_early_free;
    and torch/utils/checkpoint.py's documented differences of the
    non-reentrant variant (any backward, nested structures, early stop,
    parameters whatever the inputs, the determinism check).
  * JAX's tests/api_test.py, RematTest (jax v0.11.0): test_remat_basic (1 call
    of sin in the linearized function), test_remat_checkpoint_dots (2 calls of
    sin, with the dots saved), test_remat_freevars (a value from outside).

Counting what a recompute runs: `count_forwards` wraps ops' forward and
counts calls, so "ran again" means the op's arithmetic ran, not that the
Python code around it did.

Gradients are compared with the plain (not checkpointed) computation in
float64 at rtol 1e-12: a recompute runs the same ops on the same numbers.
These tests run on NumPy and on the strict CuPy stand-in (conftest.py).
"""

import gc

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, autograd, memory, nn, policies, tape
from tinygrad_ckpt.autograd import save_on_cpu, saved_tensors_hooks
from tinygrad_ckpt.checkpoint import CheckpointError, checkpoint, checkpoint_sequential
from tinygrad_ckpt.ops import elementwise, matmul
from tinygrad_ckpt.testing import strict_cupy

F64 = numpy.float64
RTOL, ATOL = 1e-12, 1e-14


def randn(*shape, seed=0, requires_grad=False):
    return Tensor(numpy.random.default_rng(seed).standard_normal(shape), requires_grad=requires_grad)


def grads(tensors):
    return [None if t.grad is None else t.grad.numpy().copy() for t in tensors]


def assert_same(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g is None) == (w is None), f"gradient {i}: one is None"
        if g is not None:
            numpy.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"gradient {i}")


@pytest.fixture
def count_forwards(monkeypatch):
    """count_forwards(op, ...) -> a dict name -> calls of that op's forward since."""

    def install(*ops):
        calls = {op.__name__: 0 for op in ops}
        for op in ops:
            original = op.forward

            def counting(ctx, *arrays, _original=original, _name=op.__name__, **options):
                calls[_name] += 1
                return _original(ctx, *arrays, **options)

            monkeypatch.setattr(op, "forward", staticmethod(counting))
        return calls

    return install


def recompute_counts(calls, run_forward, run_backward):
    """The calls the backward makes (the recompute), given counters installed by count_forwards."""
    out = run_forward()
    before = dict(calls)
    run_backward(out)
    return {k: calls[k] - before[k] for k in calls}


# -- 1. what a checkpointed function may take and return -----------------------------
def structured(d, pairs, scale, *, mode, extra=None):
    """Inputs in a dict, a list of tuples and a keyword; outputs of every kind."""
    a, b = d["a"], pairs[0][1]
    h = (a * b).tanh() * scale
    out = {"h": h, "n": 3, "name": mode, "none": None, "nested": [(h * extra).exp(), b.argmax(), "x"]}
    return out, True


def use(out):
    return out[0]["h"].sum() + (out[0]["nested"][0] ** 2).sum()


def test_tensors_anywhere_in_the_arguments_and_outputs_of_any_kind():
    results = []
    for ckpt in (False, True):
        a, b, c = randn(3, seed=1, requires_grad=True), randn(3, seed=2, requires_grad=True), randn(3, seed=3)
        args = ({"a": a}, [(1, b)], 2.0)
        out = checkpoint(structured, *args, mode="m", extra=c) if ckpt else structured(*args, mode="m", extra=c)
        assert out[1] is True and out[0]["n"] == 3 and out[0]["name"] == "m" and out[0]["none"] is None
        assert out[0]["nested"][2] == "x" and isinstance(out[0]["nested"], list)
        argmax = out[0]["nested"][1]
        assert argmax.dtype.kind == "i" and not argmax.requires_grad  # an integer output: no gradient
        use(out).backward()
        results.append(grads([a, b, c]) + [out[0]["h"].numpy()])
    assert_same(results[1], results[0])
    assert results[1][2] is None  # c needs no gradient


def test_a_function_without_tensor_output_just_runs():
    ran = []
    x = randn(3, requires_grad=True)
    assert checkpoint(lambda t: ran.append(t.shape) or 5, x) == 5
    assert checkpoint(lambda t: ("a", None), x) == ("a", None)
    assert ran == [(3,)]


def test_pytorch_non_tensor_inputs_outputs():
    """test_utils.py: test_checkpoint_non_tensor_inputs_outputs, in this engine's (non-reentrant) terms."""

    def foo(t1, t2, scale, t3):
        t4 = (t1 + t2 * t3) * scale
        t5 = (t1 * t2 + t3) * scale
        return scale, t4, None, True, t5, "bar", t1

    t1, t2, t3 = randn(10, seed=1, requires_grad=True), randn(10, seed=2, requires_grad=True), randn(10, seed=3)
    res = checkpoint(foo, t1, t2, 7, t3)
    assert res[0] == 7 and res[2] is None and res[3] is True and res[5] == "bar"
    # An input returned as it is is that very tensor, as torch 2.13's non-reentrant checkpoint returns
    # it (its reentrant one wraps it in a new output of its record, which a second backward refuses).
    assert res[6] is t1
    res[1].sum().backward(retain_graph=True)
    res[4].sum().backward()  # the record's saved arrays are freed now
    res[6].sum().backward()
    with pytest.raises(RuntimeError, match="a second time"):
        res[1].sum().backward()
    with_ckpt = grads([t1, t2])
    t1.grad = t2.grad = None
    plain = foo(t1, t2, 7, t3)
    (plain[1].sum() + plain[4].sum() + plain[6].sum()).backward()
    assert_same(with_ckpt, grads([t1, t2]))


def test_pytorch_no_tensors_and_none_arguments():
    """test_utils.py: test_checkpoint_no_tensors and test_checkpoint_non_tensor."""
    assert checkpoint(lambda a, b, s: (a + b) * s, 0.5, 0.25, 4) == 3.0
    x = randn(2, requires_grad=True)
    out = checkpoint(lambda t, u: t if u is None else t + u, x, None)
    out.sum().backward()
    numpy.testing.assert_allclose(x.grad.numpy(), [1.0, 1.0])


def test_pytorch_partial_grad():
    """test_utils.py: test_checkpoint_partial_grad. An output that needs no gradient has none."""
    x, y = randn(1, 4, requires_grad=True), randn(1, 4, seed=1)
    out = checkpoint(lambda a, b: (a, b), x, y)
    assert out[0].requires_grad and not out[1].requires_grad
    out[0].sum().backward()
    numpy.testing.assert_allclose(x.grad.numpy(), numpy.ones((1, 4)))
    out = checkpoint(lambda a, b: a, y, x)  # returns the input that needs no gradient
    assert not out.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        out.sum().backward()


def test_a_tensor_read_from_the_closure_is_an_input():
    """JAX's test_remat_freevars; PyTorch's non-reentrant checkpoint does the same."""
    results = []
    for ckpt in (False, True):
        w, x = randn(3, seed=4, requires_grad=True), randn(3, seed=5, requires_grad=True)
        y = (w * 2.0).tanh()  # computed outside, needs a gradient

        def f(t):
            return (t.exp() * y).tanh()

        out = checkpoint(f, x) if ckpt else f(x)
        if ckpt:
            assert len(out._node.edges) == 2  # x and y: y is an input of the record
            assert sum(a.nbytes for a in out._node.ctx.saved_arrays) == 2 * 3 * 8  # both saved
        (out * out).sum().backward()
        results.append(grads([w, x]))
    assert_same(results[1], results[0])


def test_keywords_are_the_checkpoints_and_the_rest_go_to_the_function():
    x = randn(3, requires_grad=True)
    seen = {}

    def f(t, scale=1.0, debug="fn's own"):
        seen.update(scale=scale, debug=debug)
        return t * scale

    checkpoint(f, x, scale=3.0, use_reentrant=False, debug=False).sum().backward()
    assert seen == {"scale": 3.0, "debug": "fn's own"}  # debug= was the checkpoint's
    numpy.testing.assert_allclose(x.grad.numpy(), [3.0] * 3)
    with pytest.raises(ValueError, match=r"use_reentrant=True asks for PyTorch's reentrant checkpoint.*"
                                         r"Pass use_reentrant=False, or leave it out"):
        checkpoint(f, x, use_reentrant=True)
    with pytest.raises(ValueError, match=r"determinism_check must be one of 'default', 'values', 'none', got 'shapes'"):
        checkpoint(f, x, determinism_check="shapes")
    with pytest.raises(TypeError, match="early_stop must be True or False"):
        checkpoint(f, x, early_stop="yes")


# -- 2. the determinism check ------------------------------------------------------------
def another_path():
    calls = []

    def f(t):
        calls.append(1)
        return t.exp() if len(calls) == 1 else t.tanh()  # same shapes, another op

    return f


def test_a_recompute_that_takes_another_path_is_an_error_naming_the_ops():
    x = Tensor(numpy.array([0.5, 1.0, 2.0]), requires_grad=True)
    y = checkpoint(another_path(), x)
    with pytest.raises(CheckpointError, match=r"ran Tanh as op #0, where its forward ran Exp.*Pass debug=True"):
        y.sum().backward()
    y = checkpoint(another_path(), x, debug=True)
    with pytest.raises(CheckpointError) as error:
        y.sum().backward()
    table = str(error.value).split("\n")[1:]
    assert table[0].split() == ["#", "forward", "recompute"]
    assert table[1].split() == ["0", "Exp", "Tanh", "<-", "differs"]


def test_determinism_check_none_recomputes_in_full_and_checks_nothing():
    x = Tensor(numpy.array([0.5, 1.0]), requires_grad=True)
    checkpoint(another_path(), x, determinism_check="none").sum().backward()
    numpy.testing.assert_allclose(x.grad.numpy(), 1 - numpy.tanh([0.5, 1.0]) ** 2)  # the recompute's ops, as asked


def test_a_recompute_whose_inputs_changed_shape_is_an_error():
    calls = []

    def f(t):
        calls.append(1)
        h = t[: len(calls)]  # another slice each time it runs
        return h.tanh() + 1.0  # Tanh runs again (it saved its output): it sees the other slice

    y = checkpoint(f, randn(3, 2, requires_grad=True))
    with pytest.raises(CheckpointError, match=r"ran Tanh \(op #1\), which saved \(2, 2\) float64 for backward, "
                                              r"where its forward saved \(1, 2\) float64"):
        y.sum().backward()
    calls.clear()

    def quiet(t):
        calls.append(1)
        return F.dropout(t[: len(calls)], 0.5, rng=numpy.random.default_rng(0)) + 1.0

    # Here nothing that runs again reads the slice: the slice and the dropout are rebuilt from
    # the forward (their records, placeholders of the forward's shapes), and the gradient is
    # the forward's, as with PyTorch's early stop.
    x = randn(3, 2, requires_grad=True)
    checkpoint(quiet, x).sum().backward()
    assert x.grad.shape == (3, 2) and not x.grad.numpy()[1:].any()
    calls.clear()

    def g(t):
        calls.append(1)
        return t[: len(calls)] @ Tensor(numpy.ones((2, 2)))  # what runs is checked by what it returns

    y = checkpoint(g, randn(3, 2, requires_grad=True))
    with pytest.raises(CheckpointError, match=r"returned output 0 with shape \(2, 2\), dtype float64, but its forward "
                                              r"returned shape \(1, 2\)"):
        y.sum().backward()


# -- 3. and 4. recompute only what backward needs -------------------------------------------
def test_a_block_ending_in_a_linear_does_not_run_that_linear_again(count_forwards):
    calls = count_forwards(matmul.Linear, elementwise.GELU)
    rng = numpy.random.default_rng(0)
    block = nn.Sequential(nn.Linear(4, 4, dtype=F64, rng=rng), nn.GELU(), nn.Linear(4, 4, dtype=F64, rng=rng))
    x = randn(2, 4, requires_grad=True)
    counts = recompute_counts(calls, lambda: checkpoint(block, x), lambda y: y.sum().backward())
    assert counts == {"Linear": 1, "GELU": 1}  # the first Linear and GELU; the last Linear saved what it needs
    ckpt = grads([x] + list(block.parameters()))
    x.grad = None
    block.zero_grad()
    counts = recompute_counts(calls, lambda: checkpoint(block, x, early_stop=False), lambda y: y.sum().backward())
    assert counts == {"Linear": 2, "GELU": 1}  # without early stop: the whole block again
    assert_same(grads([x] + list(block.parameters())), ckpt)


def test_jax_checkpoint_dots_recomputes_two_of_three(count_forwards):
    """JAX's test_remat_checkpoint_dots: dot, sin, dot, sin, dot, sin with the dots saved:
    the linearized function has 2 sins and no dot recomputed. Here GELU stands for sin (it
    saves its input, as sin does for cos) and save_matmuls for checkpoint_dots."""
    calls = count_forwards(matmul.MatMul, elementwise.GELU)

    def f(x):
        x = (x @ x).gelu()
        x = (x @ x).gelu()
        return (x @ x).gelu()

    x = Tensor(numpy.random.default_rng(1).standard_normal((2, 2)) * 0.5, requires_grad=True)
    counts = recompute_counts(calls, lambda: checkpoint(f, x, policy=policies.save_matmuls),
                              lambda y: y.sum().backward())
    assert counts == {"MatMul": 0, "GELU": 2}
    ckpt = grads([x])
    x.grad = None
    f(x).sum().backward()
    assert_same(ckpt, grads([x]))


def test_jax_remat_basic_one_call_of_the_inner_op(count_forwards):
    """JAX's test_remat_basic: sin(sin(x)) under remat; the linearized function calls sin once
    (for cos of the inner result). The outer op's saved input is the inner one's result."""
    calls = count_forwards(elementwise.GELU)
    x = randn(3, requires_grad=True)
    counts = recompute_counts(calls, lambda: checkpoint(lambda t: (t.gelu().gelu(), 3.0), x),
                              lambda out: out[0].sum().backward())
    assert counts == {"GELU": 1}


def test_a_side_branch_and_a_value_from_constants_are_not_recomputed(count_forwards):
    calls = count_forwards(elementwise.Exp, elementwise.Tanh, elementwise.Add)
    constant = Tensor(numpy.full(3, 2.0))

    def f(t):
        t.exp()  # a side branch: its result is never used
        c = constant.exp()  # depends on constants only; used by the Add, which saves nothing
        return t.tanh() + c

    x = randn(3, requires_grad=True)
    counts = recompute_counts(calls, lambda: checkpoint(f, x), lambda y: y.sum().backward())
    assert counts == {"Exp": 0, "Tanh": 1, "Add": 0}
    numpy.testing.assert_allclose(x.grad.numpy(), 1 - numpy.tanh(x.numpy()) ** 2, rtol=RTOL)


def test_a_segment_that_saved_only_its_inputs_is_not_called_again():
    calls = []
    layer = nn.Linear(3, 3, dtype=F64, rng=numpy.random.default_rng(2))

    def f(t):
        calls.append(1)
        return layer(t)  # Linear saves its input and its weight: both exist

    x = randn(2, 3, requires_grad=True)
    checkpoint(f, x).sum().backward()
    assert calls == [1]  # the forward only
    calls.clear()
    checkpoint(lambda t: (calls.append(1), t.tanh())[1], x, policy=policies.everything_saveable).sum().backward()
    assert calls == [1]  # everything kept: nothing to run again


def test_pytorch_checkpoint_trigger():
    """test_utils.py: test_checkpoint_trigger. PyTorch's last segment is not checkpointed, so
    only the first half run twice there; here every segment is, and each module's multiply
    saved a constant it made (the 2.0), which only running its code makes again."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.counter = 0

        def forward(self, x):
            self.counter += 1
            return x * 2.0

    modules = [Net() for _ in range(10)]
    out = checkpoint_sequential(modules, 2, randn(3, 4, requires_grad=True))
    assert [m.counter for m in modules] == [1] * 10
    out.sum().backward()
    assert [m.counter for m in modules] == [2] * 10


def test_reading_a_skipped_value_recomputes_in_full(count_forwards):
    """The code reads the value of an op the plan skips: the checkpoint recomputes it all."""
    calls = count_forwards(elementwise.Exp)

    def f(t):
        scale = t.exp().sum().item()  # Exp and Sum: no backward needs them, but .item() reads them
        return t * scale

    x = randn(3, requires_grad=True)
    counts = recompute_counts(calls, lambda: checkpoint(f, x), lambda y: y.sum().backward())
    assert counts == {"Exp": 1}  # skipped at first, then run in the full recompute
    numpy.testing.assert_allclose(x.grad.numpy(), [numpy.exp(x.numpy()).sum()] * 3, rtol=RTOL)


def test_a_placeholder_that_leaves_the_recompute_cannot_be_read():
    leaked = []

    def f(t):
        leaked.append(t.exp())  # not needed by backward: a placeholder in the recompute
        return t.tanh()

    checkpoint(f, randn(3, requires_grad=True)).sum().backward()
    with pytest.raises(tape.PlaceholderRead, match="numpy\\(\\): this tensor was not computed"):
        leaked[1].numpy()
    assert leaked[0].numpy().shape == (3,)  # the forward's is real


def test_pytorch_early_free():
    """test_utils.py: test_checkpointing_without_reentrant_early_free, with memory.py for CUDA's
    counter: in a backward through a checkpoint, each step frees what it used, even with
    retain_graph=True (the recompute's graph is its own)."""

    def run(how):
        stats = []
        gc.collect()  # what earlier tests left in cycles goes now, not between two of the hooks

        def track(h, idx):
            def hook(_):
                assert len(stats) == idx
                stats.append(memory.current()["activations"])

            h.register_hook(hook)

        def fn(t):
            t = t ** 2
            track(t, 2)
            t = t ** 2
            track(t, 1)
            t = t ** 2
            track(t, 0)
            return (t ** 2).sum()

        how(fn)
        return stats

    x = Tensor(numpy.zeros(1000), requires_grad=True)
    plain = run(lambda fn: fn(x).backward())
    ckpt = run(lambda fn: checkpoint(fn, x).backward())
    ckpt_retained = run(lambda fn: checkpoint(fn, x).backward(retain_graph=True))
    assert plain[0] > plain[1] > plain[2]
    assert [a - plain[2] for a in plain] == [a - ckpt[2] for a in ckpt] == [a - ckpt_retained[2] for a in ckpt_retained]


# -- 6. saved-tensor hooks ---------------------------------------------------------------------
def test_saved_tensors_hooks_see_every_saved_array_and_give_it_back():
    packed, unpacked = [], []

    def pack(t):
        packed.append(t.shape)
        return t

    def unpack(t):
        unpacked.append(t.shape)
        return t

    results = []
    for hooked in (False, True):
        x, w = randn(2, 3, requires_grad=True), randn(3, 3, seed=1, requires_grad=True)
        if hooked:
            with saved_tensors_hooks(pack, unpack):
                y = ((x @ w).tanh() * x.sum()).sum()
        else:
            y = ((x @ w).tanh() * x.sum()).sum()
        y.backward()
        results.append(grads([x, w]))
    assert_same(results[1], results[0])
    # MatMul saves x and w, Tanh its output, Mul its two inputs (Sum saves nothing).
    assert packed == [(2, 3), (3, 3), (2, 3), (2, 3), ()]
    assert sorted(unpacked) == sorted(packed)


def test_memory_accounting_sees_what_pack_returns():
    x = randn(64, 64, requires_grad=True)
    before = memory.current()["activations"]
    y = x.tanh()  # saves its (64, 64) output
    plain = memory.current()["activations"] - before
    del y
    handles = []
    with saved_tensors_hooks(lambda t: handles.append(t) or len(handles) - 1, lambda i: handles[i]):
        y = x.tanh()
    assert plain == 64 * 64 * 8 and memory.current()["activations"] - before == 0  # a handle holds no bytes
    y.sum().backward()
    numpy.testing.assert_allclose(x.grad.numpy(), 1 - numpy.tanh(x.numpy()) ** 2, rtol=RTOL)


def test_the_version_check_sees_through_pack():
    x = randn(3, requires_grad=True)
    with saved_tensors_hooks(lambda t: t, lambda t: t):
        h = x * 1.0
        y = h.exp()  # saves its output
    with tape.no_grad():
        y.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_save_on_cpu_gives_the_same_gradients_and_moves_arrays_on_a_device(array_backend):
    results = []
    for offload in (False, True):
        layer = nn.Linear(4, 4, dtype=F64, rng=numpy.random.default_rng(0))
        x = randn(3, 4, requires_grad=True)
        strict_cupy.reset_transfers()
        if offload:
            with save_on_cpu():
                y = layer(x).tanh()
        else:
            y = layer(x).tanh()
        to_host = strict_cupy.transfers["device_to_host"]
        (y * y).sum().backward()
        results.append(grads([x] + list(layer.parameters())))
        if array_backend == "strict" and offload:
            # Linear saves x and its weight, Tanh its output: three arrays out, three back.
            assert to_host == 3 and strict_cupy.transfers["host_to_device"] == 3
    assert_same(results[1], results[0])


def test_the_checkpoint_record_packs_its_inputs_and_the_recompute_packs_nothing():
    packed = []
    block = nn.Sequential(nn.Linear(4, 4, dtype=F64, rng=numpy.random.default_rng(0)), nn.GELU())
    x = randn(2, 4, requires_grad=True)
    with saved_tensors_hooks(lambda t: packed.append(t.shape) or t, lambda t: t):
        y = checkpoint(block, x)
        y.sum().backward()  # the recompute saves, inside the hooks' block too
    assert packed == [(2, 4)]  # only the record's saved input


# -- 7. gradient hooks ----------------------------------------------------------------------
def test_hooks_run_inside_a_recomputed_segment_exactly_as_outside():
    seen = {False: [], True: []}
    layer = nn.Linear(3, 3, dtype=F64, rng=numpy.random.default_rng(3))

    def f(t, log):
        h = layer(t)
        h.register_hook(lambda g: log.append(("h", g.numpy().copy())))
        u = h.gelu()
        u.register_hook(lambda g: log.append(("u", g.numpy().copy())) or g * 2.0)  # replaces the gradient
        return layer(u)  # the last Linear: rebuilt, not run, in the recompute

    results = []
    for ckpt in (False, True):
        layer.zero_grad()
        x = randn(2, 3, requires_grad=True)
        y = checkpoint(f, x, seen[ckpt]) if ckpt else f(x, seen[ckpt])
        y.register_hook(lambda g: seen[ckpt].append(("y", g.numpy().copy())))
        y.sum().backward()
        results.append(grads([x] + list(layer.parameters())))
    assert [name for name, _ in seen[True]] == [name for name, _ in seen[False]] == ["y", "u", "h"]
    assert_same([g for _, g in seen[True]], [g for _, g in seen[False]])
    assert_same(results[1], results[0])


def test_a_leaf_hook_sees_the_whole_gradient_once():
    w = randn(3, requires_grad=True)
    seen = []
    handle = w.register_hook(lambda g: seen.append(g.numpy().copy()))
    checkpoint(lambda t: (t * w).sum() + (t * w * 2.0).sum(), randn(3, seed=1)).backward()
    assert len(seen) == 1  # w used twice inside the segment: one call, with the sum
    numpy.testing.assert_allclose(seen[0], 3 * randn(3, seed=1).numpy(), rtol=RTOL)
    handle.remove()
    (w * 1.0).sum().backward()
    assert len(seen) == 1
    with pytest.raises(RuntimeError, match="cannot register a hook on a tensor that doesn't require gradient"):
        randn(2).register_hook(print)


# -- 9. and 10. functional gradients --------------------------------------------------------
def test_grad_and_backward_inputs_through_checkpointed_segments():
    """test_utils.py: test_checkpoint_valid (torch.autograd.grad works with use_reentrant=False)."""
    rng = numpy.random.default_rng(4)
    model = nn.Sequential(nn.Linear(6, 5, dtype=F64, rng=rng), nn.ReLU(), nn.Linear(5, 4, dtype=F64, rng=rng),
                          nn.ReLU(), nn.Linear(4, 2, dtype=F64, rng=rng), nn.ReLU())
    x = Tensor(numpy.abs(randn(3, 6, seed=5).numpy()), requires_grad=True)
    params = list(model.parameters())
    plain = autograd.grad(model(x).sum(), [x] + params)
    model.gradient_checkpointing_enable(2)
    ckpt = autograd.grad(model(x).sum(), [x] + params)
    assert_same([g.numpy() for g in ckpt], [g.numpy() for g in plain])
    assert x.grad is None and all(p.grad is None for p in params)  # grad() touches no .grad
    model(x).sum().backward(inputs=[x])
    assert_same([x.grad.numpy()], [plain[0].numpy()])
    assert all(p.grad is None for p in params)  # only the inputs asked for
    model(x).sum().backward(inputs=params[:2])
    assert_same(grads(params[:2]), [g.numpy() for g in plain[1:3]])
    assert all(p.grad is None for p in params[2:])


def test_grad_errors_and_options():
    x, unused = randn(3, requires_grad=True), randn(3, seed=1, requires_grad=True)
    y = (x * x).sum()
    with pytest.raises(RuntimeError, match="inputs\\[1\\] .* appears not to have been used in the graph"):
        autograd.grad(y, [x, unused], retain_graph=True)
    gx, gu = autograd.grad(y, [x, unused], allow_unused=True, retain_graph=True)
    assert gu is None
    numpy.testing.assert_allclose(gx.numpy(), 2 * x.numpy())
    with pytest.raises(NotImplementedError, match="create_graph=True \\(higher-order gradients\\) is not supported"):
        autograd.grad(y, x, create_graph=True)
    with pytest.raises(NotImplementedError, match="create_graph=True"):
        y.backward(create_graph=True)
    with pytest.raises(RuntimeError, match="does not require grad"):
        autograd.grad(y, randn(3))
    h = x * 3.0  # a computed tensor: its gradient is taken as it reaches its record
    (gh,) = autograd.grad((h * h).sum(), h)
    numpy.testing.assert_allclose(gh.numpy(), 2 * h.numpy())
    (g2,) = autograd.grad([(x * 2.0).sum(), (x * 3.0).sum()], x, grad_outputs=[Tensor(1.0), Tensor(2.0)])
    numpy.testing.assert_allclose(g2.numpy(), [8.0] * 3)
    h = x * 3.0
    (h * h).sum().backward(inputs=[h])  # as PyTorch: the computed tensor's .grad, and nothing else
    numpy.testing.assert_allclose(h.grad.numpy(), 2 * h.numpy())
    assert x.grad is None


# -- the hypothesis suite: structures, hooks and grad calls, checkpointed and not ----------
STRUCTURES = ["tensor", "tuple", "list", "dict", "nested"]


def pack_inputs(kind, a, b):
    return {"tensor": (a, b), "tuple": ((a, b),), "list": ([a, b],), "dict": ({"a": a, "b": b},),
            "nested": ({"p": [(a,), {"q": b}]},)}[kind]


def unpack_inputs(kind, args):
    if kind == "tensor":
        return args
    v = args[0]
    return {"tuple": lambda: v, "list": lambda: v, "dict": lambda: (v["a"], v["b"]),
            "nested": lambda: (v["p"][0][0], v["p"][1]["q"])}[kind]()


@settings(max_examples=12)
@given(inputs=st.sampled_from(STRUCTURES), output=st.sampled_from(["tensor", "tuple", "dict"]),
       hook=st.sampled_from([None, "inside", "replace", "leaf"]),
       call=st.sampled_from(["backward", "inputs", "grad", "outputs"]),
       early_stop=st.booleans(), policy=st.sampled_from([None, policies.save_matmuls]),
       closure=st.booleans(), seed=st.integers(0, 2**16))
def test_checkpointed_equals_plain_whatever_goes_in_and_out(inputs, output, hook, call, early_stop, policy, closure, seed):
    rng = numpy.random.default_rng(seed)
    layer = nn.Linear(3, 3, dtype=F64, rng=rng)
    a0, b0, c0 = (rng.standard_normal((2, 3)) for _ in range(3))
    results = []
    for ckpt in (False, True):
        log = []
        a, b, c = Tensor(a0, requires_grad=True), Tensor(b0, requires_grad=True), Tensor(c0, requires_grad=True)
        outside = c * 2.0  # computed outside, read from the closure if `closure`
        if hook == "leaf":
            layer.weight._hooks = None
            layer.weight.register_hook(lambda g: log.append(g.numpy().copy()))

        def f(*args):
            x, y = unpack_inputs(inputs, args)
            h = layer(x * y) + (outside if closure else 0.0)
            if hook in ("inside", "replace"):
                h.register_hook(lambda g: log.append(g.numpy().copy()) or (g * 0.5 if hook == "replace" else None))
            z = h.gelu()
            out = layer(z).tanh()
            return {"tensor": out, "tuple": (out, 1, z.argmax()), "dict": {"o": out, "s": "x", "z": z}}[output]

        args = pack_inputs(inputs, a, b)
        res = checkpoint(f, *args, early_stop=early_stop, policy=policy) if ckpt else f(*args)
        out = {"tensor": lambda: res, "tuple": lambda: res[0], "dict": lambda: res["o"] + res["z"]}[output]()
        loss = (out * out).sum()
        wrt = [a, b, c] + list(layer.parameters())
        layer.zero_grad()
        if call == "backward":
            loss.backward()
            got = grads(wrt)
        elif call == "inputs":
            loss.backward(inputs=[a, layer.weight])
            got = grads(wrt)
            assert b.grad is None and c.grad is None and layer.bias.grad is None
        elif call == "grad":
            got = [None if g is None else g.numpy() for g in autograd.grad(loss, wrt, allow_unused=True)]
            assert all(t.grad is None for t in wrt)
        else:  # the gradient of an output of the call: with "dict", z, on which the other output depends
            of = [res["z"], a] if output == "dict" else [out, a]
            got = [g.numpy() for g in autograd.grad(loss, of)]
        results.append((got, log))
    assert_same(results[1][0], results[0][0])
    assert_same(results[1][1], results[0][1])
    layer.weight._hooks = None


# -- Hugging Face's snippets, as pasted ---------------------------------------------------
def test_gradient_checkpointing_kwargs_use_reentrant_false_works_as_pasted():
    from tinygrad_ckpt.nn.mlp import MLP
    from tinygrad_ckpt.nn.transformer import GPT, GPTConfig

    gpt = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=8, dropout=0.0),
              rng=numpy.random.default_rng(0),
              dtype=F64)
    idx = numpy.random.default_rng(1).integers(0, 11, (2, 8))
    _, loss = gpt(idx, idx)
    loss.backward()
    plain = grads(list(gpt.parameters()))
    gpt.zero_grad()
    gpt.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert gpt.checkpoint_segments == "every" and gpt.checkpoint_options["determinism_check"] == "default"
    _, loss = gpt(idx, idx)
    loss.backward()
    assert_same(grads(list(gpt.parameters())), plain)
    gpt.gradient_checkpointing_enable({"use_reentrant": False, "segments": "sqrt", "split_blocks": True})
    assert gpt.checkpoint_split_blocks and gpt.checkpoint_segments == "sqrt"
    for model in (MLP(2, 2, 2, n_layers=2), nn.Sequential(nn.Linear(2, 2), nn.GELU())):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}, early_stop=False)
        assert model.checkpoint_options["early_stop"] is False
        with pytest.raises(ValueError, match="use_reentrant=True asks for PyTorch's reentrant checkpoint"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        assert model.checkpoint_options["early_stop"] is False  # a refused call changed nothing
        with pytest.raises(TypeError, match="unknown argument\\(s\\) context_fn"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"context_fn": None})


@pytest.mark.backends("numpy")
def test_training_arguments_take_use_reentrant_false_and_explain_true():
    from tinygrad_ckpt.train import TrainingArguments

    args = TrainingArguments(gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False})
    assert args.gradient_checkpointing_kwargs == {"use_reentrant": False}
    with pytest.raises(ValueError, match=r"gradient_checkpointing_kwargs\['use_reentrant'\]: use_reentrant=True asks "
                                         r"for PyTorch's reentrant checkpoint.*non-reentrant kind"):
        TrainingArguments(gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": True})
    with pytest.raises(ValueError, match=r"\['use_reentrant'\] must be false, got 'no'"):
        TrainingArguments(gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": "no"})


def test_checkpoint_sequential_takes_the_checkpoints_keywords():
    blocks = [nn.Sequential(nn.Linear(3, 3, dtype=F64, rng=numpy.random.default_rng(i)), nn.GELU()) for i in range(4)]
    x = randn(2, 3, requires_grad=True)
    results = []
    for options in ({}, dict(early_stop=False, determinism_check="values", debug=True, use_reentrant=False)):
        x.grad = None
        for b in blocks:
            b.zero_grad()
        checkpoint_sequential(blocks, 2, x, **options).sum().backward()
        results.append(grads([x] + [p for b in blocks for p in b.parameters()]))
    assert_same(results[1], results[0])
    with pytest.raises(TypeError, match="checkpoint_sequential: unknown keyword\\(s\\) context_fn"):
        checkpoint_sequential(blocks, 2, x, context_fn=None)
    with pytest.raises(ValueError, match="use_reentrant=True"):
        checkpoint_sequential(blocks, 2, x, use_reentrant=True)


def test_a_backward_inside_the_checkpointed_function_is_a_clear_error():
    """PyTorch's non-reentrant checkpoint allows it (its note "Nestable Checkpoint", Rule 6); one record per
    segment cannot: the segment's forward keeps no records."""

    def f(t):
        (g,) = autograd.grad((t * t).sum(), t)
        return g * t

    with pytest.raises(RuntimeError, match="backward inside a checkpointed function's forward"):
        checkpoint(f, randn(3, requires_grad=True))


def test_returning_a_parameter_or_a_tensor_from_outside_as_it_is():
    results = []
    for ckpt in (False, True):
        w, c = randn(3, seed=1, requires_grad=True), randn(3, seed=2, requires_grad=True)
        h = c * 2.0  # computed outside
        x = randn(3, seed=3)  # needs no gradient

        def f(t):
            return w, h, t * w  # a leaf and a computed tensor returned untouched, beside a result

        a, b, d = checkpoint(f, x) if ckpt else f(x)
        (a.sum() * 2.0 + (b * b).sum() + d.sum()).backward()
        results.append(grads([w, c]))
    assert_same(results[1], results[0])


# -- outputs that depend on each other, and the hooks' stack --------------------------------
@pytest.mark.parametrize("early_stop", [True, False])
@pytest.mark.parametrize("call", ["grad", "backward"])
def test_outputs_of_one_checkpointed_call_keep_their_dependence_on_each_other(early_stop, call):
    # y, z = checkpoint(fn, x) with z = 3 y: the gradient of z with respect to y is 3, as without
    # the checkpoint (and as with PyTorch's non-reentrant one, whose graph is the real one).
    def fn(x):
        y = x.exp()
        return y, y * 3

    results = []
    for ckpt in (False, True):
        x = randn(4, requires_grad=True)
        y, z = checkpoint(fn, x, early_stop=early_stop) if ckpt else fn(x)
        if call == "grad":
            got = [g.numpy() for g in autograd.grad((z * z).sum() + y.sum(), [y, x])]
        else:
            ((z * z).sum() + y.sum()).backward(inputs=[y])
            got = [y.grad.numpy()]
            assert x.grad is None
        results.append(got)
    assert_same(results[1], results[0])
    numpy.testing.assert_allclose(results[1][0], 1 + 18 * numpy.exp(randn(4).numpy()), rtol=1e-12)


def test_saved_tensors_hooks_stay_balanced():
    from tinygrad_ckpt import function

    before = list(function._saved_hooks)
    hooks = saved_tensors_hooks(lambda t: t, lambda t: t)
    with hooks:
        pass
    with pytest.raises(RuntimeError, match="exited more times than it was entered"):
        hooks.__exit__(None, None, None)
    assert function._saved_hooks == before
    # A block entered inside a pack or an unpack hook and never left: it packs nothing after the hook.
    stray = saved_tensors_hooks(lambda t: 1 / 0, lambda t: t)
    x = randn(3, requires_grad=True)
    for where in ("pack", "unpack"):
        def enter_stray(t):
            stray.__enter__()
            return t

        pack, unpack = (enter_stray, lambda t: t) if where == "pack" else (lambda t: t, enter_stray)
        with saved_tensors_hooks(pack, unpack):
            loss = (x * x).sum()
        loss.backward()
        assert function._saved_hooks == before, where
        (x * x).sum().backward()  # the stray pack hook would divide by zero
    # The same object entered twice, nested, exits twice.
    with hooks:
        with hooks:
            assert len(function._saved_hooks) == len(before) + 2
    assert function._saved_hooks == before


def test_checkpoint_sequential_takes_extra_arguments_by_keyword_only():
    x = randn(3, requires_grad=True)
    with pytest.raises(TypeError, match=r"checkpoint_sequential takes 3 positional arguments \(functions, segments, "
                                        r"input\), got 4.*use_reentrant=None, policy=None"):
        checkpoint_sequential([lambda t: t * 2], 1, x, x)
    with pytest.raises(TypeError, match=r"use_reentrant must be False \(or None\), got Tensor"):
        checkpoint_sequential([lambda t: t * 2], 1, x, use_reentrant=x)
    with pytest.raises(TypeError, match=r"determinism_check must be one of .*got int"):
        checkpoint(lambda t: t * 2, x, determinism_check=1)
    with pytest.raises(TypeError, match=r"functions must be a list of callables .*got function"):
        checkpoint_sequential(lambda t: t * 2, 1, x)
    with pytest.raises(TypeError, match=r"functions\[1\] is a int, not a callable"):
        checkpoint_sequential([lambda t: t * 2, 3], 1, x)


@pytest.mark.parametrize("early_stop", [True, False])
def test_grad_for_some_inputs_runs_only_the_records_inside_a_segment_that_reach_them(early_stop):
    from tinygrad_ckpt.function import Function

    calls = []

    class Counted(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, g):
            calls.append(1)
            return g

    x, w = randn(3, requires_grad=True), randn(3, seed=1, requires_grad=True)
    y = checkpoint(lambda t: (Counted.apply(t) * w).exp(), x, early_stop=early_stop)
    (gw,) = autograd.grad(y.sum(), [w], retain_graph=True)
    assert calls == []  # the Counted on x's path cannot reach w
    numpy.testing.assert_allclose(gw.numpy(), x.numpy() * numpy.exp(x.numpy() * w.numpy()), rtol=RTOL)
    (gx,) = autograd.grad(y.sum(), [x])
    assert calls == [1]
    numpy.testing.assert_allclose(gx.numpy(), w.numpy() * numpy.exp(x.numpy() * w.numpy()), rtol=RTOL)


@pytest.mark.parametrize("early_stop", [True, False])
def test_a_segment_may_take_inputs_and_parameters_of_other_dtypes(early_stop):
    # The record is no arithmetic: its inputs are whatever the code reads, token ids and float
    # parameters, a float32 input and float64 weights (PyTorch's checkpoint takes them too).
    emb = nn.Embedding(10, 4, rng=numpy.random.default_rng(0), dtype=F64)
    idx = Tensor(numpy.array([[1, 2, 3], [3, 2, 9]]))
    x32 = Tensor(numpy.linspace(-1, 1, 4).astype(numpy.float32), requires_grad=True)

    def segment(i, x):
        return F.embedding(i, emb.weight).tanh() * x.to(F64)

    results = []
    for ckpt in (False, True):
        emb.zero_grad()
        x32.grad = None
        out = checkpoint(segment, idx, x32, early_stop=early_stop) if ckpt else segment(idx, x32)
        (out * out).sum().backward()
        results.append([emb.weight.grad.numpy().copy(), x32.grad.numpy().copy()])
    assert results[1][1].dtype == numpy.float32  # each input's gradient in its own dtype
    assert_same(results[1], results[0])


@pytest.mark.parametrize("early_stop", [True, False])
def test_a_tensor_returned_as_it_is_is_that_tensor_and_keeps_every_path(early_stop):
    # y, z = checkpoint(lambda x, w: (x, f(x, w), w), ...): y is x itself and the third output w itself,
    # as without the checkpoint, so the gradient with respect to y has z's path too.
    def fn(x, w):
        return x, (x * w).tanh(), w

    results = []
    for ckpt in (False, True):
        x, w = randn(4, requires_grad=True), randn(4, seed=1, requires_grad=True)
        y, z, v = checkpoint(fn, x, w, early_stop=early_stop) if ckpt else fn(x, w)
        assert y is x and v is w
        results.append([g.numpy() for g in autograd.grad((z * z).sum() + (y * 2.0).sum(), [y, x, v])])
    assert_same(results[1], results[0])
