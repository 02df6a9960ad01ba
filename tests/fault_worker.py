"""What each process runs when tests/test_distributed_faults.py starts it under `mpiexec -n N`.

Not a test file (pytest does not collect it). Two modes:

    fault_worker.py disagree OUT
        for ZeRO stages 1, 2 and 3, Trainers whose last rank differs from
        the others (model size, zero_stage, dtype, shard layout); each rank
        writes `disagree_rank<r>.json`: per case, the error, the optimizer
        steps taken and the collectives that moved arrays.
    fault_worker.py FAULT WHERE train ARGS...
        `tinygrad-ckpt train ARGS...` (cli.main), where the last rank fails by
        FAULT (kill: SIGKILL, no handler runs; raise: an exception; exit:
        sys.exit(0); interrupt: KeyboardInterrupt) at WHERE (micro_batch:
        in its second forward; between: entering its first all-gather
        after a reduce: at stages 1 and 2 after the reduce-scatter and the
        optimizer step, before the updated shards are all-gathered; at
        stage 3 a unit's gather after gradients were reduced). The others
        are then inside a collective.
"""

import json
import os
import signal
import sys
from pathlib import Path

import numpy

from tinygrad_ckpt import cli, distributed
from tinygrad_ckpt.nn import GPT
from tinygrad_ckpt.train import Trainer

sys.path.insert(0, str(Path(__file__).parent))
from mpi_worker import dataset, tiny_gpt, training_args  # noqa: E402

ARRAYS = ("broadcast", "reduce_scatter", "reduce", "all_gather_arrays")  # the collectives that move arrays


def disagree(parallel, out):
    last = parallel.rank == parallel.world_size - 1
    messages = {}

    def attempt(name, build):
        before = {k: parallel.comm.calls[k] for k in ARRAYS}
        try:
            build()
            error = None
        except (distributed.DistributedError, ValueError) as e:
            error = f"{type(e).__name__}: {e}"
        messages[name] = {"error": error, "steps": parallel.steps,
                          "array_calls": sum(parallel.comm.calls[k] - before[k] for k in ARRAYS)}

    def trainer(stage, model=None):
        return Trainer(model or tiny_gpt(), training_args(zero_stage=stage, max_steps=2, per_device_train_batch_size=2),
                       dataset(20), distributed=parallel)

    def cut_for(world_size, stage):  # the last rank cuts the flat arrays for another number of processes
        real, parallel.world_size = parallel.world_size, world_size if last else parallel.world_size
        try:
            trainer(stage).train()
        finally:
            parallel.world_size = real

    for stage in (1, 2, 3):
        attempt(f"model_size_{stage}", lambda: trainer(stage, tiny_gpt(n_embd=24 if last else 16)).train())
        attempt(f"zero_stage_{stage}", lambda: trainer(3 - stage if last else stage).train())
        attempt(f"dtype_{stage}", lambda: trainer(stage, GPT(tiny_gpt().config, dtype=numpy.float32) if last else None).train())
        if stage < 3:  # stage 3 broadcasts its shards as it cuts them, before prepare can compare the cuts
            attempt(f"layout_{stage}", lambda: cut_for(parallel.world_size + 1, stage))
    (out / f"disagree_rank{parallel.rank}.json").write_text(json.dumps(messages))


def fail(fault, where):
    """Patch this process (the last rank only) to fail by `fault` at `where`; the other ranks run unchanged."""
    world = distributed.import_mpi().COMM_WORLD
    if world.Get_rank() != world.Get_size() - 1:
        return

    def now(what):
        print(f"fault_worker: the last rank fails ({fault}) {what}", file=sys.stderr, flush=True)
        if fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault == "exit":
            sys.exit(0)
        if fault == "interrupt":  # Ctrl-C that reached this process alone
            raise KeyboardInterrupt
        raise RuntimeError(f"the last rank failed {what}")

    if where == "micro_batch":
        compute_loss, calls = Trainer.compute_loss, []

        def failing(self, batch):
            calls.append(1)
            if len(calls) == 2:
                now("in the middle of a micro-batch")
            return compute_loss(self, batch)

        Trainer.compute_loss = failing
    else:  # the first all-gather after a reduce (stages 1, 2: the updated shards'; stage 3: a unit's gather)
        reduce_scatter, reduce_, all_gather_, reduced = (distributed.Communicator.reduce_scatter,
                                                         distributed.Communicator.reduce_,
                                                         distributed.Communicator.all_gather_, [])
        distributed.Communicator.reduce_scatter = lambda self, *a: reduced.append(1) or reduce_scatter(self, *a)
        distributed.Communicator.reduce_ = lambda self, *a, **k: reduced.append(1) or reduce_(self, *a, **k)

        def failing(self, array):
            if reduced:
                now("between a reduce and the all-gather")
            return all_gather_(self, array)

        distributed.Communicator.all_gather_ = failing


def main():
    mode = sys.argv[1]
    if mode == "disagree":
        disagree(distributed.DataParallel(check_every=1), Path(sys.argv[2]))
        return 0
    fail(mode, sys.argv[2])
    return cli.main(sys.argv[3:])


if __name__ == "__main__":
    sys.exit(main())
