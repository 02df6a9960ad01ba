"""The equivalence checks (testing/equivalence.py): they pass on every strategy, catch planted bugs, and touch nothing.

The property tests here are proofs too (marked `equivalence`): every op
under checkpoint with any policy, any GPT with any plan, the planner's plans
at any budget, accumulation of any GPT over any split, each with the
tolerances the checks state (float64: rtol 1e-10 relative to a tensor's
largest value). The others check the checks: that a strategy which forgets
the dropout state, a mean of means, a second BatchNorm update are caught,
that the report and the error name the worst tensors, and that the caller's
gradients, switch, buffers and generators are left as they were.

Run on NumPy and on the strict CuPy stand-in (conftest.py), so models and
inputs are made on the default device.
"""

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, backend, nn, random
from tinygrad_ckpt.accumulate import GradientAccumulator
from tinygrad_ckpt.checkpoint import checkpoint
from tinygrad_ckpt.nn import GPT, MLP, GPTConfig
from tinygrad_ckpt.schedules import measure_layers, minimum_budget, plan_checkpoints, predict
from tinygrad_ckpt.testing import EquivalenceError, check_accumulation, check_checkpoint
from tinygrad_ckpt.testing import strategies as tst

from .conftest import examples


def gpt_loss(model, batch):
    """The summed cross-entropy of a batch's counted tokens."""
    logits, _ = model(batch["input_ids"])
    return F.cross_entropy(logits, backend.to_device(batch["labels"], logits.device), reduction="sum")


def small_gpt(dropout=0.0, n_layer=2, dtype=numpy.float64, seed=0):
    config = GPTConfig(block_size=8, vocab_size=11, n_layer=n_layer, n_head=2, n_embd=8, dropout=dropout)
    return GPT(config, rng=numpy.random.default_rng(seed), dtype=dtype)


def token_batch(n=4, T=8, seed=1):
    rng = numpy.random.default_rng(seed)
    labels = rng.integers(0, 11, (n, T))
    labels[0, 2:] = -100  # uneven token counts: a mean of means would show
    return {"input_ids": rng.integers(0, 11, (n, T)), "labels": labels}


def tensor(*shape, seed=0, requires_grad=True):
    return Tensor(numpy.random.default_rng(seed).standard_normal(shape), requires_grad=requires_grad)


# -- the proofs ------------------------------------------------------------------------
OPS = {  # op name -> (function of the inputs, number of inputs)
    "add": (lambda a, b: a + b, 2), "mul": (lambda a, b: a * b, 2), "div": (lambda a, b: a / (b * b + 1.0), 2),
    "matmul": (lambda a, b: a @ b.T, 2), "linear": (lambda a, b: F.linear(a, b), 2),
    "exp": (lambda a: a.exp(), 1), "tanh": (lambda a: a.tanh(), 1), "gelu": (lambda a: a.gelu(), 1),
    "sigmoid": (lambda a: a.sigmoid(), 1), "relu": (lambda a: a.relu(), 1), "pow": (lambda a: a ** 3, 1),
    "softmax": (lambda a: a.softmax(axis=-1), 1), "log_softmax": (lambda a: a.log_softmax(axis=-1), 1),
    "sum": (lambda a: a.sum(axis=0), 1), "mean": (lambda a: a.mean(axis=-1), 1), "max": (lambda a: a.max(axis=-1), 1),
    "reshape": (lambda a: a.reshape(-1), 1), "transpose": (lambda a: a.T, 1), "getitem": (lambda a: a[1:, ::2], 1),
    "layer_norm": (lambda a: F.layer_norm(a, (a.shape[-1],)), 1), "dropout": (lambda a: F.dropout(a, 0.5), 1),
    "two outputs": (lambda a, b: (a.tanh() * b, (a - b).exp()), 2),
}


@pytest.mark.equivalence
@settings(max_examples=examples(40))
@given(op=st.sampled_from(sorted(OPS)), rows=st.integers(2, 4), cols=st.integers(2, 4),
       policy=tst.policies(), seed=st.integers(0, 2**16))
def test_every_op_under_checkpoint_with_any_policy_gives_the_plain_gradients(op, rows, cols, policy, seed):
    fn, arity = OPS[op]
    inputs = [tensor(rows, cols, seed=seed + i) for i in range(arity)]
    check_checkpoint(fn, inputs, policy=policy, raise_exception=True)


@pytest.mark.equivalence
@given(config=tst.gpt_configs(), data=st.data(), policy=tst.policies(), split=st.booleans(),
       seed=st.integers(0, 2**16))
