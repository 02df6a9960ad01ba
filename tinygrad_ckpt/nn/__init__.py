"""Layers and models, as torch.nn: `from tinygrad_ckpt import nn`.

module.py       Parameter, Module (finding parameters, state_dict, train/eval)
layers.py       Linear, Embedding, LayerNorm, BatchNorm1d, Dropout, GELU, Tanh,
                ReLU, Sequential, ModuleList
mlp.py          MLP, the deep chain of workload W1
transformer.py  GPTConfig, CausalSelfAttention, FeedForward, TransformerBlock,
                GPT (workload W2)
encoder.py      EncoderConfig, Encoder: the GPT's blocks without the causal mask, a classifier
lstm.py         lstm_cell, LSTMCell, LSTM (checkpointed through time), LSTMConfig,
                LSTMLanguageModel
"""

from .encoder import Encoder, EncoderConfig
from .layers import (
    GELU, BatchNorm1d, Dropout, Embedding, LayerNorm, Linear, ModuleList, ReLU, Sequential, Tanh,
)
from .lstm import LSTM, LSTMCell, LSTMConfig, LSTMLanguageModel, lstm_cell
from .mlp import MLP
from .module import LoadStateDictError, Module, Parameter
from .transformer import GPT, CausalSelfAttention, FeedForward, GPTConfig, TransformerBlock

__all__ = [
    "Parameter", "Module", "LoadStateDictError",
    "Linear", "Embedding", "LayerNorm", "BatchNorm1d", "Dropout", "GELU", "Tanh", "ReLU",
    "Sequential", "ModuleList",
    "MLP", "GPTConfig", "CausalSelfAttention", "FeedForward", "TransformerBlock", "GPT",
    "EncoderConfig", "Encoder", "lstm_cell", "LSTMCell", "LSTM", "LSTMConfig", "LSTMLanguageModel",
]
