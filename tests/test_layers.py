"""The package's floors hold: a module imports only from the floors below its own.

The floors are import-linter contracts in pyproject.toml (`lint-imports`
checks them; this test runs it). The one cycle they allow, tensor <-> ops
(the ops' records hand back Tensors, through function.py and tape.py), is
kept to imports inside functions, which the second test checks. So is the
one reach upwards the contracts allow: memory.Timeline's .plot() and
.to_html() draw with the instruments, importing them inside those two
methods only (the third test).
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


def test_memory_reaches_the_instruments_only_inside_the_timelines_drawing_methods():
    tree = ast.parse((PACKAGE / "memory.py").read_text(encoding="utf-8"))
    allowed = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Timeline"):
        for method in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in ("plot", "to_html")):
            allowed.update({id(n): method.name for n in ast.walk(method)})
    reaching = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("bench")]
    assert len(reaching) == 2, "memory.py imports the instruments in Timeline.plot and Timeline.to_html"
    for node in reaching:
        assert id(node) in allowed, f"memory.py line {node.lineno} imports the instruments outside Timeline.plot/to_html"
