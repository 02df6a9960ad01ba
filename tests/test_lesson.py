"""The lesson stays readable: the code a learner follows first fits the budgets the README states.

Lines of code are counted as a reader meets them: docstrings, comments and
blank lines left out. The budgets: about 100 lines for checkpointing's plain
path (checkpoint.py: run the segment without keeping anything, one record
that keeps its inputs; in backward, run it again on a fresh tape and
backpropagate), 80 for the reverse walk (tape.py: order, each record's
backward, gradients added into the inputs, free). A refinement belongs in a
file of its own (recompute.py, policies.py, determinism.py), not here, and
is chosen once, where the segment is made.
"""

import ast
import inspect
import io
import textwrap
import tokenize

import numpy

from tinygrad_ckpt import Tensor, checkpoint, recompute, tape

PLAIN_PATH = [checkpoint.checkpoint, checkpoint.Checkpoint.forward, checkpoint.Checkpoint.backward,
              checkpoint._Segment.forward, checkpoint._Segment.recompute, checkpoint._Segment.running_again,
              checkpoint._ForwardTape]
REVERSE_WALK = [tape.Tape.backward, tape.Tape._walk, tape._deliver]
SKIPPED = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)


def code_lines(obj):
    """Lines of a function's or class's source that hold code: no docstring, comment or blank line."""
    source = textwrap.dedent(inspect.getsource(obj))
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node) is not None:
            docstrings.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
    lines = {token.start[0] for token in tokenize.generate_tokens(io.StringIO(source).readline)
             if token.type not in SKIPPED}
    return len(lines - docstrings)


def test_code_lines_counts_code_only():
    def example(x):
        """A docstring
        of two lines."""
        # a comment

        y = (x +
             1)  # a continued line is one statement, two lines
        return y

    assert code_lines(example) == 4  # def, y = (x +, 1), return


def test_the_plain_recompute_path_reads_on_one_screen():
    counts = {f.__qualname__: code_lines(f) for f in PLAIN_PATH}
    print(f"checkpointing's plain path: {sum(counts.values())} lines of code ({counts})")
    assert sum(counts.values()) <= 100, counts


def test_the_reverse_walk_reads_on_one_screen():
    counts = {f.__qualname__: code_lines(f) for f in REVERSE_WALK}
    print(f"the reverse walk: {sum(counts.values())} lines of code ({counts})")
    assert sum(counts.values()) <= 80, counts


def test_the_refinement_is_chosen_once_and_checkpoint_py_reads_as_the_plain_path():
    """checkpoint.py asks recompute.py one thing, which path runs a segment (recompute.choose), and never
    looks at the planned path's state: no branch on which path it is."""
    tree = ast.parse(inspect.getsource(checkpoint))
    from_recompute = {n.attr for n in ast.walk(tree)
                      if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "recompute"}
    assert from_recompute == {"choose"}
    attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not attributes & {"plain", "full", "notes", "stash", "plan", "out_origins"}, attributes


def test_a_full_recompute_without_a_policy_is_the_plain_path_and_the_default_layers_the_planned_one():
    x = Tensor(numpy.ones((2, 3)), requires_grad=True)

    def path(**options):
        policy, options = options.pop("policy", None), checkpoint.check_options(**options)
        segment = checkpoint._Segment(lambda t: t * t, (x,), {}, options)
        return segment, recompute.choose(segment, policy, options)

    segment, plain = path(early_stop=False)
    assert plain is segment
    for options in (dict(), dict(policy="save_matmuls"), dict(early_stop=False, policy="save_matmuls"),
                    dict(early_stop=False, determinism_check="values", policy="save_matmuls")):
        segment, planned = path(**options)
        assert isinstance(planned, recompute.PlannedRecompute) and planned.segment is segment, options
