"""Side by side with what a user would pick instead: PyTorch, HIPS autograd, mygrad; and the floor.

    python benchmarks/compare.py           # W1 (N=16, 32, 64), W2 (L=4, dropout 0.1 and 0), every peer installed
    tinygrad-ckpt bench --compare          # the same, from the command line
    tinygrad-ckpt bench --compare --device cuda   # this engine, PyTorch (if built with CUDA), the floor on a GPU

The reference workloads (workloads.py: W1 the deep MLP, W2 the GPT stack),
at the sizes of workloads.FULL.compare (or QUICK's, TINY's),
run in this engine and in every peer that is installed, in one process,
with the same initial weights (ours, copied), in float32, each library on
the same number of threads. Strategies: "none" (no checkpointing), "every"
(a checkpoint around every layer or block) and "sqrt" (round(sqrt(n))
segments), cut where this engine's checkpoint_sequential cuts them
(schedules.segment_bounds), in every library that has a checkpoint
wrapper. A peer that is not installed is reported as such, never an error.

First, every library's loss and gradients are checked against ours in
float64 with dropout off: each library draws its own dropout masks, so only
then is it the same computation. A row that disagrees is reported and not
timed. Then, per row, in float32 with dropout as the workload defines it:

  step ms    median of forward + backward over `repeats` steps after a warm-up;
             the libraries take turns step by step (rounds), so a busy machine
             slows them alike; the run notes the load average after every
             round and warns if other work took more than half the CPUs besides
             the run's own threads. Gradients are set
             to None before each step (PyTorch's zero_grad() default), so each
             step allocates its gradients.
  x floor    step time over the floor's in the same rounds: the floor
             (floor.py) is the step's matrix products alone, forward and
             backward, same shapes and dtype, on bare NumPy (CuPy on a GPU),
             into buffers made beforehand, a row of its own per strategy.
  GFLOP/s    the step's matrix-product FLOPs over its step time; the notes
             give the machine's GEMM throughput (one 2048 x 2048 product).
  saved MiB  what the graph holds for backward at the end of the forward, each
             buffer counted once: ours from memory.py (the "activations"
             category); PyTorch through torch.autograd.graph.saved_tensors_hooks
             (by storage, parameters excluded); HIPS autograd and mygrad, whose
             graphs keep every intermediate, as the bytes live after the forward
             less those live before it (tracemalloc).
  peak MiB   the step's peak of live memory above what was live before it,
             counted at the allocator, op temporaries included: tracemalloc for
             the NumPy libraries, the profiler's allocation timeline for
             PyTorch. Gradient buffers are left out: ours and PyTorch's
             accumulate into .grad arrays kept from the warm-up (zeroed in
             place); autograd and mygrad allocate theirs anew each step, so the
             gradients' bytes are subtracted from their peak (marked ~).
             tracemalloc also counts Python objects (our tape's records and
             tensors, a checkpoint's notes), which PyTorch's figure, its graph
             being C++, does not: so our note column also gives the peak of
             our arrays alone (array_peak.py), the figure that compares with
             PyTorch's, and the targets compare that one.

"x ours" is the peer's figure over ours: above 1, ours does better.
`targets` reads the ratios the project aims at off the rows.

What does not live here: the peers' models, W1 and W2 written in PyTorch,
HIPS autograd and mygrad (benchmarks/peers.py, in a clone: load_peers);
the engine's own strategy benchmark (strategies.py),
the floor's products (floor.py), the per-op profile (profile.py),
the workloads' definitions (workloads.py), the models (nn/), checkpointing
(checkpoint.py).
"""

import gc
import importlib
import os
import sys
import statistics
import time
import tracemalloc
from dataclasses import asdict, replace

import numpy

from .. import backend, memory
from ..schedules import segment_bounds
from ..threads import limited_threads
from .array_peak import array_peak
from .floor import Floor, gemm_throughput
from .machine import busy, describe, load_average
from .report import MIB, markdown_table
from .workloads import FULL, label
from .workloads import name as workload_name

