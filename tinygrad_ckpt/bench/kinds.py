"""Every model kind: what checkpointing saves and costs for a CNN, an LSTM, an encoder and a GPT.

The rule of thumb in practitioners' write-ups on Hugging Face's
`gradient_accumulation_steps` and `gradient_checkpointing` sorts models into
small (a CNN, an LSTM: need neither) and large (a GPT, a BERT: checkpointing
is essential), and says checkpointing costs about 20 % and matters little
unless the model is really big. This measures it, kind by kind: the CNN on
images (nn/cnn.py), the LSTM language model (nn/lstm.py), the encoder
(nn/encoder.py, BERT's kind) and the GPT (nn/transformer.py), each with no
checkpointing, with every link of its chain checkpointed (a CNN stage, an LSTM
time step, a transformer block) and with sqrt(n) segments of it.

Part 1, on real arrays, at sizes that run in seconds: one Trainer step
(AdamW) per strategy, with memory.py's count:
  saved act.  the highest the saved activations reach during the step;
  peak        the step's peak (every category), less what lived before the model;
  = meta      the same step on the meta device (fit.estimate_step, device="cpu")
              gives the same two figures to the byte;
  wall s, cpu s  the median wall-clock and CPU time (time.process_time(), which
              other programs on a busy machine do not inflate) of a Trainer
              step, `repeats` of them after a warm-up, in rounds over the
              strategies, so that a load that drifts slows them alike;
  cpu x, paired  the ratio of the CPU medians to no checkpointing's, and the
              median of the ratios within a round;
  FLOPs x     1 + the FLOPs the recompute ran / (3 x the forward's FLOPs), the
              measure fit uses (ops/flops.py; a step is about three forwards).
  bf16 peak   the same step under bf16 autocast (TrainingArguments(bf16=True);
              fp16=True where ml_dtypes, which brings bfloat16, is missing),
              and "= meta" again: fit.estimate_step's peak of that step;
  less        1 - bf16 peak / peak. Rarely a half: the weights stay float32
              (their 16-bit copies are made per op and saved beside them,
              not cached, as PyTorch's CPU autocast does), AdamW's moments and
              the accumulation buffers stay float32, and float32 ops (softmax,
              the losses, normalisation; autocast.py's lists) save float32.

Part 2, full sizes on the meta device (a CNN at 224 x 224, an LSTM over 1024
steps, a BERT-base-sized encoder over 512 tokens, GPT-2 medium over 1024): the
step at micro-batch REFERENCE_BATCH, the FLOPs ratio, and the largest
micro-batch whose memory.py peak fits BUDGET (a V100 16 GB as CUDA reports
it, less fit's 0.5 GiB for the CUDA context; with accumulation, any batch is
that many examples at a time), from the step run at micro-batches 1, 2 and 3
(fit.StepProfile: every array is a + b x batch bytes; the largest is then
run, and the next one, to check).

    tinygrad-ckpt bench --kinds --quick     # part 1 at the small sizes, part 2 at full sizes
    tinygrad-ckpt bench --kinds             # the full set: part 1 at two sizes a kind (minutes; see below)
    python benchmarks/model_kinds.py        # the same as the full set, one BLAS thread

What does not live here: the models (nn/), the meta device's step
(fit.estimate_step), the command's flags (command.py).
"""

import gc
import statistics
import time
from dataclasses import dataclass

import numpy

from .. import autocast, fit, memory
from ..data import stack_collate
from ..kinds import batch_shapes, image_loss, language_model_loss, sequence_label_loss
from ..nn import CNN, GPT, CNNConfig, GPTConfig
from ..nn.encoder import Encoder, EncoderConfig
from ..nn.lstm import LSTMConfig, LSTMLanguageModel
from ..ops.flops import op_flops
from ..train import Trainer, TrainingArguments

KINDS = ("CNN", "LSTM", "encoder", "GPT")
STRATEGIES = {"none": None, "every": "every", "sqrt": "sqrt"}  # gradient_checkpointing_kwargs' segments
REFERENCE_BATCH = 8  # part 2's micro-batch
BUDGET = fit.device_memory_bytes("v100-16gb")[0] - fit.DEFAULT_RESERVE  # part 2's memory: 15.28 GiB
MIB, GIB = 1 << 20, 1 << 30


