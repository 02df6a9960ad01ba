"""The embedded text, the character tokenizer, splitting, examples, order and batching."""

import re

import numpy
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinygrad_ckpt import data

from .helpers import time_limit


def test_embedded_text_is_shipped_and_is_english():
    text = data.load_text()
    assert len(text) > 300_000  # "a few hundred KB"
    assert "Macbeth" in text and "Prospero" in text.title()
    assert data.DEFAULT_TEXT.with_name("README.md").exists()  # its source and licence


@given(st.text(min_size=1, max_size=50))
def test_tokenizer_round_trip(text):
    tok = data.CharTokenizer.from_text(text)
    ids = tok.encode(text)
    assert ids.dtype == numpy.int64 and ids.min() >= 0 and ids.max() < tok.vocab_size
    assert tok.decode(ids) == text
    again = data.CharTokenizer.from_state_dict(tok.state_dict())
    assert again.chars == tok.chars and again.decode(ids) == text


def test_tokenizer_names_unknown_characters():
    tok = data.CharTokenizer.from_text("abc")
    with pytest.raises(ValueError, match="'z'"):
        tok.encode("abz")


def test_split_is_contiguous_and_complete():
    ids = numpy.arange(100)
    train, val = data.train_val_split(ids, 0.1)
    assert len(train) == 90 and len(val) == 10
    assert numpy.array_equal(numpy.concatenate([train, val]), ids)


@given(n=st.integers(5, 200), T=st.integers(1, 8), stride=st.integers(1, 9))
def test_examples_are_windows_with_next_token_labels(n, T, stride):
    ids = numpy.arange(n) * 3  # distinct values, so a wrong offset shows
    if n < T + 1:
        with pytest.raises(ValueError, match="block"):
            data.CharDataset(ids, T, stride)
        return
    ds = data.CharDataset(ids, T, stride)
    for i in range(len(ds)):
        ex = ds[i]
        s = i * stride
        assert numpy.array_equal(ex["input_ids"], ids[s : s + T])
        assert numpy.array_equal(ex["labels"], ids[s + 1 : s + T + 1])
    # len() is the number of windows that fit, and no more
    last = (len(ds) - 1) * stride
    assert last + T + 1 <= n < last + stride + T + 1
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_epoch_order_depends_on_seed_and_epoch_only():
    a = data.epoch_order(50, seed=3, epoch=0)
    assert sorted(a) == list(range(50))
    assert numpy.array_equal(a, data.epoch_order(50, seed=3, epoch=0))
    assert not numpy.array_equal(a, data.epoch_order(50, seed=4, epoch=0))
    assert not numpy.array_equal(a, data.epoch_order(50, seed=3, epoch=1))


def test_collate_pads_inputs_and_ignores_padded_labels():
    batch = data.collate([
        {"input_ids": numpy.array([1, 2, 3]), "labels": numpy.array([2, 3, 4])},
        {"input_ids": numpy.array([5]), "labels": numpy.array([6])},
    ])
    assert batch["input_ids"].tolist() == [[1, 2, 3], [5, 0, 0]]
    assert batch["labels"].tolist() == [[2, 3, 4], [6, -100, -100]]


def test_collate_errors():
    with pytest.raises(ValueError, match="no examples"):
        data.collate([])
    with pytest.raises(KeyError, match="labels"):
        data.collate([{"input_ids": numpy.array([1])}])
    with pytest.raises(ValueError, match="labels has 1"):
        data.collate([{"input_ids": numpy.array([1, 2]), "labels": numpy.array([1])}])


def test_load_char_datasets_on_a_user_file(tmp_path):
    path = tmp_path / "my.txt"
    path.write_text("hello world, " * 40)
    tok, train, val = data.load_char_datasets(path, block_size=8, val_fraction=0.25)
    assert tok.decode(tok.encode("hello")) == "hello"
    assert tok.vocab_size == len(set("hello world, "))
    assert len(train) > 0 and len(val) > 0
    ex = train[0]
    assert tok.decode(ex["input_ids"]) == "hello wo" and tok.decode(ex["labels"]) == "ello wor"


def test_user_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data.load_char_datasets(tmp_path / "nope.txt")
    with pytest.raises(IsADirectoryError, match="directory"):
        data.load_char_datasets(tmp_path)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty"):
        data.load_char_datasets(empty)
    short = tmp_path / "short.txt"
    short.write_text("just a few words")
    with pytest.raises(ValueError, match="fewer than one block of 64"):
        data.load_char_datasets(short, block_size=64)
    with pytest.raises(ValueError, match="validation part"):
        data.load_char_datasets(short, block_size=8, val_fraction=0.1)
    _, train, val = data.load_char_datasets(short, block_size=8, val_fraction=0)
    assert val is None and len(train) == 1
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00abc")
    with pytest.raises(ValueError, match="UTF-8"):
        data.load_char_datasets(binary)


