"""Workloads W1 (deep MLP) and W2 (GPT stack) on the GPU: peak memory by strategy, step-time ratios, absolute times.

Question: what does each checkpointing strategy cost and save on a GPU,
measured two ways: the engine's own accounting (memory.py, by category, the
same figures as on the CPU) and CuPy's allocator (bytes in use in its
memory pool, its peak caught by a memory hook)?

    python benchmarks/gpu_workloads.py --out OUTDIR            # on a GPU (CuPy)
    python benchmarks/gpu_workloads.py --out OUTDIR --device strict --quick
                                        # dry run on the CPU stand-in: checks the script, not the GPU

Writes OUTDIR/workloads.json (rewritten after every row, so a run cut short
keeps what it measured). Time is the median of REPEATS steps after one
warm-up, the GPU synchronised before each clock read; ratios are to the
"none" strategy of the same model in the same run. Absolute times belong to
the machine named in the JSON's "meta".

To add a strategy: one more entry in w1_strategies / w2_strategies, a
name -> (segments, policy) for checkpoint_sequential over model.blocks.
"""

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict

import numpy

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, backend, memory, nn, policies, schedules
from tinygrad_ckpt.bench import workloads
from tinygrad_ckpt.bench.report import write_json
from tinygrad_ckpt.checkpoint import checkpoint_sequential
from tinygrad_ckpt.testing import strict_cupy

# -- configuration: the reference workloads (tinygrad_ckpt/bench/workloads.py), float32 ------
SIZES = workloads.FULL
QUICK_SIZES = workloads.TINY  # --quick: seconds on a CPU
REPEATS = 5
BUDGETS = (0.5, 0.25)  # W1 planner budgets, fractions of the no-checkpoint activation peak


class CheckpointedChain(nn.Module):
    """A model's blocks run through checkpoint_sequential (one module in their place)."""

    def __init__(self, blocks, segments, policy=None):
        super().__init__()
        self.chain = nn.Sequential(*blocks)
        self.segments, self.policy = segments, policy

    def forward(self, x):
        return checkpoint_sequential(list(self.chain), self.segments, x, policy=self.policy)


def use_strategy(model, blocks, segments, policy=None):
    """Give `model` its original `blocks`, checkpointed by `segments` (None: not at all)."""
    model.blocks = nn.Sequential(*blocks) if segments is None else nn.Sequential(CheckpointedChain(blocks, segments, policy))


# -- measuring -------------------------------------------------------------------------
def synchronize(xp):
    """Wait until the GPU has done all queued work (CuPy runs asynchronously)."""
    if hasattr(xp, "cuda"):
        xp.cuda.Device().synchronize()


def pool_peak_hook(xp):
    """A CuPy memory hook that follows the pool's bytes in use and keeps their peak (None off CuPy)."""
    if not hasattr(xp, "cuda"):
        return None

    class PoolPeak(xp.cuda.MemoryHook):
        name = "tinygrad_ckpt_pool_peak"

        def __init__(self):
            self.used = self.peak = 0  # bytes above what was in use when the hook started

        def malloc_postprocess(self, **kwargs):
            self.used += kwargs["mem_size"]
            self.peak = max(self.peak, self.used)

        def free_postprocess(self, **kwargs):
            self.used -= kwargs["mem_size"]

    return PoolPeak()


def measure(model, loss_fn, xp, repeats):
    """Peak memory (engine by category, and the device pool) and step times of one training step."""

    def step():
        loss_fn().backward()
        for p in model.parameters():
            p.grad = None

    step()  # warm-up: kernels compiled, pools filled
    synchronize(xp)
    gc.collect()
    before = memory.current()
    memory.reset_peak()
    hook = pool_peak_hook(xp)
    if hook is not None:
        with hook:
            step()
            synchronize(xp)
    else:
        step()
    peak_total, at_peak = memory.peak()
    times = []
    for _ in range(repeats):
        synchronize(xp)
        start = time.perf_counter()
        step()
        synchronize(xp)
        times.append(time.perf_counter() - start)
    return {
        "peak_bytes": peak_total,
        "peak_by_category": at_peak,
        "peak_above_start_by_category": {c: at_peak[c] - before[c] for c in at_peak},
        "pool_peak_above_start_bytes": hook.peak if hook is not None else None,
        "median_s": statistics.median(times),
        "times_s": times,
    }


