"""An import-linter contract of this repository: the lab reaches no lesson name that begins with `_`.

The lab (bench/, fit/, meta, activations, testing/, the command line) watches the engine through
observe.py's Observer and the lesson's public names. Import-linter's own contract types see imports
between modules, not names, so this one reads each lab file's syntax tree: a lesson `_name` imported,
read or set on a lesson module or object, read on any object that the file does not define itself
(a Tensor's `_node`), or overridden by a class that extends a lesson class (a private method of
MemoryTracker) breaks it. pyproject.toml registers it (`contract_types`); `lint-imports` runs it, from
the repository's root (which import-linter puts on sys.path), and tests/test_layers.py tests it.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tinygrad_ckpt"
LAB = ("bench", "fit", "activations", "meta", "testing", "cli", "__main__")


def _is_private(name):
    return name.startswith("_") and not name.startswith("__")


def _module_parts(path):
    return list(path.relative_to(PACKAGE).with_suffix("").parts)


def _in_lab(path):
    return _module_parts(path)[0] in LAB


def lesson_private_names():
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


def private_uses(path, source, private):
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


def lab_files():
    return sorted(p for p in PACKAGE.rglob("*.py") if _in_lab(p))


def broken():
    """{lab file: [(line, what)]} for every lab file that reaches a lesson `_name`."""
    private = lesson_private_names()
    found = {str(p.relative_to(PACKAGE)): private_uses(p, p.read_text(encoding="utf-8"), private) for p in lab_files()}
    return {name: uses for name, uses in found.items() if uses}


try:
    from importlinter import Contract, ContractCheck, output
except ImportError:  # tests/test_layers.py uses the scan without import-linter
    Contract = object


class LabWatchesThroughObserve(Contract):
    """`type = "lab_private"` in pyproject.toml: no lab file reaches a lesson `_name`."""

    def check(self, graph, verbose):
        found = broken()
        return ContractCheck(kept=not found, metadata={"found": found})

    def render_broken_contract(self, check):
        for name, uses in check.metadata["found"].items():
            for line, what in uses:
                output.print_error(f"tinygrad_ckpt/{name}:{line}: {what}", bold=False)
        output.print("Watch the engine through observe.py's Observer, or give the lesson a public name for it.")
