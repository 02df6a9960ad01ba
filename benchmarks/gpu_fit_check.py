"""Does `tinygrad-ckpt fit` hold on a GPU? Predicted against measured memory, GPT-2-small-sized steps on CuPy.

For each strategy of fit's table (no checkpointing, every block, half
blocks, sqrt(n), the selective policy, and the planner's plan for this GPU),
one Trainer step of a GPT of GPT-2 small's size is run on the GPU after a
warm-up step, and compared with the same step run on the meta device
(fit.gpt_step):

  engine peak    memory.peak() of the step (by category), against the meta step's
                 prediction: equal to the byte, or the check fails;
  pool peak      the bytes CuPy's memory pool handed out at their highest
                 during the step (a memory hook; each request rounded up to
                 512 bytes), above what was in use before it, against the
                 meta step's device bound (StepMemory.device_peak_bytes), which it
                 should not exceed by more than the rounding;
  device used    total - free from cudaMemGetInfo before the model exists (the
                 CUDA context and whatever else holds memory: what fit's
                 --reserve stands for), and after the step (the pool keeps
                 what it has handed out, so this is the step's high-water mark
                 plus the context).

    python benchmarks/gpu_fit_check.py --out OUTDIR                # on a GPU
    python benchmarks/gpu_fit_check.py --out OUTDIR --device strict --quick
                 # a dry run on the CPU stand-in for CuPy, tiny model: checks the
                 # script and the engine-peak comparison, measures no GPU

Writes OUTDIR/fit_check.json (rewritten after every row). Exit status: 0 when
every engine peak equals its prediction, 1 when one does not, 2 on an error.
"""

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time

import numpy

from tinygrad_ckpt import backend, fit, memory, random
from tinygrad_ckpt.testing import strict_cupy
from tinygrad_ckpt.nn import GPT, GPTConfig
from tinygrad_ckpt.train import TrainingArguments, Trainer

# -- configuration ------------------------------------------------------------------------
MODEL = fit.GPT2["gpt2"]  # GPT-2 small's size: 12 blocks, width 768, 12 heads, vocabulary 50257
SEQ_LEN = 1024
MICRO_BATCH = 4  # lowered to what fits the GPU with room to spare (see choose_batch)
QUICK_MODEL = GPTConfig(block_size=16, vocab_size=64, n_layer=3, n_head=4, n_embd=32, dropout=0.1)
QUICK_SEQ_LEN, QUICK_MICRO_BATCH = 16, 2
ROUNDING = 512  # CuPy's pool hands out multiples of 512 bytes


def device_used(xp):
    """total - free bytes on the GPU (cudaMemGetInfo), or None off CuPy."""
    if not hasattr(xp, "cuda"):
        return None
    free, total = xp.cuda.runtime.memGetInfo()
    return total - free


def pool_peak_hook(xp):
    """A CuPy memory hook that follows the pool's bytes in use and keeps their peak (None off CuPy)."""
    if not hasattr(xp, "cuda"):
        return None

    class PoolPeak(xp.cuda.MemoryHook):
        name = "tinygrad_ckpt_fit_pool_peak"

        def __init__(self):
            self.used = self.peak = 0  # bytes above what was in use when the hook started
            self.allocations = 0

        def malloc_postprocess(self, **kwargs):
            self.used += kwargs["mem_size"]
            self.allocations += 1
            self.peak = max(self.peak, self.used)

        def free_postprocess(self, **kwargs):
            self.used -= kwargs["mem_size"]

    return PoolPeak()


def synchronize(xp):
    if hasattr(xp, "cuda"):
        xp.cuda.Device().synchronize()


def strategies(plan):
    """(name, gradient_checkpointing_kwargs or None) for every row of fit's table, the planner's plan included."""
    return [(row.key, None if row.checkpointing is None else dict(row.checkpointing)) for row in plan.rows]


def choose_batch(config, seq_len, largest, free_bytes):
    """The micro-batch to run: at most `largest`, and one whose no-checkpointing step fits in half the free memory."""
    for b in range(largest, 0, -1):
        need = fit.gpt_step(config, b, seq_len).device_peak_bytes
        if need <= free_bytes // 2:
            return b
    return 1


def trainer_for(model, data, batch, checkpointing):
    """A Trainer for one optimizer step of one micro-batch (its own AdamW state and accumulation buffers)."""
    extra = {} if checkpointing is None else dict(gradient_checkpointing=True, gradient_checkpointing_kwargs=checkpointing)
    if checkpointing is None:
        model.gradient_checkpointing_disable()
    args = TrainingArguments(per_device_train_batch_size=batch, max_steps=1, disable_tqdm=True, logging_steps=0, **extra)
    return Trainer(model, args, data)


