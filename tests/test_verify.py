"""`tinygrad-ckpt verify` at tiny sizes: every row passes, a planted bug fails its rows (exit 1), bad flags exit 2."""

import re
from contextlib import contextmanager

import pytest

from tinygrad_ckpt import backend, cli
from tinygrad_ckpt.accumulate import GradientAccumulator
from tinygrad_ckpt import checkpoint as checkpoint_module
from tinygrad_ckpt.testing import strict_cupy, verify

TINY = ["--n-layer", "2", "--n-head", "2", "--n-embd", "8", "--block-size", "6", "--vocab-size", "11",
        "--mlp-layers", "4", "--mlp-width", "6", "--batch-size", "4"]


def table_rows(out):
    """{(model, strategy): verdict} from the printed table."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0] in ("GPT", "MLP"):
            rows[cells[0], cells[1]] = cells[6]
    return rows


def test_every_strategy_passes_and_the_table_says_so(capsys):
    assert cli.main(["verify", *TINY, "--no-mpi"]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    strategies = [s for _, s in rows]
    for expected in ("every block", "every layer", "sqrt(n) segments (1)", "split blocks (attention and feed-forward apart)",
                     "every block, policy offload_matmuls", "every layer, policy selective_attention",
                     "accumulation: short last group, [2, 1, 1] of gradient_accumulation_steps 4"):
        assert expected in strategies, expected
    assert sum(s.startswith("planner at") for s in strategies) == 4 and sum(s.startswith("nested") for s in strategies) == 2
    assert rows["GPT", "accumulation: 2 processes (MPI) x 2 micro-batches"] == "skipped: --no-mpi"
    # with 2 blocks, nested plans reach no lower than one level of checkpoints: that row says so
    assert rows["GPT", "planner below one level"] == ("skipped: no nested plan goes below one level's minimum "
                                                      "for 2 layers")
    [below] = [s for m, s in rows if m == "MLP" and s.startswith("planner below one level: ")]
    assert "(" in below and rows["MLP", below] == "pass"  # an inner plan: nested
    assert [v for v in rows.values() if not v.startswith("skipped")] == ["pass"] * (len(rows) - 2)
    assert re.search(rf"{len(rows) - 2} strategies checked: {len(rows) - 2} passed, 0 failed, 2 skipped", out)
    assert "| model | strategy | float64 max abs | float64 max rel | float32 max rel | tolerance (rel) | verdict |" in out


def only(monkeypatch, *strategies):
    """Make verify run only the rows whose strategy starts with one of these (a planted bug needs a few)."""
    every = verify.rows
    monkeypatch.setattr(verify, "rows", lambda *a, **k: [r for r in every(*a, **k) if r.strategy.startswith(strategies)])


def test_a_recompute_that_forgets_the_dropout_masks_fails_its_rows(monkeypatch, capsys):
    # The planted bug: a segment never learns which generators its forward drew from, so its
    # recompute draws other dropout masks.
    monkeypatch.setattr(checkpoint_module, "random", _Forgetful)
    only(monkeypatch, "every block", "every layer", "accumulation: 2 micro-batches")
    assert cli.main(["verify", *TINY, "--dropout", "0.3", "--no-mpi"]) == 1
    rows = table_rows(capsys.readouterr().out)
    assert rows["GPT", "every block"].startswith("FAIL: float64: ")
    # Keeping every op's result, its gradients are right, but its recompute still draws the masks (they are
    # drawn before the op runs, and replayed from the stash): the generator ends elsewhere, and that fails too.
    kept = rows["GPT", "every block, policy everything_saveable"]
    assert kept.startswith("FAIL: float64: a random generator the run draws from ends in another state"), kept
    assert rows["MLP", "every layer"] == "pass"  # no dropout
    assert all(v == "pass" for (_, s), v in rows.items() if s.startswith("accumulation") and "MPI" not in s)


def test_a_mean_of_means_fails_the_accumulation_rows(monkeypatch, capsys):
    original = GradientAccumulator.write_grads

    def mean_of_means(self):  # the planted bug: divide by micro-batches x their mean size, not the items
        self.items = self.micro_batches * max(1, self.items // self.micro_batches)
        return original(self)

    monkeypatch.setattr(GradientAccumulator, "write_grads", mean_of_means)
    only(monkeypatch, "every block", "accumulation: 4 micro-batches of 1", "accumulation: 2 micro-batches, padded")
    assert cli.main(["verify", *TINY, "--no-mpi"]) == 1
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert rows["GPT", "accumulation: 4 micro-batches of 1"].startswith("FAIL")
    assert rows["GPT", "every block"] == "pass"
    failed = [k for k, v in rows.items() if v.startswith("FAIL")]
    assert [s for _, s in failed] == ["accumulation: 2 micro-batches, padded ([5, 6, 1, 5] tokens per example)",
                                      "accumulation: 4 micro-batches of 1"]
    assert f"{len(rows)} strategies checked: {len(rows) - 2} passed, 2 failed" in out


def test_on_a_device_through_the_strict_stand_in(capsys):
    previous = backend.set_cuda_module(strict_cupy)
    try:
        assert cli.main(["verify", *TINY, "--device", "cuda", "--no-mpi"]) == 0
    finally:
        backend.set_cuda_module(previous)
    assert "on cuda" in capsys.readouterr().out


@pytest.mark.skipif(verify.mpi_unavailable_reason() is not None, reason=str(verify.mpi_unavailable_reason()))
def test_the_two_process_row_runs_under_mpiexec(capsys):
    assert cli.main(["verify", *TINY]) == 0
    assert table_rows(capsys.readouterr().out)["GPT", "accumulation: 2 processes (MPI) x 2 micro-batches"] == "pass"


@pytest.mark.parametrize("flags, message", [
    (["--n-layer", "0"], "--n-layer must be at least 1, got 0"),
    (["--n-embd", "30", "--n-head", "4"], r"--n-embd \(30\) must be divisible by --n-head \(4\)"),
    (["--batch-size", "2"], r"--batch-size must be at least 4 \(the accumulation rows cut it into uneven "
                            r"micro-batches\), got 2"),
    (["--dropout", "1.5"], r"--dropout must be in \[0, 1\), got 1.5"),
    (["--device", "tpu"], "--device: unknown device 'tpu'"),
])
def test_bad_flags_are_one_line_errors_with_status_2(flags, message, capsys):
    assert cli.main(["verify", *TINY, *flags]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(rf"tinygrad-ckpt verify: error: {message}.*\n", err), err


class _Forgetful:
    """random.py's observing(), seeing nothing."""

    @staticmethod
    @contextmanager
    def observing(on=True):
        yield []


def test_the_progress_line_is_rewritten_in_place_on_a_terminal_only():
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    shown = Terminal()
    progress = verify._Progress(12, stream=shown)
    progress.show(3, "GPT: every block, float32")
    progress.close()
    assert shown.getvalue() == "\r\033[K[ 3/12] GPT: every block, float32\r\033[K"
    quiet = io.StringIO()
    verify._Progress(12, stream=quiet).show(3, "GPT: every block, float32")
    assert quiet.getvalue() == ""
