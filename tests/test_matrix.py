"""The matrix: every model kind x every technique x every entry point, one property suite.

Each cell is one test id, `test_cell[<kind>-<technique>-<entry>]`; hypothesis draws the model's sizes, the
batch, the micro-batch splits and the checkpointing strategy (tests/conftest.py's profiles: `ci`, the default,
draws PER_CELL = 2 examples a cell; `thorough` 25). On 2026-12-06, on a 2-core Intel Xeon shared with other
jobs (OPENBLAS_NUM_THREADS=1), the 176 tests took 22 s under `ci` at a quiet moment and 2.5 min at load 4 to 5
(21 to 26 s of CPU time), and 12.5 min under `thorough` at that load (4.6 min of CPU time). Hypothesis does not
shrink a failing cell here (minutes a cell): its draw is printed as found.

Kinds: mlp (MLP), cnn (CNN: Conv2d, BatchNorm2d, max-pool), lstm (LSTM language model, checkpointed through
time), encoder (BERT's kind), gpt.

Techniques, and what must hold (float64 runs for the first three, float32 models for the 16-bit ones):

| technique             | the property                                                                            |
|-----------------------|-----------------------------------------------------------------------------------------|
| accumulate            | uneven micro-batches through the accumulator give the whole batch's mean loss and       |
|                       | gradient within 1e-10 (relative to each tensor's largest value; a sum in another order) |
| checkpoint            | a drawn strategy the kind takes (segment_plans: a count, 'sqrt', 'every', boundaries,   |
|                       | stored/checkpointed segments, revolve's nested plans; any policy; the GPT's split       |
|                       | blocks; dropout drawn) gives the plain run's loss and gradients bit for bit             |
| accumulate+checkpoint | both: checkpointed accumulated == plain accumulated bit for bit, == the whole batch     |
|                       | within 1e-10                                                                            |
| bf16, fp16            | the 16-bit run is within the stated tolerance of the float32 run (LOSS_TOLERANCE, and   |
|                       | GRADIENT_TOLERANCE for all the gradients as one vector; the CNN's wider, see there);    |
|                       | in the loop, the products (Linear, MatMul, Conv2d) take 16-bit inputs                   |
| all-bf16, all-fp16    | accumulation + checkpointing + 16 bits: the checkpointed 16-bit run equals the plain    |
|                       | 16-bit run bit for bit (both accumulated), and is within the tolerance of float32's     |

Entry points, and how each cell is proven there:

| entry          | what runs                                                                              |
|----------------|----------------------------------------------------------------------------------------|
| loop           | a hand-written loop: forward and loss under autocast, backward, GradientAccumulator      |
| trainer        | Trainer(compute_loss_func=the kind's loss), SGD; micro-batches of a drawn B, the last    |
|                | short (the data set is not a multiple of B); the gradient the optimizer gets, compared   |
|                | with the loop's over the very micro-batches the Trainer collated (bit for bit; fp16:    |
|                | the loss scale is a power of two, so within the tolerance of the float32 loop)          |
| trainer-own    | the same Trainer without compute_loss_func: its own loss, for the kinds whose forward    |
|                | takes token ids and returns (logits, loss) (lstm, encoder, gpt). mlp and cnn: not       |
|                | meaningful (their batches hold no token ids): the cell proves the Trainer refuses       |
|                | their batch with an error that names compute_loss_func                                  |
| estimate_step  | fit.estimate_step on the meta device: its peak and its split at the peak equal a real    |
|                | Trainer step's tracked ones to the byte (accumulation: a step of uneven micro-batches   |
|                | peaks as its largest micro-batch alone); 16-bit: also, at a batch where activations     |
|                | outweigh the 16-bit weight copies (tutorial 12's small sizes, the MLP 4 blocks of 256,  |
|                | a drawn batch of 512 to 2048, on the meta device only; checkpointing every link and     |
|                | sqrt(n)), the 16-bit step's highest saved activations are below float32's (the step's   |
|                | peak need not be: below)                                                                |
| checkers       | the public checkers: check_checkpoint (rtol=atol=0: bit for bit; with autocast= for     |
|                | 16 bits), check_accumulation (default float64 tolerance, 1e-10; 16 bits: the loss under |
|                | autocast, atol = the gradient tolerance x the largest gradient), and 16 bits against    |
|                | float32 as check_checkpoint with a strategy of one's own (the forward under autocast):  |
|                | each gradient's largest difference within the gradient tolerance x the largest gradient |

Not meaningful as stated, and the alternative proven instead (as tutorial 12 does): BatchNorm in training mode
normalises each micro-batch by its own statistics, so accumulated micro-batches do not give the whole batch's
update (tests/test_cnn.py shows the whole-batch check failing). Every cnn cell with accumulation proves
instead (a) that the accumulated gradient is the mean of the micro-batches' own gradients, each run alone
(within 1e-10), and (b) in eval mode (running statistics, each image on its own) that it is the whole batch's
(within 1e-10; loop and checkers, as check_accumulation can put a model in eval mode).

Where 16 bits do not lower the step's peak, though they lower its saved activations (measured on the meta
device, batch 512, autocast's lists with conv2d, lstm_cell and BatchNorm's 16-bit output):
  * lstm with sqrt(n) segments of time steps: 106.0 MB against float32's 99.4 MB. The peak is at the loss,
    where cross-entropy (on the float32 list) holds a float32 copy of the 16-bit logits beside them
    ('other': 50.3 MB against 33.6 MB), more than the 10.2 MB of activations that 16 bits save there.
    Without checkpointing (170.6 against 212.7 MB) and every step checkpointed (120.7 against 128.8) the
    peak is lower. PyTorch's cross_entropy is on its float32 list too.

What does not live here: the per-kind unit tests (test_cnn.py, test_lstm.py, test_encoder.py), the GPT's
fuller proofs (test_amp.py, test_equivalence.py), fit's table (test_fit.py), the command line.
"""

