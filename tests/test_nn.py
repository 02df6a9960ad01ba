"""nn: parameter discovery, state_dict, modes, and every layer's gradient by finite differences.

Gradient checks run in float64 on tiny sizes with the tolerances stated in
helpers.py (atol 1e-6, rtol 1e-5); the module's parameters (and its input,
where it is a float tensor) are the inputs gradcheck perturbs.
"""

import numpy
import pytest

from tinygrad_ckpt import Tensor, memory, nn, no_grad
from tinygrad_ckpt.gradcheck import gradcheck

from .helpers import ATOL, RTOL

F64 = numpy.float64


def rng(seed=0):
    return numpy.random.default_rng(seed)


def check_module_grad(module, *inputs):
    """gradcheck module(*inputs) with respect to its parameters and its float inputs."""
    checked = list(module.parameters()) + [x for x in inputs if isinstance(x, Tensor) and x.requires_grad]
    assert gradcheck(lambda *_: module(*inputs), checked, atol=ATOL, rtol=RTOL)


def x64(*shape, seed=1):
    return Tensor(rng(seed).standard_normal(shape), requires_grad=True)


# -- gradients of each layer ----------------------------------------------------
def test_linear_grad():
    check_module_grad(nn.Linear(3, 2, dtype=F64, rng=rng()), x64(4, 3))


def test_linear_without_bias_grad():
    layer = nn.Linear(3, 2, bias=False, dtype=F64, rng=rng())
    assert [n for n, _ in layer.named_parameters()] == ["weight"]
    check_module_grad(layer, x64(2, 2, 3))


def test_embedding_grad_with_repeated_indices():
    check_module_grad(nn.Embedding(5, 3, dtype=F64, rng=rng()), numpy.array([[0, 4, 0], [2, 2, 1]]))


def test_layernorm_grad():
    ln = nn.LayerNorm(4, dtype=F64)
    with no_grad():  # a parameter changes in place only off the tape, as in PyTorch
        ln.weight.copy_(rng(2).standard_normal(4))  # away from the ones/zeros init
        ln.bias.copy_(rng(3).standard_normal(4))
    check_module_grad(ln, x64(3, 4))


@pytest.mark.parametrize("shape", [(5, 3), (4, 3, 2)])
def test_batchnorm_training_grad(shape):
    bn = nn.BatchNorm1d(3, dtype=F64)
    with no_grad():
        bn.weight.copy_(rng(2).standard_normal(3))
        bn.bias.copy_(rng(3).standard_normal(3))
    check_module_grad(bn, x64(*shape))


def test_activation_modules_match_functional():
    x = x64(7)
    assert numpy.allclose(nn.ReLU()(x).numpy(), numpy.maximum(x.numpy(), 0))
    assert numpy.allclose(nn.Tanh()(x).numpy(), numpy.tanh(x.numpy()))
    u = numpy.sqrt(2 / numpy.pi) * (x.numpy() + 0.044715 * x.numpy() ** 3)
    assert numpy.allclose(nn.GELU()(x).numpy(), 0.5 * x.numpy() * (1 + numpy.tanh(u)))


# -- initialisation --------------------------------------------------------------
def test_linear_init_is_pytorch_uniform_and_seeded():
    a = nn.Linear(64, 32, rng=rng(5))
    b = nn.Linear(64, 32, rng=rng(5))
    assert numpy.array_equal(a.weight.numpy(), b.weight.numpy())
    bound = 1 / numpy.sqrt(64)
    w = a.weight.numpy()
    assert w.dtype == numpy.float32 and numpy.abs(w).max() <= bound and numpy.abs(w).max() > 0.9 * bound
    assert numpy.abs(a.bias.numpy()).max() <= bound


def test_init_std_gives_normal_weights_and_zero_bias():
    layer = nn.Linear(200, 100, rng=rng(), init_std=0.02)
    assert abs(layer.weight.numpy().std() - 0.02) < 0.001
    assert not layer.bias.numpy().any()


