"""`tinygrad-ckpt bench`: the command's flags, and what it runs and writes.

    tinygrad-ckpt bench --quick                  # the smallest sizes of the reference workloads
    tinygrad-ckpt bench --output-dir bench-out   # the full set (it says how long it took)
    tinygrad-ckpt bench --compare                # beside PyTorch, HIPS autograd, mygrad, the floor (compare.py)
    tinygrad-ckpt bench --profile                # where a step's time goes, op by op (profile.py)
    tinygrad-ckpt bench --kinds --quick          # every model kind: CNN, LSTM, encoder, GPT (kinds.py)
    tinygrad-ckpt bench --kinds                  # the same, part 1 at a second, larger size a kind (minutes)

The strategy bench (strategies.py) writes, into --output-dir, bench.md (the
tables printed on the terminal), bench.json (every figure, the machine, the
threads), PNG plots drawn by plots.py with matplotlib (the optional `plot`
extra) and report.html, the memory explorer page (explorer.py, with Plotly:
the optional `report` extra); without either library the rest is still
written, and the run says how to get what is missing. `--compare` runs compare.py instead and
writes compare.md and compare.json; `--profile` runs profile.py and writes
profile.md and profile.json; `--kinds` runs kinds.py and writes kinds.md
and kinds.json. --quick and the hidden --tiny (toy sizes,
for the tests) choose the set of sizes (workloads.py) for each.

What does not live here: the measuring (strategies.py, compare.py), the
machine (machine.py), its threads (threads.py), the table format and the file writer
(report.py).
"""

import argparse
import os
import time
from dataclasses import asdict, replace

from .. import allocator, backend, random, serialization
from ..threads import limited_threads, thread_count
from . import compare, kinds, machine, profile, strategies, workloads
from .report import write_json, write_text

DESCRIPTION = """Measure checkpointing and accumulation strategies side by side on the reference
workloads (W1 deep MLP, W2 GPT stack, W3 accumulation): peak memory by category,
saved activations measured beside the analytic count, step time relative to no
checkpointing; the plain step also in mixed precision (bf16, fp16). Prints Markdown tables; writes bench.json, bench.md, PNG plots and
report.html, an interactive page of every byte of one step (opens from disk).

  tinygrad-ckpt bench --quick      the smaller set
  tinygrad-ckpt bench              the full set (it says how long it took)
  tinygrad-ckpt bench --compare    W1 and W2 beside PyTorch, HIPS autograd, mygrad and the
                                   floor (those installed; writes compare.md, compare.json)
  tinygrad-ckpt bench --profile    where a step's time goes, op by op, against its floor
                                   (writes profile.md, profile.json)
  tinygrad-ckpt bench --kinds      every model kind: a CNN, an LSTM, an encoder, a GPT
                                   (writes kinds.md, kinds.json; the full set takes minutes,
                                   --kinds --quick the smaller one)"""


def add_arguments(parser):
    parser.add_argument("--quick", action="store_true",
                        help="a smaller set: W1 depth 8 and 16, W2 4 blocks, three W3 splits")
    parser.add_argument("--output-dir", default="bench-out", metavar="DIR",
                        help="where bench.json, bench.md, the PNG plots and report.html go (default: bench-out)")
    parser.add_argument("--threads", type=thread_count, default=2, help="BLAS threads (default 2; see the notes printed)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed steps per row, after one warm-up step (default 5; the median is reported)")
    parser.add_argument("--no-plots", action="store_true", help="write the tables and JSON only (no PNGs, no report.html)")
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # toy sizes, for the tests
    parser.add_argument("--compare", action="store_true",
                        help="instead: W1 (16, 32, 64 layers) and W2 (dropout 0.1 and 0) in this engine, in PyTorch, "
                             "HIPS autograd and mygrad, those installed (pip install -e \".[compare]\" in the clone; torch "
                             "separately), and the floor (the step's matrix products alone); see tinygrad_ckpt/bench/compare.py")
    parser.add_argument("--profile", action="store_true",
                        help="instead: the time of each op kind in a step of this engine, forward and backward, "
                             "against its floor; writes profile.md and profile.json; see tinygrad_ckpt/bench/profile.py")
    parser.add_argument("--kinds", action="store_true",
                        help="instead: every model kind (a CNN, an LSTM language model, an encoder, a GPT) with no "
                             "checkpointing, every link of its chain and sqrt(n) segments: saved activations, peak, "
                             "step time and FLOPs on real arrays, and at full sizes on the meta device the largest "
                             "micro-batch that fits a 16 GB V100; writes kinds.md and kinds.json; see "
                             "tinygrad_ckpt/bench/kinds.py")
    parser.add_argument("--keep-freed-memory", action=argparse.BooleanOptionalAction, default=True,
                        help="first ask glibc's malloc to keep what a step frees for the next step (the whole "
                             "process, every library in it; tinygrad_ckpt/allocator.py), instead of handing it back "
                             "to the system and faulting it in again; --no-keep-freed-memory: the C library's "
                             "default (default: keep it)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="with --compare or --profile: cuda runs this engine (CuPy), PyTorch (if built with CUDA) "
                             "and the floor (cuBLAS) on the GPU")


