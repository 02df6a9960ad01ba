"""Data-parallel training over MPI: all-reduce is gradient accumulation across processes.

    mpiexec -n 2 tinygrad-ckpt train --per-device-train-batch-size 4 --gradient-accumulation-steps 8

The idea. Gradient accumulation (accumulate.py) adds the gradients of k
micro-batches into buffers and divides once by the number of items in all of
them. Nothing in that sum cares which process computed which term. So let N
processes ("ranks") each hold a copy of the model, give each rank its own
share of every effective batch, let each accumulate its share locally, and
then add the N ranks' buffers together: that sum, divided by the global item
count, is the gradient of the whole effective batch, and every rank takes the
same optimizer step with it. Adding one array across processes, with every
process getting the result, is MPI's all-reduce.

    effective batch of one optimizer step = per_device_train_batch_size
                                            x gradient_accumulation_steps
                                            x number of processes

as in Hugging Face. One process with gradient_accumulation_steps x N
micro-batches reads the same examples in each step and takes the same step
(the tests check that to 1e-10 in float64).

What each rank does, and when it talks to the others:

  start          ranks check that they hold the same TrainingArguments, model
                 configuration, tokenizer, parameter shapes and data (`prepare`);
                 then parameters (and buffers) are broadcast from rank 0, so
                 every rank starts from the same values, and the Trainer
                 checks their checksums once more before its first step
                 (after a resume: every rank must have read the same
                 checkpoint).
  micro-batch    each global micro-batch (per_device_train_batch_size x N
                 examples of the seed-only order) is cut into N contiguous
                 shares, sizes differing by at most one (`shard`); a rank
                 runs forward + backward on its share and adds into its
                 accumulation buffers. No communication at all: PyTorch calls
                 this `no_sync()`. At the end of an epoch a share may be empty;
                 that rank adds nothing and still takes part in the step.
  optimizer step one all-reduce per dtype of the accumulation buffers, plus
                 one small one for the item count (and the summed loss, for
                 the log). The buffers are views into one flat array per
                 dtype (`bucket_buffers`), so each all-reduce is one large
                 message, not one per parameter, and needs no copy. Then every
                 rank divides by the GLOBAL item count, the same rule as one
                 process (a rank with few tokens must not be weighted up).
  every so often a checksum of every parameter is gathered from all ranks;
                 any difference is an error naming the parameter
                 (`check_in_sync`). Identical inputs and identical arithmetic
                 keep the copies identical bit for bit; a difference means a
                 bug, so it stops the run rather than averaging it away.

A process that fails: one that dies (killed, out of memory) is seen by
mpiexec, which ends the others; one that raises, or calls sys.exit, in the
command line ends them all with MPI_Abort (`abort_if_running`, from
cli.main). Either way no process is left waiting in a collective for a
message that will never come, ZeRO's sharded ones included.

What it leaves out, on purpose: PyTorch's DistributedDataParallel starts
all-reducing a bucket while the last backward is still running (overlap); here
the all-reduce comes after, so the step is easy to see. MPI sends host
memory: CuPy buffers are copied to the host and back (the `mpich` wheel is not
CUDA-aware). With dropout, every rank seeds its generator with the same seed
(as Hugging Face's `set_seed` does), and a resumed run gives every rank rank
0's saved generator state. Evaluation is not sharded: each rank evaluates the
whole eval set (the same number), and only rank 0 prints and saves.

What lives here: `DataParallel` (the hooks the Trainer calls), `Communicator`
(mpi4py's communicator with the collectives used, each call counted),
`shard`, `bucket_buffers`, `from_environment` and `abort_if_running` (for the
command line). This is the only file that imports mpi4py, and only when asked.
What does not live here: the accumulation buffers and the normalisation
(accumulate.py), the training loop (train.py), the command line (cli.py).
"""

import os
import sys
import time
import zlib
from dataclasses import asdict, is_dataclass

import numpy

from . import backend, memory

INSTALL_HINT = 'pip install -e ".[mpi]" in the clone'  # mpi4py, and MPICH as a wheel: no compiler, no system MPI
ABORT_GRACE_SECONDS = 1.0  # pause before MPI_Abort, so mpiexec forwards the error message first
CHECK_EVERY = 100  # optimizer steps between two parameter checksums (the first step is always checked)

# Variables an MPI launcher sets in each process it starts: MPICH's and Intel's
# (PMI_SIZE, also srun's), Open MPI's, MVAPICH's.
_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


