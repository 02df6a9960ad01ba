"""The small CNN (nn/cnn.py): its shapes, checkpointed gradients equal to plain ones, and that it learns."""

import numpy
import pytest

from tinygrad_ckpt import Tensor, optim
from tinygrad_ckpt.nn import CNN, CNNConfig

F64 = numpy.float64
TINY = CNNConfig(image_size=8, in_channels=2, n_classes=3, widths=(3, 4), convs_per_stage=2)


def test_default_config_takes_32x32_images_to_class_logits():
    model = CNN(CNNConfig(), rng=numpy.random.default_rng(0))
    x = Tensor(numpy.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(numpy.float32))
    logits, loss = model(x, numpy.array([3, 7]))
    assert logits.shape == (2, 10) and loss.shape == () and numpy.isfinite(loss.item())
    with pytest.raises(ValueError, match=r"expected images \(B, 3, 32, 32\), got shape \(2, 3, 16, 16\)"):
        model(Tensor(numpy.zeros((2, 3, 16, 16), dtype=numpy.float32)))
    with pytest.raises(ValueError, match="divisible by 2 \\*\\* 3"):
        CNN(CNNConfig(image_size=12))


@pytest.mark.equivalence
@pytest.mark.parametrize("segments", ["every", 1, [0, 1, 2]])
def test_checkpointed_gradients_and_running_statistics_equal_the_plain_ones(segments):
    x = numpy.random.default_rng(2).standard_normal((4, 2, 8, 8)) * 2 + 0.5
    targets = numpy.array([0, 2, 1, 2])
    results = []
    for checkpointed in (False, True):
        model = CNN(TINY, rng=numpy.random.default_rng(3), dtype=F64)
        if checkpointed:
            model.gradient_checkpointing_enable(segments)
        xt = Tensor(x, requires_grad=True)
        _, loss = model(xt, targets)
        loss.backward()
        grads = {name: p.grad.numpy() for name, p in model.named_parameters()}
        stats = {name: b.numpy().copy() for name, b in model.named_buffers()}
        results.append((loss.item(), xt.grad.numpy(), grads, stats))
    (plain_loss, plain_dx, plain_grads, plain_stats), (loss, dx, grads, stats) = results
    assert loss == plain_loss
    numpy.testing.assert_allclose(dx, plain_dx, rtol=1e-12, atol=1e-15)
    assert grads.keys() == plain_grads.keys() and len(grads) == 2 * 3 + 2 * 3 + 2  # conv, bn weight, bn bias; head
    for name in grads:
        numpy.testing.assert_allclose(grads[name], plain_grads[name], rtol=1e-12, atol=1e-15, err_msg=name)
    initial = {"running_mean": 0.0, "running_var": 1.0, "num_batches_tracked": 0}
    for name in stats:  # moved once per step, checkpointed or not (the count is 1, not 2)
        numpy.testing.assert_allclose(stats[name], plain_stats[name], rtol=1e-12, err_msg=name)
        assert not numpy.allclose(stats[name], initial[name.rsplit(".", 1)[1]]), name


def bars(n, rng, size=8):
    """A tiny generated data set: one-channel images with a bright bar, horizontal (class 0) or vertical (1), in noise."""
    labels = rng.integers(0, 2, n)
    images = rng.normal(0.0, 0.3, (n, 1, size, size))
    where = rng.integers(0, size, n)
    for i, (label, k) in enumerate(zip(labels, where)):
        if label == 0:
            images[i, 0, k, :] += 1.5
        else:
            images[i, 0, :, k] += 1.5
    return images.astype(numpy.float32), labels


def test_it_learns_a_tiny_generated_data_set():
    rng = numpy.random.default_rng(4)
    images, labels = bars(64, rng)
    model = CNN(CNNConfig(image_size=8, in_channels=1, n_classes=2, widths=(4, 8), convs_per_stage=1),
                rng=numpy.random.default_rng(5))
    optimizer = optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.0)
    losses = []
    for step in range(40):
        _, loss = model(Tensor(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.25 * losses[0], losses
    model.eval()  # the running statistics, on images the model has not seen
    test_images, test_labels = bars(64, rng)
    logits, _ = model(Tensor(test_images))
    accuracy = (logits.numpy().argmax(axis=1) == test_labels).mean()
    assert accuracy >= 0.9, accuracy


def _images(n=8, seed=0):
    rng = numpy.random.default_rng(seed)
    return {"x": rng.standard_normal((n, 3, 8, 8)).astype(numpy.float64), "y": rng.integers(0, 10, n)}


def _summed_loss(model, batch):
    import tinygrad_ckpt.functional as F

    logits, _ = model(Tensor(batch["x"]))
    return F.cross_entropy(logits, batch["y"], reduction="sum")


@pytest.mark.equivalence
@pytest.mark.parametrize("splits", [2, 4, [3, 3, 2]])
def test_accumulation_equals_the_whole_batch_with_batchnorm_s_running_statistics(splits):
    """In eval mode BatchNorm normalises by its running statistics, each image on its own: accumulated
    micro-batches give the whole batch's gradient. In training mode it normalises each micro-batch by its
    own statistics, so they do not (tutorial 12): the same check fails, as it must."""
    from tinygrad_ckpt.testing import check_accumulation

    model = CNN(CNNConfig(image_size=8, widths=(4, 8)), rng=numpy.random.default_rng(1), dtype=numpy.float64)
    model.eval()
    assert check_accumulation(model, _summed_loss, _images(), splits=splits)
    model.train()
    assert not check_accumulation(model, _summed_loss, _images(), splits=splits)
