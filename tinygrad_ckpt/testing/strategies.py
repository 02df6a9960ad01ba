"""Hypothesis strategies for property tests of this engine, the ones its own tests draw from.

    >>> from hypothesis import given, settings, strategies as st
    >>> from tinygrad_ckpt.testing import check_checkpoint, strategies as tst   # needs hypothesis
    >>> @settings(max_examples=5, deadline=None, database=None)
    ... @given(chain=tst.chains(), data=st.data())
    ... def test_my_strategy(chain, data):
    ...     model, x = chain.build()
    ...     segments = data.draw(tst.segment_plans(chain.depth))
    ...     check_checkpoint(model, x, strategy=segments, raise_exception=True)
    >>> test_my_strategy()          # no output: every drawn model and plan passed

What each draws:

  shapes, nonscalar_shapes   array shapes of up to 3 axes of 1 to 3 (0-d included in `shapes`)
  broadcast_pairs            two shapes that broadcast together
  arrays, away_from_zero     float64 arrays of a shape (for finite-difference op tests)
  edge_arrays, EDGES         float64 arrays mixing 0, -0.0, +-inf, NaN, huge and tiny values with
                             ordinary ones (for comparing values and gradients with PyTorch's)
  chains                     a `Chain`: Linear -> GELU (-> Dropout) blocks and a batch, as a spec
  gpt_configs                a tiny GPTConfig (layers, heads, width, context, dropout, bias, ties)
  padded_batches             token ids and labels, right-padded and partly ignored (-100)
  segment_plans(n)           what checkpoint_sequential takes for n layers: a count, 'sqrt',
                             'every', boundaries, stored/checkpointed segments, revolve's nested plans
  policies                   None, each ready-made policy, or a SaveOnly of some op names
  micro_batch_splits(n)      micro-batch sizes that add up to n
  layer_costs                a LayerCost, for the planner's own properties

Models are drawn as small specs (`Chain`, `GPTConfig`) plus a seed and built
from them, so a falsifying example prints as a few numbers you can paste,
and a failure shrinks to the smallest model, batch and plan that shows it
(tutorial 10, tutorials/10_how_we_know.md, shows one found and shrunk).

hypothesis is a test-time dependency: importing `tinygrad_ckpt` never needs
it; importing this module does. What does not live here: the checks
themselves (equivalence.py), the tests' hypothesis profiles (tests/conftest.py).
"""

from dataclasses import dataclass

import numpy

try:
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
except ImportError as e:  # what a user without the test extra sees
    raise ImportError(
        "tinygrad_ckpt.testing.strategies draws examples with hypothesis, which is not installed: "
        "pip install hypothesis (or pip install -e '.[test]')"
    ) from e

from .. import nn, policies as ready_made
from ..nn.transformer import GPTConfig
from ..schedules import LayerCost, revolve
from ..tensor import Tensor

__all__ = [
    "shapes", "nonscalar_shapes", "broadcast_pairs", "arrays", "away_from_zero", "EDGES", "edge_arrays", "Chain", "chains",
    "gpt_configs", "padded_batches", "segment_plans", "policies", "micro_batch_splits", "layer_costs",
]


# -- shapes and arrays (the op tests) ----------------------------------------------
def arrays(shape, low=-2.0, high=2.0):
    """float64 arrays of `shape` with values in [low, high]."""
    return hnp.arrays(numpy.float64, shape, elements=st.floats(low, high, allow_nan=False, width=64))


def away_from_zero(shape, low=0.5, high=2.0):
    """float64 arrays with |values| in [low, high] (for division, logs, kinks)."""
    magnitude = arrays(shape, low, high)
    signs = hnp.arrays(numpy.float64, shape, elements=st.sampled_from([-1.0, 1.0]))
    return st.tuples(magnitude, signs).map(lambda ms: ms[0] * ms[1])


# The edges of the ops' domains: signed zeros, infinities, NaN, 1 and -1, near float32's largest (and
# its overflow when squared), a float32 subnormal, exp's overflow (800), and a float64 near-zero.
EDGES = (0.0, -0.0, numpy.inf, -numpy.inf, numpy.nan, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1e-300, 800.0, -800.0,
         3e38, -3e38, 1e20, -1e-40)


def edge_arrays(shape):
    """float64 arrays of `shape` whose elements are edges (EDGES) or ordinary values in [-3, 3]."""
    return hnp.arrays(numpy.float64, shape, elements=st.one_of(st.sampled_from(EDGES), st.floats(-3, 3)))


shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3)
nonscalar_shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3)
broadcast_pairs = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, min_side=1, max_side=3)


# -- models ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Chain:
    """A chain of `depth` blocks Linear(width, width) -> GELU (-> Dropout(p_drop)), and its input.

    A spec, not a model: `build()` makes the model and a (batch, width) input
    from `seed`, the same each time. The dropout masks come from a generator
    of the chain's own (seeded from `seed`), which checkpointing must replay.
    """

    depth: int
    width: int
    batch: int = 2
    p_drop: float = 0.0
    input_grad: bool = True
    seed: int = 0

    def build(self, dtype=numpy.float64, device=None):
        """(nn.Sequential of the blocks, input Tensor (batch, width)); requires_grad on the input if input_grad."""
        init = numpy.random.default_rng(self.seed)
        drop_rng = numpy.random.default_rng(self.seed + 1)
        blocks = []
        for _ in range(self.depth):
            layers = [nn.Linear(self.width, self.width, dtype=dtype, device=device, rng=init), nn.GELU()]
            if self.p_drop:
                layers.append(nn.Dropout(self.p_drop, rng=drop_rng))
            blocks.append(nn.Sequential(*layers))
        x = numpy.random.default_rng(self.seed + 2).standard_normal((self.batch, self.width)).astype(dtype)
        return nn.Sequential(*blocks), Tensor(x, requires_grad=self.input_grad, device=device)


