"""What fit is asked about: a GPT's size, a GPU's memory, a precision; each read and checked.

GPU presets are the total memory CUDA reports for each card (GPUS, each from
a published report), less the CUDA context (DEFAULT_RESERVE); a size given
instead is taken as what the process can have. reserve_bytes overrides the
reserve; benchmarks/gpu_check.sh measures it on a GPU.

dtypes: float32 and float64 are the model's dtype. float16 and bfloat16
need the kind of 16-bit training said (mixed_precision), and each is run as
the Trainer runs it:
  True   mixed precision, TrainingArguments(fp16=True) or bf16=True: float32
         parameters, gradients, AdamW moments and accumulation buffers, and
         the forward's ops in 16-bit where autocast's policy says (autocast.py;
         layer norm, softmax and the loss stay float32). As PyTorch's autocast,
         not as the "16 bytes per parameter" of Rajbhandari et al. 2020 (ZeRO,
         section 3.1), which keeps 16-bit parameters beside float32 masters.
  False  a 16-bit model: every array 16-bit, AdamW's moments included.
bfloat16 needs the ml_dtypes package (NumPy has no bfloat16).
"""

import math
import re
from dataclasses import dataclass

import numpy

from .. import autocast
from ..nn.transformer import GPTConfig

# GPT-2's four sizes: n_layer, n_head and n_embd as nanoGPT's GPT.from_pretrained loads
# Hugging Face's gpt2, gpt2-medium, gpt2-large and gpt2-xl; vocabulary and context as
# transformers' GPT2Config defaults (vocab_size=50257, n_positions=1024); dropout 0.1 and
# biases, tied embedding, as GPT-2.
GPT2 = {
    "gpt2": GPTConfig(block_size=1024, vocab_size=50257, n_layer=12, n_head=12, n_embd=768, dropout=0.1),
    "gpt2-medium": GPTConfig(block_size=1024, vocab_size=50257, n_layer=24, n_head=16, n_embd=1024, dropout=0.1),
    "gpt2-large": GPTConfig(block_size=1024, vocab_size=50257, n_layer=36, n_head=20, n_embd=1280, dropout=0.1),
    "gpt2-xl": GPTConfig(block_size=1024, vocab_size=50257, n_layer=48, n_head=25, n_embd=1600, dropout=0.1),
}

GiB = 1 << 30
# name -> (what it is, nominal GB, GiB as CUDA reports its total memory). The reported total is
# what cudaMemGetInfo gives and PyTorch's out-of-memory message prints ("GPU 0 has a total
# capacity of 14.56 GiB"; c10/cuda/CUDACachingAllocator.cpp), less than the nominal size (ECC,
# the driver's reservations) and varying by a few hundredths with the driver. Each from a
# published report naming the card:
GPUS = {
    "t4": ("NVIDIA T4", 16, 14.56),  # github.com/Zheng-Chong/CatVTON/issues/133 ("Tesla T4")
    "v100-16gb": ("NVIDIA V100 16 GB", 16, 15.78),  # github.com/kchengiva/Shift-GCN/issues/34 ("16G V100")
    "v100-32gb": ("NVIDIA V100 32 GB", 32, 31.74),  # github.com/liucongg/ChatGLM-Finetuning/issues/73 ("V100 32GB")
    "a10": ("NVIDIA A10", 24, 21.99),  # github.com/zai-org/CogVLM/issues/236 (Lambda's a10)
    "l4": ("NVIDIA L4", 24, 22.03),  # github.com/ArcInstitute/evo2/issues/190 ("a L4 GPU")
    "rtx-3090": ("NVIDIA GeForce RTX 3090", 24, 23.68),  # github.com/LambdaLabsML/examples/issues/48 ("3090")
    "rtx-4090": ("NVIDIA GeForce RTX 4090", 24, 23.64),  # github.com/ali-vilab/VGen/issues/104 ("RTX 4090 24GB")
    "a100-40gb": ("NVIDIA A100 40 GB", 40, 39.39),  # github.com/bottlerocket-os/bottlerocket/pull/3873 (deviceQuery,
    #                                                 A100-SXM4-40GB: 42298834944 bytes)
    "a100-80gb": ("NVIDIA A100 80 GB", 80, 79.15),  # github.com/vllm-project/vllm/issues/4408 ("A100 80GB")
    "h100-80gb": ("NVIDIA H100 80 GB", 80, 79.18),  # github.com/shyampathak22/prime-rl, benchmarks/results/BENCHMARKS.md
    #                                                 ("1xH100 HBM3")
    "h200": ("NVIDIA H200", 141, 139.81),  # github.com/sungwon-chae/arxiv_confi, etu_logging.md ("NVIDIA H200")
}
# What a GPU's process cannot have of that total, by default: the CUDA context (the driver and the
# loaded kernels), about 300 MB (github.com/pytorch/pytorch/issues/107667) to 400 MB
# (github.com/pytorch/pytorch/issues/109888) with the lazy module loading PyTorch has set since 1.13
# (github.com/pytorch/pytorch/pull/86509), and it cannot be freed.
# Rounded up to 0.5 GiB for the caching allocator's rounding: that margin is ours, not a source's.
DEFAULT_RESERVE = GiB // 2

UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


