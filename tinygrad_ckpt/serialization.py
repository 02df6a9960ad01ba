"""Saving and loading checkpoints: model weights, optimizer state, and what a run needs to resume.

    >>> import os, tempfile, numpy
    >>> from tinygrad_ckpt import nn
    >>> from tinygrad_ckpt.optim import AdamW
    >>> model = nn.Linear(3, 2, rng=numpy.random.default_rng(0))
    >>> run = tempfile.TemporaryDirectory()
    >>> path = os.path.join(run.name, "ckpt.npz")
    >>> save(path, model, AdamW(model.parameters()), extra={"step": 100})   # extra: JSON values, or arrays
    >>> other = nn.Linear(3, 2, rng=numpy.random.default_rng(1))
    >>> restore(path, other, AdamW(other.parameters()))   # verifies, then copies in place; returns extra
    {'step': 100}
    >>> bool((other.weight.data == model.weight.data).all())
    True
    >>> sorted(load(path))                                 # the checkpoint as dicts of arrays
    ['extra', 'model', 'optimizer']
    >>> run.cleanup()

The format is one `.npz` file, NumPy's zip of `.npy` arrays, because:
  - it needs nothing but NumPy (no new dependency);
  - it stores every array exactly, bit for bit, in its own dtype;
  - anyone can read it without this package (`numpy.load(path)`);
  - it is read without pickle, so opening a checkpoint cannot run code
    (torch.save's format is pickle; PyTorch 2.13's torch.load restricts what
    it unpickles, weights_only=True, unless asked not to);
  - the zip's CRC-32 checksums let a damaged file be detected.

Entries: `model/<dotted name>` per state_dict entry, `optimizer/<state>/<i>`
per optimizer state array, `extra/<key>` per array in `extra`, and
`__meta__`, one JSON string with the format version, the dtype and shape of
every array, the optimizer's type, hyperparameters and step counts, and the
non-array values of `extra` (which must therefore be JSON values: numbers,
strings, lists, dicts; a numpy Generator's `bit_generator.state` is one).

Reading trusts nothing in the file. `load` reads every entry in full and
checks it before returning anything: the zip's CRC-32 of each entry, each
`.npy` header against the bytes that follow it (so a header that declares a
huge array fails before any memory is asked for), each array's dtype and
shape against the metadata, and the metadata's every field and type. Any
damage (a truncated file, a flipped byte anywhere, a plain `.npy`, another
zip, metadata of the wrong type) raises one exception, CheckpointFileError,
naming the file and what is wrong. `restore` then checks that everything
fits the model and the optimizer (names, shapes, dtypes, hyperparameters)
before it copies anything, so a failed restore changes nothing.

Files are written atomically (`atomic_write`): into a temporary file in the
same directory, flushed and fsynced, then renamed over the target with
os.replace. A crash or an error mid-save leaves the previous checkpoint
intact, never a half-written one; a process killed mid-save leaves its
temporary file, which `remove_stale_temporary_files` cleans up.

What does not live here: state_dict itself (nn/module.py, optim.py), when to
save during training and which checkpoints to keep (train.py).
"""

import contextlib
import errno
import io
import json
import math
import os
import re
import secrets
import tempfile
import zipfile

import numpy

from . import backend
from .nn.module import LoadStateDictError
from .tape import no_grad
from .tensor import Tensor

FORMAT = "tinygrad_ckpt checkpoint"
VERSION = 2  # 2: __meta__ lists every array's dtype and shape; version 1 files (without that list) are still read
MAX_HEADER_BYTES = 10_000  # a longer .npy header is damage (NumPy's own limit for untrusted files)


class CheckpointFileError(ValueError):
    """A checkpoint file is damaged, not a checkpoint, or does not fit what it is loaded into.

    The message names the file and what is wrong.
    """


