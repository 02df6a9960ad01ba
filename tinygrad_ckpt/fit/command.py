"""tinygrad-ckpt fit: plan_training (a GPT) or plan_kind (another model kind) from the command line's flags, printed."""

import argparse
import re

from ..kinds import KINDS
from .inputs import GPT2, GPUS, device_memory_bytes
from .kinds import plan_kind
from .plan import plan_training

DESCRIPTION = """Will a GPT training step fit on a GPU, and with which technique? For no checkpointing,
every block, half blocks, sqrt(n), the selective policy and the planner: the peak of one
step by category, the largest micro-batch that fits, the accumulation steps for the
effective batch, the recompute time; then the recommendation and its TrainingArguments.
The other model kinds (mlp, cnn, lstm, encoder; sized with `train --model KIND`'s flags):
no checkpointing, every link of the chain and sqrt(n), each in float32 and 16-bit mixed precision.

  tinygrad-ckpt fit --model gpt2-xl --memory a100-80gb --effective-batch-size 512 --processes 8
  tinygrad-ckpt fit --model gpt2 --n-layer 24 --memory 24GiB --seq-len 512
  tinygrad-ckpt fit --model gpt2-large --memory t4 --dtype bfloat16 --mixed-precision
  tinygrad-ckpt fit --model gpt2-xl --memory v100-16gb --effective-batch-size 8 --processes 8 --zero-stage 2
  tinygrad-ckpt fit --model cnn --image-size 224 --widths 64,128,256,512 --memory v100-16gb --effective-batch-size 256

GPUs: """ + ", ".join(GPUS) + """ (the total CUDA reports for each, less 0.5 GiB for the CUDA
context: see --reserve)."""

# The flag that sets each plan_training argument or GPTConfig field, for error messages.
FLAGS = {"seq_len": "--seq-len", "effective_batch_size": "--effective-batch-size", "processes": "--processes",
         "reserve_bytes": "--reserve", "dtype": "--dtype", "mixed_precision": "--mixed-precision",
         "planner_layers": "--planner-layers", "block_size": "--block-size", "vocab_size": "--vocab-size",
         "n_layer": "--n-layer", "n_head": "--n-head", "n_embd": "--n-embd", "dropout": "--dropout",
         "hidden_size": "--hidden-size", "image_size": "--image-size", "widths": "--widths",
         "device memory": "--memory", "model preset": "--model", "zero_stage": "--zero-stage"}
MODEL_FLAGS = ("n_layer", "n_head", "n_embd", "vocab_size", "block_size", "dropout")  # GPTConfig fields with a flag
KIND_FLAGS = ("hidden_size", "image_size", "widths")  # the other kinds' size flags that are no GPT's
# The flags only a GPT takes, by dest name, and their defaults (given otherwise, they are refused for a kind).
GPT_ONLY = dict(seq_len=None, no_bias=False, no_tie_weights=False, nested_plans=False, planner_layers=None,
                zero_stage=None)


def add_arguments(parser):
    model = parser.add_argument_group("model (a GPT-2 size, and any field changed; or another kind and its sizes)")
    model.add_argument("--model", default="gpt2", metavar="PRESET",
                       help=f"{', '.join(GPT2)}, or a kind: {', '.join(KINDS)} (default: %(default)s)")
    for name in MODEL_FLAGS[:-1] + KIND_FLAGS[:-1]:
        model.add_argument(FLAGS[name], type=int, default=None, dest=name,
                           help=f"{name} (default: the preset's or the kind's: {_taken_by(name)})")
    model.add_argument("--widths", type=_widths, default=None,
                       help=f"the CNN's stages, by their channels: 16,32,64 (default: {_taken_by('widths')})")
    model.add_argument("--dropout", type=float, default=None, help="dropout probability (default: the preset's, 0.1)")
    model.add_argument("--no-bias", action="store_true", help="no biases in Linear and LayerNorm layers")
    model.add_argument("--no-tie-weights", action="store_true", help="lm_head its own matrix, not the token embedding")
    run = parser.add_argument_group("training")
    run.add_argument("--seq-len", type=int, default=None, help="tokens per example (default: the block size)")
    run.add_argument("--effective-batch-size", type=int, default=8,
                     help="examples per optimizer step, all processes together (default: %(default)s)")
    run.add_argument("--processes", type=int, default=None,
                     help="data-parallel processes, one per GPU (default: 1)")
    run.add_argument("--zero-stage", type=int, default=None, metavar="S",
                     help="with --processes N: every peak is one process's of N under ZeRO stage S (zero.py: 1 "
                          "shards the optimizer state, 2 the accumulation buffers too, 3 the parameters too), run on the meta device, not "
                          "a formula; adds a row per stage, and where nothing fits names the stage and processes "
                          "that do. DeepSpeed's estimate_zero2/3_model_states_mem_needs_all_live count the model "
                          "states only, no activations or buffers (fit/sharded.py)")
    run.add_argument("--dtype", default="float32", help="float32, float64, float16 or bfloat16 (default: %(default)s)")
    run.add_argument("--mixed-precision", action=argparse.BooleanOptionalAction, default=None,
                     help="for float16/bfloat16, required: float32 master weights and AdamW moments "
                          "(--mixed-precision: float32 parameters and state, autocast's 16-bit ops) or a 16-bit model "
                          "(--no-mixed-precision)")
    hw = parser.add_argument_group("device")
    hw.add_argument("--memory", default="a100-80gb",
                    help="a GPU (" + ", ".join(GPUS) + "), or a size with its unit: 24GiB, 16GB, 17179869184B "
                         "(default: %(default)s)")
    hw.add_argument("--reserve", default=None, metavar="SIZE",
                    help="memory to keep free: the CUDA context, the allocator's overheads (default: 0.5 GiB for a "
                         "GPU preset, 0 for a size)")
    plan = parser.add_argument_group("planner")
    plan.add_argument("--nested-plans", action="store_true",
                      help="let the planner recompute some blocks more than once")
    plan.add_argument("--planner-layers", type=int, default=None,
                      help="the planner cuts every ceil(n_layer / this) blocks (default: 24)")


