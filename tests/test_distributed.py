"""Data parallelism over MPI: 2 processes x k micro-batches = one process running the whole effective batch.

The MPI tests start `mpiexec -n 2 python tests/mpi_worker.py SCENARIO OUT`
(one launch per scenario, shared by the tests that read it) and compare what
the ranks wrote with a run this process does itself. They are skipped, with
the reason, only where mpi4py or mpiexec is not installed
(`pip install -e ".[mpi]"`; the `test` extra includes it, so CI runs
them). The rest (sharding, bucketing, errors without MPI) runs everywhere.

Tolerances: the float64 runs differ from the reference only in summation
order (each rank sums its share, then the all-reduce adds the two), about
1e-16 relative per addition, so parameters and losses are compared at
rtol 1e-10, atol 1e-12; a wrong share, a missing example or a wrong
normalisation shows at 1e-3 or more. The two ranks' parameters are compared
exactly (bit for bit). The command-line run is float32: 1e-5.
"""

import collections
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinygrad_ckpt import cli, distributed, memory, serialization
from tinygrad_ckpt.accumulate import GradientAccumulator
from tinygrad_ckpt.train import Trainer

from .mpi_worker import CASES, DEVICE_CASE, Recording, dataset, tiny_gpt, training_args

WORKER = Path(__file__).with_name("mpi_worker.py")
RTOL, ATOL = 1e-10, 1e-12
TIMEOUT = 120  # seconds for one mpiexec launch; a hang (a rank left waiting) fails instead of blocking CI


def find_mpiexec():
    """The mpiexec installed next to this Python (the `mpich` wheel puts it there), else the one on PATH."""
    beside = Path(sys.executable).with_name("mpiexec")
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def mpi_unavailable_reason():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return f"mpi4py is not installed ({distributed.INSTALL_HINT})"
    if find_mpiexec() is None:
        return f"no mpiexec next to {sys.executable} or on PATH ({distributed.INSTALL_HINT})"
    return None


needs_mpi = pytest.mark.skipif(mpi_unavailable_reason() is not None, reason=str(mpi_unavailable_reason()))