@dataclass(frozen=True)
class Precision:
    """What the arrays of a step are made of, and how the step is run."""

    dtype: str  # the model's: its parameters, gradients, optimizer state and buffers
    autocast: str  # None, or the 16-bit dtype autocast runs the forward's ops in (TrainingArguments fp16/bf16)
    description: str

    @property
    def itemsize(self):
        """Bytes per element of most activations (the planner's formulas' unit)."""
        return 2 if self.autocast else dtype_of(self.dtype).itemsize


def precision(dtype="float32", mixed_precision=None):
    """The Precision of a dtype name; 16-bit ones need mixed_precision (True or False) said."""
    if dtype in ("float32", "float64"):
        if mixed_precision:
            raise ValueError(f"mixed_precision applies to float16 and bfloat16, not to dtype {dtype!r}")
        return Precision(dtype, None, dtype)
    if dtype in ("float16", "bfloat16"):
        if mixed_precision is None:
            raise ValueError(
                f"dtype {dtype!r}: say which 16-bit training with mixed_precision=True (autocast: float32 parameters, "
                "gradients, AdamW moments and buffers, the forward's ops in 16-bit; TrainingArguments "
                f"{'fp16' if dtype == 'float16' else 'bf16'}=True) or mixed_precision=False (a 16-bit model: every "
                "array 16-bit)")
        if mixed_precision:
            flag = "fp16" if dtype == "float16" else "bf16"
            return Precision("float32", dtype, f"{dtype} mixed precision ({flag}=True: float32 parameters and state, "
                             f"the forward's ops in {dtype} as autocast's policy says)")
        return Precision(dtype, None, f"pure {dtype} (a {dtype} model: every array 16-bit, AdamW's moments too)")
    raise ValueError(f"dtype must be one of float32, float64, float16, bfloat16, got {dtype!r}")


def model_config(model):
    """A GPTConfig from itself, a GPT-2 preset's name, or a dict of GPTConfig's fields; checked."""
    if isinstance(model, str):
        if model not in GPT2:
            raise ValueError(f"unknown model preset {model!r}: use one of {', '.join(GPT2)}, or give the GPT's fields")
        return GPT2[model]
    if isinstance(model, dict):
        unknown = set(model) - set(GPTConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown GPTConfig field(s) {', '.join(sorted(unknown))}; the fields are "
                             f"{', '.join(GPTConfig.__dataclass_fields__)}")
        model = GPTConfig(**model)
    if not isinstance(model, GPTConfig):
        raise TypeError(f"model must be a GPTConfig, a preset name or a dict of fields, got {type(model).__name__}")
    for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
        positive_int(name, getattr(model, name))
    if model.n_embd % model.n_head:
        raise ValueError(f"n_head ({model.n_head}) must divide n_embd ({model.n_embd})")
    if not 0 <= model.dropout < 1:
        raise ValueError(f"dropout must be in [0, 1), got {model.dropout}")
    return model


def device_memory_bytes(memory):
    """(bytes, label) from a GPU preset's name (its total as CUDA reports it), a number of bytes, or a size
    with its unit such as '24GiB', '16 GB' or '17179869184B'.

    A string that is a bare number is refused: '3090' is a GPU's name far
    more often than 3,090 bytes, so a size written as text says its unit.
    """
    if isinstance(memory, str):
        key = memory.strip().lower()
        if key in GPUS:
            name, nominal, gib = GPUS[key]
            return round(gib * GiB), f"{name}, {nominal} GB nominal, {gib} GiB as CUDA reports it"
        number = key.rstrip("abcdefghijklmnopqrstuvwxyz ")
        unit = key[len(number):].strip()
        if not unit and re.fullmatch(r"[0-9.e+]+", number):  # a number, not 'h300'
            like = [g for g in GPUS if len(number) > 1 and number in g]  # "3090" -> rtx-3090
            raise ValueError(f"device memory {memory!r} is a bare number: give a GPU preset "
                             f"({', '.join(GPUS)}{'; did you mean ' + ' or '.join(like) + '?' if like else ''}) "
                             f"or a size with its unit ({memory.strip()}B for bytes, 24GiB, 16GB)")
        try:
            value = float(number) if unit in UNITS else None
        except ValueError:  # 'h300', 'a100': a GPU's name this table does not have
            value = None
        if value is None or not math.isfinite(value):
            raise ValueError(f"device memory {memory!r} is neither a GPU preset ({', '.join(GPUS)}) nor a size "
                             "such as 24GiB, 16GB or 17179869184B")
        memory = int(value * UNITS[unit])
    if (isinstance(memory, bool) or not isinstance(memory, (int, float)) or not math.isfinite(memory)
            or memory <= 0):
        raise ValueError(f"device memory must be a positive size, got {memory!r}")
    memory = int(memory)
    return memory, format_size(memory)


def positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def dtype_of(name):
    """A NumPy dtype from its name; bfloat16 from ml_dtypes, as autocast gets it (ValueError without it)."""
    if name != "bfloat16":
        return numpy.dtype(name)
    try:
        return autocast.bfloat16()
    except ImportError as e:  # the command line reports a ValueError as a one-line error
        raise ValueError(str(e)) from None


def format_size(n):
    for unit, scale in (("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"

