"""serialization: exact round trips, resuming training identically, atomic saves, clear errors on bad files.

Damage of every kind (a flipped byte anywhere, a truncation, another kind of
file, a header that lies, metadata of the wrong type) must give either the
identical checkpoint or CheckpointFileError naming the file, and a restore that
fails must leave the model and optimizer as they were.
"""

import io
import json
import os
import zipfile

import numpy
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinygrad_ckpt import Tensor, nn, serialization
from tinygrad_ckpt.optim import AdamW
from tinygrad_ckpt.serialization import CheckpointFileError, atomic_write, load, restore, save

CONFIG = nn.GPTConfig(block_size=6, vocab_size=7, n_layer=1, n_head=2, n_embd=8, dropout=0.0)
IDX = numpy.array([[0, 1, 2, 3, 4, 5], [6, 5, 4, 3, 2, 1]])
TARGETS = numpy.roll(IDX, -1, axis=1)


def model_and_optimizer(seed):
    model = nn.GPT(CONFIG, rng=numpy.random.default_rng(seed))
    return model, AdamW(model.parameters(), lr=1e-2)


def train(model, opt, steps):
    for _ in range(steps):
        _, loss = model(IDX, TARGETS)
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_round_trip_is_exact(tmp_path):
    model, opt = model_and_optimizer(0)
    train(model, opt, 2)
    rng = numpy.random.default_rng(5)
    rng.random(3)
    extra = {"step": 2, "name": "run", "rng": rng.bit_generator.state, "mask": numpy.array([True, False]),
             "loss_history": Tensor(numpy.array([2.5, 2.0])), "lr": numpy.float64(0.01)}
    path = tmp_path / "ckpt.npz"
    save(path, model, opt, extra=extra)
    checkpoint = load(path)

    assert list(checkpoint["model"]) == list(model.state_dict())
    for name, value in model.state_dict().items():
        assert checkpoint["model"][name].dtype == value.dtype and numpy.array_equal(checkpoint["model"][name], value)
    saved_opt, expected_opt = checkpoint["optimizer"], opt.state_dict()
    assert saved_opt["steps"] == expected_opt["steps"] and saved_opt["type"] == "AdamW"
    for key in ("exp_avg", "exp_avg_sq"):
        for a, b in zip(saved_opt["state"][key], expected_opt["state"][key]):
            assert numpy.array_equal(a, b)
    e = checkpoint["extra"]
    assert e["step"] == 2 and e["name"] == "run" and e["lr"] == 0.01
    assert numpy.array_equal(e["mask"], [True, False]) and numpy.array_equal(e["loss_history"], [2.5, 2.0])
    resumed_rng = numpy.random.default_rng()
    resumed_rng.bit_generator.state = e["rng"]
    assert numpy.array_equal(resumed_rng.random(4), rng.random(4))


def test_resuming_continues_training_identically(tmp_path):
    model, opt = model_and_optimizer(0)
    train(model, opt, 3)
    save(tmp_path / "ckpt.npz", model, opt, extra={"step": 3})
    train(model, opt, 2)

    other, other_opt = model_and_optimizer(1)  # different initial weights, fresh optimizer
    assert restore(tmp_path / "ckpt.npz", other, other_opt) == {"step": 3}
    train(other, other_opt, 2)
    for (name, a), (_, b) in zip(model.named_parameters(), other.named_parameters()):
        assert numpy.array_equal(a.numpy(), b.numpy()), name


def test_file_is_plain_npz_without_pickle(tmp_path):
    model, _ = model_and_optimizer(0)
    save(tmp_path / "ckpt.npz", model)
    with numpy.load(tmp_path / "ckpt.npz", allow_pickle=False) as npz:
        assert "model/wte.weight" in npz.files
        assert json.loads(str(npz["__meta__"]))["version"] == serialization.VERSION


