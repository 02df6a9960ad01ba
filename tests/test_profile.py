"""`bench --profile` (bench/profile.py): every op's time, forward and backward, against its floor.

Timings are not asserted (they depend on the machine); what is asserted is
what must hold on any machine: every op the step runs has a row, calls per
step are the model's, the rows and "between ops" add up to the step, only
the matrix-product ops have a floor, and the timing observer is gone after
the block, even when the block fails.
"""

import json

import numpy
import pytest

from tinygrad_ckpt import cli
from tinygrad_ckpt.bench import profile, workloads
from tinygrad_ckpt import observe


def test_every_op_of_the_step_has_a_row_and_the_rows_add_up():
    size = workloads.TINY.w2  # 2 blocks, dropout 0.1
    result = profile.profile_workload(size, repeats=1)  # one round: medians are the figures themselves
    ops = result["ops"]
    assert ops[("Linear", "forward")]["calls"] == 4 * size.n_layer + 1  # 4 projections a block, the lm_head
    assert ops[("Linear", "backward")]["calls"] == 4 * size.n_layer + 1
    assert ops[("MatMul", "forward")]["calls"] == 2 * size.n_layer
    assert ops[("Dropout", "forward")]["calls"] == 3 * size.n_layer + 1
    assert sum(r["seconds"] for r in ops.values()) == pytest.approx(result["step"])
    with_floor = {key for key, r in ops.items() if r["floor"] is not None}
    assert with_floor == {("Linear", "forward"), ("Linear", "backward"), ("MatMul", "forward"), ("MatMul", "backward")}
    text = "\n".join(profile.table(result))
    assert "| Linear | backward |" in text and "| between ops |" in text and "| step |" in text


def test_ops_inside_a_checkpoint_are_timed_once():
    # A checkpoint's record runs its segment inside its forward: its own row must leave that time out.
    from tinygrad_ckpt import Tensor
    from tinygrad_ckpt.checkpoint import checkpoint

    model = workloads.TINY.w1.model(numpy.random.default_rng(0))
    x = Tensor(numpy.ones((2, workloads.TINY.w1.width), dtype=numpy.float32))
    with profile.OpTimer() as timer:
        checkpoint(model.blocks, x).sum().backward()
    phases = {phase for _, phase in timer.seconds}
    assert phases == {"forward", "recompute", "backward"}
    assert timer.calls[("GELU", "forward")] == workloads.TINY.w1.n_layers
    # The recompute stops early (recompute.py): the segment's last GELU is rebuilt from its saved input, not run.
    assert timer.calls[("GELU", "recompute")] == workloads.TINY.w1.n_layers - 1
    assert all(s >= 0 for s in timer.seconds.values())


def test_the_timing_observer_is_removed_even_when_the_block_fails():
    with pytest.raises(ZeroDivisionError):
        with profile.OpTimer() as timer:
            assert observe.observers == [timer]
            1 / 0
    assert observe.observers == []


def test_bench_profile_writes_the_tables(tmp_path, capsys):
    assert cli.main(["bench", "--profile", "--tiny", "--repeats", "1", "--output-dir", str(tmp_path)]) == 0
    table = (tmp_path / "profile.md").read_text()
    figures = json.loads((tmp_path / "profile.json").read_text())
    assert table.strip() in capsys.readouterr().out
    assert [w["size"] for w in figures["workloads"]] == [
        {k: v for k, v in vars(size).items()} for size in workloads.TINY.compare]
    for label in map(workloads.label, workloads.TINY.compare):
        assert f"### {label}:" in table


def test_compare_and_profile_together_is_a_clear_error(tmp_path, capsys):
    assert cli.main(["bench", "--compare", "--profile", "--tiny", "--output-dir", str(tmp_path)]) == 2
    assert "choose one" in capsys.readouterr().err


def test_the_profile_runs_on_the_strict_gpu_stand_in():
    # --device cuda: the engine and the floor on the device; here the strict
    # CuPy stand-in, which refuses any implicit host copy.
    from tinygrad_ckpt import backend
    from tinygrad_ckpt.testing import strict_cupy

    previous = backend.set_cuda_module(strict_cupy)
    try:
        result = profile.profile_workload(workloads.TINY.w2, repeats=1, device="cuda")
    finally:
        backend.set_cuda_module(previous)
    assert result["ops"][("MatMul", "backward")]["floor"] > 0
    assert sum(r["seconds"] for r in result["ops"].values()) == pytest.approx(result["step"])


def test_device_cuda_without_a_gpu_is_a_clear_error(tmp_path, capsys):
    from tinygrad_ckpt import backend

    if backend.cuda_is_available():
        pytest.skip("a GPU is present: --device cuda works here")
    assert cli.main(["bench", "--profile", "--tiny", "--device", "cuda", "--output-dir", str(tmp_path)]) == 2
    assert "--device cuda: device='cuda' needs CuPy" in capsys.readouterr().err