def run(args):
    """Run the chosen set (or the comparison), print the tables, write JSON, Markdown and plots."""
    name = "tiny" if args.tiny else "quick" if args.quick else "full"
    if args.repeats is not None and args.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
    serialization.check_writable(args.output_dir)  # now, not after the first table
    if args.compare + args.profile + args.kinds > 1:
        raise ValueError("--compare, --profile and --kinds are separate runs: choose one")
    if args.device != "cpu" and not (args.compare or args.profile):
        raise ValueError("--device cuda is for --compare and --profile; the strategy bench runs on the CPU")
    if args.device != "cpu":
        try:
            backend.module_for(args.device)
        except RuntimeError as e:  # no CuPy or no GPU: say so in one line
            raise ValueError(f"--device {args.device}: {e}") from None
    args.allocator = allocator_setting(args.keep_freed_memory)
    if args.compare:
        return run_compare(args, workloads.SETS[name])
    if args.profile:
        return run_profile(args, workloads.SETS[name])
    if args.kinds:
        return run_kinds(args, name)
    config = strategies.SETS[name]
    if args.repeats is not None:
        config = replace(config, repeats=args.repeats)
    load = machine.load_average()
    if machine.busy(load):
        print(f"note: the machine is busy (load average {load:.1f} on {os.cpu_count()} CPUs): steps will be "
              "slower and noisier than on a quiet machine. BLAS threads that find no free core wait on each "
              "other and can make single steps many times slower; --threads 1 gives steadier ratios", flush=True)
    if strategies.precision_rows()[1]:
        print("note: the bf16 autocast rows are left out: NumPy has no bfloat16, and ml_dtypes, which has it, is not "
              "installed; `pip install -e \".[bench]\"` brings it with the plots' libraries", flush=True)
    total = strategies.count_rows(config)
    start = time.perf_counter()
    done = [0]

    def progress(what, count=True):
        done[0] += count
        print(f"[{done[0]:>3}/{total}] {time.perf_counter() - start:6.0f} s  {what}", flush=True)

    random.manual_seed(0)  # the dropout masks
    with limited_threads(args.threads) as threads:
        print(f"tinygrad-ckpt bench: {name} set, {total} rows, {config.repeats} timed steps each after one warm-up; "
              f"BLAS threads: {threads['summary']}", flush=True)
        results = strategies.collect(config, progress)
    elapsed = time.perf_counter() - start
    results.update({"set": name, "elapsed_seconds": elapsed, "machine": machine.describe(), "threads": threads,
                    "allocator": args.allocator,
                    "config": asdict(config), "load_average": {"start": load, "end": machine.load_average()}})
    text = strategies.render(results)
    print()
    print(text)
    written = [os.path.join(args.output_dir, "bench.json"), os.path.join(args.output_dir, "bench.md")]
    write_json(written[0], results)
    write_text(written[1], text + "\n")
    if args.no_plots:
        print("plots: skipped (--no-plots), the memory explorer page (report.html) with them")
    else:
        try:
            from . import plots  # matplotlib, the optional `plot` extra
        except ImportError as e:
            print(f"plots: skipped, matplotlib is not installed ({e}); get them with "
                  "`pip install -e \".[bench]\"` in the clone, and run bench again")
        else:
            written += plots.draw_all(results, args.output_dir)
        written += write_page(results, text, args.output_dir)
    print(f"wrote: {', '.join(written)}")
    print(f"the {name} set took {elapsed:.0f} s ({elapsed / 60:.1f} min) on {results['machine']['description']}")
    return 0


