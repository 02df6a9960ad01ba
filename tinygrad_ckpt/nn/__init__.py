"""Layers and models, as torch.nn: `from tinygrad_ckpt import nn`.

module.py       Parameter, Module (finding parameters, state_dict, train/eval)
layers.py       Linear, Embedding, LayerNorm, BatchNorm1d, BatchNorm2d, Flatten,
                Dropout, GELU, Tanh, ReLU, LeakyReLU, ReLU6, SiLU, Hardswish,
                Softplus, Mish, Sequential, ModuleList
conv.py         Conv2d, MaxPool2d, AvgPool2d
mlp.py          MLP, the deep chain of workload W1
transformer.py  GPTConfig, CausalSelfAttention, FeedForward, TransformerBlock,
                GPT (workload W2)
cnn.py          CNNConfig, CNN: a small convolutional network for 32x32 images
encoder.py      EncoderConfig, Encoder: the GPT's blocks without the causal mask, a classifier
lstm.py         lstm_cell, LSTMCell, LSTM (checkpointed through time), LSTMConfig,
                LSTMLanguageModel
"""

from .cnn import CNN, CNNConfig
from .conv import AvgPool2d, Conv2d, MaxPool2d
from .encoder import Encoder, EncoderConfig
from .layers import (
    GELU, BatchNorm1d, BatchNorm2d, Dropout, Embedding, Flatten, Hardswish, LayerNorm, LeakyReLU, Linear, Mish,
    ModuleList, ReLU, ReLU6, Sequential, SiLU, Softplus, Tanh,
)
from .lstm import LSTM, LSTMCell, LSTMConfig, LSTMLanguageModel, lstm_cell
from .mlp import MLP
from .module import LoadStateDictError, Module, Parameter
from .transformer import GPT, CausalSelfAttention, FeedForward, GPTConfig, TransformerBlock

__all__ = [
    "Parameter", "Module", "LoadStateDictError",
    "Linear", "Embedding", "LayerNorm", "BatchNorm1d", "BatchNorm2d", "Flatten", "Dropout",
    "GELU", "Tanh", "ReLU", "LeakyReLU", "ReLU6", "SiLU", "Hardswish", "Softplus", "Mish",
    "Conv2d", "MaxPool2d", "AvgPool2d",
    "Sequential", "ModuleList",
    "MLP", "GPTConfig", "CausalSelfAttention", "FeedForward", "TransformerBlock", "GPT", "CNNConfig", "CNN",
    "EncoderConfig", "Encoder", "lstm_cell", "LSTMCell", "LSTM", "LSTMConfig", "LSTMLanguageModel",
]
