"""The memory explorer: memory.record's timeline, the page's numbers, and the page in a real browser.

Three parts:

  * the events memory.py records (what the page shows on hover) add up:
    each event's allocated minus freed bytes is the change of the live
    total, and every record's backward follows its forward;
  * the page's numbers are the bench's: the data embedded in report.html,
    read back, equal bench.json's to the byte; the page stays under a
    stated size for the largest reference steps;
  * in headless Chromium (the system's, driven by Playwright): the page
    loads with no console error and no network request, every chart
    renders, hovering shows the op, selecting a record marks its span, and
    a screenshot is not blank. These skip, saying why, where Chromium or
    Playwright is missing; .ci/run installs Chromium.

Pages need Plotly (the `report` extra; the test extra has it); tests that
need it skip without it.
"""

import html.parser
import json
import os
import shutil
import sys
from dataclasses import replace

import numpy
import pytest

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, cli, memory, optim
from tinygrad_ckpt.memory import CATEGORIES

try:
    import plotly  # noqa: F401

    HAVE_PLOTLY = True
except ImportError:
    HAVE_PLOTLY = False
needs_plotly = pytest.mark.skipif(not HAVE_PLOTLY, reason="Plotly is not installed (pip install -e \".[report]\"): no page to check")
MIB = 2**20


# -- the events ------------------------------------------------------------------------------
def mlp_step(depth=3, width=16, batch=4, segments=None, steps=1):
    """A W1-shaped MLP and a training step of `steps` micro-batches (accumulated when > 1)."""
    from tinygrad_ckpt.accumulate import GradientAccumulator
    from tinygrad_ckpt.nn.mlp import MLP

    rng = numpy.random.default_rng(0)
    model = MLP(width, width, width, n_layers=depth, rng=rng)
    if segments is not None:
        model.gradient_checkpointing_enable(segments=segments)
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    acc = GradientAccumulator(model.parameters(), gradient_accumulation_steps=steps)
    x = Tensor(rng.standard_normal((steps * batch, width), dtype=numpy.float32))
    y = Tensor(rng.standard_normal((steps * batch, width), dtype=numpy.float32))

    def step():
        for k in range(steps):
            F.mse_loss(model(x[k * batch:(k + 1) * batch]), y[k * batch:(k + 1) * batch], reduction="sum").backward()
            acc.accumulate(batch * width)
        acc.write_grads()
        opt.step()
        acc.zero_grad()

    return step


@pytest.mark.parametrize("segments", [None, "every", [(0, 2, [(0, 1, True), (1, 2, False)]), (2, 3, True)]],
                         ids=["plain", "every layer", "nested"])
def test_allocated_minus_freed_is_the_change_of_the_live_total(segments):
    timeline = memory.record(mlp_step(segments=segments, steps=2))
    previous = sum(timeline.before.values())
    assert len(timeline) > 20
    for i, e in enumerate(timeline.events):
        total = sum(e[c] for c in CATEGORIES)
        assert total - previous == sum(e["allocated"].values()) - sum(e["freed"].values()), (i, e["op"])
        assert set(e["allocated"]) <= set(CATEGORIES) and set(e["freed"]) <= set(CATEGORIES)
        previous = total


def test_every_record_is_named_once_and_its_backward_follows_its_forward():
    timeline = memory.record(mlp_step(segments="every", steps=2))
    forward, backward = {}, {}
    for i, e in enumerate(timeline.events):
        assert e["kind"] in ("op", "backward", "mark")
        if "tape" not in e:
            assert e["kind"] != "backward"  # every backward belongs to a record
            continue
        key = (e["tape"], e["record"])
        if e["kind"] == "op":
            assert key not in forward, f"record {key} made twice"
            forward[key] = i
        else:
            assert key not in backward and forward[key] < i
            backward[key] = i
    assert set(backward) == set(forward)  # a training step backpropagates every record
    assert len({tape for tape, _ in forward}) > 2  # the step's tape and the recompute tapes
    marks = [e["op"] for e in timeline.events if e["kind"] == "mark"]
    assert marks == ["GradientAccumulator.accumulate"] * 2 + ["GradientAccumulator.write_grads", "AdamW.step",
                                                             "GradientAccumulator.zero_grad"]
    assert {e["phase"] for e in timeline.events if e["kind"] == "mark"} == {"update"}


