"""Does mixed precision still train? The default `tinygrad-ckpt train` run in float32, bfloat16 and float16.

The run of the README's set-up command (cli.DEFAULTS: a 3-block GPT, width
96, context 64, 500 AdamW steps of 16 x 64 characters of the embedded
Shakespeare, validation on its last tenth), built here as cli.py builds it,
three times: as it is, with bf16=True (`--bf16`) and with fp16=True
(`--fp16`). Printed: each run's final validation loss, its difference from
float32's against MARGIN, its wall-clock and CPU time, and the float16 run's
loss scale as the Trainer's log history records it (a "skipped" entry for
each step whose scaled gradients overflowed, the scale on every logged step).

    python benchmarks/mixed_precision_training.py              # the full 500 steps (30 minutes on 2 busy cores)
    python benchmarks/mixed_precision_training.py --max-steps 50

NumPy has no 16-bit matrix product of its own speed (float16 and ml_dtypes'
bfloat16 are computed element by element, not by BLAS), so the 16-bit runs
are slower here, not faster: this answers "does it train", not "is it fast".
"""

import argparse
import os

# BLAS reads these when NumPy loads: set them before importing it.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")

import re  # noqa: E402
import time  # noqa: E402

import numpy  # noqa: E402

from tinygrad_ckpt import random  # noqa: E402
from tinygrad_ckpt.cli import DEFAULTS  # noqa: E402
from tinygrad_ckpt.data import load_char_datasets  # noqa: E402
from tinygrad_ckpt.grad_scaler import GradScaler  # noqa: E402
from tinygrad_ckpt.nn import GPT, GPTConfig  # noqa: E402
from tinygrad_ckpt.train import Trainer, TrainingArguments  # noqa: E402

# -- configuration ------------------------------------------------------------------------
MODEL_FIELDS = ("block_size", "n_layer", "n_head", "n_embd", "dropout")
PRECISIONS = {"float32": {}, "bfloat16": {"bf16": True}, "float16": {"fp16": True}}
MARGIN = 0.05  # a 16-bit run's final validation loss may be at most this far (nats per character) from float32's


def run(precision, max_steps, init_scale=None):
    """One default run; returns (final validation loss, wall seconds, CPU seconds, the log history).

    init_scale: float16's first loss scale, if not the Trainer's (PyTorch's 2**16; the Trainer's scaler
    replaced).
    """
    tokenizer, train_data, val_data = load_char_datasets(None, DEFAULTS["block_size"], 0.1)
    random.manual_seed(DEFAULTS["seed"])  # as cli.py does: dropout's stream (off in the default run)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, **{k: DEFAULTS[k] for k in MODEL_FIELDS})
    model = GPT(config, rng=numpy.random.default_rng(DEFAULTS["seed"]))
    training = {k: v for k, v in DEFAULTS.items() if k not in MODEL_FIELDS}
    if max_steps is not None:
        training["max_steps"] = max_steps
    args = TrainingArguments(**training, **PRECISIONS[precision], disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=train_data, eval_dataset=val_data, tokenizer=tokenizer)
    if init_scale is not None:
        trainer.scaler = GradScaler(init_scale=init_scale)
    wall, cpu = time.perf_counter(), time.process_time()
    history = trainer.train()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    evals = [e["eval_loss"] for e in history if "eval_loss" in e]
    return evals[-1], wall, cpu, history


def scale_history(history):
    """[(step, scale the next step starts with, why)] from the log history: the backoffs, then the logged scales."""
    rows = []
    for e in history:
        if "skipped" in e:
            now = re.search(r"now ([0-9.e+-]+)\)", e["skipped"])
            rows.append((e["step"], float(now.group(1)) if now else None, "skipped: " + e["skipped"]))
        elif "loss_scale" in e:
            rows.append((e["step"], e["loss_scale"], "logged"))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=None,
                        help=f"optimizer steps per run (default: the command's own, {DEFAULTS['max_steps']})")
    parser.add_argument("--fp16-init-scale", type=float, default=None, metavar="SCALE",
                        help="also run float16 with the loss scale starting at SCALE, not 2**16 (a fourth row)")
    options = parser.parse_args()
    steps = options.max_steps
    print(f"the default `tinygrad-ckpt train` run, {steps or DEFAULTS['max_steps']} optimizer steps, three precisions; "
          f"OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}", flush=True)
    runs = [(precision, precision, None) for precision in PRECISIONS]
    if options.fp16_init_scale is not None:
        runs.append((f"float16, scale from {options.fp16_init_scale:g}", "float16", options.fp16_init_scale))
    results = {}
    for name, precision, init_scale in runs:
        results[name] = run(precision, steps, init_scale)
        loss, wall, cpu, _ = results[name]
        print(f"  {name}: validation loss {loss:.4f}, {wall:.1f} s wall clock, {cpu:.1f} s CPU", flush=True)

    reference = results["float32"][0]
    print(f"\n| precision | validation loss | minus float32's | within {MARGIN} | wall clock | CPU time |")
    print("|---|---|---|---|---|---|")
    within = True
    for precision, (loss, wall, cpu, _) in results.items():
        ok = abs(loss - reference) <= MARGIN
        within = within and (ok or precision not in PRECISIONS)  # the verdict: the default bf16 and fp16 runs
        print(f"| {precision} | {loss:.4f} | {loss - reference:+.4f} | {'yes' if ok else 'NO'} | {wall:.1f} s | {cpu:.1f} s |")

    for name, precision, init_scale in runs:
        if precision == "float16":
            start = "the Trainer's starting scale" if init_scale is None else f"{init_scale:g}"
            print(f"\n{name}: the loss scale (from the Trainer's log history; it starts at {start}):")
            for step, scale, why in scale_history(results[name][3]):
                print(f"  step {step:>4}: scale {scale:g}  ({why})")
    print(f"\nthe default bfloat16 and float16 runs both within {MARGIN} of float32's validation loss: "
          f"{'yes' if within else 'NO'}")


if __name__ == "__main__":
    main()
