"""`tinygrad-ckpt bench` end to end, at toy sizes (--tiny): files, and figures that must agree.

Timings are not asserted (they depend on the machine); byte figures are:
the measured peak of saved activations equals the analytic count in every
row, as tests/test_activations.py shows layer by layer.
"""

import os
import stat

import pytest

from tinygrad_ckpt import cli, memory
from tinygrad_ckpt.bench import palette, strategies, workloads
from tinygrad_ckpt.bench.report import mib
from tinygrad_ckpt.schedules import segment_bounds

try:
    import matplotlib  # noqa: F401

    HAVE_MATPLOTLIB = True
except ImportError:
    HAVE_MATPLOTLIB = False

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("peak_memory.png", "timeline_w1.png", "timeline_w2.png", "timeline_w3.png", "tradeoff.png")


@pytest.fixture
def tiny_run(tiny_bench_run):
    return tiny_bench_run  # tests/conftest.py: one run for this file and test_explorer.py


def test_bench_exits_cleanly_and_writes_json_and_markdown(tiny_run):
    code, out, results = tiny_run
    assert code == 0
    assert (out / "bench.md").read_text().startswith("## tinygrad-ckpt bench (tiny set)")
    assert {r["workload"] for r in results["rows"]} == {"W1", "W2", "W3"}
    assert results["machine"]["cpu_count"] >= 1 and results["elapsed_seconds"] > 0
    assert not [p for p in os.listdir(out) if p.startswith(".")]  # atomic writes left no temporary file behind


def test_every_strategy_has_a_row(tiny_run):
    _, _, results = tiny_run
    w2 = {r["strategy"] for r in results["rows"] if r["workload"] == "W2"}
    assert w2 == {"none", "every layer", "sqrt(n)", "budget 50%", "budget 25%", "selective", "selective, half blocks",
                  "bf16 autocast", "fp16 autocast, loss scaled"}
    w3 = [r["strategy"] for r in results["rows"] if r["workload"] == "W3"]
    assert w3 == ["4 x 1", "2 x 2", "1 x 4"]
    assert [len(c["rows"]) for c in results["tradeoff"]] == [2, 2]


def test_measured_activation_peaks_equal_the_analytic_count(tiny_run):
    _, _, results = tiny_run
    rows = results["rows"] + [r for c in results["tradeoff"] for r in c["rows"]]
    measured = [r for r in rows if not r.get("infeasible") and not r.get("precision")]  # activations.py: float32
    assert len(measured) >= 15
    for r in measured:
        assert r["activation_peak_bytes"] == r["predicted_activation_bytes"], (r["workload"], r["size"], r["strategy"])
        assert sum(r["peak_by_category"].values()) == r["peak_bytes"]
        # tracemalloc saw at least what memory.py counted (it also sees op temporaries)
        assert r["tracemalloc_peak_rise_bytes"] >= r["peak_rise_bytes"] - 64 * 1024


def test_checkpointing_lowers_the_activation_peak_and_costs_recompute(tiny_run):
    _, _, results = tiny_run
    for workload in ("W1", "W2"):
        rows = {(r["size"], r["strategy"]): r for r in results["rows"] if r["workload"] == workload}
        for (size, strategy), r in rows.items():
            if strategy in ("every layer", "sqrt(n)") and size > 1:
                base = rows[(size, "none")]
                assert r["activation_peak_bytes"] < base["activation_peak_bytes"]
                assert r["recompute_flops"] > 0 and base["recompute_flops"] == 0
                # Early stop and the skipped ops recompute less than the same strategy in full:
                # each segment's last block runs only up to what backward needs.
                assert r["recompute_flops"] < r["recompute_flops_full"] <= r["forward_flops"]


def test_accumulation_gives_the_same_gradients_and_less_activation_memory(tiny_run):
    _, _, results = tiny_run
    w3 = [r for r in results["rows"] if r["workload"] == "W3"]
    assert all(r["max_grad_difference"] < 1e-5 for r in w3)  # float32 sums in another order
    peaks = [r["activation_peak_bytes"] for r in w3]  # micro-batch 4, 2, 1
    assert peaks == sorted(peaks, reverse=True) and peaks[-1] < peaks[0]
    assert w3[0]["peak_by_category"]["accumulation"] == 0 < w3[1]["peak_by_category"]["accumulation"]


