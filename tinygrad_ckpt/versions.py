"""Versions: a tensor's count of in-place changes, and the checks that keep gradients right.

Every in-place method (tensor.py) bumps its tensor's version, on a counter
shared with its views. A record remembers the version of each array it saved
(Function.apply) and of each tensor it computed (tape.Node); the walk
refuses a record whose saved arrays changed since (`check_versions`,
PyTorch's "modified by an inplace operation" error), and an op refuses an
input changed in place after its record computed it
(`raise_changed_since_recorded`): either way the gradient would be wrong.

What does not live here: the in-place methods (tensor.py), the walk (tape.py).
"""

from . import anomaly


class VersionCounter:
    """How many times a tensor's memory was changed in place; shared by a tensor and its views."""

    value = 0  # a class default: making one runs no __init__ (one per tensor made)


def check_versions(node):
    """Raise if a tensor whose array `node` saved was modified in place since (PyTorch's check).

    `node.ctx.saved_versions` holds (version counter, version when saved, what,
    (dtype, shape)) per saved array that is some tensor's (see Function.apply):
    one integer compare each. Not the array itself: a saved_tensors_hooks pack
    may have moved it (save_on_cpu), and this must not keep it alive.
    """
    for counter, version, what, (dtype, shape) in node.ctx.saved_versions:
        if counter.value != version:
            if isinstance(what, tuple):  # ("input", i) or ("output", j) of this op
                what = f"{what[0]} {what[1]} of {node.describe()}"
            else:  # said by the op itself (a checkpoint's segment inputs)
                what = f"{what}, in {node.describe()}"
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an "
                f"inplace operation: [{dtype} tensor of shape {tuple(shape)}], which is "
                f"{what}, is at version {counter.value}; expected version {version} instead. "
                f"Hint: {_version_hint(node)}"
            )


def _version_hint(node):
    if getattr(node, "stack", None) is None:
        return ("enable anomaly mode to see the line of code that created this record, with "
                "tinygrad_ckpt.autograd.detect_anomaly(). Or write the in-place operation out of place "
                "(y = y * 2, not y.mul_(2)), or change a clone (y2 = y.clone(); y2.mul_(2)).")
    return f"{anomaly.origin(node.stack)}\nThe variable in question was changed there or anywhere later."


def raise_changed_since_recorded(op, inputs):
    """Raise for the input computed by a record that was changed in place since.

    In-place methods are not recorded on the tape (PyTorch records them), so
    such a tensor's record computed other values than it now holds: the
    gradient through it would be wrong. Function.apply (and backward())
    test every computed input with one integer compare, and call this.
    """
    for i, t in enumerate(inputs):
        if t._node is not None and t._version_counter.value != t._recorded_version:
            which = "the tensor" if len(inputs) == 1 else f"input {i}"
            raise RuntimeError(
                f"{op}: {which} (shape {t.shape}) was modified by an inplace operation after "
                f"{t._node.describe()} computed it (version {t._recorded_version} -> "
                f"{t._version_counter.value}). In-place operations are not recorded on the tape, so "
                "the gradient through this tensor would be wrong. Write the in-place operation out "
                "of place (y = y * 2, not y.mul_(2)), or change a clone (y2 = y.clone(); y2.mul_(2))."
            )
