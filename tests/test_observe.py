"""Observers (observe.py): every observer in force sees every moment, and what they see adds up.

What must hold: nested observers all see the same events, their `run`s
nest (the innermost first), the buffers they are told of account for every
byte memory.py's total gains and loses, reset_peak is announced, and an
observer leaves when its block does, even on an error.
"""

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygrad_ckpt import Tensor, memory, nn, observe


class Log(observe.Observer):
    def __init__(self, name, log):
        self.name, self.log, self.ops = name, log, []

    def run(self, name, phase, call):
        self.log.append((self.name, name, phase))
        return call()

    def on_op(self, event):
        self.ops.append((event["op"], event["phase"], event["kind"]))


def test_nested_observers_see_the_same_events_and_their_runs_nest_innermost_first():
    x = Tensor(numpy.ones((2, 3)), requires_grad=True)
    log = []
    with Log("outer", log) as outer, Log("inner", log) as inner:
        (x * x).sum().backward()
    assert outer.ops == inner.ops == [("Mul", "forward", "op"), ("Sum", "forward", "op"),
                                      ("Sum", "backward", "backward"), ("Mul", "backward", "backward")]
    assert log == [(who, op, phase) for op, phase in [("Mul", "forward"), ("Sum", "forward"),
                                                      ("Sum", "backward"), ("Mul", "backward")]
                   for who in ("inner", "outer")]
    assert observe.observers == observe.runners == []


def test_only_observers_that_override_run_wrap_the_ops():
    with memory.timeline(), Log("profile", []) as profile, Bytes():
        assert observe.runners == [profile] and len(observe.observers) == 3
    assert observe.observers == observe.runners == []


class Bytes(observe.Observer):
    def __init__(self):
        self.made = self.freed = self.resets = 0

    def on_track(self, buffer, category, new):
        self.made += buffer.nbytes if new else 0

    def on_free(self, buffer):
        self.freed += buffer.nbytes

    def on_reset_peak(self):
        self.resets += 1


@settings(max_examples=20, deadline=None)
@given(depth=st.integers(1, 3), width=st.integers(1, 8), batch=st.integers(1, 4), backward=st.booleans())
def test_the_buffers_made_and_freed_account_for_every_byte_of_the_total(depth, width, batch, backward):
    model = nn.MLP(width, width, width, n_layers=depth, rng=numpy.random.default_rng(0))
    before = memory.total()
    with Bytes() as seen:
        x = Tensor(numpy.ones((batch, width), dtype=numpy.float32))
        loss = model(x).sum()
        if backward:
            loss.backward()
        del x, loss
        memory.reset_peak()
    assert seen.made > 0 and seen.resets == 1
    assert seen.made - seen.freed == memory.total() - before
    model.zero_grad()


def test_an_observer_in_force_twice_is_refused_and_leaves_with_its_block_on_an_error():
    watcher = observe.Observer()
    with pytest.raises(ZeroDivisionError):
        with watcher:
            with pytest.raises(RuntimeError, match="already in force"):
                with watcher:
                    pass
            assert observe.observers == [watcher]
            1 / 0
    assert observe.observers == []
