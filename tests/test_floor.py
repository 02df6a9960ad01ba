"""The floor of a step (bench/floor.py) and the matrix products it is made of (ops/flops.py).

The floor must run exactly the step's matrix products: the same count, the
same shapes, the same FLOPs as the models do. These tests count them from
the model definitions by hand (a GPT block's four projections and two
attention products; an MLP's layers) and compare with what floor.py
derives from a recorded forward. No timing is asserted.
"""

import numpy
import pytest

from tinygrad_ckpt.bench import floor, workloads
from tinygrad_ckpt.ops import flops


def test_a_products_forward_flops_are_the_ops_flop_count():
    # Linear without its bias add, and MatMul, folded or batched, as op_flops counts them.
    cases = [("Linear", [(8, 5, 4), (3, 4)], [(8, 5, 3)]),
             ("MatMul", [(2, 6, 4), (4, 3)], [(2, 6, 3)]),
             ("MatMul", [(2, 3, 6, 4), (2, 3, 4, 5)], [(2, 3, 6, 5)]),
             ("MatMul", [(6, 4), (2, 3, 4, 5)], [(2, 3, 6, 5)])]
    for op, inputs, outputs in cases:
        (phase, a, b), *backward = flops.matrix_products(op, inputs, (True, True))
        assert phase == "forward"
        assert flops.product_flops(a, b) == flops.op_flops(op, inputs, outputs)
        # Backward: one product per input, each as many FLOPs as the forward's.
        assert [p[0] for p in backward] == ["backward", "backward"]
        assert all(flops.product_flops(a2, b2) == flops.product_flops(a, b) for _, a2, b2 in backward)


def test_backward_products_only_for_inputs_that_need_a_gradient():
    assert [p[0] for p in flops.matrix_products("Linear", [(8, 4), (3, 4), (3,)], (False, True, True))] == [
        "forward", "backward"]
    assert flops.matrix_products("Linear", [(8, 4), (3, 4)], (False, True))[1][1:] == ((3, 8), (8, 4))  # g^T @ x
    assert flops.matrix_products("GELU", [(8, 4)], (True,)) == []


def _numpy_product(a, b):
    """Check a product's shapes by running it: a @ b must work and give a result."""
    return numpy.matmul(numpy.zeros(a, numpy.float32), numpy.zeros(b, numpy.float32))


@pytest.mark.parametrize("n_layers", [1, 3])
def test_the_w1_floor_is_every_layer_and_the_head(n_layers):
    size = workloads.DeepMLP(n_layers=n_layers, width=16, batch=4)
    products = floor.step_products(size)
    layers = n_layers + 1  # the head too
    # Forward: one product per layer; backward: dweight for every layer, dx for all but the
    # first (its input, the batch, needs no gradient).
    assert sum(p[1] == "forward" for p in products) == layers
    assert sum(p[1] == "backward" for p in products) == 2 * layers - 1
    assert all(_numpy_product(a, b).shape for _, _, a, b in products)
    assert floor.Floor(size).flops == (3 * layers - 1) * 2 * 4 * 16 * 16


def test_the_w2_floor_is_three_times_the_forwards_products():
    s = workloads.GPTStack(n_layer=2, n_embd=16, n_head=2, seq=8, batch=3, vocab=11, dropout=0.1)
    B, T, C, V, nh = s.batch, s.seq, s.n_embd, s.vocab, s.n_head
    per_block = 2 * B * T * C * (3 * C + C + 4 * C + 4 * C) + 2 * (2 * B * nh * T * T * (C // nh))
    forward = s.n_layer * per_block + 2 * B * T * C * V  # the blocks, then the tied lm_head
    f = floor.Floor(s)
    assert f.flops == 3 * forward  # every product's input needs a gradient: backward is twice the forward
    assert sum(p[1] == "forward" for p in f.products) == 6 * s.n_layer + 1
    # The attention products are batched over (B, nh), as the model runs them.
    assert ("MatMul", "forward", (B, nh, T, C // nh), (B, nh, C // nh, T)) in f.products


def test_the_floor_runs_its_products_into_its_own_buffers():
    size = workloads.TINY.w1
    f = floor.Floor(size)
    out = f.forward()
    f.backward(out)
    assert out.dtype == numpy.float32 and numpy.isfinite(out).all()
    # Inputs and outputs never share a buffer: a product never reads what another wrote.
    plan = f._plan["forward"] + f._plan["backward"]
    inputs = {id(a) for _, a, b, _ in plan} | {id(b) for _, a, b, _ in plan}
    assert not inputs & {id(o) for *_, o in plan}


def test_recording_the_step_leaves_no_record_behind():
    # step_records runs a forward on a tape of its own: the default tape gets nothing.
    from tinygrad_ckpt import tape

    before = len(tape._stack[0])
    floor.step_records(workloads.TINY.w2)
    assert len(tape._stack[0]) == before


def test_gemm_throughput_is_positive():
    assert floor.gemm_throughput(n=64, repeats=1) > 0
