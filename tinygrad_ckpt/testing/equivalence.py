"""Equivalence checks: does checkpointing, or accumulation, change any gradient?

    >>> import numpy
    >>> import tinygrad_ckpt.functional as F
    >>> from tinygrad_ckpt import Tensor
    >>> from tinygrad_ckpt.nn import MLP
    >>> from tinygrad_ckpt.testing import check_accumulation, check_checkpoint
    >>> model = MLP(4, 8, 2, n_layers=6, dtype=numpy.float64, rng=numpy.random.default_rng(0))
    >>> x = Tensor(numpy.random.default_rng(1).standard_normal((6, 4)), requires_grad=True)
    >>> report = check_checkpoint(model, x, strategy="sqrt", policy="save_matmuls")
    >>> print(report.summary())
    PASS: MLP.gradient_checkpointing_enable('sqrt', policy='save_matmuls'); 1 output, 15 gradients compared, largest gradient difference 0 (relative 0)
    >>> def loss_fn(model, batch):                      # the SUM of the examples' losses
    ...     x, y = batch
    ...     return F.mse_loss(model(Tensor(x)), Tensor(y), reduction="sum")
    >>> batch = (x.numpy(), numpy.zeros((6, 2)))
    >>> check_accumulation(model, loss_fn, batch, splits=[3, 2, 1]).passed
    True

torch.autograd.gradcheck makes "is this backward the derivative of its
forward?" one call. These make "does this technique leave every gradient as
it was?" one call, for your own model, function or strategy:

  check_checkpoint    runs `fn(*inputs)` plainly and under a checkpoint
                      strategy (a model's gradient_checkpointing_enable
                      segments and policy, checkpoint() with a policy, or a
                      strategy function of your own), from the same random
                      states, and compares the outputs, every gradient (the
                      parameters' and the inputs'), the buffers (BatchNorm's
                      running statistics: updated once, not twice) and where
                      the random generators end.
  check_accumulation  runs a summed loss on a batch whole (divided by its
                      item count) and as micro-batches through a
                      GradientAccumulator (or an accumulator of your own with
                      its methods; optionally across MPI processes), and
                      compares the loss and the gradient the optimizer gets.

Each returns an `EquivalenceReport`: one `Difference` per compared tensor
(largest absolute and relative difference, where, the tolerance), the
worst one, the verdict; `print` it to read it, `bool` it to test it, or
pass `raise_exception=True` to get an `EquivalenceError` (an
AssertionError) that lists the worst tensors. Both work on NumPy and on
CuPy arrays (values are copied to the host, explicitly, to be compared).
Both leave what they touch as they found it: the gradients (`.grad`), the
model's checkpointing switch, its buffers and the random generators.

Tolerances. A tensor passes when

    max |checked - plain|  <=  atol + rtol * max |plain|

over its elements: relative to the tensor's largest value, so an element
that is zero but for rounding (attention's key bias) cannot fail on its own.
Per dtype (`TOLERANCES`): float64 rtol 1e-10, atol 1e-12; float32 rtol
1e-5, atol 1e-6. A recompute runs the same ops on the same arrays, and an
accumulation adds the same terms in another order, so the differences are
zero or rounding (about 1e-16 relative in float64, 1e-7 in float32); a wrong
normalisation or dropout mask is off by 1e-3 or more.

What does not live here: the techniques (checkpoint.py, accumulate.py),
hypothesis strategies for drawing models and plans (strategies.py), the
command that runs these checks on every strategy (verify.py).
"""

import contextlib
import math
from dataclasses import dataclass

import numpy

from .. import backend, random
from ..accumulate import GradientAccumulator
from ..autocast import autocast as autocast_block
from ..autocast import lower_dtype
from ..bench.report import markdown_table
from ..checkpoint import checkpoint
from ..nn import Module
from ..policies import BY_NAME, resolve
from ..schedules import Plan, describe
from ..tape import get_gradient_edge
from ..tensor import Tensor

