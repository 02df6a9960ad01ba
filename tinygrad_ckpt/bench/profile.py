"""`tinygrad-ckpt bench --profile`: where a training step's time goes, op by op, against its floor.

    tinygrad-ckpt bench --profile           # W1 and W2 at the comparison's sizes
    tinygrad-ckpt bench --profile --quick   # the smaller set

For each workload, one table: the time of each op kind per step, its
forward and its backward apart, its share of the step, and its own floor
where it has one (MatMul and Linear: their matrix products alone on bare
NumPy, floor.py). What no op accounts for is a row of its own, "between
ops": the model's Python code, Function.apply (tensors, tape records) and
the backward walk. Figures are medians over `repeats` steps, the floor's
products timed in the same rounds, after one warm-up step.

How ops are timed: `OpTimer` is an observer (observe.py) whose `run` puts a
clock around each op's forward, recompute and backward; an op's time leaves out
ops run inside it (a checkpoint's segment), so the rows add up to the step. The clock
costs well under a microsecond per op. On a GPU each clock read waits for
the device first, which serialises the step: the shares stay meaningful,
the total is slower than an unprofiled step.

What does not live here: the floor's products (floor.py), the comparison
with other libraries (compare.py), the table format (report.py).
"""

import gc
import statistics
import time

import numpy

from .. import backend
from ..observe import Observer
from ..threads import limited_threads
from .floor import Floor
from .machine import load_average
from .report import markdown_table
from .workloads import label

BETWEEN = "between ops"  # the row of what no op's clock saw


class OpTimer(Observer):
    """Seconds and calls per (op name, phase), each op's time exclusive of the ops inside it.

    `with OpTimer() as timer:` times every op run inside the block.
    """

    def __init__(self, device="cpu"):
        self.device = device
        self.seconds, self.calls = {}, {}
        self._inner = []  # per running op: seconds spent in ops nested inside it

    def run(self, name, phase, call):
        key = (name, phase)
        backend.synchronize(self.device)
        start = time.perf_counter()
        self._inner.append(0.0)
        try:
            return call()
        finally:
            backend.synchronize(self.device)
            elapsed = time.perf_counter() - start
            inner = self._inner.pop()
            self.seconds[key] = self.seconds.get(key, 0.0) + elapsed - inner
            self.calls[key] = self.calls.get(key, 0) + 1
            if self._inner:
                self._inner[-1] += elapsed


def profile_workload(size, repeats=5, device="cpu"):
    """One workload's profile: {"size", "step", "ops": {(op, phase): {"seconds", "calls", "floor"}}, "floor"}.

    Medians over `repeats` rounds; each round one step of this engine (no
    checkpointing, float32, fresh gradients) and then its floor's products,
    kind by kind.
    """
    model = size.model(numpy.random.default_rng(0), device=device)
    batch = size.data(numpy.random.default_rng(1))
    floor = Floor(size, device=device)
    params = [p for _, p in model.named_parameters()]
    kinds = sorted({(op, phase) for op, phase, _, _ in floor.products})
    steps, per_op, floors, whole_floor = [], [], {k: [] for k in kinds}, []

    faults = []

    def step():
        for p in params:
            p.grad = None
        gc.collect()
        backend.synchronize(device)
        before = _minor_faults()
        start = time.perf_counter()
        size.loss(model, batch).backward()
        backend.synchronize(device)
        seconds = time.perf_counter() - start
        if before is not None:
            faults.append(_minor_faults() - before)
        return seconds

    step()  # warm-up
    floor.run("forward"), floor.run("backward")
    for _ in range(repeats):
        with OpTimer(device) as timer:
            steps.append(step())
        per_op.append(dict(timer.seconds))
        calls = timer.calls
        for op, phase in kinds:
            floor.synchronize()
            start = time.perf_counter()
            floor.run(phase, op)
            floor.synchronize()
            floors[(op, phase)].append(time.perf_counter() - start)
        floor.synchronize()
        start = time.perf_counter()
        floor.run("forward"), floor.run("backward")
        floor.synchronize()
        whole_floor.append(time.perf_counter() - start)
    ops = {}
    for key in per_op[0]:
        seconds = statistics.median(times.get(key, 0.0) for times in per_op)
        ops[key] = {"seconds": seconds, "calls": calls[key],
                    "floor": statistics.median(floors[key]) if key in floors else None}
    between = statistics.median(s - sum(times.values()) for s, times in zip(steps, per_op))
    ops[(BETWEEN, "")] = {"seconds": between, "calls": None, "floor": None}
    return {"size": size, "step": statistics.median(steps), "ops": ops, "floor": statistics.median(whole_floor),
            "flops": floor.flops, "faults": statistics.median(faults[1:]) if len(faults) > 1 else None}


def _minor_faults():
    """The process's minor page faults so far (None where the system does not say)."""
    try:
        import resource
    except ImportError:  # not a Unix
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def profile(sizes, repeats=5, threads=2, device="cpu", progress=print):
    """Profile each workload size in turn; returns (profiles, notes)."""
    results = []
    with limited_threads(threads) as info:
        notes = [f"threads: {info['summary']}", f"load average at the start: {_load()}"]
        for size in sizes:
            progress(f"profiling {label(size)}")
            results.append(profile_workload(size, repeats, device))
    notes.append(f"load average at the end: {_load()}")
    return results, notes


def _load():
    load = load_average()
    return "unknown" if load is None else f"{load:.1f}"


def table(result):
    """One workload's profile as Markdown lines: ops by time, forward then backward, then the step."""
    step = result["step"]
    head = ["op", "phase", "calls", "ms", "share", "floor ms", "x floor"]
    order = {"forward": 0, "recompute": 1, "backward": 2, "": 3}
    keys = sorted(result["ops"], key=lambda k: (order[k[1]], -result["ops"][k]["seconds"]))
    rows = []
    for op, phase in keys:
        r = result["ops"][(op, phase)]
        floor = r["floor"]
        rows.append([op, phase, "" if r["calls"] is None else str(r["calls"]), f"{r['seconds'] * 1000:.2f}",
                     f"{r['seconds'] / step:.1%}", "" if floor is None else f"{floor * 1000:.2f}",
                     "" if floor is None else f"{r['seconds'] / floor:.2f}"])
    rows.append(["step", "", "", f"{step * 1000:.1f}", "100%", f"{result['floor'] * 1000:.1f}",
                 f"{step / result['floor']:.2f}"])
    title = (f"### {label(result['size'])}: {step * 1000:.1f} ms per step, floor {result['floor'] * 1000:.1f} ms "
             f"({result['flops'] / 1e9:.2f} GFLOP of matrix products)")
    faults = result.get("faults")
    after = [] if faults is None else [
        f"Minor page faults per step: {faults:.0f} (about {faults * 4 / 1024:.0f} MiB of pages the allocator asked "
        "the system for again; they count in the op that first wrote them)", ""]
    return [title, ""] + markdown_table(head, rows) + [""] + after


def report(results, notes):
    """Every workload's table, then the notes."""
    lines = []
    for result in results:
        lines += table(result)
    lines += [f"- {note}" for note in notes]
    lines.append(f"- {BETWEEN}: the model's Python code, Function.apply (tensors, tape records) and the "
                 "backward walk: the step's time that no op's clock saw")
    lines.append("- floor: the op kind's matrix products alone, on bare NumPy (CuPy on a GPU), same shapes and dtype, "
                 "into buffers made beforehand (bench/floor.py)")
    return "\n".join(lines)
