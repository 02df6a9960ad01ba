"""The memory explorer: one self-contained HTML page of where every byte of a training step goes.

    tinygrad-ckpt bench                       # writes report.html beside bench.md

writes it for the bench's workloads; `write_timeline` writes the same page
for one step of your own:

    >>> import os, tempfile, numpy
    >>> from tinygrad_ckpt import Tensor, memory, nn
    >>> model = nn.Linear(3, 2, rng=numpy.random.default_rng(0))
    >>> x = Tensor(numpy.ones((4, 3), dtype=numpy.float32))
    >>> out = tempfile.TemporaryDirectory()
    >>> page = write_timeline(memory.record(lambda x: model(x).sum().backward(), x), os.path.join(out.name, "s.html"))
    >>> with open(page, encoding="utf-8") as f:
    ...     f.read(15)
    '<!DOCTYPE html>'
    >>> out.cleanup()

and `Trainer(..., callbacks=[MemoryReport(path)])` (`train --memory-report
PATH`) for one optimizer step of a run; under `mpiexec -n N`, one page with
each process's step side by side (`write_processes`).

For each workload and strategy the page holds a stacked timeline of one
training step by memory category (memory.py's events), with the forward,
backward, recompute and update phases shaded behind it, and in a
mixed-precision step each Cast event (autocast's copies of an op's inputs
in the op's dtype, and the gradients cast back) marked on the total
(palette.CAST_COLOUR, its own legend entry); hovering shows the
event (op, its record, shapes, bytes allocated and freed by category, the
live total); a control overlays a second strategy's total on the same axes;
and the tape listing of the step is linked to the timeline both ways:
selecting a record marks the span during which it kept its saved arrays.
Below: the budget planner's memory-against-time curves (each point's plan
on hover) and the bench's tables. Every number comes from the results dict
strategies.collect() returns (bench.json holds the same), embedded in the
page as JSON (`<script id="explorer-data">`): the figures (every drawn
value in MiB, a byte count divided by 2**20, which is exact in a float),
and the results without the timelines, so a test can compare them with
bench.json to the byte.

Why Plotly (the optional `report` extra): it is a well-kept charting library
whose Python package carries plotly.js itself (`plotly.offline.get_plotlyjs()`),
so the page inlines it and opens from disk with no network, without a second
tool to bundle scripts (Altair's HTML loads Vega from a CDN unless
vl-convert is installed to inline it). Its traces do what the page needs
without hand-written drawing: stacked areas (`stackgroup`), hover text per
point, shapes for the phase bands and the selected span, and events
(`plotly_click`) to link the chart to the listing. The cost is plotly.js
itself, about 4.8 MB in every page; the data add little beside it. Its mode
bar would offer a "Share chart..." button that uploads the chart to Plotly's
server (plotly.js 4: `showSendToCloud` is on by default); the page turns it
off, so nothing on it sends anything over the network.

The only hand-written JavaScript is the glue (templates/explorer.js, read
into `_GLUE`): it hands each figure to Plotly.newPlot / Plotly.react,
switches strategy and overlay, and links the listing and the timeline. It
and the page's style (templates/explorer.css) are files of their own,
shipped with the package (pyproject's package-data), read with
importlib.resources. bench.md's tables become HTML by markdown-it-py (a
CommonMark parser with GitHub's tables, in the `report` extra beside
Plotly), not by a converter of our own.

Large steps: a stacked area draws at most MAX_DRAWN points per category;
beyond that the events are thinned for drawing only (the lowest and the
highest total of each stretch are kept, so no peak is lost), while the
total's line and the hover keep every event.

What does not live here: the measuring (strategies.py), the events
themselves (memory.py), the colours (palette.py), the PNG plots (plots.py).
"""

import contextlib
import html
import json
import math
import os
from importlib import resources

try:
    import plotly
    import plotly.graph_objects as go
    from markdown_it import MarkdownIt
    from plotly.offline import get_plotlyjs
except ImportError as e:  # the optional `report` extra
    raise ImportError(f"the memory explorer page needs Plotly and markdown-it-py ({e}): pip install -e \".[report]\"") from None