# (rtol, atol) by dtype; see the module docstring.
TOLERANCES = {"float64": (1e-10, 1e-12), "float32": (1e-5, 1e-6), "float16": (1e-2, 1e-3)}


class EquivalenceError(AssertionError):
    """A technique changed a gradient (or an output, a buffer, a generator); the message lists the worst."""


@dataclass
class Difference:
    """One compared tensor: how far the checked run's values are from the plain run's."""

    name: str  # 'blocks.0.attn.c_attn.weight', 'input 0', 'output 1', 'loss', 'buffer bn.running_mean'
    kind: str  # 'gradient', 'output' or 'buffer'
    shape: tuple
    dtype: str
    max_abs: float  # the largest |checked - plain| over the elements
    scale: float  # the largest |plain|
    tolerance: float  # atol + rtol * scale
    index: tuple = None  # where max_abs is (None when the two agree exactly)
    plain: float = None  # the two values there
    checked: float = None
    note: str = ""  # e.g. 'no gradient in the checked run'

    @property
    def max_rel(self):
        """max_abs relative to the plain run's largest |value| (0 if both are all zeros)."""
        if self.max_abs == 0:
            return 0.0
        return self.max_abs / self.scale if self.scale else math.inf

    @property
    def passed(self):
        return bool(self.max_abs <= self.tolerance)  # False for NaN

    @property
    def excess(self):
        """max_abs / tolerance: above 1 fails; how the worst entry is chosen."""
        if self.max_abs == 0:
            return 0.0
        return self.max_abs / self.tolerance if self.tolerance else math.inf


class EquivalenceReport:
    """What a check compared, and the verdict. True when every entry passed and nothing else differed."""

    def __init__(self, title, entries, problems=(), notes=()):
        self.title = title  # what was checked against what
        self.entries = list(entries)  # one Difference per compared tensor
        self.problems = list(problems)  # differences that are not numbers (a generator ending elsewhere)
        self.notes = list(notes)  # hints that do not change the verdict

    @property
    def passed(self):
        return not self.problems and all(e.passed for e in self.entries)

    def __bool__(self):
        return self.passed

    @property
    def failures(self):
        """The entries beyond their tolerance, worst first."""
        return sorted((e for e in self.entries if not e.passed), key=lambda e: -e.excess)

    @property
    def worst(self):
        """The entry closest to (or furthest beyond) its tolerance; None if nothing was compared."""
        return max(self.entries, key=lambda e: e.excess, default=None)

    def max_abs(self, kind="gradient"):
        """The largest absolute difference among the entries of `kind` (None: every kind)."""
        return max((e.max_abs for e in self.entries if kind in (None, e.kind)), default=0.0)

    def max_rel(self, kind="gradient"):
        """The largest relative difference among the entries of `kind` (None: every kind)."""
        return max((e.max_rel for e in self.entries if kind in (None, e.kind)), default=0.0)

    def summary(self):
        """One line: the verdict and the largest differences."""
        kinds = {}
        for e in self.entries:
            kinds[e.kind] = kinds.get(e.kind, 0) + 1
        counted = ", ".join(f"{n} {kind}{'s' if n > 1 else ''}" for kind, n in kinds.items())
        verdict = "PASS" if self.passed else "FAIL"
        return (f"{verdict}: {self.title}; {counted} compared, largest gradient difference "
                f"{self.max_abs():.3g} (relative {self.max_rel():.3g})")

    def table(self, limit=5):
        """Markdown lines: the `limit` entries closest to (or furthest beyond) their tolerance."""
        shown = sorted(self.entries, key=lambda e: -e.excess)[:limit]
        rows = [[e.name + (f" ({e.note})" if e.note else ""), str(e.shape), e.dtype, f"{e.max_abs:.3g}",
                 f"{e.max_rel:.3g}", f"{e.tolerance:.3g}", _where(e), "ok" if e.passed else "FAIL"] for e in shown]
        head = ["tensor", "shape", "dtype", "max abs diff", "relative", "tolerance", "where: plain vs checked", ""]
        return markdown_table(head, rows)

    def __str__(self, limit=5):
        lines = [self.summary()]
        lines += [f"  {p}" for p in self.problems]
        if self.entries:
            failing = len(self.failures)
            which = (f"all {len(self.entries)}" if len(self.entries) <= limit else
                     f"the {limit} {'furthest beyond' if failing else 'closest to'} their tolerance, of "
                     f"{len(self.entries)}" + (f" ({failing} beyond it)" if failing else ""))
            lines.append(f"{which} (tolerance: atol + rtol x the plain run's largest |value|):")
            lines += self.table(limit)
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __repr__(self):
        return f"<EquivalenceReport {self.summary()}>"

    def raise_if_failed(self):
        """Raise EquivalenceError listing the worst entries (and any other difference) unless it passed."""
        if self.passed:
            return self
        lines = [f"{self.title}: the checked run differs from the plain run"]
        lines += [f"  {p}" for p in self.problems]
        for e in self.failures[:5]:
            lines.append(f"  {e.name}{f' ({e.note})' if e.note else ''}: max |difference| {e.max_abs:.3g} "
                         f"(relative {e.max_rel:.3g}, tolerance {e.tolerance:.3g}) at {_where(e)}")
        if len(self.failures) > 5:
            lines.append(f"  ... and {len(self.failures) - 5} more of {len(self.entries)} compared")
        lines += [f"note: {n}" for n in self.notes]
        raise EquivalenceError("\n".join(lines))


