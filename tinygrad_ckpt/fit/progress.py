"""A progress bar over the step runs of a fit that takes a while: one line on a terminal's stderr,
rewritten in place after each run once the fit has taken a second; silent elsewhere.

A step of a deep model takes seconds on the meta device (a 2,000-block GPT,
about twenty), and a table runs a dozen or so: the bar says how far it is.
"""

import sys
import time
from contextlib import contextmanager


class Bar:
    def __init__(self, runs, name, stream):
        self.done, self.runs, self.name, self.stream = 0, runs, name, stream
        self.start, self.drawn = time.perf_counter(), False

    def ran(self):
        self.done += 1
        self.runs = max(self.runs, self.done + 1)  # more runs than expected: the planner tried again
        seconds = time.perf_counter() - self.start
        if seconds > 1:
            filled = int(20 * self.done / self.runs)
            self.stream.write(f"\r\033[K{self.name}: [{'#' * filled}{'.' * (20 - filled)}] {self.done} of about "
                              f"{self.runs} steps run on the meta device, {seconds:.0f} s")
            self.stream.flush()
            self.drawn = True


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


def ran():
    """One step run is done (step._gpt_step says so)."""
    if bar is not None:
        bar.ran()