def test_saved_bytes_of_the_records_are_the_activations_a_step_keeps():
    depth, width, batch = 4, 16, 8
    timeline = memory.record(mlp_step(depth, width, batch))
    saved = sum(e.get("saved", 0) for e in timeline.events if e["kind"] == "op" and e["phase"] == "forward")
    assert saved == (2 * depth + 2) * batch * width * 4  # tutorial 3's count: every layer's input and GELU's, the loss's
    linears = [e for e in timeline.events if e["op"] == "Linear" and e["kind"] == "op"]
    assert [e["saved_parameters"] for e in linears] == [0] + [1] * depth  # the first saves the batch, an input


def test_record_returns_what_fn_returns_and_names_it():
    x = Tensor(numpy.ones(3, dtype=numpy.float32), requires_grad=True)
    timeline = memory.record(lambda t: (t * t).sum(), x, name="square")
    assert timeline.name == "square" and float(timeline.result.item()) == 3.0
    assert [e["op"] for e in timeline.events] == ["Mul", "Sum"]
    assert "square" in repr(timeline) and "2 events" in repr(timeline)
    again = memory.Timeline.from_dict(json.loads(json.dumps(timeline.to_dict())))
    assert again.totals() == timeline.totals() and again.name == "square"


def test_plot_draws_with_matplotlib():
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install -e \".[plot]\")")
    import matplotlib.pyplot as plt

    from tinygrad_ckpt.bench.plots import plot_timeline

    fig = plot_timeline(memory.record(mlp_step()))
    try:
        ax = fig.axes[0]
        assert len(ax.collections) >= len(CATEGORIES)  # one stacked area per category, phase bands besides
        assert {t.get_text() for t in ax.get_legend().get_texts()} >= set(CATEGORIES)
    finally:
        plt.close(fig)


