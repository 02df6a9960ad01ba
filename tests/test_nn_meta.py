"""Parameters made on the meta device allocate nothing on the host.

A layer built with device="meta" has parameters with a shape and a dtype
and no values: nothing is drawn from the generator and no array is made on
the host, whatever the layer's size. The host bytes are measured with
tracemalloc, which sees NumPy's allocations. Before, LSTM(256, 1024) on
meta drew 48 MiB of float64 values, and LSTM(8192, 8192, 4) would have
drawn 16 GiB.
"""

import tracemalloc

import numpy
import pytest

import tinygrad_ckpt.meta  # noqa: F401  (installs the meta device)
from tinygrad_ckpt import nn

LIMIT = 256 * 1024  # bytes: Python objects only, far below any layer's values


def host_peak(make):
    """(the layer make() returns, the most host bytes allocated while making it)."""
    tracemalloc.start()
    try:
        layer = make()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return layer, peak


LAYERS = {  # name: (make on a device, bytes its float32 values would take)
    "LSTM(256, 1024)": (lambda d: nn.LSTM(256, 1024, device=d), 4096 * (256 + 1024 + 2) * 4),
    "LSTMCell(512, 512)": (lambda d: nn.LSTMCell(512, 512, device=d), 2048 * (512 + 512 + 2) * 4),
    "Linear(4096, 4096)": (lambda d: nn.Linear(4096, 4096, device=d), (4096 * 4096 + 4096) * 4),
    "Embedding(50257, 768)": (lambda d: nn.Embedding(50257, 768, device=d), 50257 * 768 * 4),
    "Conv2d(512, 512, 3)": (lambda d: nn.Conv2d(512, 512, 3, device=d), (512 * 512 * 9 + 512) * 4),
    "BatchNorm2d(1 << 18)": (lambda d: nn.BatchNorm2d(1 << 18, device=d), 4 * (1 << 18) * 4),
    "BatchNorm1d(1 << 18, momentum=None)": (lambda d: nn.BatchNorm1d(1 << 18, momentum=None, device=d),
                                           4 * (1 << 18) * 4),
    "LayerNorm(1 << 20)": (lambda d: nn.LayerNorm(1 << 20, device=d), 2 * (1 << 20) * 4),
}


@pytest.mark.parametrize("name", LAYERS)
def test_a_layer_on_meta_allocates_nothing_on_the_host(name):
    make, value_bytes = LAYERS[name]
    layer, peak = host_peak(lambda: make("meta"))
    assert peak < LIMIT < value_bytes, f"{name} on meta: {peak} host bytes"
    tensors = list(layer.parameters()) + [b for _, b in layer.named_buffers()]
    assert all(t.device == "meta" for t in tensors)
    assert sum(t.data.nbytes for t in tensors) >= value_bytes  # the shapes are all there, as on the CPU


def test_the_shapes_and_dtypes_on_meta_are_those_on_the_cpu():
    on_cpu = nn.LSTM(6, 10, 2, dtype=numpy.float64)
    on_meta = nn.LSTM(6, 10, 2, dtype=numpy.float64, device="meta")
    assert [(n, p.shape, p.dtype) for n, p in on_cpu.named_parameters()] == \
        [(n, p.shape, p.dtype) for n, p in on_meta.named_parameters()]


def test_an_lstm_too_large_for_the_host_is_made_on_meta():
    """LSTM(8192, 8192, 4): 8 GiB of float32 parameters (16 GiB drawn in float64 before), none on the host."""
    lstm, peak = host_peak(lambda: nn.LSTM(8192, 8192, 4, device="meta"))
    assert peak < LIMIT
    assert sum(p.data.nbytes for p in lstm.parameters()) == 4 * (4 * 8192) * (8192 + 8192 + 2) * 4


def test_meta_parameters_have_no_values():
    lstm = nn.LSTM(3, 5, device="meta")
    with pytest.raises(tinygrad_ckpt.meta.NeedsValues):
        lstm.weight_ih_l0.data.sum().item()


def test_the_generator_is_not_drawn_from_on_meta():
    rng = numpy.random.default_rng(0)
    nn.LSTM(4, 8, rng=rng, device="meta")
    nn.Linear(4, 8, rng=rng, device="meta")
    assert rng.random() == numpy.random.default_rng(0).random()


def test_layers_made_on_meta_run_forward_on_meta():
    """A cumulative BatchNorm's count has no value on meta, and its forward does not ask for one."""
    x = nn.Conv2d(3, 4, 3, padding=1, device="meta")(tinygrad_ckpt.Tensor(numpy.empty((2, 3, 8, 8), numpy.float32),
                                                                           device="meta"))
    out = nn.BatchNorm2d(4, momentum=None, device="meta")(x)
    assert out.shape == (2, 4, 8, 8) and out.device == "meta"
    output, (h_n, _) = nn.LSTM(3, 5, 2, device="meta")(
        tinygrad_ckpt.Tensor(numpy.empty((4, 2, 3), numpy.float32), device="meta"))
    assert output.shape == (4, 2, 5) and h_n.shape == (2, 2, 5)