def test_crash_during_save_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.npz"
    model, opt = model_and_optimizer(0)
    save(path, model, opt, extra={"step": 1})
    good = path.read_bytes()

    def crash(file, **arrays):
        file.write(b"PK\x03\x04 half of a zip file")  # partial output, then the process "dies"
        raise RuntimeError("simulated crash while writing")

    monkeypatch.setattr(numpy, "savez", crash)
    train(model, opt, 1)
    with pytest.raises(RuntimeError, match="simulated crash"):
        save(path, model, opt, extra={"step": 2})
    assert path.read_bytes() == good
    assert load(path)["extra"] == {"step": 1}
    assert os.listdir(tmp_path) == ["ckpt.npz"]  # no temporary file left behind


def test_save_overwrites_in_one_step(tmp_path):
    path = tmp_path / "ckpt.npz"
    save(path, extra={"step": 1})
    save(path, extra={"step": 2})
    assert load(path)["extra"] == {"step": 2} and load(path)["model"] is None
    assert os.listdir(tmp_path) == ["ckpt.npz"]


def test_atomic_write_text(tmp_path):
    path = tmp_path / "log.json"
    with atomic_write(path, "w") as f:
        json.dump({"a": 1}, f)
    with pytest.raises(KeyError):
        with atomic_write(path, "w") as f:
            f.write("{broken")
            raise KeyError("stop")
    assert json.loads(path.read_text()) == {"a": 1} and os.listdir(tmp_path) == ["log.json"]


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage"])
def test_damaged_file_gives_a_clear_error(tmp_path, damage):
    path = tmp_path / "ckpt.npz"
    model, opt = model_and_optimizer(0)
    save(path, model, opt)
    data = path.read_bytes()
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":  # one byte inside the first array's data: the zip CRC catches it
        i = data.index(b"wte.weight.npy") + 200
        data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
    elif damage == "empty":
        data = b""
    else:
        data = b"this is not a checkpoint"
    path.write_bytes(data)
    with pytest.raises(CheckpointFileError, match=r"ckpt\.npz' is corrupt or truncated"):
        load(path)
    with pytest.raises(ValueError):  # CheckpointFileError is a ValueError
        restore(path, model)


# -- any damage: the identical checkpoint, or CheckpointFileError ------------------------------
SMALL = nn.Linear(3, 2, rng=numpy.random.default_rng(0))


def small_checkpoint(path):
    """A small checkpoint with every kind of entry (model, AdamW state, JSON extra, an extra array)."""
    opt = AdamW(SMALL.parameters(), lr=1e-2)
    save(path, SMALL, opt, extra={"step": 3, "nested": [1.5, {"a": "b"}], "ids": numpy.arange(3)})
    return path.read_bytes()


def same(a, b):
    """Equal values of equal types, arrays equal in dtype, shape and every element."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, numpy.ndarray):
        return isinstance(b, numpy.ndarray) and a.dtype == b.dtype and a.shape == b.shape and numpy.array_equal(a, b)
    return type(a) is type(b) and a == b


@given(flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)), min_size=1, max_size=3))
def test_flipped_bytes_anywhere_give_the_identical_checkpoint_or_checkpoint_error(tmp_path_factory, flips):
    path = tmp_path_factory.mktemp("flip") / "ckpt.npz"
    good = small_checkpoint(path)
    expected = load(path)
    data = bytearray(good)
    for where, xor in flips:  # where: a fraction of the file, so every region is drawn
        data[int(where * len(data))] ^= xor
    path.write_bytes(bytes(data))
    model = nn.Linear(3, 2, rng=numpy.random.default_rng(1))
    opt = AdamW(model.parameters(), lr=1e-2)
    before = [p.numpy().copy() for p in model.parameters()]
    try:
        extra = restore(path, model, opt)
    except CheckpointFileError as e:
        assert "ckpt.npz" in str(e)
        assert all(numpy.array_equal(p.numpy(), b) for p, b in zip(model.parameters(), before))  # nothing restored
        return
    assert same(load(path), expected)
    assert same(extra, expected["extra"])
    for p, q in zip(model.parameters(), SMALL.parameters()):
        assert numpy.array_equal(p.numpy(), q.numpy())


def test_single_byte_flips_in_the_zip_directory_and_across_the_file(tmp_path):
    """Every byte of the zip's central directory (names, sizes, offsets, flags) and every 16th elsewhere."""
    path = tmp_path / "ckpt.npz"
    good = small_checkpoint(path)
    directory = good.index(b"PK\x01\x02")  # the central directory's first record: from there to the end
    expected, errors = load(path), 0
    for i in sorted(set(range(0, directory, 16)) | set(range(directory, len(good)))):
        path.write_bytes(good[:i] + bytes([good[i] ^ 0x10]) + good[i + 1:])
        try:
            got = load(path)
        except CheckpointFileError:
            errors += 1
            continue
        assert same(got, expected), f"byte {i} flipped gave a different checkpoint"
    assert errors > 0


