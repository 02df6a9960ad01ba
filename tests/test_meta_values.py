"""The meta device never invents values, and a Tensor's truth is its one value.

A meta tensor has a shape and a dtype and no data: every question about its
data (numpy(), item(), tolist(), bool(), a copy to the CPU, a state_dict,
save, generate) is refused with NeedsValues naming the call, as PyTorch's
meta tensors refuse; repr shows the shape and the dtype. A model built on
meta leaves it with to_empty. estimate_step refuses a step that branches on
a value and names the line. Code that runs a whole step on meta (the
Trainer, the loss scaler, clipping) reads nothing and skips nothing.

Tensors as conditions, on any device: one value is its truth (as NumPy and
PyTorch), several or none are ambiguous.
"""

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, backend, fit, meta, serialization
from tinygrad_ckpt.grad_scaler import GradScaler
from tinygrad_ckpt.nn import MLP
from tinygrad_ckpt.nn.transformer import GPT, GPTConfig
from tinygrad_ckpt.optim import AdamW, clip_grad_norm_, get_total_norm

from .conftest import examples


def mlp(device):
    return MLP(4, 8, 3, 2, device=device, rng=numpy.random.default_rng(0))


def on_meta(shape=(2, 3), dtype=numpy.float32):
    return Tensor(numpy.ones(shape, dtype), device="meta")


# -- a meta tensor refuses every question about its values --------------------------------------
@pytest.mark.parametrize("call, name", [
    (lambda t: t.numpy(), "numpy()"),
    (lambda t: t.sum().item(), "item()"),
    (lambda t: t.tolist(), "tolist()"),
    (lambda t: bool(t.sum()), "bool()"),
    (lambda t: bool((t > 0).max()), "bool()"),  # a comparison, then its truth
    (lambda t: t.to("cpu"), ".to('cpu')"),
    (lambda t: t.cpu(), ".to('cpu')"),
    (lambda t: backend.to_host(t.data), "a copy to the host (backend.to_host)"),
    (lambda t: t.data.get(), "a copy to the host (.get())"),
    (lambda t: numpy.asarray(t.data), "numpy.asarray()"),
])
def test_a_meta_tensor_refuses_a_question_about_its_values_naming_the_call(call, name):
    with pytest.raises(meta.NeedsValues) as error:
        call(on_meta())
    message = str(error.value)
    assert message.startswith(f"{name}: a meta tensor has no values; it has a shape ("), message


def test_a_meta_tensor_s_repr_shows_its_shape_and_dtype_and_no_values(capsys):
    t = Tensor(numpy.ones((2, 3), numpy.float16), device="meta", requires_grad=True)
    assert repr(t) == "Tensor(..., device='meta', shape=(2, 3), dtype=float16, requires_grad=True)"
    print(t * 2)  # printing never reads
    out = capsys.readouterr().out
    assert "shape=(2, 3)" in out and "grad_fn=Mul" in out and "0." not in out
    assert "shape=(8, 4)" in repr(mlp("meta").blocks[0][0].weight)  # a Parameter too


# -- a model built on meta -------------------------------------------------------------------------
def test_a_meta_model_cannot_be_saved_moved_or_read_without_saying_so(tmp_path):
    model = mlp("meta")
    with pytest.raises(meta.NeedsValues, match=r"state_dict\(\) of 'blocks.0.0.weight'"):
        model.state_dict()
    with pytest.raises(meta.NeedsValues, match=r"Module.to\('cpu'\) .*to_empty"):
        model.to("cpu")
    assert all(p.device == "meta" for p in model.parameters())  # refused before anything moved
    path = tmp_path / "model.npz"
    with pytest.raises(meta.NeedsValues, match=r"save\(\) of the model's 'blocks.0.0.weight'"):
        serialization.save(path, model)
    assert not path.exists()
    optimizer = AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(meta.NeedsValues, match=r"AdamW.state_dict\(\)"):
        optimizer.state_dict()
    with pytest.raises(meta.NeedsValues, match=r"save\(\) of the optimizer's"):
        serialization.save(path, optimizer=optimizer)


