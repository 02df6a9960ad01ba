"""The hooks ZeRO stage 3 is built on, and stage 3 itself in one process: no MPI needed.

Module.register_forward_pre_hook / register_forward_hook and
Tensor.register_post_accumulate_grad_hook (PyTorch's names) on their own;
then zero.FlatShards with units, Stage3Hooks and the stage-3
ShardedAccumulator over a stand-in for rank `rank` of `size` processes whose
collectives move nothing (the other ranks' elements stay as they were):
between gathers a parameter refuses every read, and one micro-batch's
gradients reach the shard buffer equal to a plain backward's.
"""

import gc
import weakref

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygrad_ckpt import memory, nn
from tinygrad_ckpt.nn.module import Parameter
from tinygrad_ckpt.tensor import Tensor
from tinygrad_ckpt.zero import FlatShards, GatheredParameters, ShardedAccumulator, Stage3Hooks, stage3_units

from .test_zero import flat_padded


class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = Parameter(numpy.arange(3.0))

    def forward(self, x):
        return x * self.weight


def test_forward_hooks_run_around_forward_may_replace_its_arguments_and_output_and_come_off():
    module, calls = Scale(), []
    pre = module.register_forward_pre_hook(lambda m, args: calls.append(("pre", m, args)) or (args[0] * 2,))
    post = module.register_forward_hook(lambda m, args, out: calls.append(("post", m, out)) or out + 1)
    x = Tensor(numpy.ones(3))
    out = module(x)
    numpy.testing.assert_array_equal(out.numpy(), numpy.arange(3.0) * 2 + 1)
    assert [c[0] for c in calls] == ["pre", "post"] and all(c[1] is module for c in calls)
    assert calls[0][2] == (x,)
    pre.remove()
    post.remove()
    numpy.testing.assert_array_equal(module(x).numpy(), numpy.arange(3.0))
    assert len(calls) == 2  # removed: not called again
    assert Scale()._forward_pre_hooks == ()  # another instance never shared them
    with pytest.raises(TypeError, match="forward pre hook must be callable"):
        module.register_forward_pre_hook(3)


@settings(max_examples=30, deadline=None)
@given(coefficients=st.lists(st.integers(1, 50), min_size=1, max_size=5, unique=True))
def test_a_post_accumulate_grad_hook_sees_the_gradient_summed_so_far_after_each_contribution(coefficients):
    """A leaf used k times gets k contributions: the hook runs after each, on the leaf, whose .grad is then
    the sum of the contributions so far (PyTorch calls it once, with the whole sum: the docstring says so)."""
    x = Parameter(numpy.ones(2))
    seen = []
    handle = x.register_post_accumulate_grad_hook(lambda t: seen.append((t is x, t.grad.numpy().copy())))
    sum((x * float(c)).sum() for c in coefficients).backward()
    assert len(seen) == len(coefficients) and all(same for same, _ in seen)
    steps = numpy.diff([0.0] + [g[0] for _, g in seen])
    assert sorted(steps) == sorted(coefficients)  # each contribution once, in the walk's order
    numpy.testing.assert_array_equal(x.grad.numpy(), numpy.full(2, float(sum(coefficients))))
    handle.remove()
    (x * 1.0).sum().backward()
    assert len(seen) == len(coefficients)


def test_a_post_accumulate_grad_hook_may_take_the_gradient_away_and_only_a_leaf_that_requires_grad_has_one():
    x = Parameter(numpy.ones(2))
    x.register_post_accumulate_grad_hook(lambda t: setattr(t, "grad", None))
    (x * 3.0).sum().backward()
    assert x.grad is None
    with pytest.raises(RuntimeError, match="computed by an op"):
        (x * 2.0).register_post_accumulate_grad_hook(print)
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor(numpy.ones(2)).register_post_accumulate_grad_hook(print)


class OneOfN:
    """Rank `rank` of `size` processes whose collectives move nothing: an all-gather leaves the other ranks'
    elements as they were, a reduce sums this rank alone. Counts the calls."""

    def __init__(self, rank, size):
        self.rank, self.size, self.calls = rank, size, {"all_gather_arrays": 0, "reduce": 0, "broadcast": 0}

    def all_gather_(self, array):
        self.calls["all_gather_arrays"] += 1
        return array

    def reduce_(self, array, root):
        self.calls["reduce"] += 1
        return array

    def broadcast_(self, array, root=0):
        self.calls["broadcast"] += 1
        return array