def chains(max_depth=5, max_width=4, max_batch=3, dropout=(0.0, 0.3)):
    """`Chain` specs: depth 1..max_depth, width 1..max_width, batch 1..max_batch, p_drop from `dropout`."""
    return st.builds(
        Chain, depth=st.integers(1, max_depth), width=st.integers(1, max_width), batch=st.integers(1, max_batch),
        p_drop=st.sampled_from(dropout), input_grad=st.booleans(), seed=st.integers(0, 2**16),
    )


@st.composite
def gpt_configs(draw, max_layers=4, max_block_size=8, vocab_size=11, head_sizes=(2, 4), max_heads=2,
                dropout=(0.0, 0.2)):
    """Tiny GPTConfigs: 1..max_layers blocks, 1..max_heads heads of a size from head_sizes.

    Build the model with `GPT(config, rng=numpy.random.default_rng(seed))`,
    and draw its input with `padded_batches(config.vocab_size, config.block_size)`.
    """
    n_head = draw(st.integers(1, max_heads))
    return GPTConfig(
        block_size=draw(st.integers(2, max_block_size)), vocab_size=vocab_size,
        n_layer=draw(st.integers(1, max_layers)), n_head=n_head, n_embd=n_head * draw(st.sampled_from(head_sizes)),
        dropout=draw(st.sampled_from(dropout)), bias=draw(st.booleans()), tie_weights=draw(st.booleans()),
    )


# -- data ---------------------------------------------------------------------------
@st.composite
def padded_batches(draw, vocab_size=7, max_len=6, max_examples=10):
    """(input_ids, labels), int64 (n, T): right-padded sequences with some labels ignored (-100).

    About one label in five inside a sequence is ignored too, so a micro-batch
    cut from the batch may count no token at all; the batch as a whole counts
    at least one (its first label).
    """
    n = draw(st.integers(1, max_examples))
    T = draw(st.integers(1, max_len))
    seed = draw(st.integers(0, 2**16))
    rng = numpy.random.default_rng(seed)
    input_ids = rng.integers(0, vocab_size, size=(n, T))
    labels = rng.integers(0, vocab_size, size=(n, T))
    lengths = rng.integers(1, T + 1, size=n)  # each sequence keeps at least one token
    labels[numpy.arange(T)[None, :] >= lengths[:, None]] = -100  # padding
    labels[rng.random((n, T)) < 0.2] = -100  # and some ignored positions inside
    labels[0, 0] = rng.integers(0, vocab_size)  # the batch counts at least one token
    return input_ids, labels


@st.composite
def micro_batch_splits(draw, n, max_parts=None):
    """Sizes of 1..max_parts micro-batches (default: up to n) that add up to n, each at least 1."""
    most = n if max_parts is None else min(n, max_parts)
    cuts = draw(st.lists(st.integers(1, n - 1), unique=True, max_size=most - 1)) if most > 1 else []
    bounds = [0, *sorted(cuts), n]
    return [b - a for a, b in zip(bounds, bounds[1:])]


# -- checkpointing: where to cut, what to keep ---------------------------------------------
@st.composite
def segment_plans(draw, n):
    """Anything checkpoint_sequential (and gradient_checkpointing_enable) takes for a chain of n layers.

    A segment count, 'sqrt', 'every', a list of boundaries, explicit
    (start, stop, checkpointed) segments mixing stored and checkpointed ones,
    or revolve(n, slots): a nested plan that recomputes some layers more than once.
    """
    kind = draw(st.sampled_from(["count", "sqrt", "every", "boundaries", "segments", "revolve"]), label="kind")
    if kind in ("sqrt", "every"):
        return kind
    if kind == "count":
        return draw(st.integers(1, n), label="segments")
    if kind == "revolve":
        return revolve(n, draw(st.integers(0, max(n - 2, 0)), label="slots"))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=n - 1), label="cuts")) if n > 1 else []
    bounds = [0, *cuts, n]
    if kind == "boundaries":
        return bounds
    stored = draw(st.lists(st.booleans(), min_size=len(bounds) - 1, max_size=len(bounds) - 1), label="checkpointed")
    return [(a, b, c) for a, b, c in zip(bounds, bounds[1:], stored)]


# Op names a policy may choose among (ops/): what the chains and the GPT run.
OP_NAMES = ("Linear", "MatMul", "GELU", "LayerNorm", "Softmax", "Dropout", "Add", "Mul", "Reshape", "Permute",
            "GetItem", "Where")


def policies():
    """None (recompute everything), each ready-made policy, or SaveOnly(some op names), saved or offloaded."""
    made = [ready_made.BY_NAME[name] for name in sorted(ready_made.BY_NAME)]
    own = st.builds(lambda names, offload: ready_made.SaveOnly(*sorted(names), offload=offload),
                    st.sets(st.sampled_from(OP_NAMES), min_size=1, max_size=4), st.booleans())
    return st.one_of(st.none(), st.sampled_from(made), own)


# -- the planner --------------------------------------------------------------------------
layer_costs = st.builds(
    LayerCost, name=st.just("layer"), input_bytes=st.integers(1, 50), saved_bytes=st.integers(0, 200),
    saves_input=st.booleans(), output_bytes=st.just(0), seconds=st.integers(1, 9).map(float),
    # What a recompute runs of a layer: all of it, or less as a segment's last layer (early stop).
    recompute_share=st.just(1.0), last_share=st.sampled_from([1.0, 0.5, 0.25]),
    # Its output that it saves and the next layer keeps too (an LSTM step's h): mostly none.
    shared_output_bytes=st.sampled_from([0, 0, 0, 10, 40]),
)
