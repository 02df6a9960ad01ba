"""What each process runs when tests/test_zero_checkpoint.py starts `mpiexec -n N python tests/zero_checkpoint_worker.py OUT [FROM]`.

Not a test file (pytest does not collect it). For ZeRO stages 1, 2 and 3, in
OUT/stage<s>/: an uninterrupted 4-step run (`full/`, checkpoints at steps 2
and 4), one stopped after 2 steps and resumed (`stopped/`), and a copy of
`full/` whose step-4 shard of the last process is damaged, resumed
(`damaged/`: it must fall back to step 2). With FROM (a folder the worker
filled under another N): the stage-1 checkpoint of step 2 written there is
resumed at stages 2 and 3 on these N processes (`resharded/`, `resharded3/`). Each rank writes
`rank<r>.json` into OUT: its parameters, losses and AdamW shards, what the
resumes skipped and continued from. The test compares.
"""

import json
import shutil
import sys
from pathlib import Path

import numpy

from tinygrad_ckpt.distributed import DataParallel
from tinygrad_ckpt.train import Trainer

sys.path.insert(0, str(Path(__file__).parent))
from mpi_worker import dataset, training_args  # noqa: E402
from zero_worker import gpt  # noqa: E402  (3,421 float64 parameters: padded shards on 2 and 3 processes)

EXAMPLES_PER_MICRO_BATCH = 6  # on all processes together: 2 x 3 and 3 x 2, so either N resumes the other's runs
N_EXAMPLES = 40  # 7 micro-batches an epoch: 4 optimizer steps, the last one short


def arguments(parallel, stage, output_dir, max_steps=4):
    return training_args(optim="adamw", per_device_train_batch_size=EXAMPLES_PER_MICRO_BATCH // parallel.world_size,
                         gradient_accumulation_steps=2, max_steps=max_steps, save_steps=2, max_grad_norm=0.05,
                         lr_scheduler_type="constant", zero_stage=stage, output_dir=str(output_dir))


def run(parallel, stage, output_dir, max_steps=4, resume_from_checkpoint=None):
    trainer = Trainer(gpt(numpy.float64, seed=parallel.rank), arguments(parallel, stage, output_dir, max_steps),
                      dataset(N_EXAMPLES), distributed=parallel)
    history = trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    parallel.check_in_sync()
    with trainer.gathered():  # stage 3: every process gathers the whole parameters with the others
        params = [p.numpy().tolist() for p in trainer.model.parameters()]
    return {
        "params": params,
        "groups": [members for _, members, _ in trainer.accumulator.layout.groups],
        "losses": [e["loss"] for e in history if "loss" in e],
        "moments": [[a.tolist() for a in getattr(trainer.optimizer, name)] for name in ("exp_avg", "exp_avg_sq")],
        "skipped": [[Path(path).name, why] for path, why in trainer.skipped_checkpoints],
        "resumed_from": trainer.resumed_from and Path(trainer.resumed_from).name,
    }


def main(out, source=None):
    parallel = DataParallel(check_every=1)
    N, results = parallel.world_size, {}
    for stage in (1, 2, 3):
        here = Path(out) / f"stage{stage}"
        results[f"full_{stage}"] = run(parallel, stage, here / "full")
        run(parallel, stage, here / "stopped", max_steps=2)
        results[f"resumed_{stage}"] = run(parallel, stage, here / "stopped", resume_from_checkpoint=True)
        if parallel.rank == 0:  # the last process's shard of step 4, one byte flipped
            shutil.copytree(here / "full", here / "damaged")
            shard = here / "damaged" / f"checkpoint-4.shard-{N - 1}-of-{N}.npz"
            data = bytearray(shard.read_bytes())
            data[len(data) // 2] ^= 0xFF
            shard.write_bytes(bytes(data))
        parallel.comm.all_gather(None)  # the others wait for the damage
        results[f"damaged_{stage}"] = run(parallel, stage, here / "damaged", resume_from_checkpoint=True)
    if source is not None:  # another N's stage-1 checkpoint of step 2, resumed here at stage 2
        written = Path(source) / "stage1" / "full" / "checkpoint-2.npz"
        results["resharded"] = run(parallel, 2, Path(out) / "resharded", resume_from_checkpoint=written)
        results["resharded3"] = run(parallel, 3, Path(out) / "resharded3", resume_from_checkpoint=written)
    (Path(out) / f"rank{parallel.rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:])
