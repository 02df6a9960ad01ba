"""`tinygrad-ckpt verify`: every checkpointing and accumulation strategy checked on a GPT and an MLP, as one table.

    tinygrad-ckpt verify                           # the default sizes: 42 s of CPU time (2-core machine)
    tinygrad-ckpt verify --n-layer 8 --n-embd 64   # the GPT's fields (GPTConfig's names); --mlp-layers ...

It runs on one BLAS thread unless given --threads: its products are small,
and on a busy machine threads that wait for a free core only slow it.

Each row is one strategy, run by check_checkpoint or check_accumulation
(equivalence.py) in float64 and in float32 against the plain run of the
same model, from the same weights, data and random states. The table gives
the largest absolute and relative difference of any gradient (float64;
expected: 0, or rounding where sums are added in another order), the
largest relative one in float32, the tolerance, and the verdict (the loss,
the outputs, buffers and generator states are compared too). The rows:

  checkpointing   every block (layer), sqrt(n) segments, the planner at 50 %
                  and 25 % of the no-checkpoint peak, nested plans (revolve
                  with no slot; the planner below what one level reaches),
                  each ready-made policy, the GPT's split blocks (alone and
                  with the selective policy). The GPT has dropout, so every
                  recompute must replay its masks.
  accumulation    (dropout off: a split changes dropout's masks, whatever
                  the accumulator does) equal micro-batches, one per example,
                  a short last micro-batch, a short last group, with
                  checkpointing on, and, where MPI is installed, two
                  processes (`mpiexec -n 2`, started for that row).

Exit status: 0 when every check passes, 1 when any fails, 2 for a bad flag.

What does not live here: the checks (equivalence.py), the strategies
(checkpoint.py, schedules.py, policies.py, accumulate.py, distributed.py).
"""

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy

from .. import backend, distributed
from .. import functional as F
from ..bench.report import markdown_table
from ..nn import GPT, MLP, GPTConfig
from ..policies import BY_NAME
from ..schedules import describe, measure_layers, minimum_budget, plan_checkpoints, predict, revolve
from ..tensor import Tensor
from ..threads import limited_threads, thread_count
from .equivalence import check_accumulation, check_checkpoint, tolerance

DESCRIPTION = """Check that every checkpointing and accumulation strategy leaves the gradients as
they are without it: each strategy against the plain run of the same GPT or MLP, in
float64 and float32, one row each (largest gradient differences, tolerance, verdict).
Exit status 1 if any check fails.

  tinygrad-ckpt verify                          the default sizes (40 s or so of CPU time)
  tinygrad-ckpt verify --n-layer 8 --n-embd 64  a bigger GPT (GPTConfig's fields as flags)"""

DTYPES = ("float64", "float32")
MPI_TIMEOUT = 120  # seconds for the two-process row; a hang fails the row instead of blocking


def add_arguments(parser):
    gpt = parser.add_argument_group("the GPT (GPTConfig's fields)")
    gpt.add_argument("--n-layer", type=int, default=4, help="transformer blocks (default: %(default)s)")
    gpt.add_argument("--n-head", type=int, default=4, help="attention heads; must divide --n-embd (default: %(default)s)")
    gpt.add_argument("--n-embd", type=int, default=64, help="embedding width (default: %(default)s)")
    gpt.add_argument("--block-size", type=int, default=32, help="context length (default: %(default)s)")
    gpt.add_argument("--vocab-size", type=int, default=64, help="token ids (default: %(default)s)")
    gpt.add_argument("--dropout", type=float, default=0.1,
                     help="dropout in the checkpointing rows; the accumulation rows run without (default: %(default)s)")
    mlp = parser.add_argument_group("the MLP")
    mlp.add_argument("--mlp-layers", type=int, default=16, help="Linear -> GELU blocks (default: %(default)s)")
    mlp.add_argument("--mlp-width", type=int, default=128, help="their width (default: %(default)s)")
    run = parser.add_argument_group("the run")
    run.add_argument("--batch-size", type=int, default=8,
                     help="examples per batch (the MLP's is twice this); at least 4 (default: %(default)s)")
    run.add_argument("--device", default="cpu", help="'cpu' or 'cuda' (needs CuPy) (default: %(default)s)")
    run.add_argument("--seed", type=int, default=0, help="weights, data and dropout (default: %(default)s)")
    run.add_argument("--no-mpi", action="store_true", help="leave out the two-process row")
    run.add_argument("--threads", type=thread_count, default=1,
                     help="BLAS threads; these models' products are too small to gain from more, and on a busy "
                          "machine more threads wait for each other (default: %(default)s)")
    run.add_argument("--data-parallel-worker", action="store_true", help=argparse.SUPPRESS)  # one rank of that row


