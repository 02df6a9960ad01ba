"""serialization: exact round trips, resuming training identically, atomic saves, clear errors on bad files."""

import json
import os

import numpy
import pytest

from tinygrad_ckpt import Tensor, nn, serialization
from tinygrad_ckpt.optim import AdamW
from tinygrad_ckpt.serialization import CheckpointError, atomic_write, load, restore, save

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
    with pytest.raises(CheckpointError, match=r"ckpt\.npz' is corrupt or truncated"):
        load(path)
    with pytest.raises(ValueError):  # CheckpointError is a ValueError
        restore(path, model)


def test_an_npz_that_is_not_a_checkpoint(tmp_path):
    numpy.savez(tmp_path / "other.npz", a=numpy.ones(2))
    with pytest.raises(CheckpointError, match="not a tinygrad_ckpt checkpoint"):
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
    with pytest.raises(CheckpointError, match="holds no optimizer state"):
        restore(tmp_path / "weights.npz", model, opt)


def test_extra_must_be_json_or_arrays(tmp_path):
    with pytest.raises(TypeError, match=r"extra\['when'\] cannot be stored"):
        save(tmp_path / "ckpt.npz", extra={"when": object()})
    assert not os.listdir(tmp_path)
