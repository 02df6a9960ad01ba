"""The comparison with PyTorch, HIPS autograd and mygrad (bench/compare.py), at a tiny size.

Each peer that is installed must compute the same loss and gradients as this
engine, in float64 with dropout off, with and without checkpointing: that is
what makes the benchmark's figures a comparison of the same computation. A
peer that is not installed is skipped here (the reason is shown) and reported
by the benchmark, never an error there. No timing is asserted.
"""

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tinygrad_ckpt.bench import compare, workloads
from tinygrad_ckpt.schedules import segment_bounds

from .helpers import TORCH_INSTALL

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the peers' models live with the benchmarks
import peers  # noqa: E402  (benchmarks/peers.py)

TINY = {"W1": workloads.TINY.w1, "W2": workloads.TINY.w2}
STRATEGIES = ("none", "every", "sqrt")


def _installed(name):
    return importlib.util.find_spec(name) is not None


@pytest.mark.parametrize("peer", ["torch", "autograd", "mygrad"])
@pytest.mark.parametrize("workload", ["W1", "W2"])
def test_peer_computes_our_loss_and_gradients(peer, workload):
    if not _installed(peer):
        pytest.skip(f"{peer} is not installed (" + (TORCH_INSTALL if peer == "torch" else 'pip install -e ".[compare]"') + ")")
    checks = compare.agreement(workload, TINY[workload], [compare.Ours.name, peer], STRATEGIES)
    peer_strategies = STRATEGIES if compare.has_checkpoint(peer) else ("none",)  # mygrad has no checkpoint
    assert set(checks) == {(compare.Ours.name, s) for s in STRATEGIES} | {(peer, s) for s in peer_strategies}
    for (name, strategy), (ok, worst, what) in checks.items():
        # float64: only the order of roundings differs, ~1e-15 relative; RTOL is 1e-7.
        assert ok, f"{name} with strategy {strategy}: {what} differs from ours by {worst:.1e} (relative)"


def test_segments_are_cut_where_checkpoint_sequential_cuts_them():
    # The peers' checkpointed segments must be ours, or the rows compare different things.
    for n in range(1, 70):
        for how in ("every", "sqrt"):
            assert compare.segments(n, how) == segment_bounds(n, how)
    assert compare.segments(8, "none") is None


def test_a_missing_peer_is_reported_not_an_error(monkeypatch):
    monkeypatch.setattr(compare, "peer_version", lambda name: None)  # as if no peer were installed
    monkeypatch.setattr(compare, "gemm_throughput", lambda device: 1.0)  # the 2048 x 2048 anchor is slow here
    rows, notes = compare.compare({"W1": TINY["W1"]}, strategies=("none", "every"), repeats=1,
                                  check=False, progress=lambda what: None)
    assert {r["library"] for r in rows} == {compare.Ours.name, "floor"}  # the floor: a row per strategy
    for peer in ("torch", "autograd", "mygrad"):
        assert any(note.startswith(f"{peer}: not installed") for note in notes)
    ours = {r["strategy"]: r for r in rows if r["library"] == compare.Ours.name}
    # Checkpointing every layer saves less for backward than saving everything.
    assert 0 < ours["every"]["saved"] < ours["none"]["saved"]
    assert all(r["step"] > 0 and r["peak"] >= r["saved"] for r in ours.values())
    floors = [r for r in rows if r["library"] == "floor"]
    assert [r["strategy"] for r in floors] == ["none", "every"] and all(r["step"] > 0 for r in floors)
    text = compare.table(rows, notes)
    assert "tinygrad_ckpt" in text and "torch: not installed" in text
    assert "| x floor | GFLOP/s |" in text and any("GEMM throughput: 1.0 GFLOP/s" in note for note in notes)


def test_unknown_library_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown library torhc"):
        compare.compare({"W1": TINY["W1"]}, libraries=("tinygrad_ckpt", "torhc"), progress=lambda what: None)