def test_same_seed_same_values_in_float32_and_float64():
    a = nn.Linear(4, 3, rng=rng(1), dtype=numpy.float32)
    b = nn.Linear(4, 3, rng=rng(1), dtype=F64)
    assert b.weight.dtype == F64
    assert numpy.array_equal(a.weight.numpy(), b.weight.numpy().astype(numpy.float32))


# -- Module: finding parameters ---------------------------------------------------
class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(3, 4, rng=rng(0))
        self.body = nn.Sequential(nn.GELU(), nn.LayerNorm(4), nn.Dropout(0.5))
        self.norm = nn.BatchNorm1d(4)
        self.scale = nn.Parameter(numpy.ones(4, dtype=numpy.float32))

    def forward(self, x):
        return self.norm(self.body(self.first(x))) * self.scale


def test_named_parameters_are_dotted_own_first_then_children_in_order():
    names = [n for n, _ in TwoLayer().named_parameters()]
    assert names == ["scale", "first.weight", "first.bias", "body.1.weight", "body.1.bias", "norm.weight", "norm.bias"]


def test_modules_and_children():
    model = TwoLayer()
    assert [type(m).__name__ for m in model.children()] == ["Linear", "Sequential", "BatchNorm1d"]
    assert len(list(model.modules())) == 1 + 3 + 3  # self, children, the Sequential's three
    assert [n for n, _ in model.named_modules()][:4] == ["", "first", "body", "body.0"]


def test_buffers_are_in_state_dict_but_not_parameters():
    model = TwoLayer()
    assert [n for n, _ in model.named_buffers()] == ["norm.running_mean", "norm.running_var", "norm.num_batches_tracked"]
    assert "norm.running_mean" in model.state_dict()
    assert all(not n.startswith("norm.running") for n, _ in model.named_parameters())


def test_a_plain_list_of_modules_is_an_error():
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = [nn.Linear(2, 2)]

    with pytest.raises(TypeError, match="use ModuleList"):
        list(Bad().parameters())


def test_shared_parameter_is_listed_once():
    a = nn.Linear(2, 2)
    b = nn.Linear(2, 2)
    b.weight = a.weight
    names = [n for n, _ in nn.Sequential(a, b).named_parameters()]
    assert names == ["0.weight", "0.bias", "1.bias"]


def test_parameter_grad_is_a_plain_tensor_counted_as_gradients():
    layer = nn.Linear(3, 2, rng=rng())
    before = memory.current()["gradients"]
    layer(Tensor(numpy.ones((4, 3), dtype=numpy.float32))).sum().backward()
    assert type(layer.weight.grad) is Tensor and not layer.weight.grad.requires_grad
    assert memory.current()["gradients"] - before == layer.weight.data.nbytes + layer.bias.data.nbytes


def test_parameters_are_counted_as_parameters():
    before = memory.current()["parameters"]
    layer = nn.Linear(10, 20)
    assert memory.current()["parameters"] - before == (10 * 20 + 20) * 4
    del layer


def test_zero_grad():
    layer = nn.Linear(3, 2)
    layer(Tensor(numpy.ones((1, 3), dtype=numpy.float32))).sum().backward()
    layer.zero_grad(set_to_none=False)
    assert layer.weight.grad is not None and not layer.weight.grad.numpy().any()
    layer.zero_grad()
    assert layer.weight.grad is None and layer.bias.grad is None


def test_train_and_eval_reach_every_module():
    model = TwoLayer()
    assert all(m.training for m in model.modules())
    assert model.eval() is model
    assert not any(m.training for m in model.modules())
    model.train()
    assert all(m.training for m in model.modules())


def test_call_is_forward_and_to_cpu_keeps_parameters():
    model = TwoLayer().eval()
    x = Tensor(rng(1).standard_normal((2, 3)).astype(numpy.float32), device="cpu")
    weight = model.first.weight
    assert model.to("cpu") is model and model.first.weight is weight
    assert numpy.array_equal(model(x).numpy(), model.forward(x).numpy())