# -- the workloads -----------------------------------------------------------------------
def w1_model(depth, sizes, device):
    w1 = sizes.w1_at(depth)
    rng = numpy.random.default_rng(0)
    model = w1.model(rng, device=device)
    x, target = (Tensor(a, device=device) for a in w1.data(rng))  # (batch, width) each
    return model, x, lambda: F.mse_loss(model(x), target)


def w1_strategies(blocks, x):
    """name -> (segments, policy): none, every layer, sqrt(N), planner at 50% and 25% of the plain peak."""
    strategies = {"none": (None, None), "every": ("every", None), "sqrt": ("sqrt", None)}
    costs = schedules.measure_layers(blocks, x, cost="flops")
    plain_peak, _ = schedules.predict(costs, [(0, len(costs), False)])
    for fraction in BUDGETS:
        try:
            strategies[f"budget{int(fraction * 100)}"] = (schedules.plan_checkpoints(costs, fraction * plain_peak), None)
        except ValueError as e:  # below what any plan reaches: say so in the results
            strategies[f"budget{int(fraction * 100)}"] = ("error", str(e))
    return strategies


def w2_model(n_layer, sizes, device):
    w2 = sizes.w2_at(n_layer)
    model = w2.model(numpy.random.default_rng(0), device=device)
    idx, targets = w2.data(numpy.random.default_rng(1))  # (batch, seq) token ids and next-token targets
    return model, lambda: model(idx, targets)[1]


def w2_strategies():
    return {"none": (None, None), "every": ("every", None), "sqrt": ("sqrt", None),
            "selective": ("every", policies.selective_attention)}


def run(args):
    device = "cuda"
    if args.device == "strict":
        backend.set_cuda_module(strict_cupy)
    xp = backend.module_for(device)  # a clear RuntimeError if there is no GPU
    sizes = QUICK_SIZES if args.quick else SIZES
    results = {"meta": machine(xp, args), "sizes": asdict(sizes), "rows": []}

    def record(row):
        none = next((r for r in results["rows"] if r["workload"] == row["workload"]
                     and r["size"] == row["size"] and r["strategy"] == "none"), None)
        if none is not None and "median_s" in row:
            row["time_ratio_to_none"] = row["median_s"] / none["median_s"]
        results["rows"].append(row)
        write_json(os.path.join(args.out, "workloads.json"), results)
        shown = {k: row[k] for k in ("median_s", "time_ratio_to_none", "peak_bytes", "pool_peak_above_start_bytes", "error") if k in row}
        print(row["workload"], row["size"], row["strategy"], shown, flush=True)

    for depth in sizes.w1_depths:
        model, x, loss_fn = w1_model(depth, sizes, device)
        blocks = list(model.blocks)
        for name, (segments, policy) in w1_strategies(blocks, x).items():
            row = {"workload": "W1", "size": depth, "strategy": name}
            if segments == "error":
                row["error"] = policy
            else:
                use_strategy(model, blocks, segments, policy)
                row.update(measure(model, loss_fn, xp, args.repeats))
            record(row)
        del model, x, loss_fn, blocks
    for n_layer in sizes.w2_blocks:
        model, loss_fn = w2_model(n_layer, sizes, device)
        blocks = list(model.blocks)
        for name, (segments, policy) in w2_strategies().items():
            use_strategy(model, blocks, segments, policy)
            record({"workload": "W2", "size": n_layer, "strategy": name, **measure(model, loss_fn, xp, args.repeats)})
        del model, loss_fn, blocks
    return results


def machine(xp, args):
    meta = {"device": args.device, "quick": args.quick, "repeats": args.repeats, "python": platform.python_version(),
            "numpy": numpy.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if hasattr(xp, "cuda"):
        props = xp.cuda.runtime.getDeviceProperties(0)
        name = props["name"]
        meta.update(gpu=name.decode() if isinstance(name, bytes) else name, cupy=xp.__version__,
                    total_memory_bytes=props["totalGlobalMem"])
    else:
        meta["gpu"] = None  # the stand-in: times are NumPy's, not a GPU's
    return meta


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for workloads.json (created if missing)")
    parser.add_argument("--device", choices=["cuda", "strict"], default="cuda",
                        help="cuda: CuPy on a GPU; strict: the CPU stand-in (a dry run of this script)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (for the dry run)")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    try:
        run(args)
    except RuntimeError as e:
        print(f"gpu_workloads: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
