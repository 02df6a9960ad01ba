"""The tutorials' shape, and the harness that runs them.

The tutorials themselves are executed by pytest through tutorials/conftest.py
(every Python block run, every output block compared; see tutorials/harness.py).
Here: that the harness really catches drift, and that each tutorial has the
shape a learner relies on: it says what it teaches and assumes, ends with
exercises, opens as a notebook, is linked in order, and shows pictures that exist.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = ROOT / "tutorials"
FILES = sorted(TUTORIALS.glob("[0-9][0-9]_*.md"))


def _load_harness():
    if "harness" not in sys.modules:
        spec = importlib.util.spec_from_file_location("harness", TUTORIALS / "harness.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["harness"] = module
    return sys.modules["harness"]


harness = _load_harness()


def _write(tmp_path, text):
    path = tmp_path / "99_example.md"
    path.write_text(text)
    return path


# -- the harness ------------------------------------------------------------------
def test_harness_passes_matching_output_and_fails_drifted_output(tmp_path):
    good = _write(tmp_path, "```python\nprint(6 * 7)\n```\n\n```output\n42\n```\n")
    harness.run(good)
    bad = _write(tmp_path, "```python\nprint(6 * 7)\n```\n\n```output\n43\n```\n")
    with pytest.raises(AssertionError, match="Expected:\n    43\nGot:\n    42"):
        harness.run(bad)


def test_harness_fails_a_block_that_prints_without_an_output_block(tmp_path):
    path = _write(tmp_path, "```python\nprint('hello')\n```\n\nText.\n\n```python\nx = 1\n```\n")
    with pytest.raises(AssertionError, match="no ```output block follows"):
        harness.run(path)
    last = _write(tmp_path, "```python\nprint('hello')\n```\n")
    with pytest.raises(AssertionError, match="no ```output block follows"):
        harness.run(last)  # caught at the end of the document too


def test_harness_timing_blocks_ignore_numbers_but_not_words(tmp_path):
    shown = "```python\nprint('slowdown: 1.31x over 5 runs')\n```\n\n```output timing\n{}\n```\n"
    harness.run(_write(tmp_path, shown.format("slowdown: 1.24x over 5 runs")))
    with pytest.raises(AssertionError):
        harness.run(_write(tmp_path, shown.format("speedup: 1.24x over 5 runs")))
    with pytest.raises(AssertionError):  # a plain output block does check numbers
        harness.run(_write(tmp_path, shown.format("slowdown: 1.24x over 5 runs").replace(" timing", "")))


def test_harness_ellipsis_and_blocks_share_one_namespace(tmp_path):
    text = "```python\nx = [1, 2, 3]\n```\n\n```python\nprint(x, 'and more text')\n```\n\n```output\n[1, 2, 3] ...\n```\n"
    harness.run(_write(tmp_path, text))


def test_leading_spaces_are_part_of_the_output(tmp_path):
    # A right-aligned table: every line starts with spaces, which must be kept
    # (not dedented) both when checking and when refreshing.
    text = "```python\nprint('  42')\nprint(' 7')\n```\n\n```output\n{}```\n\nEnd.\n"
    harness.run(_write(tmp_path, text.format("  42\n 7\n")))
    with pytest.raises(AssertionError):
        harness.run(_write(tmp_path, text.format("42\n7\n")))
    path = _write(tmp_path, text.format("  100\n  200\n  300\n"))
    harness.run(path, refresh=True)
    assert path.read_text() == text.format("  42\n 7\n")


def test_refresh_rewrites_outputs_and_adds_missing_ones(tmp_path):
    path = _write(tmp_path, "# T\n\n```python\nprint(6 * 7)\n```\n\n```output\nold\n```\n\n```python\nprint('new')\n```\n\nEnd.\n")
    harness.run(path, refresh=True)
    text = path.read_text()
    assert "```output\n42\n```" in text and "old" not in text
    assert "print('new')\n```\n\n```output\nnew\n```\n\nEnd." in text
    harness.run(path)  # and the refreshed file now passes


def test_notebook_check_compares_what_jupyter_printed_with_the_text(tmp_path):
    jupytext = pytest.importorskip("jupytext")
    nbformat = pytest.importorskip("nbformat")
    text = ("```python\nON_GPU = False\nprint(6 * 7)\n```\n\n```output\n42\n```\n\n"
            "<!-- skip: start if(not ON_GPU, reason='no GPU') -->\n\n```python\nprint('on a GPU')\n```\n\n"
            "```output\non a GPU\n```\n\n<!-- skip: end -->\n\n```python\nx = 1\n```\n")
    source = tmp_path / "99_example.md"
    source.write_text(text)

    def ran(*printed, error=None):
        notebook = jupytext.reads(text, fmt="md")
        for n, (cell, out) in enumerate(zip([c for c in notebook.cells if c.cell_type == "code"], printed), start=1):
            cell.execution_count = n
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=out)] if out else []
        if error:
            cell.outputs.append(nbformat.v4.new_output("error", ename=error, evalue="boom", traceback=[]))
        path = tmp_path / "99_example.ipynb"
        nbformat.write(notebook, path)
        return path

    assert harness.check_notebook(ran("42\n", "on a GPU\n", "")) == 3
    assert harness.check_notebook(ran("42\n", "skipped: no GPU here\n", "")) == 3  # a guarded block may skip
    with pytest.raises(AssertionError, match=r"(?s)cell 1 .*Expected:\n    42\nGot:\n    43"):
        harness.check_notebook(ran("43\n", "on a GPU\n", ""))
    with pytest.raises(AssertionError, match=r"(?s)cell 1 .*Got:\n    skipped"):  # only a guarded block may skip
        harness.check_notebook(ran("skipped: why not\n", "on a GPU\n", ""))
    with pytest.raises(AssertionError, match=r"cell 3 .* raised NameError: boom"):
        harness.check_notebook(ran("42\n", "on a GPU\n", "", error="NameError"))
    with pytest.raises(AssertionError, match=r"(?s)cell 3 .*Expected:\n    \(nothing\)"):  # printed, with no output block
        harness.check_notebook(ran("42\n", "on a GPU\n", "surprise\n"))


def _harness_command(*args, cwd=ROOT):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, str(TUTORIALS / "harness.py"), *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=cwd, env=env)


def test_harness_help_prints_usage_and_no_traceback():
    for flag in ("--help", "-h"):
        ran = _harness_command(flag)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.startswith("usage: python tutorials/harness.py") and "--notebook" in ran.stdout
        assert "Traceback" not in ran.stdout + ran.stderr
    ran = _harness_command("--no-such-option")
    assert ran.returncode == 2 and "unknown option --no-such-option" in ran.stderr and "Traceback" not in ran.stderr


def test_harness_says_how_many_blocks_were_checked_and_that_they_passed(tmp_path):
    text = ("```python\nprint(6 * 7)\n```\n\n```output\n42\n```\n\n```python\nx = 1\n```\n\n"
            "<!-- skip: start if(True, reason='never here') -->\n\n```python\nprint('elsewhere')\n```\n\n"
            "```output\nelsewhere\n```\n\n<!-- skip: end -->\n")
    good = _write(tmp_path, text)
    counts = {}
    harness.run(good, workdir=None, counts=counts)
    assert counts == {"python": 2, "output": 1, "skipped": 2}
    ran = _harness_command(good)
    assert ran.returncode == 0, ran.stderr
    assert "99_example.md" in ran.stdout
    assert "2 Python blocks run,   1 output blocks checked: all as the text shows, 2 skipped" in ran.stdout
    bad = tmp_path / "98_example.md"
    bad.write_text(text.replace("42", "43"))
    ran = _harness_command(bad)
    assert ran.returncode == 1 and "98_example.md" in ran.stdout and "FAILED" in ran.stdout
    assert "Expected:\n    43\nGot:\n    42" in ran.stdout and "all as the text shows" not in ran.stdout


_AS_IN_A_NOTEBOOK = """
import contextlib, io, json, linecache, sys
blocks, namespace, printed = json.loads(sys.argv[1]), {}, []
for n, code in enumerate(blocks, start=1):
    name = f"/tmp/ipykernel_0/{n}.py"   # where IPython says a cell's code lies
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)   # as IPython registers it
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, name, "exec"), namespace)
    printed.append(out.getvalue())
