"""The model kinds besides the GPT, each from its sizes: its model, one example's fields, its loss.

The MLP, the CNN, the LSTM language model and the encoder train through the
same Trainer as the GPT; what differs is the model, what one example holds,
and the Trainer's compute_loss_func ((model, batch) -> (sum of the losses,
items)). One table of them, so that everything that builds a kind (the
command line's `train --model`, `fit --model`, `bench --kinds`) builds the
same model, on any device ("meta" for fit), from sizes named as the command
line's model flags (n_layer, n_embd, hidden_size, image_size, widths,
block_size, n_head, dropout).

    >>> model = KINDS["cnn"].build(KINDS["cnn"].sizes)                   # the default CNN
    >>> KINDS["cnn"].example(KINDS["cnn"].sizes)                       # one example: field -> (shape, dtype, high)
    {'x': ((3, 32, 32), 'float32', None), 'y': ((), 'int64', 10)}

What does not live here: the models (nn/), their data (data.py), the flags (cli.py).
"""

from dataclasses import dataclass

import numpy

from . import backend
from . import functional as F
from .nn import CNN, MLP, CNNConfig, Encoder, EncoderConfig, LSTMConfig, LSTMLanguageModel
from .tensor import Tensor


def curve_loss(model, batch):
    """The MLP's loss: the sum of the squared errors over the points, and how many points."""
    device = model.head.weight.device
    predicted = model(Tensor(batch["x"], device=device))  # (B, 1)
    return F.mse_loss(predicted, Tensor(batch["y"], device=device), reduction="sum"), len(batch["y"])


def image_loss(model, batch):
    """A CNN's loss: the sum of the cross-entropies of the images' logits, and how many images."""
    logits, _ = model(Tensor(batch["x"], device=model.head.weight.device))  # (B, n_classes)
    return F.cross_entropy(logits, backend.to_device(batch["y"], logits.device), reduction="sum"), len(batch["y"])


def language_model_loss(model, batch):
    """The LSTM's and the GPT's loss, as the Trainer's own: the sum over every token, and how many tokens."""
    logits, _ = model(batch["input_ids"])  # (B, T, vocab)
    labels = batch["labels"]
    return F.cross_entropy(logits, backend.to_device(labels, logits.device), reduction="sum"), labels.size


def sequence_label_loss(model, batch):
    """The encoder's loss: one label per sequence."""
    logits, _ = model(batch["input_ids"])  # (B, num_classes)
    labels = batch["labels"]
    return F.cross_entropy(logits, backend.to_device(labels, logits.device), reduction="sum"), len(labels)


@dataclass(frozen=True)
class ModelKind:
    """One kind: its sizes and their defaults, how to build it, one example, its loss, what checkpointing cuts."""

    sizes: dict  # the size fields it takes (the command line's model flags' names) -> their defaults
    make: object  # (sizes, vocab_size, rng, device) -> the model
    fields: object  # (sizes, vocab_size) -> one example: field -> (shape, dtype, high: labels in [0, high); None: normal)
    loss: object  # the Trainer's compute_loss_func
    chain: str  # what checkpointing cuts into segments (the links of its chain)
    item: str  # what the loss is a mean over
    vocab_size: int = None  # the token ids it reads (None: the text's: the tokenizer's)

    def build(self, sizes, vocab_size=None, rng=None, device=None):
        """The model at these sizes (a dict holding at least self.sizes' names), weights from rng."""
        return self.make(sizes, vocab_size or self.vocab_size, rng, device)

    def example(self, sizes, vocab_size=None):
        return self.fields(sizes, vocab_size or self.vocab_size)


KINDS = {
    "mlp": ModelKind(
        sizes=dict(n_layer=4, n_embd=64),
        make=lambda s, v, rng, device: MLP(1, s["n_embd"], 1, s["n_layer"], rng=rng, device=device),
        fields=lambda s, v: {"x": ((1,), "float32", None), "y": ((1,), "float32", None)},
        loss=curve_loss, chain="blocks", item="point"),
    "cnn": ModelKind(
        sizes=dict(image_size=32, widths=(16, 32, 64)),
        make=lambda s, v, rng, device: CNN(CNNConfig(image_size=s["image_size"], n_classes=10, widths=s["widths"]),
                                           rng=rng, device=device),
        fields=lambda s, v: {"x": ((3, s["image_size"], s["image_size"]), "float32", None), "y": ((), "int64", 10)},
        loss=image_loss, chain="stages", item="image"),
    "lstm": ModelKind(  # the GPT's contract (forward(input_ids) -> logits (B, T, vocab)): the Trainer's own loss
        sizes=dict(block_size=64, dropout=0.0, n_layer=1, n_embd=64, hidden_size=128),
        make=lambda s, v, rng, device: LSTMLanguageModel(LSTMConfig(
            vocab_size=v, n_embd=s["n_embd"], hidden_size=s["hidden_size"], num_layers=s["n_layer"],
            dropout=s["dropout"]), rng=rng, device=device),
        fields=lambda s, v: {name: ((s["block_size"],), "int64", v) for name in ("input_ids", "labels")},
        loss=language_model_loss, chain="time steps", item="token"),
    "encoder": ModelKind(
        sizes=dict(block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0),
        make=lambda s, v, rng, device: Encoder(EncoderConfig(
            block_size=s["block_size"], vocab_size=v, num_classes=v, n_layer=s["n_layer"], n_head=s["n_head"],
            n_embd=s["n_embd"], dropout=s["dropout"]), rng=rng, device=device),
        fields=lambda s, v: {"input_ids": ((s["block_size"],), "int64", v), "labels": ((), "int64", v)},
        loss=sequence_label_loss, chain="blocks", item="sequence", vocab_size=8),
}


def batch_shapes(example, batch_size):
    """{field: (shape of batch_size examples, dtype)}: what fit.estimate_step takes, from an example's fields."""
    return {name: ((batch_size, *shape), numpy.dtype(dtype)) for name, (shape, dtype, _) in example.items()}
