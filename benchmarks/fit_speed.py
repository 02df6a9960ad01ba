"""How long does `tinygrad-ckpt fit` take for GPT-2 XL, and does it stay under five seconds?

Times plan_training (the whole table: six strategies, the planner, the
recommendation; each strategy's step run twice on the meta device, at
micro-batches 1 and 2, every block of it, and the planner's once or more)
for GPT-2's four sizes on a few GPUs, and prints them with the machine's
load, since a busy machine is slower, and the CPU time, which load changes
less. Steps already run are kept (fit._STEPS, fit._PROFILES), so each case
is timed from empty: the first query's time, not a repeat's. The target:
GPT-2 XL's table in at most five seconds.

    python benchmarks/fit_speed.py

About a minute. Exit status 1 if GPT-2 XL's slowest case takes more than TARGET_SECONDS.
"""

import os
import time

from tinygrad_ckpt import fit

# -- configuration --------------------------------------------------------------------------
MODELS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
CASES = (("t4", 32, 1), ("a100-80gb", 512, 8), ("h200", 64, 1))  # GPU, effective batch, processes
TARGET_SECONDS = 5.0


def first_time(model, gpu, batch, processes):
    fit._STEPS.clear()
    fit._PROFILES.clear()
    start, cpu = time.perf_counter(), time.process_time()
    plan = fit.plan_training(model, effective_batch_size=batch, device_memory=gpu, processes=processes)
    return time.perf_counter() - start, time.process_time() - cpu, plan.recommendation.verdict


def main():
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"plan_training, from nothing kept; {os.cpu_count()} CPUs"
          + (f", load average {load:.1f}" if load is not None else ""))
    xl = 0.0
    for model in MODELS:
        for gpu, batch, processes in CASES:
            seconds, cpu, verdict = first_time(model, gpu, batch, processes)
            print(f"{model:<12} {gpu:<10} batch {batch:>4} x {processes} processes: {seconds * 1000:7.1f} ms "
                  f"({cpu * 1000:7.1f} ms CPU)  {verdict}")
            if model == "gpt2-xl":
                xl = max(xl, seconds)
    print(f"GPT-2 XL, slowest case: {xl * 1000:.1f} ms ({'under' if xl < TARGET_SECONDS else 'NOT under'} "
          f"{TARGET_SECONDS:.0f} s)")
    return 0 if xl < TARGET_SECONDS else 1


if __name__ == "__main__":
    raise SystemExit(main())
