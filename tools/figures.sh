#!/usr/bin/env bash
# Every committed picture, redrawn by the code that draws it: run this after a change that moves
# them, look at them, and commit them. About 20 minutes on 2 cores (the full bench is most of it).
#
#   bash tools/figures.sh        # in the clone, in the environment of `pip install -e ".[test]"`
#
# The explorer's screenshot needs Chromium (Debian: apt-get install chromium); the rest needs
# matplotlib and Plotly (the `test` extra brings both).
set -euo pipefail
cd "$(dirname "$0")/.."

python tutorials/harness.py              # tutorials/figures/*.png, as the tutorials draw them
python tools/import_graph.py             # tools/import_graph.png: the floors and the imports

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
tinygrad-ckpt bench --output-dir "$out/full"                  # benchmarks/figures/peak_memory.png
cp "$out/full/peak_memory.png" benchmarks/figures/
tinygrad-ckpt bench --quick --output-dir "$out/quick"         # timeline_w2.png and the explorer's page
cp "$out/quick/timeline_w2.png" benchmarks/figures/
python tools/explorer_screenshot.py "$out/quick" benchmarks/figures/memory_explorer.png
(cd "$out" && python "$OLDPWD/benchmarks/budget_tradeoff.py")   # tradeoff.png, into the current folder
cp "$out/tradeoff.png" benchmarks/figures/
git status --short -- tutorials/figures benchmarks/figures tools/import_graph.png