@given(keep=st.floats(0, 1, exclude_max=True))
def test_a_truncated_file_is_checkpoint_error(tmp_path_factory, keep):
    path = tmp_path_factory.mktemp("truncated") / "ckpt.npz"
    good = small_checkpoint(path)
    for n in (int(keep * len(good)), len(good) - 1):
        path.write_bytes(good[:n])
        with pytest.raises(CheckpointFileError, match=r"ckpt\.npz"):
            load(path)


# -- files that are well-formed but not checkpoints, or whose headers lie ---------------------
def members(path):
    with zipfile.ZipFile(path) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def write_members(path, entries):
    with zipfile.ZipFile(path, "w") as archive:  # valid CRCs: only the content is wrong
        for name, data in entries.items():
            archive.writestr(name, data)


def npy(array, **kwargs):
    stream = io.BytesIO()
    numpy.save(stream, array, **kwargs)
    return stream.getvalue()


def edit_meta(path, edit):
    entries = members(path)
    meta = json.loads(str(numpy.load(io.BytesIO(entries["__meta__.npy"]))))
    edit(meta)
    entries["__meta__.npy"] = npy(numpy.array(json.dumps(meta)))
    write_members(path, entries)


def test_a_plain_npy_file_is_checkpoint_error(tmp_path):
    numpy.save(tmp_path / "weights.npy", numpy.ones(3))
    with pytest.raises(CheckpointFileError, match=r"weights\.npy' is corrupt or truncated .*BadZipFile"):
        load(tmp_path / "weights.npy")


