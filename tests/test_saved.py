"""The saved-activations report (saved.py): the right arrays, charged the right way.

Expected entries are derived by hand from what each op's docstring says it
saves (ops/), not from running the report.
"""

import numpy
import pytest

from tinygrad_ckpt import Tensor, memory
import tinygrad_ckpt.functional as F
from tinygrad_ckpt.saved import compare, op_flops, saved_activations

F32 = numpy.float32


def _tensor(rng, *shape, requires_grad=True, parameter=False):
    t = Tensor(rng.standard_normal(shape, dtype=F32), requires_grad=requires_grad)
    if parameter:
        memory.track(t.data, "parameters")  # what nn.Parameter does
    return t


def test_the_report_lists_exactly_what_each_op_saves():
    rng = numpy.random.default_rng(0)
    N, IN, OUT = 4, 3, 5
    x = _tensor(rng, N, IN)
    w, b = _tensor(rng, OUT, IN, parameter=True), _tensor(rng, OUT, parameter=True)
    mask = Tensor(rng.random((N, OUT)) > 0.5)  # no gradient: a constant
    mask = mask.to(F32)

    def f(x):
        h = F.linear(x, w, b)  # #0 Linear: saves x (dweight needs it) and weight (dx needs it)
        g = F.gelu(h)  # #1 GELU: saves its input h
        m = g * mask  # #2 Mul: saves the mask only (only g needs a gradient)
        return (m * h).tanh().sum()  # #3 Mul: saves both; #4 Tanh: saves its output; Sum: nothing

    report = saved_activations(f, x)
    got = [(e.record, e.op, e.slot, e.shape, e.dtype, e.charged) for e in report.entries]
    act = N * OUT * 4  # one (N, OUT) float32 array
    assert got == [
        (0, "Linear", 0, (N, IN), "float32", N * IN * 4),  # the input x
        (0, "Linear", 1, (OUT, IN), "float32", 0),  # the weight: a parameter, not charged
        (1, "GELU", 0, (N, OUT), "float32", act),  # h
        (2, "Mul", 1, (N, OUT), "float32", act),  # the mask (a new buffer, made by .to(float32))
        (3, "Mul", 0, (N, OUT), "float32", act),  # m
        (3, "Mul", 1, (N, OUT), "float32", 0),  # h again: shared with GELU's, charged once
        (4, "Tanh", 0, (N, OUT), "float32", act),  # tanh's output
    ]
    notes = [e.note for e in report.entries]
    assert notes[0] == "input" and notes[1].startswith("parameter") and notes[5] == "shared with #1"
    assert report.total == N * IN * 4 + 4 * act
    # memory.py's count of the same forward, reached by another route (weak
    # references to buffers, not a walk over the records), agrees to the byte.
    assert report.measured == report.total
    text = str(report)
    assert "Linear" in text and "shared with #1" in text and f"{report.total} bytes" in text
    assert report.recomputed == []  # nothing is checkpointed


def test_a_view_is_charged_its_whole_buffer_once():
    rng = numpy.random.default_rng(1)
    qkv = _tensor(rng, 2, 6)

    def f(qkv):
        y = qkv * 1.0  # a new (2, 6) buffer; Mul saves nothing for qkv (the constant needs no grad)...
        q, k = y[:, 0:3], y[:, 3:6]  # ...views of y, no saves
        return (q * k).sum()  # Mul saves k and q: two views of one buffer

    report = saved_activations(f, qkv)
    muls = [e for e in report.entries if e.op == "Mul" and e.shape == (2, 3)]
    assert [e.slot for e in muls] == [0, 1]
    assert [e.charged for e in muls] == [2 * 6 * 4, 0]  # the (2, 6) buffer, once
    assert "view of a (2, 6) buffer" in muls[0].note
    assert report.measured == report.total


def test_op_flops_follow_the_documented_counts():
    assert op_flops("MatMul", [(3, 4, 5), (5, 6)], [(3, 4, 6)]) == 2 * 3 * 4 * 6 * 5
    assert op_flops("Linear", [(8, 5), (6, 5), (6,)], [(8, 6)]) == 2 * 8 * 6 * 5 + 8 * 6
    assert op_flops("Linear", [(8, 5), (6, 5)], [(8, 6)]) == 2 * 8 * 6 * 5
    assert op_flops("Add", [(4, 5), (5,)], [(4, 5)]) == 20
    assert op_flops("GELU", [(4, 5)], [(4, 5)]) == 9 * 20
    assert op_flops("Softmax", [(2, 7)], [(2, 7)]) == 5 * 14
    assert op_flops("Sum", [(2, 7)], [()]) == 14
    assert op_flops("Reshape", [(2, 7)], [(14,)]) == 0


