"""ZeRO's sharded checkpoints (zero_checkpoint.py) under `mpiexec -n 2` and `-n 3`.

A run stopped and resumed is the uninterrupted run bit for bit (float64),
at stages 1, 2 and 3; a damaged shard sends every process back to the previous
checkpoint alike; the consolidated file holds the live parameters and the
ranks' optimizer shards joined, and one process resumes from it; a
checkpoint written on N processes resumes on another number, its optimizer
state cut again, or is refused naming N when the data position would mean
other examples. The worker (tests/zero_checkpoint_worker.py) trains; these tests compare.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygrad_ckpt import serialization, zero_checkpoint
from tinygrad_ckpt.nn.module import Parameter
from tinygrad_ckpt.serialization import CheckpointFileError
from tinygrad_ckpt.train import Trainer, verify_checkpoint
from tinygrad_ckpt.zero import FlatShards

from .test_distributed import find_mpiexec, needs_mpi

sys.path.insert(0, str(Path(__file__).parent))
from mpi_worker import dataset, training_args  # noqa: E402
from zero_checkpoint_worker import EXAMPLES_PER_MICRO_BATCH, N_EXAMPLES  # noqa: E402
from zero_worker import gpt  # noqa: E402

WORKER = Path(__file__).with_name("zero_checkpoint_worker.py")
TIMEOUT = 300


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """{N: (OUT, [rank 0's results, ...])}; N = 3 resumes a checkpoint that N = 2 wrote, so 2 runs first."""
    results = {}

    def get(n):
        if n not in results:
            source = [str(get(2)[0])] if n == 3 else []
            out = tmp_path_factory.mktemp(f"zero_checkpoint{n}")
            env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                   "OMPI_MCA_rmaps_base_oversubscribe": "1", "OPENBLAS_NUM_THREADS": "1"}
            run = subprocess.run([find_mpiexec(), "-n", str(n), sys.executable, str(WORKER), str(out), *source],
                                 capture_output=True, text=True, timeout=TIMEOUT, env=env)
            assert run.returncode == 0, f"mpiexec -n {n} failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
            results[n] = out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]
        return results[n]

    return get


def single_process_args(output_dir, max_steps):
    """One process reading what N processes read together: the same examples in every optimizer step."""
    return training_args(optim="adamw", per_device_train_batch_size=EXAMPLES_PER_MICRO_BATCH,
                         gradient_accumulation_steps=2, max_steps=max_steps, save_steps=2, max_grad_norm=0.05,
                         lr_scheduler_type="constant", output_dir=str(output_dir))


def close(got, want):
    """Equal but for the order of sums: to 1e-12 (parameters of about 0.1; a weight that is zero in exact
    arithmetic holds rounding noise of about 1e-14 after six AdamW steps)."""
    assert len(got) == len(want)
    for a, b in zip(got, want):
        numpy.testing.assert_allclose(numpy.array(a), numpy.array(b), rtol=1e-12, atol=1e-12)


@needs_mpi
@pytest.mark.equivalence
@pytest.mark.parametrize("n", (2, 3))
def test_a_zero_run_stopped_and_resumed_is_the_uninterrupted_run_bit_for_bit(launched, n):
    for rank in launched(n)[1]:
        for stage in (1, 2, 3):
            full, resumed = rank[f"full_{stage}"], rank[f"resumed_{stage}"]
            assert resumed["resumed_from"] == "checkpoint-2.npz" and len(full["losses"]) == 4
            for key in ("params", "losses", "moments"):  # the moments: this rank's shards of AdamW's state
                assert resumed[key] == full[key], f"stage {stage}: {key} differ"


@needs_mpi
@pytest.mark.parametrize("n", (2, 3))
def test_a_damaged_shard_sends_every_rank_back_to_the_previous_checkpoint(launched, n):
    ranks = launched(n)[1]
    for stage in (1, 2, 3):
        runs = [rank[f"damaged_{stage}"] for rank in ranks]
        [(skipped, why)] = runs[0]["skipped"]
        assert skipped == "checkpoint-4.npz" and f"its shard 'checkpoint-4.shard-{n - 1}-of-{n}.npz'" in why, why
        assert all(r["skipped"] == runs[0]["skipped"] and r["resumed_from"] == "checkpoint-2.npz" for r in runs)
        assert all(r["params"] == rank[f"full_{stage}"]["params"] for r, rank in zip(runs, ranks))


@needs_mpi
@pytest.mark.parametrize("n", (2, 3))
def test_the_consolidated_file_holds_the_live_state_and_one_process_resumes_from_it(launched, n, tmp_path):
    out, ranks = launched(n)
    for stage in (1, 2, 3):
        consolidated = tmp_path / f"stage{stage}.npz"
        command = [sys.executable, "-m", "tinygrad_ckpt.zero_checkpoint", str(out / f"stage{stage}/full/checkpoint-4.npz"),
                   str(consolidated)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
        assert done.returncode == 0, done.stderr
        checkpoint = verify_checkpoint(consolidated)  # a plain checkpoint: one file, verified in full
        assert "zero" not in checkpoint["extra"] and not zero_checkpoint.shard_files(consolidated)
        live = ranks[0][f"full_{stage}"]
        model = gpt(numpy.float64)
        serialization.restore(consolidated, model)
        assert [p.numpy().tolist() for p in model.parameters()] == live["params"]  # bit for bit
        for key, moment in zip(("exp_avg", "exp_avg_sq"), zip(*(r[f"full_{stage}"]["moments"] for r in ranks))):
            for g, members in enumerate(live["groups"]):  # stages 1, 2: one group; stage 3: one a unit
                joined = numpy.concatenate([numpy.array(shards[g]) for shards in moment])
                whole = numpy.concatenate([checkpoint["optimizer"]["state"][key][i].ravel() for i in members])
                assert numpy.array_equal(joined[: whole.size], whole) and not joined[whole.size:].any()
    # one process, from the consolidated file of stage 2, two more steps: the steps of a run never interrupted
    resumed = Trainer(gpt(numpy.float64), single_process_args(tmp_path / "resumed", 6), dataset(N_EXAMPLES))
    resumed.train(resume_from_checkpoint=consolidated)
    plain = Trainer(gpt(numpy.float64), single_process_args(tmp_path / "plain", 6), dataset(N_EXAMPLES))
    plain.train()
    close([p.numpy() for p in resumed.model.parameters()], [p.numpy() for p in plain.model.parameters()])


@needs_mpi
def test_a_checkpoint_resumes_on_another_number_of_processes_its_optimizer_state_cut_again(launched, tmp_path):
    """Written by 2 processes at stage 1, resumed by 3 at stage 2, by 3 at stage 3 (the parameters re-sharded
    too) and by 1: the steps of the uninterrupted run (to the rounding of sums in another order), the log
    history restored exactly."""
    out, ranks = launched(2)
    full = ranks[0]["full_1"]
    for rank in launched(3)[1]:
        for resharded in (rank["resharded"], rank["resharded3"]):
            assert resharded["resumed_from"] == "checkpoint-2.npz" and resharded["losses"][:2] == full["losses"][:2]
            close(resharded["params"], full["params"])
            close(resharded["losses"], full["losses"])
    one = Trainer(gpt(numpy.float64), single_process_args(tmp_path / "one", 4), dataset(N_EXAMPLES))
    one.train(resume_from_checkpoint=out / "stage1/full/checkpoint-2.npz")  # the shards joined, in memory
    close([p.numpy() for p in one.model.parameters()], full["params"])


@needs_mpi
def test_another_number_of_examples_a_micro_batch_is_refused_naming_the_processes(launched, tmp_path):
    out, _ = launched(2)
    args = training_args(optim="adamw", per_device_train_batch_size=3, gradient_accumulation_steps=2, max_steps=4,
                         output_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"written by 2 process\(es\) x per_device_train_batch_size=3 = 6 examples a "
                                         r"micro-batch.* this run has 1 x 3 = 3.*resume with the same `mpiexec -n 2`"):
        Trainer(gpt(numpy.float64), args, dataset(N_EXAMPLES)).train(resume_from_checkpoint=out / "stage1/full")


@needs_mpi
def test_a_manifest_without_its_shards_is_refused_naming_the_missing_shard(launched, tmp_path):
    out, _ = launched(2)
    shutil.copy(out / "stage2/full/checkpoint-4.npz", tmp_path)
    with pytest.raises(CheckpointFileError, match=r"is missing its shard 'checkpoint-4.shard-0-of-2.npz'"):
        verify_checkpoint(tmp_path / "checkpoint-4.npz")
    with pytest.raises(CheckpointFileError, match="not a ZeRO checkpoint"):
        zero_checkpoint.consolidate(out / "stage2/full/model.npz", tmp_path / "out.npz")
    with pytest.raises(CheckpointFileError, match="is a folder; pass one of its checkpoint-<step>.npz files"):
        zero_checkpoint.consolidate(out / "stage2/full", tmp_path / "out.npz")


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 7), min_size=1, max_size=5), world_size=st.integers(1, 5))
def test_the_shards_cut_from_a_whole_state_join_to_it_padded_with_zeros(sizes, world_size):
    """cut, on every rank, lays each parameter's state where zero.FlatShards lays the parameter."""
    rng = numpy.random.default_rng(0)
    state = {"type": "AdamW", "hyper": {}, "steps": [3] * len(sizes),
             "state": {"exp_avg": [rng.standard_normal(size) for size in sizes]}}
    shards = [zero_checkpoint.cut(state, FlatShards([Parameter(numpy.zeros(s)) for s in sizes], r, world_size))
              for r in range(world_size)]
    joined = numpy.concatenate([shard["state"]["exp_avg"][0] for shard in shards])
    whole = numpy.concatenate(state["state"]["exp_avg"])
    assert numpy.array_equal(joined[: whole.size], whole) and not joined[whole.size:].any()
    assert len(joined) == world_size * -(-whole.size // world_size) and all(s["steps"] == [3] for s in shards)

