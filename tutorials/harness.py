"""How a tutorial is run and checked: its Python blocks executed in order, its printed output compared.

A tutorial is a Markdown file. Three kinds of fenced block matter here:

    ```python            executed, top to bottom, all blocks of a file in one namespace
    ```output            what the Python block just above printed; checked exactly
                         (trailing spaces ignored; '...' matches anything, as in doctest)
    ```output timing     the same, but numbers may differ: timings are shown, never asserted
    ```output rtol=0.05  the same, but each number may differ from the one shown by that fraction of it
                         (atol=1e-9: by that much; both: either suffices); the words and the count
                         of numbers must still match. For a figure that honestly varies a little
                         from one BLAS kernel, thread count or CPU to another (a loss after some
                         steps, an error of rounding): the text shows one machine's value, and the
                         option says how far another machine's may stray.

A Python block that prints something must be followed by an output block, so
nothing printed goes unchecked, and no number in the text can drift from the
code. Everything else (prose, pictures, other blocks) is left alone.

Blocks that can only run on some machines guard themselves in code, so that
they run anywhere (pasted into a script, IPython or Jupyter, not the plain
`python` prompt, where a blank line ends a block; or in a notebook),
printing what they skipped:

    if ON_GPU:
        ...
    else:
        print("skipped: no GPU here (...)")

and sit between Sybil's skip comments, which do not show on a code-hosting
site, so that the check skips them where their output, which shows what they
print where they do run, cannot be produced:

    <!-- skip: start if(not ON_GPU, reason="needs CuPy and an NVIDIA GPU") -->
    ...
    <!-- skip: end -->

A figure that is a statistic of rounding noise (the smallest of entries
that are zero in exact arithmetic, an error's third digit) is not checked
with a tolerance: it is not printed at all.
`.ci/run` runs the tutorials under two OpenBLAS kernels and two thread counts.

Four ways to use it:

    python -m pytest                          # tutorials/conftest.py hands this to pytest (via Sybil)
    python tutorials/harness.py [FILE ...]    # run tutorials in order, in one process; per tutorial, how
                                              # many blocks ran and were checked, and how long it took
    python tutorials/harness.py --refresh FILE  # rewrite FILE's output blocks from a real run
                                              # (and add the missing ones): how authors write them
    python tutorials/harness.py --notebook FILE.ipynb   # check a notebook that Jupyter ran (tutorials/README.md)
                                              # against the output blocks of FILE.md beside it

Run directly, each tutorial runs with tutorials/ as its working directory, as
it does when opened as a notebook there, so it writes its pictures to
figures/ (commit them). Under pytest it runs in a scratch folder instead, so a
test run leaves the committed pictures alone. A picture redrawn from data
that moved only by rounding (another BLAS kernel, another thread count) is
the same picture in other bytes: after a tutorial runs, each picture of
figures/ that is the same picture as before (bench/plots.py's
`same_picture`) gets its old bytes back, so running the tutorials leaves
git status clean on any machine, and a picture whose data changed is kept.

What one tutorial leaves behind never reaches the next: each starts from a
collected baseline (gc.collect(), so that no garbage from before is freed in
the middle of its measurements), and its namespace is emptied when it ends.
That matters because a namespace is held by a reference cycle (each function
a tutorial defines holds the namespace as its globals, and the namespace
holds the function), so without emptying it, its models, gradients and
optimizer state would stay alive, and counted by the memory accounting,
until Python's cycle collector happened to run: in the middle of another
tutorial's measurement, say. Memory figures are therefore the same whether a
tutorial runs alone, after the others, or as a notebook
(tests/test_tutorials.py checks it).

What does not live here: the tutorials themselves, and the checks of their
shape (sections, links, notebook conversion), which are in tests/test_tutorials.py.
"""

import contextlib
import doctest
import gc
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
    record = example.namespace.get("__record__")
    if record is not None:  # run(..., record=[...]): what each output block was compared with
        record.append((kind, actual))
    refresh = example.namespace.get("__refresh__")
    if refresh is not None:
        text = actual if actual.endswith("\n") else actual + "\n"
        refresh.append((start, len(expected), text))
        return None
    if not _matches(expected, actual, kind):
        raise SybilFailure(example, f"Expected{_tolerance_words(kind)}:\n{_indent(expected)}Got:\n{_indent(actual)}")
    return None


