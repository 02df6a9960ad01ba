"""The LSTM (nn/lstm.py): PyTorch's numbers, finite differences, checkpointing through time, the language model.

What each group proves:
  * the cell and the layer compute what torch.nn.LSTMCell / torch.nn.LSTM
    compute, from the same state dict, outputs and every gradient, in
    float64 (skipped without PyTorch), and their gradients are the
    derivative of their forward by finite differences (always);
  * checkpointed through time, with any segmentation the GPT takes and any
    policy, every gradient is the plain one bit for bit (a recompute runs
    the same ops on the same arrays), accumulation included;
  * sqrt(T) segments lower the saved-activation peak, and it grows slower
    than T, measured by memory.py;
  * the budget planner over time steps (measure_time_steps, then
    schedules.plan_checkpoints) keeps within its budget, and the peak
    memory.py measures is the plan's predicted one, to the byte;
  * the language model learns the embedded text, the Trainer trains it,
    and bad input gets an error that says what to do.
"""

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, memory, optim, policies
from tinygrad_ckpt.accumulate import GradientAccumulator
from tinygrad_ckpt.data import CharDataset, CharTokenizer, collate, load_text
from tinygrad_ckpt.gradcheck import gradcheck
from tinygrad_ckpt.nn import LSTM, LSTMCell, LSTMConfig, LSTMLanguageModel
from tinygrad_ckpt.schedules import describe, minimum_budget, plan_checkpoints, predict, revolve, segment_bounds
from tinygrad_ckpt.testing import check_accumulation, check_checkpoint
from tinygrad_ckpt.testing import strategies as tst
from tinygrad_ckpt.train import Trainer, TrainingArguments

from .conftest import examples
from .helpers import ATOL, RTOL, TORCH_SKIP

F64 = numpy.float64


def rng(seed=0):
    return numpy.random.default_rng(seed)


def leaf(*shape, seed=1):
    return Tensor(rng(seed).standard_normal(shape), requires_grad=True)


def torch_or_skip():
    return pytest.importorskip("torch", reason=TORCH_SKIP)


def flat(output, state):
    """An LSTM's output and (h_n, c_n) as one 1-D tensor (gradcheck checks one tensor)."""
    h, c = state
    return F.cat([output.reshape(-1), h.reshape(-1), c.reshape(-1)])


def both_runs(torch, theirs, ours, arrays, weights):
    """Forward (x, (h0, c0)) through torch's LSTM and ours, backward of sum(output * weight) over (output,
    h_n, c_n); [(ours, theirs)] for the outputs, h_n, c_n and the gradients of x, h0 and c0."""
    tx, th0, tc0 = (torch.tensor(a, requires_grad=True) for a in arrays)
    out, (h, c) = theirs(tx, (th0, tc0))
    sum((o * torch.tensor(w)).sum() for o, w in zip((out, h, c), weights)).backward()
    mx, mh0, mc0 = (Tensor(a, requires_grad=True) for a in arrays)
    our_out, (our_h, our_c) = ours(mx, (mh0, mc0))
    sum((o * Tensor(w)).sum() for o, w in zip((our_out, our_h, our_c), weights)).backward()
    return [(our_out, out), (our_h, h), (our_c, c), (mx.grad, tx.grad), (mh0.grad, th0.grad), (mc0.grad, tc0.grad)]


