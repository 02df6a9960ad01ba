"""Every `>>>` example in the package's docstrings runs and prints what it shows (doctest).

The modules are found by their text (a `>>>` in the file), so an example
added anywhere in the package is run here without being listed. Each
module's examples run in its own namespace, as `python -m doctest` would.
"""

import doctest
import importlib
import re
from pathlib import Path

import pytest

import tinygrad_ckpt

PACKAGE = Path(tinygrad_ckpt.__file__).parent
OPTIONAL = {"tinygrad_ckpt.bench.plots": "matplotlib"}  # modules that import an optional extra


def _module_name(path):
    parts = ("tinygrad_ckpt",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(_module_name(p) for p in PACKAGE.rglob("*.py") if ">>>" in p.read_text(encoding="utf-8"))


def _path(name):
    relative = Path(*name.split(".")[1:])
    return PACKAGE / relative.with_suffix(".py") if (PACKAGE / relative.with_suffix(".py")).exists() else (
        PACKAGE / relative / "__init__.py")


def test_the_examples_are_found():
    assert {"tinygrad_ckpt.tape", "tinygrad_ckpt.saved", "tinygrad_ckpt.ops.flops", "tinygrad_ckpt.fit"} <= set(MODULES)
    # fit.estimate_step's example is one that runs (it once showed an MLP call that no longer worked)
    fit = importlib.import_module("tinygrad_ckpt.fit")
    found = {t.name: len(t.examples) for t in doctest.DocTestFinder(exclude_empty=True).find(fit, "tinygrad_ckpt.fit")}
    assert found.get("tinygrad_ckpt.fit.estimate_step", 0) >= 3


@pytest.mark.parametrize("name", MODULES)
def test_every_prompt_in_a_module_is_an_example_doctest_runs(name):
    """Each `>>>` line in the file starts an example doctest finds: none sits where doctest cannot see it
    (a comment, a function defined inside another, an object imported from elsewhere)."""
    if name in OPTIONAL:
        pytest.importorskip(OPTIONAL[name], reason=f"{name} needs {OPTIONAL[name]}, not installed")
    prompts = len(re.findall(r"^\s*>>>", _path(name).read_text(encoding="utf-8"), re.MULTILINE))
    module = importlib.import_module(name)
    examples = sum(len(t.examples) for t in doctest.DocTestFinder(exclude_empty=True).find(module, name))
    assert examples == prompts, f"{name}: {prompts} '>>>' lines in the file, but doctest finds {examples} examples"


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    if name in OPTIONAL:
        pytest.importorskip(OPTIONAL[name], reason=f"{name} needs {OPTIONAL[name]}, not installed")
    module = importlib.import_module(name)
    tests = doctest.DocTestFinder(exclude_empty=True).find(module, name)
    assert sum(len(t.examples) for t in tests) > 0, f"{name} has '>>>' in its text but no example doctest can run"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    for test in tests:
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
