"""How the instruments hand over what they measured: Markdown tables, and files written atomically.

One table renderer (`markdown_table`) for every table the bench, the
comparison and the equivalence checks (testing/) print, so what is printed
is what is written; MiB figures
formatted one way (`mib`); and results files written through the package's
one atomic writer (serialization.atomic_write), so an interrupted run never
leaves half a file in place of a good one.

    >>> print("\\n".join(markdown_table(["strategy", "peak MiB"], [["none", mib(3 * 2**20)]])))
    | strategy | peak MiB |
    |---|---|
    | none | 3.0 |

What does not live here: what goes into the tables (strategies.py,
compare.py), the pictures (plots.py).
"""

import json

import numpy

from ..serialization import atomic_write

MIB = 2**20


def markdown_table(head, rows):
    """Lines of a Markdown table: the header, the rule, one line per row (cells are strings)."""
    for i, row in enumerate(rows):
        if len(row) != len(head):
            raise ValueError(f"markdown_table: row {i} has {len(row)} cells, the header {len(head)}")
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(row) + " |" for row in rows]


def mib(n, digits=1):
    """Bytes as MiB with `digits` decimals; '—' for None (not measured)."""
    return "—" if n is None else f"{n / MIB:.{digits}f}"


def write_text(path, text):
    """Write text to path atomically (UTF-8)."""
    with atomic_write(path, "w") as f:
        f.write(text)


def write_json(path, obj):
    """Write obj as indented JSON to path atomically; NumPy scalars become numbers."""
    write_text(path, json.dumps(obj, indent=1, default=_json_default) + "\n")


def _json_default(x):
    if isinstance(x, numpy.integer):
        return int(x)
    if isinstance(x, numpy.floating):
        return float(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")