import contextlib
import gc
import math
from dataclasses import dataclass

import numpy
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, backend, fit, memory, tape
from tinygrad_ckpt.accumulate import GradientAccumulator
from tinygrad_ckpt.autocast import autocast, lower_dtype
from tinygrad_ckpt.data import stack_collate
from tinygrad_ckpt.grad_scaler import GradScaler
from tinygrad_ckpt.nn import CNN, GPT, MLP, CNNConfig, Encoder, EncoderConfig, GPTConfig, LSTMConfig, LSTMLanguageModel
from tinygrad_ckpt.policies import BY_NAME
from tinygrad_ckpt.schedules import Plan
from tinygrad_ckpt.testing import check_accumulation, check_checkpoint
from tinygrad_ckpt.testing import strategies as tst
from tinygrad_ckpt.train import Trainer, TrainingArguments

pytest.importorskip("ml_dtypes", reason="bfloat16 on the CPU needs ml_dtypes: pip install -e \".[bf16]\"")

PER_CELL = max(2, settings.default.max_examples // 120)  # ci: 2, dev: 2, thorough: 25
# The 16-bit run against float32, on the same micro-batches: the loss relative to itself (LOSS_TOLERANCE), the
# gradients as one vector, |g16 - g32| / |g32| (GRADIENT_TOLERANCE). bfloat16 keeps 8 significant bits (a rounding
# is up to 0.4 %), float16 11 (0.05 %). The 16-bit cells draw models wide enough that one rounding does not decide a
# gradient (widths of 4 and more, attention heads of 8 and 16). The largest seen over 100 draws a kind, splits
# drawn: bfloat16 2.1 % to 2.9 % of the gradient (the GPT 0.5 %), float16 0.1 % to 0.7 %; the losses 0.5 % and
# 0.03 % at most. The CNN's are larger (26 % and 8 %): max-pooling keeps the largest of four values and ReLU cuts at
# zero, so a rounding that reorders near-equal values sends a gradient elsewhere. A silently float32 run passes
# these; the loop's check that the products take 16-bit inputs does not.
LOSS_TOLERANCE = {"bfloat16": 0.02, "float16": 0.005}
GRADIENT_TOLERANCE = {"bfloat16": 0.1, "float16": 0.02}
CNN_GRADIENT_TOLERANCE = {"bfloat16": 0.6, "float16": 0.25}
F64 = numpy.float64


# -- the kinds: a drawn model and batch ------------------------------------------------------------
@dataclass
class Case:
    kind: str
    make: object  # (dtype, device) -> the model, the same weights each time
    batch: dict  # field -> numpy array, one row an example
    chain: int  # the length of the chain checkpointing cuts (the LSTM: its time steps)
    dropout: bool  # the model draws dropout masks

    @property
    def n(self):
        return len(next(iter(self.batch.values())))

    def examples(self):
        return [{k: v[i] for k, v in self.batch.items()} for i in range(self.n)]

    def inputs(self, model):
        """What the model's forward takes, for check_checkpoint."""
        if "x" in self.batch:
            return (Tensor(self.batch["x"].astype(_dtype(model)), requires_grad=True),)
        return (self.batch["input_ids"],)


def _dtype(model):
    return next(iter(model.parameters())).dtype


def kind_loss(model, batch):
    """(the SUM of the batch's cross-entropies, items): the Trainer's compute_loss_func, for every kind."""
    p = next(iter(model.parameters()))
    if "x" in batch:
        out = model(Tensor(batch["x"].astype(p.dtype), device=p.device))
        labels = batch["y"]
    else:
        out, labels = model(batch["input_ids"]), batch["labels"]
    logits = out[0] if isinstance(out, tuple) else out  # the CNN and the token models return (logits, loss)
    return F.cross_entropy(logits, backend.to_device(labels, logits.device), reduction="sum"), int(labels.size)


def _seed(draw):
    return draw(st.integers(0, 2**16), label="seed")


@st.composite
def mlp_cases(draw, dropout, wide=False):
    d_in, hidden, out, layers = (draw(st.integers(1 + 3 * wide, 5 + 3 * wide)), draw(st.integers(1 + 7 * wide, 6 + 10 * wide)),
                                 draw(st.integers(2, 4)), draw(st.integers(1, 4)))
    activation, n, seed = draw(st.sampled_from(["gelu", "relu", "tanh"])), draw(st.integers(1, 6)), _seed(draw)
    rng = numpy.random.default_rng(seed + 1)
    return Case("mlp", lambda dtype, device=None: MLP(d_in, hidden, out, layers, activation, dtype=dtype, device=device,
                                                      rng=numpy.random.default_rng(seed)),
                {"x": rng.standard_normal((n, d_in)), "y": rng.integers(0, out, n)}, layers, False)


@st.composite
def cnn_cases(draw, dropout, wide=False):
    widths = tuple(draw(st.lists(st.integers(1 + 3 * wide, 3 + 5 * wide), min_size=1, max_size=2)))
    config = CNNConfig(image_size=2 ** len(widths) * draw(st.integers(1 + 3 * wide, 2 + 3 * wide)),
                       in_channels=draw(st.integers(1, 2)),
                       n_classes=draw(st.integers(2, 3)), widths=widths, convs_per_stage=draw(st.integers(1, 2)))
    n, seed = draw(st.integers(1 + 3 * wide, 5 + 3 * wide)), _seed(draw)
    rng = numpy.random.default_rng(seed + 1)
    S = config.image_size
    return Case("cnn", lambda dtype, device=None: CNN(config, rng=numpy.random.default_rng(seed), dtype=dtype,
                                                      device=device),
                {"x": rng.standard_normal((n, config.in_channels, S, S)), "y": rng.integers(0, config.n_classes, n)},
                len(widths), False)


def _tokens(rng, n, T, vocab, classes=None):
    """Token ids (n, T) and their labels: the next tokens (n, T), or one class a sequence (n,)."""
    labels = rng.integers(0, vocab, (n, T)) if classes is None else rng.integers(0, classes, n)
    return {"input_ids": rng.integers(0, vocab, (n, T)), "labels": labels}


@st.composite
def lstm_cases(draw, dropout, wide=False):
    config = LSTMConfig(vocab_size=draw(st.integers(2, 8)), n_embd=draw(st.integers(1 + 3 * wide, 4 + 8 * wide)),
                        hidden_size=draw(st.integers(1 + 3 * wide, 4 + 8 * wide)), num_layers=draw(st.integers(1, 2)),
                        dropout=draw(st.sampled_from([0.0, 0.3])) if dropout else 0.0)
    n, T, seed = draw(st.integers(1, 5)), draw(st.integers(1, 5)), _seed(draw)
    return Case("lstm", lambda dtype, device=None: LSTMLanguageModel(config, rng=numpy.random.default_rng(seed),
                                                                     dtype=dtype, device=device),
                _tokens(numpy.random.default_rng(seed + 1), n, T, config.vocab_size), T, config.dropout > 0)


@st.composite
def encoder_cases(draw, dropout, wide=False):
    n_head, T = draw(st.integers(1, 2)), draw(st.integers(1 + 3 * wide, 5 + 3 * wide))
    config = EncoderConfig(block_size=T + draw(st.integers(0, 2)), vocab_size=draw(st.integers(2, 9)),
                           num_classes=draw(st.integers(2, 4)), n_layer=draw(st.integers(1, 3)), n_head=n_head,
                           n_embd=n_head * draw(st.sampled_from([8, 16] if wide else [2, 4])), bias=draw(st.booleans()),
                           dropout=draw(st.sampled_from([0.0, 0.2])) if dropout else 0.0)
    n, seed = draw(st.integers(1, 5)), _seed(draw)
    return Case("encoder", lambda dtype, device=None: Encoder(config, rng=numpy.random.default_rng(seed), dtype=dtype,
                                                              device=device),
                _tokens(numpy.random.default_rng(seed + 1), n, T, config.vocab_size, config.num_classes),
                config.n_layer, config.dropout > 0)


@st.composite
def gpt_cases(draw, dropout, wide=False):
    config = draw(tst.gpt_configs(max_layers=3, dropout=(0.0, 0.2) if dropout else (0.0,),
                                  head_sizes=(8, 16) if wide else (2, 4)))
    n, T, seed = draw(st.integers(1, 5)), draw(st.integers(1, config.block_size)), _seed(draw)
    return Case("gpt", lambda dtype, device=None: GPT(config, rng=numpy.random.default_rng(seed), dtype=dtype,
                                                      device=device),
                _tokens(numpy.random.default_rng(seed + 1), n, T, config.vocab_size), config.n_layer,
                config.dropout > 0)


KINDS = {"mlp": mlp_cases, "cnn": cnn_cases, "lstm": lstm_cases, "encoder": encoder_cases, "gpt": gpt_cases}
OWN_LOSS = {"lstm", "encoder", "gpt"}  # forward(token ids) -> (logits, loss): the Trainer's own loss applies


# -- the techniques ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Technique:
    accumulate: bool
    checkpoint: bool
    half: str = None  # None: float64; else the 16-bit dtype, on float32 models


TECHNIQUES = {
    "accumulate": Technique(True, False), "checkpoint": Technique(False, True),
    "accumulate+checkpoint": Technique(True, True),
    "bf16": Technique(False, False, "bfloat16"), "fp16": Technique(False, False, "float16"),
    "all-bf16": Technique(True, True, "bfloat16"), "all-fp16": Technique(True, True, "float16"),
}


@st.composite
def strategies(draw, case, trainer=False):
    """gradient_checkpointing_enable's keywords: segments and policy drawn; the GPT's split blocks.

    trainer: as TrainingArguments takes them (plain data: a policy's name, a nested plan as its segments)."""
    split = case.kind == "gpt" and draw(st.booleans(), label="split_blocks")
    segments = draw(tst.segment_plans(case.chain * (2 if split else 1)), label="segments")
    if trainer:
        policy = draw(st.sampled_from([None, *sorted(BY_NAME)]), label="policy")
        segments = segments.segments if isinstance(segments, Plan) else segments
    else:
        policy = draw(tst.policies(), label="policy")
    kwargs = {"segments": segments, "policy": policy}
    return {**kwargs, "split_blocks": True} if split else kwargs


def _splits(draw, case, trainer):
    """Uneven micro-batch sizes: any (loop, checkers), or the Trainer's B, B, ..., the rest."""
    if not trainer:
        return draw(tst.micro_batch_splits(case.n), label="splits")
    B = draw(st.integers(1, case.n), label="per_device_train_batch_size")
    return [B] * (case.n // B) + ([case.n % B] if case.n % B else [])


# -- comparing runs ---------------------------------------------------------------------------------
def assert_identical(a, b, what):
    (la, ga), (lb, gb) = a, b
    assert numpy.array_equal(la, lb), f"{what}: loss {la!r} vs {lb!r}"
    for k, (x, y) in enumerate(zip(ga, gb)):
        assert numpy.array_equal(x, y), f"{what}: gradient {k} differs by {numpy.abs(x - y).max():.3g}"


def relative_differences(a, b):
    """[the loss's, then each gradient's] largest |a - b|: the loss's over |loss|, a gradient's over the largest
    |gradient| of the whole model in b (a gradient that is zero but for rounding, as through BatchNorm over
    one value, cannot fail on its own)."""
    (la, ga), (lb, gb) = a, b
    scale = max(numpy.abs(numpy.asarray(y, F64)).max(initial=0.0) for y in gb)
    loss = abs(float(la) - float(lb)) / abs(float(lb)) if la != lb else 0.0
    diffs = [numpy.abs(numpy.asarray(x, F64) - numpy.asarray(y, F64)).max(initial=0.0) for x, y in zip(ga, gb)]
    return [loss] + [0.0 if d == 0 else d / scale if scale else math.inf for d in diffs]


def assert_close(a, b, rtol, what):
    worst = max(relative_differences(a, b))
    assert worst <= rtol, f"{what}: relative difference {worst:.3g} above {rtol:g}"


def gradient_tolerance(half, kind):
    return (CNN_GRADIENT_TOLERANCE if kind == "cnn" else GRADIENT_TOLERANCE)[half]


def assert_16bit_close(a, b, half, kind, what):
    """The 16-bit run a within the tolerances of the float32 run b (see LOSS_TOLERANCE)."""
    (la, ga), (lb, gb) = a, b
    flat = [numpy.concatenate([numpy.ravel(g).astype(F64) for g in grads]) for grads in (ga, gb)]
    loss = abs(float(la) - float(lb)) / abs(float(lb))
    gradient = numpy.linalg.norm(flat[0] - flat[1]) / numpy.linalg.norm(flat[1])
    bound = gradient_tolerance(half, kind)
    assert loss <= LOSS_TOLERANCE[half] and gradient <= bound, \
        f"{what}: loss {loss:.3g} (at most {LOSS_TOLERANCE[half]}), gradient {gradient:.3g} (at most {bound})"


def _rows(batch, start, stop):
    return {k: v[start:stop] for k, v in batch.items()}


def _cat(parts):
    return {k: numpy.concatenate([p[k] for p in parts]) for k in parts[0]}


def _parts(batch, splits):
    bounds = numpy.cumsum([0, *splits])
    return [_rows(batch, a, b) for a, b in zip(bounds, bounds[1:])]


# -- the entry points: each runs (dtype, half, micro-batches, strategy) -> (mean loss, gradients) ------------
def loop(case, dtype, half, parts, strategy=None, eval_mode=False, check_dtypes=False):
    """The hand-written loop: each micro-batch's forward and loss under autocast, backward, the accumulator."""
    model = case.make(dtype)
    if eval_mode:
        model.eval()
    if strategy:
        model.gradient_checkpointing_enable(**strategy)
    acc = GradientAccumulator(list(model.parameters()), len(parts))
    summed = 0.0
    for k, part in enumerate(parts):
        recording = check_dtypes and k == 0
        with autocast(half) if half else contextlib.nullcontext(), \
                tape.recording(tape.Tape()) if recording else contextlib.nullcontext() as recorded:
            loss, items = kind_loss(model, part)
            if recording:
                products_in(recorded.nodes(), half)
        loss.backward()
        summed += float(loss.item())
        acc.accumulate(items)
    acc.write_grads()
    return summed / acc.items, [p.grad.numpy().copy() for p in model.parameters()]


def products_in(records, half):
    """The kind's products (Linear, MatMul, Conv2d) take 16-bit inputs under autocast."""
    low = lower_dtype(half)
    for r in records:
        if r.op.__name__ in ("Linear", "MatMul", "Conv2d"):
            floats = {numpy.dtype(d) for d in r.input_dtypes if numpy.dtype(d).kind == "f" or d == low}
            assert floats == {low}, f"under autocast({half!r}) {r.op.__name__} ran on {sorted(map(str, floats))}"


def alone(case, dtype, half, parts):
    """Each micro-batch run on its own (a fresh copy of the model): the mean of their summed gradients."""
    runs = [loop(case, dtype, half, [p]) for p in parts]
    items = [int(p["y" if "y" in p else "labels"].size) for p in parts]
    total = sum(items)
    loss = sum(loss * i for (loss, _), i in zip(runs, items)) / total
    grads = [sum(g[k] * i for (_, g), i in zip(runs, items)) / total for k in range(len(runs[0][1]))]
    return loss, grads


def trainer(case, dtype, half, splits, strategy=None, own_loss=False):
    """One Trainer step (SGD) over micro-batches of splits[0]: (mean loss, the gradient the optimizer got, parts)."""
    B, collated, seen = splits[0], [], []
    fields = dict(per_device_train_batch_size=B, gradient_accumulation_steps=len(splits), max_steps=1, optim="sgd",
                  max_grad_norm=0.0, logging_steps=1, disable_tqdm=True, save_steps=0)
    if half:
        fields["bf16" if half == "bfloat16" else "fp16"] = True
    if strategy:
        fields.update(gradient_checkpointing=True, gradient_checkpointing_kwargs=strategy)

    def collate(examples):
        collated.append(stack_collate(examples))
        return collated[-1]

    t = Trainer(case.make(dtype), TrainingArguments(**fields), case.examples(), data_collator=collate,
                compute_loss_func=None if own_loss else kind_loss)
    if half == "float16":  # the one step at PyTorch's 2**16 may overflow and be skipped: start at 2**8
        t.scaler = GradScaler(init_scale=2.0**8)
    step = t.optimizer.step

    def recording_step():
        seen.append([p.grad.numpy().copy() for p in t.optimizer.params])
        step()

    t.optimizer.step = recording_step
    log = t.train()
    assert len(seen) == 1, f"the optimizer stepped {len(seen)} times (skipped: {log})"
    assert [len(next(iter(b.values()))) for b in collated] == splits
    return (numpy.float64(next(e["loss"] for e in log if "loss" in e)), seen[0]), collated


def check_trainer_is_the_loop(case, dtype, half, splits, strategy, own_loss):
    """The Trainer's step equals the loop over the micro-batches it collated; returns (its run, those parts)."""
    run, parts = trainer(case, dtype, half, splits, strategy, own_loss)
    reference = loop(case, dtype, half, parts, strategy)
    if half == "float16":  # a power-of-two loss scale, unscaled: float16's own rounding of the scaled products
        assert_16bit_close(run, loop(case, numpy.float32, None, parts), half, case.kind, "Trainer fp16 against float32")
    else:
        # the logged loss is a float32 sum of float32 items; the gradients are the loop's bit for bit
        assert_identical((reference[0], run[1]), reference, "the Trainer against the loop over its micro-batches")
        assert abs(run[0] - reference[0]) <= 1e-6 * abs(reference[0]) + 1e-12
    return run, parts


# -- the properties, entry point by entry point ------------------------------------------------------
def prove_loop(case, tech, data, trainer_entry=False, own_loss=False):
    splits = _splits(data.draw, case, trainer_entry) if tech.accumulate else [case.n]
    strategy = data.draw(strategies(case, trainer=trainer_entry)) if tech.checkpoint else None
    dtype = F64 if tech.half is None else numpy.float32

    def run(half, strategy_):
        if trainer_entry:
            return check_trainer_is_the_loop(case, dtype, half, splits, strategy_, own_loss)
        parts = _parts(case.batch, splits)
        return loop(case, dtype, half, parts, strategy_, check_dtypes=bool(half)), parts

    checked, parts = run(tech.half, strategy)
    if strategy:  # checkpointing changes nothing: bit for bit
        plain, _ = run(tech.half, None)
        assert_identical(checked, plain, f"checkpointed {strategy} against plain")
    if tech.half:  # 16 bits within TOLERANCE of float32, on the same micro-batches
        assert_16bit_close(checked, loop(case, numpy.float32, None, parts), tech.half, case.kind, f"{tech.half} vs float32")
    elif tech.accumulate:
        if case.kind == "cnn":  # training-mode BatchNorm: the micro-batches' own update; eval mode: the whole batch's
            assert_close(checked, alone(case, F64, None, parts), 1e-10, "accumulated against each micro-batch alone")
            if not trainer_entry:
                assert_close(loop(case, F64, None, parts, eval_mode=True),
                             loop(case, F64, None, [_cat(parts)], eval_mode=True), 1e-10, "eval mode, whole batch")
        else:
            assert_close(checked, loop(case, F64, None, [_cat(parts)]), 1e-10, "accumulated against the whole batch")


def prove_trainer(case, tech, data):
    prove_loop(case, tech, data, trainer_entry=True)


def prove_trainer_own(case, tech, data):
    if case.kind in OWN_LOSS:
        return prove_loop(case, tech, data, trainer_entry=True, own_loss=True)
    # not meaningful: the Trainer's own loss is a language model's; it must refuse, naming what to pass
    with pytest.raises(ValueError, match="compute_loss_func"):
        trainer(case, F64 if tech.half is None else numpy.float32, tech.half, [case.n], None, own_loss=True)


def real_peak(case, splits, fields):
    """A real Trainer step (float32) of micro-batches `splits`: (peak, split at the peak), less what lived before."""
    gc.collect()
    before = memory.current()
    t = Trainer(case.make(numpy.float32), TrainingArguments(
        per_device_train_batch_size=splits[0], gradient_accumulation_steps=len(splits), max_steps=1, disable_tqdm=True,
        logging_steps=0, save_steps=0, **fields), case.examples(), data_collator=stack_collate,
        compute_loss_func=kind_loss)
    if fields.get("fp16"):
        t.scaler = GradScaler(init_scale=2.0**8)
    t.train()
    peak, split = memory.peak()
    del t
    return peak - sum(before.values()), {c: split[c] - before[c] for c in split}


def meta_step(case, B, fields):
    shapes = {k: ((B, *v.shape[1:]), "float32" if v.dtype.kind == "f" else v.dtype) for k, v in case.batch.items()}
    return fit.estimate_step(case.make(numpy.float32, "meta"), shapes, kind_loss, fields, device="cpu")


def prove_estimate_step(case, tech, data):
    splits = _splits(data.draw, case, True) if tech.accumulate else [case.n]
    fields = {}
    if tech.checkpoint:
        fields.update(gradient_checkpointing=True, gradient_checkpointing_kwargs=data.draw(strategies(case, True)))
    if tech.half:
        fields["bf16" if tech.half == "bfloat16" else "fp16"] = True
    peak, split = real_peak(case, splits, fields)
    predicted = meta_step(case, splits[0], fields)
    assert (predicted.peak_bytes, predicted.at_peak) == (peak, split), f"meta {predicted.peak_bytes} vs real {peak}"
    if tech.half:  # at a size where activations are most of the step, 16 bits save fewer activation bytes
        B = data.draw(st.integers(512, 2048), label="batch at the larger size")
        big = larger(case.kind, B)
        above = []
        for segments in ("every", "sqrt") if tech.checkpoint else (None,):
            if segments:
                fields["gradient_checkpointing_kwargs"] = {"segments": segments}
            half = meta_step(big, B, fields).highest["activations"]
            full = meta_step(big, B, {k: v for k, v in fields.items() if k not in ("bf16", "fp16")}).highest["activations"]
            if half >= full:
                above.append(f"checkpointing {segments}: {half:,} bytes, float32 {full:,}")
        assert not above, f"{tech.half} saved activations not below float32's at batch {B}: {'; '.join(above)}"


def larger(kind, B):
    """The kind at tutorial 12's small size (the MLP: 4 blocks of 256), a batch of B zeros: for the meta device."""
    zeros = numpy.zeros
    if kind == "mlp":
        return Case(kind, lambda dtype, device=None: MLP(64, 256, 10, 4, dtype=dtype, device=device),
                    {"x": zeros((B, 64)), "y": zeros(B, "int64")}, 4, False)
    if kind == "cnn":
        return Case(kind, lambda dtype, device=None: CNN(CNNConfig(), dtype=dtype, device=device),
                    {"x": zeros((B, 3, 32, 32)), "y": zeros(B, "int64")}, 3, False)
    if kind == "lstm":
        return Case(kind, lambda dtype, device=None: LSTMLanguageModel(LSTMConfig(), dtype=dtype, device=device),
                    {"input_ids": zeros((B, 64), "int64"), "labels": zeros((B, 64), "int64")}, 64, False)
    if kind == "encoder":
        return Case(kind, lambda dtype, device=None: Encoder(EncoderConfig(), dtype=dtype, device=device),
                    {"input_ids": zeros((B, 32), "int64"), "labels": zeros(B, "int64")}, 2, False)
    config = GPTConfig(block_size=64, vocab_size=96, n_layer=4, n_head=4, n_embd=64)
    return Case(kind, lambda dtype, device=None: GPT(config, dtype=dtype, device=device),
                {"input_ids": zeros((B, 64), "int64"), "labels": zeros((B, 64), "int64")}, 4, False)


def test_estimate_step_sizes_an_offloading_policy():
    """Checkpointing's offload policy on the meta device: the step is sized as on real arrays (on the CPU,
    offloading is saving; on the meta device save_on_cpu keeps the array, having no values to copy)."""
    case = larger("mlp", 4)
    fields = dict(gradient_checkpointing=True, gradient_checkpointing_kwargs={"policy": "offload_matmuls"})
    saved = meta_step(case, 4, dict(gradient_checkpointing=True, gradient_checkpointing_kwargs={"policy": "save_matmuls"}))
    assert meta_step(case, 4, fields).peak_bytes == saved.peak_bytes


def prove_checkers(case, tech, data):
    splits = data.draw(tst.micro_batch_splits(case.n), label="splits") if tech.accumulate else None
    strategy = data.draw(strategies(case)) if tech.checkpoint else None
    dtype = F64 if tech.half is None else numpy.float32
    if strategy:  # check_checkpoint, bit for bit (under autocast for 16 bits)
        model = case.make(dtype)
        kwargs = dict(strategy)
        report = check_checkpoint(model, case.inputs(model), kwargs.pop("segments"), kwargs.pop("policy"),
                                  split_blocks=kwargs.get("split_blocks"), autocast=tech.half, rtol=0.0, atol=0.0)
        assert report, str(report)
    if tech.accumulate:  # check_accumulation, the checkpointing switched on if drawn
        rtol = None if tech.half is None else gradient_tolerance(tech.half, case.kind)

        def loss_fn(model, batch):
            with autocast(tech.half) if tech.half else contextlib.nullcontext():
                return kind_loss(model, batch)[0]

        model = case.make(dtype)
        if strategy:
            model.gradient_checkpointing_enable(**strategy)
        if case.kind == "cnn":  # training-mode BatchNorm is not the whole batch's: eval mode (see the docstring)
            model.eval()
        atol = None if rtol is None else rtol * max(numpy.abs(g).max() for g in loop(case, dtype, None, [case.batch])[1])
        report = check_accumulation(model, loss_fn, case.batch, splits=splits, rtol=None if rtol is None else 0.0,
                                    atol=atol)
        assert report, str(report)
    if tech.half:  # 16 bits against float32: a strategy of one's own, the forward under autocast
        def in_16_bits(fn, *inputs):
            with autocast(tech.half):
                return fn(*inputs)

        model = case.make(numpy.float32)
        report = check_checkpoint(model, case.inputs(model), in_16_bits)
        gradients = [e for e in report.entries if e.kind == "gradient"]
        scale = max(e.scale for e in gradients)  # as relative_differences: over the largest gradient of all
        bound = gradient_tolerance(tech.half, case.kind)
        assert not report.problems and all(e.max_abs <= bound * scale for e in gradients), str(report)
        output = next(e for e in report.entries if e.kind == "output")
        assert output.max_abs <= bound * output.scale, str(report)


ENTRIES = {"loop": prove_loop, "trainer": prove_trainer, "trainer-own": prove_trainer_own,
           "estimate_step": prove_estimate_step, "checkers": prove_checkers}
CELLS = [(k, t, e) for k in KINDS for t in TECHNIQUES for e in ENTRIES]


@pytest.mark.equivalence
@pytest.mark.parametrize("kind, technique, entry", CELLS, ids=["-".join(c) for c in CELLS])
@settings(max_examples=PER_CELL, phases=[Phase.explicit, Phase.reuse, Phase.generate])  # no shrinking: minutes a cell
@given(data=st.data())
def test_cell(kind, technique, entry, data):
    tech = TECHNIQUES[technique]
    # dropout: only where nothing compares split batches (accumulation) or other precisions' masks
    case = data.draw(KINDS[kind](dropout=tech.checkpoint and not tech.accumulate and tech.half is None,
                                 wide=tech.half is not None), label="case")
    ENTRIES[entry](case, tech, data)