def test_generate_on_a_meta_model_is_refused():
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8), device="meta")
    with pytest.raises(meta.NeedsValues, match=r"generate\(\)"):
        model.generate(numpy.zeros((1, 2), numpy.int64), max_new_tokens=1)


def test_to_empty_takes_a_meta_model_to_a_device_where_a_state_dict_gives_it_values():
    real, model = mlp("cpu"), mlp("meta")
    assert model.to_empty(device="cpu") is model
    assert [(n, p.shape, p.dtype, p.device) for n, p in model.named_parameters()] == \
           [(n, p.shape, p.dtype, "cpu") for n, p in real.named_parameters()]
    model.load_state_dict(real.state_dict())
    x = numpy.random.default_rng(1).standard_normal((5, 4)).astype(numpy.float32)
    numpy.testing.assert_array_equal(model(Tensor(x)).numpy(), real(Tensor(x)).numpy())


# -- a step on meta: nothing read, nothing skipped ----------------------------------------------------
def test_clipping_and_the_loss_scaler_on_meta_read_nothing_and_make_up_nothing():
    model = mlp("meta")
    out = model(on_meta((5, 4))).sum()
    out.backward()
    assert get_total_norm([p.grad for p in model.parameters()]) is None  # no norm, not 0.0
    assert clip_grad_norm_(model.parameters(), 1.0) is None
    scaler = GradScaler()
    assert scaler.unscale_(AdamW(model.parameters(), lr=1e-3)) is False  # no values, so nothing overflows


def classification_loss(model, batch):
    return F.cross_entropy(model(Tensor(batch["x"], device="meta")), batch["y"], reduction="sum"), len(batch["y"])


BATCH = {"x": ((2, 4), "float32"), "y": ((2,), "int64")}


def test_a_mixed_precision_step_on_meta_is_taken_and_says_nothing_of_skipping(capsys):
    step = fit.estimate_step(mlp("meta"), BATCH, classification_loss, {"fp16": True})
    assert "skipped" not in capsys.readouterr().out
    assert step.highest["optimizer"] == 2 * step.highest["parameters"]  # AdamW's two moments


def branches_on_item(model, batch):
    loss, n = classification_loss(model, batch)
    if loss.item() > 0:  # the line named
        return loss, n
    return loss * 2, n


def branches_on_a_comparison(model, batch):
    loss, n = classification_loss(model, batch)
    return (loss if loss > 0 else -loss), n  # the line named


@pytest.mark.parametrize("loss, offset, what", [(branches_on_item, 2, "item()"), (branches_on_a_comparison, 2, "bool()")])
def test_estimate_step_refuses_a_step_that_branches_on_a_value_naming_the_line(loss, offset, what):
    with pytest.raises(meta.NeedsValues) as error:
        fit.estimate_step(mlp("meta"), BATCH, loss)
    message = str(error.value)
    assert f"{__file__}:{loss.__code__.co_firstlineno + offset}" in message, message
    assert "# the line named" in message and what in message


# -- a tensor as a condition ---------------------------------------------------------------------
@settings(max_examples=examples(20))
@given(value=st.one_of(st.floats(allow_nan=True), st.integers(-3, 3), st.booleans()),
       shape=st.sampled_from([(), (1,), (1, 1)]))
def test_a_tensor_of_one_value_is_as_true_as_that_value(value, shape):
    array = numpy.full(shape, value)
    assert bool(Tensor(array)) is bool(array) is bool(value)
    assert bool(Tensor(array) > 0) is bool(value > 0)  # a 0-d comparison: no IndexError


@pytest.mark.parametrize("shape, words", [((2,), "more than one value"), ((0,), "no values"), ((2, 2), "more than one value")])
def test_a_tensor_of_several_values_or_none_is_ambiguous(shape, words):
    t = Tensor(numpy.ones(shape, numpy.float32))
    with pytest.raises(RuntimeError, match=f"Boolean value of Tensor with {words} is ambiguous"):
        if t > 0:  # used to be always true
            pass
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(on_meta(shape))  # the count of values is known on meta too: the same answer, no NeedsValues


def test_len_of_a_0_d_tensor_is_a_type_error():
    with pytest.raises(TypeError, match="0-d"):
        len(Tensor(1.0))
    assert len(Tensor(numpy.zeros((3, 2)))) == 3