# -- writing ------------------------------------------------------------------------
@contextlib.contextmanager
def atomic_write(path, mode="wb"):
    """Open a temporary file next to `path`; on success it replaces `path` in one step.

    >>> import json, os, tempfile
    >>> directory = tempfile.TemporaryDirectory()
    >>> path = os.path.join(directory.name, "log.json")
    >>> with atomic_write(path, "w") as f:
    ...     json.dump({"step": 1}, f)
    >>> os.listdir(directory.name)            # the temporary file is gone: renamed onto path
    ['log.json']
    >>> directory.cleanup()

    If the block raises (or the process dies), `path` keeps its old contents
    and the temporary file is removed (or, after a hard crash, left as a
    hidden `.<name>.<pid>.<random>.tmp` next to it, which
    `remove_stale_temporary_files` removes).
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


_TEMPORARY = re.compile(r"\..+\.(\d+)\.[0-9a-f]{8}\.tmp")  # atomic_write's names: .<name>.<pid>.<random>.tmp


def remove_stale_temporary_files(directory):
    """Remove the temporary files that saves killed mid-write left in `directory`; returns their paths.

    Only atomic_write's own names are touched, and only those of processes
    that are no longer running (another run saving into the same directory
    keeps its file).
    """
    removed = []
    for name in sorted(os.listdir(directory)):
        match = _TEMPORARY.fullmatch(name)
        if match is None or _process_is_running(int(match.group(1))):
            continue
        path = os.path.join(directory, name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(path)
    return removed


def _process_is_running(pid):
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)  # signal 0: no signal, only the check
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # it exists (owned by someone else), or we cannot tell: leave its file alone
    return True


def check_writable(directory):
    """Create `directory` if needed and prove that a file can be written there; OSError naming it if not.

    Called before training starts, so a read-only or full output directory
    is found in the first second, not at the first save an hour later.
    """
    directory = os.fspath(directory)
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory) as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise type(e)(e.errno, f"output directory {directory!r} is not writable ({e.strerror}); "
                               "choose another output directory") from None


def check_file_writable(path):
    """Prove that atomic_write(path) can succeed, before the work that makes the file; OSError naming it if not.

    The path must not be a directory, and its folder must exist and take a
    new file (atomic_write writes a temporary file there, then renames it).
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, f"{path!r} is a directory; give the path of a file in it")
    if not os.path.isdir(folder):
        raise FileNotFoundError(errno.ENOENT, f"the folder of {path!r}, {folder}, does not exist; create it or "
                                              "choose another path")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise type(e)(e.errno, f"{path!r} cannot be written: its folder {folder} does not take a new file "
                               f"({e.strerror}); choose another path") from None


def save(path, model=None, optimizer=None, extra=None):
    """Write model.state_dict(), optimizer.state_dict() and `extra` to one .npz file, atomically.

    `model` may be a Module or a state_dict; `optimizer` an Optimizer or its
    state_dict. `extra` is a dict: NumPy arrays and Tensors are stored as
    arrays, everything else must be a JSON value (a TypeError names the key
    that is not). The file is written to exactly `path` (no suffix is added).
    A model or optimizer on the meta device has no values to write: NeedsValues,
    naming the entry, before anything is written.
    """
    _refuse_meta(model, optimizer)
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
    for name, value in arrays.items():
        if value.dtype.hasobject:
            raise TypeError(f"save: {name} holds Python objects, which a checkpoint does not store (it never pickles)")
    meta["arrays"] = {name: [value.dtype.str, list(value.shape)] for name, value in arrays.items()}
    arrays["__meta__"] = numpy.array(json.dumps(meta))
    with atomic_write(path) as f:
        numpy.savez(f, **arrays)