def _taken_by(name):
    """The kinds that take a size flag, with their defaults: 'mlp 4, lstm 1'."""
    shown = lambda v: ",".join(map(str, v)) if isinstance(v, tuple) else str(v)  # noqa: E731
    return ", ".join(f"{kind} {shown(k.sizes[name])}" for kind, k in KINDS.items() if name in k.sizes) or "none"


def _widths(text):
    """An argparse type: channels per stage, '16,32,64' -> (16, 32, 64)."""
    try:
        widths = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"give the channels of each stage as integers, 16,32,64: {text!r}") from None
    if min(widths) < 1:
        raise argparse.ArgumentTypeError(f"every width must be at least 1, got {text!r}")
    return widths


def run(args):
    """tinygrad-ckpt fit: plan_training from the flags, printed."""
    try:
        if args.dtype in ("float16", "bfloat16") and args.mixed_precision is None:
            raise ValueError(f"--dtype {args.dtype}: add --mixed-precision (autocast: float32 parameters and "
                             "state, the forward's ops in 16-bit) or --no-mixed-precision (a 16-bit model)")
        if args.model in KINDS:
            return _run_kind(args)
        if args.model not in GPT2:
            raise ValueError(f"unknown model preset {args.model!r}: use one of {', '.join(GPT2)}, or a model kind: "
                             f"{', '.join(KINDS)}")
        _refuse([name for name in KIND_FLAGS if getattr(args, name) is not None], args.model,
                list(MODEL_FLAGS) + list(GPT_ONLY))
        fields = {name: getattr(args, name) for name in MODEL_FLAGS if getattr(args, name) is not None}
        fields.update({"bias": False} if args.no_bias else {})
        fields.update({"tie_weights": False} if args.no_tie_weights else {})
        model = args.model if not fields else {**GPT2[args.model].__dict__, **fields}
        if args.zero_stage is not None and args.processes is None:
            raise ValueError(f"--zero-stage {args.zero_stage} shards across processes: add --processes N, the "
                             "number of GPUs (one process each) to plan for")
        plan = plan_training(model, args.seq_len, args.effective_batch_size, args.memory, args.dtype,
                             args.mixed_precision, _processes(args), _reserve(args), args.nested_plans,
                             24 if args.planner_layers is None else args.planner_layers, args.zero_stage)
    except ValueError as e:
        raise ValueError(_flag_names(str(e))) from None
    if not isinstance(args.model, str) or fields:
        plan.model_name = f"{args.model} with " + ", ".join(f"{k}={v}" for k, v in fields.items())
    print(plan)
    return 0


def _run_kind(args):
    """tinygrad-ckpt fit --model KIND: plan_kind from the kind's size flags, printed."""
    takes = list(KINDS[args.model].sizes) + (["vocab_size"] if args.model == "lstm" else [])
    _refuse([name for name in MODEL_FLAGS + KIND_FLAGS if name not in takes and getattr(args, name) is not None]
            + [name for name, default in GPT_ONLY.items() if getattr(args, name) != default], args.model, takes)
    sizes = {name: getattr(args, name) for name in KINDS[args.model].sizes if getattr(args, name) is not None}
    plan = plan_kind(args.model, sizes, args.effective_batch_size, args.memory, args.dtype, args.mixed_precision,
                     _processes(args), _reserve(args), args.vocab_size)
    print(plan)
    return 0


def _processes(args):
    """--processes (None: 1)."""
    return 1 if args.processes is None else args.processes


def _reserve(args):
    """--reserve in bytes (None: the default for --memory)."""
    reserve = None if args.reserve is None else 0
    if args.reserve is not None and args.reserve.strip() not in ("0", ""):
        if args.reserve.strip().lower() in GPUS:
            raise ValueError(f"--reserve {args.reserve!r}: give a size such as 2GiB, 500MB or 536870912B")
        try:
            reserve = device_memory_bytes(args.reserve)[0]
        except ValueError:
            raise ValueError(f"--reserve {args.reserve!r} is not a size with its unit, such as 2GiB, 500MB or "
                             "536870912B") from None
    return reserve


def _refuse(given, model, takes):
    """A ValueError for the flags `given` that --model `model` does not take (it takes `takes`)."""
    if given:
        flags = ", ".join(FLAGS.get(name, "--" + name.replace("_", "-")) for name in given)
        raise ValueError(f"{flags} {'does' if len(given) == 1 else 'do'} not apply to --model {model}, which takes "
                         f"{', '.join(FLAGS.get(name, '--' + name.replace('_', '-')) for name in takes)} (and "
                         "--memory, --reserve, --effective-batch-size, --processes, --dtype, --mixed-precision)")


def _flag_names(message):
    """An error message with plan_training's argument and field names written as the flags that set them."""
    for name in sorted(FLAGS, key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){re.escape(name)}(?![\w])", FLAGS[name], message)
    return message
