"""The one thread limiter (threads.py): it limits every BLAS pool and lifts the limit after; train samples and
verify runs under it; no other module limits threads its own way."""

import argparse
import pathlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from threadpoolctl import threadpool_info

from tinygrad_ckpt import cli, threads
from tinygrad_ckpt.nn import GPT
from tinygrad_ckpt.testing import verify

PACKAGE = pathlib.Path(threads.__file__).parent


def pool_threads():
    """{library path: threads} for every pool threadpoolctl sees now."""
    return {p["filepath"]: p["num_threads"] for p in threadpool_info()}


def test_limited_threads_limits_every_pool_and_lifts_the_limit_after():
    before = pool_threads()
    assert before, "NumPy's BLAS should be a pool threadpoolctl sees"
    with threads.limited_threads(1) as info:
        assert set(pool_threads().values()) == {1}
        assert info["requested"] == 1 and "WARNING" not in info["summary"]
        assert [p["num_threads"] for p in info["threadpoolctl"]] == [1] * len(before)
    assert pool_threads() == before


def test_limited_threads_none_leaves_the_pools_as_they_are():
    before = pool_threads()
    with threads.limited_threads(None) as info:
        assert pool_threads() == before
        assert info["summary"].startswith("not limited")


def test_the_limit_is_lifted_when_the_block_raises():
    before = pool_threads()
    with pytest.raises(KeyError):
        with threads.limited_threads(1):
            raise KeyError("inside")
    assert pool_threads() == before


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_a_thread_count_is_an_int_of_at_least_one(bad):
    with pytest.raises(ValueError, match=r"threads must be an integer of at least 1, got "):
        with threads.limited_threads(bad):
            pass


def test_only_threads_py_imports_threadpoolctl():
    """Principle 13, one thread limiter: every other module asks threads.py."""
    importers = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                       if re.search(r"^\s*(from|import) threadpoolctl", p.read_text(), re.M))
    assert importers == ["threads.py"]


def test_train_samples_on_one_blas_thread_and_trains_on_the_default(monkeypatch, tmp_path, capsys):
    seen = {}
    generate = GPT.generate

    def watched(self, *args, **kwargs):
        seen["sampling"] = set(pool_threads().values())
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(GPT, "generate", watched)
    before = pool_threads()
    text = tmp_path / "tiny.txt"
    text.write_text("the cat sat on the mat. " * 50)
    assert cli.main(["train", "--data", str(text), "--n-layer", "1", "--n-embd", "16", "--n-head", "2",
                     "--block-size", "16", "--max-steps", "1", "--sample-chars", "5", "--disable-tqdm"]) == 0
    assert "sample:" in capsys.readouterr().out
    assert seen["sampling"] == {1}
    assert pool_threads() == before  # training and what follows: BLAS's own count again


def test_train_threads_sets_the_training_steps_threads(monkeypatch, tmp_path, capsys):
    from tinygrad_ckpt.train import Trainer

    seen = {}
    train = Trainer.train

    def watched(self, *args, **kwargs):
        seen["training"] = set(pool_threads().values())
        return train(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train", watched)
    text = tmp_path / "tiny.txt"
    text.write_text("the cat sat on the mat. " * 50)
    assert cli.main(["train", "--data", str(text), "--n-layer", "1", "--n-embd", "16", "--n-head", "2",
                     "--block-size", "16", "--max-steps", "1", "--sample-chars", "0", "--disable-tqdm",
                     "--threads", "2"]) == 0
    assert seen["training"] == {2}


@given(st.integers(-10**6, 10**6))
def test_thread_count_takes_exactly_the_integers_of_at_least_one(n):
    if n >= 1:
        assert threads.thread_count(str(n)) == n
    else:
        with pytest.raises(argparse.ArgumentTypeError, match=f"got '{n}'"):
            threads.thread_count(str(n))


@pytest.mark.parametrize("command", ["train", "verify", "bench"])
@pytest.mark.parametrize("bad", ["0", "-1", "1.5", "two"])
def test_every_command_refuses_a_bad_thread_count_alike(command, bad, capsys):
    with pytest.raises(SystemExit) as exit:  # argparse's own refusal of a flag's value, as for every other flag
        cli.main([command, "--threads", bad])
    assert exit.value.code == 2
    assert f"argument --threads: must be an integer of at least 1, got '{bad}'" in capsys.readouterr().err


@pytest.mark.parametrize("flag, expected", [([], 1), (["--threads", "2"], 2)])
def test_verify_runs_on_its_threads(flag, expected, monkeypatch, capsys):
    seen = {}

    def run(args):  # in place of the table: what the pools are at while it would run
        seen["threads"] = set(pool_threads().values())
        return 0

    monkeypatch.setattr(verify, "_run", run)
    assert cli.main(["verify", "--no-mpi", *flag]) == 0
    assert seen["threads"] == {expected}
