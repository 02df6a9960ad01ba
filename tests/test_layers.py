"""The package's floors hold: a module imports only from the floors below its own.

The floors are import-linter contracts in pyproject.toml (`lint-imports`
checks them; this test runs it). The one cycle they allow, tensor <-> ops
(the ops' records hand back Tensors, through function.py and tape.py), is
kept to imports inside functions, which the second test checks. The lab
(bench/, fit, meta, activations, testing/, the command line) imports
the lesson, never the reverse, not even inside a function (the third test),
and watches it through observe.py alone: it reaches no lesson name that
begins with `_` (the last tests).
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tools import lab_contract

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tinygrad_ckpt"


def test_every_module_imports_only_from_the_floors_below_it():
    pytest.importorskip("importlinter", reason="import-linter is not installed (pip install -e '.[test]')")
    run = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()",
         "--config", str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def _imports_tensor(node):
    if isinstance(node, ast.ImportFrom) and node.level == 1:
        return node.module == "tensor" or (node.module is None and any(a.name == "tensor" for a in node.names))
    return isinstance(node, ast.Import) and any(a.name == "tinygrad_ckpt.tensor" for a in node.names)


@pytest.mark.parametrize("name", ["tape.py", "function.py"])
def test_the_engine_cycle_stays_inside_functions(name):
    tree = ast.parse((PACKAGE / name).read_text(encoding="utf-8"))
    module_level = [node for node in tree.body if _imports_tensor(node)]
    assert not module_level, f"{name} imports tensor at module level (line {module_level[0].lineno}): import it inside the function that needs it"


LAB = lab_contract.LAB


def _lab_imports(path):
    """(line, lab module) for each import of the lab in this module, at any depth (inside functions too)."""
    package = list(path.relative_to(PACKAGE).parts[:-1])  # [] for a top-level module, ["nn"] for nn/*.py
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:  # from . import x, from ..bench import y
            target = package[:len(package) - node.level + 1] + (node.module.split(".") if node.module else [])
            tops = [target[0]] if target else [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tinygrad_ckpt"):
            target = node.module.split(".")[1:]
            tops = [target[0]] if target else [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            tops = [a.name.split(".")[1] for a in node.names if a.name.startswith("tinygrad_ckpt.")]
        else:
            continue
        found += [(node.lineno, top) for top in tops if top in LAB]
    return found


def test_lab_imports_finds_them_at_any_depth(tmp_path):
    (tmp_path / "nn").mkdir()
    probe = tmp_path / "nn" / "probe.py"
    probe.write_text("from ..tensor import Tensor\ndef f():\n    from ..bench.plots import plot_timeline\n"
                     "    from .. import fit\n    import tinygrad_ckpt.testing.verify\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path
    try:
        assert _lab_imports(probe) == [(3, "bench"), (4, "fit"), (5, "testing")]
    finally:
        PACKAGE = saved


def test_the_lesson_never_imports_the_lab():
    lesson = [p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0].removesuffix(".py") not in LAB]
    assert len(lesson) > 30
    reaching = {str(p.relative_to(PACKAGE)): found for p in lesson if (found := _lab_imports(p))}
    assert not reaching, f"the lesson imports the lab (the lab imports the lesson, never the reverse): {reaching}"


# -- the lab watches the lesson through its public names alone (tools/lab_contract.py) -------
def test_private_uses_finds_each_way_in():
    probe = PACKAGE / "bench" / "probe.py"  # only its place matters: the source is given
    source = ("from ..memory import MemoryTracker, _Buffer\nfrom .. import memory\nfrom ..ops import flops\n"
              "class R(MemoryTracker):\n    def _update_peak(self):\n        self._made = []\n"
              "        self._mine = 1\n"
              "def f(t, o):\n    flops._size((2,))\n    memory.tracker._freed\n    t._node\n"
              "    getattr(t, '_version_counter')\n    o._own\n    o.__class__\n"
              "class Own:\n    def __init__(self):\n        self._own = 1\n")
    found = lab_contract.private_uses(probe, source, {"_Buffer", "_update_peak", "_made", "_size", "_node",
                                          "_version_counter", "_freed"})
    assert found == [(1, "imports _Buffer"), (5, "R overrides _update_peak"), (6, "uses self._made"),
                     (9, "uses flops._size"), (10, "uses memory.tracker._freed"), (11, "uses t._node"),
                     (12, "uses t._version_counter")]


LAB_FILES = [str(p.relative_to(PACKAGE)) for p in lab_contract.lab_files()]


@pytest.mark.parametrize("name", LAB_FILES)
def test_the_lab_reaches_no_private_name_of_the_lesson(name):
    """The lab watches the engine through observe.py and public names, never a lesson `_name`."""
    path = PACKAGE / name
    found = lab_contract.private_uses(path, path.read_text(encoding="utf-8"), lab_contract.lesson_private_names())
    assert not found, f"{name} reaches private names of the lesson (watch through observe.py's Observer, or " \
                      f"give the lesson a public name for it): {found}"
