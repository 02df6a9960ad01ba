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


LAB = ("bench", "fit", "activations", "meta", "testing", "cli", "__main__")


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


# -- the lab watches the lesson through its public names alone ---------------------
def _is_private(name):
    return name.startswith("_") and not name.startswith("__")


def _module_parts(path):
    return list(path.relative_to(PACKAGE).with_suffix("").parts)


def _in_lab(path):
    return _module_parts(path)[0] in LAB


def _lesson_private_names():
    """Every `_name` the lesson defines: its private functions, classes and globals, and the attributes it sets."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        if not _in_lab(path):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names.add(node.id)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    names.add(node.attr)
    return {n for n in names if _is_private(n)}


def _root(node):
    """The name an attribute chain starts from (`memory` in memory.tracker._update_peak), or None."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _private_uses(path, source, private):
    """(line, what) for each lesson `_name` a lab module reaches: imported, read or set on a lesson
    module or object, read on any object (a Tensor's `_node`) unless the module defines that name itself,
    or overridden or set by a class that extends a lesson class (a private method of MemoryTracker)."""
    tree, package = ast.parse(source), _module_parts(path)[:-1]
    lesson, own, found = set(), set(), []  # names the imports bind to lesson modules and objects; own _names
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("tinygrad_ckpt")):
            target = ((package[:len(package) - node.level + 1] if node.level else [])
                      + (node.module.split(".")[0 if node.level else 1:] if node.module else []))
            for a in node.names:
                if (target[0] if target else a.name) not in LAB:
                    lesson.add(a.asname or a.name)
                    if _is_private(a.name):
                        found.append((node.lineno, f"imports {a.name}"))
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
            own.add(node.id if isinstance(node, ast.Name) else node.attr)
    extending = set()  # the nodes inside classes that extend a lesson class
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef) and any(_root(b) in lesson for b in cls.bases):
            for node in ast.walk(cls):
                extending.add(node)
                if isinstance(node, ast.FunctionDef) and node.name in private:
                    found.append((node.lineno, f"{cls.name} overrides {node.name}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "setattr", "hasattr") \
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
            obj, attr = node.args[0], node.args[1].value
        elif isinstance(node, ast.Attribute):
            obj, attr = node.value, node.attr
        else:
            continue
        if not isinstance(attr, str) or not _is_private(attr):
            continue
        root = _root(obj)
        if (root in lesson or (root in ("self", "cls") and node in extending and attr in private)
                or (root not in ("self", "cls") and attr in private and attr not in own)):
            found.append((node.lineno, f"uses {ast.unparse(obj)}.{attr}"))
    return sorted(set(found))


def test_private_uses_finds_each_way_in():
    probe = PACKAGE / "bench" / "probe.py"  # only its place matters: the source is given
    source = ("from ..memory import MemoryTracker, _Buffer\nfrom .. import memory\nfrom ..ops import flops\n"
              "class R(MemoryTracker):\n    def _update_peak(self):\n        self._made = []\n"
              "        self._mine = 1\n"
              "def f(t, o):\n    flops._size((2,))\n    memory.tracker._freed\n    t._node\n"
              "    getattr(t, '_version_counter')\n    o._own\n    o.__class__\n"
              "class Own:\n    def __init__(self):\n        self._own = 1\n")
    found = _private_uses(probe, source, {"_Buffer", "_update_peak", "_made", "_size", "_node",
                                          "_version_counter", "_freed"})
    assert found == [(1, "imports _Buffer"), (5, "R overrides _update_peak"), (6, "uses self._made"),
                     (9, "uses flops._size"), (10, "uses memory.tracker._freed"), (11, "uses t._node"),
                     (12, "uses t._version_counter")]


LAB_FILES = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if _in_lab(p))


@pytest.mark.parametrize("name", LAB_FILES)
def test_the_lab_reaches_no_private_name_of_the_lesson(name):
    """The lab watches the engine through observe.py and public names, never a lesson `_name`."""
    path = PACKAGE / name
    found = _private_uses(path, path.read_text(encoding="utf-8"), _lesson_private_names())
    assert not found, f"{name} reaches private names of the lesson (watch through observe.py's Observer, or " \
                      f"give the lesson a public name for it): {found}"
