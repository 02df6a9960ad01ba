"""One rank of N under ZeRO, on the meta device: the other N - 1 ranks stood in for (MetaDataParallel).

    fit --model gpt2-xl --memory v100-16gb --effective-batch-size 8 --processes 8 --zero-stage 2

What one rank holds under ZeRO (zero.py) is found as everything else in
fit is: by running the step, here the real sharded step of the Trainer
(FlatShards, ShardedAccumulator, ShardedGradScaler, total_norm, and at stage
3 Stage3Hooks' gathers) on the meta device, as rank 0 of N. The other ranks
are not run: MetaCommunicator answers each collective with what it would
leave on this rank, an array of the right shape and dtype with no values.
One rank stands for all of them because they hold the same: every shard has
the same S = ceil(P / N) elements (the last one padded), each rank's
micro-batch has the same shape, every rank gathers the same whole blocks at
stage 3, and what a rank does differently from another (which chunk it adds
into its buffer, which slice of the flat array is its own) is done in place,
allocating nothing. tests/test_fit_zero.py runs every rank on the meta
device and finds the same bytes, and runs the real step under `mpiexec -n 2,
3, 4` and finds the predicted bytes on each rank, at every stage.

Beside DeepSpeed's estimators (v0.16.5, deepspeed/runtime/zero/stage_1_and_2.py
and stage3.py): `estimate_zero2_model_states_mem_needs_all_live(model,
num_gpus_per_node, num_nodes, additional_buffer_factor=1.5)` prints, per GPU
without offload, 2 Psi + 18 Psi / N bytes (2 Psi 16-bit parameters; 2 Psi
16-bit and 4 Psi float32 gradients, 4 Psi float32 master weights and 8 Psi
of Adam's moments, sharded; pull request 5099 corrected the 4 Psi + 16 Psi
/ N before it), and `estimate_zero3_model_states_mem_needs_all_live` 4 L
+ 18 Psi / N, L the parameters of the largest module (its own, not its
children's), gathered. The 1.5 "additional buffer factor" multiplies the
CPU's figure only. Both count model states only: not the activations (what
checkpointing is for), not a micro-batch's whole gradient before it is
reduced (stage 2 here: 4 Psi beside the shards), not the reduce-scatter's
received shard or the chunks in flight, not the token ids, not the ops'
scratch arrays, not the allocator's overheads. fit counts all of them, for
this engine's layout: float32 parameters that are their own master copy,
so stage 2 holds 4 Psi + 12 Psi / N of model states (zero.py). GPT-2 XL
on 8 GPUs, one example of 1024 tokens, every block checkpointed:

    >>> from tinygrad_ckpt.fit import gpt_step, model_config
    >>> psi, N, GiB = 1_557_611_200, 8, 2**30
    >>> round((2 * psi + 18 * psi // N) / GiB, 2)      # DeepSpeed's ZeRO-2 figure, a GPU
    6.17
    >>> step = gpt_step(model_config("gpt2-xl"), 1, 1024, checkpointing={"segments": "every"}, processes=N,
    ...                 zero_stage=2)
    >>> {k: round(v / GiB, 2) for k, v in step.at_peak.items()}     # one process's peak, by category
    {'parameters': 5.8, 'gradients': 6.53, 'accumulation': 0.73, 'optimizer': 1.45, 'activations': 0.0, 'other': 0.0}
    >>> round(step.peak_bytes / GiB, 2)
    14.51
    >>> round((4 * 50257 * 1600 + 18 * psi // N) / GiB, 2)   # ZeRO-3's, L the token embedding
    3.56
    >>> step = gpt_step(model_config("gpt2-xl"), 1, 1024, checkpointing={"segments": "every"}, processes=N,
    ...                 zero_stage=3)
    >>> round(step.peak_bytes / GiB, 2), round(step.device_peak_bytes / GiB, 2)
    (4.0, 4.2)

At stage 2 the model states are 7.98 GiB of the 14.51 (4 Psi + 12 Psi / N);
the rest is the micro-batch's whole gradient (4 Psi) and the first chunk
reduced from it, which DeepSpeed's figure leaves out. At stage 3 the model
states are 2.90 GiB of the 4.0 (16 Psi / N); the rest is the root's gathered
parameters (the token embedding, which the head uses too), the activations
and the logits' arrays.
"""

from .. import backend, meta
from ..distributed import Communicator, DataParallel


class MetaCommunicator(Communicator):
    """distributed.Communicator's collectives for rank `rank` of `size`, the others stood in for.

    On a meta array a collective returns what it leaves on this rank: the
    reduce-scatter a new shard of 1 / size of the elements, the in-place
    ones (all-reduce, reduce, all-gather, broadcast) the array as it is.
    On a host array (the item counts, the loss for the log, the overflow
    flag) the sum over the ranks is `size` times this rank's: each rank
    runs the same micro-batch shape, so each counts the same items, and on
    the meta device none finds an overflow. No MPI is imported.
    """

    def __init__(self, rank, size):
        self.rank, self.size = rank, size
        self.calls = dict.fromkeys(("all_reduce", "broadcast", "all_gather", "reduce_scatter", "reduce",
                                    "all_gather_arrays"), 0)
        self.bytes_all_reduced = 0
        self.bytes_sent = {"reduce_scatter": 0, "reduce": 0, "all_gather_arrays": 0}

    def _count(self, kind, array, sent=True):
        self.calls[kind] += 1
        if sent:
            self.bytes_sent[kind] += array.nbytes

    def all_reduce_(self, array):
        self._count("all_reduce", array, sent=False)
        self.bytes_all_reduced += array.nbytes
        if backend.holds_values(backend.device_of(array)):
            array *= self.size  # every rank's is this rank's
        return array

    def broadcast_(self, array, root=0):
        self._count("broadcast", array, sent=False)
        return array

    def reduce_scatter(self, array):
        if array.size % self.size:
            raise ValueError(f"reduce_scatter: {array.size} elements do not cut into {self.size} equal shards; pad them")
        self._count("reduce_scatter", array)
        return meta.empty((array.size // self.size,), array.dtype)

    def reduce_(self, array, root):
        self._count("reduce", array)
        return array

    def all_gather_(self, array):
        self._count("all_gather_arrays", array)
        return array

    def all_gather(self, value):
        self.calls["all_gather"] += 1
        return [value] * self.size  # every rank agrees: it is this one


class MetaDataParallel(DataParallel):
    """distributed.DataParallel as rank `rank` of `processes`, on the meta device (MetaCommunicator).

    The parameters' checksums are not compared (check_in_sync): a meta array
    has no bytes to sum, and the other ranks are this one.
    """

    def __init__(self, rank, processes):
        super().__init__(MetaCommunicator(rank, processes), check_every=0)

    def check_in_sync(self):
        pass

