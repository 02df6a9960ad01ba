"""Saving and loading checkpoints: model weights, optimizer state, and what a run needs to resume.

    save("run/ckpt.npz", model, optimizer, extra={"step": 100, "rng": rng.bit_generator.state})
    extra = restore("run/ckpt.npz", model, optimizer)   # copies in place; returns extra
    checkpoint = load("run/ckpt.npz")                   # {"model": ..., "optimizer": ..., "extra": ...}

The format is one `.npz` file, NumPy's zip of `.npy` arrays, because:
  - it needs nothing but NumPy (no new dependency);
  - it stores every array exactly, bit for bit, in its own dtype;
  - anyone can read it without this package (`numpy.load(path)`);
  - it is loaded with allow_pickle=False, so opening a checkpoint cannot run
    code (pickle-based formats such as torch.save's can);
  - the zip's CRC-32 checksums let a damaged file be detected.

Entries: `model/<dotted name>` per state_dict entry, `optimizer/<state>/<i>`
per optimizer state array, `extra/<key>` per array in `extra`, and
`__meta__`, one JSON string with the format version, the optimizer's type,
hyperparameters and step counts, and the non-array values of `extra` (which
must therefore be JSON values: numbers, strings, lists, dicts; a numpy
Generator's `bit_generator.state` is one).

Files are written atomically (`atomic_write`): into a temporary file in the
same directory, flushed and fsynced, then renamed over the target with
os.replace. A crash or an error mid-save leaves the previous checkpoint
intact, never a half-written one.

What does not live here: state_dict itself (nn/module.py, optim.py), when to
save during training (train.py).
"""

import contextlib
import json
import os
import secrets
import zipfile
import zlib

import numpy

from . import backend
from .nn.module import LoadStateDictError
from .tensor import Tensor

FORMAT = "tinygrad_ckpt checkpoint"
VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint file is corrupt, truncated, or not a checkpoint; the message names the file."""


@contextlib.contextmanager
def atomic_write(path, mode="wb"):
    """Open a temporary file next to `path`; on success it replaces `path` in one step.

        with atomic_write("log.json", "w") as f:
            json.dump(data, f)

    If the block raises (or the process dies), `path` keeps its old contents
    and the temporary file is removed (or, after a hard crash, left as a
    hidden `.<name>.<pid>.<random>.tmp` next to it).
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, mode.replace("w", "x"), encoding=None if "b" in mode else "utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)  # atomic on POSIX and Windows
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if hasattr(os, "O_DIRECTORY"):  # make the rename itself durable (POSIX)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save(path, model=None, optimizer=None, extra=None):
    """Write model.state_dict(), optimizer.state_dict() and `extra` to one .npz file, atomically.

    `model` may be a Module or a state_dict; `optimizer` an Optimizer or its
    state_dict. `extra` is a dict: NumPy arrays and Tensors are stored as
    arrays, everything else must be a JSON value (a TypeError names the key
    that is not). The file is written to exactly `path` (no suffix is added).
    """
    arrays, meta = {}, {"format": FORMAT, "version": VERSION}
    if model is not None:
        state = model if isinstance(model, dict) else model.state_dict()
        for name, value in state.items():
            arrays[f"model/{name}"] = _host(value)
        meta["model"] = list(state)  # the names, in order
    if optimizer is not None:
        state = optimizer if isinstance(optimizer, dict) else optimizer.state_dict()
        meta["optimizer"] = {key: state[key] for key in ("type", "hyper", "steps")}
        meta["optimizer"]["state"] = {name: len(values) for name, values in state["state"].items()}
        for name, values in state["state"].items():
            for i, value in enumerate(values):
                arrays[f"optimizer/{name}/{i}"] = _host(value)
    meta["extra"], meta["extra_arrays"] = {}, []
    for key, value in (extra or {}).items():
        if isinstance(value, Tensor) or _is_device_array(value):
            arrays[f"extra/{key}"] = _host(value)
            meta["extra_arrays"].append(key)
        else:
            meta["extra"][key] = value.item() if isinstance(value, numpy.generic) else value
            try:
                json.dumps(meta["extra"][key])
            except (TypeError, ValueError) as e:
                raise TypeError(
                    f"save: extra[{key!r}] cannot be stored ({e}); use arrays, Tensors or JSON "
                    "values (numbers, strings, lists, dicts)"
                ) from None
    arrays["__meta__"] = numpy.array(json.dumps(meta))
    with atomic_write(path) as f:
        numpy.savez(f, **arrays)


def load(path):
    """Read a checkpoint: {"model": state_dict or None, "optimizer": state or None, "extra": dict}.

    Raises CheckpointError (a ValueError) naming the file if it is corrupt,
    truncated or not a checkpoint; FileNotFoundError if it does not exist.
    """
    path = os.fspath(path)
    try:
        with numpy.load(path, allow_pickle=False) as npz:
            entries = {name: npz[name] for name in npz.files}  # reading checks each entry's CRC
    except FileNotFoundError:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, KeyError, AttributeError) as e:
        # AttributeError: a plain .npy file, which numpy.load returns as an array (no `with`).
        raise CheckpointError(
            f"checkpoint {path!r} is corrupt or truncated and cannot be read "
            f"({type(e).__name__}: {e}); use an earlier checkpoint"
        ) from None
    if "__meta__" not in entries:
        raise CheckpointError(f"{path!r} is an .npz file but not a tinygrad_ckpt checkpoint (it has no __meta__ entry)")
    meta = json.loads(str(entries["__meta__"]))
    if meta.get("format") != FORMAT or meta.get("version", 0) > VERSION:
        raise CheckpointError(f"{path!r} is not a checkpoint this version can read (format {meta.get('format')!r}, version {meta.get('version')})")

    model = None
    if "model" in meta:
        model = {name: entries[f"model/{name}"] for name in meta["model"]}
    optimizer = None
    if "optimizer" in meta:
        saved = meta["optimizer"]
        state = {name: [entries[f"optimizer/{name}/{i}"] for i in range(n)] for name, n in saved["state"].items()}
        optimizer = {"type": saved["type"], "hyper": saved["hyper"], "steps": saved["steps"], "state": state}
    extra = dict(meta["extra"])
    for key in meta["extra_arrays"]:
        extra[key] = entries[f"extra/{key}"]
    return {"model": model, "optimizer": optimizer, "extra": extra}


def restore(path, model=None, optimizer=None, strict=True):
    """Load a checkpoint into `model` and `optimizer` (in place) and return its `extra` dict.

    A model that does not match raises LoadStateDictError listing the
    missing, unexpected and wrongly shaped entries, before anything is copied.
    """
    checkpoint = load(path)
    if model is not None:
        if checkpoint["model"] is None:
            raise CheckpointError(f"{path!r} holds no model state")
        try:
            model.load_state_dict(checkpoint["model"], strict=strict)
        except LoadStateDictError as e:
            raise LoadStateDictError(f"{type(model).__name__} from {path!r}", e.missing, e.unexpected, e.mismatched) from None
    if optimizer is not None:
        if checkpoint["optimizer"] is None:
            raise CheckpointError(f"{path!r} holds no optimizer state")
        optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["extra"]


def _host(value):
    """A NumPy array from a Tensor or a NumPy/CuPy array."""
    return backend.to_host(value.data if isinstance(value, Tensor) else value)


def _is_device_array(value):
    try:
        backend.device_of(value)
        return True
    except TypeError:
        return False