@dataclass
class Size:
    """One model at one size: how to build it, one example's fields, and its loss."""

    kind: str  # one of KINDS
    label: str  # what the table calls the size
    make: object  # device -> the model (weights from a fixed seed)
    example: dict  # field -> (shape of one example, dtype, high: values drawn from [0, high); None: normal)
    loss: object  # the Trainer's compute_loss_func: (model, batch) -> (sum of the losses, items)
    batch: int  # part 1's micro-batch


def cnn(label, config, batch):
    S, C = config.image_size, config.in_channels
    return Size("CNN", label, lambda device: CNN(config, rng=numpy.random.default_rng(0), device=device),
                {"x": ((C, S, S), "float32", None), "y": ((), "int64", config.n_classes)}, image_loss, batch)


def lstm(label, config, T, batch):
    return Size("LSTM", label, lambda device: LSTMLanguageModel(config, rng=numpy.random.default_rng(0), device=device),
                {"input_ids": ((T,), "int64", config.vocab_size), "labels": ((T,), "int64", config.vocab_size)},
                language_model_loss, batch)


def encoder(label, config, T, batch):
    return Size("encoder", label, lambda device: Encoder(config, rng=numpy.random.default_rng(0), device=device),
                {"input_ids": ((T,), "int64", config.vocab_size), "labels": ((), "int64", config.num_classes)},
                sequence_label_loss, batch)


def gpt(label, config, T, batch):
    return Size("GPT", label, lambda device: GPT(config, rng=numpy.random.default_rng(0), device=device),
                {"input_ids": ((T,), "int64", config.vocab_size), "labels": ((T,), "int64", config.vocab_size)},
                language_model_loss, batch)


# -- the sets ------------------------------------------------------------------------------
SMALL = [  # part 1's first size of each kind: seconds
    cnn("32x32, widths 16-64", CNNConfig(), 32),
    lstm("H 128, T 64", LSTMConfig(), 64, 16),
    encoder("2 x 32, T 32", EncoderConfig(), 32, 32),
    gpt("4 x 64, T 64", GPTConfig(block_size=64, vocab_size=96, n_layer=4, n_head=4, n_embd=64, dropout=0.1), 64, 8),
]
LARGER = [  # part 1's second size of each kind: a larger model, tens of seconds
    cnn("64x64, widths 32-256", CNNConfig(image_size=64, widths=(32, 64, 128, 256)), 8),
    lstm("H 512 x 2, T 256", LSTMConfig(n_embd=128, hidden_size=512, num_layers=2), 256, 8),
    encoder("6 x 128, T 128", EncoderConfig(block_size=128, vocab_size=1024, n_layer=6, n_head=4, n_embd=128), 128, 16),
    gpt("8 x 256, T 128", GPTConfig(block_size=128, vocab_size=256, n_layer=8, n_head=4, n_embd=256, dropout=0.1), 128, 8),
]
FULL_SIZES = [  # part 2: the meta device
    cnn("224x224, widths 64-512", CNNConfig(image_size=224, widths=(64, 128, 256, 512)), None),
    lstm("H 1024 x 2, T 1024", LSTMConfig(n_embd=256, hidden_size=1024, num_layers=2), 1024, None),
    encoder("BERT-base size, T 512", EncoderConfig(block_size=512, vocab_size=30522, num_classes=2, n_layer=12,
                                                   n_head=12, n_embd=768, dropout=0.1), 512, None),
    gpt("GPT-2 medium, T 1024", fit.GPT2["gpt2-medium"], 1024, None),
]
TOYS = [  # toy sizes for the test suite: seconds, and the figures mean little
    cnn("toy", CNNConfig(image_size=8, widths=(4, 8)), 4),
    lstm("toy", LSTMConfig(vocab_size=16, n_embd=8, hidden_size=8, num_layers=2), 9, 2),
    encoder("toy", EncoderConfig(block_size=8, vocab_size=16, n_layer=4, n_head=2, n_embd=16), 8, 2),
    gpt("toy", GPTConfig(block_size=8, vocab_size=16, n_layer=4, n_head=2, n_embd=16, dropout=0.1), 8, 2),
]
# name -> (part 1's sizes, part 2's sizes, part 2's memory in bytes)
SETS = {"full": (sorted(SMALL + LARGER, key=lambda s: KINDS.index(s.kind)), FULL_SIZES, BUDGET),
        "quick": (SMALL, FULL_SIZES, BUDGET), "tiny": (TOYS, TOYS, 4 * MIB)}