def _options(kind):
    """An output block's info string ('output', 'output timing', 'output rtol=0.05 atol=1e-9') as a dict."""
    words = kind.split()[1:]
    options = {"timing": "timing" in words}
    for word in words:
        if word == "timing":
            continue
        name, _, value = word.partition("=")
        if name not in ("rtol", "atol") or not value:
            raise ValueError(f"```{kind}: unknown option {word!r}; an output block takes timing, rtol=X or atol=X")
        options[name] = float(value)
    return options


def _tolerance_words(kind):
    """'' for an exact block; else what the check allowed, for the failure message."""
    options = _options(kind)
    if options["timing"]:
        return " (numbers are timings, not compared)"
    if "rtol" in options or "atol" in options:
        return " (numbers within " + " or ".join(f"{k}={options[k]:g}" for k in ("rtol", "atol") if k in options) + ")"
    return ""


def _matches(expected, actual, kind="output"):
    """Whether what was printed matches an output block of this kind (see the module docstring)."""
    options = _options(kind)
    expected, actual = _normalise(expected), _normalise(actual)
    if options["timing"]:  # a measured duration: everything but the numbers must match
        expected, actual = _NUMBER.sub("<n>", expected), _NUMBER.sub("<n>", actual)
    elif "rtol" in options or "atol" in options:  # numbers within the tolerance, the rest exactly
        shown, printed = _NUMBER.findall(expected), _NUMBER.findall(actual)
        rtol, atol = options.get("rtol", 0.0), options.get("atol", 0.0)
        if len(shown) != len(printed) or any(abs(float(p) - float(s)) > max(atol, rtol * abs(float(s)))
                                             for s, p in zip(shown, printed)):
            return False
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
    lexer = FencedCodeBlockLexer(language=r"output(?:[ \t]+[^\n]*?)?[ \t]*", mapping={"language": "kind", "source": "source"})
    for region in lexer(document):
        # The block's text exactly as written (Sybil's lexeme is dedented, and a
        # right-aligned table's leading spaces are part of what is printed).
        start = region.start + region.lexemes["source"].offset
        end = document.text.rindex("\n", start - 1, region.end) + 1  # where the closing fence's line starts
        kind = " ".join(region.lexemes["kind"].split())
        _options(kind)  # an unknown option fails here, when the document is read, not at its block
        region.parsed = (kind, document.text[start:end], start)
        region.evaluator = check_output
        yield region


def setup(namespace):
    """Start from a collected baseline; work in tutorials/ (run, --refresh) or, under pytest, in a scratch folder.

    Under pytest the pictures go to a temporary figures/ folder: a test run
    draws them all, but leaves the committed ones alone (a picture differs in
    a few bytes from one machine's BLAS and fonts to another's).
    """
    gc.collect()  # garbage from before (other tutorials, tests) is freed now, not during a measurement
    namespace["__cwd__"] = os.getcwd()
    os.environ.setdefault("MPLBACKEND", "Agg")  # pictures go to files; no window opens
    workdir = namespace.get("__workdir__")
    if workdir is None:
        workdir = namespace["__scratch__"] = tempfile.mkdtemp(prefix="tutorial-")
        os.mkdir(os.path.join(workdir, "figures"))  # where the tutorials draw, as in tutorials/
    os.chdir(workdir)


def teardown(namespace):
    """Back to where we were; then empty the namespace, so that what the tutorial made is freed now.

    Emptying it breaks the cycle between the namespace and the functions
    defined in it (their globals), so that reference counting frees the
    tutorial's models, gradients and optimizer state at once, instead of
    Python's cycle collector, at some later moment.
    """
    os.chdir(namespace.pop("__cwd__"))
    scratch = namespace.pop("__scratch__", None)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
    try:
        _check_nothing_pending(namespace)
    finally:
        kept = {k: namespace[k] for k in ("__refresh__", "__record__") if k in namespace}
        namespace.clear()
        namespace.update(kept)  # run() still needs the edits of --refresh and the record