# -- the page's numbers: the bench's -----------------------------------------------------------
class _Scripts(html.parser.HTMLParser):
    """The text of every <script> (by id) and every src/href a page would load."""

    def __init__(self):
        super().__init__()
        self.scripts, self.loads, self._id = {}, [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script":
            self._id = attrs.get("id", f"script-{len(self.scripts)}")
            self.scripts[self._id] = ""
        for name in ("src", "href"):
            if attrs.get(name) and not attrs[name].startswith("#"):
                self.loads.append(attrs[name])

    def handle_endtag(self, tag):
        if tag == "script":
            self._id = None

    def handle_data(self, data):
        if self._id is not None:
            self.scripts[self._id] += data


def embedded(path):
    parser = _Scripts()
    parser.feed(open(path, encoding="utf-8").read())
    return json.loads(parser.scripts["explorer-data"]), parser


@pytest.fixture(scope="module")
def tiny_bench(tiny_bench_run):
    """The tiny set's output folder and bench.json (one run for this file and test_bench.py: tests/conftest.py)."""
    if not HAVE_PLOTLY:
        pytest.skip("Plotly is not installed (pip install -e \".[report]\"): no page to check")
    code, out, results = tiny_bench_run
    assert code == 0
    return out, results


def test_the_page_holds_the_bench_numbers_to_the_byte(tiny_bench):
    out, results = tiny_bench
    data, _ = embedded(out / "report.html")
    assert data["results"] == {k: v for k, v in results.items() if k != "timelines"}
    assert [s["id"] for s in data["timelines"]] == [f"timeline-{w.lower()}" for w in results["timelines"]]
    for section, (workload, timeline) in zip(data["timelines"], results["timelines"].items()):
        assert section["strategies"] == list(timeline["strategies"])
        for strategy, step in timeline["strategies"].items():
            events = step["events"]
            traces = {t["name"]: t for t in section["steps"][strategy]["figure"]["data"]}
            for c in CATEGORIES:  # every drawn point is an event's bytes, exactly (MiB = bytes / 2**20)
                assert [y * MIB for y in traces[c]["y"]] == [events[x][c] for x in traces[c]["x"]], (workload, strategy, c)
            total = traces["total"]  # the line and the hover: every event
            assert total["x"] == list(range(len(events)))
            assert [y * MIB for y in total["y"]] == [sum(e[c] for c in CATEGORIES) for e in events]
            for e, text in zip(events, total["text"]):
                assert f"<b>{e['op']}</b>" in text and f"({sum(e[c] for c in CATEGORIES):,} B)" in text
    for chart, curve in zip(data["charts"], results["tradeoff"]):
        plans = sorted((r for r in curve["rows"] if not r.get("infeasible")), key=lambda r: -r["fraction"])
        line = chart["figure"]["data"][0]
        assert [y * MIB for y in line["y"]] == [r["activation_peak_bytes"] for r in plans]
        assert [d[0] for d in line["customdata"]] == [r["plan"] for r in plans]  # each point's plan on hover


def test_the_casts_of_a_mixed_precision_step_are_marked_in_the_palette_s_colour(tiny_bench):
    """A bf16 step's Cast events (autocast's copies, gradients cast back) are diamonds on the total, with a
    legend entry; a float32 step has no such trace. Which events are casts is read from bench.json's events."""
    from tinygrad_ckpt.bench import explorer, palette

    out, results = tiny_bench
    data, _ = embedded(out / "report.html")
    sections = {s["id"]: s for s in data["timelines"]}
    for workload in ("W1", "W2"):
        steps = results["timelines"][workload]["strategies"]
        figures = sections[f"timeline-{workload.lower()}"]["steps"]
        for strategy in ("bf16 autocast", "fp16 autocast, loss scaled"):
            events = steps[strategy]["events"]
            casts = [i for i, e in enumerate(events) if e["op"] == "Cast"]
            assert len(casts) > 4 and any(events[i]["kind"] == "backward" for i in casts)  # copies and casts back
            traces = figures[strategy]["figure"]["data"]
            (marks,) = [t for t in traces if t["name"] == explorer.CASTS]
            assert marks["x"] == casts and marks["mode"] == "markers"
            assert marks["marker"]["color"] == palette.CAST_COLOUR and marks.get("showlegend", True)
            assert [y * MIB for y in marks["y"]] == [sum(events[i][c] for c in CATEGORIES) for i in casts]  # on the total
            assert traces[-1]["name"] == "total"  # still the last trace: the overlay's total
        assert all(t["name"] != explorer.CASTS for t in figures["none"]["figure"]["data"])  # float32: no casts
    assert "mark its Cast events" in _howto(out / "report.html")


def test_the_page_loads_nothing_from_outside_and_stays_small(tiny_bench):
    from plotly.offline import get_plotlyjs

    out, _ = tiny_bench
    _, parser = embedded(out / "report.html")
    assert parser.loads == []  # no <script src>, no <link href>: everything inline
    size = os.path.getsize(out / "report.html")
    assert size < len(get_plotlyjs()) + 2 * MIB, f"{size / MIB:.1f} MiB"  # plotly.js, and the tiny set's data


def test_bench_without_plotly_says_how_to_get_the_page(tiny_bench_run, tmp_path, capsys, monkeypatch):
    import tinygrad_ckpt.bench
    from tinygrad_ckpt.bench import command

    _, _, results = tiny_bench_run
    monkeypatch.setitem(sys.modules, "plotly", None)  # an import of plotly now fails,
    monkeypatch.setitem(sys.modules, "tinygrad_ckpt.bench.explorer", None)  # and so does the explorer's
    monkeypatch.delattr(tinygrad_ckpt.bench, "explorer", raising=False)
    assert command.write_page(results, "tables", str(tmp_path)) == []  # bench writes the rest before it
    assert "pip install -e \".[bench]\"" in capsys.readouterr().out
    assert os.listdir(tmp_path) == []


@needs_plotly
def test_train_memory_report_records_every_micro_batch_of_one_step(tmp_path, capsys):
    path = tmp_path / "step.html"
    code = cli.main(["train", "--max-steps", "2", "--gradient-accumulation-steps", "3", "--per-device-train-batch-size", "2",
                     "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "8", "--sample-chars", "0",
                     "--disable-tqdm", "--memory-report", str(path)])
    assert code == 0 and f"memory report: {path}" in capsys.readouterr().out
    data, _ = embedded(path)
    (section,) = data["timelines"]
    (step,) = section["steps"].values()
    events = step["figure"]["data"][-1]["text"]
    accumulates = [t for t in events if "<b>GradientAccumulator.accumulate</b>" in t]
    assert len(accumulates) == 3 and sum("<b>AdamW.step</b>" in t for t in events) == 1  # one step, three teeth
    assert "micro-batch 3 of 3" in open(path, encoding="utf-8").read()


@needs_plotly
def test_train_memory_report_into_a_missing_folder_is_said_before_training(tmp_path, capsys):
    code = cli.main(["train", "--max-steps", "1", "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "8",
                     "--sample-chars", "0", "--disable-tqdm", "--memory-report", str(tmp_path / "no" / "step.html")])
    printed = capsys.readouterr()
    assert code == 2 and "does not exist" in printed.err and "step 1/1" not in printed.out


@needs_plotly
def _howto(path):
    text = open(path, encoding="utf-8").read()
    return text[text.index("<details class='howto'"):text.index("</details>")]


def test_the_page_offers_no_upload_and_says_compare_with_only_beside_its_control(tiny_bench, tmp_path):
    """plotly.js 4 shows a 'Share chart...' button (sendChartToCloud, on by default) that uploads the chart:
    the page turns it off. 'compare with' is said only on a page that has the control."""
    from tinygrad_ckpt.bench import explorer

    out, _ = tiny_bench
    _, parser = embedded(out / "report.html")
    glue = parser.scripts[max(parser.scripts, key=lambda k: "Plotly.newPlot" in parser.scripts[k])]
    assert "showSendToCloud: false" in glue and '"sendChartToCloud"' in glue and "displaylogo: false" in glue
    assert "<label>compare with" in open(out / "report.html", encoding="utf-8").read()
    assert "compare with" in _howto(out / "report.html")
    one = explorer.write_timeline(memory.record(mlp_step()), tmp_path / "step.html")
    page = open(one, encoding="utf-8").read()
    assert "compare with" not in page and "showSendToCloud: false" in page


def test_the_page_s_peak_and_the_bench_table_s_agree_or_say_why(tiny_bench):
    """The chart marks the most live bytes after an event; the table's peak (memory.py's) also sees inside an op.
    Where they differ, the mark gives both; the how-to says why."""
    out, results = tiny_bench
    data, _ = embedded(out / "report.html")
    table = {(r["workload"], r["size"], r["strategy"]): r["peak_bytes"] for r in results["rows"] if "peak_bytes" in r}
    differ = 0
    for section, (workload, timeline) in zip(data["timelines"], results["timelines"].items()):
        for strategy, step in section["steps"].items():
            (mark,) = step["figure"]["layout"]["annotations"]
            after_event = step["peak"]["bytes"]
            peak = table[workload, timeline["size"], strategy]
            assert peak >= after_event
            assert mark["text"].startswith(f"peak after an event {memory.format_bytes(after_event)}")
            if peak != after_event:
                differ += 1
                assert f"table's peak {memory.format_bytes(peak)}: inside an op" in mark["text"]
            else:
                assert "table's peak" not in mark["text"]
    assert differ  # the tiny set has such steps: the text is exercised
    assert "can be higher: it also sees the moment inside an op" in _howto(out / "report.html")


def test_the_listing_s_columns_wrap_rather_than_run_off_to_the_right():
    from tinygrad_ckpt.bench import explorer

    rules = [line for line in explorer._CSS.splitlines() if line.startswith(".listing td")]
    assert rules and "overflow-wrap: anywhere" in rules[0] and "nowrap" not in rules[0]
    assert ".listing td:first-child, .listing td:last-child { white-space: nowrap; }" in rules


def test_to_html_refuses_what_is_not_a_timeline(tmp_path):
    from tinygrad_ckpt.bench import explorer

    with pytest.raises(TypeError, match="memory.Timeline"):
        explorer.write_timeline([{"op": "Mul"}], tmp_path / "x.html")
    with pytest.raises(ValueError, match="no events"):
        explorer.write_timeline(memory.Timeline([], name="empty"), tmp_path / "x.html")
    assert not (tmp_path / "x.html").exists()


# -- large steps -------------------------------------------------------------------------------
LARGE_PAGE_MIB = 4.0  # the data of W1 at 64 layers and W2 at 8 blocks, every strategy, beside plotly.js


@pytest.fixture(scope="module")
def large_page(tmp_path_factory):
    """W1 at 64 layers and W2 at 8 blocks, every strategy the bench runs, on toy widths: the full steps' events."""
    if not HAVE_PLOTLY:
        pytest.skip("Plotly is not installed (pip install -e \".[report]\"): no page to check")
    from tinygrad_ckpt import activations
    from tinygrad_ckpt.bench import explorer, strategies, workloads
    from tinygrad_ckpt.schedules import measure_layers

    def steps(model, loss, n, costs, after, selective):
        opt = optim.AdamW(model.parameters(), lr=1e-4)
        out = {}
        for name, how in strategies._strategies(strategies.FULL, (), selective):
            segments, policy, _, split = strategies._segments_for(how, n, costs, after)
            strategies.checkpointing(model, segments, policy, split)

            def step():
                loss().backward()
                opt.step()
                opt.zero_grad()

            out[name] = memory.record(step, name=name)
        return out

    rng = numpy.random.default_rng(0)
    w1 = replace(workloads.W1, n_layers=64, width=8, batch=2)  # the events of W1 at 64 layers; toy arrays
    mlp = w1.model(rng)
    x, y = (Tensor(a) for a in w1.data(rng))
    one = steps(mlp, lambda: F.mse_loss(mlp(x), y), 64, measure_layers(list(mlp.blocks), x, cost="flops"),
                2 * 4 * w1.batch * w1.width, False)
    w2 = replace(workloads.W2, n_layer=8, n_embd=8, n_head=2, seq=8, batch=2, vocab=16)
    gpt = w2.model(rng)
    idx, targets = w2.data(rng)
    two = steps(gpt, lambda: gpt(idx, targets)[1], 8, measure_layers(list(gpt.blocks), strategies.gpt_embed(gpt, idx), cost="flops"),
                activations.gpt_head(w2.seq, w2.batch, w2.n_embd, w2.vocab), True)
    sections = [explorer._timeline_section("timeline-w1", "W1, 64 layers", one, ""),
                explorer._timeline_section("timeline-w2", "W2, 8 blocks", two, "")]
    path = tmp_path_factory.mktemp("large") / "large.html"
    path.write_text(explorer._page("large steps", "", sections, [], None, None), encoding="utf-8")
    return path, one, two


def test_a_large_page_stays_under_its_bound(large_page):
    from plotly.offline import get_plotlyjs

    path, one, two = large_page
    assert len(one["every layer"]) > 500 and len(two["selective, half blocks"]) > 600  # as many events as the full sizes
    size = os.path.getsize(path)
    print(f"W1 64 layers + W2 8 blocks, 12 steps: {size / MIB:.2f} MiB, of which plotly.js {len(get_plotlyjs()) / MIB:.2f} MiB")
    assert size < len(get_plotlyjs()) + LARGE_PAGE_MIB * MIB


@needs_plotly
def test_long_steps_are_thinned_for_drawing_only_and_keep_their_peak():
    from tinygrad_ckpt.bench import explorer

    timeline = memory.record(mlp_step(depth=2, width=8, batch=2, steps=200))  # a long step: 200 micro-batches
    assert len(timeline) > 2 * explorer.MAX_DRAWN
    view = explorer._step_view(timeline, "long")
    traces = {t["name"]: t for t in view["figure"]["data"]}
    assert len(traces["activations"]["x"]) <= explorer.MAX_DRAWN + 2
    assert len(traces["total"]["x"]) == len(timeline)  # the hover keeps every event
    peak, _ = timeline.peak()
    assert peak in traces["activations"]["x"]


# -- in a real browser --------------------------------------------------------------------------
def _chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install -e '.[test]')")
    executable = _chromium()
    if executable is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, headless=True)
        yield browser
        browser.close()


