"""How a tutorial is run and checked: its Python blocks executed in order, its printed output compared.

A tutorial is a Markdown file. Three kinds of fenced block matter here:

    ```python            executed, top to bottom, all blocks of a file in one namespace
    ```output            what the Python block just above printed; checked exactly
                         (trailing spaces ignored; '...' matches anything, as in doctest)
    ```output timing     the same, but numbers may differ: timings are shown, never asserted

A Python block that prints something must be followed by an output block, so
nothing printed goes unchecked, and no number in the text can drift from the
code. Everything else (prose, pictures, other blocks) is left alone.

Blocks that can only run on some machines sit between Sybil's skip comments,
which do not show on a code-hosting site:

    <!-- skip: start if(not ON_GPU, reason="needs CuPy and an NVIDIA GPU") -->
    ...
    <!-- skip: end -->

Used in two ways:

    python -m pytest                          # tutorials/conftest.py hands this to pytest (via Sybil)
    python tutorials/harness.py [FILE ...]    # run tutorials, print how long each took
    python tutorials/harness.py --refresh FILE  # rewrite FILE's output blocks from a real run
                                              # (and add the missing ones): how authors write them

Run directly, each tutorial runs with tutorials/ as its working directory, as
it does when opened as a notebook there, so it writes its pictures to
figures/ (commit them). Under pytest it runs in a scratch folder instead, so a
test run leaves the committed pictures alone.
What does not live here: the tutorials themselves, and the checks of their
shape (sections, links, notebook conversion), which are in tests/test_tutorials.py.
"""

import contextlib
import doctest
import io
import os
import re
import shutil
import sys
import tempfile
import time
import unittest
from pathlib import Path

from sybil import Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.example import SybilFailure
from sybil.parsers.markdown.codeblock import CodeBlockParser
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer
from sybil.parsers.markdown.skip import SkipParser

from tinygrad_ckpt.serialization import atomic_write

HERE = Path(__file__).resolve().parent
PATTERN = "[0-9][0-9]_*.md"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_run_python = PythonEvaluator()


def run_python(example):
    """Execute one Python block, keeping what it printed for the output block below it."""
    __tracebackhide__ = True
    _check_nothing_pending(example.namespace)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        _run_python(example)
    if printed.getvalue():
        example.namespace["__printed__"] = (example, printed.getvalue())


def check_output(example):
    """Compare an output block with what the Python block above it printed."""
    kind, expected, start = example.parsed
    pending = example.namespace.pop("__printed__", None)
    actual = pending[1] if pending else ""
    refresh = example.namespace.get("__refresh__")
    if refresh is not None:
        text = actual if actual.endswith("\n") else actual + "\n"
        refresh.append((start, len(expected), text))
        return None
    if not _matches(expected, actual, timing=kind.endswith("timing")):
        raise SybilFailure(example, f"Expected:\n{_indent(expected)}Got:\n{_indent(actual)}")
    return None


def _matches(expected, actual, timing):
    expected, actual = _normalise(expected), _normalise(actual)
    if timing:  # a measured duration: everything but the numbers must match
        expected, actual = _NUMBER.sub("<n>", expected), _NUMBER.sub("<n>", actual)
    return doctest.OutputChecker().check_output(expected, actual, doctest.ELLIPSIS)


def _normalise(text):
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()) + "\n"


def _indent(text):
    return "".join("    " + line + "\n" for line in text.strip("\n").splitlines()) or "    (nothing)\n"


def _check_nothing_pending(namespace):
    pending = namespace.pop("__printed__", None)
    if pending is None:
        return
    example, printed = pending
    refresh = namespace.get("__refresh__")
    if refresh is not None:  # --refresh adds the missing output block
        refresh.append((example.region.end, 0, "\n\n```output\n" + printed + "```"))
        return
    raise SybilFailure(
        example,
        "this block prints, but no ```output block follows it to show what it prints:\n"
        f"{_indent(printed)}(run `python tutorials/harness.py --refresh {Path(example.path).name}` to add it)",
    )


def parse_outputs(document):
    """The ```output blocks of a document, each checked by check_output."""
    lexer = FencedCodeBlockLexer(language=r"output(?: timing)?", mapping={"language": "kind", "source": "source"})
    for region in lexer(document):
        # The block's text exactly as written (Sybil's lexeme is dedented, and a
        # right-aligned table's leading spaces are part of what is printed).
        start = region.start + region.lexemes["source"].offset
        end = document.text.rindex("\n", start - 1, region.end) + 1  # where the closing fence's line starts
        region.parsed = (region.lexemes["kind"], document.text[start:end], start)
        region.evaluator = check_output
        yield region


def setup(namespace):
    """Work in tutorials/ (run, --refresh) or, under pytest, in a scratch copy of it.

    Under pytest the pictures go to a temporary figures/ folder: a test run
    draws them all, but leaves the committed ones alone (a picture differs in
    a few bytes from one machine's BLAS and fonts to another's).
    """
    namespace["__cwd__"] = os.getcwd()
    os.environ.setdefault("MPLBACKEND", "Agg")  # pictures go to files; no window opens
    workdir = namespace.get("__workdir__")
    if workdir is None:
        workdir = namespace["__scratch__"] = tempfile.mkdtemp(prefix="tutorial-")
    os.chdir(workdir)


def teardown(namespace):
    os.chdir(namespace.pop("__cwd__"))
    scratch = namespace.pop("__scratch__", None)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
    _check_nothing_pending(namespace)


sybil = Sybil(
    parsers=[SkipParser(), CodeBlockParser("python", run_python), parse_outputs],
    patterns=[PATTERN],
    setup=setup,
    teardown=teardown,
)


def run(path, refresh=False):
    """Run one tutorial outside pytest; with refresh, rewrite its output blocks. Returns seconds."""
    document = sybil.parse(Path(path).resolve())
    edits = document.namespace["__refresh__"] = [] if refresh else None
    document.namespace["__workdir__"] = HERE  # pictures into tutorials/figures/, to be committed
    start = time.perf_counter()
    setup(document.namespace)
    try:
        for example in document.examples():
            try:
                example.evaluate()
            except unittest.SkipTest:  # a block behind <!-- skip: ... --> (e.g. needs a GPU)
                pass
    finally:
        teardown(document.namespace)
    seconds = time.perf_counter() - start
    if refresh:
        text = document.text
        for offset, length, new in sorted(edits, reverse=True):
            text = text[:offset] + new + text[offset + length:]
        with atomic_write(path, "w") as f:  # the package's one atomic writer
            f.write(text)
    return seconds


def main(argv):
    refresh = "--refresh" in argv
    paths = [a for a in argv if a != "--refresh"] or sorted(HERE.glob(PATTERN))
    for path in paths:
        print(f"{Path(path).name:<32} {run(path, refresh):6.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