# -- state_dict -------------------------------------------------------------------
def test_state_dict_round_trip_is_exact():
    a, b = nn.Linear(5, 3, rng=rng(1)), nn.Linear(5, 3, rng=rng(2))
    a_state = a.state_dict()
    weight_before = b.weight
    missing, unexpected = b.load_state_dict(a_state)
    assert (missing, unexpected) == ([], [])
    assert b.weight is weight_before  # copied in place
    for name, value in b.state_dict().items():
        assert numpy.array_equal(value, a_state[name])
    x = Tensor(rng(3).standard_normal((4, 5)).astype(numpy.float32))
    assert numpy.array_equal(a(x).numpy(), b(x).numpy())


def test_state_dict_is_a_snapshot():
    layer = nn.Linear(2, 2)
    state = layer.state_dict()
    with no_grad():
        layer.weight.add_(1.0)
    assert not numpy.array_equal(state["weight"], layer.weight.numpy())


def test_load_state_dict_accepts_tensors_and_bumps_version():
    layer = nn.Linear(2, 3)
    version = layer.weight._version
    layer.load_state_dict({"weight": Tensor(numpy.ones((3, 2), dtype=numpy.float32)), "bias": numpy.zeros(3)})
    assert numpy.array_equal(layer.weight.numpy(), numpy.ones((3, 2)))
    assert layer.bias.dtype == numpy.float32  # copied into the existing array, in its dtype
    assert layer.weight._version > version


def test_load_state_dict_lists_every_problem_and_copies_nothing():
    model = TwoLayer()
    state = model.state_dict()
    del state["first.bias"]
    state["extra.weight"] = numpy.zeros(2)
    state["first.weight"] = numpy.zeros((5, 3))
    state["scale"] = numpy.full(4, 7.0)
    with pytest.raises(nn.LoadStateDictError) as info:
        model.load_state_dict(state)
    message = str(info.value)
    assert "missing keys" in message and "first.bias" in message
    assert "unexpected keys" in message and "extra.weight" in message
    assert "wrong shape for first.weight: state_dict has (5, 3), the model has (4, 3)" in message
    assert info.value.missing == ["first.bias"] and info.value.unexpected == ["extra.weight"]
    assert numpy.array_equal(model.scale.numpy(), numpy.ones(4))  # checked before copying anything


