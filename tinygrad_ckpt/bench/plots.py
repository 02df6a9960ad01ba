"""The bench's pictures, drawn with matplotlib (the optional `plot` extra).

    peak_memory.png     peak memory against depth (W1) and blocks (W2), per strategy:
                        the whole peak, and the saved activations (measured, and
                        the analytic count as crosses); lines that coincide stay
                        visible (hollow markers of different sizes) and the
                        legend says which they coincide with
    timeline_w1.png     one training step per strategy, live bytes by category
    timeline_w2.png     op by op: the forward rise, the recompute bumps (marked
                        along the top), the backward fall
    timeline_w3.png     one optimizer step per split of the batch: a tooth per
                        micro-batch
    tradeoff.png        budget plans: activation peak against step time, each
                        point measured by running the plan, beside the uniform
                        schedules

Input is the dict strategies.collect() returns (and bench.json holds), so
the plots can be redrawn from a saved JSON file: `plots.draw_all(json.load(f), dir)`.
Every picture is written through the package's one atomic writer, readable
by everyone as any file the user writes (the umask decides, as for open()),
and only if it is a different picture from the file already there
(`same_picture`): a figure redrawn from data that moved by rounding (another
BLAS kernel, another thread count) leaves a committed file, and git status,
alone. The tutorials save their figures through `save` too.
Colours of memory categories and recompute marks come from palette.py, which
the tutorials use too.
`plot_timeline(timeline)` draws one memory.Timeline (memory.record's), and
each panel of the timeline pictures.

What does not live here: measuring (strategies.py), the memory categories
themselves (memory.py), the colours (palette.py), the interactive page
(explorer.py).
"""

import io
import os

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.image  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy  # noqa: E402

from ..memory import Timeline  # noqa: E402
from ..serialization import atomic_write  # noqa: E402
from .palette import CATEGORY_COLOURS, RECOMPUTE_COLOUR, SEGMENT_BACKWARD_COLOUR, STACK, STYLES  # noqa: E402

MIB = 2**20


def _style(strategy):
    colour, marker = STYLES.get(strategy, (None, "o"))
    return {"color": colour, "marker": marker}


def draw_all(results, output_dir):
    """Draw every picture into output_dir; returns the paths written."""
    paths = []
    path = os.path.join(output_dir, "peak_memory.png")
    save(peak_memory(results), path)
    paths.append(path)
    for workload, timeline in results["timelines"].items():
        if timeline["strategies"]:
            path = os.path.join(output_dir, f"timeline_{workload.lower()}.png")
            save(timelines(workload, timeline), path)
            paths.append(path)
    path = os.path.join(output_dir, "tradeoff.png")
    save(tradeoff(results), path)
    paths.append(path)
    return paths


# Two renderings are the same picture when at most this fraction of their pixels differ by more than
# PIXEL_CHANGE of full intensity in some channel. A curve moved by a fraction of a pixel (data that
# moved by rounding) changes the antialiased edge's shade, by less than PIXEL_CHANGE; one digit of a
# label changed is about 70 pixels at full contrast, more than 1 in 10,000 of a 600 x 400 picture.
PIXEL_CHANGE = 0.25
CHANGED_FRACTION = 1e-4


def save(fig, path, dpi=110):
    """Save fig as a PNG at path, atomically (serialization.atomic_write), and close it.

    If path holds the same picture already (same_picture), it is left as it
    is, byte for byte. Returns True if the file was written. The PNG carries
    no "Software" field, so the bytes do not change with matplotlib's version.
    """
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, dpi=dpi, format="png", metadata={"Software": None})
    finally:
        plt.close(fig)
    png = buffer.getvalue()
    if os.path.exists(path) and same_picture(path, png):
        return False
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_write(path, "wb") as f:
        f.write(png)
    return True


