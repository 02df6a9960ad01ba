"""Shared test setup: hypothesis profiles, the `equivalence` marker, every engine test on every backend.

The profiles (HYPOTHESIS_PROFILE=ci|dev|thorough; tests/README.md's table of
them says when to use which): `ci`, the default, is derandomized and
small, so a run is repeatable and fast; `dev` and `thorough` draw fresh
random examples, about 13 and 200 times as many. A test that pins its own
count, `@settings(max_examples=examples(8))`, is scaled the same way.
"""

import os

from hypothesis import HealthCheck, settings

CI_EXAMPLES = 15
settings.register_profile(
    "ci", max_examples=CI_EXAMPLES, derandomize=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "thorough", max_examples=3000, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def examples(n):
    """n examples under the ci profile, as many times more as the loaded profile draws (dev, thorough)."""
    return max(n, round(n * settings.default.max_examples / CI_EXAMPLES))


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
    "test_ops.py", "test_axes.py", "test_tape.py", "test_errors.py", "test_nn.py", "test_optim.py",
    "test_accumulate.py", "test_checkpoint.py", "test_checkpoint_semantics.py", "test_saved.py", "test_memory.py",
    "test_autograd.py", "test_equivalence.py", "test_lstm.py", "test_encoder.py", "test_layer_options.py",
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
    config.addinivalue_line("markers", "equivalence: proves that checkpointed or accumulated gradients equal the "
                                       "plain ones (python -m pytest -m equivalence runs exactly these)")


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


# -- one run of the bench, for the tests that read what it writes -------------------
@pytest.fixture(scope="session")
def tiny_bench_run(tmp_path_factory):
    """`tinygrad-ckpt bench --tiny`, run once: (exit code, its output folder, bench.json loaded)."""
    import json

    from tinygrad_ckpt import cli

    out = tmp_path_factory.mktemp("bench")
    umask = os.umask(0o022)  # the usual umask: files anyone may read, only the owner write
    try:
        code = cli.main(["bench", "--tiny", "--output-dir", str(out)])
    finally:
        os.umask(umask)
    with open(out / "bench.json") as f:
        return code, out, json.load(f)
