"""The array backends: the strict CuPy stand-in, the default device, and the guard they give.

conftest.py runs every engine test module on NumPy, on the strict stand-in
and (with a GPU) on CuPy. The tests here check the stand-in itself behaves
like CuPy where it matters, and that the guard works: an op that quietly
uses NumPy on a device array fails.
"""

import gc
import operator
import weakref

import numpy
import pytest

import tinygrad_ckpt as tg
import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, autocast, backend, memory
from tinygrad_ckpt.testing import strict_cupy
from tinygrad_ckpt.function import Function

from .conftest import cupy_unavailable_reason


@pytest.fixture
def strict():
    """'cuda' is the strict stand-in for this test; the default device stays 'cpu'."""
    previous = backend.set_cuda_module(strict_cupy)
    strict_cupy.reset_transfers()
    yield strict_cupy
    backend.set_cuda_module(previous)


@pytest.fixture
def strict_default(strict):
    """As `strict`, and host data goes to 'cuda' by default."""
    previous = backend.set_default_device("cuda")
    yield strict
    backend.set_default_device(previous)


# -- the stand-in refuses what CuPy refuses (and NumPy functions too) --------------
def test_implicit_conversions_are_refused(strict):
    x = strict.asarray(numpy.arange(6.0).reshape(2, 3))
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array"):
        numpy.asarray(x)
    with pytest.raises(TypeError, match="does not support ufuncs"):
        numpy.exp(x)
    with pytest.raises(TypeError, match=r"numpy.sum was applied to a device array.*xp.sum"):
        numpy.sum(x)
    for implicit in (float, bool, int):
        with pytest.raises(TypeError, match="implicit device->host transfer"):
            implicit(x.sum())
    with pytest.raises(TypeError, match="implicit device->host transfer"):
        x.sum().item()
    with pytest.raises(TypeError, match="NumPy \\(host\\) array was mixed"):
        x + numpy.ones(3)
    with pytest.raises(TypeError, match="NumPy \\(host\\) array was mixed"):
        x[...] = numpy.zeros((2, 3))


def test_arithmetic_follows_numpy_and_scalars_are_welcome(strict):
    host = numpy.arange(6.0, dtype=numpy.float32).reshape(2, 3)
    x = strict.asarray(host)
    y = (2 * x + 1.5) / x.max() - numpy.float32(1)  # Python and NumPy scalars mix in freely
    assert isinstance(y, strict.ndarray) and y.dtype == numpy.float32
    numpy.testing.assert_array_equal(y.get(), (2 * host + 1.5) / host.max() - 1)
    numpy.testing.assert_array_equal((x @ x.T).get(), host @ host.T)
    s = x.sum()
    assert isinstance(s, strict.ndarray) and s.shape == ()  # a 0-d array, never a NumPy scalar


def test_views_report_the_owner_as_base_and_arrays_are_weakly_referenceable(strict):
    x = strict.zeros((4, 3))
    for view in (x.T, x[1:], x.reshape(3, 4), x.T[0], strict.broadcast_to(x[0], (5, 3)), x.swapaxes(0, 1)):
        assert view.base is x  # the owner, never a view of a view (as in CuPy and NumPy)
        assert backend.storage(view) is x
    assert (x + 1).base is None and x.copy().base is None
    ref = weakref.ref(x)
    del x, view
    gc.collect()
    assert ref() is None


def test_transfers_are_explicit_counted_and_copy(strict):
    host = numpy.ones(3)
    x = backend.to_device(host, "cuda")
    host[0] = 5.0  # the device copy is not affected: no shared memory
    back = backend.to_host(x)
    back[1] = 7.0
    numpy.testing.assert_array_equal(x.get(), [1.0, 1.0, 1.0])
    assert strict.transfers == {"host_to_device": 1, "device_to_host": 2}
    assert backend.to_device(x, "cuda") is x and strict.asarray(x) is x  # already there: no copy


def test_backend_knows_the_stand_in(strict):
    x = strict.zeros((5, 2))
    assert backend.device_of(x) == "cuda" and backend.array_module(x) is strict
    with pytest.raises(RuntimeError, match="different devices"):
        backend.array_module(x, numpy.zeros(2))
    backend.scatter_add(x, strict.asarray(numpy.array([0, 3, 0])), strict.ones((3, 2)))
    numpy.testing.assert_array_equal(x.get()[:, 0], [2, 0, 0, 1, 0])  # the repeated row adds twice


def test_the_pool_stand_in_counts_live_buffers_rounded_to_512_bytes(strict):
    pool = strict.get_default_memory_pool()
    gc.collect()
    before = pool.used_bytes()
    a, b = strict.zeros(10, dtype=numpy.float32), strict.zeros(200, dtype=numpy.float32)  # 40 B and 800 B
    view = a[2:]  # no new memory
    assert pool.used_bytes() - before == 512 + 1024
    del a, b, view
    gc.collect()
    assert pool.used_bytes() == before