sybil = Sybil(
    parsers=[SkipParser(), CodeBlockParser("python", run_python), parse_outputs],
    patterns=[PATTERN],
    setup=setup,
    teardown=teardown,
)


def run(path, refresh=False, workdir=HERE, record=None, counts=None):
    """Run one tutorial outside pytest; with refresh, rewrite its output blocks. Returns seconds.

    workdir: where it runs and writes its pictures (tutorials/ by default, so
    that they can be committed; None: a scratch folder, removed afterwards).
    record: a list; for each output block, in order, (its kind: 'output',
    'output timing', 'output rtol=0.05', ..., what the Python block above it printed) is appended to
    it (skipped blocks leave no entry).
    counts: a dict; it gets 'python' (Python blocks run), 'output' (output
    blocks compared, or rewritten with refresh) and 'skipped' (blocks behind
    skip comments). A block that fails raises SybilFailure.
    """
    document = sybil.parse(Path(path).resolve())
    edits = document.namespace["__refresh__"] = [] if refresh else None
    document.namespace["__record__"] = record
    document.namespace["__workdir__"] = workdir
    counts = {} if counts is None else counts
    counts.update(python=0, output=0, skipped=0)
    start = time.perf_counter()
    before = _pictures(workdir)
    setup(document.namespace)
    try:
        for example in document.examples():
            kind = {run_python: "python", check_output: "output"}.get(example.region.evaluator)
            try:
                example.evaluate()
            except unittest.SkipTest:  # a block behind <!-- skip: ... --> (e.g. needs a GPU)
                kind = "skipped" if kind else None
            if kind:
                counts[kind] += 1
    finally:
        teardown(document.namespace)
        _keep_same_pictures(workdir, before)
    seconds = time.perf_counter() - start
    if refresh:
        text = document.text
        for offset, length, new in sorted(edits, reverse=True):
            text = text[:offset] + new + text[offset + length:]
        with atomic_write(path, "w") as f:  # the package's one atomic writer
            f.write(text)
    return seconds


def _pictures(workdir):
    """{path: bytes} of the PNGs in workdir/figures (none for a scratch folder)."""
    if workdir is None:
        return {}
    return {path: path.read_bytes() for path in (Path(workdir) / "figures").glob("*.png")}


def _keep_same_pictures(workdir, before):
    """Give each picture that a run redrew as the same picture its old bytes back (see the docstring)."""
    redrawn = {path: old for path, old in before.items() if path.exists() and path.read_bytes() != old}
    if not redrawn:
        return
    from tinygrad_ckpt.bench.plots import same_picture  # matplotlib: a tutorial that drew has it

    for path, old in redrawn.items():
        if same_picture(old, path.read_bytes()):
            with atomic_write(path, "wb") as f:
                f.write(old)


# -- notebooks: what Jupyter printed, against the Markdown ---------------------------------
def check_notebook(path):
    """Check a notebook that Jupyter ran against the output blocks of the Markdown file it came from.

    path: NN_name.ipynb, made from NN_name.md beside it by Jupytext and run
    (tutorials/README.md, "Open one as a notebook"). Each code cell's printed
    output (stdout) is compared as check_output compares it: with the output
    block below that Python block, or with nothing. A cell that stopped on an
    error fails. A block between skip comments (a GPU, MPI) may instead
    print its own "skipped: ..." line. Raises AssertionError naming the first
    cell that differs; returns the number of cells checked.
    """
    nbformat = _import("nbformat")
    path = Path(path)
    source = path.with_suffix(".md")
    notebook = nbformat.read(path, as_version=4)
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    blocks = _python_blocks(source.read_text())
    if len(cells) != len(blocks):
        raise AssertionError(f"{path.name} has {len(cells)} code cells, {source.name} {len(blocks)} Python blocks: "
                             "convert it again (jupytext --to ipynb ...)")
    for n, (cell, (code, output, skippable)) in enumerate(zip(cells, blocks), start=1):
        where = f"{path.name}, cell {n} ({code.strip().splitlines()[0][:60]!r})"
        if cell.source.rstrip("\n") != code.rstrip("\n"):
            raise AssertionError(f"{where}: the cell is not the Markdown's block any more; convert it again")
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        if errors:
            raise AssertionError(f"{where} raised {errors[0].ename}: {errors[0].evalue}")
        if cell.get("execution_count") is None:
            raise AssertionError(f"{where} was not run: run the notebook first (jupyter execute --inplace ...)")
        printed = "".join(o.text for o in cell.get("outputs", []) if o.output_type == "stream" and o.name == "stdout")
        if skippable and printed.startswith("skipped: "):
            continue
        kind, expected = output if output is not None else ("output", "")
        if not _matches(expected, printed, kind):
            raise AssertionError(f"{where}:\nExpected:\n{_indent(expected)}Got:\n{_indent(printed)}")
    return len(cells)


