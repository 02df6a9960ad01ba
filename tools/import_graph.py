"""Draw the package's floors and the imports between its modules: tools/import_graph.png.

    python tools/import_graph.py          # Python 3.11+ (tomllib); grimp (with import-linter), matplotlib

The floors are read from the import-linter contract in pyproject.toml (the
one the tests check), the imports from the source by grimp, the graph
builder import-linter uses: nothing in the picture is drawn by hand. Each
module or subpackage of tinygrad_ckpt is a box on its floor; an arrow goes
from a module to each one it imports, gray when it goes down, red and
dashed for the imports the contract lets go up, all function-local (the
tensor <-> ops cycle, the only one). The README links the picture.
"""

import re
import sys
import tomllib
from pathlib import Path

import grimp
import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "tinygrad_ckpt"


def floors():
    """[[module, ...] per floor, top first] and the ignored imports, from pyproject.toml's 'floors' contract."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c.get("id") == "floors")
    layers = [[name.strip() for name in re.split(r"[|:]", layer)] for layer in contract["layers"]]
    layers = [[m for m in layer if m != "__main__"] for layer in layers]  # `python -m`: one line, nothing to see
    ignored = {tuple(part.strip().removeprefix(PACKAGE + ".").split(".")[0] for part in rule.split("->"))
               for rule in contract.get("ignore_imports", [])}  # a subpackage's module: the subpackage
    return [layer for layer in layers if layer], ignored


def imports(names):
    """{(importer, imported)} between the top-level modules `names` (a subpackage stands for its modules)."""
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph(PACKAGE)
    edges = set()
    for module in graph.modules:
        a = module.removeprefix(PACKAGE + ".").split(".")[0]
        for imported in graph.find_modules_directly_imported_by(module):
            b = imported.removeprefix(PACKAGE + ".").split(".")[0]
            if a != b and a in names and b in names:
                edges.add((a, b))
    return edges


def draw(layers, edges, ignored, path):
    position = {}
    for row, layer in enumerate(layers):
        for col, name in enumerate(layer):
            position[name] = ((col + 0.5) / len(layer), len(layers) - 1 - row)
    fig, ax = plt.subplots(figsize=(11, 0.62 * len(layers) + 0.6))
    for a, b in sorted(edges):
        (x0, y0), (x1, y1) = position[a], position[b]
        up = y1 > y0  # only the imports the contract ignores may go up
        step = 0.2 if up else -0.2
        ax.annotate("", xy=(x1, y1 - step), xytext=(x0, y0 + step),
                    arrowprops=dict(arrowstyle="-|>", lw=1.3 if up else 0.6, color="#c0392b" if up else "#8a8a8a",
                                    alpha=1.0 if up else 0.55, ls="--" if up else "-", shrinkA=0, shrinkB=0,
                                    connectionstyle="arc3,rad=-0.45" if up else "arc3,rad=0.0"))
        assert not up or (a, b) in ignored, f"{a} imports {b}, a floor above it: lint-imports should have failed"
    for name, (x, y) in position.items():
        ax.text(x, y, name, ha="center", va="center", fontsize=9, family="monospace",
                bbox=dict(boxstyle="round,pad=0.3", fc="#eef3fa", ec="#4c72b0", lw=0.8))
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.6, len(layers) - 0.4)
    ax.axis("off")
    ax.set_title(f"{PACKAGE}: floors (top to bottom) and imports, from pyproject.toml and the source", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    layers, ignored = floors()
    names = {name for layer in layers for name in layer}
    path = ROOT / "tools" / "import_graph.png"
    draw(layers, imports(names), ignored, path)
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
