"""The Trainer's mixed precision reaches every model: a compute_loss_func runs under autocast too.

Before, the Trainer entered autocast only around its own GPT loss, so bf16=True or fp16=True with a
compute_loss_func (how every model but the GPT trains) ran the whole forward in float32.
"""

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygrad_ckpt import Tensor, autocast, fit
from tinygrad_ckpt import functional as F
from tinygrad_ckpt.nn import MLP
from tinygrad_ckpt.train import Trainer, TrainingArguments


def classification_loss(model, batch):
    logits = model(Tensor(batch["x"], device=next(model.parameters()).device))
    return F.cross_entropy(logits, batch["y"], reduction="sum"), len(batch["y"])


@settings(deadline=None, max_examples=10)
@given(flag=st.sampled_from([None, "bf16", "fp16"]), batch=st.integers(1, 4))
def test_a_compute_loss_func_runs_under_the_autocast_the_arguments_ask_for(flag, batch):
    if flag == "bf16":
        pytest.importorskip("ml_dtypes")
    seen = []

    def loss(model, b):
        seen.append(autocast.get_dtype())
        return classification_loss(model, b)

    rng = numpy.random.default_rng(0)
    data = [{"x": rng.standard_normal(6).astype(numpy.float32), "y": numpy.int64(i % 3)} for i in range(8)]

    def collate(examples):
        return {"x": numpy.stack([e["x"] for e in examples]), "y": numpy.array([e["y"] for e in examples])}

    fields = {"per_device_train_batch_size": batch, "max_steps": 1, "logging_steps": 1, "save_steps": 0}
    if flag:
        fields[flag] = True
    trainer = Trainer(MLP(6, 8, 3, n_layers=1), TrainingArguments(**fields), data,
                      data_collator=collate, compute_loss_func=loss)
    trainer.train()
    expected = {None: None, "bf16": "bfloat16", "fp16": "float16"}[flag]
    assert seen and all(dtype == expected for dtype in seen), seen


def test_bf16_lowers_the_saved_activations_of_a_model_trained_with_a_compute_loss_func():
    pytest.importorskip("ml_dtypes")
    shapes = {"x": ((256, 512), "float32"), "y": ((256,), "int64")}

    def step(**arguments):
        return fit.estimate_step(MLP(512, 1024, 10, n_layers=4, device="meta"), shapes,
                                 classification_loss, arguments)

    plain, mixed = step(), step(bf16=True)
    assert mixed.start["parameters"] == plain.start["parameters"]  # float32 parameters in mixed precision
    assert mixed.peak_bytes < plain.peak_bytes
