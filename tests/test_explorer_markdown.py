"""The explorer page's tables section: bench.md's Markdown rendered by markdown-it-py (bench/explorer.py).

What the page adds to plain CommonMark: headings one level down (the page's
title is its one h1), each table in a scrolling div, numbers right-aligned
(class "num"); and every word of bench.md reaches the page, nothing dropped.
"""

from html.parser import HTMLParser

import pytest

pytest.importorskip("plotly", reason="the memory explorer page needs Plotly (pip install -e \".[report]\")")
pytest.importorskip("markdown_it", reason="the memory explorer page needs markdown-it-py (pip install -e \".[report]\")")

from tinygrad_ckpt.bench import explorer  # noqa: E402
from tinygrad_ckpt.bench.report import markdown_table  # noqa: E402


class _Cells(HTMLParser):
    """Every element's tag and class, and the text of each cell, in order."""

    def __init__(self):
        super().__init__()
        self.tags, self.cells, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs).get("class")))
        if tag in ("td", "th"):
            self.cells.append((tag, dict(attrs).get("class"), ""))

    def handle_data(self, data):
        self.text.append(data)
        if self.cells and self.tags[-1][0] in ("td", "th"):
            tag, cls, text = self.cells[-1]
            self.cells[-1] = (tag, cls, text + data)


def test_bench_markdown_renders_with_the_page_s_touches():
    rows = [["none", "12.5", "1.00", "—", "60% (69% in full)"], ["sqrt", "-3e-05", "+2", "—", "a_b <c> & d"]]
    text = "# bench (tiny set)\n\nmachine: two CPUs\nand a second line.\n\n## W1\n\n" + "\n".join(
        markdown_table(["strategy", "peak MiB", "step ×", "note", "plan"], rows)) + "\n"
    parser = _Cells()
    parser.feed(explorer.markdown_html(text))
    headings = [tag for tag, _ in parser.tags if tag.startswith("h")]
    assert headings == ["h2", "h3"]  # one level down: the page's title is its h1
    assert [t for t in parser.tags if t[0] in ("div", "table")] == [("div", "table"), ("table", None)]
    body = [(cls, text.strip()) for tag, cls, text in parser.cells if tag == "td"]
    numeric = {"12.5", "1.00", "—", "-3e-05", "+2"}
    assert body == [("num" if cell in numeric else None, cell) for row in rows for cell in row]
    words = " ".join("".join(parser.text).split())
    assert "machine: two CPUs and a second line." in words and "a_b <c> & d" in words  # escaped, not dropped


def test_the_page_s_style_and_glue_ship_with_the_package():
    # bench/templates/, package data (pyproject.toml): the page inlines both.
    assert ".listing td" in explorer._CSS and "Plotly.newPlot" in explorer._GLUE
    page = explorer._page("t", "", [], [], None, None)
    assert f"<style>{explorer._CSS}</style>" in page and f"<script>{explorer._GLUE}</script>" in page
