"""Memory accounting: every live array buffer, counted once, by category.

Why it exists: the two techniques this package teaches are about memory, so
memory must be measured, not guessed. Every array the engine creates passes
through one of a few choke points, and each reports here:

    Tensor(...)                 -> the buffer becomes known ("other")
    ctx.save_for_backward(...)  -> held as "activations" until backward frees it
    nn.Parameter(...)           -> "parameters"
    leaf .grad                  -> "gradients"
    GradientAccumulator buffers -> "accumulation"
    optimizer state             -> "optimizer"

A buffer is counted once however many views and holders it has (a view is
traced to the array that owns its memory), and it is counted under the most
important category that holds it, in the order of CATEGORIES. Buffers are
forgotten by a weak reference callback the moment the array is freed, so
`current()` is exact: the bytes of live arrays the engine knows about.

What it does not see: temporaries inside an op that never become a tensor
(the `tmp` in `tmp = a * b; return tmp + c`). Tests compare these figures
with tracemalloc, which sees every NumPy buffer, and state the margin.

The timeline (`timeline()`) records one event per op in forward, backward and
recompute, with the live bytes per category after it: that is the picture of
a training step that the benchmarks draw.
"""

import weakref
from contextlib import contextmanager

from . import backend

CATEGORIES = ("parameters", "gradients", "accumulation", "optimizer", "activations", "other")


class _Buffer:
    """One live memory buffer: its size and how many holders of each category it has."""

    __slots__ = ("nbytes", "holds", "category", "ref")

    def __init__(self, nbytes):
        self.nbytes = nbytes
        self.holds = {}
        self.category = "other"

    def recategorise(self):
        self.category = next((c for c in CATEGORIES if self.holds.get(c)), "other")


class MemoryTracker:
    """Live bytes by category, their peak, and an optional event timeline."""

    def __init__(self):
        self.buffers = {}  # id(storage array) -> _Buffer
        self.current = dict.fromkeys(CATEGORIES, 0)
        self.peak_total = 0
        self.peak = dict(self.current)  # bytes by category at the moment of the peak
        self.events = None  # a list while a timeline is being recorded
        self.phase = "forward"

    # -- the choke points call these --------------------------------------
    def track(self, array, category=None):
        """Make `array`'s buffer known; with a category, add one holder of it."""
        base = backend.storage(array)
        key = id(base)
        buf = self.buffers.get(key)
        if buf is None:
            buf = _Buffer(base.nbytes)
            buf.ref = weakref.ref(base, lambda _, key=key: self._free(key))
            self.buffers[key] = buf
            self.current["other"] += buf.nbytes
        if category is not None:
            buf.holds[category] = buf.holds.get(category, 0) + 1
            self._move(buf)
        self._update_peak()

    def release(self, array, category):
        """Remove one holder of `category` from `array`'s buffer."""
        buf = self.buffers.get(id(backend.storage(array)))
        if buf is not None and buf.holds.get(category):
            buf.holds[category] -= 1
            self._move(buf)

    def _move(self, buf):
        old = buf.category
        buf.recategorise()
        if buf.category != old:
            self.current[old] -= buf.nbytes
            self.current[buf.category] += buf.nbytes

    def _free(self, key):
        buf = self.buffers.pop(key, None)
        if buf is not None:
            self.current[buf.category] -= buf.nbytes

    def _update_peak(self):
        total = sum(self.current.values())
        if total > self.peak_total:
            self.peak_total = total
            self.peak = dict(self.current)

    # -- what users read ----------------------------------------------------
    def total(self):
        return sum(self.current.values())

    def reset_peak(self):
        """Start a new peak measurement from what is live now."""
        self.peak_total = self.total()
        self.peak = dict(self.current)

    def event(self, op, phase=None, inputs=None, outputs=None):
        """Append a timeline point (only while a timeline is being recorded).

        An op's forward passes its input and output arrays: their shapes ride
        along ("input_shapes", "output_shapes"), so a reader can count the op's
        FLOPs (saved.py does, to price a recompute).
        """
        if self.events is not None:
            event = {"op": op, "phase": phase or self.phase, **self.current}
            if outputs is not None:
                event["input_shapes"] = [tuple(a.shape) for a in inputs]
                event["output_shapes"] = [tuple(o.shape) for o in outputs]
            self.events.append(event)


tracker = MemoryTracker()


def track(array, category=None):
    tracker.track(array, category)


def release(array, category):
    tracker.release(array, category)


def category(array):
    """The category `array`'s buffer is counted under now (None if memory.py never saw it)."""
    buf = tracker.buffers.get(id(backend.storage(array)))
    return buf.category if buf is not None else None


def current():
    """Live bytes by category, now."""
    return dict(tracker.current)


def total():
    """All live bytes the engine knows about, now."""
    return tracker.total()


def peak():
    """(peak total bytes, bytes by category at that moment) since the last reset."""
    return tracker.peak_total, dict(tracker.peak)


def reset_peak():
    tracker.reset_peak()


@contextmanager
def phase(name):
    """Label the ops run inside as 'forward', 'backward' or 'recompute'."""
    previous, tracker.phase = tracker.phase, name
    try:
        yield
    finally:
        tracker.phase = previous


@contextmanager
def timeline():
    """Record one event per op: `with timeline() as events: step()`."""
    previous, tracker.events = tracker.events, []
    events = tracker.events
    try:
        yield events
    finally:
        tracker.events = previous


def format_bytes(n):
    """1536 -> '1.50 KiB': exact bytes are in the numbers, this is for reading."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
