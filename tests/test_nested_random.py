"""Checkpoints inside checkpoints, with random ops before, inside and after the inner segment.

A segment's forward watches which generators it draws from (random.observing)
so that its recompute can put them back where it found them. Segments nest,
so observers nest; these tests draw nestings with dropout anywhere and
check that the gradients are the plain run's bit for bit, that every
generator ends where the plain run leaves it, and that the equivalence
checker answers (instead of crashing) when a strategy draws random numbers.
"""

import numpy
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tinygrad_ckpt import Tensor, autograd, random
from tinygrad_ckpt import functional as F
from tinygrad_ckpt.checkpoint import checkpoint
from tinygrad_ckpt.testing import check_checkpoint

from .conftest import examples

WIDTH, BATCH, P = 4, 3, 0.5


def make_generator(kind, seed):
    """None (the package's default generator, seeded), or a generator of its own of that kind."""
    if kind == "default":
        random.manual_seed(seed)
        return None
    if kind == "mt19937":  # its state holds an array (the key): compared as an array, never with ==
        return numpy.random.Generator(numpy.random.MT19937(seed))
    return numpy.random.default_rng(seed)


def the_generator(rng):
    return random.default_generator if rng is None else rng


def nested(levels, weights, rng, checkpointed, early_stop, policy=None):
    """The segment of `levels[0]`: dropout before, a layer, the next level's segment (checkpointed), dropout after.

    levels: one (before, after) pair of booleans per level, outermost first;
    the innermost segment draws inside itself when its own pair says so.
    """
    (before, after), rest = levels[0], levels[1:]
    w = weights[len(weights) - len(levels)]

    def segment(h):
        if before:
            h = F.dropout(h, P, rng=rng)
        h = (h @ w).tanh()
        if rest:
            inner = nested(rest, weights, rng, checkpointed, early_stop, policy)
            h = checkpoint(inner, h, early_stop=early_stop, policy=policy) if checkpointed else inner(h)
        if after:
            h = F.dropout(h, P, rng=rng)
        return h

    return segment


def run(levels, kind, seed, checkpointed, early_stop, call, policy=None):
    """One forward and backward; (output, gradients of x and each weight, the generator's end state)."""
    rng = make_generator(kind, seed)
    data = numpy.random.default_rng(seed + 1)
    weights = [Tensor(data.standard_normal((WIDTH, WIDTH)), requires_grad=True) for _ in levels]
    x = Tensor(data.standard_normal((BATCH, WIDTH)), requires_grad=True)
    top = nested(levels, weights, rng, checkpointed, early_stop, policy)
    out = checkpoint(top, x, early_stop=early_stop, policy=policy) if checkpointed else top(x)
    loss = (out * out).sum()
    if call == "grad":
        grads = [g.numpy() for g in autograd.grad(loss, [x, *weights])]
    else:
        loss.backward()
        grads = [t.grad.numpy() for t in [x, *weights]]
    return out.numpy(), grads, the_generator(rng).bit_generator.state


levels = st.lists(st.tuples(st.booleans(), st.booleans()), min_size=2, max_size=4)


@settings(max_examples=examples(20))
@given(levels=levels, kind=st.sampled_from(["default", "pcg64", "mt19937"]), seed=st.integers(0, 2**16),
       early_stop=st.booleans(), call=st.sampled_from(["backward", "grad"]),
       policy=st.sampled_from([None, "save_matmuls", "everything_saveable", "offload_matmuls"]))
# The case: nothing drawn before the inner segment, a draw after it (crashed in forward).
@example(levels=[(False, True), (False, False)], kind="default", seed=0, early_stop=True, call="backward", policy=None)
# Draws only inside the inner segment: the outer and inner observers see the same (generator, state).
@example(levels=[(False, False), (True, False)], kind="mt19937", seed=1, early_stop=False, call="backward",
         policy=None)
def test_nested_segments_with_dropout_give_the_plain_gradients_bit_for_bit(levels, kind, seed, early_stop, call,
                                                                          policy):
    """policy: every segment's (policies.py): what it keeps is replayed, not run, in the recompute."""
    plain_out, plain_grads, plain_end = run(levels, kind, seed, False, early_stop, call)
    out, grads, end = run(levels, kind, seed, True, early_stop, call, policy)
    numpy.testing.assert_array_equal(out, plain_out)
    for got, want in zip(grads, plain_grads):
        numpy.testing.assert_array_equal(got, want)
    assert random.same_state(end, plain_end), "the generator ends elsewhere than after the plain run"
    assert not random._observers, "a segment's observer outlived its forward"


def test_an_inner_segment_drawing_nothing_then_a_draw_after_it():
    """The issue's traceback: list.remove took the outer segment's (equal, empty) list at the inner's exit."""
    x = Tensor(numpy.ones((2, 3)), requires_grad=True)

    def outer(h):
        h = checkpoint(lambda g: g.tanh(), h)
        return F.dropout(h, P)

    random.manual_seed(3)
    checkpoint(outer, x).sum().backward()
    got = x.grad.numpy()
    random.manual_seed(3)
    x.grad = None
    outer_plain = F.dropout(x.tanh(), P)
    outer_plain.sum().backward()
    numpy.testing.assert_array_equal(got, x.grad.numpy())


def test_observers_are_told_apart_by_identity_not_equality():
    rng = numpy.random.default_rng(0)
    with random.observing() as outer:
        with random.observing() as inner:
            random.generator(rng)
        assert inner == outer and inner is not outer  # equal lists, two observers
        random.generator(numpy.random.default_rng(1))  # drawn after the inner: the outer alone sees it
        assert len(outer) == 2 and len(inner) == 1
    assert not random._observers


@pytest.mark.parametrize("make", [numpy.random.default_rng, lambda s: numpy.random.Generator(numpy.random.MT19937(s))])
def test_same_state(make):
    a, b = make(5), make(5)
    assert random.same_state(a.bit_generator.state, b.bit_generator.state)
    b.random()
    assert not random.same_state(a.bit_generator.state, b.bit_generator.state)


# -- the equivalence checker answers when a strategy draws ---------------------------------------
def tanh2(h):
    return h.tanh() * 2


def x_in():
    return Tensor(numpy.random.default_rng(0).standard_normal((BATCH, WIDTH)), requires_grad=True)


@settings(max_examples=examples(6))
@given(seed=st.integers(0, 2**16), kind=st.sampled_from(["default", "pcg64", "mt19937"]))
def test_check_checkpoint_answers_for_a_strategy_that_draws_after_its_checkpoint(seed, kind):
    rng = make_generator(kind, seed)
    report = check_checkpoint(lambda h: F.dropout(tanh2(h), P, rng=rng), x_in(),
                              strategy=lambda fn, h: F.dropout(checkpoint(tanh2, h), P, rng=rng))
    assert report.passed, report


def test_check_checkpoint_answers_for_a_segment_drawing_from_an_mt19937_generator():
    mt = numpy.random.Generator(numpy.random.MT19937(3))
    report = check_checkpoint(lambda h: F.dropout(h.tanh(), P, rng=mt), x_in())
    assert report.passed, report


def test_check_checkpoint_reports_a_strategy_that_draws_more():
    """A strategy drawing an extra mask is answered with a failure that says so, not an exception."""
    mt = numpy.random.Generator(numpy.random.MT19937(4))

    def extra(fn, h):
        F.dropout(h, P, rng=mt)  # thrown away, but drawn
        return checkpoint(fn, h)

    report = check_checkpoint(lambda h: F.dropout(h.tanh(), P, rng=mt), x_in(), strategy=extra)
    assert not report.passed
    assert any("another state" in p for p in report.problems), report