from .. import memory, serialization
from ..memory import Timeline, format_bytes
from ..train import TrainerCallback
from .palette import CAST_COLOUR, CATEGORY_COLOURS, PHASES, STACK, STYLES
from .report import write_text

MIB = 2**20
MAX_DRAWN = 1500  # points drawn per stacked category; the hover keeps every event
CASTS = "Cast: autocast's copies"  # the legend's name of the cast marks (a mixed-precision step's)
# The page's style and its glue (the only hand-written JavaScript), files shipped with the package (package data).
_CSS = (resources.files(__package__) / "templates" / "explorer.css").read_text(encoding="utf-8")
_GLUE = (resources.files(__package__) / "templates" / "explorer.js").read_text(encoding="utf-8")


# -- the pages ----------------------------------------------------------------------------
def write(results, path, tables=None):
    """Write the bench's page (results: what strategies.collect() returns, with the run's details); returns path.

    tables: the Markdown of bench.md (strategies.render), shown at the end.
    """
    write_text(path, page(results, tables))
    return path


def page(results, tables=None):
    """The bench's page as one HTML string."""
    results = json.loads(json.dumps(results, default=_number))  # exactly what bench.json holds
    sections = []
    for workload, data in results.get("timelines", {}).items():
        if not data["strategies"]:
            continue
        steps = {name: Timeline.from_dict(step) for name, step in data["strategies"].items()}
        table_peaks = {r["strategy"]: r["peak_bytes"] for r in results.get("rows", [])
                       if r["workload"] == workload and r["size"] == data["size"] and "peak_bytes" in r}
        sections.append(_timeline_section(f"timeline-{workload.lower()}", _workload_title(results, workload, data["size"]),
                                          steps, _WORKLOAD_NOTES.get(workload, ""), table_peaks))
    charts = [_tradeoff_chart(results, curve, i) for i, curve in enumerate(results.get("tradeoff", []))]
    machine = results.get("machine", {}).get("description", "")
    title = f"tinygrad-ckpt memory explorer: the {results.get('set', '')} set"
    intro = (f"<p class='run'>{html.escape(machine)}"
             + (f"; the run took {results['elapsed_seconds']:.0f} s" if "elapsed_seconds" in results else "") + ".</p>")
    figures = {k: v for k, v in results.items() if k != "timelines"}  # the timelines are in the figures
    return _page(title, intro, sections, charts, tables, figures, bench=True)


def write_timeline(timeline, path, title=None):
    """Write the page of one memory.Timeline (memory.record's); returns path."""
    if not isinstance(timeline, Timeline):
        raise TypeError(f"write_timeline: expected a memory.Timeline (memory.record's), got {type(timeline).__name__}")
    if not timeline.events:
        raise ValueError(f"write_timeline: the timeline {timeline.name!r} has no events: did the recorded call run any op?")
    title = title or f"Memory explorer: {timeline.name}"
    section = _timeline_section("timeline-step", html.escape(timeline.name), {timeline.name: timeline}, "")
    write_text(path, _page(title, "", [section], [], None, None))
    return path


def write_processes(timelines, peaks, path):
    """Write one page of each process's timeline, side by side (`mpiexec -n N train --memory-report`); returns path.

    timelines: process r's memory.Timeline at [r]; peaks: process r's
    memory.peak() by the end of that step, which its panel's title gives.
    """
    sections = []
    for rank, (timeline, peak) in enumerate(zip(timelines, peaks)):
        title = f"process {rank}: {html.escape(timeline.name)}, peak {format_bytes(peak)} ({peak:,} bytes)"
        body, data = _timeline_section(f"timeline-process{rank}", title, {timeline.name: timeline}, "")
        sections.append((body, {**data, "process": rank, "memory_peak": peak}))
    intro = ("<p class='run'>Each process's own bytes, side by side; the peak in each title is memory.py's peak "
             "of that process by the end of this step (the one it prints at the end of a run whose peak came "
             "then).</p>")
    write_text(path, _page(f"Memory explorer: {len(sections)} processes", intro, sections, [], None, None,
                           side_by_side=True))
    return path


