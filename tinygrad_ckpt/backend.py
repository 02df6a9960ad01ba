"""The only place that decides between NumPy (CPU) and CuPy (GPU).

Every op asks `array_module(*arrays)` for the module its inputs live in and
calls `xp.exp`, `xp.zeros`, ... on it, so each derivative is written once and
runs on both devices. Nothing outside this file imports CuPy.

What lives here: the device names ('cpu', 'cuda', and 'meta' once the lab's
meta.py is imported), the array module of an array, explicit host/device
transfers, and the buffer that owns an array's memory (the memory
accounting counts buffers, not views). And the meta device's refusal
(`NeedsValues`): a device whose arrays have no values refuses every
question about them, as PyTorch's meta tensors do, so the engine's reads
(numpy(), item(), a state_dict, a copy to the CPU) name the call that asked.

What does not: any op, any tensor logic.
"""

import numpy

# The array module behind each device. 'cuda' is filled in on first use
# (importing CuPy is slow and fails where there is no GPU); tests may install a
# strict stand-in with `set_cuda_module` to prove the engine never touches the
# host behind the user's back. 'meta' (arrays with a shape and no data, to
# measure a step before running it) is the lab's: importing tinygrad_ckpt.meta
# installs it with `set_device_module`.
_modules = {"cpu": numpy, "cuda": None, "meta": None}


def set_device_module(device, module):
    """Use `module` as the array module of 'cuda' or 'meta'; returns the one there before."""
    if device not in ("cuda", "meta"):
        raise ValueError(f"only 'cuda' and 'meta' take another array module, not {device!r}")
    previous = _modules[device]
    _modules[device] = module
    return previous


def set_cuda_module(module):
    """Use `module` (CuPy, or a stand-in with the same interface) for 'cuda'.

    Returns the module that was there before, so a test can put it back.
    """
    return set_device_module("cuda", module)


def _cuda():
    if _modules["cuda"] is None:
        try:
            import cupy

            cupy.cuda.runtime.getDeviceCount()
        except Exception as e:  # ImportError, or CuPy present with no GPU
            raise RuntimeError(
                "device='cuda' needs CuPy and an NVIDIA GPU "
                f"({type(e).__name__}: {e}). Install the GPU extra with "
                "`pip install -e \".[gpu]\"` in the clone, on a machine with CUDA, "
                "or use device='cpu'."
            ) from None
        _modules["cuda"] = cupy
    return _modules["cuda"]


# Where host data (Python values, NumPy arrays) goes when a Tensor is made
# without a device, as with torch.set_default_device. 'cpu' unless changed;
# the test suite sets 'cuda' to run every engine test on the device.
_default_device = "cpu"


def set_default_device(device):
    """Make `Tensor(host_data)` and the constructors put tensors on `device`.

    Returns the previous default, so it can be put back.
    """
    global _default_device
    if device not in _modules:
        raise ValueError(f"unknown device {device!r}: use 'cpu', 'cuda' or 'meta'")
    previous, _default_device = _default_device, device
    return previous


def get_default_device():
    return _default_device


def cuda_is_available():
    """True when device='cuda' would work (CuPy importable and a GPU present)."""
    try:
        _cuda()
        return True
    except RuntimeError:
        return False


def module_for(device):
    """The array module of a device name ('cpu', 'cuda' or 'meta')."""
    if device == "cpu":
        return numpy
    if device == "cuda":
        return _cuda()
    if device == "meta":
        if _modules["meta"] is None:
            raise RuntimeError("device='meta' is the lab's: `import tinygrad_ckpt.meta` installs it")
        return _modules["meta"]
    raise ValueError(f"unknown device {device!r}: use 'cpu', 'cuda' or 'meta'")


def device_of(array):
    """'cpu' for NumPy arrays, 'cuda' for arrays of the CUDA module, 'meta' for the meta device's."""
    if isinstance(array, numpy.ndarray):
        return "cpu"
    for device in ("cuda", "meta"):
        module = _modules[device]
        if module is not None and isinstance(array, module.ndarray):
            return device
    if isinstance(array, ReadsRefused) and hasattr(array, "device"):  # no values, a device (zero.Unfetched)
        return array.device
    raise TypeError(
        f"expected a NumPy or CuPy array, got {type(array).__name__}; "
        "wrap Python values with Tensor(...) first"
    )


def is_inexact(dtype):
    """True for floating and complex dtypes (NumPy's numpy.inexact), ml_dtypes' bfloat16 included.

    NumPy files bfloat16 under kind 'V' (void), so a kind test alone misses it.
    """
    dtype = numpy.dtype(dtype)
    return dtype.kind in "fc" or dtype.name == "bfloat16"


def is_array(x):
    """True for an array of NumPy, of the CUDA module (CuPy, or the strict stand-in), or of the meta device."""
    if isinstance(x, numpy.ndarray):
        return True
    return any(m is not None and isinstance(x, m.ndarray) for m in (_modules["cuda"], _modules["meta"]))


def on_cpu(array):
    """True where the CPU computes `array`: NumPy's arrays, and the meta device's standing in for the CPU.

    Some ops work in pieces on the CPU (a piece fits the cache) and in one pass
    on a GPU; they ask this.
    """
    return isinstance(array, numpy.ndarray) or (device_of(array) == "meta" and _modules["meta"].like == "cpu")


def holds_values(device):
    """False for the meta device, whose arrays have no values: code that would draw random
    values for it (an initialisation, a dropout mask) makes an empty array instead, and code
    that would read one (a loss to log, a check for overflow) does not ask."""
    return device != "meta"


