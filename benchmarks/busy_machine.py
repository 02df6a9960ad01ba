"""On a busy machine, what do BLAS threads do to `tinygrad-ckpt train` and `verify`?

NumPy's BLAS starts one thread per core. A thread that finds no free core is
waited for by the others, so on a machine whose cores are taken, a small
matrix product can take many times longer on two threads than on one. This
script takes the cores on purpose (BUSY processes that spin, the load of
another job), then times, as medians of REPEATS runs:

  1. sampling 300 characters from the default `train` model (what `train`
     does after training), in this process, on BLAS's default threads and on
     one (the command now samples on one: threads.limited_threads);
  2. the main job, `tinygrad-ckpt train --max-steps 2 --sample-chars 0`,
     with BLAS's default threads and with OPENBLAS_NUM_THREADS=1;
  3. `tinygrad-ckpt train --max-steps 2` as it runs now (sampling included);
  4. `tinygrad-ckpt verify --no-mpi` with --threads 2 (BLAS's default on two
     cores, what verify did before it had the flag) and --threads 1 (its
     default now).

    python benchmarks/busy_machine.py                # 2 spinning processes, 2 runs each: 11 minutes on 2 cores
    python benchmarks/busy_machine.py --busy 0       # the same on the machine as it is

The spinning processes are killed at the end, whatever happens. The figures
depend on the machine and on what else runs: the script prints the machine,
the load average before and after, and the date, to quote beside them.
"""

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time

BUSY = 2  # processes that spin (`while True: pass`) during the measurements
REPEATS = 2  # runs of each row; the median is printed
SAMPLE_CHARS = 300  # `tinygrad-ckpt train`'s default


def spin(n):
    """Start n processes that each keep a core busy; returns them (kill them after)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def command_seconds(argv, env=None):
    """Wall seconds of one run of a command (its output is checked, not shown)."""
    start = time.perf_counter()
    done = subprocess.run(argv, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return seconds


def sampling_seconds(threads, repeats):
    """Wall seconds to sample SAMPLE_CHARS characters from the default train model, `threads` BLAS threads
    (None: BLAS's default), median of `repeats`."""
    import numpy

    from tinygrad_ckpt.cli import DEFAULTS
    from tinygrad_ckpt.data import load_char_datasets
    from tinygrad_ckpt.nn import GPT, GPTConfig
    from tinygrad_ckpt.threads import limited_threads

    tokenizer, _, _ = load_char_datasets(None, DEFAULTS["block_size"], 0.1)
    config = GPTConfig(block_size=DEFAULTS["block_size"], vocab_size=tokenizer.vocab_size, n_layer=DEFAULTS["n_layer"],
                       n_head=DEFAULTS["n_head"], n_embd=DEFAULTS["n_embd"], dropout=0.0)
    model = GPT(config, rng=numpy.random.default_rng(0))
    model.eval()
    prompt = tokenizer.encode("\n")[None, :]
    times = []
    with limited_threads(threads):
        for _ in range(repeats):
            start = time.perf_counter()
            model.generate(prompt, SAMPLE_CHARS, temperature=0.8, rng=numpy.random.default_rng(0))
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=BUSY, help="spinning processes (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="runs per row (default: %(default)s)")
    args = parser.parse_args()
    from tinygrad_ckpt.bench.machine import describe, load_average

    command = [sys.executable, "-m", "tinygrad_ckpt"]
    one = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    rows = [
        ("sampling 300 characters, BLAS default threads", lambda: sampling_seconds(None, 1)),
        ("sampling 300 characters, 1 thread", lambda: sampling_seconds(1, 1)),
        ("train --max-steps 2 --sample-chars 0, BLAS default threads",
         lambda: command_seconds(command + ["train", "--max-steps", "2", "--sample-chars", "0", "--disable-tqdm"])),
        ("train --max-steps 2 --sample-chars 0, OPENBLAS_NUM_THREADS=1",
         lambda: command_seconds(command + ["train", "--max-steps", "2", "--sample-chars", "0", "--disable-tqdm"],
                                 one)),
        ("train --max-steps 2 (sampling on 1 thread)",
         lambda: command_seconds(command + ["train", "--max-steps", "2", "--disable-tqdm"])),
        ("verify --no-mpi --threads 2", lambda: command_seconds(command + ["verify", "--no-mpi", "--threads", "2"])),
        ("verify --no-mpi --threads 1", lambda: command_seconds(command + ["verify", "--no-mpi", "--threads", "1"])),
    ]
    load_before = load_average()
    spinners = spin(args.busy)
    try:
        time.sleep(1)
        samples = {name: [] for name, _ in rows}
        for k in range(args.repeats):  # rows in turn, round after round: a change of load touches each alike
            for name, measure in rows:
                samples[name].append(measure())
                print(f"round {k + 1}/{args.repeats}: {name}: {samples[name][-1]:.1f} s", flush=True)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    print()
    print(f"{datetime.date.today()}, {describe()['description']}; {args.busy} spinning processes; load average "
          f"{load_before:.1f} before, {load_average():.1f} after; medians of {args.repeats} runs, wall seconds")
    print()
    print("| what | median s | runs |")
    print("|---|---|---|")
    for name, _ in rows:
        print(f"| {name} | {statistics.median(samples[name]):.1f} | "
              f"{', '.join(f'{s:.1f}' for s in samples[name])} |")


if __name__ == "__main__":
    main()
