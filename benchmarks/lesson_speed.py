"""What the speed code kept in the lesson's files buys, on W2's training step (the 4-block GPT).

Four things are written for speed or memory rather than as the plain
formula; each row runs the step as the engine has it and with the plain form
swapped in for that one thing, nothing else changed:

  GELU fused      ops/elementwise.GELU, in place (`*=`, `out=`); plain: the formula, an array per operator
  GELU in pieces  its backward's scratch arrays, GELU.piece elements at a time; plain: one piece
  placeholders    what a checkpoint's recompute hands on for an op it skips (tape.placeholder): a
                  zero-stride broadcast of one NaN; plain: a full array of NaN (every block checkpointed)
  tape pruning    Tape.append forgets dead references after the list doubles; plain: it keeps them.
                  Measured on 20 forwards never backpropagated (an evaluation loop with gradients on)

A step is forward, backward, AdamW step, zero_grad. Times are the median CPU
time of REPEATS steps, the two forms of a row taken in turn, round after
round, so a drifting load touches both alike; "ratio" is the median of the
plain form's time over the written form's, round by round (back to back:
the steadier figure on a busy machine). Bytes come from one more step,
exact: the peak that memory.py counts (what the tutorials print) and
tracemalloc's peak (every NumPy buffer and Python object, scratch arrays
included). 1 BLAS thread.

    python benchmarks/lesson_speed.py        # about a minute on 2 cores
"""

import os

os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"

import gc  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
import weakref  # noqa: E402
from contextlib import contextmanager, nullcontext  # noqa: E402

import numpy  # noqa: E402

from tinygrad_ckpt import memory, optim, tape  # noqa: E402
from tinygrad_ckpt.bench import workloads  # noqa: E402
from tinygrad_ckpt.ops.elementwise import GELU, array_module, narrow, wide  # noqa: E402

REPEATS = 7
EVAL_FORWARDS = 20
C = 0.7978845608028654  # sqrt(2 / pi)


# -- the plain forms ---------------------------------------------------------------
def plain_gelu_forward(ctx, x):
    ctx.save_for_backward(x)
    w = wide(x)
    with numpy.errstate(over="ignore"):
        return narrow(0.5 * (1 + array_module(x).tanh(C * (w + 0.044715 * w * w * w))) * w, x.dtype)


def plain_gelu_backward(ctx, g):
    (x,) = ctx.saved_arrays
    w = wide(x)
    with numpy.errstate(over="ignore"):
        t = array_module(x).tanh(C * (w + 0.044715 * w * w * w))
        k = C * w * (1 + 3 * 0.044715 * w * w)
        return narrow(wide(g) * 0.5 * (1 + t) * (1 + k * (1 - t)), g.dtype)


def full_placeholder(shape, dtype, device):
    """A placeholder that takes its bytes: a full array, registered as tape.placeholder registers its base."""
    array = numpy.full(shape, numpy.nan, dtype=dtype)
    tape._placeholder_bases[id(array)] = array
    return array


def append_keeping_dead_references(self, node):
    node.tape, node.index = self, self.count
    self.count += 1
    self.records.append(weakref.ref(node))


@contextmanager
def swapped(owner, **plain):
    """The plain forms in place of owner's attributes inside the block (staticmethods stay static)."""
    kept = {name: owner.__dict__[name] for name in plain}
    for name, value in plain.items():
        setattr(owner, name, staticmethod(value) if isinstance(kept[name], staticmethod) else value)
    try:
        yield
    finally:
        for name, value in kept.items():
            setattr(owner, name, value)


ROWS = [  # (what, checkpointed, swap in the plain form)
    ("GELU fused", False, lambda: swapped(GELU, forward=plain_gelu_forward, backward=plain_gelu_backward)),
    ("GELU in pieces", False, lambda: swapped(GELU, piece=1 << 62)),
    ("placeholders", True, lambda: swapped(tape, placeholder=full_placeholder)),
    ("tape pruning", False, lambda: swapped(tape.Tape, append=append_keeping_dead_references)),
]


def main():
    w2 = workloads.W2
    rng = numpy.random.default_rng(0)
    model = w2.model(rng)
    batch = w2.data(rng)
    optimizer = optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        w2.loss(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad()

    def evaluation():
        for _ in range(EVAL_FORWARDS):
            w2.loss(model, batch)  # gradients on, never backpropagated

    def run(fn, checkpointed, plain, swap):
        (model.gradient_checkpointing_enable if checkpointed else model.gradient_checkpointing_disable)()
        with swap() if plain else nullcontext():
            gc.collect()
            start = time.process_time()
            fn()
            return time.process_time() - start

    def measure(fn, checkpointed, plain, swap):
        gc.collect()
        memory.reset_peak()
        before = memory.total()
        tracemalloc.start()
        run(fn, checkpointed, plain, swap)
        gc.collect()
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return memory.peak()[0] - before, peak, current, len(tape.active().records)

    work = {what: evaluation if what == "tape pruning" else step for what, _, _ in ROWS}
    for what, checkpointed, swap in ROWS:  # a warm-up of each form
        for plain in (False, True):
            run(step, checkpointed, plain, swap)
    times = {(what, plain): [] for what, _, _ in ROWS for plain in (False, True)}
    for _ in range(REPEATS):
        for what, checkpointed, swap in ROWS:
            for plain in (False, True):
                times[what, plain].append(run(step, checkpointed, plain, swap))
    print(f"W2 step ({w2.n_layer} blocks), median CPU time of {REPEATS} steps; bytes exact, from one more run")
    print(f"{'':16}{'form':>12}{'step ms':>10}{'ratio':>7}{'memory.py peak B':>19}{'tracemalloc peak B':>20}   left behind")
    for what, checkpointed, swap in ROWS:
        for plain in (False, True):
            counted, traced, current, references = measure(work[what], checkpointed, plain, swap)
            left = (f"{references} references, {current:,} B after {EVAL_FORWARDS} forwards"
                    if what == "tape pruning" else "")
            ratio = statistics.median(p / a for p, a in zip(times[what, plain], times[what, False]))
            print(f"{what if not plain else '':16}{'plain' if plain else 'as written':>12}"
                  f"{1e3 * statistics.median(times[what, plain]):>10.1f}{ratio:>7.2f}{counted:>19,}{traced:>20,}   {left}")
            if what == "tape pruning":
                tape.active().records = [r for r in tape.active().records if r() is not None]


if __name__ == "__main__":
    main()