def test_any_gpt_under_any_plan_and_policy_gives_the_plain_gradients(config, data, policy, split, seed):
    model = GPT(config, rng=numpy.random.default_rng(seed), dtype=numpy.float64)
    plan = data.draw(tst.segment_plans(config.n_layer * (2 if split else 1)), label="plan")
    input_ids, labels = data.draw(tst.padded_batches(config.vocab_size, config.block_size, max_examples=3),
                                  label="batch")
    check_checkpoint(model, (input_ids, labels), strategy=plan, policy=policy, split_blocks=split,
                     raise_exception=True)


@pytest.mark.equivalence
@given(chain=tst.chains(max_depth=8), fraction=st.floats(0.0, 1.0), nested=st.booleans())
def test_the_planners_plan_at_any_budget_gives_the_plain_gradients(chain, fraction, nested):
    model, x = chain.build()
    costs = measure_layers(list(model), x, repeats=1, cost="flops")
    least = minimum_budget(costs, nested)
    budget = int(least + fraction * (predict(costs, [(0, len(costs), False)])[0] - least))
    plan = plan_checkpoints(costs, max(budget, least), nested)
    check_checkpoint(model, x, strategy=plan, raise_exception=True)


@pytest.mark.equivalence
@given(config=tst.gpt_configs(dropout=(0.0,)), data=st.data(), short_group=st.booleans(),
       checkpointing=st.booleans())
def test_any_gpt_accumulated_over_any_split_gives_the_whole_batch_gradient(config, data, short_group, checkpointing):
    model = GPT(config, rng=numpy.random.default_rng(0), dtype=numpy.float64)
    if checkpointing:
        model.gradient_checkpointing_enable()
    input_ids, labels = data.draw(tst.padded_batches(config.vocab_size, config.block_size, max_examples=6),
                                  label="batch")
    sizes = data.draw(tst.micro_batch_splits(len(input_ids)), label="micro-batch sizes")
    steps = len(sizes) + 1 if short_group else None  # a short last group: fewer micro-batches than steps
    check_accumulation(model, gpt_loss, {"input_ids": input_ids, "labels": labels}, sizes,
                       gradient_accumulation_steps=steps, raise_exception=True)


# -- what a report says -------------------------------------------------------------------------
def test_a_passing_report_is_true_and_says_what_it_compared():
    model, x = tst.Chain(depth=3, width=4, batch=2, p_drop=0.3).build()
    report = check_checkpoint(model, x, strategy="sqrt")
    assert report and report.passed and not report.failures
    names = [e.name for e in report.entries]
    assert names[0] == "output" and "input 0" in names and "0.0.weight" in names and "2.0.bias" in names
    assert len(report.entries) == 1 + 1 + 3 * 2  # the output, the input, three Linear layers' weight and bias
    assert report.max_abs() == 0.0  # a recompute runs the same ops on the same arrays
    text = str(report)
    assert text.startswith("PASS: Sequential.gradient_checkpointing_enable('sqrt');")
    assert "| tensor | shape | dtype | max abs diff |" in text and "0.0.weight" in text
    assert repr(report).startswith("<EquivalenceReport PASS")


def forgetful(fn, *inputs):
    """A planted bug: a checkpoint whose recompute draws new dropout masks."""
    return checkpoint(fn, *inputs, preserve_rng_state=False)


def test_a_recompute_that_forgets_the_dropout_state_fails_and_names_the_worst_parameters():
    model, x = tst.Chain(depth=2, width=6, batch=4, p_drop=0.5).build()
    report = check_checkpoint(model, x, strategy=forgetful)
    assert not report and report.failures
    assert report.title == "forgetful(fn, *inputs) against fn(*inputs)"
    assert any("ends in another state" in p for p in report.problems)  # it drew masks twice
    worst = report.failures[0]
    assert worst is report.worst and worst.excess > 1 and worst.max_abs > 1e-3
    with pytest.raises(EquivalenceError, match=rf"forgetful.*differs from the plain run\n.*\n  {worst.name}: "
                                               r"max \|difference\| [0-9.e-]+ \(relative"):
        check_checkpoint(model, x, strategy=forgetful, raise_exception=True)
    assert issubclass(EquivalenceError, AssertionError)


class MeanOfMeans(GradientAccumulator):
    """A planted bug: each micro-batch's gradient divided by its own items, then the mean of those."""

    def accumulate(self, num_items, end_of_data=False):
        for p in self.parameters:
            if p.grad is not None:
                p.grad = Tensor(p.grad.data / max(num_items, 1), device=p.device)
        return super().accumulate(1, end_of_data)