STRATEGIES = ("none", "every", "sqrt")
LIBRARIES = ("tinygrad_ckpt", "torch", "autograd", "mygrad")
TORCH_INSTALL = "a CPU build: pip install torch --index-url https://download.pytorch.org/whl/cpu"
# The peers' models (load_peers): the clone's benchmarks/peers.py, beside this package's folder.
BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")
NO_PEERS = ("not run: its model lives in benchmarks/peers.py, in a clone of the repository, not in the installed "
            "package (git clone, then pip install -e \".[compare]\" there)")
SEED = 0

# Agreement in float64: the libraries differ only in the order of float64
# roundings (~1e-15 relative), so this is tight enough to catch any wrong op.
RTOL = 1e-7
SAMPLE = {  # the gradients compared (whole arrays), besides the loss
    "W1": ("blocks.0.0.weight", "blocks.0.0.bias", "head.weight", "head.bias"),
    "W2": ("wte.weight", "wpe.weight", "blocks.0.attn.c_attn.weight", "blocks.0.ln_1.weight", "ln_f.bias"),
}


def segments(n, strategy):
    """The segments of n layers a strategy checkpoints: None for 'none', else
    schedules.segment_bounds(n, strategy), [(start, stop, checkpointed), ...],
    the very segments checkpoint_sequential runs, so every library cuts where this engine does."""
    return None if strategy == "none" else segment_bounds(n, strategy)


def make_data(workload, size, dtype):
    """The batch, from a fixed seed: W1 (x, target), W2 (idx, next-token targets); see workloads.py."""
    rng = numpy.random.default_rng(SEED + 1)
    return size.data(rng, dtype) if workload == "W1" else size.data(rng)


def depth(workload, size):
    """The number of layers (W1) or blocks (W2) in the chain the strategies cut."""
    return size.n_layers if workload == "W1" else size.n_layer


class Library:
    """What every library's runner shares: the strategy in use, as the segments it checkpoints."""

    segments = None  # None: no checkpointing; else [(start, stop, checkpointed), ...]

    def use(self, strategy):
        self.segments = segments(self.n, strategy)

    def synchronize(self):
        """Wait for the device before a clock is read (a no-op on the CPU)."""


# -- libraries whose parameters carry their own .grad (this engine, PyTorch) -----------
class GradOnParams(Library):
    """backward, loss and gradients for a library whose tensors have .backward() and .grad."""

    def backward(self, loss):
        loss.backward()

    def loss_value(self, loss):
        return float(loss.item())

    def grads(self):
        return {name: p.grad.numpy() for name, p in self.params.items()}

    def clear_grads(self, keep=False):
        for p in self.params.values():
            if keep and p.grad is not None:
                p.grad.zero_()
            else:
                p.grad = None


# -- this engine ------------------------------------------------------------------------
class Ours(GradOnParams):
    """This engine: the models of nn/, checkpointed by their own switch, as a user would."""

    name = "tinygrad_ckpt"

    def __init__(self, workload, size, dtype, dropout, device="cpu"):
        self.workload, self.dtype, self.device = workload, numpy.dtype(dtype), device
        rng = numpy.random.default_rng(SEED)
        self.size = size if workload == "W1" else replace(size, dropout=dropout)
        self.model = self.size.model(rng, dtype=dtype, device=device)
        self.n = depth(workload, size)
        self.params = dict(self.model.named_parameters())
        self.data = make_data(workload, size, dtype)

    def use(self, strategy):
        super().use(strategy)
        if self.segments is None:
            self.model.gradient_checkpointing_disable()
        else:
            self.model.gradient_checkpointing_enable(segments=self.segments)  # checkpoint_sequential over the blocks

    def weights(self):
        """{name: NumPy array}: the initial weights every peer copies."""
        return {name: p.numpy().copy() for name, p in self.params.items()}

    def forward(self):
        return self.size.loss(self.model, self.data)  # on the model's device

    def synchronize(self):
        backend.synchronize(self.device)




def load_peers():
    """{name: runner class} of PyTorch, HIPS autograd and mygrad: benchmarks/peers.py, in a clone; {} without one.

    The peers' models are not part of the installed package (they are other
    libraries' code, and belong with the benchmarks that run them), so
    `bench --compare` finds them in the clone the package runs from
    (`pip install -e .`): benchmarks/ beside tinygrad_ckpt/, put first on
    sys.path as a script in benchmarks/ has it. Installed from a wheel, there
    is no clone: the comparison then runs this engine and the floor alone, and
    its notes say why (NO_PEERS).
    """
    if not os.path.isfile(os.path.join(BENCHMARKS, "peers.py")):
        return {}
    if BENCHMARKS not in sys.path:
        sys.path.insert(0, BENCHMARKS)
    return importlib.import_module("peers").PEERS