def _where(e):
    """'(3, 1): 0.25 vs 0.5' (index: plain vs checked), or what is known."""
    if e.index is None:
        return "-"
    return f"{e.index}: {e.plain:.6g} vs {e.checked:.6g}"


def tolerance(dtype, rtol=None, atol=None):
    """(rtol, atol) for `dtype`: the given ones, else TOLERANCES' (exact for integers)."""
    name = numpy.dtype(dtype).name
    default = TOLERANCES.get(name, (0.0, 0.0) if numpy.dtype(dtype).kind in "iub" else TOLERANCES["float32"])
    return (default[0] if rtol is None else rtol), (default[1] if atol is None else atol)


def compare(name, kind, plain, checked, rtol=None, atol=None):
    """A Difference between two host arrays (either may be None: no gradient, taken as zeros)."""
    note = ""
    if plain is None and checked is None:
        return Difference(name, kind, (), "-", 0.0, 0.0, 0.0, note="no gradient in either run")
    if plain is None or checked is None:
        note = f"no gradient in the {'plain' if plain is None else 'checked'} run"
        plain = numpy.zeros_like(checked) if plain is None else plain
        checked = numpy.zeros_like(plain) if checked is None else checked
    plain, checked = numpy.asarray(plain), numpy.asarray(checked)
    r, a = tolerance(plain.dtype, rtol, atol)
    if plain.shape != checked.shape:
        return Difference(name, kind, plain.shape, plain.dtype.name, math.inf, 0.0, 0.0,
                          note=f"shape {checked.shape} in the checked run")
    p, c = plain.astype(numpy.float64), checked.astype(numpy.float64)
    same = (p == c) | (numpy.isnan(p) & numpy.isnan(c))
    diff = numpy.where(same, 0.0, numpy.abs(p - c))
    diff = numpy.where(numpy.isnan(diff), math.inf, diff)  # NaN in one run only: as far as it gets
    finite = numpy.abs(p[numpy.isfinite(p)])
    scale = float(finite.max()) if finite.size else 0.0
    if p.size == 0 or not diff.any():
        return Difference(name, kind, plain.shape, plain.dtype.name, 0.0, scale, a + r * scale, note=note)
    index = numpy.unravel_index(int(numpy.argmax(diff)), diff.shape)
    return Difference(name, kind, plain.shape, plain.dtype.name, float(diff[index]), scale, a + r * scale,
                      tuple(int(i) for i in index), float(p[index]), float(c[index]), note)


