"""Does checkpointing meet its targets? W1 (64-layer MLP) and W2 (4-block GPT), measured.

W1  MLP, 64 x (Linear(1024, 1024) -> GELU) + Linear, batch 256, float32, MSE loss.
    Strategies: none, every layer checkpointed, sqrt(64) = 8 segments.
    Target: step time with every layer checkpointed / without <= 1.4
    (PyTorch 2.13 on CPU: 1.23 to 1.41).
    Target: the sqrt(n) peak <= PyTorch's 29 MiB of live tensor memory
    (134 MiB without checkpointing, 71 MiB per layer). PyTorch's figure is
    its peak of live tensors apart from the weights; the nearest thing
    memory.py counts is the peak, over the ops of one step, of live bytes in
    every category but "parameters" and "gradients" (saved activations plus
    "other": layer outputs, gradients in flight, the batch). That is the
    figure compared; the saved activations alone are printed beside it.
W2  GPT, 4 blocks, d_model 256, 4 heads, sequence 128, batch 8, vocabulary 256,
    dropout 0.1. Strategies: none, every block, every block with
    policies.selective_attention (keep the Linear outputs, recompute the
    attention core and the elementwise ops), and every block with
    policies.save_matmuls (keep MatMul outputs too: recompute only softmax,
    dropout, layer norms and the elementwise ops); and the selective policy
    with each block's two halves checkpointed apart (split_blocks=True,
    "sel. halves"), so that a recompute holds half a block's inside at a time.
    Target: the selective policy saves >= 40% of activation memory for <= 10%
    extra time. Activation memory is printed two ways: what is held from the
    end of the forward into backward, and the peak over the whole step.

A step is forward, backward, SGD step, zero_grad. Times are the median of
REPEATS steps after one warm-up, taken in rounds over the strategies (the
machine may be shared: a load that drifts then slows all strategies alike);
beside the ratio of medians are the median of the ratios within a round
(steps run back to back: the steadiest figure on a busy machine), the
ratio of the fastest steps and that of the CPU time the process used;
memory comes from one more step recorded with memory.timeline() (one point
per op), so it does not slow the timed steps. 2 BLAS threads.

    python benchmarks/checkpointing.py        # a few minutes on 2 cores
"""

import os

# BLAS reads these when NumPy loads: set them before importing it.
os.environ["OMP_NUM_THREADS"] = "2"
os.environ["OPENBLAS_NUM_THREADS"] = "2"
os.environ["MKL_NUM_THREADS"] = "2"

import statistics  # noqa: E402
import time  # noqa: E402
from dataclasses import replace  # noqa: E402

import numpy  # noqa: E402

from tinygrad_ckpt import Tensor, memory, optim, policies  # noqa: E402
from tinygrad_ckpt import functional as F  # noqa: E402
from tinygrad_ckpt.bench import workloads  # noqa: E402
from tinygrad_ckpt.threads import limited_threads  # noqa: E402

# -- configuration ----------------------------------------------------------------
REPEATS = {"W1": 11, "W2": 15}  # W2's steps are short: more of them for a steadier median
W1 = replace(workloads.W1, n_layers=64)  # the reference workloads (tinygrad_ckpt/bench/workloads.py)
W2 = workloads.W2
MIB = 1 << 20
PYTORCH_W1_MIB = {"none": 134, "every": 71, "sqrt": 29}  # PyTorch 2.13 on CPU, W1 depth 64: live tensors apart from weights


def blas_threads():
    """What the BLAS pools run on, as the one thread limiter reports it (limiting nothing)."""
    with limited_threads(None) as info:
        return info["summary"]


def measure(step, strategies, repeats):
    """{name: (median seconds, memory figures)} for step() under each strategy.

    strategies: {name: a function that switches the model to it}. The timed
    steps go round the strategies in turn (none, every, ..., none, every,
    ...), so a machine whose load drifts during the run slows them alike.
    """
    times = {name: [] for name in strategies}
    cpu = {name: [] for name in strategies}
    for switch in strategies.values():  # one warm-up each
        switch()
        step()
    for _ in range(repeats):
        for name, switch in strategies.items():
            switch()
            start, start_cpu = time.perf_counter(), time.process_time()
            step()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    rows = {}
    apart = [c for c in memory.CATEGORIES if c not in ("parameters", "gradients")]
    for name, switch in strategies.items():
        switch()
        memory.reset_peak()
        with memory.timeline() as events:
            step()
        forward_end = max((i for i, e in enumerate(events) if e["phase"] == "forward"), default=0)
        rows[name] = statistics.median(times[name]), {
            "min_seconds": min(times[name]),
            "cpu_seconds": statistics.median(cpu[name]),
            # the same round's steps ran one after the other: their ratio is steadier on a busy machine
            "paired_ratio": statistics.median(t / t0 for t, t0 in zip(times[name], times["none"])),
            "activations_peak": max(e["activations"] for e in events),
            "activations_held": events[forward_end]["activations"],  # at the last forward op (the loss)
            "live_apart_peak": max(sum(e[c] for c in apart) for e in events),
            "total_peak": memory.peak()[0],
        }
    return rows