def test_forward_flops_of_a_linear_layer():
    rng = numpy.random.default_rng(2)
    x, w, b = _tensor(rng, 8, 5), _tensor(rng, 6, 5), _tensor(rng, 6)
    report = saved_activations(lambda x: F.linear(x, w, b).sum(), x)
    assert report.forward_flops == (2 * 8 * 6 * 5 + 8 * 6) + 8 * 6  # linear, then the sum's 48 adds


def test_bad_inputs_say_what_to_pass():
    with pytest.raises(TypeError, match="pass Tensors"):
        saved_activations(lambda x: x, numpy.ones(3))
    with pytest.raises(TypeError, match="must return one Tensor"):
        saved_activations(lambda x: (x, x), Tensor(numpy.ones(3), requires_grad=True))


def test_compare_lists_the_arrays_only_one_version_saves():
    rng = numpy.random.default_rng(3)
    x = _tensor(rng, 4, 4)
    plain = saved_activations(lambda x: (x.tanh() * x).sum(), x, name="plain")
    lean = saved_activations(lambda x: x.tanh().sum(), x, name="lean")
    diff = compare(plain, lean)
    # plain saves tanh's output, then Mul saves x and tanh(x); lean only tanh's output.
    assert [(e.op, e.slot) for e in diff.only_before] == [("Mul", 0), ("Mul", 1)]
    assert diff.only_after == []
    assert "saved by plain only" in str(diff)


def _block(rng, s=8, b=2, h=16, a=2):
    from tinygrad_ckpt.nn.transformer import GPTConfig, TransformerBlock

    block = TransformerBlock(GPTConfig(n_embd=h, n_head=a, dropout=0.0, block_size=s), rng=rng)
    x = Tensor(rng.standard_normal((b, s, h), dtype=F32), requires_grad=True)
    return block, x


def test_a_checkpointed_block_saves_its_input_and_recomputes_its_forward():
    from tinygrad_ckpt.checkpoint import checkpoint

    rng = numpy.random.default_rng(4)
    block, x = _block(rng)
    plain = saved_activations(lambda x: block(x).sum(), x, name="plain")
    ckpt = saved_activations(lambda x: checkpoint(block, x).sum(), x, name="checkpointed")
    # What the checkpointed version keeps: one record, the segment's input.
    assert [(e.op, e.shape, e.charged) for e in ckpt.entries] == [("Checkpoint", x.shape, x.data.nbytes)]
    assert ckpt.total == ckpt.measured == x.data.nbytes
    diff = compare(plain, ckpt)
    assert len(diff.only_before) == len(plain.entries) and diff.only_after == ckpt.entries
    # It recomputes every op of the block once but the last two: the
    # feed-forward's c_proj (a Linear that saved only its input and weight,
    # which exist by then) and the residual add (saves nothing) have their
    # records rebuilt, not run (recompute.py). So the forward's FLOPs less
    # the final sum's (outside the checkpoint, one per element of x), less
    # that Linear's 2 * (b s) * 4h * h + (b s) h and the add's (b s) h.
    b, s, h = x.shape
    last_linear, last_add = 2 * b * s * 4 * h * h + b * s * h, b * s * h
    assert ckpt.recompute_flops == plain.forward_flops - x.data.size - last_linear - last_add
    assert [r.op for r in ckpt.recomputed][:2] == ["LayerNorm", "Linear"]
    assert [r.op for r in ckpt.recomputed][-1] == "GELU"  # the last op that runs again
    assert "recompute cost of checkpointed" in str(diff)


def test_a_policy_keeps_its_ops_out_of_the_recompute():
    from tinygrad_ckpt import policies
    from tinygrad_ckpt.checkpoint import checkpoint

    rng = numpy.random.default_rng(5)
    block, x = _block(rng)
    plain = saved_activations(lambda x: block(x).sum(), x)
    policy = policies.selective_attention  # keep Linear outputs, recompute the rest
    sel = saved_activations(lambda x: checkpoint(block, x, policy=policy).sum(), x, policy=policy)
    linear = sum(op_flops("Linear", list(n.input_shapes), n.shapes) for n in _linear_nodes(block, x))
    assert "Linear" not in {r.op for r in sel.recomputed}
    # Less the final residual add too, whose record is rebuilt (it saves nothing).
    assert sel.recompute_flops == plain.forward_flops - x.data.size - linear - x.data.size
    # The Checkpoint record now also keeps the four Linear outputs (b, s, 3h), (b, s, h), (b, s, 4h), (b, s, h).
    b, s, h = x.shape
    kept = sorted(e.shape for e in sel.entries if e.op == "Checkpoint")
    assert kept == sorted([x.shape, (b, s, 3 * h), (b, s, h), (b, s, 4 * h), (b, s, h)])
    assert sel.total == sel.measured


def _linear_nodes(block, x):
    from tinygrad_ckpt import tape

    record = tape.Tape()
    with tape.recording(record):
        out = block(x)
    nodes = [n for n in record.nodes() if n.name == "Linear"]
    del out
    return nodes