# -- checkpointing ------------------------------------------------------------------------------
def check_checkpoint(fn, inputs, strategy=None, policy=None, *, split_blocks=None, loss_fn=None, rtol=None,
                     atol=None, raise_exception=False, seed=0, autocast=None):
    """Run fn(*inputs) plainly and checkpointed; compare outputs, gradients, buffers and generators.

    fn: a model with `gradient_checkpointing_enable` (MLP, GPT, nn.Sequential,
        your ChainCheckpointing model), any Module, or a function of tensors.
        Its outputs may nest in tuples and lists (an LSTM's output, (h_n, c_n)):
        they are compared, and handed to loss_fn, as one flat list.
    inputs: a tuple of fn's arguments (tensors, token-id arrays, anything),
        or one tensor. The tensors that require grad must be leaves; their
        gradients are compared with the parameters'.
    strategy: for a model with the switch, what gradient_checkpointing_enable
        takes ('every', the default; 'sqrt', a count, boundaries, a Plan,
        nested segments), with `policy` and (GPT) `split_blocks`. For anything
        else, None runs checkpoint(fn, *inputs, policy=policy). Or a function
        strategy(fn, *inputs) -> fn's outputs: a strategy of your own.
    loss_fn: outputs -> a scalar Tensor to backpropagate. Default: each
        output's sum against fixed random weights (seed), so every element
        of every output that requires grad is checked.
    rtol, atol: see the module docstring (default: by dtype).
    raise_exception: raise EquivalenceError, listing the worst tensors, if it fails.
    autocast: None, or "bfloat16" / "float16": both runs' forwards under
        autocast(autocast) (mixed precision), their backward outside it, as
        a training loop runs them; the recompute must make the same casts.

    Returns an EquivalenceReport. Bad arguments are a ValueError before anything runs.
    """
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    for i, x in enumerate(inputs):
        if isinstance(x, Tensor) and x.requires_grad and not x.is_leaf:
            raise ValueError(f"check_checkpoint: input {i} requires grad but is computed by an op, so it gets no "
                             ".grad to compare; pass a leaf: x.detach() with requires_grad=True")
    title, plain, checked, switch = _checkpoint_strategy(fn, inputs, strategy, policy, split_blocks)
    if autocast is not None:
        lower_dtype(autocast)  # a bad dtype (or bfloat16 without ml_dtypes) is an error before anything runs
        title += f", under autocast({autocast!r})"
    module = fn if isinstance(fn, Module) else None
    names = {id(x): f"input {i}" for i, x in enumerate(inputs) if isinstance(x, Tensor)}
    for n, p in module.named_parameters() if module is not None else ():
        names.setdefault(id(p), n)
    order = {key: k for k, key in enumerate(names)}  # the inputs, then the parameters as the model lists them
    with _restored(module, switch) as state:
        plain_run = _run(plain, loss_fn, None, seed, state, order, autocast)
        leaves = plain_run.leaves
        checked_run = _run(checked, loss_fn, leaves, seed, state, autocast=autocast)
    entries = []
    for k, (p, c) in enumerate(zip(plain_run.outputs, checked_run.outputs)):
        label = "output" if len(plain_run.outputs) == 1 else f"output {k}"
        if p is not None or c is not None:
            entries.append(compare(label, "output", p, c, rtol, atol))
    for k, t in enumerate(leaves):
        name = names.get(id(t), f"tensor {k} {t.shape}")
        entries.append(compare(name, "gradient", plain_run.grads[k], checked_run.grads[k], rtol, atol))
    for name in plain_run.buffers:
        entries.append(compare(f"buffer {name}", "buffer", plain_run.buffers[name], checked_run.buffers[name], rtol, atol))
    problems = _generator_problems(plain_run.generators, checked_run.generators)
    if len(plain_run.outputs) != len(checked_run.outputs):
        problems.append(f"the checked run returned {len(checked_run.outputs)} outputs, the plain run "
                        f"{len(plain_run.outputs)}")
    report = EquivalenceReport(title, entries, problems)
    return report.raise_if_failed() if raise_exception else report


