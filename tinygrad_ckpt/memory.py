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
a training step that the benchmarks draw. It is an observer (observe.py), as
every instrument is: the tracker tells the observers in force of each buffer
it counts and frees, and (`tracker.event`) of each op that function.py and
tape.py run. `record(fn, *args)` runs one call with the timeline on and
returns it as a `Timeline`, which the lab draws (bench/plots.py, the memory
explorer page: bench/explorer.py). A timeline event is observe.py's event
(op, phase, kind, tape, record, saved, saved_parameters), and:

    parameters, ...    live bytes of each category after the event (CATEGORIES)
    allocated, freed   bytes of the buffers that became known / were freed
                       since the previous event, by category: {"other": 1024};
                       a freed buffer counts under the category it had last,
                       one made and freed in between counts in both. Their
                       difference is the change of the live total (a buffer
                       that changes category moves bytes, it is not counted)
    input_shapes, output_shapes
                       an op: its arrays' shapes (to count its FLOPs)

What does not live here: drawing (bench/plots.py) and the page
(bench/explorer.py): the lab imports the lesson, never the reverse, so
importing the engine never loads matplotlib or Plotly.
"""

import weakref
from contextlib import contextmanager

from . import backend, observe

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
    """Live bytes by category and their peak; it tells the observers in force what it counts (observe.py)."""

    def __init__(self):
        self.buffers = {}  # id(storage array) -> _Buffer
        self.current = dict.fromkeys(CATEGORIES, 0)
        self.peak_total = 0
        self.peak = dict(self.current)  # bytes by category at the moment of the peak
        self.phase = "forward"

    # -- the choke points call these --------------------------------------
    def track(self, array, category=None):
        """Make `array`'s buffer known; with a category, add one holder of it."""
        base = backend.storage(array)
        key = id(base)
        buf = self.buffers.get(key)
        new = buf is None
        if new:
            buf = _Buffer(base.nbytes)
            buf.ref = weakref.ref(base, lambda _, key=key: self._free(key))
            self.buffers[key] = buf
            self.current["other"] += buf.nbytes
        if category is not None:
            buf.holds[category] = buf.holds.get(category, 0) + 1
            self._move(buf)
        self._update_peak()
        for observer in observe.observers:
            observer.on_track(buf, category, new)

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
            for observer in observe.observers:
                observer.on_free(buf)

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
        for observer in observe.observers:
            observer.on_reset_peak()

    def event(self, op, kind, phase=None, **fields):
        """Tell the observers in force (observe.py) of an op, a record's backward or a mark: one event dict.

        fields: tape, record, saved, saved_parameters, inputs, outputs, as
        observe.py describes them; phase defaults to the one in force.
        """
        event = {"op": op, "phase": phase or self.phase, "kind": kind, **fields}
        for observer in observe.observers:
            observer.on_op(event)

    def mark(self, name, phase="update"):
        """Tell the observers of a moment that is not an op but changes memory (an optimizer step)."""
        self.event(name, "mark", phase)


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
    """Record one event per op: `with timeline() as events: step()` (the module docstring says what an event holds)."""
    with _TimelineObserver() as observer:
        yield observer.events


class _TimelineObserver(observe.Observer):
    """timeline()'s observer: each event with the live bytes by category, and the buffers made and freed since the last."""

    def __init__(self):
        self.events, self.made, self.freed = [], [], {}

    def on_track(self, buffer, category, new):
        if new:
            self.made.append(buffer)

    def on_free(self, buffer):
        self.freed[buffer.category] = self.freed.get(buffer.category, 0) + buffer.nbytes

    def on_op(self, event):
        point = {"op": event["op"], "phase": event["phase"], "kind": event["kind"], **tracker.current}
        allocated = {}
        for buf in self.made:
            allocated[buf.category] = allocated.get(buf.category, 0) + buf.nbytes
        point["allocated"], point["freed"] = allocated, self.freed
        self.made, self.freed = [], {}
        for name in ("tape", "record", "saved", "saved_parameters"):
            if name in event:
                point[name] = event[name]
        if "outputs" in event:
            point["input_shapes"] = [tuple(a.shape) for a in event["inputs"]]
            point["output_shapes"] = [tuple(o.shape) for o in event["outputs"]]
        self.events.append(point)


def record(fn, *args, name=None, **kwargs):
    """Run fn(*args, **kwargs) with the timeline on; returns its `Timeline`.

    >>> import numpy
    >>> from tinygrad_ckpt import Tensor, nn
    >>> model = nn.Linear(3, 2, rng=numpy.random.default_rng(0))
    >>> x = Tensor(numpy.ones((4, 3), dtype=numpy.float32))
    >>> timeline = record(lambda x: model(x).sum().backward(), x)
    >>> [(event["op"], event["phase"]) for event in timeline.events]
    [('Linear', 'forward'), ('Sum', 'forward'), ('Sum', 'backward'), ('Linear', 'backward')]
    >>> timeline.events[0]["saved"]     # Linear saved x for backward: 4*3 float32 = 48 bytes
    48

    Draw it with `plot_timeline` (bench/plots.py, the `plot` extra) or
    write the memory explorer page with `write_timeline` (bench/explorer.py,
    the `report` extra).

    name: what the pictures call it (default: fn's name). What fn returns
    is kept as `timeline.result`.
    """
    before = current()
    with timeline() as events:
        result = fn(*args, **kwargs)
    return Timeline(events, name=name or getattr(fn, "__name__", "step"), before=before, result=result)


class Timeline:
    """The events of one recorded call (`record`), oldest first, and what was live before them.

    events: the event dicts (see the module docstring); before: live bytes
    by category when the recording started; result: what the call returned.
    `to_dict()` / `Timeline.from_dict()` carry it through JSON.
    """

    def __init__(self, events, name="step", before=None, result=None):
        self.events = list(events)
        self.name = name
        self.before = dict.fromkeys(CATEGORIES, 0) if before is None else dict(before)
        self.result = result

    def __len__(self):
        return len(self.events)

    def __repr__(self):
        i, total = self.peak()
        where = f"; peak {format_bytes(total)} at event {i} ({self.events[i]['op']}, {self.events[i]['phase']})" if self.events else ""
        return f"Timeline({self.name!r}: {len(self.events)} events{where})"

    def totals(self):
        """Live bytes after each event, all categories together."""
        return [sum(e[c] for c in CATEGORIES) for e in self.events]

    def peak(self):
        """(index of the event with the most live bytes, those bytes); (None, 0) if empty."""
        totals = self.totals()
        if not totals:
            return None, 0
        i = max(range(len(totals)), key=totals.__getitem__)
        return i, totals[i]

    def to_dict(self):
        return {"name": self.name, "before": dict(self.before), "events": self.events}

    @classmethod
    def from_dict(cls, data):
        return cls(data["events"], name=data.get("name", "step"), before=data.get("before"))


def format_bytes(n):
    """1536 -> '1.50 KiB': exact bytes are in the numbers, this is for reading."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
