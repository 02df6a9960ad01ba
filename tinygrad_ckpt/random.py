"""The package's default random generator, and `manual_seed` to seed it.

Randomness is always an explicit `numpy.random.Generator`: a function that
needs it takes an `rng` argument and, when given None, uses the default
generator here (as PyTorch's ops use the global generator that
`torch.manual_seed` seeds). There is no hidden global NumPy state.

Checkpointing must replay random ops exactly (the same dropout mask in the
recompute as in the forward), so it saves and restores generator states;
`generator(rng)` is the one place random ops obtain their generator, which
lets a checkpoint segment see which generators it used.
"""

from contextlib import contextmanager

import numpy

default_generator = numpy.random.default_rng(0)

# While a checkpoint segment runs its forward, the generators it draws from
# are collected here so their states can be restored for the recompute.
_observers = []


def manual_seed(seed):
    """Seed the default generator (as torch.manual_seed does); returns it."""
    default_generator.bit_generator.state = numpy.random.default_rng(seed).bit_generator.state
    return default_generator


def generator(rng=None):
    """The generator a random op should draw from: `rng`, or the default."""
    rng = default_generator if rng is None else rng
    for seen in _observers:
        if all(g is not rng for g, _ in seen):
            seen.append((rng, rng.bit_generator.state))
    return rng


@contextmanager
def observing(on=True):
    """Inside: a list of (generator, its state before its first draw here), filled as random ops draw.

    Observers nest (a checkpoint inside a checkpoint); with on=False the list stays empty.
    """
    seen = []
    if on:
        _observers.append(seen)
    try:
        yield seen
    finally:
        if on:
            _observers.remove(seen)