def test_a_mean_of_means_fails_when_micro_batches_count_other_token_numbers():
    model, batch = small_gpt(), token_batch()
    report = check_accumulation(model, gpt_loss, batch, [1, 3], accumulator=MeanOfMeans)
    assert not report and report.max_rel() > 1e-2
    assert "MeanOfMeans" in report.title and report.entries[0].name == "loss" and report.entries[0].passed
    assert not report.notes  # the losses add up: it is the accumulator that is wrong
    same_counts = {k: v[1:] for k, v in batch.items()}  # three full sequences: equal counts, equal means
    assert check_accumulation(model, gpt_loss, same_counts, 3, accumulator=MeanOfMeans)


def test_a_mean_loss_instead_of_a_sum_is_caught_and_the_report_says_why():
    def mean_loss(model, batch):
        logits, _ = model(batch["input_ids"])
        return F.cross_entropy(logits, backend.to_device(batch["labels"], logits.device))

    report = check_accumulation(small_gpt(), mean_loss, token_batch(), 2)
    assert not report and not report.entries[0].passed and "reduction='sum'" in str(report)


def test_a_second_batchnorm_update_is_caught_in_the_buffers():
    model = nn.Sequential(nn.Linear(3, 4, dtype=numpy.float64, rng=numpy.random.default_rng(0)),
                          nn.BatchNorm1d(4, dtype=numpy.float64), nn.Tanh())
    x = tensor(6, 3)

    def twice(fn, x):  # runs the forward twice: the same output, the statistics updated twice
        fn(x)
        return fn(x)

    report = check_checkpoint(model, x, strategy=twice)
    assert sorted(e.name for e in report.failures) == [
        "buffer 1.num_batches_tracked", "buffer 1.running_mean", "buffer 1.running_var"]  # counted twice too
    assert check_checkpoint(model, x)  # the real checkpoint updates them once


def test_dropout_in_an_accumulation_check_is_noted():
    report = check_accumulation(small_gpt(dropout=0.3), gpt_loss, token_batch(), 2)
    assert any("dropout" in n for n in report.notes)
    assert not any("dropout" in n for n in check_accumulation(small_gpt(), gpt_loss, token_batch(), 2).notes)


def test_float32_is_checked_at_float32_tolerance():
    model = MLP(6, 8, 3, n_layers=4, rng=numpy.random.default_rng(0))  # float32
    x = Tensor(numpy.random.default_rng(1).standard_normal((4, 6)).astype(numpy.float32), requires_grad=True)
    report = check_checkpoint(model, x, strategy=2, policy="save_matmuls")
    assert report and all(e.dtype == "float32" for e in report.entries)
    assert all(e.tolerance == pytest.approx(1e-6 + 1e-5 * e.scale) for e in report.entries)
    assert not check_checkpoint(model, x, strategy=forgetful, rtol=0, atol=0) or report.max_abs() == 0


def test_a_raw_tensor_model_and_tuple_batches():
    w = tensor(3, 2, seed=3)
    data = numpy.random.default_rng(4)
    batch = (data.standard_normal((5, 3)), data.standard_normal((5, 2)))

    def loss(params, batch):
        (w,), (x, y) = params, batch
        return ((Tensor(x, dtype=numpy.float64) @ w - Tensor(y, dtype=numpy.float64)) ** 2).sum()

    report = check_accumulation([w], loss, batch, [2, 2, 1])
    assert report and [e.name for e in report.entries] == ["loss", "parameter 0 (3, 2)"]


# -- they leave things as they found them ------------------------------------------------------
def test_gradients_switch_buffers_and_generators_are_left_as_they_were():
    model = small_gpt(dropout=0.2)
    batch = token_batch()
    model.gradient_checkpointing_enable("sqrt", policy="save_matmuls")
    before = [numpy.full(p.shape, 7.0) for p in model.parameters()]
    for p, g in zip(model.parameters(), before):
        p.grad = Tensor(g)
    generator = model.drop.rng.bit_generator.state
    default = random.default_generator.bit_generator.state
    assert check_checkpoint(model, (batch["input_ids"], batch["labels"]), strategy="every", split_blocks=True)
    assert check_accumulation(small_gpt(), gpt_loss, batch, 2)
    assert (model.checkpoint_segments, model.checkpoint_policy.names) == ("sqrt", frozenset({"MatMul", "Linear"}))
    assert not model.checkpoint_split_blocks
    assert all(numpy.array_equal(p.grad.numpy(), g) for p, g in zip(model.parameters(), before))
    assert model.drop.rng.bit_generator.state == generator
    assert random.default_generator.bit_generator.state == default


