"""ZeRO's checkpoints: each process writes its shard of the optimizer state, and a manifest names the shards.

    output_dir/checkpoint-6.npz               the manifest: what resume.py writes for one process (the
                                              model, the Trainer's and the random generators' state, ...)
                                              but the optimizer, plus extra["zero"]: the layout of the
                                              flat shards and each shard's file name and SHA-256
    output_dir/checkpoint-6.shard-0-of-2.npz  process 0's optimizer state: AdamW's moments of its S elements
    output_dir/checkpoint-6.shard-1-of-2.npz  process 1's

("Checkpoint" as in resume.py: a file of a saved run.) Stages 1 and 2 shard
the optimizer state only; every process holds all the parameters, so
process 0 writes them once, in the manifest. Stage 3 too: the processes
gather the parameters for the save (zero.GatheredParameters, one all-gather
of the model) and process 0 writes them whole, so the manifest's model is
the single process's, and consolidating or resuming on another N (the
parameters loaded whole, each process keeping its shard) needs nothing of
its own; the price is that rank 0 holds the whole model while it saves.

Writing (`save_shard`, on every process): each writes its shard atomically,
then they exchange the files' hashes, and process 0 writes the manifest
last. A checkpoint exists from the moment its manifest does: a save killed
halfway leaves no checkpoint-<step>.npz, so resuming never sees it (and an
older manifest of the same step names the old shards' hashes: it fails
whole, never mixing two saves).

Reading (`join_shards`): a manifest's shards are read and checked (the
file's SHA-256 against the manifest's, then serialization.load's checks),
each group's shards are joined in rank order, the padding is checked to be
zero and dropped, and the flat arrays are cut at the parameters. The result
is the checkpoint one process would have written, so a sharded checkpoint
verifies, resumes and loads as a plain one does (resume.verify_checkpoint
calls it), and `consolidate` writes it to one file, for one process. A
damaged or missing shard is a CheckpointFileError naming it, and resuming
moves on to the previous checkpoint, as for any damaged file.

Resuming a ZeRO run (`cut`): this process's shard of that whole state,
laid out as zero.FlatShards lays out the parameters. The whole state is cut
again on any number of processes, so a run saved on N processes resumes on
N' (resume.py checks that the data position means the same examples). The
cost: every process reads every shard and holds the whole optimizer state
for the moment of the restore (DeepSpeed 0.16.5's universal checkpoints,
made offline by deepspeed/checkpoint/ds_to_universal.py, store instead each
parameter's value and moments in files of its own, <name>/exp_avg.pt, ...).

One file for one process, from the command line (no MPI needed):

    python -m tinygrad_ckpt.zero_checkpoint output_dir/checkpoint-6.npz consolidated.npz

as DeepSpeed's `python zero_to_fp32.py CHECKPOINT_DIR OUTPUT_DIR` (deepspeed/utils/zero_to_fp32.py,
0.16.5), which also joins each group's fp32 partitions in rank order and cuts
them at the parameters' shapes, but keeps the weights only ("we only care for
fp32 master weights"). The file written here keeps the optimizer state
too, so one process resumes the run from it (reading the examples a
micro-batch that the N processes read together). A function and `python -m`, not a
subcommand of tinygrad-ckpt: it is this module's own tool, needs no MPI and
no model, and is run once, after training, as DeepSpeed's script is.

What does not live here: the layout itself (zero.py), what else a checkpoint
holds and choosing the newest good one (resume.py), the file format (serialization.py).
"""

import hashlib
import sys
from pathlib import Path

import numpy

from . import serialization
from .serialization import CheckpointFileError


def shard_path(path, rank, world_size):
    """Process `rank`'s shard of the checkpoint `path`: checkpoint-6.npz -> checkpoint-6.shard-0-of-2.npz."""
    path = Path(path)
    return path.with_name(f"{path.stem}.shard-{rank}-of-{world_size}.npz")


def shard_files(path):
    """The shard files beside the checkpoint `path` (any number of processes), to delete with it."""
    path = Path(path)
    return sorted(path.parent.glob(f"{path.stem}.shard-*-of-*.npz"))


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# -- writing ------------------------------------------------------------------------------
def save_shard(trainer, path):
    """Write this process's optimizer shard beside `path`; returns the manifest's extra["zero"].

    Called by every process; OSError on any of them stops all of them
    (DistributedError), never one waiting for the others.
    """
    layout, parallel = trainer.accumulator.layout, trainer.distributed
    mine, error, digest = shard_path(path, layout.rank, layout.world_size), None, None
    try:
        serialization.save(mine, optimizer=trainer.optimizer, extra={"shard": [layout.rank, layout.world_size]})
        digest = sha256(mine)
    except OSError as e:
        error = e
    parallel.raise_if_any(error)
    digests = parallel.comm.all_gather(digest)
    return {
        "stage": trainer.zero,
        "world_size": layout.world_size,
        "parameters": [name for name, _ in parallel.named_parameters],  # the optimizer's order
        "groups": [members for _, members, _ in layout.groups],  # indices into "parameters", one flat array each
        "shards": [[shard_path(path, r, layout.world_size).name, d] for r, d in enumerate(digests)],
    }


