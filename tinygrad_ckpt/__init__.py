"""tinygrad_ckpt: a small tape-based autograd engine for learning how training fits in memory.

    from tinygrad_ckpt import Tensor, no_grad
    import tinygrad_ckpt.functional as F
"""

from . import autograd, backend, functional, memory
from .random import manual_seed
from .tape import enable_grad, is_grad_enabled, no_grad
from .tensor import Tensor, from_numpy, ones, randn, tensor, zeros

__version__ = "0.1.0"

__all__ = [
    "Tensor", "tensor", "from_numpy", "zeros", "ones", "randn", "no_grad", "enable_grad", "is_grad_enabled",
    "manual_seed", "functional", "memory", "backend", "autograd",
]
