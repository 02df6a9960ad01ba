"""How long does `tinygrad-ckpt fit` take for GPT-2 XL, and does it stay under a second?

Times plan_training (the whole table: six strategies, the planner, the
recommendation) for GPT-2's four sizes on a few GPUs, the best of REPEATS
runs each, and prints them with the machine's load, since a busy machine is
slower. The target: GPT-2 XL's table in under a second.

    python benchmarks/fit_speed.py

A few seconds. Exit status 1 if GPT-2 XL's best time is a second or more.
"""

import os
import time

from tinygrad_ckpt.fit import plan_training

# -- configuration --------------------------------------------------------------------------
MODELS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
CASES = (("t4", 32, 1), ("a100-80gb", 512, 8), ("h200", 64, 1))  # GPU, effective batch, processes
REPEATS = 3
TARGET_SECONDS = 1.0


def best_time(model, gpu, batch, processes):
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        plan = plan_training(model, effective_batch_size=batch, device_memory=gpu, processes=processes)
        best = min(best, time.perf_counter() - start)
    return best, plan.recommendation.verdict


def main():
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"plan_training, best of {REPEATS}; {os.cpu_count()} CPUs"
          + (f", load average {load:.1f}" if load is not None else ""))
    xl = 0.0
    for model in MODELS:
        for gpu, batch, processes in CASES:
            seconds, verdict = best_time(model, gpu, batch, processes)
            print(f"{model:<12} {gpu:<10} batch {batch:>4} x {processes} processes: {seconds * 1000:7.1f} ms  {verdict}")
            if model == "gpt2-xl":
                xl = max(xl, seconds)
    print(f"GPT-2 XL, slowest case: {xl * 1000:.1f} ms ({'under' if xl < TARGET_SECONDS else 'NOT under'} "
          f"{TARGET_SECONDS:.0f} s)")
    return 0 if xl < TARGET_SECONDS else 1


if __name__ == "__main__":
    raise SystemExit(main())