def allocator_setting(keep):
    """--keep-freed-memory (bench's default): apply it (allocator.py) and say so; the line goes into the run's notes."""
    if not keep:
        return "allocator: the C library's default (what a step frees may go back to the system)"
    applied, why = allocator.keep_freed_memory()
    line = f"allocator: {why}" if applied else f"allocator: --keep-freed-memory not applied: {why}"
    print(line, flush=True)
    return line


def write_page(results, tables, output_dir):
    """report.html, the memory explorer (explorer.py, Plotly: the optional `report` extra); the paths written."""
    try:
        from . import explorer
    except ImportError as e:
        print(f"memory explorer page: skipped, Plotly is not installed ({e}); get report.html with "
              "`pip install -e \".[bench]\"` in the clone, and run bench again")
        return []
    path = explorer.write(results, os.path.join(output_dir, "report.html"), tables)
    print(f"memory explorer: {path} ({os.path.getsize(path) / 2**20:.1f} MiB; it opens from disk, no network)")
    return [path]


def run_compare(args, sizes):
    """bench --compare: the set's comparison sizes; prints the table, writes compare.md and compare.json."""
    repeats = args.repeats if args.repeats is not None else 5
    start = time.perf_counter()
    rows, notes = compare.compare(sizes.compare, repeats=repeats, threads=args.threads, device=args.device,
                                  progress=lambda what: print(what, flush=True))
    notes.append(args.allocator)
    notes.append(f"the comparison took {time.perf_counter() - start:.0f} s")
    text = compare.report(rows, notes)
    print(text)
    write_text(os.path.join(args.output_dir, "compare.md"), text + "\n")
    figures = [{**r, "size": asdict(r["size"])} for r in rows]
    write_json(os.path.join(args.output_dir, "compare.json"), {"rows": figures, "notes": notes})
    return 0


def run_profile(args, sizes):
    """bench --profile: the time of each op kind per step against its floor; prints it, writes profile.md and profile.json."""
    repeats = args.repeats if args.repeats is not None else 5
    start = time.perf_counter()
    results, notes = profile.profile(sizes.compare, repeats=repeats, threads=args.threads, device=args.device,
                                     progress=lambda what: print(what, flush=True))
    notes.append(args.allocator)
    notes.append(f"the profile took {time.perf_counter() - start:.0f} s")
    text = profile.report(results, notes)
    print(text)
    write_text(os.path.join(args.output_dir, "profile.md"), text + "\n")
    figures = [{**r, "size": asdict(r["size"]), "ops": [{"op": op, "phase": phase, **v} for (op, phase), v in r["ops"].items()]}
               for r in results]
    write_json(os.path.join(args.output_dir, "profile.json"), {"workloads": figures, "notes": notes})
    return 0


def run_kinds(args, name):
    """bench --kinds: every model kind (kinds.py); prints the two tables as they come, writes kinds.md and kinds.json."""
    measured, full, budget = kinds.SETS[name]
    repeats = args.repeats if args.repeats is not None else 5
    lines, start = [], time.perf_counter()

    def say(line):
        lines.append(line)
        print(line, flush=True)

    total, done = len(measured) + len(full), [0]

    def progress(what):  # on the terminal only, not in kinds.md
        done[0] += 1
        print(f"[{done[0]:>2}/{total}] {time.perf_counter() - start:6.0f} s  {what}", flush=True)

    with limited_threads(args.threads) as threads:
        say(f"tinygrad-ckpt bench --kinds: {name} set (part 1 at "
            f"{len(measured)} sizes, part 2 at {len(full)}); BLAS threads: {threads['summary']}")
        part1 = kinds.part1(measured, repeats, say, progress)
        say("")
        part2 = kinds.part2(full, budget, say, progress)
    notes = [args.allocator, f"the {name} set took {time.perf_counter() - start:.0f} s on "
             f"{machine.describe()['description']}"]
    say("")
    for note in notes:
        say(note)
    write_text(os.path.join(args.output_dir, "kinds.md"), "```\n" + "\n".join(lines) + "\n```\n")
    write_json(os.path.join(args.output_dir, "kinds.json"), {"set": name, "part1": part1, "part2": part2,
                                                             "budget_bytes": budget, "notes": notes})
    print(f"wrote: {os.path.join(args.output_dir, 'kinds.md')}, {os.path.join(args.output_dir, 'kinds.json')}")
    return 0