def peer_version(name):
    """The installed version of a peer, or None if it cannot be imported."""
    try:
        module = __import__(name)
    except ImportError:
        return None
    version = getattr(module, "__version__", None)
    if version is None:
        from importlib.metadata import version as installed

        version = installed(name)
    return str(version)


def has_checkpoint(name):
    return name != "mygrad"


# -- agreement ----------------------------------------------------------------------------
def agreement(workload, size, libraries, strategies, device="cpu", peers=None):
    """Loss and sampled gradients of every (library, strategy) against ours, float64, dropout 0.

    peers: {name: runner class}, default load_peers(). Returns {(library, strategy): (ok, worst relative error, what)}.
    """
    peers = load_peers() if peers is None else peers
    ours = Ours(workload, size, numpy.float64, dropout=0.0, device=device)
    weights = ours.weights()
    ref_loss = ours.loss_value(_step(ours))
    ref = ours.grads()
    results = {}
    for name in libraries:
        run = ours if name == Ours.name else _peer(peers, name, workload, size, weights, numpy.float64, 0.0, device)
        for strategy in strategies:
            if name != Ours.name and strategy != "none" and not has_checkpoint(name):
                continue
            run.use(strategy)
            run.clear_grads()
            loss = run.loss_value(_step(run))
            grads = run.grads()
            worst, what = abs(loss - ref_loss) / abs(ref_loss), "loss"
            for key in SAMPLE[workload]:
                g, r = numpy.asarray(grads[key], dtype=numpy.float64), ref[key]
                err = float(numpy.max(numpy.abs(g - r)) / max(numpy.max(numpy.abs(r)), 1e-300))
                if err > worst:
                    worst, what = err, key
            results[(name, strategy)] = (worst <= RTOL, worst, what)
        del run
        gc.collect()
    return results


def _step(run):
    """One forward + backward; returns what forward returned (the loss handle)."""
    loss = run.forward()
    run.backward(loss)
    return loss


def _peer(peers, name, workload, size, weights, dtype, dropout, device):
    """A peer's run; only PyTorch takes a device (HIPS autograd and mygrad run on NumPy)."""
    if name == "torch":
        return peers[name](workload, size, weights, dtype, dropout, device=device)
    return peers[name](workload, size, weights, dtype, dropout)


# -- time -----------------------------------------------------------------------------------
def time_steps(runs, repeats, loads=None):
    """Median seconds of forward + backward per run; the runs take turns, step by step (rounds).

    Each run waits for its device before and after its step (run.synchronize).
    `loads`, a list, gets the load average after each round.
    """
    for run in runs:  # warm-up, and a check that nothing was silently done in float64
        run.clear_grads()
        loss = _step(run)
        dtype = str(loss[1].dtype if isinstance(loss, tuple) else loss.dtype)
        if run.dtype.name not in dtype:
            raise RuntimeError(f"{run.name}: the loss came out as {dtype}, not {run.dtype.name}: an upcast in the model code")
    times = {run.name: [] for run in runs}
    for _ in range(repeats):
        for run in runs:
            run.clear_grads()
            gc.collect()
            run.synchronize()
            start = time.perf_counter()
            _step(run)
            run.synchronize()
            times[run.name].append(time.perf_counter() - start)
        if loads is not None:
            loads.append(load_average())
    return {name: statistics.median(ts) for name, ts in times.items()}


# -- memory ---------------------------------------------------------------------------------
def memory_ours(run):
    """(saved bytes at the end of forward, tracemalloc peak, memory.py peak, peak of arrays alone), gradients kept.

    On a GPU the peak is memory.py's (tracemalloc sees host memory only),
    and there is no peak of arrays alone (None).
    """
    _keep_grads(run)
    gc.collect()
    memory.reset_peak()
    base = memory.total()
    tracemalloc.start()
    loss = run.forward()
    saved = memory.current()["activations"]
    run.backward(loss)
    del loss
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    engine_peak = memory.peak()[0] - base
    if run.device != "cpu":
        return saved, engine_peak, engine_peak, None
    run.clear_grads(keep=True)  # the .grad arrays exist: zero them in place, as _keep_grads left them
    gc.collect()
    return saved, peak, engine_peak, array_peak(lambda: _step(run))


