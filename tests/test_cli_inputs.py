"""What a newcomer tripped on at the command line, each pinned: `fit --memory 3090`, the planner's row when
every block wins, `bench` without ml_dtypes, `bench --kinds` without a progress line."""

import re
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinygrad_ckpt import cli, fit
from tinygrad_ckpt.bench import strategies
from tinygrad_ckpt.schedules import describe

GPU_NAMES = ("t4", "v100-16gb", "v100-32gb", "a10", "l4", "rtx-3090", "rtx-4090", "a100-40gb", "a100-80gb",
             "h100-80gb", "h200")


# -- fit --memory: a bare number is a GPU's name more often than a size -----------------------------
@given(st.integers(min_value=0, max_value=10**12), st.sampled_from(["", " ", "  "]))
def test_a_bare_number_is_refused_with_the_gpu_names_and_how_to_write_bytes(n, pad):
    with pytest.raises(ValueError, match="is a bare number") as error:
        fit.device_memory_bytes(f"{pad}{n}{pad}")
    message = str(error.value)
    assert all(name in message for name in GPU_NAMES) and f"{n}B for bytes" in message


@pytest.mark.parametrize("number, gpus", [("3090", ["rtx-3090"]), ("4090", ["rtx-4090"]),
                                          ("80", ["a100-80gb", "h100-80gb"]), ("7", [])])
def test_a_bare_number_that_is_part_of_a_gpu_s_name_suggests_it(number, gpus):
    with pytest.raises(ValueError) as error:
        fit.device_memory_bytes(number)
    suggested = re.search(r"did you mean (.*)\?", str(error.value))
    assert (suggested.group(1).split(" or ") if suggested else []) == gpus


@pytest.mark.parametrize("text, size", [("24GiB", 24 << 30), ("16 GB", 16 * 10**9), ("17179869184B", 1 << 34),
                                        ("1.5 kib", 1536), ("500MB", 500 * 10**6), ("2 TB", 2 * 10**12)])
def test_a_size_with_its_unit_is_taken(text, size):
    assert fit.device_memory_bytes(text)[0] == size


@pytest.mark.parametrize("name", ["h300", "a100", "3090ti", "rtx3090"])
def test_a_gpu_name_not_in_the_table_is_not_called_a_bare_number(name):
    with pytest.raises(ValueError, match=rf"device memory '{name}' is neither a GPU preset \(t4, .*\) nor a size"):
        fit.device_memory_bytes(name)


def test_an_int_is_bytes():
    assert fit.device_memory_bytes(1 << 34)[0] == 1 << 34


@pytest.mark.parametrize("argv, message", [
    (["--memory", "3090"], r"--memory '3090' is a bare number: give a GPU preset \(t4, .*; did you mean rtx-3090\?\) "
                           r"or a size with its unit \(3090B for bytes, 24GiB, 16GB\)"),
    (["--reserve", "512"], r"--reserve '512' is not a size with its unit, such as 2GiB, 500MB or 536870912B"),
])
def test_fit_command_refuses_a_bare_number_in_one_line(argv, message, capsys):
    assert cli.main(["fit", *argv]) == 2
    assert re.fullmatch(rf"tinygrad-ckpt fit: error: {message}\n", capsys.readouterr().err)


# -- the planner's row: its label says what its plan is, and the plan is one short line ---------------
def every_block(n):
    return [(i, i + 1, True) for i in range(n)]