_FENCE = re.compile(r"^```(python|output(?:[ \t]+[^\n]*?)?)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_SKIP = re.compile(r"<!--\s*skip:\s*(start|end)\b")


def _python_blocks(text):
    """[(code, (kind, expected output) or None, inside skip comments)] for each ```python block, in order."""
    skip_marks = [(m.start(), m.group(1) == "start") for m in _SKIP.finditer(text)]
    blocks = []
    for m in _FENCE.finditer(text):
        if m.group(1) == "python":
            inside = False  # the last skip comment above the block says whether it is inside
            for at, starts in skip_marks:
                inside = starts if at < m.start() else inside
            blocks.append([m.group(2), None, inside])
        elif blocks and blocks[-1][1] is None:
            blocks[-1][1] = (" ".join(m.group(1).split()), m.group(2))
    return [tuple(b) for b in blocks]


def _import(name):
    try:
        return __import__(name)
    except ImportError:
        raise SystemExit(f"{name} is not installed: pip install -e \".[tutorials]\" (tutorials/README.md)") from None


USAGE = """\
usage: python tutorials/harness.py [FILE.md ...]            run tutorials (all of them by default) and check them
       python tutorials/harness.py --refresh FILE.md ...    rewrite their output blocks from a real run
       python tutorials/harness.py --notebook FILE.ipynb ...  check notebooks that Jupyter ran
       python tutorials/harness.py --help                   this text

Every Python block runs, in order, in one namespace per tutorial, and what it
prints is compared with the output block below it. Per tutorial it prints how
many blocks ran and were checked; at the first block that differs it prints
what was expected and what was printed, and exits with status 1.
(tutorials/harness.py's docstring says more; tutorials/README.md, how to open
a tutorial as a notebook.)"""


def main(argv):
    """The command line (USAGE); returns the exit status."""
    if "-h" in argv or "--help" in argv:
        print(USAGE)
        return 0
    unknown = [a for a in argv if a.startswith("-") and a not in ("--refresh", "--notebook")]
    if unknown or ("--notebook" in argv and argv[0] != "--notebook") or argv == ["--notebook"]:
        problem = f"unknown option {unknown[0]}" if unknown else "--notebook comes first, then one or more .ipynb files"
        print(f"harness.py: {problem}\n\n{USAGE}", file=sys.stderr)
        return 2
    if argv[:1] == ["--notebook"]:
        for path in argv[1:]:
            try:
                cells = check_notebook(path)
            except AssertionError as failure:
                print(f"{Path(path).name:<32} FAILED: {failure}", flush=True)
                return 1
            print(f"{Path(path).name:<32} {cells:3d} code cells checked: each printed what the text shows",
                  flush=True)
        return 0
    refresh = "--refresh" in argv
    paths = [a for a in argv if a != "--refresh"] or sorted(HERE.glob(PATTERN))
    for path in paths:
        counts = {}
        try:
            seconds = run(path, refresh, counts=counts)
        except SybilFailure as failure:
            print(f"{Path(path).name:<32} FAILED\n{failure}", flush=True)
            return 1
        skipped = f", {counts['skipped']} skipped (skip comments)" if counts["skipped"] else ""
        if refresh:
            done = f"{counts['python']:3d} Python blocks run, {counts['output']:3d} output blocks rewritten"
        else:
            done = (f"{counts['python']:3d} Python blocks run, {counts['output']:3d} output blocks checked: "
                    "all as the text shows")
        print(f"{Path(path).name:<32} {done}{skipped}, {seconds:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
