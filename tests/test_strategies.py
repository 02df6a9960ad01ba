"""The hypothesis strategies users draw from (testing/strategies.py): what they draw is valid, and they need hypothesis only when imported."""

import subprocess
import sys

import numpy
from hypothesis import given
from hypothesis import strategies as st

from tinygrad_ckpt.nn import GPT
from tinygrad_ckpt.schedules import segment_bounds
from tinygrad_ckpt.testing import strategies as tst


@given(n=st.integers(1, 12), data=st.data())
def test_segment_plans_are_what_checkpoint_sequential_takes(n, data):
    plan = data.draw(tst.segment_plans(n))
    bounds = segment_bounds(n, plan)
    assert bounds[0][0] == 0 and bounds[-1][1] == n


@given(n=st.integers(1, 20), data=st.data())
def test_micro_batch_splits_add_up_to_the_batch(n, data):
    sizes = data.draw(tst.micro_batch_splits(n, max_parts=4))
    assert sum(sizes) == n and all(s >= 1 for s in sizes) and 1 <= len(sizes) <= 4


@given(config=tst.gpt_configs(), batch=st.data())
def test_gpt_configs_build_and_padded_batches_fit_them(config, batch):
    model = GPT(config, rng=numpy.random.default_rng(0))
    input_ids, labels = batch.draw(tst.padded_batches(config.vocab_size, config.block_size))
    assert input_ids.shape == labels.shape and input_ids.shape[1] <= config.block_size
    assert (labels != -100).any() and ((labels == -100) | ((labels >= 0) & (labels < config.vocab_size))).all()
    logits, loss = model(input_ids, labels)
    assert logits.shape == (*input_ids.shape, config.vocab_size) and loss.shape == ()


@given(chain=tst.chains())
def test_chains_build_the_same_model_every_time(chain):
    (a, x), (b, y) = chain.build(), chain.build()
    assert len(a) == chain.depth and x.shape == (chain.batch, chain.width) and x.requires_grad == chain.input_grad
    assert all(numpy.array_equal(p.numpy(), q.numpy()) for p, q in zip(a.parameters(), b.parameters()))
    assert numpy.array_equal(x.numpy(), y.numpy())


def test_the_package_imports_without_hypothesis_and_the_strategies_say_how_to_get_it():
    code = ("import sys; sys.modules['hypothesis'] = None\n"  # as if hypothesis were not installed
            "import tinygrad_ckpt, tinygrad_ckpt.testing, tinygrad_ckpt.cli\n"
            "try:\n    import tinygrad_ckpt.testing.strategies\n"
            "except ImportError as e:\n    print(e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("tinygrad_ckpt.testing.strategies draws examples with hypothesis, which is not "
                                 "installed: pip install hypothesis")
