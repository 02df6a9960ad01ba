"""Anomaly mode: the first NaN or infinity, forward or backward, named with its op, record and line."""

import os
import traceback

import numpy
import pytest

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, anomaly, autograd, nn, no_grad, tape
from tinygrad_ckpt.checkpoint import checkpoint

HERE = os.path.basename(__file__)
# NumPy warns as it makes the NaNs and infinities these tests plant; the errors are the point.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered", "ignore:divide by zero encountered",
                                        "ignore:overflow encountered")


def line_of(text):
    """The line number in this file of the line containing `text` (how the messages must point here)."""
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "line_of(" not in line)


def test_a_nan_in_forward_names_the_op_the_record_and_the_line():
    x = Tensor([1.0, -2.0], requires_grad=True)
    t = tape.Tape()
    with autograd.detect_anomaly(), tape.recording(t), pytest.raises(RuntimeError) as error:
        h = x * 2.0
        h.log()  # log of -4: NaN
    message = str(error.value)
    assert message.startswith("anomaly mode: Function Log (record #1 on the tape) returned nan values in its output 0 "
                              "during forward.")
    assert f"{HERE}, line {line_of('h.log()  # log of -4')}, in test_a_nan_in_forward" in message
    assert "    h.log()  # log of -4: NaN" in message


def test_an_inf_in_backward_names_the_op():
    x = Tensor([0.0, 1.0], requires_grad=True)
    with autograd.detect_anomaly():
        y = x.sqrt().sum()  # finite forward; the derivative at 0 is infinite
        with pytest.raises(RuntimeError, match=r"Function Sqrt \(record #\d+ on the tape\) returned inf values in "
                                               r"its output 0 during backward \(the gradient of its input 0\)") as error:
            y.backward()
    assert f"line {line_of('x.sqrt().sum()  # finite forward')}" in str(error.value)
    assert x.grad is None  # raised before the gradient reached x


def test_a_nan_from_a_leaf_is_caught_at_the_first_op_that_reads_it():
    w = Tensor([1.0, numpy.nan], requires_grad=True)  # a parameter gone bad
    with autograd.detect_anomaly(), pytest.raises(RuntimeError, match=r"Function Mul .* returned nan values in its "
                                                                      r"output 0 during forward; its input 0 already "
                                                                      r"held nan values"):
        w * 3.0


def test_ops_that_record_nothing_are_checked_too():
    with autograd.detect_anomaly(), pytest.raises(RuntimeError, match=r"Function Log \(not recorded: no input requires "
                                                                      r"grad\) returned nan values"):
        Tensor([-1.0]).log()


def test_an_infinity_passed_in_is_intended_not_an_anomaly():
    # The causal attention mask: -inf filled in, softmax makes it 0.
    x = Tensor(numpy.random.default_rng(0).standard_normal((3, 3)), requires_grad=True)
    mask = numpy.triu(numpy.ones((3, 3), dtype=bool), k=1)
    with autograd.detect_anomaly():
        x.masked_fill(mask, float("-inf")).softmax(axis=-1).sum().backward()
    assert numpy.isfinite(x.grad.numpy()).all()
    with autograd.detect_anomaly(), pytest.raises(RuntimeError, match="Function Exp .* returned inf values"):
        (x * 1000.0).exp()  # an infinity made from finite inputs is one


def test_a_gpt_training_step_runs_clean_in_anomaly_mode():
    config = nn.GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8, dropout=0.1)
    model = nn.GPT(config, rng=numpy.random.default_rng(0))
    idx = numpy.random.default_rng(1).integers(0, 11, (2, 8))
    with autograd.detect_anomaly():
        _, loss = model(idx, idx)
        loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_a_checkpoint_recompute_is_checked_as_a_forward():
    calls = []

    def segment(x):
        calls.append(x)
        scale = 1e4 if len(calls) > 1 else 1.0  # the recompute goes wrong (the same ops), the forward did not
        return (x * scale).exp()

    x = Tensor([-1.0, 2.0], requires_grad=True)
    with autograd.detect_anomaly():
        y = checkpoint(segment, x)
        with pytest.raises(RuntimeError, match=r"Function Exp \(record #1 on the recompute of checkpoint segment "
                                               r"'.*segment'\) returned inf values in its output 0 during forward") as error:
            y.sum().backward()
    assert f"line {line_of('return (x * scale).exp()')}" in str(error.value)


