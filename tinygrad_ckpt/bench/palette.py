"""One colour per memory category, per strategy and per phase: the same in every picture.

The PNG plots (plots.py) and the memory explorer page (explorer.py) both
draw with these, so a learner who knows that saved activations are green in
one picture finds them green in the other.

What does not live here: the categories themselves and their order
(memory.CATEGORIES), drawing.
"""

from ..memory import CATEGORIES

# One colour per category, in the order they are stacked: what lives all
# through a step at the bottom, what comes and goes on top.
COLOURS = {"parameters": "#4c72b0", "optimizer": "#8172b3", "accumulation": "#937860",
           "gradients": "#dd8452", "activations": "#55a868", "other": "#c4c4c4"}
STACK = tuple(COLOURS)
assert set(STACK) == set(CATEGORIES), "one colour per memory category"

# One colour and marker per strategy; others get the plotting library's own.
STYLES = {"none": ("#1f77b4", "o"), "every layer": ("#ff7f0e", "^"), "sqrt(n)": ("#2ca02c", "D"),
          "selective": ("#d62728", "P"), "selective, half blocks": ("#e377c2", "X"),
          "budget 50%": ("#9467bd", "s"), "budget 25%": ("#8c564b", "v")}

# The phases of a step (memory.py's event "phase"), as bands behind a timeline.
PHASES = {"forward": "#dbe9f6", "backward": "#fde3c8", "recompute": "#f4b183", "update": "#e0e0e0"}