def tiny_gpt():
    return nn.GPT(nn.GPTConfig(block_size=4, vocab_size=7, n_layer=2, n_head=1, n_embd=5, dropout=0.0),
                  rng=numpy.random.default_rng(0), dtype=numpy.float64)


def sharded(model, size=1, rank=0):
    units = stage3_units(model)
    comm = OneOfN(rank, size)
    layout = FlatShards(model.parameters(), rank, size, units=[p for _, p in units], comm=comm,
                        names={id(p): n for n, p in model.named_parameters()})
    return layout, Stage3Hooks(model, units, layout), ShardedAccumulator(layout, comm, stage=3), comm


def test_units_are_each_block_then_the_root_with_the_rest():
    model = tiny_gpt()
    units = stage3_units(model)
    assert [m for m, _ in units] == [*model.blocks, model]
    assert [id(p) for p in units[-1][1]] == [id(p) for p in (model.wte.weight, model.wpe.weight, model.ln_f.weight,
                                                               model.ln_f.bias)]
    assert sorted(id(p) for _, ps in units for p in ps) == sorted(id(p) for p in model.parameters())


def test_between_gathers_a_parameter_has_its_shape_and_dtype_and_refuses_every_read():
    model = tiny_gpt()
    sharded(model)
    p = model.blocks[0].attn.c_attn.weight
    assert p.shape == tiny_gpt().blocks[0].attn.c_attn.weight.shape == (15, 5) and p.dtype == numpy.float64
    for read in (lambda: p.numpy(), lambda: p.data + 1, lambda: numpy.asarray(p.data), lambda: p.data[0],
                 lambda: float(p.data.sum()), lambda: p * 2.0, lambda: model.blocks[0].forward(Tensor(numpy.ones((1, 4, 5))))):
        with pytest.raises(RuntimeError, match=r"'blocks.0.(attn.c_attn|ln_1).weight': under ZeRO stage 3 this process "
                                               "holds only its shard"):
            read()  # module.forward(x) skips the hooks: its first parameter read, ln_1's, refuses


def test_a_forward_and_backward_under_stage_3_give_the_plain_gradients_and_leave_no_parameter_gathered():
    """One process (N = 1: the shard is the whole group): the loss and the gradients summed into the shard
    buffers are a plain model's bit for bit; after the backward no .grad is left and no unit is gathered; each
    unit was all-gathered for its forward and once again for its backward, each gradient reduced once (the
    tied embedding twice: it is the head too)."""
    plain, model = tiny_gpt(), tiny_gpt()
    layout, _, accumulator, comm = sharded(model)
    idx = numpy.array([[1, 2, 3, 4]])
    want_logits, _ = plain(idx)
    want_logits.sum().backward()
    logits, _ = model(idx)
    numpy.testing.assert_array_equal(logits.numpy(), want_logits.numpy())
    assert comm.calls["all_gather_arrays"] == len(layout.groups) and layout.gathered == [None] * len(layout.groups)
    logits.sum().backward()
    assert all(p.grad is None for p in model.parameters()) and layout.gathered == [None] * len(layout.groups)
    assert comm.calls["all_gather_arrays"] == 2 * len(layout.groups)
    assert comm.calls["reduce"] == len(list(model.parameters())) + 1
    for (_, members, _), buf in zip(layout.groups, accumulator.flats):
        numpy.testing.assert_array_equal(buf, flat_padded([p.grad.numpy() for p in
                                                           (list(plain.parameters())[i] for i in members)], 1))


def test_a_forward_that_raised_leaves_nothing_behind_for_the_next_one():
    """A forward that raises inside a block (a token past the vocabulary, say) leaves its saved-tensor hooks
    pushed and its units gathered; the next forward takes them off first, and gives the plain gradients."""
    from tinygrad_ckpt import function

    plain, model = tiny_gpt(), tiny_gpt()
    layout, _, accumulator, _ = sharded(model)
    depth = len(function._saved_hooks)
    with pytest.raises(Exception):
        model(numpy.array([[1, 2, 3, 4, 5]]))  # longer than block_size: raises after the root gathered
    idx = numpy.array([[1, 2, 3, 4]])
    logits, _ = model(idx)
    assert len(function._saved_hooks) == depth  # the hooks of the forward that raised are gone
    logits.sum().backward()
    assert layout.gathered == [None] * len(layout.groups)
    want, _ = plain(idx)
    want.sum().backward()
    for (_, members, _), buf in zip(layout.groups, accumulator.flats):
        numpy.testing.assert_array_equal(buf, flat_padded([p.grad.numpy() for p in
                                                           (list(plain.parameters())[i] for i in members)], 1))