# -- reading: every byte checked before anything is returned ------------------------
def load(path):
    """Read and verify a checkpoint: {"model": state_dict or None, "optimizer": state or None, "extra": dict}.

    Every entry is read in full and checked (see the module docstring)
    before anything is returned. Raises CheckpointFileError (a ValueError) naming
    the file and what is wrong if it is damaged or not a checkpoint;
    FileNotFoundError if it does not exist. Nothing is ever unpickled.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path!r} does not exist")
    entries = _read_entries(path)
    meta = _read_meta(entries, path)
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


def read_extra(path):
    """The `extra` dict of a checkpoint, reading only its metadata (not its arrays): to sort many files quickly.

    Checks the metadata entry's CRC-32 and that it is a JSON object with a
    dict `extra`; CheckpointFileError if not. Use load() for a file you will use.
    """
    path = os.fspath(path)
    try:
        with zipfile.ZipFile(path) as archive:
            raw = _parse_npy(archive.read("__meta__.npy"), "__meta__", path)
        meta = json.loads(str(raw))
    except (PermissionError, IsADirectoryError, FileNotFoundError):
        raise
    except Exception as e:  # damage, as in _read_entries
        raise CheckpointFileError(f"{path!r} is corrupt or not a checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("extra"), dict):
        raise CheckpointFileError(f"{path!r} is corrupt or not a checkpoint: its metadata holds no 'extra' dict")
    return meta["extra"]


def _read_entries(path):
    """{entry name without .npy: array}, every entry read in full, its CRC-32 and header checked."""
    size = os.path.getsize(path)
    entries = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                name = info.filename
                if not name.endswith(".npy"):
                    raise CheckpointFileError(f"{path!r} is corrupt or not a checkpoint: it holds {name!r}, which is not "
                                          "a .npy array; use an earlier checkpoint")
                if info.compress_type != zipfile.ZIP_STORED or info.file_size > size:
                    raise CheckpointFileError(
                        f"{path!r} is corrupt or not a checkpoint: entry {name!r} declares "
                        f"{info.file_size:,} bytes{' compressed' if info.compress_type else ''} in a file of "
                        f"{size:,} (checkpoints store their arrays uncompressed); use an earlier checkpoint"
                    )
                key = name[: -len(".npy")]
                if key in entries:
                    raise CheckpointFileError(f"{path!r} is corrupt: it holds the entry {name!r} twice")
                entries[key] = _parse_npy(archive.read(info), key, path)  # read() checks the CRC-32
    except CheckpointFileError:
        raise
    except (PermissionError, IsADirectoryError):
        raise  # not damage: the file cannot be opened at all
    except Exception as e:
        # Damaged bytes fail inside zipfile, struct, zlib or NumPy's header parser in many ways
        # (BadZipFile, EOFError, struct.error, ValueError, NotImplementedError, RuntimeError for a
        # flipped "encrypted" flag, MemoryError, ...): every one of them means the same thing here.
        raise CheckpointFileError(
            f"{path!r} is corrupt or truncated and cannot be read ({type(e).__name__}: {e}); "
            "use an earlier checkpoint"
        ) from None
    return entries


def _parse_npy(data, key, path):
    """One .npy entry's bytes -> a NumPy array, after checking its header against its length."""
    stream = io.BytesIO(data)
    version = numpy.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, fortran_order, dtype = numpy.lib.format.read_array_header_1_0(stream, max_header_size=MAX_HEADER_BYTES)
    elif version == (2, 0):
        shape, fortran_order, dtype = numpy.lib.format.read_array_header_2_0(stream, max_header_size=MAX_HEADER_BYTES)
    else:
        raise CheckpointFileError(f"{path!r}: entry {key!r} is a .npy file of version {version}, which checkpoints never use")
    if dtype.hasobject:
        raise CheckpointFileError(f"{path!r}: entry {key!r} holds Python objects; a checkpoint is never unpickled")
    declared = math.prod(shape) * dtype.itemsize  # Python ints: no overflow, however large the header says
    held = len(data) - stream.tell()
    if declared != held:
        raise CheckpointFileError(
            f"{path!r} is corrupt: entry {key!r} declares shape {shape} of {dtype} ({declared:,} bytes) "
            f"but holds {held:,} bytes; use an earlier checkpoint"
        )
    array = numpy.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=stream.tell())
    return array.reshape(shape, order="F" if fortran_order else "C").copy()  # a writable array of its own


