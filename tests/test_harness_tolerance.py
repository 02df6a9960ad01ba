"""The harness's ```output rtol=X / atol=X blocks: numbers within the tolerance pass, the rest is exact.

A figure that honestly varies from one BLAS kernel or thread count to
another is shown with a tolerance the checker honours; these tests prove the checker honours it and nothing more.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sybil.example import SybilFailure

from .test_tutorials import _write, harness

BLOCK = "```python\nprint({printed!r})\n```\n\n```output{options}\n{shown}\n```\n"


def _run(tmp_path, printed, shown, options):
    harness.run(_write(tmp_path, BLOCK.format(printed=printed, shown=shown, options=options)), workdir=None)


def test_a_relative_tolerance_passes_numbers_within_it_and_fails_those_outside(tmp_path):
    _run(tmp_path, "loss 2.0304 after 20 steps", "loss 2.03 after 20 steps", " rtol=0.01")
    with pytest.raises(SybilFailure, match=r"within rtol=0.01"):
        _run(tmp_path, "loss 2.0704 after 20 steps", "loss 2.03 after 20 steps", " rtol=0.01")
    with pytest.raises(SybilFailure):  # without the option the same figure must be exact
        _run(tmp_path, "loss 2.0304 after 20 steps", "loss 2.03 after 20 steps", "")


def test_the_words_and_the_count_of_numbers_are_still_exact(tmp_path):
    with pytest.raises(SybilFailure):
        _run(tmp_path, "loss 2.03 after 20 steps", "gain 2.03 after 20 steps", " rtol=0.5")
    with pytest.raises(SybilFailure):
        _run(tmp_path, "loss 2.03 after 20 steps, 3 skipped", "loss 2.03 after 20 steps", " rtol=0.5")


def test_an_absolute_tolerance_covers_numbers_near_zero(tmp_path):
    _run(tmp_path, "error 3e-09", "error 0", " atol=1e-8")
    with pytest.raises(SybilFailure):
        _run(tmp_path, "error 3e-09", "error 0", " rtol=0.5")  # no fraction of 0 covers 3e-09


def test_an_unknown_option_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="unknown option 'tol=0.1'"):
        _run(tmp_path, "1", "1", " tol=0.1")


@given(shown=st.floats(0.01, 1e6), fraction=st.floats(-0.99, 0.99), rtol=st.sampled_from([0.001, 0.01, 0.1]))
def test_matches_is_exactly_the_stated_relative_bound(shown, fraction, rtol):
    printed = shown * (1 + fraction * rtol * 2)  # half inside the bound, half outside
    text_shown, text_printed = f"{shown:.6e}", f"{printed:.6e}"
    inside = abs(float(text_printed) - float(text_shown)) <= rtol * abs(float(text_shown))
    assert harness._matches(f"x {text_shown}\n", f"x {text_printed}\n", f"output rtol={rtol}") == inside
