"""Take the memory explorer's screenshot that benchmarks/README.md shows.

    tinygrad-ckpt bench --quick --output-dir bench-out      # writes report.html and bench.json
    python tools/explorer_screenshot.py bench-out benchmarks/figures/memory_explorer.png

It opens bench-out/report.html in headless Chromium (the system's, driven by
Playwright, as tests/test_explorer.py does: `apt-get install chromium` on
Debian, and `pip install -e ".[test]"` for Playwright), shows W2 with every
block checkpointed against no checkpointing (dashed), selects the second
block's `Checkpoint` record, puts the pointer on the GELU of the first
block's recompute, and saves the top of the W2 section as a PNG. The event
numbers come from bench.json, beside the page.
"""

import json
import os
import shutil
import sys


def main(out_dir, png):
    from playwright.sync_api import sync_playwright

    events = json.load(open(os.path.join(out_dir, "bench.json")))["timelines"]["W2"]["strategies"]["every layer"]["events"]
    checkpoints = [i for i, e in enumerate(events) if e["op"] == "Checkpoint" and e["kind"] == "op"]
    first = {}  # (tape, record) -> its first event: the listing's rows, in forward order
    for i, e in enumerate(events):
        if "tape" in e and e["kind"] == "op":
            first.setdefault((e["tape"], e["record"]), i)
    rows = sorted(first.values())
    row = rows.index(checkpoints[1])  # the second block's Checkpoint record
    gelus = [i for i, e in enumerate(events) if e["op"] == "GELU" and e["phase"] == "recompute"]
    gelu = gelus[-1]  # backward walks the blocks in reverse: the first block is recomputed last

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("Chromium is not installed (Debian: apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.goto("file://" + os.path.abspath(os.path.join(out_dir, "report.html")))
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length > 0")
        root = page.locator("#timeline-w2")
        root.locator("select.strategy").select_option("every layer")
        root.locator("select.overlay").select_option("none")
        root.scroll_into_view_if_needed()
        root.locator(".listing:not([hidden]) tr.record").nth(row).click()
        chart = "document.querySelector('#timeline-w2 .timeline-chart')"
        x, y = page.evaluate(f"""() => {{ const gd = {chart}, l = gd._fullLayout, t = gd.data.find(t => t.name === 'total');
            const r = gd.getBoundingClientRect();
            return [r.left + l.xaxis._offset + l.xaxis.l2p({gelu}), r.top + l.yaxis._offset + l.yaxis.l2p(t.y[{gelu}])]; }}""")
        page.mouse.move(x, y)
        root.locator(".hoverlayer .hovertext").wait_for()
        box = root.bounding_box()
        page.screenshot(path=png, clip={"x": box["x"], "y": box["y"], "width": box["width"],
                                         "height": min(box["height"], 600)})
        browser.close()
    print(f"wrote {png}: W2, every layer against none, record {row} selected, event {gelu} (GELU, recompute) hovered")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