class Visit:
    """A page open in the browser, with every console message, page error and request it caused."""

    def __init__(self, browser, path):
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.errors, self.requests = [], []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.url = "file://" + os.path.abspath(path)
        self.page.goto(self.url)
        self.page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length > 0")

    def chart(self, section):
        return f"document.querySelector('#{section} .timeline-chart')"

    def point(self, section, i):
        """Where on the screen event i of the drawn strategy's total is."""
        js = self.chart(section)
        self.page.locator(f"#{section}").scroll_into_view_if_needed()
        x, y = self.page.evaluate(f"""() => {{ const gd = {js}, l = gd._fullLayout, t = gd.data.find(t => t.name === 'total');
            const r = gd.getBoundingClientRect();
            return [r.left + l.xaxis._offset + l.xaxis.l2p({i}), r.top + l.yaxis._offset + l.yaxis.l2p(t.y[{i}])]; }}""")
        return x, y


@pytest.fixture(scope="module")
def visit(browser, tiny_bench):
    out, _ = tiny_bench
    v = Visit(browser, out / "report.html")
    yield v
    v.page.close()


def test_page_loads_without_errors_or_network(visit, tiny_bench):
    _, results = tiny_bench
    visit.page.wait_for_timeout(200)
    assert visit.errors == []
    assert visit.requests == [visit.url]  # the page itself, nothing else
    charts = len(results["timelines"]) + len(results["tradeoff"])
    rendered = visit.page.evaluate(  # drawn by Plotly: its SVG, and a plot area with some size
        "Array.from(document.querySelectorAll('.js-plotly-plot')).filter(d => d.querySelector('.main-svg')"
        " && d._fullLayout && d._fullLayout._size.w > 100 && d._fullLayout._size.h > 100).length")
    assert visit.page.evaluate("document.querySelectorAll('.js-plotly-plot').length") == charts == rendered
    assert visit.page.locator("#tables table").count() >= 3