def _read_meta(entries, path):
    """The __meta__ entry, parsed and checked field by field against the entries."""
    def expect(condition, what):
        if not condition:
            raise CheckpointFileError(f"{path!r} is corrupt or not a checkpoint of this format: {what}")

    if "__meta__" not in entries:
        raise CheckpointFileError(f"{path!r} is an .npz file but not a tinygrad_ckpt checkpoint (it has no __meta__ entry)")
    raw = entries["__meta__"]
    expect(raw.dtype.kind == "U" and raw.shape == (), "__meta__ is not a JSON string")
    try:
        meta = json.loads(str(raw))
    except (ValueError, RecursionError) as e:
        raise CheckpointFileError(f"{path!r} is corrupt: its __meta__ entry is not valid JSON ({e})") from None
    expect(isinstance(meta, dict), "__meta__ is not a JSON object")
    if meta.get("format") != FORMAT:
        raise CheckpointFileError(f"{path!r} is not a tinygrad_ckpt checkpoint (format {meta.get('format')!r})")
    version = meta.get("version")
    if not _is_int(version) or not 1 <= version <= VERSION:
        raise CheckpointFileError(f"{path!r} is a checkpoint of format version {version!r}; this version of "
                              f"tinygrad_ckpt reads versions 1 to {VERSION} (a newer tinygrad_ckpt wrote it?)")
    names = {"__meta__"}  # every entry the metadata accounts for
    if "model" in meta:
        expect(_is_list_of(meta["model"], str) and len(set(meta["model"])) == len(meta["model"]),
               "'model' is not a list of distinct names")
        names.update(f"model/{name}" for name in meta["model"])
    if "optimizer" in meta:
        opt = meta["optimizer"]
        expect(isinstance(opt, dict) and set(opt) == {"type", "hyper", "steps", "state"},
               "'optimizer' does not hold exactly 'type', 'hyper', 'steps' and 'state'")
        expect(isinstance(opt["type"], str), "the optimizer's 'type' is not a name")
        expect(isinstance(opt["hyper"], dict) and all(_is_hyperparameter(v) for v in opt["hyper"].values()),
               "the optimizer's 'hyper' is not a dict of numbers")
        expect(_is_list_of(opt["steps"], int) and all(_is_int(n) and n >= 0 for n in opt["steps"]),
               "the optimizer's 'steps' is not a list of step counts")
        expect(isinstance(opt["state"], dict) and all(_is_int(n) and n >= 0 for n in opt["state"].values()),
               "the optimizer's 'state' is not a dict of array counts")
        names.update(f"optimizer/{name}/{i}" for name, n in opt["state"].items() for i in range(n))
    expect(isinstance(meta.get("extra"), dict), "'extra' is not a dict")
    expect(_is_list_of(meta.get("extra_arrays"), str) and not set(meta["extra_arrays"]) & set(meta["extra"]),
           "'extra_arrays' is not a list of names apart from extra's")
    names.update(f"extra/{key}" for key in meta["extra_arrays"])
    missing, unexpected = sorted(names - set(entries)), sorted(set(entries) - names)
    expect(not missing, f"entries {missing} are listed in its metadata but missing from the file")
    expect(not unexpected, f"it holds entries {unexpected} that its metadata does not list")
    if version >= 2:  # every array's dtype and shape, as written
        described = meta.get("arrays")
        expect(isinstance(described, dict) and set(described) == names - {"__meta__"},
               "'arrays' does not describe exactly the arrays in the file")
        for name, description in described.items():
            expect(isinstance(description, list) and len(description) == 2 and isinstance(description[0], str)
                   and _is_list_of(description[1], int), f"the description of {name!r} is not [dtype, shape]")
            dtype, shape = description
            array = entries[name]
            expect(array.dtype.str == dtype and list(array.shape) == shape,
                   f"entry {name!r} is {array.dtype.str} {list(array.shape)}, its metadata says {dtype} {shape}")
    return meta


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_list_of(value, kind):
    return isinstance(value, list) and all(_is_int(v) if kind is int else isinstance(v, kind) for v in value)