def _checkpoint_strategy(fn, inputs, strategy, policy, split_blocks):
    """(title, plain run, checked run, the model whose switch they turn, or None); bad arguments are errors here."""
    switched = fn if hasattr(fn, "gradient_checkpointing_disable") else None

    def plain():  # with the model's own checkpointing off, whatever the caller had set
        if switched is not None:
            switched.gradient_checkpointing_disable()
        return fn(*inputs)

    if callable(strategy) and not isinstance(strategy, (str, Plan)):
        if policy is not None or split_blocks is not None:
            raise ValueError("check_checkpoint: policy= and split_blocks= choose among the built-in strategies; "
                             "a strategy function applies its own")
        name = getattr(strategy, "__qualname__", None) or type(strategy).__name__

        def own():
            if switched is not None:
                switched.gradient_checkpointing_disable()
            return strategy(fn, *inputs)

        return f"{name}(fn, *inputs) against fn(*inputs)", plain, own, switched
    switch = getattr(fn, "gradient_checkpointing_enable", None)
    if switch is None:
        if strategy is not None or split_blocks is not None:
            raise ValueError(
                f"check_checkpoint: strategy={_describe(strategy)} chooses the segments of a model with "
                f"gradient_checkpointing_enable, which {type(fn).__name__} has not; pass a function "
                "strategy(fn, *inputs), or leave it None to run checkpoint(fn, *inputs, policy=policy)")
        policy = resolve(policy)
        title = "checkpoint(fn, *inputs" + (f", policy={_describe(policy)}" if policy is not None else "") + ")"
        return title, plain, lambda: checkpoint(fn, *inputs, policy=policy), None
    segments = "every" if strategy is None else strategy
    options = {"policy": policy}
    if split_blocks is not None:
        options["split_blocks"] = split_blocks
    state = _switch_state(fn)
    try:
        switch(segments, **options)  # a bad value is an error now, before anything runs
    finally:
        _set_switch_state(fn, state)
    described = ", ".join([_describe(segments)] + [f"{k}={_describe(v)}" for k, v in options.items() if v is not None])

    def checked():
        switch(segments, **options)
        return fn(*inputs)

    return f"{type(fn).__name__}.gradient_checkpointing_enable({described})", plain, checked, fn


def _describe(value):
    for name, made in BY_NAME.items():
        if value is made:
            return name
    if isinstance(value, Plan):
        return f"Plan {describe(value.segments)}"
    if isinstance(value, (list, tuple)) and value and all(isinstance(s, tuple) and len(s) == 3 for s in value):
        return describe(value)
    if callable(value) and hasattr(value, "__qualname__"):
        return value.__qualname__
    return repr(value)


_SWITCH = ("checkpoint_segments", "checkpoint_policy", "checkpoint_options", "checkpoint_split_blocks")


def _switch_state(model):
    """The switch of the model and of every module in it (an LSTM language model keeps it on its LSTM)."""
    holders = model.modules() if isinstance(model, Module) else [model]
    return [(m, {name: getattr(m, name) for name in _SWITCH if hasattr(m, name)}) for m in holders]


def _set_switch_state(model, state):
    for holder, values in state:
        for name, value in values.items():
            setattr(holder, name, value)


@dataclass
class _Run:
    outputs: list  # host copies (None where fn returned None)
    leaves: list  # the tensors that got gradients
    grads: list  # host copies, in the order of leaves
    buffers: dict  # name -> host copy after the run
    generators: dict  # id -> (generator, state after the run)