print(json.dumps(printed))
"""


def test_tutorial_1_passes_the_notebook_check(tmp_path):
    """Run as Jupyter runs it (each cell a file of its own, not the .md), tutorial 1 prints what its text shows."""
    jupytext = pytest.importorskip("jupytext")
    nbformat = pytest.importorskip("nbformat")
    source = TUTORIALS / "01_the_tape.md"
    blocks = harness._python_blocks(source.read_text())
    ran = subprocess.run([sys.executable, "-c", _AS_IN_A_NOTEBOOK, json.dumps([code for code, _, _ in blocks])],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    printed = json.loads(ran.stdout.strip().splitlines()[-1])
    notebook = jupytext.reads(source.read_text(), fmt="md")
    for n, (cell, out) in enumerate(zip([c for c in notebook.cells if c.cell_type == "code"], printed), start=1):
        cell.execution_count = n
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=out)] if out else []
    (tmp_path / source.name).write_text(source.read_text())
    nbformat.write(notebook, tmp_path / "01_the_tape.ipynb")
    assert harness.check_notebook(tmp_path / "01_the_tape.ipynb") == len(blocks)


# -- the tutorials' shape -----------------------------------------------------------
def test_tutorials_are_numbered_from_one_without_gaps():
    assert FILES, "no tutorials found in tutorials/"
    assert [int(p.name[:2]) for p in FILES] == list(range(1, len(FILES) + 1))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_tutorial_opens_with_goals_and_assumptions_and_ends_with_exercises(path):
    text = path.read_text()
    head = text[:1500]
    assert text.startswith(f"# {int(path.name[:2])}. "), "title must be '# N. ...'"
    assert "**At the end you will know**" in head and "**It assumes**" in head
    sections = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert sections[-1] == "Exercises", f"last section is {sections[-1]!r}"
    exercises = re.findall(r"^\d+\. ", text.split("\n## Exercises\n")[1], re.MULTILINE)
    assert 2 <= len(exercises) <= 3, f"{len(exercises)} exercises"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_tutorial_opens_as_a_notebook_with_one_code_cell_per_python_block(path):
    jupytext = pytest.importorskip("jupytext")
    nbformat = pytest.importorskip("nbformat")
    text = path.read_text()
    notebook = jupytext.reads(text, fmt="md")
    nbformat.validate(notebook)
    code = [c.source for c in notebook.cells if c.cell_type == "code"]
    blocks = re.findall(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    assert code == [b.rstrip("\n") for b in blocks]
    # Outputs stay in the text cells, so every code cell runs as it is.
    assert all("```output" not in c for c in code)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_tutorial_pictures_exist(path):
    for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", path.read_text()):
        assert (TUTORIALS / target).is_file(), f"{path.name} shows {target}, which does not exist"


def test_every_picture_is_shown_by_some_tutorial():
    shown = set()
    for path in FILES:
        shown.update(re.findall(r"!\[[^\]]*\]\((figures/[^)]+)\)", path.read_text()))
    on_disk = {f"figures/{p.name}" for p in (TUTORIALS / "figures").glob("*.png")}
    assert on_disk <= shown, f"pictures no tutorial shows: {sorted(on_disk - shown)}"


SOLUTION = re.compile(r"^<details><summary>Solution</summary>\n(.*?)^</details>$", re.MULTILINE | re.DOTALL)
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def _exercises(text):
    """Each numbered item of the Exercises section, with what follows it up to the next item."""
    return re.split(r"(?m)^(?=\d+\. )", text.split("\n## Exercises\n", 1)[1])[1:]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_exercise_is_followed_by_a_worked_solution_in_a_fold(path):
    """Right after each exercise's text: <details><summary>Solution</summary>, with code the harness runs."""
    text = path.read_text()
    exercises = _exercises(text)
    assert exercises, f"{path.name} has no numbered exercises"
    for n, item in enumerate(exercises, start=1):
        folds = SOLUTION.findall(item)
        assert len(folds) == 1, (f"{path.name}, exercise {n}: {len(folds)} solution folds after its text; want one "
                                 "'<details><summary>Solution</summary>' ... '</details>', each on a line of its own")
        assert PYTHON_BLOCK.search(folds[0]), f"{path.name}, exercise {n}: its solution has no ```python block to run"
        assert not item.split("<details>")[0].count("```"), f"{path.name}, exercise {n}: code before its fold"