def test_load_state_dict_non_strict_skips_missing_and_unexpected():
    model = TwoLayer()
    state = {"scale": numpy.full(4, 2.0), "other": numpy.zeros(1)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert unexpected == ["other"] and "first.weight" in missing
    assert numpy.array_equal(model.scale.numpy(), numpy.full(4, 2.0))
    with pytest.raises(nn.LoadStateDictError, match="wrong shape for scale"):
        model.load_state_dict({"scale": numpy.zeros(3)}, strict=False)


# -- dropout and batch norm modes -------------------------------------------------
def test_dropout_draws_from_its_rng_deterministically():
    x = Tensor(numpy.ones((50, 40), dtype=numpy.float32))
    a = nn.Dropout(0.3, rng=rng(7))(x).numpy()
    b = nn.Dropout(0.3, rng=rng(7))(x).numpy()
    c = nn.Dropout(0.3, rng=rng(8))(x).numpy()
    assert numpy.array_equal(a, b) and not numpy.array_equal(a, c)
    assert 0.2 < (a == 0).mean() < 0.4
    assert numpy.allclose(a[a != 0], 1 / 0.7)


def test_eval_disables_dropout():
    drop = nn.Dropout(0.5, rng=rng())
    x = Tensor(rng(1).standard_normal((10, 10)).astype(numpy.float32))
    assert (drop(x).numpy() == 0).any()
    drop.eval()
    assert numpy.array_equal(drop(x).numpy(), x.numpy())


def test_batchnorm_running_stats_and_eval():
    bn = nn.BatchNorm1d(3, momentum=0.1, dtype=F64)
    x = rng(4).standard_normal((6, 3, 2)) * 3 + 1
    out = bn(Tensor(x)).numpy()
    # Independent NumPy: per-channel statistics over axes (0, 2).
    mean, var = x.mean(axis=(0, 2)), x.var(axis=(0, 2))
    assert numpy.allclose(out, (x - mean[:, None]) / numpy.sqrt(var[:, None] + 1e-5))
    assert numpy.allclose(bn.running_mean.numpy(), 0.1 * mean)
    assert numpy.allclose(bn.running_var.numpy(), 0.9 + 0.1 * x.var(axis=(0, 2), ddof=1))
    bn.eval()
    y = rng(5).standard_normal((4, 3, 2))
    rm, rv = bn.running_mean.numpy(), bn.running_var.numpy()
    assert numpy.allclose(bn(Tensor(y)).numpy(), (y - rm[:, None]) / numpy.sqrt(rv[:, None] + 1e-5))
    assert numpy.array_equal(bn.running_mean.numpy(), rm)  # eval does not update


def test_batchnorm_bad_input():
    with pytest.raises(ValueError, match=r"expects input \(N, 3\)"):
        nn.BatchNorm1d(3)(Tensor(numpy.ones((2, 4), dtype=numpy.float32)))
    with pytest.raises(ValueError, match="more than one value per channel"):
        nn.BatchNorm1d(3)(Tensor(numpy.ones((1, 3), dtype=numpy.float32)))


def test_embedding_index_out_of_range():
    with pytest.raises(ValueError, match="index 5 is out of range for 5 embeddings"):
        nn.Embedding(5, 2)(numpy.array([1, 5]))


# -- containers ---------------------------------------------------------------------
def test_sequential_indexing_iteration_and_len():
    layers = [nn.Linear(2, 2, rng=rng(i)) for i in range(3)]
    seq = nn.Sequential(*layers)
    assert len(seq) == 3 and seq[1] is layers[1] and list(seq) == layers
    assert isinstance(seq[1:], nn.Sequential) and list(seq[1:]) == layers[1:]
    x = Tensor(numpy.ones((1, 2), dtype=numpy.float32))
    assert numpy.array_equal(seq(x).numpy(), layers[2](layers[1](layers[0](x))).numpy())


def test_module_list():
    ml = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 3)])
    ml.append(nn.Linear(3, 1))
    assert len(ml) == 3 and [n for n, _ in ml.named_parameters()][-1] == "2.bias"
    with pytest.raises(TypeError, match="holds Modules"):
        ml.append(3)


# -- MLP (workload W1's model) ------------------------------------------------------
def test_mlp_structure_and_names():
    model = nn.MLP(3, 5, 2, n_layers=2, rng=rng())
    assert len(model.blocks) == 2 and isinstance(model.blocks[0][1], nn.GELU)
    names = [n for n, _ in model.named_parameters()]
    assert names == ["blocks.0.0.weight", "blocks.0.0.bias", "blocks.1.0.weight", "blocks.1.0.bias", "head.weight", "head.bias"]
    assert model.blocks[0][0].weight.shape == (5, 3) and model.head.weight.shape == (2, 5)


def test_mlp_forward_is_the_chain():
    model = nn.MLP(3, 4, 2, n_layers=3, activation="tanh", rng=rng())
    x = Tensor(rng(1).standard_normal((2, 3)).astype(numpy.float32))
    h = x.numpy()
    for block in model.blocks:
        h = numpy.tanh(h @ block[0].weight.numpy().T + block[0].bias.numpy())
    expected = h @ model.head.weight.numpy().T + model.head.bias.numpy()
    numpy.testing.assert_allclose(model(x).numpy(), expected, rtol=1e-5, atol=1e-6)


def test_mlp_grad():
    check_module_grad(nn.MLP(3, 4, 2, n_layers=2, dtype=F64, rng=rng()), x64(2, 3))


def test_mlp_unknown_activation():
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        nn.MLP(2, 2, 2, n_layers=1, activation="swish")


