"""The one palette of memory pictures: a colour per memory category, per strategy and per phase.

Every picture that shows memory by category uses these colours (the PNG
plots, plots.py; the memory explorer page, explorer.py; the tutorials' own
pictures), so that activations are the same red in a tutorial's timeline,
in the bench's and on the page (matplotlib: `ax.stackplot(steps, *stacks,
colors=[CATEGORY_COLOURS[c] for c in categories])`):

    >>> from tinygrad_ckpt.memory import CATEGORIES
    >>> CATEGORY_COLOURS["activations"]
    '#C44E52'
    >>> all(c in CATEGORY_COLOURS for c in CATEGORIES)
    True

The categories are memory.py's (memory.CATEGORIES, every one of them here);
the colours are only presentation, so they live here, with the
instruments, rather than in the accounting. Plain hex strings: nothing here
needs matplotlib or Plotly.

What does not live here: the categories themselves (memory.py), the
pictures (plots.py, explorer.py, and the tutorials' own code).
"""

from ..memory import CATEGORIES

# One colour per category, in the order they are stacked: what lives all
# through a step at the bottom, what comes and goes on top.
CATEGORY_COLOURS = {
    "parameters": "#4C72B0",    # blue: the weights
    "optimizer": "#8172B3",     # purple: AdamW's moments
    "accumulation": "#937860",  # brown: GradientAccumulator's buffers
    "gradients": "#DD8452",     # orange: their .grad
    "activations": "#C44E52",   # red: what ops saved for backward
    "other": "#BBBBBB",         # grey: inputs, outputs, tensors in flight
}
STACK = tuple(CATEGORY_COLOURS)
assert set(STACK) == set(CATEGORIES), "one colour per memory category"

# The marks of a checkpointed step's backward, chosen apart from every category's colour
# (the gradients' orange above all, since gradients grow while segments recompute).
RECOMPUTE_COLOUR = "#2CA02C"  # green: a segment running its forward again
SEGMENT_BACKWARD_COLOUR = "#4D4D4D"  # dark grey: the segment's own backward, on its short-lived tape
# Autocast's casts (memory.py's "Cast" events: a 16-bit copy made for an op, a gradient cast back),
# marked on a timeline's total, apart from every category's colour and the recompute marks.
CAST_COLOUR = "#17BECF"  # cyan

# One colour and marker per strategy; others get the plotting library's own.
STYLES = {"none": ("#1f77b4", "o"), "every layer": ("#ff7f0e", "^"), "sqrt(n)": ("#2ca02c", "D"),
          "selective": ("#d62728", "P"), "selective, half blocks": ("#e377c2", "X"),
          "budget 50%": ("#9467bd", "s"), "budget 25%": ("#8c564b", "v")}

# The phases of a step (memory.py's event "phase"), as bands behind a timeline;
# recompute in a light tint of RECOMPUTE_COLOUR.
PHASES = {"forward": "#dbe9f6", "backward": "#fde3c8", "recompute": "#c7e9c0", "update": "#e0e0e0"}
