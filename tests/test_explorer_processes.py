"""`mpiexec -n 2 tinygrad-ckpt train --zero-stage S --memory-report PATH`: one page, each process's step side by side.

Each process records its own first optimizer step; process 0 gathers them
(bench/explorer.py, MemoryReport) and writes one page with a panel a process,
whose title gives that process's peak. The test reads the page's embedded
data and checks each panel's peak against the line that process's peak got
in the command's own output ("peak memory of process r: ... (N bytes)"),
and, in Chromium where it is installed, that the panels render side by side.
"""

import re
import subprocess
import sys

import pytest

from .test_distributed import find_mpiexec, needs_mpi
from .test_distributed_faults import ENV, TIMEOUT
from .test_explorer import Visit, browser, embedded, needs_plotly  # noqa: F401  (browser: a fixture)

G = 2  # accumulation steps: each panel's step holds this many micro-batches


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda s: f"zero{s}")
def two_processes(request, tmp_path_factory):
    """(the page's path, its embedded data, the command's stdout) of a 2-process, 1-step run at ZeRO stage S."""
    out = tmp_path_factory.mktemp(f"processes{request.param}")
    (out / "tiny.txt").write_text("the cat sat on the mat. " * 60)
    page = out / "step.html"
    run = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, "-m", "tinygrad_ckpt", "train",
                          "--data", str(out / "tiny.txt"), "--n-layer", "1", "--n-embd", "16", "--n-head", "2",
                          "--block-size", "8", "--disable-tqdm", "--max-steps", "1", "--val-fraction", "0",
                          "--per-device-train-batch-size", "2", "--gradient-accumulation-steps", str(G),
                          "--sample-chars", "0", "--zero-stage", str(request.param), "--memory-report", str(page)],
                         capture_output=True, text=True, timeout=TIMEOUT, env=ENV)
    assert run.returncode == 0, run.stdout + run.stderr
    return page, embedded(page)[0], run.stdout


@needs_mpi
@needs_plotly
def test_a_two_process_run_writes_one_page_whose_panels_peaks_are_what_each_process_printed(two_processes):
    page, data, stdout = two_processes
    printed = {int(r): int(b.replace(",", "")) for r, b in
               re.findall(r"peak memory of process (\d): \S+ \S+ \(([\d,]+) bytes\)", stdout)}
    assert sorted(printed) == [0, 1]
    assert f"memory report: {page} " in stdout and "of each of the 2 processes, side by side" in stdout
    panels = data["timelines"]
    assert [p["process"] for p in panels] == [0, 1] and [p["id"] for p in panels] == ["timeline-process0",
                                                                                        "timeline-process1"]
    text = page.read_text(encoding="utf-8")
    for panel in panels:
        rank = panel["process"]
        assert panel["memory_peak"] == printed[rank]
        assert f"<h2>process {rank}: optimizer step 1, peak " in text and f"({printed[rank]:,} bytes)</h2>" in text
        (step,) = panel["steps"].values()
        events = step["figure"]["data"][-1]["text"]  # the total's hover: one per event of this process's step
        assert sum("<b>GradientAccumulator.accumulate</b>" in t or "<b>ShardedAccumulator.accumulate</b>" in t
                   for t in events) == G
        assert 0 < step["peak"]["bytes"] <= panel["memory_peak"]  # after an event; memory.py's also sees inside ops
    assert text.index("class='side-by-side'") < text.index("id='timeline-process0'") < text.index("id='timeline-process1'")


@needs_mpi
@needs_plotly
def test_the_panels_render_side_by_side_in_a_browser(browser, two_processes):  # noqa: F811
    visit = Visit(browser, two_processes[0])
    try:
        boxes = visit.page.evaluate("Array.from(document.querySelectorAll('.timeline-chart')).map(d => "
                                    "{const r = d.getBoundingClientRect(); return [r.left, r.right, r.top, "
                                    "d._fullLayout ? d._fullLayout._size.w : 0];})")
        assert visit.errors == [] and visit.requests == [visit.url]
        (left0, right0, top0, w0), (left1, _, top1, w1) = boxes
        assert right0 <= left1 and abs(top0 - top1) < 1 and w0 > 100 and w1 > 100  # one row, both drawn
    finally:
        visit.page.close()
