"""The layers check their arguments where they are given, as PyTorch's do, with messages that name the argument.

Conv2d's padding, stride, kernel, dilation and groups, the sizes of Linear,
Embedding, Conv2d, LSTM and BatchNorm, pooling's options: a bad one is an
error at construction, not at the first forward. NumPy integers are taken
wherever ints are. Pooling refuses an input with no channels and takes an
empty batch; BatchNorm in training returns an empty output for an empty
batch; momentum=None is PyTorch's cumulative average; the LSTM checks its
state's dtype; LSTM.load_state_dict checks every entry before copying any
and takes torch's state dict as it is. Where torch is installed, the same
calls are checked to behave as torch's (PyTorch 2.13, torch/nn/modules/conv.py,
batchnorm.py, rnn.py).
"""

import numpy
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinygrad_ckpt import Tensor
from tinygrad_ckpt import functional as F
from tinygrad_ckpt import nn
from tinygrad_ckpt.nn.module import LoadStateDictError

RNG = numpy.random.default_rng(0)


def ones(*shape):
    return Tensor(numpy.ones(shape, dtype=numpy.float32))


# -- Conv2d ----------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, message", [
    ({"padding": "foo"}, ValueError, r"invalid padding string 'foo'"),
    ({"padding": "same", "stride": 2}, ValueError, r"padding='same' is not supported for strided convolutions"),
    ({"padding": "same", "stride": (1, 2)}, ValueError, r"padding='same' is not supported for strided"),
    ({"groups": 0}, ValueError, r"groups must be a positive integer"),
    ({"groups": -2}, ValueError, r"groups must be a positive integer"),
    ({"groups": 4}, ValueError, r"must both be divisible by groups \(4\)"),
    ({"kernel_size": 0}, ValueError, r"kernel_size must be an int >= 1"),
    ({"kernel_size": (3, -1)}, ValueError, r"kernel_size must be an int >= 1"),
    ({"stride": 0}, ValueError, r"stride must be an int >= 1"),
    ({"dilation": 0}, ValueError, r"dilation must be an int >= 1"),
    ({"padding": -1}, ValueError, r"padding must be an int >= 0"),
    ({"in_channels": 0}, ValueError, r"in_channels must be greater than zero"),
    ({"out_channels": -3}, ValueError, r"out_channels must be greater than zero"),
    ({"in_channels": 6.0}, TypeError, r"in_channels should be of type int, got: float"),
])
def test_conv2d_refuses_bad_arguments_at_construction(kwargs, error, message):
    arguments = {"in_channels": 6, "out_channels": 6, "kernel_size": 3, **kwargs}
    with pytest.raises(error, match=message):
        nn.Conv2d(**arguments)


def test_conv2d_bad_arguments_are_refused_by_torch_too():
    """Each refused construction above that torch checks at construction, torch refuses too."""
    torch = pytest.importorskip("torch")
    for kwargs in ({"padding": "foo"}, {"padding": "same", "stride": 2}, {"groups": 0}, {"groups": 4}):
        with pytest.raises(ValueError):
            torch.nn.Conv2d(**{"in_channels": 6, "out_channels": 6, "kernel_size": 3, **kwargs})


def test_functional_conv2d_names_a_bad_padding_string():
    with pytest.raises(ValueError, match=r"conv2d: invalid padding string 'foo'"):
        F.conv2d(ones(1, 2, 5, 5), ones(3, 2, 3, 3), padding="foo")


def test_numpy_integers_are_taken_where_ints_are():
    i = numpy.int64
    conv = nn.Conv2d(i(4), numpy.int32(6), i(3), stride=i(2), padding=(i(1), i(1)), dilation=i(1), groups=i(2))
    assert conv.weight.shape == (6, 2, 3, 3) and conv(ones(1, 4, 7, 7)).shape == (1, 6, 4, 4)
    assert repr(conv) == "Conv2d(4, 6, kernel_size=(3, 3), stride=2, padding=(1, 1), dilation=1, groups=2, bias=True)"
    assert nn.MaxPool2d(i(2), stride=i(2))(ones(1, 1, 4, 4)).shape == (1, 1, 2, 2)
    assert nn.AvgPool2d(numpy.int16(2))(ones(1, 1, 4, 4)).shape == (1, 1, 2, 2)
    assert nn.Linear(i(3), i(2))(ones(4, 3)).shape == (4, 2)
    assert nn.Embedding(i(10), i(4)).weight.shape == (10, 4)
    assert nn.BatchNorm2d(i(3))(ones(2, 3, 2, 2)).shape == (2, 3, 2, 2)
    lstm = nn.LSTM(i(3), i(5), num_layers=i(2))
    assert lstm(ones(4, 2, 3))[0].shape == (4, 2, 5)
    assert nn.LSTMCell(i(3), i(5))(ones(2, 3))[0].shape == (2, 5)
    assert F.max_pool2d(ones(1, 1, 4, 4), i(2)).shape == (1, 1, 2, 2)
    assert F.layer_norm(ones(2, 4), i(4)).shape == nn.LayerNorm(i(4))(ones(2, 4)).shape == (2, 4)