class _restored:
    """Puts back, on exit, what the runs change: .grad, the switch, buffers, generators; hands each run a clean start."""

    def __init__(self, module, switch_model):
        self.module, self.switch_model = module, switch_model
        self.buffers = list(module.named_buffers()) if module is not None else []
        self.grads = {}  # id -> (tensor, its .grad before the check)
        self.generators = {}  # id -> (generator, state before its first draw)

    def __enter__(self):
        self.switch = _switch_state(self.switch_model) if self.switch_model is not None else []
        self.buffer_values = [(b, b.data.copy()) for _, b in self.buffers]
        return self

    def start(self, leaves):
        """Before a run's backward: the leaves' .grad to None (remembering the caller's)."""
        for t in leaves:
            self.grads.setdefault(id(t), (t, t.grad))
            t.grad = None

    def reset(self):
        """Before the next run: buffers and generators as they were before the check."""
        for b, value in self.buffer_values:
            b.data[...] = value
        for g, state in self.generators.values():
            g.bit_generator.state = state

    def __exit__(self, *exc):
        self.reset()
        for t, grad in self.grads.values():
            t.grad = grad
        if self.switch_model is not None:
            _set_switch_state(self.switch_model, self.switch)
        return False


def _run(call, loss_fn, leaves, seed, state, order=None, autocast=None):
    """One forward and backward of `call`, observed: outputs, gradients, buffers, generators (host copies).

    autocast: the forward's 16-bit dtype (mixed precision), or None.
    """
    state.reset()
    with random.observing() as observed:
        try:
            with autocast_block(autocast) if autocast is not None else contextlib.nullcontext():
                result = call()
            outputs = _flat(result)
            if leaves is None:
                leaves = sorted(_leaves(outputs), key=lambda t: order.get(id(t), len(order)))
                if not leaves:
                    raise ValueError("check_checkpoint: nothing fn returns depends on a tensor that requires "
                                     "grad, so there is no gradient to compare")
            state.start(leaves)
            _loss(outputs, loss_fn, seed).backward()
        finally:
            for g, before in observed:  # to be put back, whatever happened
                state.generators.setdefault(id(g), (g, before))
    return _Run(
        outputs=[_host(o) for o in outputs],
        leaves=leaves,
        grads=[_host(t.grad) for t in leaves],
        buffers={name: _host(b) for name, b in state.buffers},
        generators={id(g): (g, g.bit_generator.state) for g, _ in observed},
    )


def _flat(result):
    """fn's outputs as a flat list: nested tuples and lists unpacked (an LSTM's output, (h_n, c_n))."""
    if isinstance(result, (tuple, list)):
        return [o for r in result for o in _flat(r)]
    return [result]


def _leaves(outputs):
    """The tensors that require grad and that the outputs were computed from, in the order first found."""
    found, seen, stack = {}, set(), []
    for o in outputs:
        if isinstance(o, Tensor) and o.requires_grad:
            if o.is_leaf:
                found.setdefault(id(o), o)
            else:
                stack.append(get_gradient_edge(o)[0])
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for parent, where in node.edges:
            if parent is not None:
                stack.append(parent)
            elif where is not None:
                found.setdefault(id(where), where)
    return list(found.values())


def _loss(outputs, loss_fn, seed):
    """A scalar to backpropagate: loss_fn(outputs), or each output's sum against fixed random weights."""
    if loss_fn is not None:
        single = outputs[0] if len(outputs) == 1 else tuple(outputs)
        return loss_fn(single)
    rng = numpy.random.default_rng(seed)
    total = None
    for o in outputs:
        if not (isinstance(o, Tensor) and o.requires_grad):
            continue
        weights = rng.standard_normal(o.shape).astype(o.dtype)
        term = (o * Tensor(backend.to_device(weights, o.device), device=o.device)).sum()
        total = term if total is None else total + term
    return total


def _host(x):
    """A NumPy copy of a tensor's (or array's) values; None stays None."""
    if x is None:
        return None
    if isinstance(x, Tensor):
        x = x.data
    if isinstance(x, (int, float, numpy.generic)):
        return numpy.asarray(x)
    return numpy.array(backend.to_host(x), copy=True)


def _generator_problems(plain, checked):
    problems = []
    for key, (g, state) in plain.items():
        if key in checked and not random.same_state(checked[key][1], state):
            problems.append("a random generator the run draws from ends in another state than after the plain "
                            "run: the technique drew other random numbers (or more of them)")
    for key in checked.keys() - plain.keys():
        problems.append("the checked run drew from a random generator the plain run never used")
    return problems