# -- one step ------------------------------------------------------------------------------
def arguments(strategy, batch, precision=None):
    """TrainingArguments' fields for one step; precision: None (float32), "bf16" or "fp16" (autocast)."""
    segments = STRATEGIES[strategy]
    return dict(**({precision: True} if precision else {}), per_device_train_batch_size=batch, max_steps=1, logging_steps=0, disable_tqdm=True, output_dir=None,
                save_steps=0, eval_steps=0, gradient_checkpointing=segments is not None,
                gradient_checkpointing_kwargs={"segments": segments} if segments else None)


def dataset(size, batch, seed=1):
    rng = numpy.random.default_rng(seed)
    return [{name: (rng.standard_normal(shape).astype(dtype) if high is None else rng.integers(0, high, shape))
             for name, (shape, dtype, high) in size.example.items()} for _ in range(batch)]


def flops(events):
    """(forward FLOPs, recomputed FLOPs) of a step's timeline."""
    count = {"forward": 0, "recompute": 0}
    for e in events:
        if e["kind"] == "op" and e["phase"] in count and "input_shapes" in e:
            count[e["phase"]] += op_flops(e["op"], e["input_shapes"], e["output_shapes"])
    return count["forward"], count["recompute"]


def sixteen_bits():
    """The 16-bit autocast the column runs: "bf16", or "fp16" where NumPy has no bfloat16 (no ml_dtypes)."""
    try:
        autocast.bfloat16()
    except ImportError:
        return "fp16"
    return "bf16"


def real_step(size, strategy, batch, precision=None):
    """One Trainer step of a fresh model on real arrays: (peak, highest saved activations, FLOPs ratio)."""
    gc.collect()
    before = sum(memory.current().values())
    trainer = Trainer(size.make(None), TrainingArguments(**arguments(strategy, batch, precision)), dataset(size, batch),
                      data_collator=stack_collate, compute_loss_func=size.loss)
    with memory.timeline() as events:
        trainer.train()
    peak = memory.peak()[0] - before
    forward, recomputed = flops(events)
    return peak, max(e["activations"] for e in events), 1 + recomputed / (3 * forward)


def meta_step(size, strategy, batch, device="cuda", precision=None):
    """fit.estimate_step of the model built on the meta device."""
    shapes = batch_shapes(size.example, batch)
    return fit.estimate_step(size.make("meta"), shapes, size.loss, arguments(strategy, batch, precision), device=device)


def meta_forward_flops(size, batch):
    """The forward FLOPs of one micro-batch, from the ops the loss runs on the meta device."""
    model = size.make("meta")
    batch_ = {name: numpy.zeros((batch, *shape), dtype) for name, (shape, dtype, _) in size.example.items()}
    with memory.timeline() as events:
        size.loss(model, batch_)
    return flops(events)[0]


def times(size, batch, repeats):
    """{strategy: [(wall-clock s, CPU s) of each timed step]}: one Trainer per strategy, stepped in rounds."""
    trainers = {s: Trainer(size.make(None), TrainingArguments(**arguments(s, batch)), dataset(size, batch),
                           data_collator=stack_collate, compute_loss_func=size.loss) for s in STRATEGIES}
    seconds = {s: [] for s in STRATEGIES}
    for trainer in trainers.values():  # warm-up: AdamW's moments, NumPy's first calls
        trainer.train()
    for _ in range(repeats):
        for s, trainer in trainers.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            trainer.train()
            seconds[s].append((time.perf_counter() - start, time.process_time() - start_cpu))
    return seconds