def test_hovering_a_point_shows_its_op(visit, tiny_bench):
    _, results = tiny_bench
    events = results["timelines"]["W2"]["strategies"]["none"]["events"]
    i = next(k for k, e in enumerate(events) if e["op"] == "Softmax")
    visit.page.mouse.move(*visit.point("timeline-w2", i))
    label = visit.page.locator("#timeline-w2 .hoverlayer .hovertext")
    label.wait_for()
    text = label.text_content()  # SVG text: its lines run together
    assert "Softmax" in text and f"event {i} of {len(events)}" in text


def _record_rows(events):
    """(first, last) event of each record, in the order the listing shows them (forward order)."""
    first, last = {}, {}
    for i, e in enumerate(events):
        if "tape" in e:
            (first if e["kind"] == "op" else last)[(e["tape"], e["record"])] = i
    return [(first[k], last[k]) for k in sorted(first, key=first.get)]


def test_selecting_a_record_marks_its_span_and_clicking_the_chart_selects_it(visit, tiny_bench):
    _, results = tiny_bench
    events = results["timelines"]["W1"]["strategies"]["none"]["events"]
    spans = _record_rows(events)
    rows = visit.page.locator("#timeline-w1 .listing:not([hidden]) tr.record")
    assert rows.count() == len(spans)
    rows.nth(2).click()
    shapes = visit.page.evaluate(f"{visit.chart('timeline-w1')}.layout.shapes.filter(s => s.name === 'selected record')")
    assert [(s["x0"], s["x1"]) for s in shapes] == [(spans[2][0], spans[2][1] + 1)]
    assert "selected" in rows.nth(2).get_attribute("class")
    assert f"from event {spans[2][0]} to event {spans[2][1]}" in visit.page.locator("#timeline-w1 .selection").inner_text()
    # and back: clicking the chart at a record's forward selects that record
    visit.page.mouse.click(*visit.point("timeline-w1", spans[4][0]))
    visit.page.wait_for_function("document.querySelector('#timeline-w1 tr.selected').dataset.row === '4'")
    shapes = visit.page.evaluate(f"{visit.chart('timeline-w1')}.layout.shapes.filter(s => s.name === 'selected record')")
    assert [(s["x0"], s["x1"]) for s in shapes] == [(spans[4][0], spans[4][1] + 1)]


