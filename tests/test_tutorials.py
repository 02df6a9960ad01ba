"""The tutorials' shape, and the harness that runs them.

The tutorials themselves are executed by pytest through tutorials/conftest.py
(every Python block run, every output block compared; see tutorials/harness.py).
Here: that the harness really catches drift, and that each tutorial has the
shape a learner relies on: it says what it teaches and assumes, ends with
exercises, opens as a notebook, is linked in order, and shows pictures that exist.
"""

import importlib.util
import re
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


def test_readmes_link_every_tutorial_in_order():
    for readme in (TUTORIALS / "README.md", ROOT / "README.md"):
        text = readme.read_text()
        links = [m for m in re.findall(r"\(((?:tutorials/)?\d\d_[^)]+\.md)\)", text)]
        names = [Path(link).name for link in links]
        assert names == [p.name for p in FILES], f"{readme.relative_to(ROOT)} links {names}"