# -- transformer (workload W2's model) ----------------------------------------------
def tiny_config(**changes):
    config = dict(block_size=4, vocab_size=5, n_layer=1, n_head=2, n_embd=4, dropout=0.0)
    config.update(changes)
    return nn.GPTConfig(**config)


def test_causal_self_attention_grad():
    check_module_grad(nn.CausalSelfAttention(tiny_config(), rng=rng(), dtype=F64), x64(2, 3, 4))


def test_causal_self_attention_matches_numpy():
    attn = nn.CausalSelfAttention(tiny_config(n_embd=6, n_head=3), rng=rng(), dtype=F64)
    with no_grad():
        attn.c_attn.bias.copy_(rng(2).standard_normal(18))  # GPT-2 init makes biases zero
        attn.c_proj.bias.copy_(rng(3).standard_normal(6))
    x = rng(1).standard_normal((2, 4, 6))
    # Independent reference: one head at a time, explicit loops over positions.
    qkv = x @ attn.c_attn.weight.numpy().T + attn.c_attn.bias.numpy()
    q, k, v = qkv[..., :6], qkv[..., 6:12], qkv[..., 12:]
    y = numpy.zeros_like(x)
    for h in range(3):
        cols = slice(2 * h, 2 * h + 2)
        for t in range(4):
            scores = numpy.einsum("bd,bsd->bs", q[:, t, cols], k[:, : t + 1, cols]) / numpy.sqrt(2)
            w = numpy.exp(scores - scores.max(-1, keepdims=True))
            w /= w.sum(-1, keepdims=True)
            y[:, t, cols] = numpy.einsum("bs,bsd->bd", w, v[:, : t + 1, cols])
    expected = y @ attn.c_proj.weight.numpy().T + attn.c_proj.bias.numpy()
    numpy.testing.assert_allclose(attn(Tensor(x)).numpy(), expected, rtol=1e-10, atol=1e-12)


def test_feed_forward_grad():
    check_module_grad(nn.FeedForward(tiny_config(), rng=rng(), dtype=F64), x64(1, 2, 4))


def test_transformer_block_grad():
    block = nn.TransformerBlock(tiny_config(), rng=rng(), dtype=F64)
    with no_grad():
        block.ln_1.weight.copy_(rng(5).standard_normal(4))  # ln weights away from their all-ones init
    check_module_grad(block, x64(2, 3, 4))


@pytest.mark.parametrize("n_layer,tie", [(1, True), (2, False)])
def test_gpt_loss_grad(n_layer, tie):
    model = nn.GPT(tiny_config(n_layer=n_layer, tie_weights=tie), rng=rng(), dtype=F64)
    idx, targets = numpy.array([[0, 3, 1], [4, 4, 2]]), numpy.array([[3, 1, -100], [4, 2, 0]])
    assert gradcheck(lambda *_: model(idx, targets)[1], list(model.parameters()), atol=ATOL, rtol=RTOL)


def test_gpt_names_and_tied_weights():
    model = nn.GPT(tiny_config(n_layer=2), rng=rng())
    names = [n for n, _ in model.named_parameters()]
    assert names[:3] == ["wte.weight", "wpe.weight", "blocks.0.ln_1.weight"]
    assert "blocks.1.attn.c_attn.weight" in names and "blocks.1.mlp.c_proj.bias" in names
    assert model.lm_head.weight is model.wte.weight and "lm_head.weight" not in names
    untied = nn.GPT(tiny_config(tie_weights=False), rng=rng())
    assert "lm_head.weight" in dict(untied.named_parameters())


def test_gpt2_initialisation():
    model = nn.GPT(nn.GPTConfig(block_size=8, vocab_size=16, n_layer=2, n_head=2, n_embd=64), rng=rng())
    block = model.blocks[0]
    assert abs(block.attn.c_attn.weight.numpy().std() - 0.02) < 0.001
    assert abs(block.mlp.c_proj.weight.numpy().std() - 0.02 / numpy.sqrt(4)) < 0.0005
    assert abs(block.attn.c_proj.weight.numpy().std() - 0.02 / numpy.sqrt(4)) < 0.0005
    assert not block.attn.c_attn.bias.numpy().any() and numpy.array_equal(block.ln_1.weight.numpy(), numpy.ones(64))