@given(value=st.integers(-3, 0), which=st.sampled_from(["in_features", "out_features"]))
def test_linear_sizes_must_be_positive(value, which):
    sizes = {"in_features": 3, "out_features": 2, which: value}
    with pytest.raises(ValueError, match=f"Linear: {which} must be greater than zero, got {value}"):
        nn.Linear(**sizes)


@pytest.mark.parametrize("make, message", [
    (lambda: nn.LSTM(0, 4), r"LSTM: input_size must be greater than zero"),
    (lambda: nn.LSTM(3, 0), r"LSTM: hidden_size must be greater than zero"),
    (lambda: nn.LSTM(3, 4, num_layers=0), r"LSTM: num_layers must be greater than zero"),
    (lambda: nn.LSTMCell(3, -1), r"LSTMCell: hidden_size must be greater than zero"),
    (lambda: nn.Embedding(0, 4), r"Embedding: num_embeddings must be greater than zero"),
    (lambda: nn.BatchNorm1d(0), r"BatchNorm1d: num_features must be greater than zero"),
    (lambda: nn.LayerNorm(0), r"LayerNorm: normalized_shape must be greater than zero"),
])
def test_sizes_must_be_positive(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_lstm_sizes_refused_by_torch_too():
    torch = pytest.importorskip("torch")
    for args in ((0, 4), (3, 0)):
        with pytest.raises(ValueError, match="must be greater than zero"):
            torch.nn.LSTM(*args)


def test_a_bool_is_not_a_size():
    with pytest.raises(TypeError, match="in_features should be of type int, got: bool"):
        nn.Linear(True, 2)


# -- pooling ------------------------------------------------------------------------
@pytest.mark.parametrize("make, message", [
    (lambda: nn.MaxPool2d(0), r"MaxPool2d: kernel_size must be an int >= 1"),
    (lambda: nn.MaxPool2d(2, stride=0), r"MaxPool2d: stride must be an int >= 1"),
    (lambda: nn.MaxPool2d(2, dilation=0), r"MaxPool2d: dilation must be an int >= 1"),
    (lambda: nn.MaxPool2d(2, padding=2), r"MaxPool2d: padding should be at most half of the kernel size"),
    (lambda: nn.AvgPool2d((2, 0)), r"AvgPool2d: kernel_size must be an int >= 1"),
    (lambda: nn.AvgPool2d(3, padding=-1), r"AvgPool2d: padding must be an int >= 0"),
])
def test_pooling_refuses_bad_arguments_at_construction(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("pool", [nn.MaxPool2d(2), nn.AvgPool2d(2)])
def test_pooling_refuses_zero_channels_and_takes_an_empty_batch(pool):
    with pytest.raises(ValueError, match=r"C, H and W above 0 \(N may be 0\), got shape \(2, 0, 4, 4\)"):
        pool(ones(2, 0, 4, 4))
    x = Tensor(numpy.ones((0, 3, 4, 4), dtype=numpy.float32), requires_grad=True)
    out = pool(x)
    assert out.shape == (0, 3, 2, 2)
    out.sum().backward()
    assert x.grad.shape == (0, 3, 4, 4)


def test_the_cnn_takes_an_empty_batch():
    """Conv2d, BatchNorm2d, pooling and Flatten each take N = 0, so the CNN does, forward and backward."""
    model = nn.CNN(nn.CNNConfig(image_size=8, widths=(4, 8), convs_per_stage=1))
    x = Tensor(numpy.ones((0, 3, 8, 8), dtype=numpy.float32), requires_grad=True)
    logits, _ = model(x)
    assert logits.shape == (0, 10)
    logits.sum().backward()
    assert x.grad.shape == (0, 3, 8, 8)


def test_pooling_shapes_agree_with_torch():
    torch = pytest.importorskip("torch")
    for f in ("max_pool2d", "avg_pool2d"):
        assert getattr(torch.nn.functional, f)(torch.zeros(0, 3, 4, 4), 2).shape == (0, 3, 2, 2)
        with pytest.raises(RuntimeError):
            getattr(torch.nn.functional, f)(torch.zeros(2, 0, 4, 4), 2)


# -- BatchNorm -------------------------------------------------------------------------
def test_batchnorm2d_in_training_takes_an_empty_batch():
    bn = nn.BatchNorm2d(3)
    x = Tensor(numpy.ones((0, 3, 4, 4), dtype=numpy.float32), requires_grad=True)
    out = bn(x)
    assert out.shape == (0, 3, 4, 4)
    out.sum().backward()
    assert x.grad.shape == (0, 3, 4, 4) and bn.weight.grad.data.tolist() == [0, 0, 0]
    assert bn.running_mean.data.tolist() == [0, 0, 0] and bn.running_var.data.tolist() == [1, 1, 1]  # untouched


def test_batchnorm_momentum_none_is_the_cumulative_average():
    """After n batches the running mean is the plain mean of the n batch means (PyTorch: momentum=None)."""
    bn = nn.BatchNorm1d(2, momentum=None)
    assert repr(bn) == "BatchNorm1d(2, eps=1e-05, momentum=None)"
    batches = [RNG.standard_normal((5, 2)).astype(numpy.float32) + k for k in range(4)]
    for x in batches:
        bn(Tensor(x))
    assert int(bn.num_batches_tracked.item()) == 4
    means = numpy.mean([x.mean(axis=0) for x in batches], axis=0)
    variances = numpy.mean([x.var(axis=0, ddof=1) for x in batches], axis=0)
    assert numpy.allclose(bn.running_mean.data, means, atol=1e-6)
    assert numpy.allclose(bn.running_var.data, variances, atol=1e-5)
    assert "num_batches_tracked" in bn.state_dict()  # saved, so a resumed run goes on averaging
    fresh = nn.BatchNorm1d(2, momentum=None)
    fresh.load_state_dict(bn.state_dict())
    assert int(fresh.num_batches_tracked.item()) == 4


def test_batchnorm_momentum_none_agrees_with_torch():
    torch = pytest.importorskip("torch")
    ours, theirs = nn.BatchNorm2d(3, momentum=None), torch.nn.BatchNorm2d(3, momentum=None)
    for k in range(3):
        x = RNG.standard_normal((4, 3, 2, 2)).astype(numpy.float32) * (k + 1)
        ours(Tensor(x))
        theirs(torch.tensor(x))
    assert numpy.allclose(ours.running_mean.data, theirs.running_mean.numpy(), atol=1e-6)
    assert numpy.allclose(ours.running_var.data, theirs.running_var.numpy(), atol=1e-5)


@pytest.mark.parametrize("momentum", [-0.1, 1.5, "0.1", True])
def test_batchnorm_momentum_out_of_range_is_refused(momentum):
    with pytest.raises(ValueError, match=r"momentum must be a number in \[0, 1\], or None"):
        nn.BatchNorm2d(3, momentum=momentum)


def test_batchnorm_buffers_are_pytorchs_three():
    """PyTorch 2.13 keeps num_batches_tracked for every momentum, so a state_dict loads in either."""
    names = [name for name, _ in nn.BatchNorm2d(3).named_buffers()]
    assert names == ["running_mean", "running_var", "num_batches_tracked"]


# -- LSTM ------------------------------------------------------------------------------
def test_lstm_state_of_another_dtype_is_a_clear_error():
    lstm = nn.LSTM(3, 5)
    x = ones(4, 2, 3)
    h = Tensor(numpy.zeros((1, 2, 5), dtype=numpy.float64))
    c = Tensor(numpy.zeros((1, 2, 5), dtype=numpy.float32))
    with pytest.raises(TypeError, match=r"LSTM: h_0 is float64, the parameters \(and the input\) are float32"):
        lstm(x, (h, c))
    with pytest.raises(TypeError, match=r"LSTM: c_0 is float64"):
        lstm(x, (c, h))


def test_lstm_cell_state_of_another_dtype_is_a_clear_error():
    h = Tensor(numpy.zeros((2, 5), dtype=numpy.float64))
    with pytest.raises(TypeError, match=r"LSTMCell: h is float64, the parameters are float32"):
        nn.LSTMCell(3, 5)(ones(2, 3), (h, h))


def _torch_lstm(torch, *args, **kwargs):
    torch.manual_seed(0)
    return torch.nn.LSTM(*args, **kwargs)


def test_lstm_loads_torchs_state_dict_as_it_is():
    torch = pytest.importorskip("torch")
    theirs = _torch_lstm(torch, 3, 5, 2)
    ours = nn.LSTM(3, 5, 2)
    assert ours.load_state_dict(theirs.state_dict()) == ([], [])
    x = RNG.standard_normal((6, 2, 3)).astype(numpy.float32)
    expected, _ = theirs(torch.tensor(x))
    got, _ = ours(Tensor(x))
    assert numpy.allclose(got.data, expected.detach().numpy(), atol=1e-5)
    # a bfloat16 state dict (NumPy has no bfloat16) loads through float32, exactly
    ours.load_state_dict({k: v.bfloat16() for k, v in theirs.state_dict().items()})
    assert numpy.array_equal(ours.weight_hh_l1.data, theirs.weight_hh_l1.detach().bfloat16().float().numpy())


def test_lstm_load_state_dict_checks_every_entry_before_copying_any():
    lstm = nn.LSTM(3, 5, 2)
    before = {k: v.copy() for k, v in lstm.state_dict().items()}
    good = {k: numpy.full(v.shape, 0.5, dtype=numpy.float32) for k, v in before.items()}
    for bad_key, bad_value, error in (("weight_hh_l1", numpy.zeros((3, 3)), LoadStateDictError),
                                      ("bias_hh_l1", numpy.array(["a"] * 20), TypeError)):
        state = dict(good, **{bad_key: bad_value})  # every other entry fine, and first in order
        with pytest.raises(error, match=bad_key):
            lstm.load_state_dict(state)
        assert all(numpy.array_equal(v, before[k]) for k, v in lstm.state_dict().items()), "something was copied"
