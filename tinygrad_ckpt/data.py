"""The embedded data set, a character tokenizer, batching, and the generated tasks of the other models.

What lives here, in the order a training run uses it:

    >>> text = load_text()                  # the embedded plays, or load_text(path) for your own file
    >>> tokenizer = CharTokenizer.from_text(text)
    >>> train_ids, val_ids = train_val_split(tokenizer.encode(text), 0.1)
    >>> train = CharDataset(train_ids, block_size=64)
    >>> example = train[0]                  # labels: input_ids shifted by one token
    >>> bool((example["labels"][:-1] == example["input_ids"][1:]).all())
    True
    >>> order = epoch_order(len(train), seed=0, epoch=0)   # a permutation: the seed alone decides it
    >>> batch = collate([train[i] for i in order[:16]])
    >>> {name: array.shape for name, array in batch.items()}
    {'input_ids': (16, 64), 'labels': (16, 64)}

`load_char_datasets(...)` does the first four lines at once, with clear
errors for a missing, empty or too-short file. The language models (the
GPT, the LSTM) learn from it.

The models that do not read text have small tasks of their own, generated
from a seed (nothing downloaded, the same arrays on every machine): the MLP's
`curve_task(n)` (tutorial 2's curve, y = sin(2x) + noise), the CNN's
`stripes_task(n)` (which way an image's stripes run) and the encoder's
`majority_token_task(n)` (which token a sequence holds most often);
`array_examples(...)` makes examples of their arrays, for `stack_collate`.

The default text (`assets/shakespeare.txt`, 390 KB, four plays; see
`assets/README.md` for its source and licence) ships inside the package, so
training needs no network.

A data set here is any sequence of examples, each a dict of integer arrays
`input_ids` (T,) and `labels` (T,), as in Hugging Face. `labels[t]` is the
token that should follow `input_ids[:t+1]`; a label of -100 (`IGNORE_INDEX`)
marks a position that does not count (padding), as `cross_entropy` expects.
`collate` pads such examples into a batch; `stack_collate` stacks examples
of equal shapes (images, features) for other models.

What does not live here: the training loop and the grouping of micro-batches
into optimizer steps (train.py), the gradient accumulation (accumulate.py).
"""

import os
import stat
import zlib
from pathlib import Path

import numpy

from .memory import format_bytes

DEFAULT_TEXT = Path(__file__).with_name("assets") / "shakespeare.txt"
IGNORE_INDEX = -100  # the label that cross_entropy skips