# -- the two parts -------------------------------------------------------------------------
def part1(sizes, repeats=5, say=print, progress=None):
    """Real steps at `sizes`; says each row as it comes (a line of the table); returns the rows.

    progress(what), if given, is told before each size is measured (its three
    rows come after all of its timed steps, tens of seconds at the larger sizes).
    """
    half = sixteen_bits()
    say(f"Part 1: one Trainer step (AdamW) on real arrays; time: median of {repeats} steps after a warm-up; "
        f"MiB = 2^20 bytes; {half} peak: the step under {half} autocast")
    say(f"{'kind':<8} {'size':<22} {'batch':>5} {'strategy':<6} {'saved act.':>10} {'peak':>9} {'= meta':>6} "
        f"{'wall s':>7} {'cpu s':>7} {'cpu x':>5} {'paired':>6} {'FLOPs x':>7} {half + ' peak':>9} {'= meta':>6} "
        f"{'less':>4}")
    rows = []
    for size in sizes:
        if progress is not None:
            progress(f"part 1: {size.kind} {size.label}, {len(STRATEGIES)} strategies x {repeats + 1} steps")
        steps = {s: real_step(size, s, size.batch) for s in STRATEGIES}
        seconds = times(size, size.batch, repeats)
        cpu_none = statistics.median(c for _, c in seconds["none"])
        for s, (peak, activations, ratio) in steps.items():
            m = meta_step(size, s, size.batch, device="cpu")
            half_peak = real_step(size, s, size.batch, half)[0]
            half_meta = meta_step(size, s, size.batch, device="cpu", precision=half).peak_bytes
            wall, cpu = (statistics.median(t[i] for t in seconds[s]) for i in (0, 1))
            row = dict(kind=size.kind, size=size.label, batch=size.batch, strategy=s, saved_bytes=activations,
                       peak_bytes=peak, meta_equal=(m.peak_bytes, m.highest["activations"]) == (peak, activations),
                       wall_s=wall, cpu_s=cpu, cpu_ratio=cpu / cpu_none, flops_ratio=ratio,
                       paired_ratio=statistics.median(c / c0 for (_, c), (_, c0) in zip(seconds[s], seconds["none"])),
                       precision=half, half_peak_bytes=half_peak, half_meta_equal=half_meta == half_peak)
            rows.append(row)
            say(f"{size.kind:<8} {size.label:<22} {size.batch:>5} {s:<6} {activations / MIB:10.2f} "
                f"{peak / MIB:9.2f} {'yes' if row['meta_equal'] else 'NO':>6} {wall:7.3f} {cpu:7.3f} "
                f"{row['cpu_ratio']:5.2f} {row['paired_ratio']:6.2f} {ratio:7.2f} {half_peak / MIB:9.2f} "
                f"{'yes' if row['half_meta_equal'] else 'NO':>6} {1 - half_peak / peak:4.0%}")
    say(f"less, under {half}: rarely a half, and below 0 where a model reuses its weights many times in a step "
        "(an LSTM at every time step): weights, AdamW's moments and the accumulation buffers stay float32, and "
        "each op casts the weights it reads again and saves that copy (casts are not cached; autocast.py)")
    return rows


def profile(steps):
    """fit.StepProfile from the steps at micro-batches 1, 2 and 3 (affine from 2 and 3; 1 may differ)."""
    return fit.StepProfile(steps[2], steps[3], batch=2, below={1: steps[1]})


def part2(sizes, budget=BUDGET, say=print, progress=None):
    """Meta-device steps at `sizes`: the reference batch, and the largest micro-batch within `budget` bytes.

    progress(what), if given, is told before each size is measured."""
    unit, name = (GIB, "GiB") if budget >= GIB else (MIB, "MiB")
    say(f"Part 2: on the meta device; peak and saved activations at micro-batch {REFERENCE_BATCH} ({name} = "
        f"2^{unit.bit_length() - 1} bytes); largest: the largest micro-batch whose peak fits {budget / unit:.2f} {name}")
    say(f"{'kind':<8} {'size':<24} {'strategy':<6} {'params':>8} {'saved act.':>10} {'peak':>7} {'FLOPs x':>7} "
        f"{'largest':>7}  checked")
    rows = []
    for size in sizes:
        if progress is not None:
            progress(f"part 2: {size.kind} {size.label} on the meta device")
        forward = meta_forward_flops(size, 1)
        params = sum(p.data.size for p in size.make("meta").parameters())
        for s in STRATEGIES:
            p = profile({b: meta_step(size, s, b) for b in (1, 2, 3)})
            ref = p.at(REFERENCE_BATCH)
            most = p.largest_batch(budget, device=False)
            # run the largest, and the next size: it fits, the next does not
            fits = meta_step(size, s, most).peak_bytes <= budget if most else True
            over = meta_step(size, s, most + 1).peak_bytes > budget
            row = dict(kind=size.kind, size=size.label, strategy=s, parameters=params,
                       saved_bytes=ref.highest["activations"], peak_bytes=ref.peak_bytes,
                       flops_ratio=1 + ref.recomputed_flops / (3 * forward * REFERENCE_BATCH), largest_micro_batch=most,
                       as_predicted=fits and over)
            rows.append(row)
            say(f"{size.kind:<8} {size.label:<24} {s:<6} {params / 1e6:7.1f}M {row['saved_bytes'] / unit:10.2f} "
                f"{row['peak_bytes'] / unit:7.2f} {row['flops_ratio']:7.2f} {most:>7}  meta; {most} and {most + 1} "
                f"run: {'as predicted' if row['as_predicted'] else 'NOT as predicted'}")
    return rows