def test_another_zip_is_checkpoint_error(tmp_path):
    write_members(tmp_path / "other.zip", {"readme.txt": b"hello"})
    with pytest.raises(CheckpointFileError, match=r"other\.zip' is corrupt or not a checkpoint: it holds 'readme\.txt'"):
        load(tmp_path / "other.zip")
    with zipfile.ZipFile(tmp_path / "deflated.npz", "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("a.npy", npy(numpy.ones(3)))
    with pytest.raises(CheckpointFileError, match="compressed"):
        load(tmp_path / "deflated.npz")


@pytest.mark.parametrize("lie", ["huge shape", "small shape", "huge header", "other dtype", "pickled objects",
                                 "not a dict", "duplicate"])
def test_lying_or_dangerous_entries_are_checkpoint_error_before_any_allocation(tmp_path, lie):
    path = tmp_path / "ckpt.npz"
    small_checkpoint(path)
    entries = members(path)
    weight = numpy.load(io.BytesIO(entries["model/weight.npy"]))
    if lie == "huge shape":  # 8 TB declared, 48 bytes held: must fail on the header, not in the allocator
        header = npy(weight).replace(b"(2, 3)", b"(1000000000000,)")
        entries["model/weight.npy"], message = header, r"declares shape \(1000000000000,\) .* but holds"
    elif lie == "small shape":
        entries["model/weight.npy"], message = npy(weight).replace(b"(2, 3)", b"(2, 2)"), "declares shape"
    elif lie == "huge header":
        data = bytearray(npy(weight))
        data[8:10] = (60000).to_bytes(2, "little")  # the header-length field of a version 1.0 .npy
        entries["model/weight.npy"], message = bytes(data), "corrupt or truncated"
    elif lie == "other dtype":  # a consistent .npy of another dtype: caught by the metadata
        entries["model/weight.npy"], message = npy(weight.astype(numpy.float64)), "is <f8 .* its metadata says <f4"
    elif lie == "pickled objects":
        entries["extra/ids.npy"], message = npy(numpy.array([{}, "x"], dtype=object), allow_pickle=True), "never unpickled"
    elif lie == "not a dict":
        entries["__meta__.npy"], message = npy(numpy.array("[1, 2]")), "__meta__ is not a JSON object"
    else:
        entries["extra/ids.npy.x"] = b""
        message = "not a .npy array"
    write_members(path, entries)
    with pytest.raises(CheckpointFileError, match=r"ckpt\.npz"):
        load(path)
    with pytest.raises(CheckpointFileError, match=message):
        load(path)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(model="weight"), "'model' is not a list of distinct names"),
    (lambda m: m.update(model=["weight", "weight"]), "'model' is not a list of distinct names"),
    (lambda m: m["optimizer"].update(steps=["1", "1"]), "'steps' is not a list of step counts"),
    (lambda m: m["optimizer"].update(steps=[-1, 1]), "'steps' is not a list of step counts"),
    (lambda m: m["optimizer"].update(hyper={"lr": "fast"}), "'hyper' is not a dict of numbers"),
    (lambda m: m["optimizer"].update(state={"exp_avg": "two"}), "'state' is not a dict of array counts"),
    (lambda m: m["optimizer"].pop("type"), "does not hold exactly"),
    (lambda m: m.update(extra=[1, 2]), "'extra' is not a dict"),
    (lambda m: m.update(extra_arrays="ids"), "'extra_arrays' is not a list"),
    (lambda m: m.update(version="2"), "format version '2'"),
    (lambda m: m.update(version=99), "format version 99"),
    (lambda m: m.update(format="something else"), "not a tinygrad_ckpt checkpoint"),
    (lambda m: m["model"].append("extra_weight"), r"entries \['model/extra_weight'\] are listed .* missing"),
    (lambda m: m["model"].remove("bias"), r"holds entries \['model/bias'\] that its metadata does not list"),
    (lambda m: m["arrays"]["model/bias"].__setitem__(1, [3]), r"'model/bias' is <f4 \[2\], its metadata says <f4 \[3\]"),
    (lambda m: m["arrays"].update({"model/bias": "f8"}), "is not \\[dtype, shape\\]"),
])
def test_metadata_of_the_wrong_type_is_checkpoint_error(tmp_path, edit, message):
    path = tmp_path / "ckpt.npz"
    small_checkpoint(path)
    edit_meta(path, edit)
    with pytest.raises(CheckpointFileError, match=message) as info:
        load(path)
    assert "ckpt.npz" in str(info.value)


def test_meta_that_is_not_json(tmp_path):
    path = tmp_path / "ckpt.npz"
    small_checkpoint(path)
    entries = members(path)
    entries["__meta__.npy"] = npy(numpy.array("{not json"))
    write_members(path, entries)
    with pytest.raises(CheckpointFileError, match="__meta__ entry is not valid JSON"):
        load(path)
    entries["__meta__.npy"] = npy(numpy.array("[" * 100_000 + "]" * 100_000))  # deeper than Python recurses
    write_members(path, entries)
    with pytest.raises(CheckpointFileError, match="__meta__"):
        load(path)


def test_a_version_1_file_without_the_array_list_is_still_read(tmp_path):
    path = tmp_path / "ckpt.npz"
    small_checkpoint(path)
    expected = load(path)

    def version_1(meta):
        meta["version"] = 1
        del meta["arrays"]

    edit_meta(path, version_1)
    assert same(load(path), expected)


def test_loading_never_unpickles(tmp_path, monkeypatch):
    import pickle

    def refuse(*args, **kwargs):
        raise AssertionError("pickle was called")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    path = tmp_path / "ckpt.npz"
    small_checkpoint(path)
    assert load(path)["extra"]["step"] == 3