def same_picture(a, b):
    """Whether two PNGs (paths, or bytes) show the same picture, up to what rounding moves.

    Same size, and at most CHANGED_FRACTION of the pixels differ by more
    than PIXEL_CHANGE (of full intensity) in some channel.
    """
    a, b = (matplotlib.image.imread(io.BytesIO(x) if isinstance(x, bytes) else x) for x in (a, b))
    if a.shape != b.shape:
        return False
    changed = numpy.abs(a.astype(numpy.float32) - b.astype(numpy.float32)) > PIXEL_CHANGE
    if changed.ndim == 3:
        changed = changed.any(axis=-1)
    return changed.mean() <= CHANGED_FRACTION


def peak_memory(results):
    """Top: the step's whole peak; bottom: the peak of saved activations (x: the analytic count).

    Strategies often have the same peak (in W1 the peak is the parameters,
    gradients and optimizer state, whatever is checkpointed): each line gets
    a hollow marker, the first drawn the largest, so that markers drawn on
    top of each other still show, and a legend label that names the line it
    coincides with.
    """
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), squeeze=False)
    for col, (workload, xlabel) in enumerate((("W1", "depth (layers)"), ("W2", "blocks"))):
        rows = [r for r in results["rows"] if r["workload"] == workload and not r.get("infeasible")
                and not r.get("precision")]  # mixed precision: one size only, in its table and the timelines
        strategies = list(dict.fromkeys(r["strategy"] for r in rows))
        drawn = ({}, {})  # per panel: strategy -> its points, to find lines that coincide
        for k, strategy in enumerate(strategies):
            points = sorted((r["size"], r) for r in rows if r["strategy"] == strategy)
            sizes = [s for s, _ in points]
            colour = None
            for panel, key in enumerate(("peak_bytes", "activation_peak_bytes")):
                ys = [r[key] / MIB for _, r in points]
                same = next((other for other, xy in drawn[panel].items() if xy == (sizes, ys)), None)
                drawn[panel][strategy] = (sizes, ys)
                style = {**_style(strategy), "markersize": max(4, 11 - 1.5 * k), "markerfacecolor": "none",
                         "markeredgewidth": 1.5}
                if colour is not None:
                    style["color"] = colour
                label = strategy if same is None else f"{strategy} (same as {same})"
                line, = axes[panel][col].plot(sizes, ys, "-", label=label, **style)
                colour = line.get_color()
            axes[1][col].plot(sizes, [r["predicted_activation_bytes"] / MIB for _, r in points], "x", color="black",
                              markersize=5, zorder=3)
        axes[0][col].set_title(f"{workload}: peak live memory of a training step")
        axes[1][col].set_title(f"{workload}: peak of saved activations (x = predicted)")
        for row in (0, 1):
            ax = axes[row][col]
            ax.set_xlabel(xlabel)
            ax.set_ylabel("MiB")
            if rows:
                ax.set_xticks(sorted({r["size"] for r in rows}))
                ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def timelines(workload, timeline):
    """One panel per strategy: live bytes by category, event by event, recompute marked."""
    strategies = timeline["strategies"]
    fig, axes = plt.subplots(len(strategies), 1, figsize=(11, 2.4 * len(strategies)), squeeze=False)
    steps = {name: Timeline.from_dict(data) for name, data in strategies.items()}
    top = max((t for step in steps.values() for t in step.totals()), default=1) / MIB
    for ax, (strategy, step) in zip(axes[:, 0], steps.items()):
        draw_timeline(ax, step, f"{workload} size {timeline['size']}, {strategy}", top)
    legend = {}
    for ax in axes[:, 0]:  # one legend for all panels: categories, and the recompute marks
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(legend.values(), legend.keys(), loc="upper center", ncol=8, fontsize=8)
    axes[-1, 0].set_xlabel("event: an op's forward (or its recompute), a record's backward, or an update, in the order they ran")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
    return fig


