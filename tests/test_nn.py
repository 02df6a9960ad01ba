"""nn: parameter discovery, state_dict, modes, and every layer's gradient by finite differences.

Gradient checks run in float64 on tiny sizes with the tolerances stated in
helpers.py (atol 1e-6, rtol 1e-5); the module's parameters (and its input,
where it is a float tensor) are the inputs gradcheck perturbs.
"""

import numpy
import pytest

from tinygrad_ckpt import Tensor, memory, nn
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
    ln.weight.data[...] = rng(2).standard_normal(4)  # away from the ones/zeros init
    ln.bias.data[...] = rng(3).standard_normal(4)
    check_module_grad(ln, x64(3, 4))


@pytest.mark.parametrize("shape", [(5, 3), (4, 3, 2)])
def test_batchnorm_training_grad(shape):
    bn = nn.BatchNorm1d(3, dtype=F64)
    bn.weight.data[...] = rng(2).standard_normal(3)
    bn.bias.data[...] = rng(3).standard_normal(3)
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
    assert [n for n, _ in model.named_buffers()] == ["norm.running_mean", "norm.running_var"]
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
    x = Tensor(rng(1).standard_normal((2, 3)).astype(numpy.float32))
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