# -- mixed precision: float32, bfloat16, float16 ---------------------------------------------
def _precision_rows(results, workload):
    """{precision: row} of the plain step at the workload's mixed-precision size; float32 is the "none" row."""
    config = strategies.TINY  # at the size whose timeline is drawn
    size = config.timeline_w1_depth if workload == "W1" else config.timeline_w2_blocks
    rows = {r.get("precision", "float32"): r for r in results["rows"] if r["workload"] == workload and r["size"] == size
            and (r["strategy"] == "none" or r.get("precision"))}
    assert set(rows) == {"float32", "bfloat16", "float16"}, (workload, sorted(rows))
    return rows


def test_mixed_precision_rows_exist_for_w1_and_w2_and_are_tabled(tiny_run):
    _, out, results = tiny_run
    text = (out / "bench.md").read_text()
    assert "### Mixed precision: the plain step in float32, and under autocast (bf16=True, fp16=True)" in text
    table = text.split("### Mixed precision")[1].split("###")[0]
    for workload in ("W1", "W2"):
        rows = _precision_rows(results, workload)
        for precision, r in rows.items():
            assert r["step_seconds"] > 0 and r["repeats"] == strategies.TINY.repeats
            assert f"| {workload} | {r['size']} | {precision} | {mib(r['activation_peak_bytes'], 2)} |" in table
        assert rows["float16"].get("loss_scale") == 2.0**16  # no step overflowed: none skipped, the scale not halved
        assert "loss_scale" not in rows["bfloat16"]  # bfloat16 needs no scaler
    # only the chosen sizes have them, and the checkpointing summary leaves them out
    assert sum(1 for r in results["rows"] if r.get("precision")) == 4
    summary = text.split("### When accumulation and checkpointing are needed")[1]
    assert "autocast" not in summary


def test_w1_s_mixed_precision_saved_bytes_are_the_policy_s_count(tiny_run):
    """Counted from autocast's policy, not from the bench: each Linear saves its input in 16 bits (2 bytes
    an element), and, where its input needs a gradient (every layer but the first), the 16-bit copy of its
    weight; each GELU its 16-bit input; the loss's square its float32 difference (a Sub of a 16-bit output
    and a float32 target runs in float32). float32 saves 4 bytes an element and no weight. So the activations
    are half of float32's, but for the loss's float32, and the weight copies come on top: at W1's reference
    width (1024) and batch (256) a weight copy is 4 times a layer's 16-bit activations."""
    _, _, results = tiny_run
    w1 = workloads.TINY.w1_at(strategies.TINY.timeline_w1_depth)
    n, b, h = w1.n_layers, w1.batch, w1.width
    rows = _precision_rows(results, "W1")
    assert rows["float32"]["activation_peak_bytes"] == (2 * n + 2) * 4 * b * h
    bf16 = (n + 1) * 2 * b * h + n * 2 * h * h + n * 2 * b * h + 4 * b * h
    assert rows["bfloat16"]["activation_peak_bytes"] == bf16
    # float16: the same copies, and the loss scale, a float32 scalar the scaled loss's multiply keeps
    assert rows["float16"]["activation_peak_bytes"] == bf16 + 4
    for r in rows.values():  # the master weights stay float32
        assert r["peak_by_category"]["parameters"] == rows["float32"]["peak_by_category"]["parameters"]


def test_w2_s_mixed_precision_saves_less_than_float32_and_more_than_half(tiny_run):
    """A GPT's blocks keep float32 where the policy says so (LayerNorm, softmax, the loss) and the residual
    stream is float32: so more than half of float32's bytes; its activations outweigh the weight copies."""
    _, _, results = tiny_run
    rows = _precision_rows(results, "W2")
    f32, bf16 = rows["float32"]["activation_peak_bytes"], rows["bfloat16"]["activation_peak_bytes"]
    assert f32 / 2 < bf16 < f32
    assert rows["float16"]["activation_peak_bytes"] == bf16 + 4  # and the loss scale
    for r in rows.values():
        assert r["peak_by_category"]["parameters"] == rows["float32"]["peak_by_category"]["parameters"]


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason='matplotlib is not installed (pip install -e ".[plot]"): no PNGs to check')
def test_plots_are_png_files(tiny_run):
    _, out, _ = tiny_run
    for name in PLOTS:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000, name