# -- accumulation -----------------------------------------------------------------------------------
def check_accumulation(model, loss_fn, batch, splits=2, *, gradient_accumulation_steps=None, num_items=None,
                       accumulator=GradientAccumulator, distributed=None, rtol=None, atol=None,
                       raise_exception=False):
    """Compare the whole batch's mean loss and gradient with the accumulated micro-batches'.

    model: a Module, or a list of parameter tensors (for a model of raw tensors).
    loss_fn(model, batch) -> the SUM of the batch's per-item losses (the
        accumulator's contract: reduction='sum'; this check divides by the
        item count itself). Called on the whole batch and on each micro-batch.
    batch: a dict of arrays (collate's {'input_ids', 'labels'}), a tuple of
        arrays, or one array; micro-batches are cut along the first axis.
    splits: a number of micro-batches of nearly equal size, or their sizes
        ([3, 3, 2]: a short last micro-batch).
    gradient_accumulation_steps: default, the number of micro-batches. More
        than that makes a short last group: the last micro-batch passes
        end_of_data=True, and the group's own items are the divisor.
    num_items(batch) -> int: the items a batch's summed loss counts. Default:
        the labels that are not -100 for a dict with 'labels', else the rows.
    accumulator: GradientAccumulator, or a class of your own with its
        methods (accumulate(num_items, end_of_data), write_grads(), zero_grad()).
    distributed: a distributed.DataParallel (under mpiexec): every process
        takes its share of each micro-batch, as the Trainer shares them, and
        the buffers are all-reduced before write_grads; the whole batch is
        the reference on every process.

    The whole batch and the micro-batches see other shapes, so a model that
    draws random numbers (dropout) or keeps batch statistics (BatchNorm)
    differs for a reason other than the accumulation (tutorial 4); the report
    notes it when the model drew random numbers. Returns an EquivalenceReport.
    """
    parameters = list(model.parameters()) if hasattr(model, "parameters") else list(model)
    if not parameters:
        raise ValueError("check_accumulation: the model has no parameters")
    names = {id(p): n for n, p in model.named_parameters()} if hasattr(model, "named_parameters") else {}
    n = _rows(batch)
    sizes = _split_sizes(n, splits)
    steps = len(sizes) if gradient_accumulation_steps is None else gradient_accumulation_steps
    if not isinstance(steps, int) or steps < len(sizes):
        raise ValueError(f"check_accumulation: gradient_accumulation_steps={steps!r} must be an int of at least the "
                         f"number of micro-batches ({len(sizes)}): they form one group")
    count = _count_items if num_items is None else num_items
    total = int(count(batch))
    if total <= 0:
        raise ValueError("check_accumulation: the batch counts no items (every label -100?): it has no mean loss")
    module = model if isinstance(model, Module) else None
    with _restored(module, None) as state:
        with random.observing() as drew:
            state.start(parameters)
            whole = loss_fn(model, batch)
            (whole / total).backward()
            plain_loss = _host(whole) / total
            plain = [_host(p.grad) for p in parameters]
            for g, before in drew:  # the micro-batches start from the same random states
                state.generators.setdefault(id(g), (g, before))
            state.reset()
            state.start(parameters)
            try:
                checked_loss, checked = _accumulate(model, parameters, loss_fn, batch, sizes, steps, count,
                                                    accumulator, distributed)
            finally:
                for g, before in drew:  # put back at the end, with any the micro-batches drew from first
                    state.generators.setdefault(id(g), (g, before))
    name = getattr(accumulator, "__name__", type(accumulator).__name__)
    title = (f"micro-batches of {sizes} through {name}(gradient_accumulation_steps={steps})"
             + (f" on {distributed.world_size} processes" if distributed is not None else "")
             + f" against the whole batch of {n}")
    entries = [compare("loss", "output", plain_loss, checked_loss, rtol, atol)]
    entries += [compare(names.get(id(p), f"parameter {k} {p.shape}"), "gradient", a, b, rtol, atol)
                for k, (p, a, b) in enumerate(zip(parameters, plain, checked))]
    notes = []
    if drew:
        notes.append("the model drew random numbers (dropout?): the whole batch and its micro-batches draw other "
                     "masks, so they differ whatever the accumulation does; check with dropout off")
    if not entries[0].passed:  # the loss: the micro-batches' sums do not add up to the whole batch's
        notes.append("loss_fn must return the SUM of its batch's per-item losses (reduction='sum'); the check "
                     "divides by the items itself")
    report = EquivalenceReport(title, entries, notes=notes)
    return report.raise_if_failed() if raise_exception else report


