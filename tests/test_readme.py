"""The README's Python example runs as written (a new user copies it first)."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README should show the two techniques in code"
    for block in blocks:
        namespace = {}
        exec(compile(block, str(README), "exec"), namespace)
        assert namespace["optimizer"].params  # it built a model and took optimizer steps
        assert namespace["acc"].items == 0  # the last group was stepped and zeroed