class MemoryReport(TrainerCallback):
    """One optimizer step of a training run, all its micro-batches, recorded and written as this page.

    `tinygrad-ckpt train --memory-report PATH`, or Trainer(...,
    callbacks=[MemoryReport(path)]). The path is checked when the report is
    made, before any step; the first optimizer step is recorded (memory.timeline)
    from its first micro-batch to its update, and only the main process writes.
    With several processes (data parallelism, ZeRO: their bytes differ) each
    records its own step, and process 0 gathers them onto one page, side by side.
    """

    def __init__(self, path):
        if not isinstance(path, (str, os.PathLike)) or str(path) == "":
            raise ValueError(f"memory_report must be the path of an HTML file to write, got {path!r}")
        try:  # said now, not after the step has run
            serialization.check_file_writable(path)
        except OSError as e:
            raise type(e)(e.errno, f"memory_report: {e.strerror}") from None
        self.path, self.recording, self.done = path, None, False

    def on_step_begin(self, trainer):
        if not self.done and self.recording is None:
            self.before = memory.current()
            self.recording = contextlib.ExitStack()
            self.events = self.recording.enter_context(memory.timeline())

    def on_step_end(self, trainer):
        """Stop recording, write the page; returns the line to print."""
        if self.recording is None:
            return None
        self.recording.close()
        self.recording, self.done = None, True
        name = f"optimizer step {trainer.state.global_step}"
        timeline = Timeline(self.events, name=name, before=self.before)
        if trainer.world_size > 1:  # every process's timeline and peak to process 0, which writes them
            gathered = trainer.distributed.comm.gather((timeline.to_dict(), memory.peak()[0]))
            if trainer.is_main_process:
                write_processes([Timeline.from_dict(t) for t, _ in gathered], [p for _, p in gathered], self.path)
                return (f"memory report: {self.path} ({os.path.getsize(self.path) / 2**20:.1f} MiB; {name} of each "
                        f"of the {len(gathered)} processes, side by side)")
        if not trainer.is_main_process:
            return None
        write_timeline(timeline, self.path)
        i, peak = timeline.peak()
        return (f"memory report: {self.path} ({os.path.getsize(self.path) / 2**20:.1f} MiB; {name}: {len(timeline)} "
                f"events, peak {format_bytes(peak)} at {timeline.events[i]['op']}, {timeline.events[i]['phase']})")


_WORKLOAD_NOTES = {
    "W1": "A chain of Linear + GELU layers. Each layer saves its input and its GELU's input; "
          "checkpointing keeps only what a segment needs to start again.",
    "W2": "A GPT stack. The selective policy keeps the projections' outputs and recomputes the rest.",
    "W3": "One optimizer step of the same batch, split into micro-batch × steps: one tooth per micro-batch, "
          "the accumulation buffers underneath all of them.",
}


def _workload_title(results, workload, size):
    sizes = results.get("config", {}).get("sizes", {})
    if workload == "W1" and "w1" in sizes:
        w = sizes["w1"]
        return f"W1: deep MLP, {size} layers (width {w['width']}, batch {w['batch']})"
    if workload == "W2" and "w2" in sizes:
        w = sizes["w2"]
        return f"W2: GPT stack, {size} blocks (d_model {w['n_embd']}, {w['n_head']} heads, seq {w['seq']}, batch {w['batch']})"
    if workload == "W3" and "w3" in sizes:
        w = sizes["w3"]
        return (f"W3: accumulation, the W2 model with {size} blocks, effective batch {w['effective_batch']} "
                "(micro-batch × steps)")
    return f"{workload}, size {size}"


