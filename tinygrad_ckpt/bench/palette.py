"""The one palette of memory pictures: a colour per memory category, and the recompute marks.

Every picture that shows memory by category uses these colours, so that
activations are the same red in a tutorial's timeline and in the bench's:

    from tinygrad_ckpt.bench.palette import CATEGORY_COLOURS
    ax.stackplot(steps, *stacks, colors=[CATEGORY_COLOURS[c] for c in categories])

The categories are memory.py's (memory.CATEGORIES, every one of them here:
tests/test_bench.py checks it); the colours are only presentation, so they
live here, with the instruments, rather than in the accounting. Plain hex
strings: nothing here needs matplotlib, so a report that draws no PNG can
use them too.

What does not live here: the categories themselves (memory.py), the
pictures (plots.py, and the tutorials' own code).
"""

CATEGORY_COLOURS = {
    "parameters": "#4C72B0",    # blue: the weights
    "gradients": "#DD8452",     # orange: their .grad
    "accumulation": "#937860",  # brown: GradientAccumulator's buffers
    "optimizer": "#8172B3",     # purple: AdamW's moments
    "activations": "#C44E52",   # red: what ops saved for backward
    "other": "#BBBBBB",         # grey: inputs, outputs, tensors in flight
}
# The marks of a checkpointed step's backward, chosen apart from every category's colour
# (the gradients' orange above all, since gradients grow while segments recompute).
RECOMPUTE_COLOUR = "#2CA02C"  # green: a segment running its forward again
SEGMENT_BACKWARD_COLOUR = "#4D4D4D"  # dark grey: the segment's own backward, on its short-lived tape