def test_no_plots_writes_tables_only(tmp_path, capsys):
    assert cli.main(["bench", "--tiny", "--no-plots", "--repeats", "1", "--output-dir", str(tmp_path)]) == 0
    assert sorted(os.listdir(tmp_path)) == ["bench.json", "bench.md"]
    printed = capsys.readouterr().out
    assert "plots: skipped" in printed and "| depth | strategy |" in printed


def test_bad_arguments_are_clear_errors(tmp_path, capsys):
    assert cli.main(["bench", "--tiny", "--repeats", "0", "--output-dir", str(tmp_path)]) == 2
    assert "--repeats must be at least 1" in capsys.readouterr().err


def test_written_files_are_readable_by_everyone_as_open_would_make_them(tiny_run, tmp_path):
    _, out, _ = tiny_run
    for name in os.listdir(out):
        mode = stat.S_IMODE(os.stat(out / name).st_mode)
        assert mode == 0o644, (name, oct(mode))  # umask 022, as open() would give: not 0600


# -- what the tables say ---------------------------------------------------------------
def test_the_summary_quotes_its_source_and_its_theory_never_contradicts_itself(tiny_run):
    _, out, results = tiny_run
    text = (out / "bench.md").read_text()
    assert "Hugging Face's guide (transformers v4.47.1, perf_train_gpu_one)" in text
    assert "https://huggingface.co/docs/transformers/v4.47.1/perf_train_gpu_one" in text
    assert "often quoted" not in text and "seed" not in text
    rows = results["rows"] + [r for c in results["tradeoff"] for r in c["rows"]]
    for r in (r for r in rows if r.get("theory_ratio") and r["workload"] != "W3"):
        if r["theory_ratio"] > 4 / 3 + 1e-9:  # more than one extra forward: only a nested plan does that
            assert r.get("nested"), (r["strategy"], r["theory_ratio"])
    nested = strategies._theory({"theory_ratio": 1.51, "nested": True})
    assert nested.startswith("+51%") and "more than once" in nested and "+33%" not in nested
    assert "at most one extra forward, +33%" in strategies._theory({"theory_ratio": 1.2, "nested": False})


def test_a_strategy_that_saves_nothing_at_a_size_says_why(tiny_run):
    _, out, results = tiny_run
    one_segment = [r for r in results["rows"] if r["strategy"] == "sqrt(n)" and r["size"] <= 2]
    assert one_segment and all("rounds to 1 segment" in r["note"] for r in one_segment)
    assert "sqrt(n) (sqrt(2) rounds to 1 segment: the whole stack is one checkpoint" in (out / "bench.md").read_text()


def test_the_quick_set_uses_sizes_where_sqrt_n_cuts_the_chain():
    """(The full set keeps W2 at 2 blocks, a reference size: there the row says why sqrt(n) saves nothing.)"""
    sizes = workloads.QUICK
    for n in (*sizes.w1_depths, *sizes.w2_blocks):
        assert len(segment_bounds(n, "sqrt")) >= 2, n
    config = strategies.QUICK
    assert config.tradeoff_w2_blocks in sizes.w2_blocks and config.timeline_w2_blocks in sizes.w2_blocks


# -- one palette ---------------------------------------------------------------------------
def _rgb(hex_colour):
    return [int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]


