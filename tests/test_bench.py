"""`tinygrad-ckpt bench` end to end, at toy sizes (--tiny): files, and figures that must agree.

Timings are not asserted (they depend on the machine); byte figures are:
the measured peak of saved activations equals the analytic count in every
row, as tests/test_activations.py shows layer by layer.
"""

import json
import os

import pytest

from tinygrad_ckpt import cli

try:
    import matplotlib  # noqa: F401

    HAVE_MATPLOTLIB = True
except ImportError:
    HAVE_MATPLOTLIB = False

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("peak_memory.png", "timeline_w1.png", "timeline_w2.png", "tradeoff.png")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    code = cli.main(["bench", "--tiny", "--output-dir", str(out)])
    with open(out / "bench.json") as f:
        results = json.load(f)
    return code, out, results


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
    assert w2 == {"none", "every layer", "sqrt(n)", "budget 50%", "budget 25%", "selective", "selective, half blocks"}
    w3 = [r["strategy"] for r in results["rows"] if r["workload"] == "W3"]
    assert w3 == ["4 x 1", "2 x 2", "1 x 4"]
    assert [len(c["rows"]) for c in results["tradeoff"]] == [2, 2]


def test_measured_activation_peaks_equal_the_analytic_count(tiny_run):
    _, _, results = tiny_run
    rows = results["rows"] + [r for c in results["tradeoff"] for r in c["rows"]]
    measured = [r for r in rows if not r.get("infeasible")]
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


def test_accumulation_gives_the_same_gradients_and_less_activation_memory(tiny_run):
    _, _, results = tiny_run
    w3 = [r for r in results["rows"] if r["workload"] == "W3"]
    assert all(r["max_grad_difference"] < 1e-5 for r in w3)  # float32 sums in another order
    peaks = [r["activation_peak_bytes"] for r in w3]  # micro-batch 4, 2, 1
    assert peaks == sorted(peaks, reverse=True) and peaks[-1] < peaks[0]
    assert w3[0]["peak_by_category"]["accumulation"] == 0 < w3[1]["peak_by_category"]["accumulation"]


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