# -- PyTorch's numbers ------------------------------------------------------------------------
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_lstm_matches_pytorch_outputs_and_gradients(batch_first, bias):
    torch = torch_or_skip()
    T, B, D, H, L = 5, 3, 4, 6, 2  # steps, batch, input size, hidden size, layers
    torch.manual_seed(0)
    theirs = torch.nn.LSTM(D, H, L, bias=bias, batch_first=batch_first).double()
    ours = LSTM(D, H, L, bias=bias, batch_first=batch_first, dtype=F64)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})  # the same names
    x = rng(1).standard_normal((B, T, D) if batch_first else (T, B, D))
    h0, c0 = rng(2).standard_normal((L, B, H)), rng(3).standard_normal((L, B, H))
    weights = [rng(4 + k).standard_normal(s) for k, s in enumerate([x.shape[:2] + (H,), (L, B, H), (L, B, H)])]

    close = dict(rtol=1e-10, atol=1e-12)
    for mine, theirs_t in both_runs(torch, theirs, ours, (x, h0, c0), weights):
        numpy.testing.assert_allclose(mine.numpy(), theirs_t.detach().numpy(), **close)
    their_params = dict(theirs.named_parameters())
    assert [n for n, _ in ours.named_parameters()] == list(their_params)  # names and order
    for name, p in ours.named_parameters():
        numpy.testing.assert_allclose(p.grad.numpy(), their_params[name].grad.numpy(), **close, err_msg=name)


def test_lstm_cell_matches_pytorch():
    torch = torch_or_skip()
    torch.manual_seed(0)
    theirs = torch.nn.LSTMCell(3, 5).double()
    ours = LSTMCell(3, 5, dtype=F64)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    x, h, c = rng(1).standard_normal((4, 3)), rng(2).standard_normal((4, 5)), rng(3).standard_normal((4, 5))
    th, tc = theirs(torch.tensor(x), (torch.tensor(h), torch.tensor(c)))
    mh, mc = ours(Tensor(x), (Tensor(h), Tensor(c)))
    numpy.testing.assert_allclose(mh.numpy(), th.detach().numpy(), rtol=1e-12, atol=1e-14)
    numpy.testing.assert_allclose(mc.numpy(), tc.detach().numpy(), rtol=1e-12, atol=1e-14)


def test_names_shapes_and_initialisation_are_pytorchs():
    H = 16
    lstm = LSTM(3, H, num_layers=2, rng=rng())
    shapes = {n: p.shape for n, p in lstm.named_parameters()}
    assert shapes == {"weight_ih_l0": (4 * H, 3), "weight_hh_l0": (4 * H, H), "bias_ih_l0": (4 * H,),
                      "bias_hh_l0": (4 * H,), "weight_ih_l1": (4 * H, H), "weight_hh_l1": (4 * H, H),
                      "bias_ih_l1": (4 * H,), "bias_hh_l1": (4 * H,)}
    values = numpy.concatenate([p.numpy().ravel() for p in lstm.parameters()])
    bound = 1 / numpy.sqrt(H)
    assert numpy.abs(values).max() <= bound  # U(-1/sqrt(H), 1/sqrt(H))
    assert values.min() < -0.9 * bound and values.max() > 0.9 * bound  # ... over all of it, not a narrower range
    assert [n for n, _ in LSTM(3, H, bias=False).named_parameters()] == ["weight_ih_l0", "weight_hh_l0"]
    assert [n for n, _ in LSTMCell(3, H).named_parameters()] == ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]


