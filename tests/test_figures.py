"""Pictures are rewritten only when the picture changed: bench/plots.py's save and the tutorial harness.

A figure redrawn from data that moved by rounding (another BLAS kernel or
thread count) must leave a committed PNG byte for byte as it was, so that
running the tutorials leaves git status clean on any machine; a figure whose data or labels changed must be written.
"""

import numpy
import pytest

plots = pytest.importorskip("tinygrad_ckpt.bench.plots", reason="matplotlib (the plot extra) is not installed")
plt = plots.plt

from .test_tutorials import _write, harness  # noqa: E402


def _figure(y, title="peak 420 MiB"):
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(y)
    ax.set_title(title)
    return fig


Y = numpy.cumsum(numpy.random.default_rng(0).standard_normal(200))


def test_save_writes_a_new_picture_and_leaves_the_same_one_alone(tmp_path):
    path = tmp_path / "figures" / "curve.png"
    assert plots.save(_figure(Y), path, dpi=100)  # no file yet: written (and its folder made)
    first = path.read_bytes()
    assert not plots.save(_figure(Y * (1 + 1e-6)), path, dpi=100)  # data moved by rounding: left alone
    assert path.read_bytes() == first
    assert plots.save(_figure(Y, title="peak 421 MiB"), path, dpi=100)  # one digit of a label: written
    assert path.read_bytes() != first
    assert plots.save(_figure(Y[::-1]), path, dpi=100)  # other data: written


def test_same_picture_refuses_another_size(tmp_path):
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    plots.save(_figure(Y), a, dpi=100)
    plots.save(_figure(Y), b, dpi=50)
    assert plots.same_picture(a, a.read_bytes()) and not plots.same_picture(a, b)


DRAWS = """```python
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(3, 2))
ax.plot([0, 1, 4, 9])
ax.set_title({title!r})
fig.savefig("figures/drawn.png", format="png", metadata={{"Software": {software!r}}})
```
"""


def test_the_harness_gives_a_redrawn_same_picture_its_old_bytes_back(tmp_path):
    (tmp_path / "work" / "figures").mkdir(parents=True)
    picture = tmp_path / "work" / "figures" / "drawn.png"
    harness.run(_write(tmp_path, DRAWS.format(title="squares", software="one")), workdir=tmp_path / "work")
    committed = picture.read_bytes()
    # the same picture in other bytes (here, other metadata; on another machine, rounding): kept as it was
    harness.run(_write(tmp_path, DRAWS.format(title="squares", software="two")), workdir=tmp_path / "work")
    assert picture.read_bytes() == committed
    # another picture: the new one stays
    harness.run(_write(tmp_path, DRAWS.format(title="cubes", software="two")), workdir=tmp_path / "work")
    assert picture.read_bytes() != committed