def test_the_initial_gradient_is_checked():
    x = Tensor([1.0, 2.0], requires_grad=True)
    with autograd.detect_anomaly(), pytest.raises(RuntimeError, match="the gradient passed to backward"):
        (x * 2.0).backward(Tensor([1.0, numpy.inf]))


def test_an_in_place_change_names_the_line_that_created_the_record():
    x = Tensor([1.0, 2.0], requires_grad=True)
    with autograd.detect_anomaly():
        y = x.exp()
        loss = y.sum()
        y.mul_(2.0)
        with pytest.raises(RuntimeError, match=r"(?s)output 0 of Exp .* expected version 0 instead\. Hint: The record "
                                               r"was created at .*, line \d+.*changed there or anywhere later") as error:
            loss.backward()
    assert f"line {line_of('y = x.exp()')}" in str(error.value)


def test_no_stack_is_captured_outside_anomaly_mode(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a stack was captured outside anomaly mode")

    monkeypatch.setattr(traceback, "walk_stack", refuse)
    monkeypatch.setattr(anomaly, "capture_stack", refuse)
    x = Tensor([1.0, 2.0], requires_grad=True)
    t = tape.Tape()
    with tape.recording(t):
        loss = F.gelu(x * x).sum()
    assert all(not hasattr(node, "stack") for node in t.nodes())
    loss.backward()
    Tensor([-1.0]).log()  # NaN, unchecked: anomaly mode is off


def test_records_keep_their_stack_in_anomaly_mode():
    x = Tensor([1.0, 2.0], requires_grad=True)
    t = tape.Tape()
    with autograd.detect_anomaly(), tape.recording(t):
        (x * x).sum()
    for node in t.nodes():
        assert any(f.name == "test_records_keep_their_stack_in_anomaly_mode" for f in node.stack)


def test_switches_nest_and_restore():
    assert not autograd.is_anomaly_enabled()
    with autograd.detect_anomaly():
        assert autograd.is_anomaly_enabled()
        with autograd.set_detect_anomaly(False):
            assert not autograd.is_anomaly_enabled()
            with no_grad():
                Tensor([-1.0]).log()  # off here
        assert autograd.is_anomaly_enabled()
    assert not autograd.is_anomaly_enabled()
    autograd.set_detect_anomaly(True)
    try:
        assert autograd.is_anomaly_enabled()
    finally:
        autograd.set_detect_anomaly(False)
    assert not autograd.is_anomaly_enabled()


def test_reachable_as_tinygrad_ckpt_autograd():
    import tinygrad_ckpt

    with tinygrad_ckpt.autograd.detect_anomaly():
        assert tinygrad_ckpt.autograd.is_anomaly_enabled()


@pytest.mark.parametrize("early_stop", [True, False])
def test_a_nan_gradient_inside_a_checkpointed_segment_names_the_op_and_the_line(early_stop):
    # With early stop the Pow's record is rebuilt from the forward's note, not made again: it
    # carries the stack its forward record captured, so the message names the line all the same.
    def segment(x):
        a = x.exp()
        return a ** 0.5  # exp(-1000) is 0 in float64: the derivative 0.5 / sqrt(0) is infinite

    x = Tensor([-1000.0, 1.0], requires_grad=True)
    with autograd.detect_anomaly(), pytest.raises(RuntimeError) as error:
        y = checkpoint(segment, x, early_stop=early_stop)
        y.sum().backward()
    message = str(error.value)
    assert "Function PowScalar (record #1 on the recompute of checkpoint segment" in message
    assert f"{HERE}, line {line_of('return a ** 0.5')}, in segment" in message
    assert "before anomaly mode" not in message