def test_another_strategy_and_an_overlay(visit, tiny_bench):
    _, results = tiny_bench
    root = visit.page.locator("#timeline-w2")
    root.locator("select.strategy").select_option("every layer")
    root.locator("select.overlay").select_option("none")
    names = visit.page.evaluate(f"{visit.chart('timeline-w2')}.data.map(t => t.name)")
    assert names[-1] == "total, none" and "activations" in names
    drawn = visit.page.evaluate(f"{visit.chart('timeline-w2')}.data[{len(names) - 2}].y.length")
    assert drawn == len(results["timelines"]["W2"]["strategies"]["every layer"]["events"])
    assert root.locator(".listing:not([hidden])").get_attribute("data-strategy") == "every layer"
    assert visit.errors == []


def test_a_screenshot_is_not_blank(visit, tmp_path):
    from matplotlib.image import imread  # the test extra has matplotlib

    path = tmp_path / "w2.png"
    visit.page.locator("#timeline-w2").screenshot(path=str(path))
    pixels = imread(str(path))[..., :3]
    assert pixels.shape[0] > 300 and pixels.shape[1] > 800
    assert pixels.std() > 0.05  # not one colour
    colours = {tuple(p) for p in (pixels.reshape(-1, 3)[::37] * 255).astype(int)}
    assert len(colours) > 50


def test_a_large_page_opens_and_answers_hover(browser, large_page):
    path, one, _ = large_page
    v = Visit(browser, path)
    try:
        assert v.page.evaluate("document.querySelectorAll('.js-plotly-plot').length") == 2
        v.page.locator("#timeline-w1 select.strategy").select_option("every layer")
        v.page.wait_for_function(f"{v.chart('timeline-w1')}.data.at(-1).x.length === {len(one['every layer'])}")
        n = len(one["every layer"])
        for i in (10, n // 2, n - 20):  # about 1.3 pixels an event: the label is that event's or a neighbour's
            v.page.mouse.move(*v.point("timeline-w1", i))
            label = v.page.locator("#timeline-w1 .hoverlayer .hovertext")
            label.wait_for(timeout=5000)
            shown = int(label.text_content().rsplit("event ", 1)[1].split(" of ")[0])
            assert abs(shown - i) <= 1 and f" of {n}" in label.text_content()
        assert v.errors == []
    finally:
        v.page.close()