def plot_timeline(timeline, ax=None):
    """One memory.Timeline drawn into ax (default: a new figure); returns the Figure.

    Live bytes by category after each event, the phases shaded. Needs
    matplotlib (pip install -e ".[plot]").
    """
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 3.6))
    else:
        fig = ax.figure
    draw_timeline(ax, timeline, timeline.name)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.set_xlabel("event: an op's forward (or its recompute), a record's backward, or an update")
    fig.tight_layout()
    return fig


def draw_timeline(ax, timeline, title, top=None):
    """Live MiB by category after each event, stacked; recompute marked along the top, backward dashed."""
    events = timeline.events
    steps = range(len(events))
    ax.stackplot(steps, *[[e[c] / MIB for e in events] for c in STACK],
                 labels=STACK, colors=[CATEGORY_COLOURS[c] for c in STACK], step="post")
    _shade(ax, events, lambda e: e["phase"] == "recompute" and e["kind"] == "op", RECOMPUTE_COLOUR,
           "recompute (forward again)", hatch="////")
    _shade(ax, events, lambda e: e["phase"] == "recompute" and e["kind"] != "op", SEGMENT_BACKWARD_COLOUR,
           "the segment's backward")
    _shade(ax, events, lambda e: e["phase"] == "update", "#9e9e9e", "update (accumulate, optimizer)")
    first_backward = next((i for i, e in enumerate(events) if e["phase"] != "forward"), None)
    if first_backward is not None:
        ax.axvline(first_backward, color="black", lw=0.8, ls="--")
    top = top if top is not None else max(timeline.totals(), default=1) / MIB
    ax.set_ylim(0, top * 1.05 or 1)
    ax.set_xlim(0, max(len(events) - 1, 1))
    ax.set_ylabel("MiB")
    ax.set_title(f"{title}: forward | backward (dashed line)", fontsize=9)


def _shade(ax, events, inside, colour, label, hatch=None):
    """Mark the runs of consecutive events for which inside(event) holds: a band along the top.

    hatch: a pattern over the band (white lines), so that the recompute band
    differs from the one beside it in more than colour.
    """
    start = None
    labelled = False
    for i, e in enumerate(events + [None]):
        if e is not None and inside(e):
            start = i if start is None else start
        elif start is not None:
            ax.axvspan(start, i, ymin=0.93, ymax=1.0, facecolor=colour, edgecolor="white" if hatch else colour,
                       hatch=hatch, lw=0, label=None if labelled else label)
            ax.axvspan(start, i, color=colour, alpha=0.08, lw=0)
            labelled, start = True, None


def tradeoff(results):
    """Budget plans (a line through the budgets) and uniform schedules (markers): memory against time."""
    curves = results["tradeoff"]
    fig, axes = plt.subplots(1, max(len(curves), 1), figsize=(6 * max(len(curves), 1), 4.5), squeeze=False)
    uniform_strategies = ("none", "every layer", "sqrt(n)", "selective", "selective, half blocks")
    for ax, curve in zip(axes[0], curves):
        base = curve["baseline"]
        measured = [r for r in curve["rows"] if not r.get("infeasible")]
        if base is not None and measured:
            # in the order of the budget, from the largest: the curve's parameter
            points = [(r["step_seconds"] / base["step_seconds"], r["activation_peak_bytes"] / MIB, r)
                      for r in sorted(measured, key=lambda r: -r["fraction"])]
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-", color="black", label="budget plans (measured)")
            for x, y, r in points:
                ax.annotate(r["strategy"].replace("budget ", ""), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        uniform = [r for r in results["rows"] if r["workload"] == curve["workload"] and r["size"] == curve["size"]
                   and r["strategy"] in uniform_strategies and not r.get("infeasible")]
        for r in uniform:
            if base is not None:
                ax.plot(r["step_seconds"] / base["step_seconds"], r["activation_peak_bytes"] / MIB,
                        linestyle="none", markersize=9, label=r["strategy"], **_style(r["strategy"]))
        ax.set_title(f"{curve['workload']} size {curve['size']}: memory against time")
        ax.set_xlabel("step time / no checkpointing (median)")
        ax.set_ylabel("peak of saved activations, MiB")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
