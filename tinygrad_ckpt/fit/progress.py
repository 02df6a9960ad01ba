"""A progress bar over the step runs of a fit that takes a while: one line on a terminal's stderr,
rewritten in place as the ops run, once the fit has taken a second; silent elsewhere.

A step of a deep model takes seconds on the meta device (a 2,000-block GPT,
half a minute), and a table runs a dozen or so: the bar says how far it is,
counting the runs done and, within a run, its ops against the run before.
"""

import sys
import time
from contextlib import contextmanager


class Bar:
    def __init__(self, runs, name, stream):
        self.done, self.runs, self.name, self.stream = 0, runs, name, stream
        self.ops, self.ops_per_run = 0, None  # ops of the run under way; of the first run, once done
        self.start = self.shown = time.perf_counter()
        self.drawn = False

    def op(self):
        self.ops += 1
        if self.ops % 256 == 0:
            self.draw()

    def ran(self):
        self.done += 1
        self.runs = max(self.runs, self.done + 1)  # more runs than expected: the planner tried again
        self.ops_per_run, self.ops = self.ops_per_run or self.ops, 0
        self.draw()

    def draw(self):
        now = time.perf_counter()
        if now - self.start < 1 or now - self.shown < 0.25:
            return
        within = min(self.ops / self.ops_per_run, 0.99) if self.ops_per_run else 0.0
        filled = int(20 * (self.done + within) / self.runs)
        self.stream.write(f"\r\033[K{self.name}: [{'#' * filled}{'.' * (20 - filled)}] step {self.done + 1} of about "
                          f"{self.runs} running on the meta device, {now - self.start:.0f} s")
        self.stream.flush()
        self.shown, self.drawn = now, True


bar = None  # the bar of the fit under way, if it is shown


@contextmanager
def shown(runs, name, stream=None):
    """A bar for about `runs` step runs while the block inside runs (where the stream is a terminal)."""
    global bar
    stream = sys.stderr if stream is None else stream
    bar = Bar(runs, name, stream) if hasattr(stream, "isatty") and stream.isatty() else None
    try:
        yield
    finally:
        if bar is not None and bar.drawn:
            stream.write("\r\033[K")  # the bar goes; what is printed next starts on a clean line
            stream.flush()
        bar = None


def op():
    """An op of the step under way ran (the recorder sees its event)."""
    if bar is not None:
        bar.op()


def ran():
    """A step run is done (step._gpt_step says so)."""
    if bar is not None:
        bar.ran()