def test_exercise_solutions_in_folds_are_run_and_checked(tmp_path):
    """A fenced block inside <details> is a block like any other: run, and its output compared."""
    text = ("# T\n\n## Exercises\n\n1. Multiply.\n\n<details><summary>Solution</summary>\n\n"
            "```python\nprint(6 * 7)\n```\n\n```output\n{}\n```\n\n</details>\n")
    harness.run(_write(tmp_path, text.format(42)))
    with pytest.raises(AssertionError, match="Expected:\n    43\nGot:\n    42"):
        harness.run(_write(tmp_path, text.format(43)))
    missing = _write(tmp_path, "# T\n\n## Exercises\n\n1. Multiply.\n\n2. Divide.\n\n" + text.split("1. Multiply.\n\n")[1])
    assert [bool(SOLUTION.findall(item)) for item in _exercises(missing.read_text())] == [False, True]


def test_readmes_link_every_tutorial_in_order():
    for readme in (TUTORIALS / "README.md", ROOT / "README.md"):
        text = readme.read_text()
        links = [m for m in re.findall(r"\(((?:tutorials/)?\d\d_[^)]+\.md)\)", text)]
        names = [Path(link).name for link in links]
        assert names == [p.name for p in FILES], f"{readme.relative_to(ROOT)} links {names}"


