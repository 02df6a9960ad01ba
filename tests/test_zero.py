"""ZeRO stages 1, 2 and 3 (zero.py) under `mpiexec -n N`, N = 2, 3, 4, checked as the anchors' own tests check theirs.

Every stage takes the steps of the single process that reads the whole
effective batch: the same parameters and losses (float64: to 1e-12; the
16-bit runs: as data parallelism's own, stage 0, to the float32 rounding of
a sum in another order), each rank's shard of the AdamW moments is the slice
of the single process's, the padding stays zero, the ranks agree bit for bit,
and each rank's optimizer state and accumulation buffers are the bytes of its
shard. Stage 3 keeps only each rank's shard of the parameters too: the
ranks' gathered parameters agree after every step. The worker
(tests/zero_worker.py) trains; these tests compare.
"""

import json
import sys
from pathlib import Path

import numpy
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinygrad_ckpt import memory
from tinygrad_ckpt.nn.module import Parameter
from tinygrad_ckpt.tensor import Tensor
from tinygrad_ckpt.train import Trainer, TrainingArguments
from tinygrad_ckpt.zero import FlatShards, ShardedAccumulator, stage3_units

from .test_distributed import find_mpiexec, needs_mpi

sys.path.insert(0, str(Path(__file__).parent))
from mpi_worker import dataset, training_args  # noqa: E402
from zero_worker import CASES, FROZEN, N_EXAMPLES, STAGES, gpt  # noqa: E402

WORKER = Path(__file__).with_name("zero_worker.py")
TIMEOUT = 300
RANKS = (2, 3, 4)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """{N: [rank 0's results, ..., rank N-1's]}, each worker started once under mpiexec -n N."""
    import os
    import subprocess

    results = {}

    def get(n):
        if n not in results:
            out = tmp_path_factory.mktemp(f"zero{n}")
            env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                   "OMPI_MCA_rmaps_base_oversubscribe": "1", "OPENBLAS_NUM_THREADS": "1"}
            run = subprocess.run([find_mpiexec(), "-n", str(n), sys.executable, str(WORKER), str(out)],
                                 capture_output=True, text=True, timeout=TIMEOUT, env=env)
            assert run.returncode == 0, f"mpiexec -n {n} zero_worker failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
            results[n] = [json.loads((out / f"zero_rank{r}.json").read_text()) for r in range(n)]
        return results[n]

    return get


def single_process(overrides, dtype, n, frozen=False):
    """One process reading the whole effective batch (B x G x N) in one micro-batch."""
    overrides = dict(overrides)
    B, G = overrides.pop("per_device_train_batch_size"), overrides.pop("gradient_accumulation_steps")
    trainer = Trainer(gpt(dtype, frozen=frozen), training_args(per_device_train_batch_size=B * G * n, gradient_accumulation_steps=1,
                                                **overrides), dataset(N_EXAMPLES))
    history = trainer.train()
    return trainer, [e["loss"] for e in history if "loss" in e]


def flat_padded(arrays, n):
    """The arrays in order as one flat array, padded with zeros to n equal shards (zero.FlatShards' layout)."""
    flat = numpy.concatenate([numpy.asarray(a, dtype=numpy.float64).ravel() for a in arrays])
    return numpy.concatenate([flat, numpy.zeros(-len(flat) % n)])