def _is_hyperparameter(value):
    if isinstance(value, list):
        return all(_is_hyperparameter(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# -- restoring: everything checked against the model and optimizer, then copied ------------
def restore(source, model=None, optimizer=None, strict=True):
    """Load a checkpoint into `model` and `optimizer` (in place) and return its `extra` dict.

    source: a path, or what load() returned. Everything is checked before
    anything is copied, so on any error the model and optimizer are
    unchanged: a model that does not match raises LoadStateDictError
    listing the missing, unexpected and wrongly shaped entries; an array
    of another dtype than the model's or the optimizer's, or an optimizer
    state that does not fit, raises CheckpointFileError.
    """
    checkpoint = source if isinstance(source, dict) else load(source)
    path = repr(os.fspath(source)) if not isinstance(source, dict) else "the checkpoint"
    if model is not None:
        if checkpoint["model"] is None:
            raise CheckpointFileError(f"{path} holds no model state")
        _check_model_fits(checkpoint["model"], model, strict, path)
    if optimizer is not None:
        if checkpoint["optimizer"] is None:
            raise CheckpointFileError(f"{path} holds no optimizer state")
        _check_optimizer_fits(checkpoint["optimizer"], optimizer, path)
    with no_grad():  # writing into parameters: a copy, not an op to differentiate
        if model is not None:
            model.load_state_dict(checkpoint["model"], strict=strict)
        if optimizer is not None:
            optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["extra"]


def _check_model_fits(state, model, strict, path):
    own = dict(list(model.named_parameters()) + list(model.named_buffers()))
    missing = [name for name in own if name not in state]
    unexpected = [name for name in state if name not in own]
    mismatched = [(name, tuple(state[name].shape), t.shape) for name, t in own.items()
                  if name in state and tuple(state[name].shape) != t.shape]
    if mismatched or (strict and (missing or unexpected)):
        raise LoadStateDictError(f"{type(model).__name__} from {path}", missing, unexpected, mismatched)
    for name, t in own.items():
        if name in state and state[name].dtype != t.dtype:
            raise CheckpointFileError(
                f"{path}: model entry {name!r} is {state[name].dtype}, the model's is {t.dtype}; "
                "build the model with the dtype it was saved in"
            )


def _check_optimizer_fits(state, optimizer, path):
    name = type(optimizer).__name__
    if state["type"] != name:
        raise CheckpointFileError(f"{path} holds a {state['type']} state, not a {name} state")
    if set(state["hyper"]) != set(optimizer.hyper_names):
        raise CheckpointFileError(f"{path}: the {name} hyperparameters are {sorted(state['hyper'])}, "
                              f"expected {sorted(optimizer.hyper_names)}")
    if len(state["steps"]) != len(optimizer.params) or set(state["state"]) != set(optimizer.state_names):
        raise CheckpointFileError(
            f"{path}: the {name} state does not fit this optimizer: it has {len(state['steps'])} parameters and "
            f"state {sorted(state['state'])}, this one has {len(optimizer.params)} parameters and state "
            f"{sorted(optimizer.state_names)}"
        )
    for key in optimizer.state_names:
        ours = getattr(optimizer, key)
        if len(state["state"][key]) != len(ours):
            raise CheckpointFileError(f"{path}: the {name} state {key!r} has {len(state['state'][key])} arrays, "
                                  f"this optimizer has {len(ours)}")
        for i, (saved, own) in enumerate(zip(state["state"][key], ours)):
            if tuple(saved.shape) != tuple(own.shape) or saved.dtype != own.dtype:
                raise CheckpointFileError(
                    f"{path}: the {name} state {key}[{i}] is {saved.dtype} {tuple(saved.shape)}, this "
                    f"optimizer's is {own.dtype} {tuple(own.shape)}"
                )


def _refuse_meta(model, optimizer):
    """NeedsValues for the first parameter, buffer or optimizer state on the meta device (no values to save)."""
    named = []
    if model is not None and not isinstance(model, dict):
        named += [(f"the model's {name!r}", t.data) for name, t in
                  list(model.named_parameters()) + list(model.named_buffers())]
    if optimizer is not None and not isinstance(optimizer, dict):
        named += [(f"the optimizer's {key}[{i}]", a) for key in optimizer.state_names
                  for i, a in enumerate(getattr(optimizer, key))]
    for name, array in named:
        if not backend.holds_values(backend.device_of(array)):
            raise backend.no_values(f"save() of {name}", array,
                                    "A model built on device='meta' sizes a step; build it on 'cpu' or 'cuda' to "
                                    "train and save it (or model.to_empty(device=...) and load a state_dict).")


def _host(value):
    """A NumPy array from a Tensor or a NumPy/CuPy array."""
    return backend.to_host(value.data if isinstance(value, Tensor) else value)


def _is_device_array(value):
    try:
        backend.device_of(value)
        return True
    except TypeError:
        return False