def check_arguments(args):
    """A bad flag is a ValueError naming it (the command line prints it and exits with status 2)."""
    at_least = {"--n-layer": (args.n_layer, 1), "--n-head": (args.n_head, 1), "--n-embd": (args.n_embd, 1),
                "--block-size": (args.block_size, 1), "--vocab-size": (args.vocab_size, 2),
                "--mlp-layers": (args.mlp_layers, 1), "--mlp-width": (args.mlp_width, 1),
                "--batch-size": (args.batch_size, 4)}
    for flag, (value, least) in at_least.items():
        if value < least:
            why = " (the accumulation rows cut it into uneven micro-batches)" if flag == "--batch-size" else ""
            raise ValueError(f"{flag} must be at least {least}{why}, got {value}")
    if args.seed < 0:
        raise ValueError(f"--seed must be 0 or more (NumPy's generators take no negative seed), got {args.seed}")
    if args.n_embd % args.n_head:
        raise ValueError(f"--n-embd ({args.n_embd}) must be divisible by --n-head ({args.n_head})")
    if not 0 <= args.dropout < 1:
        raise ValueError(f"--dropout must be in [0, 1), got {args.dropout}")
    try:
        backend.module_for(args.device)  # an unknown device, or 'cuda' without CuPy or a GPU
    except RuntimeError as e:
        raise ValueError(f"--device {args.device}: {e}") from None
    except ValueError as e:
        raise ValueError(f"--device: {e}") from None
    return args


# -- the models and their data --------------------------------------------------------------
class Models:
    """The GPT and the MLP of the flags, built afresh for each run from the same seed, and their data."""

    def __init__(self, args):
        self.args = args
        a = args
        self.config = GPTConfig(block_size=a.block_size, vocab_size=a.vocab_size, n_layer=a.n_layer,
                                n_head=a.n_head, n_embd=a.n_embd, dropout=a.dropout)
        data = numpy.random.default_rng(a.seed + 1)
        self.idx = data.integers(0, a.vocab_size, size=(a.batch_size, a.block_size))
        self.labels = data.integers(0, a.vocab_size, size=(a.batch_size, a.block_size))
        lengths = data.integers(1, a.block_size + 1, size=a.batch_size)  # right padding: uneven token counts
        self.labels[numpy.arange(a.block_size)[None, :] >= lengths[:, None]] = -100
        self.x = data.standard_normal((2 * a.batch_size, a.mlp_width))
        self.y = data.standard_normal((2 * a.batch_size, a.mlp_width))

    def gpt(self, dtype, dropout=None):
        config = self.config if dropout is None else GPTConfig(**{**vars(self.config), "dropout": dropout})
        return GPT(config, rng=numpy.random.default_rng(self.args.seed), dtype=dtype, device=self.args.device)

    def mlp(self, dtype):
        a = self.args
        return MLP(a.mlp_width, a.mlp_width, a.mlp_width, n_layers=a.mlp_layers, dtype=dtype, device=a.device,
                   rng=numpy.random.default_rng(a.seed))

    def mlp_input(self, dtype):
        return Tensor(self.x.astype(dtype), requires_grad=True, device=self.args.device)

    def gpt_batch(self):
        return {"input_ids": self.idx, "labels": self.labels}

    def mlp_batch(self, dtype):
        return (self.x.astype(dtype), self.y.astype(dtype))


def gpt_loss(model, batch):
    """The summed cross-entropy of the counted tokens (the accumulator's contract)."""
    logits, _ = model(batch["input_ids"])
    return F.cross_entropy(logits, backend.to_device(batch["labels"], logits.device), reduction="sum")