class NeedsValues(RuntimeError):
    """A question about values, asked of an array that has none (the meta device's)."""


def no_values(what, array, hint=None):
    """The NeedsValues error for `what` (the call, e.g. "item()") asked of a meta `array`."""
    hint = hint or ("Code run on device='meta' sizes a step: it may not read or branch on values. "
                    "Build on device='cpu' or 'cuda' to compute them.")
    return NeedsValues(f"{what}: a meta tensor has no values; it has a shape {tuple(array.shape)} and a dtype "
                       f"{array.dtype}. {hint}")


class ReadsRefused:
    """The Python reads of an array's values, refused: a base for arrays whose values Python may not see.

    bool(), float(), int(), use as an index, .item() and .tolist() each raise
    what `refusal(what)` returns. Two arrays are built on it: the meta
    device's, which has no values at all (meta.py, NeedsValues), and the
    strict CuPy stand-in's, whose values live on a "device" and leave it only
    by an explicit, counted copy (testing/strict_cupy.py). Each says why in
    its own words; neither ever answers with a made-up value.
    """

    __slots__ = ()

    def refusal(self, what):
        raise NotImplementedError("an array built on ReadsRefused says why a read is refused: define refusal")

    def __bool__(self):
        raise self.refusal("bool()")

    def __float__(self):
        raise self.refusal("float()")

    def __int__(self):
        raise self.refusal("int()")

    def __index__(self):
        raise self.refusal("using it as a Python integer")

    def item(self):
        raise self.refusal(".item()")

    def tolist(self):
        raise self.refusal(".tolist()")


def array_module(*arrays):
    """The array module shared by `arrays`; a clear error if they disagree."""
    devices = {device_of(a) for a in arrays}
    if len(devices) > 1:
        raise RuntimeError(
            f"arrays are on different devices ({' and '.join(sorted(devices))}); "
            "move them to one device with .to('cpu') or .to('cuda')"
        )
    return module_for(devices.pop()) if devices else numpy


def as_array(x):
    """NumPy turns 0-d results into scalars (numpy.float64); make them arrays again."""
    return numpy.asarray(x) if isinstance(x, numpy.generic) else x


def unbroadcast(grad, shape):
    """Sum `grad` down to `shape`: the adjoint of NumPy broadcasting (the ops and the walk use it)."""
    if tuple(grad.shape) == tuple(shape):
        return grad
    extra = grad.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(i + extra for i, n in enumerate(shape) if n == 1 and grad.shape[i + extra] != 1)
    return grad.sum(axis=axes, keepdims=True).reshape(shape)


def to_device(array, device):
    """An explicit copy of `array` onto `device` (no copy if already there).

    From the meta device to another: NeedsValues (there is nothing to copy;
    Module.to_empty makes a model's arrays on a device, without values).
    """
    if device_of(array) == device:
        return array
    if device_of(array) == "meta":
        raise no_values(f".to({device!r})", array,
                        "There is nothing to copy: make the arrays on the device without values with "
                        "Module.to_empty(device=...) and load or initialise them (PyTorch's to_empty).")
    if device == "cpu":
        return to_host(array)
    return module_for(device).asarray(array)


def to_host(array, what="a copy to the host (backend.to_host)"):
    """A NumPy copy of any array. The one sanctioned device-to-host transfer.

    A meta array has nothing to copy: NeedsValues, naming `what` asked.
    """
    if isinstance(array, numpy.ndarray):
        return array
    if device_of(array) == "meta":
        raise no_values(what, array)
    return array.get()


def synchronize(device):
    """Wait until `device` has done all the work queued on it (CuPy runs asynchronously).

    A no-op on the CPU, and on an array module without streams (the strict stand-in).
    Timing code calls it before each clock read.
    """
    if device == "cpu":
        return
    cuda = getattr(module_for(device), "cuda", None)
    if cuda is not None:
        cuda.Device().synchronize()


def storage(array):
    """The array that owns `array`'s memory: a view is counted once, by its base."""
    while getattr(array, "base", None) is not None and hasattr(array.base, "nbytes"):
        array = array.base
    return array


def address(array):
    """Where `array`'s first element lies in memory (NumPy's or CuPy's pointer): a view's place in its base.
    The meta device has no memory: its bytes from its base's first (meta.ndarray.offset), a place all the same."""
    if isinstance(array, numpy.ndarray):
        return array.__array_interface__["data"][0]
    return array.offset if device_of(array) == "meta" else array.data.ptr


def view_at(base, offset, shape, strides):
    """The view of `base` that starts `offset` bytes in, with this shape and these strides (NumPy, CuPy, meta)."""
    if isinstance(base, numpy.ndarray):
        return numpy.ndarray(shape, base.dtype, buffer=base, offset=offset, strides=strides)
    if device_of(base) == "meta":
        return module_of(base).ndarray(shape, base.dtype, strides, storage(base), base.offset + offset)
    return module_of(base).ndarray(shape, base.dtype, memptr=base.data + offset, strides=strides)


def scatter_add(target, index, values):
    """target[index] += values, adding (not overwriting) where index repeats.

    The adjoint of gathering rows (an embedding lookup): a token that appears
    twice gets both gradients.
    """
    if isinstance(target, numpy.ndarray):
        numpy.add.at(target, index, values)
    elif hasattr(module_of(target), "add") and hasattr(module_of(target).add, "at"):
        module_of(target).add.at(target, index, values)
    else:  # older CuPy: the same operation lives in cupyx
        import cupyx

        cupyx.scatter_add(target, index, values)
    return target


def module_of(array):
    """The array module of one array (array_module without the checks)."""
    return module_for(device_of(array))