@needs_mpi
@pytest.mark.equivalence
@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("case", [c for c in CASES if c[2] == numpy.float64], ids=lambda c: c[0])
def test_every_stage_takes_the_single_process_steps_in_float64(launched, case, n):
    name, overrides, dtype = case
    reference, losses = single_process(overrides, dtype, n, frozen=name == "frozen")
    want = [p.numpy() for p in reference.model.parameters()]
    trained = [p.numpy() for p in reference.optimizer.params]  # the layouts' parameters: the frozen ones left out
    if name == "frozen":
        untouched = [p.numpy() for p in gpt(dtype, frozen=True).parameters()]
        assert len(trained) == len(want) - 2 and all(
            numpy.array_equal(w, u) for (pname, _), w, u in zip(reference.model.named_parameters(), want, untouched)
            if pname in FROZEN)
    for stage in STAGES:
        ranks = [r[f"{name}_{stage}"] for r in launched(n)]
        for rank in ranks:
            for got, expected in zip(rank["params"], want):
                numpy.testing.assert_allclose(numpy.array(got), expected, rtol=1e-12, atol=1e-14, err_msg=f"stage {stage}")
            numpy.testing.assert_allclose(rank["losses"], losses, rtol=1e-12, atol=1e-14)
        assert all(r["params"] == ranks[0]["params"] for r in ranks), f"stage {stage}: the ranks differ"
        groups = ranks[0]["groups"]  # stages 1, 2: one group of every parameter; stage 3: one a unit
        if stage and overrides["optim"] == "adamw":  # each rank's moments: its slice of the single process's
            for state, (mine_by_rank, whole) in enumerate(zip(zip(*(r["moments"] for r in ranks)),
                                                               (reference.optimizer.exp_avg, reference.optimizer.exp_avg_sq))):
                for g, members in enumerate(groups):
                    expected = flat_padded([whole[i] for i in members], n).reshape(n, -1)
                    for r, mine in enumerate(mine_by_rank):
                        numpy.testing.assert_allclose(numpy.array(mine[g]), expected[r], rtol=1e-12, atol=1e-14,
                                                      err_msg=f"stage {stage}, rank {r}, group {g}, moment {state + 1}")
        if stage:
            assert all(not any(numpy.any(numpy.array(p)) for p in r["padding"]) for r in ranks)
            assert ranks[0]["shard_sizes"] == [-(-sum(trained[i].size for i in members) // n) for members in groups]
            assert sorted(i for members in groups for i in members) == list(range(len(trained)))
        if stage in (1, 2):
            assert len(groups) == 1
        elif stage == 3:  # one group a unit: each block, and the root's embeddings, final norm and head
            assert len(groups) == gpt(dtype).config.n_layer + 1
            assert len(ranks[0]["steps"]) == overrides["max_steps"] and ranks[0]["steps"][-1] == ranks[0]["params"]
            assert all(r["steps"] == ranks[0]["steps"] for r in ranks), "stage 3: the ranks' gathered parameters differ"


@needs_mpi
@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("case", [c for c in CASES if c[2] == numpy.float32], ids=lambda c: c[0])
def test_with_mixed_precision_every_stage_takes_data_parallelisms_steps(launched, case, n):
    """bf16 (with checkpointing) and fp16 (its loss scale found by the ranks together): stages 1, 2 and 3 step as
    stage 0 does, up to the order of a float32 sum (measured: 2.2e-7 relative at most; stage 3's parameters
    within 2.9e-8 of stage 0's and its losses equal, N = 2..4); fp16's skipped steps are the same on every stage. SGD, so that the rounding shows as it is: AdamW divides by sqrt(v) + 1e-8, and a
    gradient near zero turns a last-bit difference into a visible step (measured: 1.5e-3 after two steps)."""
    name, overrides, _ = case
    plain = launched(n)[0][f"{name}_0"]
    for stage in STAGES[1:]:
        ranks = [r[f"{name}_{stage}"] for r in launched(n)]
        assert all(r["params"] == ranks[0]["params"] and r["steps"] == ranks[0]["steps"] for r in ranks)
        assert len(ranks[0]["losses"]) == len(plain["losses"]) > 0  # the same steps taken (fp16: the same skipped)
        numpy.testing.assert_allclose(ranks[0]["losses"], plain["losses"], rtol=1e-6)
        for got, expected in zip(ranks[0]["params"], plain["params"]):
            numpy.testing.assert_allclose(numpy.array(got), numpy.array(expected), rtol=1e-6, atol=1e-7)


@needs_mpi
@pytest.mark.parametrize("n", RANKS)
def test_each_rank_holds_its_shard_of_the_optimizer_state_and_at_stage_2_of_the_buffers(launched, n):
    """Bytes by category when training ended, per rank (AdamW, float64, P parameters, shards of S = ceil(P / N)):
    stage 0: parameters 8P, accumulation 8P, optimizer 16P; stage 1: 8NS, 8NS, 16S; stage 2: 8NS, 8S, 16S;
    stage 3, with a group of P_u parameters a unit and S' = the sum of ceil(P_u / N): 8S', 8S', 16S' (between
    steps no unit is gathered). (Parameters and stage 1's buffers are padded to N S; the rest is the run's
    other arrays, the same in all.)"""
    P = sum(p.data.size for p in gpt(numpy.float64).parameters())
    S = -(-P // n)
    S3 = sum(-(-sum(p.data.size for p in params) // n) for _, params in stage3_units(gpt(numpy.float64)))
    want = {0: (P, P, 2 * P), 1: (n * S, n * S, 2 * S), 2: (n * S, S, 2 * S), 3: (S3, S3, 2 * S3)}
    for stage in STAGES:
        for r, rank in enumerate(launched(n)):
            got = rank[f"adamw_{stage}"]["bytes"]
            assert (got["parameters"], got["accumulation"], got["optimizer"]) == tuple(8 * e for e in want[stage]), (
                f"stage {stage}, rank {r}: {got}")


@needs_mpi
@pytest.mark.parametrize("n", RANKS)
def test_stage_1_sends_what_data_parallelism_sends_and_stage_2_reduces_each_micro_batch_chunk_by_chunk(launched, n):
    """Stage 0: one all-reduce of the buffers a step; stage 1: one reduce-scatter and one all-gather of the
    parameters a step (the two halves of an all-reduce); stage 2: N reduces per micro-batch, one shard-sized
    chunk to each owner (one dtype here: one group), and the all-gather a step."""
    name, overrides, _ = CASES[0]
    steps = overrides["max_steps"]
    micro_batches = launched(n)[0][f"{name}_2"]["micro_batches"]  # each ends with its gradients reduced
    assert micro_batches > steps
    calls = {stage: launched(n)[0][f"{name}_{stage}"]["calls"] for stage in STAGES}
    assert calls[0]["reduce_scatter"] == calls[0]["reduce"] == calls[0]["all_gather_arrays"] == 0
    assert calls[1]["reduce_scatter"] == calls[1]["all_gather_arrays"] == steps and calls[1]["reduce"] == 0
    assert calls[2]["reduce"] == n * micro_batches and calls[2]["reduce_scatter"] == 0
    assert calls[2]["all_gather_arrays"] == steps


@needs_mpi
@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: c[0])
def test_stage_3_gathers_each_unit_twice_a_micro_batch_and_reduces_each_gradient_once(launched, case, n):
    """Per micro-batch: every unit all-gathered for its forward and once again for its backward (without
    checkpointing by the saved weights' unpack, with it by the recompute), 2 x 8 N S' bytes; each gradient
    reduced to its owners as backward makes it, 8 P bytes, and the tied embedding's twice (wte is the head
    too: two contributions, each reduced as it is added). The worker gathers once more after each step."""
    name, overrides, _ = case
    model = gpt(numpy.float64)
    units = stage3_units(model)
    P, S3 = sum(p.data.size for p in model.parameters()), sum(-(-sum(p.data.size for p in u) // n) for _, u in units)
    rank = launched(n)[0][f"{name}_3"]
    micro_batches, steps = rank["micro_batches"], overrides["max_steps"]
    assert rank["calls"]["all_gather_arrays"] == len(units) * (2 * micro_batches + steps)
    assert rank["sent"]["all_gather_arrays"] == 8 * n * S3 * (2 * micro_batches + steps)
    assert rank["sent"]["reduce"] == 8 * (P + model.wte.weight.data.size) * micro_batches
    assert rank["calls"]["reduce_scatter"] == 0


class OneRankOfN:
    """Rank `rank` of `size` processes, as the Communicator stage 2 calls: a reduce with this rank alone adds
    nothing; it records each call's root, chunk, and the gradient bytes alive then."""

    def __init__(self, rank, size):
        self.rank, self.size, self.reduces = rank, size, []

    def reduce_(self, array, root):
        self.reduces.append((root, array.copy(), memory.current()["gradients"]))
        return array


@given(sizes=st.lists(st.integers(0, 9), min_size=1, max_size=6), n=st.integers(1, 5), data=st.data())
def test_stage_2_reduces_one_chunk_to_each_owner_and_frees_each_gradient_once_it_is_gathered(sizes, n, data):
    """Chunk r is elements [r S, (r + 1) S) of the padded flat gradient, reduced to rank r, which adds it into its
    buffer; while it is alive, the only other gradients are those with an element past it (the rest are freed),
    so the step's peak is the leaf gradients and one chunk (the first: every gradient is still alive then)."""
    if sum(sizes) == 0:
        sizes = sizes + [1]
    rank = data.draw(st.integers(0, n - 1))
    used = data.draw(st.lists(st.booleans(), min_size=len(sizes), max_size=len(sizes)))  # an unused one has no .grad
    rng = numpy.random.default_rng(len(sizes) * 10 + n)
    params = [Parameter(rng.standard_normal(k)) for k in sizes]
    layout, comm = FlatShards(params, rank, n), OneRankOfN(rank, n)
    accumulator = ShardedAccumulator(layout, comm, stage=2)
    before, grads = memory.current()["gradients"], []
    for p, u in zip(params, used):
        grads.append(rng.standard_normal(p.shape) if u else numpy.zeros(p.shape))
        if u:
            p.grad = Tensor(grads[-1].copy())
            memory.track(p.grad.data, "gradients")
    memory.reset_peak()
    holding = memory.total()  # the leaf gradients, and all the rest
    accumulator.accumulate(1)
    S, ends = layout.groups[0][2], numpy.cumsum(sizes)
    assert [root for root, _, _ in comm.reduces] == list(range(n))
    numpy.testing.assert_array_equal(numpy.concatenate([c for _, c, _ in comm.reduces]), flat_padded(grads, n))
    for r, (_, _, alive) in enumerate(comm.reduces):
        waiting = sum(8 * k for k, end, u in zip(sizes, ends, used) if u and end > (r + 1) * S)
        assert alive - before == 8 * S + waiting, f"chunk {r}: {alive - before} gradient bytes alive"
    assert all(p.grad is None for p in params) and memory.current()["gradients"] == before
    assert memory.peak()[0] == holding + 8 * S  # one chunk of S float64 beside them, at the most
    numpy.testing.assert_array_equal(accumulator.flats[0], flat_padded(grads, n)[rank * S : (rank + 1) * S])


def test_a_stage_not_built_is_refused():
    with pytest.raises(ValueError, match=r"zero_stage must be one of \(0, 1, 2, 3\), got 4"):
        TrainingArguments(zero_stage=4)


def test_one_process_has_nothing_to_shard_and_trains_as_without_zero():
    runs = []
    for stage in (0, 2):
        trainer = Trainer(gpt(numpy.float64), training_args(zero_stage=stage, max_steps=2), dataset(N_EXAMPLES))
        trainer.train()
        runs.append([p.numpy() for p in trainer.model.parameters()])
    assert all(numpy.array_equal(a, b) for a, b in zip(*runs))