def test_one_colour_per_memory_category_and_recompute_marks_apart_from_them():
    assert set(palette.CATEGORY_COLOURS) == set(memory.CATEGORIES)
    marks = (palette.RECOMPUTE_COLOUR, palette.SEGMENT_BACKWARD_COLOUR, palette.CAST_COLOUR)
    colours = list(palette.CATEGORY_COLOURS.values()) + list(marks)
    assert len({c.lower() for c in colours}) == len(colours)
    for mark in marks:  # far from every category's colour
        for category, colour in palette.CATEGORY_COLOURS.items():
            distance = sum((a - b) ** 2 for a, b in zip(_rgb(mark), _rgb(colour))) ** 0.5
            assert distance > 80, (mark, category)


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason='matplotlib is not installed (pip install -e ".[plot]"): no PNGs to check')
def test_the_timelines_draw_categories_and_marks_in_the_palettes_colours(tiny_run):
    from matplotlib.colors import to_hex

    from tinygrad_ckpt.bench import plots

    _, _, results = tiny_run
    fig = plots.timelines("W2", results["timelines"]["W2"])
    ax = fig.axes[1]  # "every layer": the stack and the recompute marks
    stacked = {c.get_label(): to_hex(c.get_facecolor()[0]) for c in ax.collections}
    assert {k: stacked[k] for k in palette.STACK} == {k: palette.CATEGORY_COLOURS[k].lower() for k in palette.STACK}
    marks = {p.get_label(): to_hex(p.get_facecolor()) for p in ax.patches if p.get_label() and p.get_label()[0] != "_"}
    assert marks["recompute (forward again)"] == palette.RECOMPUTE_COLOUR.lower()
    plots.plt.close(fig)


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason='matplotlib is not installed (pip install -e ".[plot]"): no PNGs to check')
def test_coinciding_lines_in_peak_memory_stay_visible_and_are_named(tiny_run):
    from tinygrad_ckpt.bench import plots

    _, _, results = tiny_run
    fig = plots.peak_memory(results)
    for ax in fig.axes:
        lines = [line for line in ax.get_lines() if not line.get_label().startswith("_") and line.get_marker() != "x"]
        seen = {}
        for line in lines:
            xy = (tuple(line.get_xdata()), tuple(line.get_ydata()))
            assert line.get_markerfacecolor() == "none"  # hollow: a marker under it still shows
            if xy in seen:  # drawn on top of an earlier line: smaller, and the legend says which
                assert line.get_markersize() < seen[xy].get_markersize()
                assert f"(same as {seen[xy].get_label().split(' (')[0]})" in line.get_label()
            seen.setdefault(xy, line)
    plots.plt.close(fig)


def test_an_infeasible_budget_s_note_never_shows_the_budget_and_the_least_alike():
    """A budget of 25 % that no plan meets, where the least plan reaches 25.03 %: the note must not read
    'no plan fits 25 %: the least any plan reaches is ... (25 % ...)'."""
    full = 88 << 20
    note = strategies.infeasible_note(0.25, int(0.25 * full), int(0.2503 * full), full)
    assert note == ("no plan fits the budget of 25% of no checkpointing (22.00 MiB, 25.00%): the least any plan "
                    "reaches is 22.03 MiB (25.03%)")
    assert strategies.infeasible_note(0.25, int(0.25 * full), int(0.31 * full), full).endswith("27.28 MiB (31%)")


# -- bench --kinds: every model kind ------------------------------------------------------------
def test_kinds_measures_every_kind_with_every_strategy_and_the_meta_device_agrees(tmp_path, capsys):
    """Each kind's real step equals its meta step to the byte; checkpointing saves bytes and costs FLOPs; the
    largest micro-batch of part 2 fits and the next does not."""
    import json

    from tinygrad_ckpt.bench import kinds

    assert cli.main(["bench", "--kinds", "--tiny", "--repeats", "1", "--output-dir", str(tmp_path)]) == 0
    assert sorted(os.listdir(tmp_path)) == ["kinds.json", "kinds.md"]
    results = json.loads((tmp_path / "kinds.json").read_text())
    printed = capsys.readouterr().out
    for part in ("part1", "part2"):
        rows = results[part]
        assert {(r["kind"], r["strategy"]) for r in rows} == {(k, s) for k in kinds.KINDS for s in kinds.STRATEGIES}
        by = {(r["kind"], r["strategy"]): r for r in rows}
        for kind in kinds.KINDS:
            none, every = by[kind, "none"], by[kind, "every"]
            assert every["saved_bytes"] < none["saved_bytes"], kind
            assert none["flops_ratio"] == 1 and every["flops_ratio"] > 1, kind
            if part == "part2":
                assert every["largest_micro_batch"] > none["largest_micro_batch"] > 0, kind
    assert all(r["meta_equal"] for r in results["part1"])
    # the 16-bit column: the real step under autocast is the meta step's to the byte, and differs from float32's
    assert all(r["half_meta_equal"] for r in results["part1"])
    assert any(r["half_peak_bytes"] != r["peak_bytes"] for r in results["part1"])
    assert all(r["as_predicted"] for r in results["part2"])
    assert "NOT" not in printed and "NO " not in printed
    assert (tmp_path / "kinds.md").read_text().splitlines()[1] == printed.splitlines()[1]


def test_kinds_is_a_run_of_its_own(tmp_path, capsys):
    assert cli.main(["bench", "--kinds", "--compare", "--tiny", "--output-dir", str(tmp_path)]) == 2
    assert "--compare, --profile and --kinds are separate runs: choose one" in capsys.readouterr().err