class DistributedError(RuntimeError):
    """The processes of a data-parallel run disagree (model, arguments, parameter values)."""


def import_mpi():
    """mpi4py's MPI module, or an error that says what to install."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError(
            f"data-parallel training needs mpi4py and an MPI library: {INSTALL_HINT} "
            f"(then run with `mpiexec -n 2 ...`); the import failed with: {e}"
        ) from None
    return MPI


def world_size_from_environment(environ=None):
    """How many processes `mpiexec -n N` started, from the variables it sets; 1 when not under mpiexec."""
    environ = os.environ if environ is None else environ
    for name in _SIZE_VARIABLES:
        if name in environ:
            return int(environ[name])
    return 1


def shard(indices, rank, world_size):
    """Rank `rank`'s share of `indices`: contiguous, disjoint, together exactly `indices`.

    The first len(indices) % world_size ranks get one more than the others, so
    10 examples on 4 ranks are shared 3, 3, 2, 2, and 1 example on 2 ranks is
    shared 1, 0 (an empty share is allowed: see DataParallel).
    """
    n, size = len(indices), world_size
    start = rank * (n // size) + min(rank, n % size)
    stop = start + n // size + (rank < n % size)
    return indices[start:stop]


def bucket_buffers(accumulator):
    """Make the accumulator's buffers views into one flat array per (dtype, device); return those arrays.

    After this, adding a micro-batch's gradient into `accumulator.buffers[i]`
    writes into the flat array, so summing all buffers across processes is
    one all-reduce per flat array, with no packing and no unpacking. (PyTorch's
    DDP does the same with `gradient_as_bucket_view=True`.) The flat arrays
    replace the per-parameter buffers; they are counted as "accumulation".
    """
    groups = {}  # (dtype, device) -> indices of the buffers in it, in parameter order
    for i, buf in enumerate(accumulator.buffers):
        groups.setdefault((buf.dtype, backend.device_of(buf)), []).append(i)
    flats = []
    for (dtype, device), members in groups.items():
        flat = backend.module_for(device).zeros(sum(accumulator.buffers[i].size for i in members), dtype=dtype)
        memory.track(flat, "accumulation")
        offset = 0
        for i in members:
            old = accumulator.buffers[i]
            view = flat[offset : offset + old.size].reshape(old.shape)  # a view: writes go into flat
            view[...] = old
            accumulator.buffers[i] = view
            offset += old.size
        flats.append(flat)
    return flats


class Communicator:
    """An MPI communicator with the collectives data parallelism uses and ZeRO's three, each call counted.

    `calls` counts the calls by kind and `bytes_all_reduced` the bytes summed:
    that is how the tests, and tutorial 8, check that an optimizer step sends
    one message per dtype, not one per parameter or one per micro-batch.
    """

    def __init__(self, comm=None):
        self.MPI = import_mpi()
        self.comm = self.MPI.COMM_WORLD if comm is None else comm
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.calls = {"all_reduce": 0, "broadcast": 0, "all_gather": 0, "reduce_scatter": 0, "reduce": 0,
                      "all_gather_arrays": 0, "gather": 0}
        self.bytes_all_reduced = 0
        self.bytes_sent = {"reduce_scatter": 0, "reduce": 0, "all_gather_arrays": 0}  # ZeRO's (zero.py): the input's bytes

    def all_reduce_(self, array):
        """Sum `array` over all processes, in place: afterwards every process holds the sum."""
        host = numpy.ascontiguousarray(backend.to_host(array))  # MPI sends host memory
        self.comm.Allreduce(self.MPI.IN_PLACE, host, op=self.MPI.SUM)
        if host is not array:  # a CuPy array (or a strided one): copy the sum back
            array[...] = backend.to_device(host, backend.device_of(array))
        self.calls["all_reduce"] += 1
        self.bytes_all_reduced += host.nbytes
        return array

    def broadcast_(self, array, root=0):
        """Overwrite `array`, in place, with process `root`'s values."""
        host = numpy.ascontiguousarray(backend.to_host(array))
        self.comm.Bcast(host, root=root)
        if host is not array:
            array[...] = backend.to_device(host, backend.device_of(array))
        self.calls["broadcast"] += 1
        return array

    def reduce_scatter(self, array):
        """The sum over all processes of `array`, cut into `size` equal shards: this process's shard (a new array)."""
        host = numpy.ascontiguousarray(backend.to_host(array))
        if host.size % self.size:
            raise ValueError(f"reduce_scatter: {host.size} elements do not cut into {self.size} equal shards; pad them")
        shard = numpy.empty(host.size // self.size, dtype=host.dtype)
        self.comm.Reduce_scatter_block(host, shard, op=self.MPI.SUM)
        self.calls["reduce_scatter"] += 1
        self.bytes_sent["reduce_scatter"] += host.nbytes
        return backend.to_device(shard, backend.device_of(array)) if host is not array else shard

    def reduce_(self, array, root):
        """Sum `array` over all processes into process `root`'s `array`, in place; the others' stay as they were."""
        host = numpy.ascontiguousarray(backend.to_host(array))
        if self.rank == root:
            self.comm.Reduce(self.MPI.IN_PLACE, host, op=self.MPI.SUM, root=root)
            if host is not array:
                array[...] = backend.to_device(host, backend.device_of(array))
        else:
            self.comm.Reduce(host, None, op=self.MPI.SUM, root=root)
        self.calls["reduce"] += 1
        self.bytes_sent["reduce"] += host.nbytes
        return array

    def all_gather_(self, array):
        """Fill `array`, in place, with every process's shard: process r's from its own elements [r S, (r+1) S)."""
        host = numpy.ascontiguousarray(backend.to_host(array))
        self.comm.Allgather(self.MPI.IN_PLACE, host)
        if host is not array:
            array[...] = backend.to_device(host, backend.device_of(array))
        self.calls["all_gather_arrays"] += 1
        self.bytes_sent["all_gather_arrays"] += host.nbytes
        return array

    def any_(self, flag):
        """True on every process if `flag` is true on any."""
        return bool(self.all_reduce_(numpy.array([float(bool(flag))]))[0])

    def all_gather(self, value):
        """[value of rank 0, value of rank 1, ...] on every process (small Python values only)."""
        self.calls["all_gather"] += 1
        return self.comm.allgather(value)

    def gather(self, value, root=0):
        """[value of rank 0, value of rank 1, ...] on process `root`, None on the others (Python values)."""
        self.calls["gather"] += 1
        return self.comm.gather(value, root=root)


class DataParallel:
    """Train one model on N processes as if one process ran the whole effective batch.

        parallel = DataParallel()   # run under `mpiexec -n N`: MPI's COMM_WORLD
        trainer = Trainer(model=model, args=args, train_dataset=train, distributed=parallel)
        trainer.train()             # every rank trains; only rank 0 prints and saves

    The Trainer calls these hooks (see the module docstring for the why):

        prepare(model, accumulator, args, train_dataset, tokenizer)   once, when the Trainer is built
        raise_if_any(error), check_in_sync()   at the start of train(), before the first step
        shard(indices)                  for each micro-batch: this rank's share of it
        all_reduce_(accumulator, stats) once per optimizer step, before write_grads()
        is_main_process                 only rank 0 logs, shows progress and saves

    `check_every`: optimizer steps between parameter checksums, the first step
    included (0: never). `check_in_sync()` checks on demand.
    `comm`: an mpi4py communicator (default COMM_WORLD) or a Communicator.
    """

    def __init__(self, comm=None, check_every=CHECK_EVERY):
        self.comm = comm if isinstance(comm, Communicator) else Communicator(comm)
        self.rank, self.world_size = self.comm.rank, self.comm.size
        self.is_main_process = self.rank == 0
        self.check_every = check_every
        self.steps = 0  # all_reduce_ calls so far = optimizer steps taken
        self.named_parameters = None  # [(name, Parameter)] in the accumulator's order, set by prepare
        self.flat_buffers = []  # the accumulation buffers' flat arrays, set by prepare

    # -- once, at the start ---------------------------------------------------------
    def prepare(self, model, accumulator, args=None, train_dataset=None, tokenizer=None):
        """Check that all ranks agree (`agree`), give them rank 0's parameters, bucket the accumulation buffers.

        The parameters compared are the accumulator's; under ZeRO the shard
        layout is compared too (what it reduce-scatters and all-gathers: a
        rank that cut it otherwise would exchange the wrong elements, or wait
        for a message of another size).
        """
        names = {id(p): name for name, p in model.named_parameters()}
        missing = [i for i, p in enumerate(accumulator.parameters) if id(p) not in names]
        if missing:
            raise ValueError(f"the accumulator holds {len(missing)} parameter(s) that are not the model's")
        self.named_parameters = [(names[id(p)], p) for p in accumulator.parameters]
        self.agree(model, args, train_dataset, tokenizer, self.named_parameters)
        layout = getattr(accumulator, "layout", None)  # ZeRO (zero.py): every rank must cut the flat arrays alike
        if layout is not None:
            self.same_everywhere("the ZeRO shard layout (each flat array's dtype, elements P, shard size S)",
                                 [(str(shard.dtype), sum(layout.parameters[i].data.size for i in members), S)
                                  for (_, members, S), shard in zip(layout.groups, layout.shards)])
        for p in model.parameters():  # rank 0's values everywhere, frozen ones too (once: one call per tensor is fine)
            self.comm.broadcast_(p.data)
        for _, buf in model.named_buffers():
            self.comm.broadcast_(buf.data)
        # ZeRO's accumulator (zero.py) has its flat arrays already, padded to equal shards
        self.flat_buffers = accumulator.flats if hasattr(accumulator, "reduce_scatter_") else bucket_buffers(accumulator)
        return self

    def agree(self, model, args=None, train_dataset=None, tokenizer=None, named_parameters=None):
        """Raise an error on every rank unless all hold the same model, arguments, tokenizer and data.

        Compared, in this order, each an error on every rank naming what
        differs, on which rank, and (with more than two) every rank's value
        of it: the parameters' names, shapes and dtypes (`named_parameters`,
        default the model's), the training arguments (ZeRO's stage among
        them), the model's configuration (a dataclass `model.config`, as
        GPTConfig), the tokenizer (its state_dict), and the training data:
        its size, and its `fingerprint()` where the data set has one
        (CharDataset: a CRC-32 of its tokens; a data set without one is
        compared by size only, since reading all of it to hash it could take
        long). Every rank must read the same data the same way, or their
        shares would overlap or miss examples; so the data set must also hold
        at least one micro-batch for every rank. Only small values are sent,
        so call it before anything whose size each rank computes from its own
        model (`prepare` does).
        """
        self.same_everywhere("the model's parameters (name, shape, dtype)",
                             [(name, tuple(p.shape), str(p.dtype)) for name, p in
                              (model.named_parameters() if named_parameters is None else named_parameters)])
        if args is not None:
            self.same_everywhere("the training arguments", sorted(asdict(args).items()))
        config = getattr(model, "config", None)
        if is_dataclass(config):
            self.same_everywhere("the model configuration", sorted(asdict(config).items()))
        if tokenizer is not None:
            self.same_everywhere("the tokenizer", sorted(tokenizer.state_dict().items()))
        if train_dataset is not None:
            num_examples = len(train_dataset)
            self.same_everywhere("the training data set's size", num_examples)
            if hasattr(train_dataset, "fingerprint"):
                self.same_everywhere("the training data (its fingerprint)", train_dataset.fingerprint())
            B = args.per_device_train_batch_size if args is not None else 1
            if num_examples < B * self.world_size:
                raise ValueError(
                    f"the training data set has {num_examples} examples, fewer than one micro-batch on each of "
                    f"the {self.world_size} processes (per_device_train_batch_size={B} x {self.world_size} = "
                    f"{B * self.world_size}); use fewer processes, a smaller batch size, or more data"
                )

    def raise_if_any(self, error):
        """Raise DistributedError on every rank if any rank passes an exception; `error` is None where all is well.

        For a check only some ranks can make (rank 0 alone writes the output
        directory): the others must stop too, not wait in the next collective.
        """
        messages = self.comm.all_gather(None if error is None else f"{type(error).__name__}: {error}")
        for rank, message in enumerate(messages):
            if message is not None:
                raise DistributedError(f"rank {rank} cannot go on: {message}")

    def same_everywhere(self, what, value):
        """Raise DistributedError, on every rank, unless every rank passed an equal `value`."""
        values = self.comm.all_gather(value)
        for rank, other in enumerate(values):
            if other != values[0]:
                parts = _first_difference(values, rank)
                every = "" if len(values) == 2 else f" (rank by rank: {', '.join(f'{r} {p}' for r, p in enumerate(parts))})"
                raise DistributedError(
                    f"the processes disagree on {what}: rank {rank} has {parts[rank]} where rank 0 has "
                    f"{parts[0]}{every}; start every process with the same command, model and data"
                )

    # -- every micro-batch -------------------------------------------------------------
    def shard(self, indices):
        """This rank's share of one global micro-batch (see `shard`); may be empty."""
        return shard(indices, self.rank, self.world_size)

    # -- every optimizer step -----------------------------------------------------------
    def all_reduce_(self, accumulator, stats=None):
        """Sum every rank's accumulation buffers and item count (and `stats`, a dict of numbers), in place.

        Afterwards every rank's `accumulator` holds the sums over the whole
        effective batch, so `accumulator.write_grads()` divides by the global
        item count. One all-reduce per flat buffer, one for the counts.
        """
        if self.check_every and self.steps % self.check_every == 0:
            self.check_in_sync()
        if hasattr(accumulator, "reduce_scatter_"):  # ZeRO (zero.py): each process receives its shard of the sum
            accumulator.reduce_scatter_()
        else:
            for flat in self.flat_buffers:
                self.comm.all_reduce_(flat)
        keys = list(stats) if stats is not None else []
        counts = numpy.array([accumulator.items] + [stats[k] for k in keys], dtype=numpy.float64)
        self.comm.all_reduce_(counts)  # float64: item counts stay exact up to 2**53
        accumulator.items = int(counts[0])
        for key, total in zip(keys, counts[1:]):
            stats[key] = int(total) if isinstance(stats[key], int) else float(total)
        self.steps += 1

    def check_in_sync(self):
        """Raise DistributedError, on every rank, if any parameter differs between ranks.

        A CRC-32 of each parameter's bytes is gathered from every rank: exact
        (one flipped bit shows) and a few bytes per parameter to send.
        """
        copies = [(name, p) for name, p in self.named_parameters if backend.is_array(p.data)]  # ZeRO stage 3: none
        sums = [zlib.crc32(numpy.ascontiguousarray(backend.to_host(p.data)).view(numpy.uint8)) for _, p in copies]
        everyone = self.comm.all_gather(sums)
        for rank, other in enumerate(everyone):  # each rank against rank 0: the same error on every rank
            for (name, _), reference, theirs in zip(copies, everyone[0], other):
                if theirs != reference:
                    raise DistributedError(
                        f"parameters diverged after {self.steps} optimizer step(s): {name!r} on rank {rank} "
                        "differs from rank 0's. Every rank applies the same update to the same values, so "
                        "the copies stay identical unless something changed one of them outside the "
                        "optimizer step (code that runs on one rank only, a non-deterministic op); "
                        "stopping rather than training different models"
                    )


def _first_difference(values, rank):
    """Every rank's part of the gathered `values` where rank `rank`'s first differs from rank 0's.

    Lists are compared entry by entry, and each rank's entry at the first
    difference is given; other values whole.
    """
    value, reference = values[rank], values[0]
    if not (isinstance(value, list) and isinstance(reference, list)):
        return [repr(v) for v in values]
    i = next((i for i, (a, b) in enumerate(zip(value, reference)) if a != b), None)
    if i is None:  # one is the other and more
        return [f"{len(v)} entries" for v in values]
    return [repr(v[i]) if i < len(v) else f"{len(v)} entries" for v in values]


# -- for the command line -------------------------------------------------------------
def from_environment():
    """A DataParallel when this process was started by `mpiexec -n N` with N > 1; None otherwise.

    Plain runs (and `mpiexec -n 1`) never import mpi4py.
    """
    expected = world_size_from_environment()
    if expected <= 1:
        return None
    parallel = DataParallel()
    if parallel.world_size != expected:
        raise DistributedError(
            f"mpiexec started {expected} processes, but MPI sees {parallel.world_size}: the mpiexec you ran "
            f"belongs to another MPI than mpi4py's. Run the one installed with it: "
            f"{os.path.join(os.path.dirname(sys.executable), 'mpiexec')}"
        )
    return parallel


def abort_if_running(code, traceback=False):
    """Under mpiexec with several processes, stop them all; otherwise do nothing.

    Call it after printing an error: one process that exits while the others
    wait in an all-reduce would leave them waiting forever. MPI_Abort ends the
    whole run with exit status `code`. traceback: print the exception being
    handled first (it would not be printed otherwise).
    """
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized() or MPI.COMM_WORLD.Get_size() == 1:
        return
    if traceback:
        import traceback as tb

        tb.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    # MPI_Abort kills every process at once, and mpiexec may tear down the
    # output pipes before it has forwarded what was just printed: the error
    # message, the one thing the user needs, would be lost. A moment's pause
    # lets mpiexec pass it on first (CI once saw exit status 3 with no text).
    time.sleep(ABORT_GRACE_SECONDS)
    try:
        MPI.COMM_WORLD.Abort(code)
    finally:  # MPI_Abort does not return; if it ever fails, leave at once: after a normal exit (through
        os._exit(code)  # MPI_Finalize) the others would wait for us forever. mpiexec ends the job when one dies so.
