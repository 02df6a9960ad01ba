"""The package's floors hold: a module imports only from the floors below its own.

The floors are import-linter contracts in pyproject.toml (`lint-imports`
checks them; this test runs it). The one cycle they allow, tensor <-> ops
(the ops' records hand back Tensors, through function.py and tape.py), is
kept to imports inside functions, which the second test checks.
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