# -- a data file that cannot be read is named as such, before it is read ---------------------------
@pytest.fixture
def within_10_seconds():
    """A read that would block or never end fails the test instead."""
    with time_limit(10, "still reading"):
        yield


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_path_that_is_not_a_regular_file_is_refused_before_it_is_read(tmp_path, kind, within_10_seconds):
    import os

    if kind == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("named pipes are POSIX")
        path, says = tmp_path / "pipe", "is a named pipe (FIFO)"
        os.mkfifo(path)  # opening it for reading would wait for a writer forever
    else:
        if not os.path.exists(kind):
            pytest.skip("no /dev/zero here")
        path, says = kind, "is a character device, which may never end"
    with pytest.raises(ValueError, match=rf"data path '{path}' {re.escape(says)}.*give --data a regular file"):
        data.load_char_datasets(path, block_size=8)


def test_a_file_larger_than_the_memory_available_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "huge.txt"
    with open(path, "wb") as f:
        f.truncate(2**20)  # a sparse MiB: instant to make, and only NUL bytes if it were read
    monkeypatch.setattr(data, "_available_memory", lambda: 2**20)
    with pytest.raises(ValueError, match=r"data file '.*huge.txt' is 1.00 MiB: reading and tokenising it takes "
                                         r"about 20.00 MiB, more than the 1.00 MiB of memory available"):
        data.load_text(path)


def test_a_binary_file_is_named_binary(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"text at first" + bytes(range(256)) * 4)  # NUL is valid UTF-8, so it would decode
    with pytest.raises(ValueError, match=r"'.*weights.bin' is binary, not text \(it holds a NUL byte at byte 13\)"):
        data.load_text(path)


def test_running_out_of_memory_while_tokenising_names_the_data(tmp_path, monkeypatch):
    path = tmp_path / "text.txt"
    path.write_text("the cat sat on the mat. " * 20)

    def out_of_memory(self, text):
        raise MemoryError

    monkeypatch.setattr(data.CharTokenizer, "encode", out_of_memory)
    with pytest.raises(ValueError, match=r"'.*text.txt' does not fit in memory once tokenised; give --data a smaller"):
        data.load_char_datasets(path, block_size=8)


def test_a_file_that_cannot_be_read_is_named(tmp_path, monkeypatch):
    import errno
    from pathlib import Path

    path = tmp_path / "locked.txt"
    path.write_text("some text")

    def denied(self):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(PermissionError, match=r"data file '.*locked.txt' cannot be read \(Permission denied\); give "
                                              r"--data a file you can read"):
        data.load_text(path)


# -- the generated tasks of the models that do not read text ------------------------------------
@given(n=st.integers(1, 20), size=st.sampled_from([4, 8, 12]), classes=st.integers(2, 12), seed=st.integers(0, 2**32 - 1))
def test_stripes_task_is_images_and_labels_decided_by_the_seed(n, size, classes, seed):
    images, labels = data.stripes_task(n, size, classes, seed)
    assert images.shape == (n, 3, size, size) and images.dtype == numpy.float32
    assert labels.shape == (n,) and labels.dtype == numpy.int64 and ((0 <= labels) & (labels < classes)).all()
    again, again_labels = data.stripes_task(n, size, classes, seed)
    assert numpy.array_equal(images, again) and numpy.array_equal(labels, again_labels)
    assert not numpy.array_equal(images, data.stripes_task(n, size, classes, seed + 1)[0])


def test_curve_task_is_the_curve_with_noise_of_a_tenth():
    x, y = data.curve_task(4000)
    assert x.shape == y.shape == (4000, 1) and x.dtype == y.dtype == numpy.float32
    assert -3 <= x.min() and x.max() <= 3
    noise = y - numpy.sin(2 * x)
    assert abs(noise.mean()) < 0.01 and 0.095 < noise.std() < 0.105
    assert numpy.array_equal(x, data.curve_task(4000)[0])


@given(n=st.integers(1, 10))
def test_array_examples_are_the_arrays_rows_and_stack_back(n):
    x, y = numpy.arange(2 * n).reshape(n, 2), numpy.arange(n)
    examples = data.array_examples(x=x, y=y)
    assert len(examples) == n and all(numpy.array_equal(e["x"], x[i]) and e["y"] == y[i] for i, e in enumerate(examples))
    batch = data.stack_collate(examples)
    assert numpy.array_equal(batch["x"], x) and numpy.array_equal(batch["y"], y)


def test_generated_task_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="array_examples: the arrays must have one length"):
        data.array_examples(x=numpy.zeros(3), y=numpy.zeros(4))
    with pytest.raises(ValueError, match="stripes_task needs n_examples >= 1"):
        data.stripes_task(0)
    with pytest.raises(ValueError, match="curve_task needs n_examples >= 1"):
        data.curve_task(0)