# -- one timeline: the figure, the listing, what links them -----------------------------------
def _timeline_section(section_id, title, steps, note, table_peaks=None):
    """A section: its strategies' figures, listings and event→row maps (for the glue), and its HTML.

    table_peaks: strategy -> the bench table's peak of that step (memory.py's
    peak, which also sees moments inside an op), shown beside the chart's.
    """
    names = list(steps)
    views = {name: _step_view(step, name, (table_peaks or {}).get(name)) for name, step in steps.items()}
    options = "".join(f"<option value='{html.escape(n, quote=True)}'>{html.escape(n)}</option>" for n in names)
    controls = ""
    if len(names) > 1:
        controls = (f"<div class='controls'><label>strategy <select class='strategy'>{options}</select></label>"
                    f"<label>compare with <select class='overlay'><option value=''>(none)</option>{options}</select></label>"
                    "<span class='hint'>its total is drawn dashed on the same axes</span></div>")
    listings = "".join(
        f"<div class='listing' data-strategy='{html.escape(n, quote=True)}'{'' if i == 0 else ' hidden'}>"
        f"{views[n]['listing']}</div>" for i, n in enumerate(names))
    body = (f"<section class='timeline' id='{section_id}'><h2>{title}</h2>"
            + (f"<p class='note'>{html.escape(note)}</p>" if note else "") + controls
            + "<div class='pair'><div class='chart timeline-chart'></div>"
            + f"<div class='records'><div class='selection'>Select a record to mark when it kept its saved arrays.</div>{listings}</div></div>"
            + "</section>")
    data = {"id": section_id, "strategies": names,
            "steps": {n: {"figure": views[n]["figure"], "event_rows": views[n]["event_rows"],
                          "rows": views[n]["rows"], "peak": views[n]["peak"]} for n in names}}
    return body, data


def _step_view(timeline, strategy, table_peak=None):
    """The figure of one step, its listing (HTML), each event's listing row, and each row's span.

    The chart's peak is the most live bytes after an event. memory.py's peak
    (the bench table's, `table_peak`) can be higher: it also sees the moment
    inside an op when its result exists and what it frees is not yet freed;
    the annotation then gives both.
    """
    events = timeline.events
    n = len(events)
    totals = timeline.totals()
    records = _records(events)
    drawn = _thin(totals, MAX_DRAWN)
    traces = [go.Scatter(x=drawn, y=[events[i][c] / MIB for i in drawn], name=c, mode="lines", stackgroup="memory",
                         line=dict(width=0, shape="hv", color=CATEGORY_COLOURS[c]), fillcolor=CATEGORY_COLOURS[c], hoverinfo="skip")
              for c in STACK]
    casts = [i for i, e in enumerate(events) if e["op"] == "Cast"]  # autocast's: a copy made, or a gradient cast back
    if casts:  # marked on the total, under its line, which stays the last trace (the glue's overlay takes it)
        traces.append(go.Scatter(x=casts, y=[totals[i] / MIB for i in casts], name=CASTS, mode="markers",
                                 marker=dict(color=CAST_COLOUR, size=7, symbol="diamond", line=dict(width=0.5, color="#222222")),
                                 hoverinfo="skip"))
    traces.append(go.Scatter(
        x=list(range(n)), y=[t / MIB for t in totals], name="total", mode="lines",
        line=dict(width=1.2, shape="hv", color="#222222"), text=[_hover(events, i, n, totals, records) for i in range(n)],
        hovertemplate="%{text}<extra></extra>"))
    peak_i = max(range(n), key=totals.__getitem__) if n else 0
    layout = go.Layout(
        height=470, margin=dict(l=60, r=20, t=24, b=40), hovermode="x", hoverdistance=-1,
        hoverlabel=dict(bgcolor="white", font=dict(size=12, family="ui-monospace, Menlo, Consolas, monospace"), align="left"),
        xaxis=dict(title=dict(text="event: an op's forward (or its recompute), a record's backward, an update; in the order they ran"),
                   range=[-0.5, max(n, 1) + 0.5], showspikes=True, spikemode="across", spikethickness=1, spikecolor="#888",
                   zeroline=False),
        yaxis=dict(title=dict(text="live MiB"), rangemode="tozero", zeroline=False),
        legend=dict(orientation="h", y=-0.16, yanchor="top", x=0, font=dict(size=11)),
        shapes=_phase_bands(events), plot_bgcolor="white",
        annotations=[dict(x=peak_i, y=totals[peak_i] / MIB if n else 0, text=_peak_text(totals[peak_i] if n else 0, table_peak),
                          showarrow=True, arrowhead=2, ax=30, ay=-25, font=dict(size=11))],
    )
    figure = go.Figure(traces, layout).to_plotly_json()
    listing, event_rows, rows = _listing(events, records)
    return {"figure": figure, "listing": listing, "event_rows": event_rows, "rows": rows,
            "peak": {"event": peak_i, "bytes": totals[peak_i] if n else 0, "strategy": strategy}}