def test_a_peer_that_computes_something_else_is_caught(monkeypatch):
    if not _installed("torch"):
        pytest.skip(f"torch is not installed ({TORCH_INSTALL})")
    import torch

    # GELU without the tanh approximation: close to ours, but not the same function.
    def exact_gelu_layers(self, h, start, stop):
        for i in range(start, stop):
            h = torch.nn.functional.gelu(torch.nn.functional.linear(
                h, self.params[f"blocks.{i}.0.weight"], self.params[f"blocks.{i}.0.bias"]))
        return h

    monkeypatch.setattr(peers.Torch, "_mlp_layers", exact_gelu_layers)
    checks = compare.agreement("W1", TINY["W1"], [compare.Ours.name, "torch"], ("none",))
    ok, worst, _ = checks["torch", "none"]
    assert not ok and worst > compare.RTOL


def test_bench_compare_writes_the_table_and_figures(tmp_path, monkeypatch, capsys):
    import json

    from tinygrad_ckpt import cli

    monkeypatch.setattr(compare, "peer_version", lambda name: None)  # this engine alone: fast, and no timing asserted
    monkeypatch.setattr(compare, "gemm_throughput", lambda device: 1.0)  # the 2048 x 2048 anchor is slow here
    assert cli.main(["bench", "--compare", "--tiny", "--repeats", "1", "--output-dir", str(tmp_path)]) in (0, None)
    table = (tmp_path / "compare.md").read_text()
    figures = json.loads((tmp_path / "compare.json").read_text())
    printed = capsys.readouterr().out
    assert "tinygrad_ckpt" in table and table.strip().strip("`").strip() in printed  # the file is what was printed
    # The tiny set's comparison: W1, and W2 with dropout 0.1 and 0, each with its floor.
    assert list(dict.fromkeys(r["label"] for r in figures["rows"])) == [
        workloads.label(size) for size in workloads.TINY.compare]
    assert {r["library"] for r in figures["rows"]} == {compare.Ours.name, "floor"}
    assert all(r["step"] > 0 for r in figures["rows"])


def test_the_comparison_runs_on_the_strict_gpu_stand_in(monkeypatch):
    # --device cuda: this engine and the floor on the device (here the strict
    # CuPy stand-in, which refuses any implicit host copy); the NumPy-only peers are left out.
    from tinygrad_ckpt import backend
    from tinygrad_ckpt.testing import strict_cupy

    previous = backend.set_cuda_module(strict_cupy)
    monkeypatch.setattr(compare, "gemm_throughput", lambda device: 1.0)  # the 2048 x 2048 anchor is slow here
    try:
        rows, notes = compare.compare([TINY["W2"]], libraries=("tinygrad_ckpt", "autograd"), strategies=("none",),
                                      repeats=1, device="cuda", progress=lambda what: None)
    finally:
        backend.set_cuda_module(previous)
    assert {r["library"] for r in rows} == {compare.Ours.name, "floor"}
    assert all(r["step"] > 0 for r in rows)
    if _installed("autograd"):
        assert any(note.startswith("autograd: not run on cuda") for note in notes)


def test_targets_read_the_ratios_of_the_same_rounds():
    size = workloads.TINY.w1
    rows = [dict(workload="W1", label="W1, N=4", size=size, strategy="none", library=lib, version="", step=step,
                 saved=saved, peak=saved, note="", flops=10**9)
            for lib, step, saved in (("tinygrad_ckpt", 0.10, 5), ("torch", 0.11, 6), ("floor", 0.09, None))]
    found = {what: (value, met) for what, value, met in compare.targets(rows)}
    assert found["W1, N=4 none: step time ours / torch <= 1.0"] == ("0.91", True)
    assert found["W1, N=4 none: step time ours / floor <= 1.15"] == ("1.11", True)
    assert found["W1, N=4 none: peak ours <= torch"][1]
    text = compare.table(rows)
    assert "| none | tinygrad_ckpt | 100.0 | 1.00 | 1.11 | 10.0 |" in text  # x floor and GFLOP/s


