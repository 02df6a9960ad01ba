"""Shared test setup: hypothesis profiles.

HYPOTHESIS_PROFILE=ci (the default, and what .ci/run uses) is derandomized
with a bounded number of examples, so CI is repeatable and fast;
HYPOTHESIS_PROFILE=dev explores many more examples for local runs.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=15, derandomize=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# -- every engine test on every array backend ------------------------------------
# The modules in ENGINE_TESTS run once per backend (test ids end in [numpy],
# [strict], [cupy]). 'numpy' is the plain CPU run. 'strict' installs the CPU
# stand-in for CuPy (tinygrad_ckpt/testing/strict_cupy.py) as device 'cuda' and makes
# 'cuda' the default device, so every tensor the tests make lives there and any
# NumPy call on it inside the engine fails the test. 'cupy' does the same with
# real CuPy where a GPU is present; elsewhere it is left out, and the header of
# the run and tests/test_backends.py (one skipped test) say why. A test that
# only makes sense on some backends says so: @pytest.mark.backends("numpy").
import functools  # noqa: E402

import pytest  # noqa: E402

from tinygrad_ckpt import backend  # noqa: E402
from tinygrad_ckpt.testing import strict_cupy  # noqa: E402

ENGINE_TESTS = {
    "test_ops.py", "test_tape.py", "test_errors.py", "test_nn.py", "test_optim.py",
    "test_accumulate.py", "test_checkpoint.py", "test_checkpoint_semantics.py", "test_saved.py", "test_memory.py",
    "test_autograd.py",
}


@functools.lru_cache(maxsize=None)  # asked once, at collection, before any test installs a stand-in
def cupy_unavailable_reason():
    """None where device='cuda' can use CuPy and a GPU; else why not."""
    try:
        backend.module_for("cuda")  # imports CuPy and looks for a GPU, once
        return None
    except RuntimeError as e:
        return str(e)


def backends():
    return ("numpy", "strict") if cupy_unavailable_reason() else ("numpy", "strict", "cupy")


def pytest_configure(config):
    config.addinivalue_line("markers", "backends(*names): run this test only on these array backends")


def pytest_report_header(config):
    reason = cupy_unavailable_reason()
    return f"array backends: {', '.join(backends())}" + (f" (no CuPy run: {reason})" if reason else "")


def pytest_generate_tests(metafunc):
    if os.path.basename(metafunc.module.__file__) in ENGINE_TESTS:
        metafunc.parametrize("array_backend", backends(), indirect=True, scope="module")


@pytest.fixture(scope="module", autouse=True)
def array_backend(request):
    """Install the module's backend for its tests, and put things back after."""
    name = getattr(request, "param", "numpy")
    if name == "numpy":
        yield name
        return
    previous_module = backend.set_cuda_module(strict_cupy if name == "strict" else None)
    previous_device = backend.set_default_device("cuda")
    try:
        backend.module_for("cuda")  # 'cupy': import it again, now that the slot is empty
        yield name
    finally:
        backend.set_default_device(previous_device)
        backend.set_cuda_module(previous_module)


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("backends")
    callspec = getattr(item, "callspec", None)
    name = callspec.params.get("array_backend", "numpy") if callspec else "numpy"
    if marker is not None and name not in marker.args:
        pytest.skip(f"runs on the {', '.join(marker.args)} backend(s) only")