# -- what one tutorial leaves behind -------------------------------------------------------
# Runs tutorials with the harness in a fresh process, in the order given, in scratch folders;
# writes what each output block was compared with, and the bytes memory.py still counted
# after each tutorial. With "--no-gc", Python's cycle collector is off: only reference
# counting frees, so whatever a finished tutorial left counted is held by something.
_DRIVER = """
import gc, json, sys
sys.path.insert(0, sys.argv[1])
import harness
from tinygrad_ckpt import memory
out, collect, paths = sys.argv[2], sys.argv[3] == "--gc", sys.argv[4:]
if not collect:
    gc.disable()
found = {}
for path in paths:
    printed = []
    harness.run(path, workdir=None, record=printed)
    found[path] = {"printed": printed, "left": memory.current()}
with open(out, "w") as f:
    json.dump(found, f)
"""
MEMORY_FIGURE = re.compile(r"-?\d[\d,]*(?:\.\d+)?\s?(?:B|KiB|MiB|GiB|bytes)\b")


def _run_tutorials(tmp_path, paths, collect):
    out = tmp_path / f"run-{len(list(tmp_path.iterdir()))}.json"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1")}
    run = subprocess.run([sys.executable, "-c", _DRIVER, str(TUTORIALS), str(out), "--gc" if collect else "--no-gc",
                          *map(str, paths)], capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(out.read_text())


def test_tutorials_print_the_same_memory_figures_alone_and_after_the_others(tmp_path):
    """All of them in one process, in order, against each one alone: every memory figure printed is the same.

    The run in order has the cycle collector off, so it also shows that a
    tutorial leaves nothing counted behind it (the harness empties its
    namespace, which a reference cycle holds), and that no tutorial's figures
    wait for the collector. Both runs check every exact output block against
    the text, so those figures are the text's in both; the tutorials run alone
    here are those that print memory figures in timing blocks (the Trainer's
    log lines), whose numbers the text does not pin.
    """
    together = _run_tutorials(tmp_path, FILES, collect=False)
    for path in FILES:
        left = together[str(path)]["left"]
        assert not any(left.values()), f"after {path.name}, memory.py still counts {left}"
    printed = [text for path in FILES for _, text in together[str(path)]["printed"]]
    assert sum(len(MEMORY_FIGURE.findall(text)) for text in printed) > 50  # the tutorials do print memory
    unpinned = [path for path in FILES if any(kind.endswith("timing") and MEMORY_FIGURE.search(text)
                                              for kind, text in together[str(path)]["printed"])]
    assert unpinned, "no memory figure in a timing block: then the text pins them all, and this part checks nothing"
    for path in unpinned:
        alone = _run_tutorials(tmp_path, [path], collect=True)[str(path)]["printed"]
        after = together[str(path)]["printed"]
        assert len(alone) == len(after)
        for block, ((_, a), (_, b)) in enumerate(zip(alone, after)):
            assert MEMORY_FIGURE.findall(a) == MEMORY_FIGURE.findall(b), (
                f"{path.name}, output block {block + 1}: alone it printed\n{a}\nafter the others\n{b}")


# -- blocks that need a GPU or MPI run anywhere --------------------------------------------------
_PASTED = """
import contextlib, io, json, os, sys
sys.modules["cupy"] = None       # as on a machine without CuPy ...
sys.modules["mpi4py"] = None     # ... and without mpi4py: `import` of either fails
os.environ["MPLBACKEND"] = "Agg"
blocks, namespace, printed = json.loads(sys.argv[1]), {}, []
for code in blocks:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<pasted>", "exec"), namespace)
    printed.append(out.getvalue())
print(json.dumps(printed))
"""


GUARDED = [p for p in FILES if any(skippable for _, _, skippable in harness._python_blocks(p.read_text()))]


def test_the_gpu_and_mpi_tutorials_have_guarded_blocks():
    assert {"07_on_a_gpu.md", "08_data_parallel.md", "13_when_one_gpu_is_not_enough.md"} <= {p.name for p in GUARDED}


@pytest.mark.parametrize("path", GUARDED, ids=lambda p: p.name)
def test_every_block_runs_as_pasted_without_a_gpu_or_mpi(path, tmp_path):
    """No Sybil, no skip comments: the blocks one after the other, as a notebook runs them.

    A block that needs what is missing says "skipped: ..." in its own code;
    every block between skip comments does (and only those may skip).
    """
    blocks = harness._python_blocks(path.read_text())
    run = subprocess.run([sys.executable, "-c", _PASTED, json.dumps([code for code, _, _ in blocks])],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    printed = json.loads(run.stdout.strip().splitlines()[-1])
    for (code, _, skippable), text in zip(blocks, printed):
        if skippable:
            assert text.startswith("skipped: ") and 'pip install -e ".[' in text, (code[:200], text)
        else:
            assert "skipped" not in text, code[:200]


@pytest.mark.parametrize("name", ["03_where_memory_goes.md", "04_gradient_accumulation.md"])
def test_memory_pictures_take_their_colours_from_the_palette(name):
    code = "".join(code for code, _, _ in harness._python_blocks((TUTORIALS / name).read_text()))
    assert "from tinygrad_ckpt.bench.palette import CATEGORY_COLOURS" in code
    assert not re.findall(r"#[0-9A-Fa-f]{6}\b", code)  # no colour spelled out by hand