def mpiexec(*command, cwd=None):
    """Run `mpiexec -n 2 <command>`; returns the CompletedProcess (stdout + stderr as text)."""
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}  # for Open MPI's mpiexec; MPICH's ignores them
    try:
        return subprocess.run([find_mpiexec(), "-n", "2", *command], capture_output=True, text=True,
                              timeout=TIMEOUT, env=env, cwd=cwd)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"mpiexec -n 2 {' '.join(command)} did not finish in {TIMEOUT} s:\n{e.stdout}\n{e.stderr}")


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Run each worker scenario once under mpiexec -n 2; {scenario: [rank 0's results, rank 1's]}."""
    out, results = tmp_path_factory.mktemp("mpi"), {}

    def get(scenario):
        if scenario not in results:
            run = mpiexec(sys.executable, str(WORKER), scenario, str(out))
            assert run.returncode == 0, f"worker {scenario} failed:\n{run.stdout}\n{run.stderr}"
            results[scenario] = [json.loads((out / f"{scenario}_rank{r}.json").read_text()) for r in (0, 1)]
        return results[scenario]

    return get


def single_process(overrides, n_examples, checkpointing=False):
    """The reference: one process, the whole effective batch (B x G x 2 examples) in one micro-batch."""
    overrides = dict(overrides)
    B, G = overrides.pop("per_device_train_batch_size"), overrides.pop("gradient_accumulation_steps")
    data = Recording(dataset(n_examples))
    trainer = Trainer(tiny_gpt(), training_args(per_device_train_batch_size=B * G * 2, gradient_accumulation_steps=1,
                                                gradient_checkpointing=checkpointing, **overrides), data)
    history = trainer.train()
    return trainer, [e["loss"] for e in history if "loss" in e], data.reads


# -- 2 ranks equal one process ---------------------------------------------------------
CHECKPOINTING = [False, pytest.param(True, marks=pytest.mark.skipif(
    not hasattr(tiny_gpt(), "gradient_checkpointing_enable"),
    reason="gradient checkpointing has not landed yet (GPT.gradient_checkpointing_enable is missing)"))]


@pytest.mark.equivalence
@needs_mpi
@pytest.mark.parametrize("checkpointing", CHECKPOINTING, ids=["plain", "checkpointing"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_two_ranks_equal_one_process_with_the_whole_effective_batch(launched, case, checkpointing):
    name, overrides, n_examples = case
    ranks = [r[f"{name}_ckpt" if checkpointing else name] for r in launched("equivalence")]
    trainer, losses, reads = single_process(overrides, n_examples, checkpointing)
    for rank in ranks:
        assert rank["steps"] == trainer.state.global_step == overrides["max_steps"]
        for got, want in zip(rank["params"], trainer.optimizer.params):
            numpy.testing.assert_allclose(numpy.array(got), want.numpy(), rtol=RTOL, atol=ATOL)
        # the logged loss is the whole effective batch's (the sums were all-reduced too)
        numpy.testing.assert_allclose(rank["losses"], losses, rtol=RTOL, atol=ATOL)
    assert ranks[0]["params"] == ranks[1]["params"]  # bit for bit: the copies never drift
    # the shares are disjoint and together exactly the reference's examples
    assert collections.Counter(ranks[0]["reads"] + ranks[1]["reads"]) == collections.Counter(reads)
    assert ranks[0]["reads"] and ranks[1]["reads"]


@pytest.mark.equivalence
@needs_mpi
def test_two_ranks_on_a_device_copy_to_the_host_explicitly_and_still_agree(launched):
    # device 'cuda' backed by the strict CuPy stand-in: any implicit host copy would be an error
    name, overrides, n_examples = next(case for case in CASES if case[0] == DEVICE_CASE)
    trainer, losses, _ = single_process(overrides, n_examples)
    for rank in launched("equivalence"):
        run = rank[name + "_cuda"]
        assert run["device"] == "cuda"
        for got, want in zip(run["params"], trainer.optimizer.params):
            numpy.testing.assert_allclose(numpy.array(got), want.numpy(), rtol=RTOL, atol=ATOL)


@needs_mpi
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_one_all_reduce_per_dtype_per_optimizer_step_and_none_during_accumulation(launched, case):
    name, overrides, _ = case
    G, steps = overrides["gradient_accumulation_steps"], overrides["max_steps"]
    for rank in launched("equivalence"):
        run = rank[name]
        n_params = len(run["params"])
        per_step = run["flat_buffers"] + 1  # one flat buffer per dtype (here one: float64), one for the counts
        assert run["flat_buffers"] == 1 and per_step < n_params
        assert run["calls"]["all_reduce"] == steps * per_step  # not per parameter, not per micro-batch
        # At every micro-batch of optimizer step s, exactly s steps' all-reduces have happened:
        # nothing is sent while a group accumulates ("no_sync").
        seen = run["seen"]
        groups = [seen[i] // per_step for i in range(len(seen))]
        assert groups == sorted(groups) and set(groups) == set(range(steps))
        assert all(v % per_step == 0 for v in seen)
        assert max(collections.Counter(groups).values()) == G
        # each step sends the gradients once: the parameters' bytes, plus a few counts
        param_bytes = sum(numpy.array(p).nbytes for p in run["params"])
        assert param_bytes * steps <= run["bytes_all_reduced"] <= (param_bytes + 64) * steps


@needs_mpi
def test_a_two_rank_run_resumes_exactly_and_only_with_two_ranks(launched):
    for rank in launched("equivalence"):
        run = rank["resume"]
        assert len(run["full"]) == 4 and run["resumed"] == run["full"]  # the history, saved steps included
        assert run["same_params"]
    # rank 0 wrote the checkpoint; one process reading 2 examples a micro-batch, not 4, must not resume it
    # (micro_step counts micro-batches of both ranks' examples)
    args = training_args(optim="adamw", per_device_train_batch_size=2, gradient_accumulation_steps=2,
                         lr_scheduler_type="constant", max_steps=4)
    with pytest.raises(ValueError, match=r"written by 2 process\(es\) x per_device_train_batch_size=2 = 4 .* this run has 1 x 2 = 2"):
        Trainer(tiny_gpt(), args, dataset(23)).train(resume_from_checkpoint=launched("equivalence")[0]["resume"]["checkpoint"])


# -- errors ------------------------------------------------------------------------------
@needs_mpi
@pytest.mark.parametrize("scenario, message", [
    ("model", r"DistributedError: the processes disagree on the model's parameters .*: rank 1 has "
              r"\('wte.weight', \(11, 24\), 'float64'\) where rank 0 has \('wte.weight', \(11, 16\), 'float64'\)"),
    ("arguments", r"disagree on the training arguments: rank 1 has \('seed', 4\) where rank 0 has \('seed', 3\)"),
    ("data_size", r"disagree on the training data set's size: rank 1 has 21 where rank 0 has 20"),
    ("config", r"DistributedError: the processes disagree on the model configuration: rank 1 has \('n_head', 4\) "
               r"where rank 0 has \('n_head', 2\)"),
    ("tokenizer", r"disagree on the tokenizer: rank 1 has \('chars', 'abcdefghikj'\) where rank 0 has "
                  r"\('chars', 'abcdefghijk'\)"),
    ("data", r"disagree on the training data \(its fingerprint\): rank 1 has \d+ where rank 0 has \d+"),
    ("output_dir", r"DistributedError: rank 0 cannot go on: NotADirectoryError: .*output directory .*a_file/run' "
                   r"is not writable"),
    ("too_little_data", r"ValueError: the training data set has 5 examples, fewer than one micro-batch on each of "
                        r"the 2 processes \(per_device_train_batch_size=3 x 2 = 6\)"),
    ("diverge", r"DistributedError: parameters diverged after 0 optimizer step\(s\): 'blocks.1.mlp.c_fc.weight' "
                r"on rank 1 differs from rank 0's"),
])
def test_disagreeing_ranks_fail_on_every_rank_with_a_clear_error(launched, scenario, message):
    ranks = launched("errors")
    for rank in ranks:
        assert rank[scenario] is not None, f"{scenario}: no error was raised"
        assert re.search(message, rank[scenario]), rank[scenario]
    assert ranks[0][scenario] == ranks[1][scenario]  # the same error on both: neither is left waiting


@needs_mpi
def test_ranks_that_resume_from_different_checkpoints_stop_before_the_first_step(launched):
    for rank, errors in enumerate(launched("errors")):
        mine = f"run_{0.03 if rank == 0 else 0.01}/checkpoint-1.npz"
        assert re.search(rf"DistributedError: after resuming from '.*{re.escape(mine)}': parameters diverged after \d+ "
                         r"optimizer step\(s\): 'wte.weight' on rank 1 differs from rank 0's.*every process must read "
                         r"the same checkpoint", errors["resume_elsewhere"]), errors["resume_elsewhere"]


@needs_mpi
def test_a_nan_on_one_rank_skips_the_step_on_every_rank(launched):
    ranks = [r["nonfinite"] for r in launched("equivalence")]
    for run in ranks:
        assert run["skipped"] == [{"step": 1, "skipped": "loss nan, grad_norm nan", "consecutive_nonfinite_steps": 1,
                                   "nonfinite_steps": 1}]
        assert run["steps"] == [2, 3]
    assert ranks[0]["params"] == ranks[1]["params"]


@needs_mpi
def test_one_rank_failing_alone_stops_the_run_instead_of_leaving_the_other_waiting():
    run = mpiexec(sys.executable, str(WORKER), "abort", ".")
    assert run.returncode == 3 and "rank 1 failed alone" in run.stderr, run.stdout + run.stderr


def test_missing_mpi4py_says_which_extra_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # `import mpi4py` now fails, as if not installed
    with pytest.raises(ImportError, match=r'pip install -e "\.\[mpi\]"'):
        distributed.DataParallel()
    monkeypatch.setenv("PMI_SIZE", "2")  # as under `mpiexec -n 2`
    assert cli.main(["train", "--max-steps", "1", "--sample-chars", "0"]) == 2
    assert 'pip install -e ".[mpi]"' in capsys.readouterr().err


@needs_mpi
def test_an_mpiexec_from_another_mpi_is_named():
    # mpiexec says 2 processes, but MPI (mpi4py's) was not started by it: it sees 1.
    run = subprocess.run([sys.executable, "-m", "tinygrad_ckpt", "train", "--max-steps", "1"], capture_output=True,
                         text=True, timeout=TIMEOUT, env={**os.environ, "PMI_SIZE": "2"})
    assert run.returncode == 2
    assert "mpiexec started 2 processes, but MPI sees 1" in run.stderr and "mpiexec" in run.stderr.splitlines()[-1]


# -- the command line ------------------------------------------------------------------------
@pytest.mark.equivalence
@needs_mpi
def test_train_command_under_mpiexec_matches_one_process_and_only_rank_0_prints(tmp_path, capsys):
    text = tmp_path / "tiny.txt"
    text.write_text("the cat sat on the mat. " * 60)
    common = ["train", "--data", str(text), "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "8",
              "--disable-tqdm", "--max-steps", "4", "--per-device-train-batch-size", "3", "--logging-steps", "1",
              "--learning-rate", "0.1", "--optim", "sgd", "--warmup-steps", "0", "--sample-chars", "0"]
    run = mpiexec(sys.executable, "-m", "tinygrad_ckpt", *common, "--gradient-accumulation-steps", "2",
                  "--output-dir", str(tmp_path / "two"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("training: 4 optimizer steps, each of 12 examples (the effective batch) = 3 per "
                            "micro-batch x 2 accumulation steps x 2 processes") == 1
    assert run.stdout.count("memory: per process: 'mem' in a log line is what process 0 holds then") == 1
    logged = [line.split(" |")[0] for line in run.stdout.splitlines() if "| loss " in line]
    assert logged == [f"step {s}/4" for s in range(1, 5)]  # each log line once: only rank 0 prints
    assert run.stdout.count("validation loss:") == 1
    assert cli.main([*common, "--gradient-accumulation-steps", "4", "--output-dir", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    two = serialization.load(tmp_path / "two" / "model.npz")["model"]
    one = serialization.load(tmp_path / "one" / "model.npz")["model"]
    assert two.keys() == one.keys()
    # float32: the two runs add the same terms in a different order. SGD, because AdamW divides by
    # sqrt(v): a gradient that is zero but for rounding (attention's key bias) becomes a step of ~lr.
    for name in one:
        numpy.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["checkpoint-4.npz", "model.npz"]


# -- the pieces, without MPI -------------------------------------------------------------------
@given(n=st.integers(0, 40), world_size=st.integers(1, 6))
def test_shards_are_contiguous_disjoint_balanced_and_cover_the_batch(n, world_size):
    indices = numpy.arange(100, 100 + n)
    shares = [distributed.shard(indices, r, world_size) for r in range(world_size)]
    assert numpy.array_equal(numpy.concatenate(shares), indices)  # in order, so disjoint and covering
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_world_size_from_the_launchers_environment():
    assert distributed.world_size_from_environment({}) == 1
    assert distributed.world_size_from_environment({"PMI_SIZE": "4"}) == 4  # MPICH, Intel MPI, srun
    assert distributed.world_size_from_environment({"OMPI_COMM_WORLD_SIZE": "3"}) == 3  # Open MPI


@pytest.mark.equivalence
def test_bucketed_buffers_are_views_of_one_flat_array_and_accumulate_the_same():
    def accumulate_two(acc, model):
        for seed in (1, 2):
            ids = numpy.random.default_rng(seed).integers(0, 11, size=(2, 8))
            _, loss = model(ids, targets=ids)
            loss.backward()
            acc.accumulate(16)
        acc.write_grads()
        return [p.grad.numpy().copy() for p in acc.parameters]

    plain_model, bucketed_model = tiny_gpt(), tiny_gpt()
    plain = GradientAccumulator(plain_model.parameters(), gradient_accumulation_steps=2)
    bucketed = GradientAccumulator(bucketed_model.parameters(), gradient_accumulation_steps=2)
    before = memory.current()["accumulation"]
    flats = distributed.bucket_buffers(bucketed)
    assert len(flats) == 1 and flats[0].size == sum(p.numel() for p in bucketed.parameters)
    assert all(numpy.shares_memory(buf, flats[0]) for buf in bucketed.buffers)
    assert memory.current()["accumulation"] == before  # the flat array replaced the buffers: no extra bytes
    for got, want in zip(accumulate_two(bucketed, bucketed_model), accumulate_two(plain, plain_model)):
        numpy.testing.assert_array_equal(got, want)