def mlp_loss(model, batch):
    """The summed squared error of the examples."""
    x, y = batch
    device = model.head.weight.device
    return F.mse_loss(model(Tensor(x, device=device)), Tensor(y, device=device), reduction="sum")


def chain_costs(model, models, dtype):
    """measure_layers of the model's checkpoint chain, at the input it sees (FLOP-proportional costs)."""
    if isinstance(model, GPT):
        xp = backend.module_for(models.args.device)
        x = model.wte(models.idx) + model.wpe(xp.arange(models.idx.shape[1]))  # the blocks' input (B, T, C)
    else:
        x = models.mlp_input(dtype)
    return measure_layers(model.checkpoint_chain(), x, repeats=1, cost="flops")


def planned(costs, fraction=None):
    """(the planner's plan, what its budget was): at `fraction` of the no-checkpoint peak, or
    (fraction None) halfway between the least a nested plan and the least one level reaches;
    (None, why) when nested plans reach no lower than one level."""
    least = minimum_budget(costs)
    if fraction is not None:
        budget = int(predict(costs, [(0, len(costs), False)])[0] * fraction)
        if budget < least:
            return plan_checkpoints(costs, least), f"{fraction:.0%} of the peak, raised to the least any plan reaches"
        return plan_checkpoints(costs, budget), f"{fraction:.0%} of the peak"
    single = minimum_budget(costs, nested=False)
    if least >= single:
        return None, f"no nested plan goes below one level's minimum for {len(costs)} layers"
    return plan_checkpoints(costs, (least + single) // 2), "below one level"


# -- the rows -----------------------------------------------------------------------------
@dataclass
class Row:
    model: str
    strategy: str
    check: object = None  # dtype -> EquivalenceReport (or the figures of one, from the MPI workers)
    skip: str = None  # why the row does not run


def rows(models, with_mpi=True):
    """Every strategy on each model: the table's rows, in order."""
    out = []
    for name, unit, make in (("GPT", "block", models.gpt), ("MLP", "layer", models.mlp)):
        def inputs(dtype, name=name):
            return (models.idx, models.labels) if name == "GPT" else models.mlp_input(dtype)

        def ckpt(strategy=None, policy=None, split_blocks=None, make=make, inputs=inputs):
            return lambda dtype: check_checkpoint(make(dtype), inputs(dtype), strategy, policy, split_blocks=split_blocks)

        n = models.config.n_layer if name == "GPT" else models.args.mlp_layers
        costs = chain_costs(make("float64"), models, "float64")
        out.append(Row(name, f"every {unit}", ckpt("every")))
        out.append(Row(name, f"sqrt(n) segments ({round(n ** 0.5)})", ckpt("sqrt")))
        for fraction in (0.5, 0.25):
            plan, budget = planned(costs, fraction)
            out.append(Row(name, f"planner at {budget}: {_label(plan.segments)}", ckpt(plan)))
        if n >= 2:
            out.append(Row(name, f"nested: revolve({n}, 0), {_label(revolve(n, 0))}", ckpt(revolve(n, 0))))
        else:
            out.append(Row(name, "nested: revolve(n, 0)", skip="one layer: nothing to nest"))
        plan, budget = planned(costs)
        if plan is None:
            out.append(Row(name, "planner below one level", skip=budget))
        else:
            out.append(Row(name, f"planner {budget}: {_label(plan.segments)}", ckpt(plan)))
        for policy in sorted(BY_NAME):
            out.append(Row(name, f"every {unit}, policy {policy}", ckpt("every", policy)))
        if name == "GPT":
            out.append(Row(name, "split blocks (attention and feed-forward apart)", ckpt("every", split_blocks=True)))
            out.append(Row(name, "split blocks, policy selective_attention",
                           ckpt("every", "selective_attention", split_blocks=True)))
    out += accumulation_rows(models, with_mpi)
    return out


def _label(segments):
    """A plan as schedules.describe writes it, or, when that is long, how deep it nests."""
    text = describe(segments)
    if len(text) <= 40:
        return text
    def depth(segs):  # plan levels: 1 for a plan without inner plans
        return 1 + max((depth(how) for _, _, how in segs if isinstance(how, list)), default=0)

    levels = depth(segments) - 1
    return f"{len(segments)} segments" + (f", nested {levels} deep" if levels else "")


def accumulation_rows(models, with_mpi):
    b = models.args.batch_size
    tokens = (models.labels != -100).sum(axis=1)

    def gpt(splits, steps=None, checkpointing=False):
        def run(dtype):
            model = models.gpt(dtype, dropout=0.0)
            if checkpointing:
                model.gradient_checkpointing_enable()
            return check_accumulation(model, gpt_loss, models.gpt_batch(), splits, gradient_accumulation_steps=steps)
        return run

    def mlp(splits):
        return lambda dtype: check_accumulation(models.mlp(dtype), mlp_loss, models.mlp_batch(dtype), splits)

    short = [b - 2, 1, 1]
    out = [
        Row("GPT", f"accumulation: 2 micro-batches, padded ({tokens.tolist()} tokens per example)", gpt(2)),
        Row("GPT", f"accumulation: {b} micro-batches of 1", gpt(b)),
        Row("GPT", f"accumulation: short last micro-batch {[b - 1, 1]}", gpt([b - 1, 1])),
        Row("GPT", f"accumulation: short last group, {short} of gradient_accumulation_steps 4", gpt(short, 4)),
        Row("GPT", "accumulation: 2 micro-batches, every block checkpointed", gpt(2, checkpointing=True)),
        Row("MLP", "accumulation: 4 micro-batches", mlp(4)),
        Row("MLP", f"accumulation: uneven {[b + 1, b - 2, 1]}", mlp([b + 1, b - 2, 1])),
    ]
    what = "accumulation: 2 processes (MPI) x 2 micro-batches"
    reason = "--no-mpi" if not with_mpi else mpi_unavailable_reason()
    out.append(Row("GPT", what, skip=reason) if reason else Row("GPT", what, data_parallel_row(models.args)))
    return out


# -- two processes ------------------------------------------------------------------------------
def find_mpiexec():
    """The mpiexec installed next to this Python (the `mpich` wheel puts it there), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.exists(beside) else shutil.which("mpiexec")


def mpi_unavailable_reason():
    if importlib.util.find_spec("mpi4py") is None:
        return f"mpi4py is not installed ({distributed.INSTALL_HINT})"
    if find_mpiexec() is None:
        return f"no mpiexec next to {sys.executable} or on PATH ({distributed.INSTALL_HINT})"
    return None


_MODEL_FLAGS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "dropout", "mlp_layers", "mlp_width",
                "batch_size", "seed")


def data_parallel_row(args):
    """Start the two workers once; each dtype's figures come from their JSON."""
    results = {}

    def run(dtype):
        if not results:
            flags = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in _MODEL_FLAGS]
            env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                   "OMPI_MCA_rmaps_base_oversubscribe": "1", "OPENBLAS_NUM_THREADS": str(args.threads)}
            command = [find_mpiexec(), "-n", "2", sys.executable, "-m", "tinygrad_ckpt", "verify",
                       "--data-parallel-worker", *flags]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=MPI_TIMEOUT, env=env)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"the two processes did not finish in {MPI_TIMEOUT} s") from None
            if done.returncode != 0:
                raise RuntimeError(f"the two processes failed (exit status {done.returncode}): "
                                   f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
            results.update(json.loads(done.stdout.strip().splitlines()[-1]))
        return results[dtype]

    return run


def data_parallel_worker(args):
    """One rank of the MPI row: check_accumulation across the processes; rank 0 prints every rank's figures."""
    parallel = distributed.from_environment()
    if parallel is None:
        raise ValueError("--data-parallel-worker runs under `mpiexec -n 2` only")
    models = Models(args)
    figures = {}
    for dtype in DTYPES:
        report = check_accumulation(models.gpt(dtype, dropout=0.0), gpt_loss, models.gpt_batch(), 2,
                                    distributed=parallel)
        figures[dtype] = _figures(report)
    everyone = parallel.comm.all_gather(figures)
    if parallel.is_main_process:  # the worst rank's figures, per dtype
        worst = {dtype: max((f[dtype] for f in everyone), key=lambda f: (not f["passed"], f["max_rel"]))
                 for dtype in DTYPES}
        print(json.dumps(worst))
    return 0


# -- running and printing ---------------------------------------------------------------------------
def _figures(report):
    """What the table shows of one report (a dict, so the MPI workers can send it as JSON)."""
    if isinstance(report, dict):
        return report
    worst = report.failures[0] if report.failures else report.worst
    return {"max_abs": report.max_abs(), "max_rel": report.max_rel(), "passed": report.passed,
            "problem": None if report.passed else (report.problems[:1] or [f"{worst.name}: {worst.max_abs:.3g} "
                                                                         f"(tolerance {worst.tolerance:.3g})"])[0]}


class _Progress:
    """'[ 7/32] GPT: sqrt(n) segments, float32' on a terminal's stderr, rewritten in place; silent elsewhere."""

    def __init__(self, total, stream=None):
        self.total, self.stream = total, sys.stderr if stream is None else stream
        self.enabled = hasattr(self.stream, "isatty") and self.stream.isatty()

    def show(self, k, text):
        if self.enabled:
            self.stream.write(f"\r\033[K[{k:>2}/{self.total}] {text}")
            self.stream.flush()

    def close(self):
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()


def run(args):
    """Run every row in float64 and float32, print the table; 1 if any check failed."""
    check_arguments(args)
    if args.data_parallel_worker:
        return data_parallel_worker(args)
    with limited_threads(args.threads):  # threads.py: the one thread limiter
        return _run(args)


def _run(args):
    start = time.perf_counter()
    models = Models(args)
    a, c = args, models.config
    print("tinygrad-ckpt verify: each strategy against the plain run of the same model, in float64 and float32; "
          "every gradient, the loss and outputs, buffers and random states compared")
    print(f"GPT: {c.n_layer} blocks, {c.n_head} heads, width {c.n_embd}, context {c.block_size}, vocabulary "
          f"{c.vocab_size}, dropout {c.dropout} (none in the accumulation rows), batch {a.batch_size}; MLP: "
          f"{a.mlp_layers} layers of width {a.mlp_width}, batch {2 * a.batch_size}; on {a.device}", flush=True)
    table = rows(models, with_mpi=not a.no_mpi)
    progress = _Progress(len(table))
    lines, failed, skipped = [], 0, 0
    for k, row in enumerate(table, 1):
        if row.skip:
            skipped += 1
            lines.append([row.model, row.strategy, "", "", "", "", f"skipped: {row.skip}"])
            continue
        got = {}
        try:
            for dtype in DTYPES:
                progress.show(k, f"{row.model}: {row.strategy}, {dtype}")
                got[dtype] = _figures(row.check(dtype))
        except Exception as e:  # a strategy that raises fails its row, and the others still run
            failed += 1
            lines.append([row.model, row.strategy, "", "", "", "", f"ERROR: {type(e).__name__}: {e}"])
            continue
        passed = all(f["passed"] for f in got.values())
        failed += not passed
        problems = [f"{dtype}: {f['problem']}" for dtype, f in got.items() if not f["passed"]]
        lines.append([row.model, row.strategy, f"{got['float64']['max_abs']:.2g}", f"{got['float64']['max_rel']:.2g}",
                      f"{got['float32']['max_rel']:.2g}", _tolerances(),
                      "pass" if passed else "FAIL: " + "; ".join(problems)])
    progress.close()
    head = ["model", "strategy", "float64 max abs", "float64 max rel", "float32 max rel", "tolerance (rel)", "verdict"]
    print("\n".join(markdown_table(head, lines)))
    ran = len(table) - skipped
    print(f"{ran} strategies checked: {ran - failed} passed, {failed} failed"
          + (f", {skipped} skipped" if skipped else "") + f"; {time.perf_counter() - start:.0f} s")
    print("max rel: the largest |difference| over a gradient's largest |value|, the worst gradient of the row; "
          "a row passes when every gradient, the loss (or outputs) and the buffers are within "
          "atol + rtol x that largest |value|")
    return 1 if failed else 0


def _tolerances():
    return " / ".join(f"{tolerance(d)[0]:.0e}" for d in DTYPES)