# -- a restore that cannot complete changes nothing --------------------------------------------
def test_an_optimizer_that_does_not_fit_leaves_the_model_untouched(tmp_path):
    from tinygrad_ckpt.optim import SGD

    model, opt = model_and_optimizer(0)
    save(tmp_path / "ckpt.npz", model, opt)
    other = nn.GPT(CONFIG, rng=numpy.random.default_rng(1))
    before = other.state_dict()
    with pytest.raises(CheckpointFileError, match="holds a AdamW state, not a SGD state"):
        restore(tmp_path / "ckpt.npz", other, SGD(other.parameters(), lr=0.1, momentum=0.9))
    for name, value in other.state_dict().items():
        assert numpy.array_equal(value, before[name]), name


def test_arrays_of_another_dtype_are_refused_not_cast(tmp_path):
    model, opt = model_and_optimizer(0)
    save(tmp_path / "ckpt.npz", model, opt)
    double = nn.GPT(CONFIG, rng=numpy.random.default_rng(1), dtype=numpy.float64)
    with pytest.raises(CheckpointFileError, match=r"model entry 'wte.weight' is float32, the model's is float64"):
        restore(tmp_path / "ckpt.npz", double)
    opt_state = opt.state_dict()
    opt_state["state"]["exp_avg"][0] = opt_state["state"]["exp_avg"][0].astype(numpy.float64)
    save(tmp_path / "mixed.npz", model, opt_state)
    fresh, fresh_opt = model_and_optimizer(1)
    with pytest.raises(CheckpointFileError, match=r"AdamW state exp_avg\[0\] is float64 .* this optimizer's is float32"):
        restore(tmp_path / "mixed.npz", fresh, fresh_opt)


def test_remove_stale_temporary_files(tmp_path):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # a process that has exited
    stale = tmp_path / f".checkpoint-3.npz.{dead_pid}.0badcafe.tmp"
    live = tmp_path / f".checkpoint-4.npz.{os.getpid()}.0badcafe.tmp"  # a save in progress in a running process
    mine = tmp_path / ".notes.txt.tmp"  # not atomic_write's name
    for p in (stale, live, mine):
        p.write_bytes(b"PK half")
    assert serialization.remove_stale_temporary_files(tmp_path) == [str(stale)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, mine.name])


def test_check_writable(tmp_path):
    serialization.check_writable(tmp_path / "new" / "dir")
    assert (tmp_path / "new" / "dir").is_dir() and not os.listdir(tmp_path / "new" / "dir")
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError, match="output directory .*file' is not writable"):
        serialization.check_writable(tmp_path / "file")


def test_an_npz_that_is_not_a_checkpoint(tmp_path):
    numpy.savez(tmp_path / "other.npz", a=numpy.ones(2))
    with pytest.raises(CheckpointFileError, match="not a tinygrad_ckpt checkpoint"):
        load(tmp_path / "other.npz")


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "nope.npz")


def test_loading_into_a_different_model_lists_the_differences(tmp_path):
    model, _ = model_and_optimizer(0)
    save(tmp_path / "ckpt.npz", model)
    wider = nn.GPT(nn.GPTConfig(block_size=6, vocab_size=9, n_layer=2, n_head=2, n_embd=8, dropout=0.0))
    before = wider.state_dict()
    with pytest.raises(nn.LoadStateDictError) as info:
        restore(tmp_path / "ckpt.npz", wider)
    message = str(info.value)
    assert "ckpt.npz" in message
    assert "missing keys" in message and "blocks.1.attn.c_attn.weight" in message
    assert "wrong shape for wte.weight: state_dict has (7, 8), the model has (9, 8)" in message
    for name, value in wider.state_dict().items():  # nothing copied
        assert numpy.array_equal(value, before[name])


def test_restore_asks_for_what_the_file_lacks(tmp_path):
    model, opt = model_and_optimizer(0)
    save(tmp_path / "weights.npz", model)
    with pytest.raises(CheckpointFileError, match="holds no optimizer state"):
        restore(tmp_path / "weights.npz", model, opt)


def test_extra_must_be_json_or_arrays(tmp_path):
    with pytest.raises(TypeError, match=r"extra\['when'\] cannot be stored"):
        save(tmp_path / "ckpt.npz", extra={"when": object()})
    assert not os.listdir(tmp_path)