# -- reading ------------------------------------------------------------------------------
def join_shards(checkpoint, path):
    """`checkpoint` (serialization.load of a manifest) with its shards joined: one process's optimizer state.

    Returns {"model", "optimizer", "extra"} as serialization.load does, the
    optimizer state per parameter in the manifest's order, and extra
    without "zero". CheckpointFileError names the shard that is missing,
    damaged, replaced or of another layout.
    """
    zero, model, where = checkpoint["extra"]["zero"], checkpoint["model"], repr(str(path))

    def expect(condition, what):
        if not condition:
            raise CheckpointFileError(f"{where} is a ZeRO checkpoint whose {what}")

    expect(isinstance(zero, dict) and set(zero) == {"stage", "world_size", "parameters", "groups", "shards"},
           "'zero' entry is not {stage, world_size, parameters, groups, shards}")
    N, names, groups = zero["world_size"], zero["parameters"], zero["groups"]
    expect(type(N) is int and N >= 1 and isinstance(zero["shards"], list) and len(zero["shards"]) == N,
           f"list of shards does not name one shard per process (world_size {N!r})")
    expect(model is not None and isinstance(names, list) and all(n in model for n in names),
           "parameters are not all in its model")
    expect(isinstance(groups, list) and sorted(i for g in groups for i in g) == list(range(len(names))),
           "groups do not hold each parameter once")
    shards = []
    for r, entry in enumerate(zero["shards"]):
        name = shard_path(path, r, N).name
        file = Path(path).with_name(name)
        expect(isinstance(entry, list) and len(entry) == 2 and entry[0] == name, f"shard {r} is not named {name!r}")
        if not file.is_file():
            raise CheckpointFileError(f"{where} is missing its shard {name!r} (process {r} of {N}'s optimizer state)")
        if sha256(file) != entry[1]:
            raise CheckpointFileError(f"{where}: its shard {name!r} is not the file process {r} wrote (its SHA-256 "
                                      "differs from the manifest's): it was damaged or replaced")
        shard = serialization.load(file)["optimizer"]  # CheckpointFileError names the shard file
        first = shards[0] if shards else shard
        expect(shard is not None and len(shard["steps"]) == len(groups) and (shard["type"], shard["hyper"],
               shard["steps"]) == (first["type"], first["hyper"], first["steps"]),
               f"shard {name!r} holds no optimizer state for its groups, or another than shard 0's")
        shards.append(shard)
    state, steps = {key: [None] * len(names) for key in first["state"]}, [None] * len(names)
    for g, members in enumerate(groups):
        sizes = [model[names[i]].size for i in members]
        S = -(-sum(sizes) // N)
        for key in state:
            parts = [shard["state"][key][g] for shard in shards]
            expect(all(p.shape == (S,) for p in parts), f"shards of group {g} ({key}) are not of {S} elements each")
            whole = numpy.concatenate(parts)  # rank order: process r held [r S, (r + 1) S)
            expect(not whole[sum(sizes):].any(), f"padding of group {g} ({key}) is not zero")
            offset = 0
            for i, size in zip(members, sizes):
                state[key][i] = whole[offset : offset + size].reshape(model[names[i]].shape)
                offset += size
        for i in members:
            steps[i] = first["steps"][g]
    optimizer = {"type": first["type"], "hyper": first["hyper"], "steps": steps, "state": state}
    extra = {k: v for k, v in checkpoint["extra"].items() if k != "zero"}
    return {"model": model, "optimizer": optimizer, "extra": extra}


def cut(state, layout):
    """This process's shard of one process's optimizer state `state` (Optimizer.state_dict()'s form).

    layout: the run's zero.FlatShards; each group's per-parameter arrays are
    laid out flat, padded with zeros, and [r S, (r + 1) S) is kept.
    CheckpointFileError if the state is not of these parameters.
    """
    shapes = [tuple(p.shape) for p in layout.parameters]
    saved = [tuple(a.shape) for a in next(iter(state["state"].values()), [])] or shapes
    if len(state["steps"]) != len(shapes) or saved != shapes:
        raise CheckpointFileError(f"the checkpoint's optimizer state is for {len(state['steps'])} parameters of "
                                  f"other shapes than this model's {len(shapes)}; resume with the model it was written from")
    steps, arrays = [], {key: [] for key in state["state"]}
    for (_, members, S), shard in zip(layout.groups, layout.shards):
        counts = {state["steps"][i] for i in members}
        if len(counts) != 1:
            raise CheckpointFileError(f"the checkpoint's parameters {members} took {sorted(counts)} optimizer steps; "
                                      "a ZeRO run steps them together, so it cannot resume this state")
        steps.append(counts.pop())
        for key, values in state["state"].items():
            whole = numpy.zeros(S * layout.world_size, dtype=shard.dtype)
            for i, view in zip(members, layout.views(whole, members)):
                view[...] = values[i]
            arrays[key].append(whole[layout.rank * S : (layout.rank + 1) * S])
    return {**state, "steps": steps, "state": arrays}


# -- one file for one process -------------------------------------------------------------
def consolidate(path, out):
    """Write the ZeRO checkpoint `path` (its manifest) as one process's checkpoint file `out`, atomically.

    `out` holds the model, the whole optimizer state and the run's state: a
    single process resumes from it (with per_device_train_batch_size x
    processes as the run had) or loads its model (serialization.restore).
    """
    if Path(path).is_dir():
        raise CheckpointFileError(f"{str(path)!r} is a folder; pass one of its checkpoint-<step>.npz files (a manifest)")
    checkpoint = serialization.load(path)
    if "zero" not in checkpoint["extra"]:
        raise CheckpointFileError(f"{str(path)!r} is not a ZeRO checkpoint (no 'zero' entry): it is one file already")
    checkpoint = join_shards(checkpoint, path)
    serialization.save(out, model=checkpoint["model"], optimizer=checkpoint["optimizer"], extra=checkpoint["extra"])
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m tinygrad_ckpt.zero_checkpoint CHECKPOINT OUT  (CHECKPOINT: a checkpoint-<step>.npz "
                 "with its .shard-<r>-of-<N>.npz files beside it)")
    try:
        print(f"wrote {consolidate(sys.argv[1], sys.argv[2])}")
    except (OSError, CheckpointFileError) as e:
        sys.exit(f"consolidate: {e}")
