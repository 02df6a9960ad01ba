"""Faults under ZeRO (stages 1, 2 and 3), under `mpiexec -n 2` and `-n 3`: a rank that fails ends the whole job,
and ranks that disagree stop before the first step, saying on what.

A rank that dies in a ZeRO step leaves the others inside a collective (a
reduce, the reduce-scatter, an all-gather) that will never complete. The
tests fail the last rank (tests/fault_worker.py) in the middle of a
micro-batch, and between a reduce and the all-gather that follows it
(stages 1 and 2: after the reduce-scatter and the optimizer step, before the
updated shards are all-gathered), in three ways: a SIGKILL (no handler runs:
mpiexec must notice and end the others), an exception (cli.main's
abort_if_running), and sys.exit() or a Ctrl-C that reached one process alone
(the same; before cli.main caught those, the process's MPI_Finalize waited
for the others, which waited for it, forever). Each run is asked for 1000
optimizer steps, so a job that ended early ended because of the fault; a
hang fails at TIMEOUT.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinygrad_ckpt import distributed

from .mpi_worker import tiny_gpt
from .test_distributed import find_mpiexec, needs_mpi

WORKER = Path(__file__).with_name("fault_worker.py")
TIMEOUT = 120  # seconds: a job left waiting fails here instead of blocking CI
BOUND = 30  # seconds: what "within a bounded time" means here (a fault lands in the first step, after ~2 s)
ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
       "OMPI_MCA_rmaps_base_oversubscribe": "1", "OPENBLAS_NUM_THREADS": "1"}


def mpiexec(*command, n=2):
    """`mpiexec -n N command...` (or several programs, given as mpiexec's own ':'-separated arguments);
    (CompletedProcess, seconds it took)."""
    start = time.perf_counter()
    try:
        run = subprocess.run([find_mpiexec(), "-n", str(n), *command], capture_output=True, text=True,
                             timeout=TIMEOUT, env=ENV)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"mpiexec {' '.join(command)} was still running after {TIMEOUT} s:\n{e.stdout}\n{e.stderr}")
    return run, time.perf_counter() - start


def train_flags(tmp_path):
    text = tmp_path / "tiny.txt"
    text.write_text("the cat sat on the mat. " * 60)
    return ["train", "--data", str(text), "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "8",
            "--disable-tqdm", "--max-steps", "1000", "--per-device-train-batch-size", "2",
            "--gradient-accumulation-steps", "2", "--logging-steps", "1", "--sample-chars", "0"]


# -- a rank that fails ---------------------------------------------------------------------
WHERE = {"micro_batch": "in the middle of a micro-batch", "between": "between a reduce and the all-gather"}
SAYS = {"kill": r"signal 9",  # mpiexec's own report (MPICH: "Killed (signal 9)"; Open MPI: "exited on signal 9")
        "raise": r"RuntimeError: the last rank failed {where}",
        "exit": r"SystemExit: 0",
        "interrupt": r"\ninterrupted\n"}
CASES = [(2, stage, fault, where) for stage in (1, 2, 3) for fault in ("kill", "raise", "exit") for where in WHERE]
CASES += [(2, 2, "interrupt", "micro_batch"), (3, 1, "kill", "micro_batch"), (3, 2, "exit", "between"),
          (3, 3, "raise", "between")]


@needs_mpi
@pytest.mark.parametrize("n, stage, fault, where", CASES, ids=lambda v: str(v))
def test_a_rank_that_fails_in_a_zero_step_ends_the_job_on_every_rank_within_a_bounded_time(tmp_path, n, stage,
                                                                                           fault, where):
    run, seconds = mpiexec(sys.executable, str(WORKER), fault, where, *train_flags(tmp_path), "--zero-stage",
                           str(stage), n=n)
    output = run.stdout + run.stderr
    assert f"fault_worker: the last rank fails ({fault}) {WHERE[where]}" in run.stderr, output  # it got there
    assert run.returncode != 0, output  # not a job that says it succeeded
    assert re.search(SAYS[fault].format(where=WHERE[where]), output), output  # the message says why
    assert seconds < BOUND, f"the job took {seconds:.0f} s to end after the fault:\n{output}"
    assert "time:" not in run.stdout and "step 2/1000" not in run.stdout, output  # rank 0 did not go on


# -- ranks that disagree ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def disagreeing(tmp_path_factory):
    """{N: [each rank's {case: {error, steps, array_calls}}]}, the worker started once per N."""
    results = {}

    def get(n):
        if n not in results:
            out = tmp_path_factory.mktemp(f"disagree{n}")
            run, _ = mpiexec(sys.executable, str(WORKER), "disagree", str(out), n=n)
            assert run.returncode == 0, run.stdout + run.stderr
            results[n] = [json.loads((out / f"disagree_rank{r}.json").read_text()) for r in range(n)]
        return results[n]

    return get


def expected(case, stage, n):
    """(what differs, rank 0's value, the last rank's), as regular expressions."""
    P = sum(p.numel() for p in tiny_gpt().parameters())
    return {
        "model_size": (r"the model's parameters \(name, shape, dtype\)", r"\('wte.weight', \(11, 16\), 'float64'\)",
                       r"\('wte.weight', \(11, 24\), 'float64'\)"),
        "zero_stage": ("the training arguments", rf"\('zero_stage', {stage}\)", rf"\('zero_stage', {3 - stage}\)"),
        "dtype": (r"the model's parameters \(name, shape, dtype\)", r"\('wte.weight', \(11, 16\), 'float64'\)",
                  r"\('wte.weight', \(11, 16\), 'float32'\)"),
        "layout": (r"the ZeRO shard layout \(each flat array's dtype, elements P, shard size S\)",
                   rf"\('float64', {P}, {-(-P // n)}\)", rf"\('float64', {P}, {-(-P // (n + 1))}\)"),  # S = ceil(P / N)
    }[case]


@needs_mpi
@pytest.mark.parametrize("n", (2, 3))
# Not the layout at stage 3: it broadcasts its shards as it cuts them, before prepare compares the cuts (the
# cut follows from what agree() compares before it: the parameters in order, and N).
@pytest.mark.parametrize("case, stage", [(case, stage) for case in ("model_size", "zero_stage", "dtype", "layout")
                                         for stage in (1, 2, 3) if (case, stage) != ("layout", 3)])
def test_ranks_that_disagree_under_zero_stop_before_the_first_step_naming_the_difference(disagreeing, n, stage, case):
    what, first, last = expected(case, stage, n)
    message = f"DistributedError: the processes disagree on {what}: rank {n - 1} has {last} where rank 0 has {first}"
    if n > 2:  # and every rank's value
        message += r" \(rank by rank: " + "".join(f"{r} {first}, " for r in range(n - 1)) + rf"{n - 1} {last}\)"
    ranks = [r[f"{case}_{stage}"] for r in disagreeing(n)]
    for rank in ranks:
        assert rank["error"] is not None, f"{case}: no error was raised"
        assert re.match(message + "; start every process", rank["error"]), rank["error"]
        assert rank["steps"] == 0 and rank["array_calls"] == 0  # stopped before any step, before any array was sent
    assert all(rank["error"] == ranks[0]["error"] for rank in ranks)  # the same error everywhere: none left waiting


@needs_mpi
def test_train_commands_with_different_zero_stages_stop_before_the_first_step(tmp_path):
    flags = [sys.executable, "-m", "tinygrad_ckpt", *train_flags(tmp_path)]
    run, _ = mpiexec(*flags, "--zero-stage", "1", ":", "-n", "1", *flags, "--zero-stage", "2", n=1)
    assert run.returncode == 2, run.stdout + run.stderr
    assert ("tinygrad-ckpt train: error: the processes disagree on the training arguments: rank 1 has "
            "('zero_stage', 2) where rank 0 has ('zero_stage', 1)") in run.stderr, run.stderr
    assert "| loss" not in run.stdout and "peak memory" not in run.stdout, run.stdout  # no step, no summary


# -- the message, without MPI ----------------------------------------------------------------------
class Gathered(distributed.Communicator):
    """A communicator whose all_gather returns what `values` says the N ranks sent (no MPI)."""

    def __init__(self, values):
        self.values, self.rank, self.size = values, 0, len(values)

    def all_gather(self, value):
        return self.values


@given(st.lists(st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 2)), max_size=3), min_size=2, max_size=5))
def test_the_message_names_the_first_rank_that_differs_and_with_more_than_two_every_rank_s_value(values):
    parallel = distributed.DataParallel(comm=Gathered(values))
    if all(v == values[0] for v in values):
        parallel.same_everywhere("the thing", values[0])  # all agree: no error
        return
    first = next(r for r, v in enumerate(values) if v != values[0])
    with pytest.raises(distributed.DistributedError) as error:
        parallel.same_everywhere("the thing", values[0])
    found = re.match(r"the processes disagree on the thing: rank (\d+) has (.*) where rank 0 has (.*?)"
                     r"(?: \(rank by rank: (.*)\))?; start every process", str(error.value))
    assert found and int(found[1]) == first and found[2] != found[3], str(error.value)
    if len(values) == 2:
        assert found[4] is None
    else:  # every rank's part, in rank order; a rank that sent what rank 0 sent has rank 0's
        listing = found[4]
        assert listing.startswith(f"0 {found[3]}") and f", {first} {found[2]}" in listing
        assert listing.endswith(f"{len(values) - 1} {found[2] if values[-1] == values[first] else found[3]}") or \
            values[-1] not in (values[0], values[first])
        for r, v in enumerate(values):
            assert f", {r} " in listing or r == 0
            if v == values[0]:
                assert f"{r} {found[3]}" in listing


def test_a_process_whose_mpi_abort_fails_still_leaves_at_once(monkeypatch):
    """MPI_Abort should not return. Once, in a whole-suite run beside other MPI jobs, a process printed its
    exception a second time after MPI_Abort, on its way out, and left; the two others went on waiting in a
    collective for it, and mpiexec did not end them. Whatever MPI_Abort does, abort_if_running then leaves
    with os._exit(code), never a normal exit through MPI_Finalize, and mpiexec ends the job when a process
    dies so. No MPI needed: a stand-in mpi4py.MPI."""
    import types

    from tinygrad_ckpt import distributed

    class World:
        def Get_size(self):
            return 2

        def Abort(self, code):
            raise RuntimeError("MPI_Abort failed")

    fake = types.SimpleNamespace(Is_initialized=lambda: True, Is_finalized=lambda: False, COMM_WORLD=World())
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", fake)
    monkeypatch.setattr(distributed, "ABORT_GRACE_SECONDS", 0)
    exits = []

    def leave(code):
        exits.append(code)
        raise SystemExit(code)  # os._exit would end pytest too

    monkeypatch.setattr(distributed.os, "_exit", leave)
    with pytest.raises(SystemExit):
        distributed.abort_if_running(3)
    assert exits == [3]