def w1():
    model = W1.model(numpy.random.default_rng(0))
    rng = numpy.random.default_rng(1)
    x, target = (Tensor(a) for a in W1.data(rng))  # (batch, width) each
    opt = optim.SGD(model.parameters(), lr=1e-4)

    def step():
        F.mse_loss(model(x), target).backward()
        opt.step()
        opt.zero_grad()

    return measure(step, {
        "none": model.gradient_checkpointing_disable,
        "every": lambda: model.gradient_checkpointing_enable("every"),
        "sqrt": lambda: model.gradient_checkpointing_enable("sqrt"),
    }, REPEATS["W1"])


def w2():
    model = W2.model(numpy.random.default_rng(0))
    idx, targets = W2.data(numpy.random.default_rng(1))  # (batch, seq) token ids and next-token targets
    opt = optim.SGD(model.parameters(), lr=1e-4)

    def step():
        _, loss = model(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()

    return measure(step, {
        "none": model.gradient_checkpointing_disable,
        "every": lambda: model.gradient_checkpointing_enable("every"),
        "selective": lambda: model.gradient_checkpointing_enable("every", policy=policies.selective_attention),
        "sel. halves": lambda: model.gradient_checkpointing_enable("every", policy=policies.selective_attention,
                                                                    split_blocks=True),
        "save_matmuls": lambda: model.gradient_checkpointing_enable("every", policy=policies.save_matmuls),
    }, REPEATS["W2"])


def mib(n):
    return f"{n / MIB:8.1f}"


def table(rows, title, extra=None):
    base_time, base_min, base_cpu = rows["none"][0], rows["none"][1]["min_seconds"], rows["none"][1]["cpu_seconds"]
    print(f"\n{title}")
    print(f"{'strategy':<12} {'step s':>7} {'ratio':>6} {'paired':>6} {'(min)':>6} {'(cpu)':>6} {'saved act peak':>15} {'act held fwd->bwd':>18} "
          f"{'live-apart peak':>16} {'total peak':>11}" + (f" {extra[0]:>10}" if extra else ""))
    for name, (seconds, m) in rows.items():
        line = (f"{name:<12} {seconds:7.3f} {seconds / base_time:6.2f} {m['paired_ratio']:6.2f} {m['min_seconds'] / base_min:6.2f} "
                f"{m['cpu_seconds'] / base_cpu:6.2f} "
                f"{mib(m['activations_peak']):>11} MiB "
                f"{mib(m['activations_held']):>14} MiB {mib(m['live_apart_peak']):>12} MiB {mib(m['total_peak']):>7} MiB")
        if extra:
            line += f" {extra[1](name):>10}"
        print(line)


def main():
    print(f"BLAS: {blas_threads()}; step s and ratio: median wall-clock of {REPEATS['W1']} (W1) / "
          f"{REPEATS['W2']} (W2) steps after one warm-up, ratio of medians; paired: median of the ratios within "
          f"a round; (min): ratio of the fastest steps; (cpu): ratio of the median process CPU time. "
          f"Load average at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    r1 = w1()
    table(r1, f"W1: MLP depth {W1.n_layers}, width {W1.width}, batch {W1.batch}, float32 (MiB = 2^20 bytes)",
          ("PyTorch", lambda name: f"{PYTORCH_W1_MIB[name]} MiB"))
    ratio, paired = r1["every"][0] / r1["none"][0], r1["every"][1]["paired_ratio"]
    sqrt_live = r1["sqrt"][1]["live_apart_peak"] / MIB
    print(f"target: every-layer time ratio <= 1.4: ratio of medians {ratio:.2f} ({'met' if ratio <= 1.4 else 'MISSED'}), "
          f"paired {paired:.2f} ({'met' if paired <= 1.4 else 'MISSED'})")
    print(f"target: sqrt live-apart peak {sqrt_live:.1f} MiB <= PyTorch's 29 MiB: {'met' if sqrt_live <= 29 else 'MISSED'}")

    r2 = w2()
    table(r2, f"W2: GPT {W2.n_layer} blocks, d_model {W2.n_embd}, {W2.n_head} heads, seq {W2.seq}, "
              f"batch {W2.batch}, dropout {W2.dropout}")
    none = r2["none"]
    for name in ("selective", "sel. halves", "save_matmuls"):
        sel = r2[name]
        held = 1 - sel[1]["activations_held"] / none[1]["activations_held"]
        peak = 1 - sel[1]["activations_peak"] / none[1]["activations_peak"]
        overhead, paired = sel[0] / none[0] - 1, sel[1]["paired_ratio"] - 1
        print(f"{name}: saved activations held fwd->bwd {held:.0%} lower, peak over the step {peak:.0%} lower "
              f"(target >= 40%: {'met' if held >= 0.4 else 'MISSED'} held, {'met' if peak >= 0.4 else 'MISSED'} peak); "
              f"time overhead (target <= 10%) {overhead:+.1%} from medians ({'met' if overhead <= 0.10 else 'MISSED'}), "
              f"{paired:+.1%} paired ({'met' if paired <= 0.10 else 'MISSED'})")
    print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