def test_the_peak_target_compares_our_arrays_with_torch_tensors():
    # tracemalloc's whole peak also counts our Python objects, PyTorch's profiler only its tensors:
    # the target reads our arrays alone, and the whole peak stays a line of its own.
    size = workloads.TINY.w1
    mib = compare.MIB
    ours = dict(workload="W1", label="W1, N=4", size=size, strategy="sqrt", library="tinygrad_ckpt", version="",
                step=0.1, saved=6 * mib, peak=16.2 * mib, array_peak=16.0 * mib, engine_peak=11 * mib, note="")
    torch = dict(ours, library="torch", saved=7 * mib, peak=16.1 * mib, array_peak=None, engine_peak=None)
    found = {what: (value, met) for what, value, met in compare.targets([ours, torch])}
    assert found["W1, N=4 sqrt: peak of arrays alone (PyTorch: of tensors) ours <= torch"] == ("16.00 vs 16.10 MiB", True)
    assert found["W1, N=4 sqrt: peak with our Python objects ours <= torch"] == ("16.20 vs 16.10 MiB", False)
    assert found["W1, N=4 sqrt: saved ours <= torch"][1]
    assert "arrays alone 16.00 MiB" in compare.table([ours, torch])


def test_with_dropout_the_gpt_must_be_five_percent_ahead_of_torch():
    """W2 at dropout 0.1 aims at 0.95 of PyTorch's step, at dropout 0 at 1.0 (the issue's targets)."""
    rows = [dict(workload="W2", label=f"W2, dropout {p}", size=replace(workloads.TINY.w2, dropout=p), strategy="none",
                 library=lib, version="", step=step, saved=None, peak=None, note="", flops=10**9)
            for p in (0.1, 0.0) for lib, step in (("tinygrad_ckpt", 0.097), ("torch", 0.1))]
    found = {what: met for what, value, met in compare.targets(rows)}
    assert found == {"W2, dropout 0.1 none: step time ours / torch <= 0.95": False,
                     "W2, dropout 0.0 none: step time ours / torch <= 1.0": True}


def test_a_busy_machine_is_flagged_and_a_quiet_one_is_not(monkeypatch):
    monkeypatch.setattr(compare, "gemm_throughput", lambda device: 1.0)
    for load, flagged in ((1000.0, True), (0.0, False)):
        monkeypatch.setattr(compare, "load_average", lambda: load)
        _, notes = compare.compare([TINY["W1"]], libraries=("tinygrad_ckpt",), strategies=("none",), repeats=1,
                                   check=False, progress=lambda what: None)
        assert any(note.startswith("WARNING: the load average rose") for note in notes) == flagged


def test_bench_compare_finds_the_peers_in_the_clone_and_says_so_without_one(tmp_path, monkeypatch):
    # From a clone, load_peers is benchmarks/peers.py (the module this file imported, not a second copy).
    assert compare.load_peers() is peers.PEERS and set(peers.PEERS) == set(compare.LIBRARIES) - {compare.Ours.name}
    # Installed from a wheel there is no benchmarks/ beside the package: this engine and the floor run alone,
    # and each peer's note says where its model lives.
    monkeypatch.setattr(compare, "BENCHMARKS", str(tmp_path))
    monkeypatch.setattr(compare, "gemm_throughput", lambda device: 1.0)  # the 2048 x 2048 anchor is slow here
    assert compare.load_peers() == {}
    rows, notes = compare.compare([TINY["W1"]], strategies=("none",), repeats=1, check=False,
                                  progress=lambda what: None)
    assert {r["library"] for r in rows} == {compare.Ours.name, "floor"}
    for name in ("torch", "autograd", "mygrad"):
        assert f"{name}: {compare.NO_PEERS}" in notes
