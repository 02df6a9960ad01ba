"""Observers: the one way to watch the engine run, for the timeline and every instrument.

An observer is a subclass of `Observer` that overrides the moments it wants;
`with MyObserver() as watcher:` puts it in force inside the block. Observers
nest: every observer in force sees every moment, the outermost first.

    run(name, phase, call)    around each op's forward ("forward", or "recompute":
                              a checkpoint's forward run again) and each record's
                              backward ("backward"): call() computes it; return its result
    on_op(event)              after an op's forward, a record's backward, or a mark
                              (a moment that is not an op: an optimizer step)
    on_track(buffer, category, new)
                              memory.track counted an array: its buffer (.nbytes,
                              .category) became known (new) or gained a holder of
                              `category`; live bytes: memory.tracker.current
    on_free(buffer)           a buffer memory.py knew was freed
    on_reset_peak()           memory.reset_peak(): a new peak measurement starts

An event is a dict: "op" (the op's class name, "Linear", or the mark's,
"AdamW.step"), "phase" ("forward", "backward", "recompute": a checkpointed
segment's second forward and its backward, or "update": the optimizer and
the accumulation buffers) and "kind" ("op", "backward" or "mark"); for an op
put on a tape and its record's backward, "tape" and "record" (the tape's
number and the record's index, tape.Tape); for that op, "saved" and
"saved_parameters" (the bytes its record keeps for backward, parameters left
out as `print(tape)` shows them, and how many parameters it keeps besides);
for any op's forward, "inputs" and "outputs": its arrays, to read during the
call, not to keep.

This is PyTorch's design, made small: its dispatch modes
(`TorchDispatchMode` in torch/utils/_python_dispatch.py, read at commit
00c2d88: `with MyMode():` pushes a mode on a stack, and its
`__torch_dispatch__(func, ...)` runs around each op and calls `func`) and
its profiler's allocation events (`torch.profiler.profile(profile_memory=
True)`, PyTorch 2.13: "track tensor memory allocation/deallocation").
Observers watch; they never change what the engine computes. So three
things that look alike are the engine's own: how a tape runs an op (a
checkpoint's tapes override `Tape.run` to skip, replay or check ops), what
an op keeps for backward (saved-tensor hooks), and the checks that refuse a
wrong result (anomaly mode, versions.py), which raise at the op, before its
result goes on, as PyTorch's anomaly check sits in its engine
(`Engine::evaluate_function` in torch/csrc/autograd/engine.cpp, read at
commit 00c0674).

Off, the engine pays one test of the `observers` list per op and per buffer,
and of `runners` (the observers that override run) per op's computation.

What does not live here: the moments themselves (function.py, tape.py,
memory.py emit them), the timeline (memory.py), the instruments (the lab).
"""

import functools

observers = []  # the observers in force, outermost first
runners = []  # those of them that override run: only these wrap the ops


class Observer:
    """Base class: override the moments you watch (see the module docstring); `with` puts it in force."""

    def run(self, name, phase, call):
        return call()

    def on_op(self, event):
        pass

    def on_track(self, buffer, category, new):
        pass

    def on_free(self, buffer):
        pass

    def on_reset_peak(self):
        pass

    def __enter__(self):
        if self in observers:
            raise RuntimeError(f"{type(self).__name__} is already in force; make another one to nest it")
        observers.append(self)
        if type(self).run is not Observer.run:
            runners.append(self)
        return self

    def __exit__(self, *exc):
        observers.remove(self)
        if self in runners:
            runners.remove(self)


def run(name, phase, call):
    """call() through every observer's run: the innermost first, whose call() goes on to the next one out."""
    for observer in runners:
        call = functools.partial(observer.run, name, phase, call)
    return call()