def _peak_text(after_event, table_peak):
    """The chart's peak annotation; with the table's peak beside it where the two differ."""
    text = f"peak after an event {format_bytes(after_event)}"
    if table_peak is not None and table_peak != after_event:
        text += f"<br>table's peak {format_bytes(table_peak)}: inside an op"
    return text


def _thin(totals, limit):
    """Indices of the events to draw: all of them, or per stretch the lowest and the highest total."""
    n = len(totals)
    if n <= limit:
        return list(range(n))
    width = math.ceil(n / (limit // 2))
    keep = {0, n - 1}
    for start in range(0, n, width):
        stretch = range(start, min(start + width, n))
        keep.add(min(stretch, key=totals.__getitem__))
        keep.add(max(stretch, key=totals.__getitem__))
    return sorted(keep)


def _phase_bands(events):
    """One shaded band per run of events in the same phase (the first of each phase in the legend)."""
    bands, start, seen = [], 0, set()
    for i in range(1, len(events) + 1):
        if i == len(events) or events[i]["phase"] != events[start]["phase"]:
            phase = events[start]["phase"]
            bands.append(dict(type="rect", xref="x", yref="paper", x0=start, x1=i, y0=0, y1=1, layer="below",
                              fillcolor=PHASES.get(phase, "#eeeeee"), opacity=0.6, line=dict(width=0),
                              name=phase, showlegend=phase not in seen))
            seen.add(phase)
            start = i
    return bands


# -- records: the tape listing of the step ------------------------------------------------------
def _records(events):
    """Every record the step put on a tape: {(tape, index): {first, last, number, where, ...}}.

    first: the event of its forward; last: the event of its backward, when
    its saved arrays were freed (the step's end if it had none). number:
    its index counted from the step's first record on that tape. where: ""
    on the step's tape, else which Checkpoint record's backward re-ran it.
    """
    records = {}
    for i, e in enumerate(events):
        if "tape" not in e:
            continue
        key = (e["tape"], e["record"])
        if e["kind"] == "op":
            records[key] = {"first": i, "last": len(events) - 1, "op": e["op"], "phase": e["phase"],
                            "shapes": e.get("output_shapes", []), "saved": e.get("saved", 0),
                            "saved_parameters": e.get("saved_parameters", 0), "freed": False}
        elif key in records:
            records[key].update(last=i, freed=True)
    tapes = sorted({tape for tape, _ in records}, key=lambda t: min(r["first"] for (tt, _), r in records.items() if tt == t))
    main = tapes[0] if tapes else None
    lowest = {t: min(i for tt, i in records if tt == t) for t in tapes}
    for (tape, index), r in records.items():
        r["number"] = index - lowest[tape]
    parents = {}
    for t in tapes[1:]:  # a recompute tape lives inside its Checkpoint record's backward
        start = min(r["first"] for (tt, _), r in records.items() if tt == t)
        parent = next((e for e in events[start:] if e["kind"] == "backward" and e.get("tape", t) < t), None)
        if parent is not None and (parent["tape"], parent["record"]) in records:
            parents[t] = records[(parent["tape"], parent["record"])]
    for (tape, _), r in records.items():
        if tape == main:
            r["where"] = ""
        elif tape in parents:
            p = parents[tape]
            r["where"] = f"recomputed in the backward of {p['op']} #{p['number']}" + (f" ({p['where']})" if p["where"] else "")
        else:
            r["where"] = f"tape {tape}"
    return records


def _listing(events, records):
    """(the listing's HTML table, each event's row or -1, each row's [first, last] event)."""
    ordered = sorted(records.items(), key=lambda kv: kv[1]["first"])
    main = ordered[0][0][0] if ordered else None
    micro = _micro_batches(events, main)
    head = "<tr><th>#</th><th>op</th><th>output</th><th>saved for backward</th><th>kept (events)</th></tr>"
    lines, rows, row_of = [], [], {}
    group = None
    for key, r in ordered:
        label = r["where"] or (f"micro-batch {micro[r['first']]} of {micro['count']}" if micro["count"] > 1 else "the step's tape")
        if label != group:
            lines.append(f"<tr class='group'><td colspan='5'>{html.escape(label)}</td></tr>")
            group = label
        row_of[key] = len(rows)
        rows.append([r["first"], r["last"]])
        params = r["saved_parameters"]
        saved = format_bytes(r["saved"]) + (f" (+{params} parameter{'s' if params > 1 else ''})" if params else "")
        shapes = ", ".join(_shape(s) for s in r["shapes"])
        alive = f"{r['first']}–{r['last']}" if r["freed"] else f"{r['first']}–end (still kept when the step ended)"
        lines.append(f"<tr class='record' data-row='{len(rows) - 1}' tabindex='0'><td>{r['number']}</td>"
                     f"<td>{html.escape(r['op'])}</td><td>{html.escape(shapes)}</td><td>{html.escape(saved)}</td>"
                     f"<td>{alive}</td></tr>")
    event_rows = [row_of.get((e["tape"], e["record"]), -1) if "tape" in e else -1 for e in events]
    if not rows:
        return "<p>No op of this call was put on a tape (nothing was recorded for backward).</p>", event_rows, rows
    return f"<table><thead>{head}</thead><tbody>{''.join(lines)}</tbody></table>", event_rows, rows


def _micro_batches(events, main):
    """Which micro-batch each event is in: a forward on the step's tape after a backward starts the next."""
    number, after_backward, of = 1, False, {}
    for i, e in enumerate(events):
        if e.get("tape") == main and e["kind"] == "op" and e["phase"] == "forward" and after_backward:
            number, after_backward = number + 1, False
        if e["kind"] == "backward" and e.get("tape") == main:
            after_backward = True
        of[i] = number
    of["count"] = number
    return of


# -- what hovering an event shows ------------------------------------------------------------
def _hover(events, i, n, totals, records):
    e = events[i]
    where = ""
    if "tape" in e:
        r = records.get((e["tape"], e["record"]))
        if r is not None:
            where = f"record #{r['number']}" + (f", {r['where']}" if r["where"] else "")
    lines = []
    if e["kind"] == "op":
        lines.append(f"<b>{html.escape(e['op'])}</b>  {e['phase']}" + (f" · {where}" if where else " · not on a tape: it keeps nothing for backward"))
        if "input_shapes" in e:
            lines.append("in " + ", ".join(_shape(s) for s in e["input_shapes"]) + " → out "
                         + ", ".join(_shape(s) for s in e["output_shapes"]))
        if "saved" in e:
            params = e.get("saved_parameters", 0)
            lines.append(f"saved for backward: {format_bytes(e['saved'])}"
                         + (f" (+{params} parameter{'s' if params > 1 else ''}, counted under parameters)" if params else ""))
    elif e["kind"] == "backward":
        phase = "backward" if e["phase"] == "backward" else f"backward, in the {e['phase']}"
        lines.append(f"<b>{html.escape(e['op'])}</b>  {phase}" + (f" · {where}" if where else ""))
        r = records.get((e.get("tape"), e.get("record")))
        if r is not None:
            lines.append(f"it lets go of what it saved, kept since event {r['first']}")
    else:
        lines.append(f"<b>{html.escape(e['op'])}</b>  {e['phase']} (not an op)")
    lines.append("allocated: " + _by_category(e.get("allocated", {})))
    lines.append("freed: " + _by_category(e.get("freed", {})))
    lines.append(f"live: {format_bytes(totals[i])} ({totals[i]:,} B); activations {format_bytes(e['activations'])}")
    lines.append(f"event {i} of {n}")
    return "<br>".join(lines)


def _by_category(counts):
    parts = [f"{format_bytes(b)} {c}" for c, b in counts.items() if b]
    return ", ".join(parts) if parts else "—"


def _shape(shape):
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


# -- the planner's curves ------------------------------------------------------------------------
UNIFORM = ("none", "every layer", "sqrt(n)", "selective", "selective, half blocks")


def _tradeoff_chart(results, curve, i):
    """Memory against time: the budget plans (a line, each plan on hover) and the uniform strategies."""
    base = curve["baseline"]
    traces = []
    plans = sorted((r for r in curve["rows"] if not r.get("infeasible")), key=lambda r: -r["fraction"])
    if plans and base.get("step_seconds"):
        traces.append(go.Scatter(
            x=[r["step_seconds"] / base["step_seconds"] for r in plans], y=[r["activation_peak_bytes"] / MIB for r in plans],
            mode="lines+markers+text", name="budget plans (measured)", line=dict(color="#222222"), cliponaxis=False,
            text=[r["strategy"].replace("budget ", "") for r in plans], textposition="top right",
            customdata=[[html.escape(r.get("plan", "")), format_bytes(r["activation_peak_bytes"]),
                         format_bytes(r.get("planner_predicted_bytes", 0))] for r in plans],
            hovertemplate="<b>%{text} budget</b><br>%{customdata[0]}<br>measured peak of saved activations "
                          "%{customdata[1]} (planner: %{customdata[2]})<br>step time × %{x:.2f}<extra></extra>"))
    uniform = [r for r in results["rows"] if r["workload"] == curve["workload"] and r["size"] == curve["size"]
               and r["strategy"] in UNIFORM and not r.get("infeasible")]
    for r in uniform:
        if not base.get("step_seconds"):
            continue
        colour, _ = STYLES.get(r["strategy"], (None, "o"))
        traces.append(go.Scatter(
            x=[r["step_seconds"] / base["step_seconds"]], y=[r["activation_peak_bytes"] / MIB], mode="markers",
            name=r["strategy"], marker=dict(size=11, color=colour, symbol="diamond"),
            hovertemplate=f"<b>{html.escape(r['strategy'])}</b><br>peak of saved activations "
                          f"{format_bytes(r['activation_peak_bytes'])}<br>step time × %{{x:.2f}}<extra></extra>"))
    infeasible = [r["strategy"] for r in curve["rows"] if r.get("infeasible")]
    layout = go.Layout(
        height=380, margin=dict(l=60, r=20, t=40, b=50), plot_bgcolor="white", hovermode="closest",
        title=dict(text=f"{curve['workload']} size {curve['size']}: memory against time", font=dict(size=14)),
        xaxis=dict(title=dict(text="step time / no checkpointing (median)"), gridcolor="#eeeeee"),
        yaxis=dict(title=dict(text="peak of saved activations, MiB"), rangemode="tozero", gridcolor="#eeeeee"),
        annotations=[dict(text="out of reach: " + ", ".join(infeasible), xref="paper", yref="paper", x=1, y=1,
                          showarrow=False, xanchor="right", font=dict(size=11, color="#a33"))] if infeasible else [],
    )
    return {"id": f"tradeoff-{i}", "figure": go.Figure(traces, layout).to_plotly_json()}


# -- the page ----------------------------------------------------------------------------------------
def _page(title, intro, sections, charts, tables, results, bench=False, side_by_side=False):
    """The whole page. bench: the bench's page (its tables hold each step's peak, memory.py's);
    side_by_side: the sections in one row (one a process: write_processes)."""
    data = {"timelines": [d for _, d in sections], "charts": charts, "results": results}
    overlay = any(len(d["strategies"]) > 1 for _, d in sections)  # a 'compare with' control is on the page
    casts = any(t["name"] == CASTS for _, d in sections for step in d["steps"].values() for t in step["figure"]["data"])
    peaks = ("The marked peak is the most live bytes after an event. memory.py's own peak, the tables' "
             "<em>peak MiB</em>, can be higher: it also sees the moment inside an op when its result exists and "
             "what it frees is not yet freed; the mark then gives both." if bench else
             "The marked peak is the most live bytes after an event; memory.py's own peak (memory.peak()) can be "
             "higher, as it also sees the moment inside an op when its result exists and what it frees is not yet "
             "freed.")
    nav = ""
    if charts or tables:  # a page of several parts: links to each
        nav = "".join(f"<a href='#{d['id']}'>{html.escape(d['id'].split('-', 1)[1].upper())}</a>" for _, d in sections)
        nav += ("<a href='#tradeoff'>planner</a>" if charts else "") + ("<a href='#tables'>tables</a>" if tables else "")
    legend = "".join(f"<span class='swatch' style='background:{CATEGORY_COLOURS[c]}'></span>{c} " for c in STACK)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<header><h1>{html.escape(title)}</h1>{intro}<nav>{nav}</nav></header>",
        "<details class='howto' open><summary>How to read this page</summary>",
        f"<p>Each chart is one training step, event by event: {legend}stacked, live bytes after each event "
        "as memory.py counts them (each buffer once). Bands behind it: the forward, the backward, a checkpointed "
        "segment's recompute, and the update (accumulation, the optimizer step). Hover to see an event: the op, its "
        "record on the tape, its shapes, the bytes it allocated and freed by category, and the live total."
        + (f" In a mixed-precision step (autocast) the <span class='swatch' style='background:{CAST_COLOUR}'></span>"
           "diamonds on the total mark its Cast events: in the forward a copy of an op's input in the dtype autocast "
           "gives the op (16 bits for a matrix product, float32 for a LayerNorm or the loss), in the backward a "
           "gradient cast back." if casts else "") + "</p>",
        "<p>The table beside each chart is the tape of the step: one record per op that kept something for backward. "
        "Click a record (or a point of the chart) to mark when it kept its saved arrays: from its forward to its "
        "backward (an array that another record or your code also holds lives on)."
        + (" <em>compare with</em> draws another strategy's total, dashed, on the same axes; its events need not "
           "line up with these (a recompute adds events)." if overlay else "")
        + f" {peaks}</p></details>",
    ]
    bodies = "".join(body for body, _ in sections)
    parts.append(f"<div class='side-by-side' style='--panels: {len(sections)}'>{bodies}</div>" if side_by_side else bodies)
    if charts:
        parts.append("<section id='tradeoff'><h2>The budget planner: memory against time</h2>"
                     "<p class='note'>Each point of the line is a plan the planner chose for a budget (a fraction of "
                     "the no-checkpoint peak), run and measured; hover for its segments (* checkpointed, (...) a nested "
                     "plan).</p><div class='charts'>"
                     + "".join(f"<div class='chart' id='{c['id']}'></div>" for c in charts) + "</div></section>")
    if tables:
        parts.append(f"<section id='tables'>{markdown_html(tables)}</section>")
    parts.append(f"<footer>Plotly {plotly.__version__}; written by tinygrad_ckpt.bench.explorer.</footer>")
    payload = json.dumps(data, separators=(",", ":"), default=_number).replace("</", "<\\/")
    parts.append(f"<script type='application/json' id='explorer-data'>{payload}</script>")
    parts.append(f"<script>{get_plotlyjs()}</script>")
    parts.append(f"<script>{_GLUE}</script></body></html>")
    return "\n".join(parts)


def markdown_html(text):
    """The Markdown the bench writes (headings, paragraphs, tables) as HTML, by markdown-it-py (CommonMark, GFM tables).

    Three touches for this page: headings one level down (the page's title is its one h1),
    each table in a scrolling <div class='table'>, and cells that hold a number right-aligned.
    """
    tokens = _MARKDOWN.parse(text)
    for i, token in enumerate(tokens):
        if token.type in ("heading_open", "heading_close"):
            token.tag = f"h{min(int(token.tag[1]) + 1, 4)}"
        elif token.type == "td_open" and _numeric(tokens[i + 1].content):
            token.attrJoin("class", "num")
    return _MARKDOWN.renderer.render(tokens, _MARKDOWN.options, {})


def _numeric(text):
    """A table cell that holds a number (or a dash for none): right-aligned, as numbers line up."""
    text = text.strip()
    return text == "—" or text.replace(".", "", 1).replace("e-", "", 1).replace("e+", "", 1).lstrip("+-").rstrip("%").isdigit()


def _wrapped_table(renderer, tokens, i, options, env):
    """<table> in a <div class='table'>, so that a wide table scrolls on its own, not the page."""
    tag = renderer.renderToken(tokens, i, options, env)
    return f"<div class='table'>{tag}" if tokens[i].type == "table_open" else f"{tag}</div>\n"


_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table")  # html off: a "<" in a cell is text
_MARKDOWN.add_render_rule("table_open", _wrapped_table)
_MARKDOWN.add_render_rule("table_close", _wrapped_table)


def _number(x):
    """JSON for NumPy scalars (as report.write_json writes them)."""
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")