# Bytes of memory that reading and tokenising one byte of text takes at its peak (the str, the
# list of ids, the int64 array): 17.4 measured on the embedded text (tracemalloc), rounded up.
BYTES_PER_CHARACTER = 20
_NOT_A_FILE = ((stat.S_ISFIFO, "a named pipe (FIFO), which may never end or never start"),
               (stat.S_ISCHR, "a character device, which may never end (as /dev/zero)"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def load_text(path=None):
    """The training text: the embedded plays when `path` is None, else the file at `path`.

    Checked before it is read, so that no data file can hang the run or be
    taken for a batch too large: a path that is not a regular file (a pipe,
    a device such as /dev/zero) and a file larger than the memory available
    to read it are refused; then a binary file (it holds NUL bytes) or one
    that is not UTF-8. Each is a ValueError (or OSError) naming the file.
    """
    path = DEFAULT_TEXT if path is None else Path(path)
    where = repr(str(path))
    if not path.exists():
        raise FileNotFoundError(f"data file {where} does not exist; give --data the path of a text file")
    if path.is_dir():
        raise IsADirectoryError(f"data path {where} is a directory; give --data the path of a text file")
    mode, size = path.stat().st_mode, path.stat().st_size
    for test, kind in _NOT_A_FILE:
        if test(mode):
            raise ValueError(f"data path {where} is {kind}, not a text file; give --data a regular file "
                             "(save a stream to a file first)")
    available = _available_memory()
    if available is not None and size * BYTES_PER_CHARACTER > available:
        raise ValueError(
            f"data file {where} is {format_bytes(size)}: reading and tokenising it takes about "
            f"{format_bytes(size * BYTES_PER_CHARACTER)}, more than the {format_bytes(available)} of memory "
            "available; give --data a smaller file (a part of it)"
        )
    try:
        raw = path.read_bytes()
    except MemoryError:
        raise ValueError(f"data file {where} ({format_bytes(size)}) does not fit in memory; give --data a smaller "
                         "file") from None
    except OSError as e:  # no permission, a disk error
        raise type(e)(e.errno, f"data file {where} cannot be read ({e.strerror}); give --data a file you can "
                               "read") from None
    if b"\0" in raw:
        raise ValueError(f"data file {where} is binary, not text (it holds a NUL byte at byte {raw.index(0)}); "
                         "give --data a UTF-8 text file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"data file {where} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not text:
        raise ValueError(f"data file {where} is empty; a character model needs some text to learn from")
    return text


def _available_memory():
    """Bytes of memory this process can still get, or None if unknown.

    The system's (Linux's MemAvailable, else free pages), or less where a
    container's memory limit (cgroup v2's memory.max, or v1's) leaves less.
    """
    found = []
    try:
        with open("/proc/meminfo") as f:
            found += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    if not found:
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (AttributeError, ValueError, OSError):
            pass
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit) as f, open(usage) as g:
                found.append(int(f.read()) - int(g.read()))  # "max" (no limit) is not a number: skipped
        except (OSError, ValueError):
            pass
    return min(found) if found else None


class CharTokenizer:
    """One token per character; the vocabulary is the sorted set of characters in the text.

    It must be saved with a checkpoint (`state_dict()`): token ids mean
    nothing without it, and sampling needs it to turn ids back into text.
    """

    def __init__(self, chars):
        self.chars = list(chars)  # id -> character
        self.stoi = {c: i for i, c in enumerate(self.chars)}  # character -> id
        if len(self.stoi) != len(self.chars):
            raise ValueError("CharTokenizer: the vocabulary holds a character twice")

    @classmethod
    def from_text(cls, text):
        return cls(sorted(set(text)))

    @property
    def vocab_size(self):
        return len(self.chars)

    def encode(self, text):
        """str -> int64 array of ids."""
        unknown = set(text) - self.stoi.keys()
        if unknown:
            shown = ", ".join(repr(c) for c in sorted(unknown)[:10])
            raise ValueError(
                f"CharTokenizer.encode: {len(unknown)} character(s) not in the vocabulary: {shown}; "
                "build the tokenizer from a text that contains them"
            )
        return numpy.array([self.stoi[c] for c in text], dtype=numpy.int64)

    def decode(self, ids):
        """ids (any integer sequence or array) -> str."""
        return "".join(self.chars[int(i)] for i in ids)

    def state_dict(self):
        """The vocabulary as one string, character i at position i (a JSON value, for checkpoints)."""
        return {"chars": "".join(self.chars)}

    @classmethod
    def from_state_dict(cls, state):
        return cls(state["chars"])


def train_val_split(ids, val_fraction=0.1):
    """The first (1 - val_fraction) of the ids for training, the rest for validation.

    A contiguous split (as nanoGPT's shakespeare_char does), not a random one:
    overlapping windows on both sides of a random split would leak the
    validation text into training.
    """
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    n_train = len(ids) - int(round(len(ids) * val_fraction))
    return ids[:n_train], ids[n_train:]


class CharDataset:
    """Windows of `block_size` tokens from one long id array, as examples.

    Example i starts at i * stride: input_ids = ids[s : s+T], labels =
    ids[s+1 : s+T+1] (each position's label is the next character). With the
    default stride = block_size the windows do not overlap, so one epoch
    reads each character once.
    """

    def __init__(self, ids, block_size, stride=None):
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        stride = block_size if stride is None else stride
        if stride < 1:
            raise ValueError(f"stride must be at least 1, got {stride}")
        if len(ids) < block_size + 1:
            raise ValueError(
                f"the text has {len(ids)} tokens, but one example of block_size {block_size} needs "
                f"{block_size + 1} (its inputs plus the next token); use a longer text or a smaller --block-size"
            )
        self.ids = numpy.asarray(ids, dtype=numpy.int64)
        self.block_size = block_size
        self.stride = stride

    def __len__(self):
        return (len(self.ids) - self.block_size - 1) // self.stride + 1

    def fingerprint(self):
        """A short value that differs when the examples differ: a CRC-32 of the tokens, with the window.

        Data-parallel processes compare it before training (distributed.py),
        so that no two of them train on different text.
        """
        return [zlib.crc32(numpy.ascontiguousarray(self.ids).view(numpy.uint8)), len(self.ids), self.block_size, self.stride]

    def __getitem__(self, i):
        if not -len(self) <= i < len(self):
            raise IndexError(f"example {i} out of range for a data set of {len(self)} examples")
        s = (i % len(self)) * self.stride
        T = self.block_size
        return {"input_ids": self.ids[s : s + T], "labels": self.ids[s + 1 : s + T + 1]}


def load_char_datasets(path=None, block_size=64, val_fraction=0.1, stride=None):
    """Read, tokenise and split a text: (tokenizer, train_dataset, val_dataset or None).

    The vocabulary comes from the whole text, so the validation part never
    holds a character the model cannot name. val_fraction=0 gives no
    validation set.
    """
    where = "the embedded text" if path is None else f"{str(path)!r}"
    try:
        return _load_char_datasets(load_text(path), where, block_size, val_fraction, stride)
    except MemoryError:  # the data, not the batch: say so (the command line's advice is about batches)
        raise ValueError(f"{where} does not fit in memory once tokenised; give --data a smaller file") from None


def _load_char_datasets(text, where, block_size, val_fraction, stride):
    if len(text) < block_size + 1:
        raise ValueError(
            f"{where} has {len(text)} characters, fewer than one block of {block_size} plus the "
            f"next character; use a longer text or --block-size {max(1, len(text) - 1)} or less"
        )
    tokenizer = CharTokenizer.from_text(text)
    train_ids, val_ids = train_val_split(tokenizer.encode(text), val_fraction)
    if len(train_ids) < block_size + 1:
        raise ValueError(
            f"the training part of {where} ({len(train_ids)} characters) is shorter than one block "
            f"of {block_size} plus one; use a smaller --block-size or --val-fraction"
        )
    val = None
    if val_fraction > 0:
        if len(val_ids) < block_size + 1:
            raise ValueError(
                f"the validation part of {where} ({len(val_ids)} characters, {val_fraction:.0%} of it) "
                f"is shorter than one block of {block_size} plus one; use a smaller --block-size, "
                "a larger --val-fraction, or --val-fraction 0 for no validation"
            )
        val = CharDataset(val_ids, block_size, stride)
    return tokenizer, CharDataset(train_ids, block_size, stride), val


def epoch_order(n, seed, epoch):
    """The order in which epoch `epoch` visits examples 0..n-1: a permutation.

    It depends on (seed, epoch) and n only, never on the batch size or the
    number of accumulation steps: two runs that split the same effective
    batch differently see the same examples in each optimizer step. It is
    recomputed from the seed, not drawn from a shared generator, so a resumed
    run finds the same order without saving it.
    """
    return numpy.random.default_rng([seed, epoch]).permutation(n)


def stack_collate(examples):
    """A list of examples -> one batch: each field of the examples stacked along a new first axis.

    For examples of equal shapes that need no padding (images and their
    labels, fixed-length features): the Trainer's data_collator for them.
    """
    if not examples:
        raise ValueError("stack_collate: no examples to put in a batch")
    return {name: numpy.stack([e[name] for e in examples]) for name in examples[0]}


def collate(examples, pad_id=0):
    """A list of examples -> one batch: {"input_ids": (B, T), "labels": (B, T)}.

    Examples of different lengths are padded on the right to the longest:
    input_ids with `pad_id`, labels with IGNORE_INDEX, so padding never
    counts in the loss or in the number of items.
    """
    if not examples:
        raise ValueError("collate: no examples to put in a batch")
    for i, ex in enumerate(examples):
        if "input_ids" not in ex or "labels" not in ex:
            raise KeyError(f"example {i} has keys {sorted(ex)}; each example needs 'input_ids' and 'labels'")
        if len(ex["input_ids"]) != len(ex["labels"]):
            raise ValueError(
                f"example {i}: input_ids has {len(ex['input_ids'])} tokens but labels has {len(ex['labels'])}"
            )
    T = max(len(ex["input_ids"]) for ex in examples)
    input_ids = numpy.full((len(examples), T), pad_id, dtype=numpy.int64)
    labels = numpy.full((len(examples), T), IGNORE_INDEX, dtype=numpy.int64)
    for b, ex in enumerate(examples):
        n = len(ex["input_ids"])
        input_ids[b, :n] = ex["input_ids"]
        labels[b, :n] = ex["labels"]
    return {"input_ids": input_ids, "labels": labels}


# -- generated tasks for the models that do not read text -----------------------------
def majority_token_task(n_examples, seq_len=16, vocab_size=8, seed=0):
    """The encoder's small task (nn.Encoder), generated: which token appears most often in a sequence?

    Returns (input_ids (n_examples, seq_len), labels (n_examples,)), int64:
    label b is the token most frequent in row b (the smallest id on a tie),
    so there are vocab_size classes. Each row favours a token drawn at random
    (about a third of its positions), so most rows have a clear majority. The
    seed alone decides the arrays; nothing is downloaded. A sequence task: no
    single position tells the answer, every position counts.
    """
    if n_examples < 1 or seq_len < 1 or vocab_size < 2:
        raise ValueError(f"majority_token_task needs n_examples >= 1, seq_len >= 1 and vocab_size >= 2, got "
                         f"{n_examples}, {seq_len}, {vocab_size}")
    rng = numpy.random.default_rng(seed)
    ids = rng.integers(0, vocab_size, size=(n_examples, seq_len))
    favourite = rng.integers(0, vocab_size, size=(n_examples, 1))
    ids = numpy.where(rng.random((n_examples, seq_len)) < 0.3, favourite, ids)  # (n, T)
    counts = (ids[:, :, None] == numpy.arange(vocab_size)).sum(axis=1)  # (n, vocab_size): each token's count
    return ids.astype(numpy.int64), counts.argmax(axis=1).astype(numpy.int64)  # argmax: the first on a tie


def curve_task(n_examples, seed=0):
    """The MLP's small task (tutorial 2's curve), generated: y = sin(2x) + noise, for x drawn from [-3, 3].

    Returns (x (n_examples, 1), y (n_examples, 1)), float32; the noise has
    standard deviation 0.1, so a model that has learned the curve has a mean
    squared error near 0.01. The seed alone decides the arrays.
    """
    if n_examples < 1:
        raise ValueError(f"curve_task needs n_examples >= 1, got {n_examples}")
    rng = numpy.random.default_rng(seed)
    x = rng.uniform(-3, 3, (n_examples, 1))
    y = numpy.sin(2 * x) + 0.1 * rng.standard_normal(x.shape)
    return x.astype(numpy.float32), y.astype(numpy.float32)


def stripes_task(n_examples, image_size=32, n_classes=10, seed=0):
    """The CNN's small task, generated: which way do an image's stripes run?

    Returns (images (n_examples, 3, S, S) float32, labels (n_examples,) int64).
    Image b is a colour grating, cos(2 pi f (u cos a + v sin a) + phase) over
    the image's coordinates u, v in [0, 1), at the angle a = label pi /
    n_classes (so the classes are n_classes directions, 180 degrees apart
    at most), with a frequency f of 2 to 5 stripes across the image, a phase
    and a colour drawn at random, plus noise of standard deviation 0.5. No
    single pixel tells the answer: a convolution's neighbourhoods do. The
    seed alone decides the arrays.
    """
    if n_examples < 1 or image_size < 1 or n_classes < 2:
        raise ValueError(f"stripes_task needs n_examples >= 1, image_size >= 1 and n_classes >= 2, got "
                         f"{n_examples}, {image_size}, {n_classes}")
    rng = numpy.random.default_rng(seed)
    labels = rng.integers(0, n_classes, n_examples)
    angle = (labels * numpy.pi / n_classes)[:, None, None]  # (n, 1, 1)
    u = numpy.arange(image_size) / image_size  # (S,): the coordinates
    along = numpy.cos(angle) * u[None, None, :] + numpy.sin(angle) * u[None, :, None]  # (n, S, S): across the stripes
    frequency, phase = rng.uniform(2, 5, (n_examples, 1, 1)), rng.uniform(0, 2 * numpy.pi, (n_examples, 1, 1))
    wave = numpy.cos(2 * numpy.pi * frequency * along + phase)  # (n, S, S)
    colour = rng.uniform(-1, 1, (n_examples, 3, 1, 1))  # each channel's share of the grating
    images = colour * wave[:, None] + 0.5 * rng.standard_normal((n_examples, 3, image_size, image_size))
    return images.astype(numpy.float32), labels.astype(numpy.int64)


def array_examples(**arrays):
    """Examples from arrays of equal length along their first axis: example i is {name: array[i]}.

    For the generated tasks above and any arrays of features: a list, so
    `train_val_split` splits it and `stack_collate` batches it.
    """
    lengths = {name: len(array) for name, array in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"array_examples: the arrays must have one length, got {lengths}")
    return [{name: array[i] for name, array in arrays.items()} for i in range(len(next(iter(arrays.values()))))]
