"""Schedules: segment bounds, the cost model against measurements, the planner against brute force."""

import itertools
import math

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygrad_ckpt import Tensor, memory
from tinygrad_ckpt import functional as F
from tinygrad_ckpt.checkpoint import checkpoint_sequential
from tinygrad_ckpt.nn.mlp import MLP
from tinygrad_ckpt.nn.module import Parameter
from tinygrad_ckpt.nn.transformer import GPT, GPTConfig
from tinygrad_ckpt.schedules import (
    LayerCost, Plan, describe, measure_layers, minimum_budget, plan_checkpoints, predict, revolve,
    revolve_recomputations, segment_bounds,
)
from tinygrad_ckpt.testing.strategies import layer_costs

from .conftest import examples

# The cost model counts the same buffers memory.py does, a layer's output
# that it saves itself and the next layer saves again included
# (LayerCost.shared_output_bytes), so prediction and measurement agree to the byte.


# -- fixed schedules -----------------------------------------------------------------
def test_segment_bounds():
    assert segment_bounds(7, 3) == [(0, 3, True), (3, 5, True), (5, 7, True)]
    assert segment_bounds(64, "sqrt") == [(8 * i, 8 * i + 8, True) for i in range(8)]
    assert segment_bounds(3, "every") == [(0, 1, True), (1, 2, True), (2, 3, True)]
    assert segment_bounds(5, [2, 4]) == [(0, 2, True), (2, 4, True), (4, 5, True)]
    assert segment_bounds(5, [0, 2, 5]) == [(0, 2, True), (2, 5, True)]
    plan = Plan([(0, 2, False), (2, 5, True)], 0, 0.0)
    assert segment_bounds(5, plan) == plan.segments and plan.boundaries == [0, 2, 5]
    with pytest.raises(ValueError, match=r"segments .* do not cover layers 0..6"):
        segment_bounds(6, plan)


# -- the cost model against memory.py ------------------------------------------------
def peak_activations(step):
    with memory.timeline() as events:
        step()
    return max(e["activations"] for e in events)


def mlp_chain(depth, width, batch, dtype=numpy.float32, input_grad=False):
    model = MLP(width, width, width, n_layers=depth, rng=numpy.random.default_rng(0), dtype=dtype)
    rng = numpy.random.default_rng(1)
    x = Tensor(rng.standard_normal((batch, width)).astype(dtype), requires_grad=input_grad)
    target = Tensor(rng.standard_normal((batch, width)).astype(dtype))
    layers = list(model.blocks) + [model.head, lambda y: F.mse_loss(y, target)]
    return model, layers, x


@settings(max_examples=examples(6))
@given(depth=st.integers(2, 24), width=st.sampled_from([4, 16]), batch=st.integers(1, 4),
       how=st.sampled_from(["sqrt", "every", 3, "plan50", "plan25"]))
def test_measured_peak_is_the_predicted_one(depth, width, batch, how):
    model, layers, x = mlp_chain(depth, width, batch)
    costs = measure_layers(layers, x, repeats=1)
    full = predict(costs, [(0, len(layers), False)])[0]
    if isinstance(how, str) and how.startswith("plan"):
        budget = max(int(full * int(how[4:]) / 100), minimum_budget(costs))
        segments = plan_checkpoints(costs, budget)
        assert segments.peak_bytes <= budget
    else:
        segments = segment_bounds(len(layers), how)
    predicted = predict(costs, segments)[0]

    def step():
        model.zero_grad()
        checkpoint_sequential(layers, segments, x).backward()

    base = memory.current()["activations"]
    measured = peak_activations(step) - base
    assert measured == predicted


