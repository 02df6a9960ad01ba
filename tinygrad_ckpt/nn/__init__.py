"""Layers and models, as torch.nn: `from tinygrad_ckpt import nn`.

module.py       Parameter, Module (finding parameters, state_dict, train/eval)
layers.py       Linear, Embedding, LayerNorm, BatchNorm1d, Dropout, GELU, Tanh,
                ReLU, Sequential, ModuleList
"""

from .layers import (
    GELU, BatchNorm1d, Dropout, Embedding, LayerNorm, Linear, ModuleList, ReLU, Sequential, Tanh,
)
from .module import LoadStateDictError, Module, Parameter

__all__ = [
    "Parameter", "Module", "LoadStateDictError",
    "Linear", "Embedding", "LayerNorm", "BatchNorm1d", "Dropout", "GELU", "Tanh", "ReLU",
    "Sequential", "ModuleList",
]
