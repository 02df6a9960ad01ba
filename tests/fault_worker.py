"""What each process runs when tests/test_distributed_faults.py starts it under `mpiexec -n N`.

Not a test file (pytest does not collect it). Two modes:

    fault_worker.py disagree OUT
        for ZeRO stages 1 and 2, Trainers whose last rank differs from the
        others (model size, zero_stage, dtype, shard layout); each rank writes
        `disagree_rank<r>.json`: per case, the error and whether any
        optimizer step or sharded collective ran.
    fault_worker.py FAULT WHERE train ARGS...
        `tinygrad-ckpt train ARGS...` (cli.main), where the last rank fails by
        FAULT (kill: SIGKILL, no handler runs; raise: an exception; exit:
        sys.exit(0); interrupt: KeyboardInterrupt) at WHERE (micro_batch: in its second forward;
        between: after the reduce-scatter and the optimizer step, as it
        enters the all-gather). The others are then inside a collective.
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

SHARDED = ("reduce_scatter", "reduce", "all_gather_arrays")  # ZeRO's collectives (distributed.Communicator)


def disagree(parallel, out):
    last = parallel.rank == parallel.world_size - 1
    messages = {}

    def attempt(name, build):
        before = {k: parallel.comm.calls[k] for k in SHARDED}
        try:
            build()
            error = None
        except (distributed.DistributedError, ValueError) as e:
            error = f"{type(e).__name__}: {e}"
        messages[name] = {"error": error, "steps": parallel.steps,
                          "sharded_calls": sum(parallel.comm.calls[k] - before[k] for k in SHARDED)}

    def trainer(stage, model=None):
        return Trainer(model or tiny_gpt(), training_args(zero_stage=stage, max_steps=2, per_device_train_batch_size=2),
                       dataset(20), distributed=parallel)

    def cut_for(world_size, stage):  # the last rank cuts the flat arrays for another number of processes
        real, parallel.world_size = parallel.world_size, world_size if last else parallel.world_size
        try:
            trainer(stage).train()
        finally:
            parallel.world_size = real

    for stage in (1, 2):
        attempt(f"model_size_{stage}", lambda: trainer(stage, tiny_gpt(n_embd=24 if last else 16)).train())
        attempt(f"zero_stage_{stage}", lambda: trainer(3 - stage if last else stage).train())
        attempt(f"dtype_{stage}", lambda: trainer(stage, GPT(tiny_gpt().config, dtype=numpy.float32) if last else None).train())
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
    else:
        def failing(self, array):
            now("between the reduce-scatter and the all-gather")

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