# -- finite differences ---------------------------------------------------------------------
def test_lstm_cell_gradcheck():
    cell = LSTMCell(3, 4, dtype=F64, rng=rng())
    x, h, c = leaf(2, 3, seed=1), leaf(2, 4, seed=2), leaf(2, 4, seed=3)
    assert gradcheck(lambda *_: F.cat(list(cell(x, (h, c))), axis=1), [*cell.parameters(), x, h, c],
                     atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("segments", [None, "sqrt", [0, 1, 3]])
def test_lstm_gradcheck_plain_and_checkpointed(segments):
    lstm = LSTM(2, 3, num_layers=2, batch_first=True, dtype=F64, rng=rng())
    if segments is not None:
        lstm.gradient_checkpointing_enable(segments)
    x, h0, c0 = leaf(2, 4, 2, seed=1), leaf(2, 2, 3, seed=2), leaf(2, 2, 3, seed=3)
    assert gradcheck(lambda *_: flat(*lstm(x, (h0, c0))), [*lstm.parameters(), x, h0, c0], atol=ATOL, rtol=RTOL)


# -- checkpointing through time: the same gradients, bit for bit ------------------------------
LSTM_OPS = ("Linear", "Add", "Split", "Sigmoid", "Tanh", "Mul", "Stack", "Cat", "Reshape", "Permute")


def lstm_policies():
    """Any policy, and policies that keep some of the LSTM's own ops."""
    own = st.builds(lambda names: policies.SaveOnly(*sorted(names)), st.sets(st.sampled_from(LSTM_OPS), min_size=1))
    return st.one_of(tst.policies(), own)


@pytest.mark.equivalence
@settings(max_examples=examples(20))
@given(data=st.data(), T=st.integers(1, 9), num_layers=st.integers(1, 2), batch_first=st.booleans(),
       with_state=st.booleans(), policy=lstm_policies(), seed=st.integers(0, 2**16))
def test_checkpointed_through_time_gives_the_plain_gradients_exactly(data, T, num_layers, batch_first, with_state,
                                                                       policy, seed):
    segments = data.draw(tst.segment_plans(T), label="segments")
    B, D, H = 2, 3, 4  # batch, input size, hidden size
    lstm = LSTM(D, H, num_layers, batch_first=batch_first, dtype=F64, rng=rng(seed))
    x = leaf(*((B, T, D) if batch_first else (T, B, D)), seed=seed + 1)
    inputs = (x, (leaf(num_layers, B, H, seed=seed + 2), leaf(num_layers, B, H, seed=seed + 3))) if with_state else (x,)
    report = check_checkpoint(lstm, inputs, strategy=segments, policy=policy, rtol=0, atol=0, raise_exception=True)
    assert len(report.entries) == 3 + len(list(lstm.parameters())) + 1 + (2 if with_state else 0)  # outputs, grads


@pytest.mark.equivalence
@pytest.mark.parametrize("options", [dict(early_stop=False), dict(determinism_check="values"),
                                     dict(gradient_checkpointing_kwargs={"use_reentrant": False})])
def test_checkpoints_own_options_pass_through(options):
    """checkpoint()'s keywords reach every segment's checkpoint: the plain recompute, the value check."""
    lstm, x = LSTM(2, 3, num_layers=2, dtype=F64, rng=rng()), leaf(6, 2, 2)

    def strategy(model, *inputs):
        model.gradient_checkpointing_enable("sqrt", **options)
        return model(*inputs)

    check_checkpoint(lstm, (x,), strategy=strategy, rtol=0, atol=0, raise_exception=True)
    assert lstm.checkpoint_segments is None  # check_checkpoint put the switch back


def test_every_way_to_cut_time_is_run_and_recomputed():
    """Each strategy really checkpoints (a recompute runs) and cuts where it says (one record per segment)."""
    T = 9
    lstm, x = LSTM(2, 3, dtype=F64, rng=rng()), leaf(T, 2, 2)
    for segments, n_checkpoints in (("every", T), ("sqrt", 3), (4, 4), ([0, 2, 7], 3), (20, T),
                                    ([(0, 4, False), (4, 9, True)], 1), (revolve(T, 2), None)):
        lstm.gradient_checkpointing_enable(segments)
        with memory.timeline() as events:
            output, _ = lstm(x)
            output.sum().backward()
        recorded = sum(e["op"] == "Checkpoint" and e["kind"] == "op" for e in events)
        assert any(e["phase"] == "recompute" for e in events), segments
        if n_checkpoints is not None:
            assert recorded == n_checkpoints, (segments, recorded)


@pytest.mark.equivalence
def test_accumulation_with_checkpointing_through_time():
    model = LSTMLanguageModel(LSTMConfig(vocab_size=7, n_embd=4, hidden_size=5, num_layers=2), rng=rng(),
                              dtype=F64)
    ids = rng(1).integers(0, 7, (6, 8))
    labels = rng(2).integers(0, 7, (6, 8))
    labels[0, 3:] = -100  # uneven token counts: a mean of means would show

    def loss_fn(model, batch):
        logits, _ = model(batch["input_ids"])
        return F.cross_entropy(logits, batch["labels"], reduction="sum")

    batch = {"input_ids": ids, "labels": labels}
    grads = []
    for segments in (None, "sqrt"):
        if segments is None:
            model.gradient_checkpointing_disable()
        else:
            model.gradient_checkpointing_enable(segments)
        check_accumulation(model, loss_fn, batch, splits=[3, 2, 1], raise_exception=True)
        acc = GradientAccumulator(list(model.parameters()), gradient_accumulation_steps=2)
        for part in (slice(0, 4), slice(4, 6)):
            micro = {k: v[part] for k, v in batch.items()}
            loss_fn(model, micro).backward()
            acc.accumulate(int((micro["labels"] != -100).sum()))
        acc.write_grads()
        grads.append([p.grad.numpy().copy() for p in model.parameters()])
        acc.zero_grad()
    for plain, checked in zip(*grads):  # accumulated through checkpoints: bit for bit the plain accumulation
        assert numpy.array_equal(plain, checked)


# -- memory: sqrt(T) segments hold less, and it grows slower than T ----------------------------
def peak_saved(lstm, T, segments):
    """The highest saved-activation bytes above what was live before, over one forward and backward of T steps."""
    lstm.gradient_checkpointing_disable()
    if segments is not None:
        lstm.gradient_checkpointing_enable(segments)
    x = Tensor(rng(1).standard_normal((T, 4, 8)).astype(numpy.float32))
    base = memory.current()["activations"]
    with memory.timeline() as events:
        lstm.zero_grad()
        output, _ = lstm(x)
        output.sum().backward()  # a loss that saves nothing: only the LSTM's own activations count
    return max(e["activations"] for e in events) - base


def test_sqrt_segments_through_time_lower_the_saved_activation_peak():
    lstm = LSTM(8, 16, rng=rng())
    T = 64
    plain, sqrt = peak_saved(lstm, T, None), peak_saved(lstm, T, "sqrt")
    print(f"LSTM(8, 16), B=4, T={T}: saved-activation peak {plain} B plain, {sqrt} B with sqrt(T) segments")
    # sqrt(64) = 8 segments: at most 8 states kept plus one segment (1/8 of the steps) recomputed at a time
    assert sqrt < plain / 2
    # Plain backpropagation through time holds every step: 4 times the steps, 4 times the bytes.
    # Checkpointed, it holds sqrt(T) states and one segment of sqrt(T) steps: about twice.
    plain_4, sqrt_4 = peak_saved(lstm, 4 * T, None), peak_saved(lstm, 4 * T, "sqrt")
    print(f"T={4 * T}: {plain_4} B plain, {sqrt_4} B with sqrt(T) segments")
    assert plain_4 >= 3.9 * plain  # linear in T
    assert sqrt_4 < plain_4 / 3 and sqrt_4 / sqrt < plain_4 / plain  # less, and growing slower


# -- the planner over time steps: a budget in bytes -> where to cut time ----------------------------
def measured_peak(lstm, x, hx=None):
    """memory.py's highest saved-activation bytes above what was live before, over a forward and backward."""
    base = memory.current()["activations"]
    with memory.timeline() as events:
        lstm.zero_grad()
        output, _ = lstm(x, hx)
        output.sum().backward()  # saves nothing: only the LSTM's own activations count
    return max(e["activations"] for e in events) - base


@settings(max_examples=examples(12))
@given(T=st.integers(2, 20), num_layers=st.integers(1, 3), B=st.integers(1, 3), batch_first=st.booleans(),
       input_grad=st.booleans(), with_state=st.booleans(), fraction=st.floats(0.0, 1.0), nested=st.booleans(),
       seed=st.integers(0, 2**16))
def test_the_planner_cuts_time_within_a_budget_and_the_step_holds_what_it_predicts(
        T, num_layers, B, batch_first, input_grad, with_state, fraction, nested, seed):
    """measure_time_steps -> plan_checkpoints -> gradient_checkpointing_enable: the peak memory.py measures is
    the plan's predicted peak, to the byte, within the budget; and so for sqrt and every step; same gradients."""
    D, H = 3, 5
    lstm = LSTM(D, H, num_layers, batch_first=batch_first, rng=rng(seed))
    x = Tensor(rng(seed + 1).standard_normal((B, T, D) if batch_first else (T, B, D)).astype(numpy.float32),
               requires_grad=input_grad)
    hx = tuple(Tensor(rng(seed + k).standard_normal((num_layers, B, H)).astype(numpy.float32), requires_grad=True)
               for k in (2, 3)) if with_state else None
    costs = lstm.measure_time_steps(x, hx, repeats=1, cost="flops")
    assert len(costs) == T
    plain = predict(costs, [(0, T, False)])[0]
    least = minimum_budget(costs, nested)
    budget = int(least + fraction * (plain - least))
    plan = plan_checkpoints(costs, budget, nested)
    assert plan.peak_bytes <= budget
    lstm.gradient_checkpointing_disable()
    assert measured_peak(lstm, x, hx) == plain
    grads = [p.grad.numpy().copy() for p in lstm.parameters()]
    for segments in (plan, "sqrt", "every"):
        lstm.gradient_checkpointing_enable(segments)
        assert measured_peak(lstm, x, hx) == predict(costs, segments)[0], describe(segment_bounds(T, segments))
        assert all(numpy.array_equal(g, p.grad.numpy()) for g, p in zip(grads, lstm.parameters()))


def test_a_tighter_budget_cuts_time_more_and_a_plan_is_for_its_own_length():
    lstm = LSTM(4, 8, num_layers=2, rng=rng())
    x = Tensor(rng(1).standard_normal((32, 2, 4)).astype(numpy.float32))
    costs = lstm.measure_time_steps(x, cost="flops")
    plain = predict(costs, [(0, 32, False)])[0]
    loose, tight = plan_checkpoints(costs, plain // 2), plan_checkpoints(costs, minimum_budget(costs, nested=False), nested=False)
    assert len(tight.segments) > len(loose.segments) and tight.peak_bytes < loose.peak_bytes <= plain // 2
    assert tight.recompute_seconds > loose.recompute_seconds > 0  # less memory, more recompute
    lstm.gradient_checkpointing_enable(loose)
    with pytest.raises(ValueError, match="do not fit a sequence of 16 time steps"):
        lstm(Tensor(numpy.zeros((16, 2, 4), dtype=numpy.float32)))


def test_time_step_costs_count_the_state_and_the_sequence_once():
    """A step's input is every layer's (h, c); the sequence, read by all steps, is counted once, with step 0."""
    T, B, D, H, L = 6, 3, 4, 5, 2
    lstm = LSTM(D, H, num_layers=L, rng=rng())
    x = Tensor(numpy.zeros((T, B, D), dtype=numpy.float32))
    costs = lstm.measure_time_steps(x, repeats=1)
    state = 2 * L * B * H * 4  # h and c of every layer, float32
    assert [c.input_bytes for c in costs] == [state + x.data.nbytes] + [state] * (T - 1)
    assert all(c.saves_input for c in costs)
    # Layer 1 saves layer 0's new h (its input) and so does the next step (its state): counted once.
    assert [c.shared_output_bytes for c in costs] == [(L - 1) * B * H * 4] * (T - 1) + [0]


# -- the language model -------------------------------------------------------------------------
def text_data(n_chars=20000, block_size=32):
    text = load_text()[:n_chars]  # the embedded plays
    tokenizer = CharTokenizer.from_text(text)
    return tokenizer, CharDataset(tokenizer.encode(text), block_size=block_size)


@pytest.mark.backends("numpy")  # learning is the ops' work, which the other tests check on every backend
def test_the_language_model_learns_the_embedded_text():
    tokenizer, data = text_data()
    model = LSTMLanguageModel(LSTMConfig(vocab_size=tokenizer.vocab_size, n_embd=16, hidden_size=32), rng=rng())
    model.gradient_checkpointing_enable("sqrt")  # checkpointed through time: it learns the same
    optimizer = optim.AdamW(model.parameters(), lr=1e-2)
    order, losses = rng(1), []
    for _ in range(30):
        batch = collate([data[int(i)] for i in order.integers(0, len(data), 16)])
        _, loss = model(batch["input_ids"], batch["labels"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    # From about log(vocab) (uniform guessing) to well below it: it learned which characters follow which.
    assert losses[0] > 0.9 * numpy.log(tokenizer.vocab_size)
    assert numpy.mean(losses[-5:]) < 0.8 * losses[0], losses


@pytest.mark.equivalence
@pytest.mark.parametrize("segments", ["every", "sqrt", 3, [0, 5, 6], revolve(8, 1)])
@pytest.mark.parametrize("policy", [None, "save_matmuls"])
def test_the_language_model_checkpointed_gives_the_plain_gradients_exactly(segments, policy):
    model = LSTMLanguageModel(LSTMConfig(vocab_size=9, n_embd=4, hidden_size=6, num_layers=2, dropout=0.2),
                              rng=rng(), dtype=F64)
    ids, targets = rng(1).integers(0, 9, (3, 8)), rng(2).integers(0, 9, (3, 8))
    # Dropout on: the recompute must draw the same masks (check_checkpoint also compares the generators).
    report = check_checkpoint(model, (ids, targets), strategy=segments, policy=policy, rtol=0, atol=0)
    assert report.passed, report
    assert {e.name for e in report.entries} >= {n for n, _ in model.named_parameters()}


def test_check_checkpoint_leaves_the_language_models_switch_as_it_was():
    model = LSTMLanguageModel(LSTMConfig(vocab_size=5, n_embd=3, hidden_size=4), rng=rng(), dtype=F64)
    ids = rng(1).integers(0, 5, (2, 4))
    for before in (None, "every"):  # off stays off; on stays on, as it was
        if before is not None:
            model.gradient_checkpointing_enable(before)
        assert check_checkpoint(model, (ids, ids), strategy="sqrt", rtol=0, atol=0).passed
        assert model.lstm.checkpoint_segments == before


def test_trainer_trains_the_language_model():
    tokenizer, data = text_data(5000, block_size=16)
    model = LSTMLanguageModel(LSTMConfig(vocab_size=tokenizer.vocab_size, n_embd=8, hidden_size=16), rng=rng())
    args = TrainingArguments(per_device_train_batch_size=8, gradient_accumulation_steps=2, max_steps=6,
                             learning_rate=1e-2, logging_steps=1, disable_tqdm=True, seed=0,
                             gradient_checkpointing=True, gradient_checkpointing_kwargs={"segments": "sqrt"})
    trainer = Trainer(model, args, data, tokenizer=tokenizer)
    assert model.lstm.checkpoint_segments == "sqrt"  # the Trainer switched it on
    before = {n: p.numpy().copy() for n, p in model.named_parameters()}
    history = trainer.train()
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert trainer.state.global_step == 6 and len(losses) == 6
    assert all(numpy.isfinite(losses)) and min(losses[-2:]) < losses[0]
    assert all(not numpy.array_equal(before[n], p.numpy()) for n, p in model.named_parameters())


# -- bad input ----------------------------------------------------------------------------------
def test_bad_input_gets_an_error_that_says_what_to_do():
    lstm = LSTM(4, 3, num_layers=2)
    with pytest.raises(ValueError, match=r"input.size\(-1\) must be equal to input_size. Expected 4, got 5"):
        lstm(Tensor(numpy.zeros((6, 2, 5), dtype=numpy.float32)))
    with pytest.raises(ValueError, match=r"3 dimensions .*add a batch axis"):
        lstm(Tensor(numpy.zeros((6, 4), dtype=numpy.float32)))
    with pytest.raises(TypeError, match="input must be a Tensor"):
        lstm(numpy.zeros((6, 2, 4)))
    with pytest.raises(TypeError, match="input is float64, the parameters are float32"):
        lstm(Tensor(numpy.zeros((6, 2, 4))))
    with pytest.raises(ValueError, match="no time steps"):
        lstm(Tensor(numpy.zeros((0, 2, 4), dtype=numpy.float32)))
    x = Tensor(numpy.zeros((6, 2, 4), dtype=numpy.float32))
    with pytest.raises(ValueError, match=r"expected h_0 of shape \(2, 2, 3\)"):
        lstm(x, (Tensor(numpy.zeros((1, 2, 3))), Tensor(numpy.zeros((2, 2, 3)))))
    with pytest.raises(TypeError, match=r"tuple of two Tensors \(h_0, c_0\)"):
        lstm(x, Tensor(numpy.zeros((2, 2, 3))))
    with pytest.raises(ValueError, match=r"LSTMCell: expected input of shape \(batch, input_size=4\)"):
        LSTMCell(4, 3)(Tensor(numpy.zeros((2, 5), dtype=numpy.float32)))


def test_bad_segments_are_refused_at_enable_and_change_nothing():
    lstm = LSTM(2, 3)
    lstm.gradient_checkpointing_enable("sqrt")
    for bad, error, message in ((0, ValueError, "at least 1 segment of time steps, got 0"),
                                ("half", ValueError, "segments must be 'sqrt', 'every'"),
                                ([0, 4, 2], ValueError, "must increase strictly"),
                                (2.5, TypeError, "segments must be an int")):
        with pytest.raises(error, match=message):
            lstm.gradient_checkpointing_enable(bad)
        assert lstm.checkpoint_segments == "sqrt"  # the refused call changed nothing
    with pytest.raises(ValueError, match="policy"):
        lstm.gradient_checkpointing_enable("sqrt", policy="no such policy")


def test_segments_for_another_length_say_so_in_forward():
    lstm = LSTM(2, 3)
    lstm.gradient_checkpointing_enable([(0, 4, True), (4, 8, True)])  # a plan for 8 steps
    lstm(Tensor(numpy.zeros((8, 1, 2), dtype=numpy.float32)))  # fits
    with pytest.raises(ValueError, match="do not fit a sequence of 5 time steps"):
        lstm(Tensor(numpy.zeros((5, 1, 2), dtype=numpy.float32)))
    lstm.gradient_checkpointing_enable(4)  # a count fits any length: at most one segment per step
    output, _ = lstm(Tensor(numpy.zeros((2, 1, 2), dtype=numpy.float32)))
    assert output.shape == (2, 1, 3)


def test_the_state_carries_the_past():
    """Running a sequence in two halves, the second from the first's (h_n, c_n), is running it whole."""
    lstm = LSTM(3, 4, num_layers=2, dtype=F64, rng=rng())
    x = Tensor(rng(1).standard_normal((6, 2, 3)))
    whole, (h, c) = lstm(x)
    first, state = lstm(x[:3])
    second, (h2, c2) = lstm(x[3:], state)
    numpy.testing.assert_array_equal(F.cat([first, second]).numpy(), whole.numpy())
    numpy.testing.assert_array_equal(h2.numpy(), h.numpy())
    numpy.testing.assert_array_equal(c2.numpy(), c.numpy())
