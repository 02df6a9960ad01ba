"""Every micro-batch size from the step run at two: a step is affine in the batch (StepProfile)."""

import dataclasses

import numpy

from .. import memory
from .step import PROFILES, StepMemory, _gpt_step, kept


class StepProfile:
    """One step's memory at every micro-batch size, from the step run at two sizes.

    Every array of a GPT's step is a + b * batch bytes (activations grow with
    the batch; parameters, the causal mask and scalars do not), and the step
    makes the same arrays in the same order at every batch size on a GPU, so
    the bytes at each check are affine in the batch: two runs, at `batch` and
    batch + 1, give them all, exactly (tests/test_fit.py compares with running
    each size). A micro-batch of 1 can make views where larger ones copy (an
    axis of 1 merges with anything): then the runs are at 2 and 3, and `below`
    holds the run at 1. `at(b)` is the step at b; `largest_batch(limit)` the
    largest micro-batch whose peak fits.
    """

    def __init__(self, one, two, batch=1, below=None):
        if len(one.scratch_points) != len(two.scratch_points) or len(one.points) != len(two.points):
            raise ValueError(f"the step makes different arrays at micro-batches {batch} and {batch + 1}")
        p1, p2, s1, s2 = one.points, two.points, one.scratch_points, two.scratch_points
        affine = lambda x1, x2: (x1 - batch * (x2 - x1), x2 - x1)  # noqa: E731 (at batch 0, and per example)
        a, k = affine(p1, p2)
        # A check that another beats at every batch size can never be a peak: only the others are kept
        # (the first of equal ones), in order, for the totals and for each category.
        keep = _front(a.sum(axis=1), k.sum(axis=1))
        for c in range(a.shape[1]):
            keep |= _front(a[:, c], k[:, c])
        self._points = (a[keep], k[keep])
        a, k = affine(s1, s2)
        keep = _front(a, k)
        self._scratch = (a[keep], k[keep])
        self._constant = affine(one.constant_bytes, two.constant_bytes)
        self._flops = affine(one.recomputed_flops, two.recomputed_flops)
        self._forward = affine(one.forward_flops, two.forward_flops)
        self.start, self.batch, self.below = one.start, batch, dict(below or {})

    def at(self, batch_size):
        """The StepMemory of a micro-batch of batch_size examples."""
        if batch_size in self.below:
            return self.below[batch_size]
        points = self._points[0] + self._points[1] * batch_size
        totals = points.sum(axis=1)
        first = int(totals.argmax())  # memory.py keeps the first of equal peaks
        constant = int(self._constant[0] + self._constant[1] * batch_size)
        scratch = self._scratch[0] + self._scratch[1] * batch_size
        device = max(int(totals[first]), int(scratch.max()) if len(scratch) else 0) + constant
        split = dict(zip(memory.CATEGORIES, map(int, points[first])))
        highest = dict(zip(memory.CATEGORIES, map(int, points.max(axis=0))))
        flops = int(self._flops[0] + self._flops[1] * batch_size)
        forward = int(self._forward[0] + self._forward[1] * batch_size)
        return StepMemory(int(totals[first]), split, highest, dict(self.start), device, constant, flops, forward)

    def largest_batch(self, limit, device=True):
        """The largest micro-batch whose peak is at most `limit` bytes (0 if not even 1 fits).

        device: judge by the device peak (StepMemory.device_peak_bytes), else
        by memory.py's peak.
        """
        c0, c1 = self._constant if device else (0, 0)
        a, k = (self._scratch if device else (self._points[0].sum(axis=1), self._points[1].sum(axis=1)))
        a, k = a + c0, k + c1
        grow = k > 0
        if (a[~grow] + k[~grow] * self.batch > limit).any() or (a + k * self.batch > limit).any():
            most = 0  # not even `batch` fits
        else:
            most = int(((limit - a[grow]) // k[grow]).min()) if grow.any() else 1 << 40
        if most < self.batch:  # the sizes run apart
            peak = (lambda s: s.device_peak_bytes) if device else (lambda s: s.peak_bytes)  # noqa: E731
            most = max([b for b, step in self.below.items() if peak(step) <= limit], default=0)
        return most


def _front(a, k):
    """The lines a + k * batch (batch >= 1) that may be the highest at some batch: a boolean mask.

    A line is left out if another is higher at batch 1 and rises at least as
    fast, or is as high at batch 1, rises at least as fast and comes first
    (memory.py keeps the first of equal peaks).
    """
    order = numpy.lexsort((numpy.arange(len(a)), -(a + k)))  # highest at batch 1 first; in order among equals
    steep = k[order]
    before = numpy.maximum.accumulate(numpy.concatenate(([numpy.iinfo(numpy.int64).min], steep[:-1])))
    keep = numpy.zeros(len(a), dtype=bool)
    keep[order[steep > before]] = True  # steeper than every line before it in that order
    return keep


def profile_gpt(config, seq_len, **kwargs):
    """The step at every micro-batch on a GPU: a StepProfile (kwargs as gpt_step's, without batch_size and device).

    Not for the CPU, where GELU and the cross-entropy work in pieces of a fixed
    size: there the step is not affine in the batch; run gpt_step at each size.
    """
    return kept(PROFILES, (repr(config), seq_len, repr(sorted(kwargs.items()))), lambda: _profile(config, seq_len, kwargs))


def _profile(config, seq_len, kwargs):
    step = {**dict(dtype="float32", checkpointing=None, accumulation_dtype=None, optim="adamw", device="cuda",
                   autocast=None), **kwargs}
    return profile(lambda b: _gpt_step(config, b, seq_len, **step))  # with every moment's bytes


def profile(run):
    """A StepProfile from run(b), the StepMemory (with its points) of a micro-batch of b: the runs at 1 and 2,
    or at 2 and 3 where 1 is not like the others (see StepProfile)."""
    one, two = run(1), run(2)
    try:
        return StepProfile(one, two)
    except ValueError:
        return StepProfile(two, run(3), batch=2, below={1: dataclasses.replace(one, points=None, scratch_points=None)})
