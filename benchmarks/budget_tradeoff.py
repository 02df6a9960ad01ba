"""What does each activation-memory budget cost in step time? (W1 depth 32, W2 8 blocks)

For budgets from 90% down to 10% of the no-checkpoint activation peak, the
planner (schedules.plan_checkpoints) picks the plan that recomputes least;
each plan is then run and measured: the peak of saved activations (beside
the analytic count) and the step time relative to no checkpointing, next to
the uniform schedules (every layer, sqrt(n)). Below what one level of
checkpoints can reach, the plans are nested (revolve: some layers are
recomputed more than once); budgets no plan can meet are listed with the
least one can. Draws tradeoff.png with matplotlib, if installed, into the
current folder.

    python benchmarks/budget_tradeoff.py

Several minutes on 2 cores.
"""

import os

# BLAS reads these when NumPy loads: set them before importing it.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")

from dataclasses import replace  # noqa: E402

from tinygrad_ckpt.bench import strategies  # noqa: E402

# -- configuration: W1 and W2 (tinygrad_ckpt/bench/workloads.py) at one size each ----------
CONFIG = replace(strategies.FULL, budgets=(), tradeoff_fractions=(0.9, 0.75, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.1))
W1_DEPTH, W2_BLOCKS = 32, 8


def main():
    progress = lambda what, count=True: print(what, flush=True)  # noqa: E731
    rows, curves = [], []
    for workload, size, run in (("W1", W1_DEPTH, strategies.bench_w1), ("W2", W2_BLOCKS, strategies.bench_w2)):
        # none, every layer, sqrt(n) (and selective for W2), then a plan per budget, timed in the same rounds
        got = run(CONFIG, size, progress, fractions=CONFIG.tradeoff_fractions)
        uniform = [r for r in got if r.get("fraction") is None]
        curve = sorted((r for r in got if r.get("fraction") is not None), key=lambda r: -r["fraction"])
        rows += uniform
        baseline = next(r for r in uniform if r["strategy"] == "none")
        curves.append({"workload": workload, "size": size, "rows": curve, "baseline": baseline})
        print(strategies.table(uniform + curve, f"{workload}, size {size}", "size", {size: baseline},
                          ("plan", lambda r: r.get("plan", ""))))
    try:
        from tinygrad_ckpt.bench import plots
    except ImportError:
        print('no plot: matplotlib is not installed (pip install -e ".[plot]" in the clone)')
        return
    plots.save(plots.tradeoff({"rows": rows, "tradeoff": curves}), "tradeoff.png")
    print("wrote tradeoff.png")


if __name__ == "__main__":
    main()