# -- the guard: an op that uses NumPy on its input fails on the stand-in -------------
class HostSquare(Function):
    """A deliberately wrong op: it computes on the host with numpy.asarray."""

    @staticmethod
    def forward(ctx, x):
        return numpy.asarray(x) ** 2  # works on NumPy arrays, silently copies on a GPU

    @staticmethod
    def backward(ctx, g):
        raise NotImplementedError


class SyncingScale(Function):
    """Another wrong one: float() of a device value waits for the GPU."""

    @staticmethod
    def forward(ctx, x):
        return x / float(x.max())

    @staticmethod
    def backward(ctx, g):
        raise NotImplementedError


@pytest.mark.parametrize("op", [HostSquare, SyncingScale])
def test_an_op_touching_the_host_fails_on_the_stand_in_and_passes_on_numpy(strict, op):
    host = numpy.array([1.0, 2.0])
    assert op.apply(Tensor(host)).numpy().shape == (2,)  # NumPy: nothing to notice
    with pytest.raises(TypeError, match="Implicit conversion|implicit device->host transfer"):
        op.apply(Tensor(host, device="cuda"))


# -- the default device, as torch.set_default_device ----------------------------------
def test_host_data_goes_to_the_default_device(strict_default):
    assert Tensor([1.0]).device == "cuda" and Tensor(numpy.ones(2)).device == "cuda"
    assert tg.zeros(2).device == tg.ones(2).device == tg.randn(2, rng=numpy.random.default_rng(0)).device == "cuda"
    assert Tensor(numpy.ones(2), device="cpu").device == "cpu"


def test_cpu_tensors_stay_on_the_cpu_under_a_cuda_default(strict_default):
    x = Tensor(numpy.array([1.0, -2.0]), device="cpu", requires_grad=True)
    y = (x * 2).relu()
    assert y.device == "cpu" and (x < 0).device == "cpu" and x.detach().device == "cpu"
    z = x.cuda()
    assert z.device == "cuda" and z.cpu().device == "cpu"
    (z * z).sum().backward()
    assert x.grad.device == "cpu"
    numpy.testing.assert_array_equal(x.grad.numpy(), [2.0, -4.0])


def test_host_constants_are_copied_to_the_device_once(strict_default):
    logits = Tensor(numpy.zeros((2, 3)), requires_grad=True)
    mask = numpy.array([[True, False, True], [False, False, True]])
    F.where(mask, logits, 1.0).sum().backward()
    assert logits.masked_fill(mask, -1.0).device == "cuda"
    assert logits[numpy.array([1, 1])].shape == (2, 3)
    assert F.cross_entropy(logits, numpy.array([0, 2])).device == "cuda"
    with pytest.raises(ValueError, match="target 7 is out of range for 3 classes"):
        F.cross_entropy(logits, numpy.array([0, 7]))  # checked on the host, before the copy


def test_memory_accounting_counts_stand_in_buffers_once(strict):
    gc.collect()
    before = memory.total()
    x = Tensor(numpy.ones((8, 8), dtype=numpy.float32), device="cuda")
    views = [x.T, x[2:], x.reshape(64)]
    assert memory.total() - before == 8 * 8 * 4
    del x, views
    gc.collect()
    assert memory.total() == before


# -- CuPy itself ---------------------------------------------------------------------
@pytest.mark.skipif(cupy_unavailable_reason() is not None, reason=f"engine tests not run on CuPy: {cupy_unavailable_reason()}")
def test_engine_tests_run_on_cupy_here():
    xp = backend.module_for("cuda")
    assert xp.__name__ == "cupy"
    x = Tensor(numpy.array([1.0, 2.0]), device="cuda", requires_grad=True)
    (x * x).sum().backward()
    numpy.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])


@pytest.mark.parametrize("name", ["bool", "int8", "uint16", "int64", "float16", "float32", "float64",
                                  "complex64", "complex128", "U3", "V4"])
def test_is_inexact_is_numpys_inexact_kind(name):
    """One floating-or-complex check for the engine (tape, anomaly mode, saved-tensor hooks)."""
    dtype = numpy.dtype(name)
    assert backend.is_inexact(dtype) == numpy.issubdtype(dtype, numpy.inexact)


def test_is_inexact_counts_bfloat16_which_numpy_files_as_void():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert numpy.dtype(ml_dtypes.bfloat16).kind == "V"
    assert backend.is_inexact(ml_dtypes.bfloat16)
    assert autocast.is_float(ml_dtypes.bfloat16) and not autocast.is_float(numpy.complex64)


@pytest.mark.parametrize("read", [bool, float, int, operator.index, lambda a: a.item(), lambda a: a.tolist()])
def test_the_meta_array_and_the_strict_stand_in_refuse_the_same_reads(read):
    """One base, backend.ReadsRefused: each refuses every Python read of a value, in its own words."""
    import tinygrad_ckpt.meta as meta

    for array, error, words in ((meta.empty((), "float32"), backend.NeedsValues, "no values"),
                                (strict_cupy.asarray(numpy.float32(1.0)), TypeError, "implicit device->host")):
        assert isinstance(array, backend.ReadsRefused)
        with pytest.raises(error, match=words):
            read(array)