@settings(max_examples=examples(8))
@given(depth=st.integers(2, 12), batch=st.integers(1, 3), how=st.sampled_from(["sqrt", "every", 2, "plan", "nested"]))
def test_a_layer_saving_the_output_the_next_one_saves_is_counted_once_and_twice_in_a_recompute(depth, batch, how):
    """tanh saves its output, the next layer's Mul saves its input: one buffer where both are the forward's,
    two where a recompute makes a fresh copy; the prediction follows both, to the byte."""
    weights = [Parameter(numpy.full((4,), 0.1 * (i + 1))) for i in range(depth)]
    layers = [lambda y, w=w: (y * w).tanh() for w in weights]
    x = Tensor(numpy.linspace(-1, 1, 4 * batch).reshape(batch, 4), requires_grad=True)
    costs = measure_layers(layers, x, repeats=1)
    assert [c.shared_output_bytes for c in costs] == [x.data.nbytes] * (depth - 1) + [0]
    if how in ("plan", "nested"):
        plain = predict(costs, [(0, depth, False)])[0]
        segments = plan_checkpoints(costs, (plain + minimum_budget(costs, how == "nested")) // 2, how == "nested")
    else:
        segments = segment_bounds(depth, how)
    base = memory.current()["activations"]
    measured = peak_activations(lambda: checkpoint_sequential(layers, segments, x).sum().backward()) - base
    assert measured == predict(costs, segments)[0], describe(segment_bounds(depth, segments))


def test_64_layer_mlp_sqrt_peak_is_at_most_30_percent_and_as_predicted():
    model, layers, x = mlp_chain(64, 32, 8)
    costs = measure_layers(layers, x, repeats=1)
    full, _ = predict(costs, [(0, len(layers), False)])
    sqrt, _ = predict(costs, "sqrt")
    assert sqrt <= 0.30 * full
    step = lambda: checkpoint_sequential(layers, "sqrt", x).backward()  # noqa: E731
    base = memory.current()["activations"]
    assert peak_activations(step) - base == sqrt


# -- the planner ---------------------------------------------------------------------
def all_plans(n):
    """Every way to cut n layers into segments, each stored or checkpointed."""
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
        pairs = list(zip(bounds, bounds[1:]))
        for flags in itertools.product([False, True], repeat=len(pairs)):
            yield [(a, b, f) for (a, b), f in zip(pairs, flags)]


@settings(max_examples=examples(25))
@given(costs=st.lists(layer_costs, min_size=1, max_size=6), fraction=st.floats(0.0, 1.0),
       after=st.sampled_from([0, 0, 30, 300]))
def test_single_level_planner_matches_brute_force(costs, fraction, after):
    plans = [(predict(costs, p, after), p) for p in all_plans(len(costs))]
    least = min(peak for (peak, _), _ in plans)
    assert minimum_budget(costs, nested=False, after_bytes=after) == least
    most = max(peak for (peak, _), _ in plans)
    budget = int(least + fraction * (most - least))
    plan = plan_checkpoints(costs, budget, nested=False, after_bytes=after)
    best = min(cost for (peak, cost), _ in plans if peak <= budget)
    assert plan.peak_bytes <= budget
    assert plan.recompute_seconds == pytest.approx(best)
    assert (plan.peak_bytes, plan.recompute_seconds) == pytest.approx(predict(costs, plan, after))
    # and among the cheapest plans, the lowest peak
    assert plan.peak_bytes == min(peak for (peak, cost), _ in plans if peak <= budget and math.isclose(cost, best))


@pytest.mark.parametrize("nested", [False, True])
def test_budget_below_the_minimum_states_the_minimum(nested):
    costs = [LayerCost("layer", 1024, 2048, True, 1024)] * 16
    least = minimum_budget(costs, nested)
    assert plan_checkpoints(costs, least, nested).peak_bytes == least
    with pytest.raises(ValueError, match=rf"no checkpoint plan fits a budget of {least - 1} bytes .* reaches is {least} bytes"):
        plan_checkpoints(costs, least - 1, nested)


@pytest.mark.parametrize("budget", ["1GB", None, [1024], True, numpy.array([4096])])
def test_a_budget_that_is_not_a_number_of_bytes_is_a_type_error_in_one_line(budget):
    costs = [LayerCost("layer", 1024, 2048, True, 1024)] * 4
    with pytest.raises(TypeError, match=r"plan_checkpoints: budget must be a number of bytes, got .*; pass an int, "
                                        r"e.g. 2 \* 1024\*\*3 for 2 GiB") as e:
        plan_checkpoints(costs, budget)
    assert "\n" not in str(e.value)


def test_a_nan_budget_is_a_value_error_and_numpy_numbers_are_budgets():
    costs = [LayerCost("layer", 1024, 2048, True, 1024)] * 4
    with pytest.raises(ValueError, match="plan_checkpoints: budget is NaN"):
        plan_checkpoints(costs, float("nan"))
    least = minimum_budget(costs)
    assert plan_checkpoints(costs, numpy.int64(least)) == plan_checkpoints(costs, float(least)) == plan_checkpoints(costs, least)
    assert plan_checkpoints(costs, math.inf) == plan_checkpoints(costs, 10**12)


def test_uniform_chain_at_the_minimum_budget_beats_sqrt_with_shrinking_segments():
    # When segment j is recomputed, every earlier checkpoint is still held, so
    # later segments must be shorter: lengths k, k-1, ..., 1 (each twice here,
    # since a layer holds two units against one for a checkpoint).
    costs = [LayerCost("layer", 1024, 1024, True, 1024)] * 64
    plan = plan_checkpoints(costs, minimum_budget(costs, nested=False), nested=False)
    lengths = [b - a for a, b, _ in plan.segments]
    assert lengths == sorted(lengths, reverse=True)
    assert plan.peak_bytes < predict(costs, "sqrt")[0]


def test_transformer_blocks_are_checkpointed_one_by_one():
    # A block's input is small next to its interior (W2: 1 MiB against ~18 MiB);
    # the planner must find from the sizes alone that one block per segment
    # beats sqrt(n) segments.
    block = LayerCost("block", 1 << 20, 18 << 20, True, 1 << 20)
    costs = [block] * 16
    plan = plan_checkpoints(costs, minimum_budget(costs, nested=False), nested=False)
    assert all(b - a == 1 for a, b, c in plan.segments if c)
    every, _ = predict(costs, "every")
    sqrt, _ = predict(costs, "sqrt")
    assert plan.peak_bytes <= every < sqrt


def test_planner_on_a_measured_gpt_checkpoints_every_block():
    config = GPTConfig(block_size=32, vocab_size=16, n_layer=6, n_head=2, n_embd=16, dropout=0.0)
    model = GPT(config, rng=numpy.random.default_rng(0))
    blocks = list(model.blocks)
    x = Tensor(numpy.random.default_rng(1).standard_normal((2, 32, 16)).astype(numpy.float32))
    costs = measure_layers(blocks, x, repeats=1)
    assert all(c.saved_bytes > 4 * c.input_bytes for c in costs)  # measured: the interior dwarfs the input
    plan = plan_checkpoints(costs, minimum_budget(costs, nested=False), nested=False)
    assert all(b - a == 1 for a, b, c in plan.segments if c)
    assert plan.peak_bytes < predict(costs, "sqrt")[0]


# -- nested plans: revolve ----------------------------------------------------------
def griewank_recomputations(steps, snapshots):
    """Griewank's closed form (1992) for the least forward steps to reverse a chain.

    t(l, c) = r l - beta(c + 1, r - 1), beta(c, r) = (c + r)! / (c! r!), where r
    is the integer with beta(c, r - 1) < l <= beta(c, r). Its c snapshots
    include the chain's input; its advances are our recomputations.
    """
    beta = lambda c, r: math.comb(c + r, c)  # noqa: E731
    r = 0
    while beta(snapshots, r) < steps:
        r += 1
    return r * steps - beta(snapshots + 1, r - 1)


@pytest.mark.parametrize("slots", range(6))
def test_revolve_recomputes_what_griewanks_binomial_formula_says(slots):
    for n in range(1, 41):
        assert revolve_recomputations(n, slots) == griewank_recomputations(n, slots + 1), (n, slots)


def test_revolve_at_both_ends():
    # no slot besides the input: recompute from the input for every layer, n(n-1)/2
    assert revolve_recomputations(12, 0) == 66
    assert describe(revolve(3, 0)) == "[0:2]*([0:1]* [1:2]) [2:3]"
    # a slot for every layer: every layer but the last checkpointed once, as 'every'
    assert revolve(5, 3) == [(0, 1, True), (1, 2, True), (2, 3, True), (3, 4, True), (4, 5, False)]
    assert revolve_recomputations(5, 3) == 4
    with pytest.raises(ValueError, match="slots >= 0"):
        revolve(4, -1)


def test_nested_segments_are_checked():
    assert segment_bounds(4, [(0, 3, [(0, 1, True), (1, 3, False)]), (3, 4, False)])[0][2] == [(0, 1, True), (1, 3, False)]
    with pytest.raises(ValueError, match=r"do not cover layers 0..3"):
        segment_bounds(4, [(0, 3, [(0, 1, True), (1, 2, False)]), (3, 4, False)])
    with pytest.raises(ValueError, match=r"inner plan of segment \(0, 3\) must be a list"):
        segment_bounds(4, [(0, 3, []), (3, 4, False)])


def mlp_grads(layers, model, x, segments):
    model.zero_grad()
    checkpoint_sequential(layers, segments, x).backward()
    return [p.grad.numpy().copy() for p in model.parameters()] + [x.grad.numpy().copy()]


@pytest.mark.equivalence
@settings(max_examples=examples(8))
@given(depth=st.integers(1, 14), slots=st.integers(0, 4), batch=st.integers(1, 3), last_checkpointed=st.booleans())
def test_revolve_gradients_equal_plain_and_peak_is_predicted(depth, slots, batch, last_checkpointed):
    model, layers, x = mlp_chain(depth, 8, batch, numpy.float64, input_grad=True)
    n = len(layers)
    slots = min(slots, max(n - 2, 0))
    segments = revolve(n, slots)
    if last_checkpointed:  # as the planner's variant: the last layer recomputed, not stored
        segments = segments[:-1] + [(n - 1, n, True)]
    plain = mlp_grads(layers, model, x, [(0, n, False)])
    x.grad = None
    costs = measure_layers(layers, x, repeats=1)
    predicted = predict(costs, segments)[0]
    base = memory.current()["activations"]
    measured = peak_activations(lambda: mlp_grads(layers, model, x, segments)) - base
    x.grad = None
    nested = mlp_grads(layers, model, x, segments)
    for a, b in zip(plain, nested):
        numpy.testing.assert_array_equal(a, b)  # the same ops on the same arrays: bit for bit
    assert measured == predicted, describe(segments)


def test_the_planner_goes_below_the_single_level_minimum_with_a_nested_plan():
    model, layers, x = mlp_chain(30, 32, 8)
    costs = measure_layers(layers, x, repeats=1)
    single = minimum_budget(costs, nested=False)
    budget = single // 2
    plan = plan_checkpoints(costs, budget)
    assert plan.peak_bytes <= budget and any(isinstance(how, list) for _, _, how in plan.segments)
    base = memory.current()["activations"]
    measured = peak_activations(lambda: checkpoint_sequential(layers, plan, x).backward()) - base
    assert measured == plan.peak_bytes <= budget
    assert minimum_budget(costs) < single


@settings(max_examples=examples(25))
@given(costs=st.lists(layer_costs, min_size=1, max_size=10), fraction=st.floats(0.0, 1.0),
       after=st.sampled_from([0, 100]))
def test_nested_planning_never_recomputes_more_than_single_level(costs, fraction, after):
    single_least = minimum_budget(costs, nested=False, after_bytes=after)
    full = predict(costs, [(0, len(costs), False)], after)[0]
    budget = int(single_least + fraction * max(full - single_least, 0))
    single = plan_checkpoints(costs, budget, nested=False, after_bytes=after)
    plan = plan_checkpoints(costs, budget, after_bytes=after)
    assert plan.peak_bytes <= budget
    assert plan.recompute_seconds <= single.recompute_seconds * (1 + 1e-9)
    assert (plan.peak_bytes, plan.recompute_seconds) == pytest.approx(predict(costs, plan, after))
    assert minimum_budget(costs, after_bytes=after) <= single_least


def test_bytes_saved_behind_the_chain_make_the_planner_checkpoint_the_last_layer():
    # Storing the last block ties with recomputing it inside the chain, but a
    # stored block is still held when the head's bytes join at the end of the forward.
    block = LayerCost("block", 1 << 20, 18 << 20, True, 1 << 20)
    costs, head = [block] * 8, 3 << 20
    budget = minimum_budget(costs, nested=False, after_bytes=head)
    blind = plan_checkpoints(costs, minimum_budget(costs, nested=False), nested=False)
    assert blind.segments[-1][2] is False  # planned without the head: the last block stored
    assert predict(costs, blind, after_bytes=head)[0] > budget  # and over budget once the head is counted
    seeing = plan_checkpoints(costs, budget, nested=False, after_bytes=head)
    assert all(how for _, _, how in seeing.segments) and seeing.peak_bytes == budget


def test_flops_costs_make_equal_layers_cost_the_same_and_plans_repeat():
    model, layers, x = mlp_chain(6, 32, 8)
    blocks = list(model.blocks)
    timed = measure_layers(blocks, x, repeats=1)
    counted = measure_layers(blocks, x, repeats=1, cost="flops")
    B, W = 8, 32
    assert all(c.flops == 2 * B * W * W + B * W + 9 * B * W for c in counted)  # Linear (+ bias), then GELU
    assert len({c.seconds for c in counted}) == 1 and counted[0].seconds > 0
    assert [c.flops for c in timed] == [c.flops for c in counted]
    full = predict(counted, [(0, len(blocks), False)])[0]
    plans = {describe(plan_checkpoints(measure_layers(blocks, x, repeats=1, cost="flops"), full // 2).segments)
             for _ in range(3)}
    assert len(plans) == 1
    with pytest.raises(ValueError, match="cost must be 'time' or 'flops'"):
        measure_layers(blocks, x, cost="bytes")


# -- what a recompute costs: predicted against counted -----------------------------------
@pytest.mark.parametrize("how", ["every", "sqrt", 3, "revolve1", "revolve0"])
def test_predicted_recompute_is_the_recompute_the_timeline_counts(how):
    """The cost model prices each layer's recompute by the plan recompute.py will follow
    (the last layer of a segment stops early), so with cost="flops" the predicted recompute,
    in FLOPs, is what the ops that ran again count (ops/flops.py), exactly."""
    from tinygrad_ckpt.ops.flops import op_flops

    model, layers, x = mlp_chain(8, 16, 4, input_grad=True)
    costs = measure_layers(layers, x, repeats=1, cost="flops")
    n = len(layers)
    segments = revolve(n, int(how[-1])) if isinstance(how, str) and how.startswith("revolve") else segment_bounds(n, how)
    _, predicted_seconds = predict(costs, segments)
    per_flop = sum(c.seconds for c in costs) / sum(c.flops for c in costs)
    with memory.timeline() as events:
        checkpoint_sequential(layers, segments, x).backward()
    counted = sum(op_flops(e["op"], e["input_shapes"], e["output_shapes"]) for e in events
                  if e["phase"] == "recompute" and "output_shapes" in e)
    assert predicted_seconds / per_flop == pytest.approx(counted, rel=1e-9)
    # Each MLP block is Linear + GELU: inside a segment both run again; as a segment's last
    # block only the Linear (GELU saved its input, which the Linear makes).
    block = costs[0]
    assert block.recompute_share == 1.0 and 0 < block.last_share < 1