@given(size=st.integers(2, 5), data=st.data())
@settings(max_examples=15, deadline=None)
def test_each_rank_keeps_only_its_shard_and_gathered_parameters_are_the_model_with_its_padding_zero(size, data):
    """Of N ranks, rank r keeps [r S, (r + 1) S) of each unit's padded flat array (the stand-in gathers
    nothing: only that slice holds the model's values, the rest is zeros); GatheredParameters points the
    parameters at it and, on exit, puts a change made inside into the shard."""
    rank = data.draw(st.integers(0, size - 1))
    model, reference = tiny_gpt(), tiny_gpt()
    want = {id(p): q.numpy() for p, q in zip(model.parameters(), reference.parameters())}
    layout, _, _, _ = sharded(model, size, rank)
    for (_, members, S), shard in zip(layout.groups, layout.shards):
        whole = flat_padded([want[id(layout.parameters[i])] for i in members], size)
        numpy.testing.assert_array_equal(shard.data, whole[rank * S : (rank + 1) * S])
    assert memory.category(layout.shards[0].data) == "parameters"
    with GatheredParameters(layout):
        p = model.wte.weight
        p.data[...] = 7.0  # every rank would make the same change (loading a checkpoint)
    with GatheredParameters(layout):
        mine = [i for i in range(layout.groups[0][2]) if rank * layout.groups[0][2] + i < p.data.size]
        assert all(p.data.reshape(-1)[rank * layout.groups[0][2] + i] == 7.0 for i in mine)
    assert all(not numpy.any(pad) for pad in layout.padding())


@pytest.mark.parametrize("policy", ["save_matmuls", "selective_attention", "offload_matmuls"])
def test_a_checkpoint_policy_under_stage_3_gives_the_plain_gradients(policy):
    """A policy keeps some ops' results; what their backward needs of a weight it keeps as the op's input
    (the Parameter), not as the gathered array, so the recompute, which calls the block again (early_stop=False,
    as the Trainer sets at stage 3), gathers it: the gradients are a plain model's, bit for bit, and no unit is
    left gathered after the forward."""
    plain, model = tiny_gpt(), tiny_gpt()
    for m in (plain, model):
        m.gradient_checkpointing_enable(policy=policy, early_stop=False)
    layout, _, accumulator, comm = sharded(model)
    gathered, all_gather = [], layout.all_gather
    layout.all_gather = lambda g: (lambda full: gathered.append(weakref.ref(full)) or full)(all_gather(g))
    idx = numpy.array([[1, 2, 3, 4]])
    want, _ = plain(idx)
    want.sum().backward()
    logits, _ = model(idx)
    gc.collect()
    assert len(gathered) == len(layout.groups) and all(ref() is None for ref in gathered)  # nothing kept them
    logits.sum().backward()
    assert comm.calls["all_gather_arrays"] == 2 * len(layout.groups)  # forward; recompute (blocks), unpack (root)
    for (_, members, _), buf in zip(layout.groups, accumulator.flats):
        numpy.testing.assert_array_equal(buf, flat_padded([p.grad.numpy() for p in
                                                           (list(plain.parameters())[i] for i in members)], 1))


def test_stage_3_refuses_checkpointing_that_would_not_call_the_blocks_again():
    """Its recompute must call each block (the pre-hook gathers it): split_blocks runs the halves of a block,
    which are not the units; it is refused, naming it."""
    from tinygrad_ckpt.train import Trainer

    from .test_zero import dataset, training_args

    for kwargs in ({"split_blocks": True}, {"split_blocks": True, "policy": "save_matmuls"}):
        args = training_args(zero_stage=3, gradient_checkpointing=True, gradient_checkpointing_kwargs=kwargs)
        with pytest.raises(ValueError, match="zero_stage=3 gathers each block's parameters when the block is called"):
            Trainer(tiny_gpt(), args, dataset(8), distributed=object())  # refused before any process is asked
