"""Every `>>>` example in the package's docstrings runs and prints what it shows (doctest).

The modules are found by their text (a `>>>` in the file), so an example
added anywhere in the package is run here without being listed. Each
module's examples run in its own namespace, as `python -m doctest` would.
And no docstring shows an example any other way: an indented code sketch
(which nothing runs, so nothing keeps it true) fails the last test below.
"""

import doctest
import importlib
import re
from pathlib import Path

import pytest

import tinygrad_ckpt

PACKAGE = Path(tinygrad_ckpt.__file__).parent
OPTIONAL = {"tinygrad_ckpt.bench.plots": "matplotlib", "tinygrad_ckpt.bench.explorer": "plotly"}  # modules that import an optional extra


def _module_name(path):
    parts = ("tinygrad_ckpt",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(_module_name(p) for p in PACKAGE.rglob("*.py") if ">>>" in p.read_text(encoding="utf-8"))


def _path(name):
    relative = Path(*name.split(".")[1:])
    return PACKAGE / relative.with_suffix(".py") if (PACKAGE / relative.with_suffix(".py")).exists() else (
        PACKAGE / relative / "__init__.py")


def test_the_examples_are_found():
    assert {"tinygrad_ckpt.tape", "tinygrad_ckpt.saved", "tinygrad_ckpt.ops.flops", "tinygrad_ckpt.fit",
            "tinygrad_ckpt.checkpoint", "tinygrad_ckpt.accumulate", "tinygrad_ckpt.train"} <= set(MODULES)
    # fit.estimate_step's example is one that runs (it once showed an MLP call that no longer worked)
    step = importlib.import_module("tinygrad_ckpt.fit.step")
    found = {t.name: len(t.examples) for t in doctest.DocTestFinder(exclude_empty=True).find(step, "tinygrad_ckpt.fit.step")}
    assert found.get("tinygrad_ckpt.fit.step.estimate_step", 0) >= 3


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


# --- An example in a docstring is a doctest, not an indented sketch that never runs ---------------------------------
#
# A docstring line is a code-like example when it is indented at least 4 spaces beyond the docstring's body, is not
# part of a `>>>` example, and is a Python statement a reader would type: an import; a block header (`for`, `with`,
# `while`, `if`, `def`, `class`, ending in `:`); or a statement that calls a method (`loss.backward()`) or one of the
# package's own public functions and classes (`checkpoint(block, x)`). Prose never parses as Python; an argument
# list (`x: the input, (B, T)`) does not either; a formula (`p = p - lr * m / (sqrt(v) + eps)`) calls no method and
# no package function. Names of the CuPy stand-in (testing/strict_cupy.py: `sqrt`, `exp`, ...) are NumPy's, not ours.

import ast  # noqa: E402
import textwrap  # noqa: E402

HEADER = re.compile(r"(for|with|while|if|elif|def|class)\b")
# (file relative to the package, object whose docstring it is): why its indented code stays a sketch, not a doctest
SKETCHES = {
    ("distributed.py", "DataParallel"): "it needs N processes started by `mpiexec -n N` (MPI's COMM_WORLD); "
                                        "tests/test_distributed.py runs it so, through tests/mpi_worker.py",
}


def _public_names():
    names = set()
    for path in PACKAGE.rglob("*.py"):
        if path.name == "strict_cupy.py":
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                names.add(node.name)
    return names


PUBLIC = _public_names()


def _is_code_statement(node):
    """An import, a block statement, or a statement that calls a method or one of the package's functions."""
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.For, ast.With, ast.While, ast.If, ast.FunctionDef,
                         ast.ClassDef)):
        return True
    return any(isinstance(n, ast.Call) and (isinstance(n.func, ast.Attribute)
                                          or (isinstance(n.func, ast.Name) and n.func.id in PUBLIC))
               for n in ast.walk(node))


def _is_code(line):
    """Is this stripped docstring line, read alone, a Python statement used as an example?"""
    if HEADER.match(line):  # a block's first line: `with autocast("float16"):`
        try:
            ast.parse(line + "\n    pass")
            return True
        except SyntaxError:
            return False
    try:
        body = ast.parse(line).body
    except SyntaxError:
        return False
    return len(body) == 1 and _is_code_statement(body[0])


def _code_in(block):
    """The code-like lines of one indented block: read whole if it parses (a call over two lines), else line by line."""
    try:
        body = ast.parse(textwrap.dedent("\n".join(block))).body
    except SyntaxError:
        return [line.strip() for line in block if _is_code(line.strip())]
    return [block[node.lineno - 1].strip() for node in body if _is_code_statement(node)]


def _sketches(text):
    """The code-like lines of one cleaned docstring that sit outside its `>>>` examples."""
    found, block, in_example = [], [], False
    for line in text.splitlines() + [""]:
        stripped = line.strip()
        indented = len(line) - len(line.lstrip()) >= 4
        if block and not (stripped and indented and not stripped.startswith(">>>")):
            found += _code_in(block)
            block = []
        if stripped.startswith(">>>"):
            in_example = True
        elif not stripped:
            in_example = False
        elif not in_example and indented:
            block.append(line)
    return found


def _docstrings(path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=True)
            if text:
                yield getattr(node, "name", "<module>"), text


def test_the_sketch_rule_tells_code_from_prose():
    assert _sketches("Use it so:\n\n    y = checkpoint(block, x)\n    loss.backward()\n") == [
        "y = checkpoint(block, x)", "loss.backward()"]
    assert _sketches("Use it so:\n\n    with autocast('float16'):  # here\n        pass\n")[0].startswith("with")
    assert _sketches("Import:\n\n    from tinygrad_ckpt import meta\n") == ["from tinygrad_ckpt import meta"]
    two_lines = "So:\n\n    args = TrainingArguments(max_steps=2,\n                             output_dir='out')\n"
    assert _sketches(two_lines) == ["args = TrainingArguments(max_steps=2,"]
    assert _sketches(">>> with no_grad():\n...     y = f(x)\n>>> y.shape\n(2, 3)\n") == []
    prose = ("Args:\n    x: the input, (B, T)\n    reduction (str): \"sum\" or \"mean\"\n"
             "Wrapped:\n    with no slot; the planner below what one level reaches,\n"
             "    p = p - lr * m / (sqrt(v) + eps)\n    out = weight (G, K) @ cols   (N, G, L)\n"
             "    (StepMemory.device_peak_bytes);\nRun:\n\n    python -m tinygrad_ckpt train --max-steps 3\n")
    assert _sketches(prose) == []


FILES = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("relative", FILES)
def test_no_docstring_shows_code_that_does_not_run(relative):
    """An example a reader copies is one the tests ran: usage is shown as `>>>`, a shell command as prose."""
    stale = [f"{name}: {line}" for name, text in _docstrings(PACKAGE / relative)
             if (relative, name) not in SKETCHES for line in _sketches(text)]
    assert not stale, (f"{relative}: indented code in a docstring that no test runs; write it as a `>>>` example "
                       "(or, if it cannot run here, add it to SKETCHES with the reason):\n  " + "\n  ".join(stale))
