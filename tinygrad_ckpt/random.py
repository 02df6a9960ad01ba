"""The package's default random generator, and `manual_seed` to seed it.

Randomness is always an explicit `numpy.random.Generator`: a function that
needs it takes an `rng` argument and, when given None, uses the default
generator here (as PyTorch's ops use the global generator that
`torch.manual_seed` seeds). There is no hidden global NumPy state.

Checkpointing must replay random ops exactly (the same dropout mask in the
recompute as in the forward), so it saves and restores generator states;
`generator(rng)` is the one place random ops obtain their generator, which
lets a checkpoint segment see which generators it used.

Observers are found by identity, never by `==`: two observers' lists may be
equal (both empty, or both holding the same generator at the same state) and
still be different segments' (a checkpoint inside a checkpoint), and a
generator's state may hold arrays (MT19937's key), which `==` compares
element by element. `same_state` is the one comparison of two states.
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
            # By identity: list.remove would take the first *equal* list, another segment's.
            for i in range(len(_observers) - 1, -1, -1):
                if _observers[i] is seen:
                    del _observers[i]
                    break


def same_state(a, b):
    """Whether two `bit_generator.state` values are the same state (arrays inside compared as arrays)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, numpy.ndarray) or isinstance(b, numpy.ndarray):
        return numpy.shape(a) == numpy.shape(b) and bool(numpy.array_equal(a, b))
    return bool(a == b)