def memory_torch(run):
    """(saved bytes at the end of forward, allocator peak), gradients kept."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    _keep_grads(run)
    params = {p.untyped_storage().data_ptr() for p in run.params.values()}
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    gc.collect()
    if run.device != "cpu":  # on a GPU: the caching allocator's own peak counter
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = run.forward()
        saved_bytes = sum(saved.values())
        run.backward(loss)
        del loss
        torch.cuda.synchronize()
        return saved_bytes, torch.cuda.max_memory_allocated() - before
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = run.forward()
        saved_bytes = sum(saved.values())
        run.backward(loss)
        del loss
    return saved_bytes, _torch_peak(prof)


def _torch_peak(prof):
    """Peak of live CPU tensor bytes above those live before, from the profiler's allocation timeline.

    (torch.profiler._memory_profiler is not public API; None if it is not there.)
    """
    try:
        from torch.profiler._memory_profiler import Action, MemoryProfile

        timeline = MemoryProfile(prof.profiler.kineto_results).timeline
    except Exception:
        return None
    live = peak = 0
    for _, action, _, nbytes in timeline:
        if action == Action.CREATE:
            live += nbytes
        elif action == Action.DESTROY:
            live -= nbytes
        peak = max(peak, live)
    return peak


def memory_tracemalloc(run, gradient_bytes):
    """(bytes live after the forward, peak less the gradients' bytes) by tracemalloc."""
    run.clear_grads()
    gc.collect()
    tracemalloc.start()
    state = run.forward()
    saved = tracemalloc.get_traced_memory()[0]
    run.backward(state)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del state
    run.clear_grads()
    return saved, peak - gradient_bytes


def _keep_grads(run):
    """Make every .grad exist (one step) and zero it in place: the step allocates no gradients."""
    run.clear_grads()
    _step(run)
    run.clear_grads(keep=True)


# -- the comparison ---------------------------------------------------------------------------
def compare(workloads=None, libraries=LIBRARIES, strategies=STRATEGIES, repeats=5, threads=2,
            check=True, progress=print, device="cpu", peers=None):
    """Run the comparison; returns a list of row dicts (see `table`) and notes.

    workloads: the sizes to compare, in order (workloads.DeepMLP and
    workloads.GPTStack; default: workloads.FULL.compare, W1 at 16, 32 and 64
    layers, W2 with 4 blocks at dropout 0.1 and 0); a dict {"W1": size,
    "W2": size} is taken too. threads: every library's thread pools
    (threads.py's limited_threads). device: "cuda" runs this engine (CuPy),
    PyTorch (if it has CUDA) and the floor (cuBLAS) on the GPU; HIPS autograd
    and mygrad, NumPy-only, are then left out.

    Every strategy's rounds include the floor (floor.py): the step's matrix
    products alone, on bare NumPy (CuPy), so each library's "x floor" is
    measured in the same rounds as its step.

    peers: {name: runner class} of the other libraries' models, default
    load_peers() (benchmarks/peers.py, in a clone).
    """
    peers = load_peers() if peers is None else peers
    sizes = list(workloads.values()) if isinstance(workloads, dict) else list(workloads or FULL.compare)
    unknown = [n for n in libraries if n not in LIBRARIES]
    if unknown:
        raise ValueError(f"compare: unknown library {', '.join(unknown)}; choose from {', '.join(LIBRARIES)}")
    versions = {n: peer_version(n) if n in peers else None for n in libraries if n != Ours.name}  # imports them: then their threads count
    loads = [load_average()]
    with limited_threads(threads) as thread_info:
        notes = [f"machine: {describe()['description']}", f"threads: {thread_info['summary']}",
                 f"load average at the start: {_load_text(loads[0])}"]
        for n, version in versions.items():
            how = TORCH_INSTALL if n == "torch" else 'pip install -e ".[compare]" in the clone'
            notes.append(f"{n}: " + (version if version else f"not installed ({how})" if n in peers else NO_PEERS))
        installed = [Ours.name] + [n for n, v in versions.items() if v]
        if device != "cpu":
            installed = _on_device(installed, device, notes)
        throughput = gemm_throughput(device=device)
        notes.append(f"the machine's GEMM throughput: {throughput:.1f} GFLOP/s (one 2048 x 2048 float32 product, "
                     f"{'NumPy' if device == 'cpu' else 'CuPy'}, median of 3); GFLOP/s on a step: its matrix "
                     "products' FLOPs over its step time")
        rows = []
        for size in sizes:
            rows += _compare_workload(size, installed, versions, strategies, repeats, check, progress, notes,
                                      loads, device, peers)
    loads.append(load_average())
    notes.append(f"load average at the end: {_load_text(loads[-1])} ({os.cpu_count()} CPUs)")
    known = [x for x in loads if x is not None]
    if known and busy(max(known) - threads):  # the run's own threads count in the load average too
        notes.append(f"WARNING: the load average rose to {max(known):.1f} during the run: other work took more than "
                     f"half the {os.cpu_count()} CPUs besides this run's {threads} thread(s), so timings are unreliable "
                     "(waiting BLAS and OpenMP threads slow every library, unevenly); run again on a quiet machine")
    notes.append("peak MiB: tracemalloc (NumPy libraries; includes Python objects: our tape's records, a "
                 "checkpoint's notes), PyTorch's profiler allocation timeline (tensor storage only); ~ = less the "
                 "gradients' bytes; 'arrays alone': our peak of NumPy array bytes, measured op by op "
                 "(bench/array_peak.py), like for like with PyTorch's"
                 if device == "cpu" else
                 "peak MiB on the GPU: memory.py (this engine), torch.cuda.max_memory_allocated (PyTorch)")
    notes.append("floor: the step's matrix products alone (forward and backward, the same shapes and dtype, "
                 f"batched where the step batches them) on bare {'NumPy' if device == 'cpu' else 'CuPy'}, into "
                 "buffers made beforehand: the time no implementation of the step can go below without doing "
                 "less arithmetic (bench/floor.py)")
    return rows, notes


def _on_device(installed, device, notes):
    """The libraries that run on the GPU: this engine, and PyTorch if it was built with CUDA."""
    kept = [Ours.name]
    for n in installed[1:]:
        if n == "torch" and __import__("torch").cuda.is_available():
            kept.append(n)
        else:
            notes.append(f"{n}: not run on {device} ({'a build without CUDA' if n == 'torch' else 'NumPy only'})")
    return kept


def _compare_workload(size, installed, versions, strategies, repeats, check, progress, notes, loads, device, peers):
    """The rows of one size: agreement first (float64), then per strategy, time and memory (float32)."""
    workload, title = workload_name(size), label(size)
    checks = {}
    if check:
        progress(f"{title}: checking losses and gradients against ours (float64, dropout 0)")
        checks = agreement(workload, size, installed, strategies, device, peers)
        worst = {}
        for (lib, _), (_, err, _) in checks.items():
            worst[lib] = max(worst.get(lib, 0.0), err)
        notes.append(f"{title} agreement with ours (float64, dropout 0, loss and {', '.join(SAMPLE[workload])}; "
                     f"worst relative error, all strategies; limit {RTOL:.0e}): "
                     + ", ".join(f"{lib} {err:.1e}" for lib, err in worst.items() if lib != Ours.name))
    dropout = getattr(size, "dropout", 0.0)
    ours = Ours(workload, size, numpy.float32, dropout=dropout, device=device)
    weights = ours.weights()
    runs = [ours] + [_peer(peers, n, workload, size, weights, numpy.float32, dropout, device)
                     for n in installed if n != Ours.name]
    floor = Floor(size, numpy.float32, device)
    notes.append(f"{title}: {floor.flops / 1e9:.2f} GFLOP of matrix products per step ({len(floor.products)} products)")
    gradient_bytes = sum(w.nbytes for w in weights.values())
    rows = []
    for strategy in strategies:
        active = []
        for run in runs:
            row = dict(workload=workload, label=title, size=size, strategy=strategy, library=run.name,
                       version=versions.get(run.name) or "", step=None, saved=None, peak=None, note="",
                       flops=floor.flops)
            rows.append(row)
            ok = checks.get((run.name, strategy))
            if strategy != "none" and not has_checkpoint(run.name):
                row["note"] = "no checkpoint wrapper"
            elif check and ok is not None and not ok[0]:
                row["note"] = f"DISAGREES with ours: {ok[2]} off by {ok[1]:.1e}"
            else:
                if ok is not None:
                    row["agree"] = ok[1]
                run.use(strategy)
                active.append((run, row))
        floor_row = dict(workload=workload, label=title, size=size, strategy=strategy, library=Floor.name,
                         version="", step=None, saved=None, peak=None, flops=floor.flops,
                         note="matrix products only")
        rows.append(floor_row)
        progress(f"{title} {strategy}: timing {', '.join(r.name for r, _ in active)} and the floor")
        times = time_steps([r for r, _ in active] + [floor], repeats, loads)
        floor_row["step"] = times[Floor.name]
        for run, row in active:
            row["step"] = times[run.name]
            if run.name == Ours.name:
                row["saved"], row["peak"], row["engine_peak"], row["array_peak"] = memory_ours(run)
            elif run.name == "torch":
                row["saved"], row["peak"] = memory_torch(run)
            else:
                row["saved"], row["peak"] = memory_tracemalloc(run, gradient_bytes)
                row["approx_peak"] = True
            run.clear_grads()
    del runs, ours, floor
    gc.collect()
    return rows


def _load_text(load=None):
    load = load_average() if load is None else load
    return "unknown" if load is None else f"{load:.1f}"


def table(rows, notes=(), title=None):
    """The comparison as Markdown: a table per workload size, then the notes.

    x ours: the library's figure over ours (above 1, ours does better); x
    floor: its step time over the floor's in the same rounds; GFLOP/s: the
    step's matrix-product FLOPs over its step time.
    """
    out = [title, ""] if title else []
    head = ["strategy", "library", "step ms", "x ours", "x floor", "GFLOP/s", "saved MiB", "x ours", "peak MiB",
            "x ours", "note"]
    for key in dict.fromkeys(r.get("label", r["workload"]) for r in rows):
        group = [r for r in rows if r.get("label", r["workload"]) == key]
        size = group[0]["size"]
        out.append(f"### {key}: " + ", ".join(f"{k}={v}" for k, v in asdict(size).items()) + "; float32")
        out.append("")
        cells_of_rows = []
        for r in group:
            same = [b for b in group if b["strategy"] == r["strategy"]]
            base = next(b for b in same if b["library"] == Ours.name)
            floor = next((b for b in same if b["library"] == Floor.name), None)
            cells = [r["strategy"], f"{r['library']} {r['version']}".strip()]
            for k, scale in (("step", 1000), ("saved", 1 / MIB), ("peak", 1 / MIB)):
                value = r.get(k)
                if value is None:
                    cells += ["-", "-"] + (["-", "-"] if k == "step" else [])
                    continue
                mark = "~" if k == "peak" and r.get("approx_peak") else ""
                ratio = value / base[k] if base.get(k) else float("nan")
                digits = ".1f" if value * scale >= 10 else ".2f"
                cells += [mark + format(value * scale, digits), f"{ratio:.2f}"]
                if k == "step":
                    x_floor = value / floor["step"] if floor and floor.get("step") else float("nan")
                    cells += [f"{x_floor:.2f}", f"{r['flops'] / value / 1e9:.1f}" if r.get("flops") else "-"]
            note = r["note"]
            if r["library"] == Ours.name and r.get("array_peak") is not None:
                note = f"arrays alone {r['array_peak'] / MIB:.2f} MiB" + (f"; {note}" if note else "")
            if r["library"] == Ours.name and r.get("engine_peak") is not None:
                note = f"memory.py peak {r['engine_peak'] / MIB:.1f} MiB" + (f"; {note}" if note else "")
            cells_of_rows.append(cells + [note])
        out += markdown_table(head, cells_of_rows) + [""]
    out += [f"- {note}" for note in notes]
    return "\n".join(out)


def ratios(rows):
    """The ratios the targets are read from: [(label, strategy, what, value)] for each size and strategy.

    what: "ours / torch" (step time), "ours / floor", "torch / floor".
    """
    found = []
    for key in dict.fromkeys(r.get("label", r["workload"]) for r in rows):
        for strategy in dict.fromkeys(r["strategy"] for r in rows if r.get("label", r["workload"]) == key):
            get = {r["library"]: r for r in rows if r.get("label", r["workload"]) == key and r["strategy"] == strategy}
            for a, b in ((Ours.name, "torch"), (Ours.name, Floor.name), ("torch", Floor.name)):
                if get.get(a, {}).get("step") and get.get(b, {}).get("step"):
                    what = f"{'ours' if a == Ours.name else a} / {'floor' if b == Floor.name else b}"
                    found.append((key, strategy, what, get[a]["step"] / get[b]["step"]))
    return found


def targets(rows):
    """The comparison's targets, read off the rows: [(what, value, met)].

    Against PyTorch, the library a user would pick instead: step time at or
    below PyTorch's without checkpointing (W1 at every depth, W2 at dropout
    0), at most 0.95 of it with dropout (W2 at 0.1) and with checkpointing;
    within 1.15x (W1) and 1.25x (W2) of the floor without checkpointing; no
    more saved or peak memory in any row (the peak like for like: see
    _memory_targets). Against HIPS autograd and mygrad: faster.
    """
    found = []
    dropout = {r.get("label", r["workload"]): getattr(r["size"], "dropout", 0.0) for r in rows}
    for key, strategy, what, value in ratios(rows):
        w2 = key.startswith("W2")
        if what == "ours / torch":
            limit = 1.0 if strategy == "none" and not dropout[key] else 0.95
            found.append((f"{key} {strategy}: step time ours / torch <= {limit}", f"{value:.2f}", value <= limit))
        elif what == "ours / floor" and strategy == "none":
            limit = 1.25 if w2 else 1.15
            found.append((f"{key} {strategy}: step time ours / floor <= {limit}", f"{value:.2f}", value <= limit))
    for key in dict.fromkeys(r.get("label", r["workload"]) for r in rows):
        group = [r for r in rows if r.get("label", r["workload"]) == key]

        def get(strategy, library):
            return next((r for r in group if (r["strategy"], r["library"]) == (strategy, library)), None)

        for strategy in dict.fromkeys(r["strategy"] for r in group):
            ours, torch = get(strategy, Ours.name), get(strategy, "torch")
            if ours and torch:
                found += _memory_targets(f"{key} {strategy}", ours, torch)
        for peer in ("autograd", "mygrad"):
            ours, other = get("none", Ours.name), get("none", peer)
            if ours and other and ours["step"] and other["step"]:
                found.append((f"{key} faster than {peer}", f"{ours['step'] / other['step']:.2f}",
                              ours["step"] < other["step"]))
    return found


def _memory_targets(row_name, ours, torch):
    """Saved and peak bytes, ours <= PyTorch's: [(what, value, met)].

    The peak like for like: our arrays alone (array_peak.py) against
    PyTorch's tensors. tracemalloc's whole peak, which also counts our
    Python objects (PyTorch's graph is C++, outside its count), is a line of
    its own. On a GPU both peaks count device memory only (memory.py,
    torch.cuda), so there is one line.
    """
    pairs = [("saved", ours.get("saved"), torch.get("saved"))]
    if ours.get("array_peak") is None:
        pairs.append(("peak", ours.get("peak"), torch.get("peak")))
    else:
        pairs += [("peak of arrays alone (PyTorch: of tensors)", ours["array_peak"], torch.get("peak")),
                  ("peak with our Python objects", ours.get("peak"), torch.get("peak"))]
    return [(f"{row_name}: {what} ours <= torch", f"{a / MIB:.2f} vs {b / MIB:.2f} MiB", a <= b)
            for what, a, b in pairs if a and b]


def report(rows, notes):
    """The table, then the targets met or missed."""
    text = table(rows, notes)
    found = targets(rows)
    if found:
        text += "\n\nTargets:\n\n" + "\n".join(
            f"- {'met ' if met else 'MISS'}  {what}: {value}" for what, value, met in found)
    return text