def measure(model, data, batch, checkpointing, xp):
    """One warm-up step, then one measured step: engine peak by category, pool peak, device used after."""
    trainer_for(model, data, batch, checkpointing).train()  # warm-up: kernels compiled, the pool filled
    synchronize(xp)
    gc.collect()
    trainer = trainer_for(model, data, batch, checkpointing)  # the step starts with its state allocated
    gc.collect()
    synchronize(xp)
    hook = pool_peak_hook(xp)
    pool = xp.get_default_memory_pool()
    before_pool = pool.used_bytes()
    start = time.perf_counter()
    if hook is not None:
        with hook:
            trainer.train()
            synchronize(xp)
    else:
        trainer.train()
    seconds = time.perf_counter() - start
    peak, at_peak = memory.peak()
    result = {"engine_peak_bytes": peak, "engine_at_peak": at_peak, "seconds": seconds,
              "pool_used_before_bytes": before_pool,
              "pool_peak_above_start_bytes": hook.peak if hook is not None else None,
              "pool_allocations": hook.allocations if hook is not None else None,
              "pool_total_bytes_after": pool.total_bytes(), "device_used_after_bytes": device_used(xp)}
    del trainer
    gc.collect()
    return result


def run(args):
    if args.device == "strict":
        backend.set_cuda_module(strict_cupy)
    xp = backend.module_for("cuda")  # a clear RuntimeError if there is no GPU
    config, seq_len, batch = (QUICK_MODEL, QUICK_SEQ_LEN, QUICK_MICRO_BATCH) if args.quick else (MODEL, SEQ_LEN, MICRO_BATCH)
    context = device_used(xp)
    meta = {"device": args.device, "quick": args.quick, "python": platform.python_version(), "numpy": numpy.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "device_used_before_model_bytes": context}
    if hasattr(xp, "cuda"):
        props = xp.cuda.runtime.getDeviceProperties(0)
        name = props["name"]
        free, total = xp.cuda.runtime.memGetInfo()
        meta.update(gpu=name.decode() if isinstance(name, bytes) else name, cupy=xp.__version__,
                    total_memory_bytes=total, free_before_model_bytes=free)
        batch = choose_batch(config, seq_len, batch, free)
    else:
        total, meta["gpu"] = 64 << 30, None  # the stand-in: no device; fit is asked about 64 GiB
    plan = fit.plan_training(config, seq_len, effective_batch_size=batch, device_memory=int(total),
                             reserve_bytes=int(context or 0))
    results = {"meta": meta, "model": config.__dict__, "seq_len": seq_len, "micro_batch": batch,
               "fit_table": str(plan), "rows": []}
    print(f"GPT of {plan.parameters / 1e6:.0f}M parameters, sequence {seq_len}, micro-batch {batch}, on "
          f"{meta['gpu'] or 'the CPU stand-in'}", flush=True)

    random.manual_seed(0)
    model = GPT(config, rng=numpy.random.default_rng(0), device="cuda")
    rng = numpy.random.default_rng(1)
    data = [{"input_ids": rng.integers(0, config.vocab_size, seq_len), "labels": rng.integers(0, config.vocab_size, seq_len)}
            for _ in range(batch)]
    ok = True
    for name, checkpointing in strategies(plan):
        ck = checkpointing or {}
        predicted = fit.gpt_step(config, batch, seq_len, checkpointing=ck or None)
        row = {"strategy": name, "checkpointing": checkpointing, "predicted_peak_bytes": predicted.peak_bytes,
               "predicted_at_peak": predicted.at_peak, "predicted_device_bound_bytes": predicted.device_peak_bytes,
               "predicted_start_bytes": sum(predicted.start.values())}
        try:
            row.update(measure(model, data, batch, checkpointing, xp))
        except Exception as e:  # an out-of-memory on one row must not lose the others
            row["error"] = f"{type(e).__name__}: {e}"
            ok = False
        if "engine_peak_bytes" in row:
            row["engine_peak_equal"] = row["engine_peak_bytes"] == predicted.peak_bytes and \
                row["engine_at_peak"] == predicted.at_peak
            ok = ok and row["engine_peak_equal"]
            if row["pool_peak_above_start_bytes"] is not None:
                bound = predicted.device_peak_bytes - row["predicted_start_bytes"]
                row["pool_peak_minus_bound_bytes"] = row["pool_peak_above_start_bytes"] - bound
        results["rows"].append(row)
        write_json(os.path.join(args.out, "fit_check.json"), results)
        report(row)
    return ok


def report(row):
    mib = 1 << 20
    if "error" in row:
        print(f"{row['strategy']:<10} error: {row['error']}", flush=True)
        return
    line = (f"{row['strategy']:<10} engine peak {row['engine_peak_bytes'] / mib:10.2f} MiB, predicted "
            f"{row['predicted_peak_bytes'] / mib:10.2f} MiB ({'equal' if row['engine_peak_equal'] else 'DIFFERENT'})")
    if row["pool_peak_above_start_bytes"] is not None:
        bound = row["predicted_device_bound_bytes"] - row["predicted_start_bytes"]
        line += (f"; pool peak above start {row['pool_peak_above_start_bytes'] / mib:10.2f} MiB, bound "
                 f"{bound / mib:10.2f} MiB ({row['pool_peak_minus_bound_bytes'] / mib:+.2f})")
    print(line + f"; {row['seconds']:.2f} s", flush=True)


def write_json(path, obj):
    """Atomically: a temporary file in the same folder, then os.replace."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for fit_check.json (created if missing)")
    parser.add_argument("--device", choices=["cuda", "strict"], default="cuda",
                        help="cuda: CuPy on a GPU; strict: the CPU stand-in (a dry run of this script)")
    parser.add_argument("--quick", action="store_true", help="a tiny model (for the dry run)")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    try:
        return 0 if run(args) else 1
    except RuntimeError as e:
        print(f"gpu_fit_check: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