def test_buffers_are_put_back():
    model = nn.Sequential(nn.Linear(3, 4, dtype=numpy.float64, rng=numpy.random.default_rng(0)),
                          nn.BatchNorm1d(4, dtype=numpy.float64))
    before = model[1].running_mean.numpy().copy()
    assert check_checkpoint(model, tensor(5, 3))
    assert numpy.array_equal(model[1].running_mean.numpy(), before)


# -- bad arguments ----------------------------------------------------------------------------
def test_bad_arguments_are_clear_errors_before_anything_runs():
    model, x = tst.Chain(depth=3, width=2).build()
    with pytest.raises(ValueError, match=r"segments must be between 1 and the number of layers \(3\), got 5"):
        check_checkpoint(model, x, strategy=5)
    assert model.checkpoint_segments is None  # the refused strategy changed nothing
    with pytest.raises(ValueError, match=r"strategy='sqrt' chooses the segments of a model with "
                                         r"gradient_checkpointing_enable, which function has not"):
        check_checkpoint(lambda t: t.tanh(), x, strategy="sqrt")
    with pytest.raises(ValueError, match="a strategy function applies its own"):
        check_checkpoint(model, x, strategy=forgetful, policy="save_matmuls")
    with pytest.raises(ValueError, match="unknown checkpoint policy 'fast'"):
        check_checkpoint(lambda t: t.tanh(), x, policy="fast")
    with pytest.raises(ValueError, match="input 0 requires grad but is computed by an op"):
        check_checkpoint(model, x * 2.0)
    with pytest.raises(ValueError, match="no gradient to compare"):
        check_checkpoint(lambda t: t.tanh(), tensor(2, 2, requires_grad=False))
    batch = token_batch()
    with pytest.raises(ValueError, match=r"splits \[2, 1\] must be micro-batch sizes of at least 1 that add up to "
                                         r"the batch's 4 examples"):
        check_accumulation(small_gpt(), gpt_loss, batch, [2, 1])
    with pytest.raises(ValueError, match=r"splits=5 micro-batches of a batch of 4: use 1 to 4"):
        check_accumulation(small_gpt(), gpt_loss, batch, 5)
    with pytest.raises(TypeError, match="splits must be a number of micro-batches or a list"):
        check_accumulation(small_gpt(), gpt_loss, batch, 2.0)
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=1 must be an int of at least the number of "
                                         r"micro-batches \(2\)"):
        check_accumulation(small_gpt(), gpt_loss, batch, 2, gradient_accumulation_steps=1)
    with pytest.raises(ValueError, match="the batch counts no items"):
        check_accumulation(small_gpt(), gpt_loss, {**batch, "labels": numpy.full((4, 8), -100)}, 2)
    with pytest.raises(ValueError, match=r"different lengths \[3, 4\]"):
        check_accumulation(small_gpt(), gpt_loss, {**batch, "labels": batch["labels"][:3]}, 2)


# -- every refinement gives the plain path's gradients, bit for bit -------------------------
@pytest.mark.equivalence
@settings(max_examples=examples(20))
@given(ops=st.lists(st.sampled_from(sorted(OPS)), min_size=1, max_size=4), policy=tst.policies(),
       nested=st.booleans(), dropout=st.booleans(), seed=st.integers(0, 2**16))
def test_every_refinement_gives_the_plain_paths_gradients_bit_for_bit(ops, policy, nested, dropout, seed):
    """Early stop, rebuilt and skipped records, a policy's kept ops (the planned path, recompute.py): the
    same gradients as the plain path (early_stop=False, no policy: run again on a fresh tape), to the bit."""
    w0 = numpy.random.default_rng(seed).standard_normal((3, 3))

    def chain(x, w):
        for name in ops:
            fn, arity = OPS[name]
            x = fn(x, w) if arity == 2 else fn(x)
            x = x[0] + x[1] if isinstance(x, tuple) else x
            n = int(numpy.prod(x.shape))  # back to (3, 3), whatever the op made
            x = x.reshape(-1)[:9].reshape(3, 3) if n >= 9 else x.reshape(-1)[:1] * w
        return (F.dropout(x, 0.5) if dropout else x) * w

    def run(**options):
        random.manual_seed(seed)
        x, w = tensor(3, 3, seed=seed), Tensor(w0.copy(), requires_grad=True)
        inner = (lambda t: checkpoint(chain, t, w, **options)) if nested else (lambda t: chain(t, w))
        out = checkpoint(lambda t: inner(t) * 2.0, x, **options)
        (out * out).sum().backward()
        return [x.grad.numpy(), w.grad.numpy()]

    plain = run(early_stop=False)
    for options in (dict(), dict(policy=policy), dict(early_stop=False, policy=policy)):
        for got, want in zip(run(**options), plain):
            numpy.testing.assert_array_equal(got, want, err_msg=str(options))