@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 12), st.booleans()), min_size=1, max_size=6))
def test_a_plan_s_text_writes_each_run_of_alike_segments_once(runs):
    """runs: (size, count, checkpointed); a run of 3 or more becomes first ... last (count segments of size)."""
    merged = []  # two drawn runs side by side with the same size and flag are one run
    for size, count, how in runs:
        if merged and merged[-1][0::2] == (size, how):
            count += merged.pop()[1]
        merged.append((size, count, how))
    runs = merged
    segments, start = [], 0
    for size, count, how in runs:
        segments += [(start + k * size, start + (k + 1) * size, how) for k in range(count)]
        start += size * count
    text = fit.table._plan_text(segments, start)
    if segments == every_block(start):
        assert text.startswith(f"every block checkpointed, each of the {start}")
        return
    assert text.endswith(" (blocks; * = checkpointed)")
    assert describe(segments[:1]) in text and describe(segments[-1:]) in text
    # no more than two segments of every run are spelled out, so the text does not grow with the plan
    assert text.count("[") <= 2 * len(runs)
    for size, count, how in runs:
        if count >= 3:
            assert f"({count} segments of {'1 block' if size == 1 else f'{size} blocks'})" in text


def test_the_planner_row_of_gpt2_xl_says_every_block_when_every_block_won(capsys):
    """GPT-2 XL's 48 blocks: the planner cuts only every 2 blocks; where checkpointing every block measures
    better, the row takes that plan, and its label and plan line must say so, not 'cuts every 2 blocks'."""
    assert cli.main(["fit", "--model", "gpt2-xl", "--memory", "a100-40gb", "--effective-batch-size", "64"]) == 0
    out = capsys.readouterr().out
    [row] = [line for line in out.splitlines() if line.startswith("planner at the budget")
             and not line.startswith("planner at the budget: schedules")]
    [plan] = [line for line in out.splitlines() if line.startswith("planner's plan: ")]
    assert row.startswith("planner at the budget: every block ") and "cuts every" not in row
    assert plan == "planner's plan: every block checkpointed, each of the 48 a segment of its own (as the 'every " \
                   "block' row)"
    every = next(line for line in out.splitlines() if line.startswith("every block  "))
    assert row.split()[-12:] == every.split()[-12:]  # the same figures as the every-block row


# -- bench without ml_dtypes: the set runs, without the bf16 rows, and says so first --------------------
def test_bench_without_ml_dtypes_leaves_out_the_bf16_rows_and_says_so_first(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # `import ml_dtypes` raises ImportError
    rows, why = strategies.precision_rows()
    assert list(rows) == ["float16"] and "ml_dtypes" in why
    assert cli.main(["bench", "--tiny", "--repeats", "1", "--no-plots", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    note = out.index("note: the bf16 autocast rows are left out")
    assert note < out.index("[  1/") and '`pip install -e ".[bench]"`' in out[note:note + 300]
    total = int(re.search(r"\[ *1/(\d+)\]", out).group(1))
    assert re.search(rf"\[ *{total}/{total}\]", out)  # the counter's total is the rows run
    assert "fp16 autocast" in out and "bf16 autocast |" not in out


def test_the_bench_extra_brings_what_bench_imports():
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11

    extras = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {re.split(r"[<>=;\s]", r)[0] for r in extras["bench"]} == {"matplotlib", "plotly", "markdown-it-py", "ml_dtypes"}


# -- bench --kinds: a line before each size, on the terminal, not in kinds.md -------------------------
def test_bench_kinds_says_each_size_before_it_runs(monkeypatch, tmp_path, capsys):
    from tinygrad_ckpt.bench import kinds

    toys = kinds.SETS["tiny"]
    monkeypatch.setitem(kinds.SETS, "tiny", (toys[0][-2:], toys[1][:1], toys[2]))  # three sizes are enough
    assert cli.main(["bench", "--kinds", "--tiny", "--repeats", "1", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    measured, full, _ = kinds.SETS["tiny"]
    total = len(measured) + len(full)
    progress = re.findall(rf"^\[ *(\d+)/{total}\] +\d+ s  part ([12]): (\w+)", out, re.M)
    assert [int(k) for k, _, _ in progress] == list(range(1, total + 1))
    assert [kind for _, _, kind in progress] == [s.kind for s in measured] + [s.kind for s in full]
    assert "part 1: " not in (tmp_path / "kinds.md").read_text()