def _accumulate(model, parameters, loss_fn, batch, sizes, steps, count, accumulator, distributed):
    """The micro-batches through the accumulator: (mean loss, gradients as host arrays)."""
    acc = accumulator(parameters, gradient_accumulation_steps=steps)
    if distributed is not None:
        distributed.prepare(model, acc)
    summed, counted, start = 0.0, 0, 0
    for k, size in enumerate(sizes):
        rows = numpy.arange(start, start + size)
        start += size
        if distributed is not None:
            rows = distributed.shard(rows)
        part = _take(batch, slice(int(rows[0]), int(rows[-1]) + 1) if len(rows) else slice(0, 0))
        items = int(count(part)) if len(rows) else 0  # an empty share (more processes than rows) adds nothing
        if len(rows):
            loss = loss_fn(model, part)
            loss.backward()
            summed += float(_host(loss))
        counted += items
        acc.accumulate(items, end_of_data=(k == len(sizes) - 1))
    stats = {"loss": summed, "items": counted}
    if distributed is not None:
        distributed.all_reduce_(acc, stats)
    acc.write_grads()
    grads = [_host(p.grad) for p in parameters]
    acc.zero_grad()
    return numpy.asarray(stats["loss"] / stats["items"]), grads


def _rows(batch):
    arrays = list(batch.values()) if isinstance(batch, dict) else list(batch) if isinstance(batch, (tuple, list)) else [batch]
    lengths = {len(a) for a in arrays}
    if len(lengths) != 1:
        raise ValueError(f"check_accumulation: the batch's arrays have different lengths {sorted(lengths)}; "
                         "micro-batches are cut along their first axis")
    return lengths.pop()


def _take(batch, rows):
    def cut(a):
        return Tensor(a.data[rows], device=a.device) if isinstance(a, Tensor) else a[rows]

    if isinstance(batch, dict):
        return {k: cut(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(cut(v) for v in batch)
    return cut(batch)


def _count_items(batch):
    """The labels that count (not -100) of a dict batch with 'labels'; else its rows."""
    if isinstance(batch, dict) and "labels" in batch:
        labels = batch["labels"]
        labels = labels.data if isinstance(labels, Tensor) else labels
        return int((backend.to_host(labels) != -100).sum())
    return _rows(batch)


def _split_sizes(n, splits):
    """Micro-batch sizes from a count (nearly equal, larger first) or from the sizes themselves."""
    if isinstance(splits, bool) or not isinstance(splits, (int, list, tuple)):
        raise TypeError(f"check_accumulation: splits must be a number of micro-batches or a list of their sizes, "
                        f"got {splits!r}")
    if isinstance(splits, int):
        if not 1 <= splits <= n:
            raise ValueError(f"check_accumulation: splits={splits} micro-batches of a batch of {n}: use 1 to {n}")
        size, extra = divmod(n, splits)
        return [size + (1 if i < extra else 0) for i in range(splits)]
    sizes = list(splits)
    if not sizes or any(not isinstance(s, int) or s < 1 for s in sizes) or sum(sizes) != n:
        raise ValueError(f"check_accumulation: splits {sizes} must be micro-batch sizes of at least 1 that add up "
                         f"to the batch's {n} examples")
    return sizes