def test_float32_stays_float32_everywhere():
    from tinygrad_ckpt import tape

    model = nn.GPT(tiny_config(n_layer=2, dropout=0.1), rng=rng())
    logits, loss = model(numpy.array([[0, 1, 2, 3]]), numpy.array([[1, 2, 3, 4]]))
    saved = [a for node in tape.active().nodes() for a in node.ctx.saved_arrays or () if a is not None]
    assert saved and all(a.dtype.kind != "f" or a.dtype == numpy.float32 for a in saved)
    loss.backward()
    assert logits.dtype == loss.dtype == numpy.float32
    assert all(p.dtype == p.grad.dtype == numpy.float32 for p in model.parameters())


def test_attention_is_causal():
    model = nn.GPT(tiny_config(block_size=6, n_layer=2), rng=rng())
    idx = numpy.array([[1, 2, 3, 4, 0, 1]])
    changed = idx.copy()
    changed[0, 3] = 0
    before, _ = model(idx)
    after, _ = model(changed)
    numpy.testing.assert_allclose(after.numpy()[:, :3], before.numpy()[:, :3], rtol=0, atol=1e-7)
    assert not numpy.allclose(after.numpy()[:, 3:], before.numpy()[:, 3:])


def test_gpt_learns_a_repeated_sequence():
    from tinygrad_ckpt.optim import AdamW

    model = nn.GPT(nn.GPTConfig(block_size=8, vocab_size=8, n_layer=1, n_head=2, n_embd=16, dropout=0.0), rng=rng())
    seq = numpy.tile(numpy.arange(8), 3)
    idx = numpy.stack([seq[i:i + 8] for i in range(4)])  # (4, 8)
    targets = numpy.stack([seq[i + 1:i + 9] for i in range(4)])  # the next token at each position
    opt = AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    losses = []
    for _ in range(30):
        _, loss = model(idx, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 0.9 * numpy.log(8)  # starts near chance
    assert losses[-1] < 0.25 * losses[0]


def test_gpt_dropout_follows_its_rng_and_eval():
    idx = numpy.array([[0, 1, 2, 3]])
    a = nn.GPT(tiny_config(dropout=0.3), rng=rng(1))
    b = nn.GPT(tiny_config(dropout=0.3), rng=rng(1))
    first, second = a(idx)[0].numpy(), a(idx)[0].numpy()
    assert not numpy.array_equal(first, second)  # fresh masks each forward
    assert numpy.array_equal(first, b(idx)[0].numpy())  # same seed, same init and masks
    a.eval()
    assert numpy.array_equal(a(idx)[0].numpy(), a(idx)[0].numpy())


def test_generate():
    from tinygrad_ckpt import tape

    model = nn.GPT(tiny_config(block_size=4), rng=rng()).eval()
    start = numpy.array([[1, 2], [3, 0]])
    records = len(tape.active())
    out = model.generate(start, 5, top_k=1)
    assert out.shape == (2, 7) and numpy.array_equal(out[:, :2], start) and len(tape.active()) == records
    context = out[:, :-1][:, -4:]  # greedy: the last token is the argmax given the (cropped) context
    assert numpy.array_equal(out[:, -1], model(context)[0].numpy()[:, -1].argmax(-1))
    s1 = model.generate(start, 6, rng=rng(9))
    s2 = model.generate(start, 6, rng=rng(9))
    assert numpy.array_equal(s1, s2) and s1.min() >= 0 and s1.max() < 5


def test_gpt_errors():
    with pytest.raises(ValueError, match="longer than block_size 4"):
        nn.GPT(tiny_config(), rng=rng())(numpy.zeros((1, 5), dtype=int))
    with pytest.raises(ValueError, match=r"n_embd \(4\) must be divisible by n_head \(3\)"):
        nn.GPT(tiny_config(n_head=3))
