"""Bad input gets an error that names the op and what is wrong."""

import numpy
import pytest

import tinygrad_ckpt as tg
import tinygrad_ckpt.functional as F
from tinygrad_ckpt import Tensor, backend


def test_matmul_inner_dimensions():
    with pytest.raises(ValueError, match=r"matmul: inner dimensions differ: \(2, 3\) @ \(4, 5\)"):
        Tensor(numpy.ones((2, 3))) @ Tensor(numpy.ones((4, 5)))


def test_linear_feature_mismatch():
    with pytest.raises(ValueError, match="linear: input has 3 features"):
        F.linear(Tensor(numpy.ones((2, 3))), Tensor(numpy.ones((4, 5))))


def test_broadcast_mismatch_names_the_op_and_shapes():
    with pytest.raises(ValueError, match=r"add: shapes \(2, 3\) and \(4,\) cannot be broadcast"):
        Tensor(numpy.ones((2, 3))) + Tensor(numpy.ones(4))


def test_mixed_dtypes_are_an_error_not_an_upcast():
    with pytest.raises(TypeError, match="Mul: inputs have different dtypes \\(float32 and float64\\)"):
        Tensor(numpy.ones(2, dtype=numpy.float32)) * Tensor(numpy.ones(2, dtype=numpy.float64))


def test_reshape_size_mismatch():
    with pytest.raises(ValueError, match=r"reshape: cannot reshape a tensor of shape \(2, 3\) \(6 elements\) into \(4,\)"):
        Tensor(numpy.ones((2, 3))).reshape(4)


def test_cross_entropy_target_out_of_range():
    with pytest.raises(ValueError, match="target 7 is out of range for 5 classes"):
        F.cross_entropy(Tensor(numpy.ones((2, 5))), numpy.array([1, 7]))


def test_cross_entropy_float_targets():
    with pytest.raises(TypeError, match="targets must be integers"):
        F.cross_entropy(Tensor(numpy.ones((2, 5))), numpy.array([1.0, 2.0]))


def test_integer_tensors_cannot_require_grad():
    with pytest.raises(TypeError, match="only floating-point tensors can require grad"):
        Tensor(numpy.array([1, 2]), requires_grad=True)


def test_backward_without_requires_grad():
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor([1.0]).sum().backward()


def test_randn_needs_an_explicit_generator():
    with pytest.raises(TypeError, match="rng=numpy.random.default_rng"):
        tg.randn(3, rng=42)


def test_unknown_device():
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        Tensor([1.0], device="tpu")


@pytest.mark.backends("numpy")  # on the other backends 'cuda' works
@pytest.mark.skipif(backend.cuda_is_available(), reason="a GPU is present here, so 'cuda' works")
def test_cuda_without_cupy_says_how_to_install():
    with pytest.raises(RuntimeError, match=r'pip install -e "\.\[gpu\]"'):
        Tensor([1.0], device="cuda")


def test_dropout_probability_range():
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\)"):
        F.dropout(Tensor([1.0]), p=1.0)


def test_item_on_many_elements():
    with pytest.raises(ValueError, match="item\\(\\) needs a tensor with one element"):
        Tensor([1.0, 2.0]).item()


def test_subtracting_bools_is_an_error_as_in_pytorch():
    with pytest.raises(TypeError, match="subtraction with a bool is not supported"):
        Tensor(numpy.array([True, False])) - 1
    with pytest.raises(TypeError, match="subtraction with a bool is not supported"):
        Tensor(numpy.array([1, 2])) - True


def test_a_scalar_tensor_has_axis_0_and_minus_1_only():
    x = Tensor(numpy.array(2.0))
    assert x.sum(axis=0).item() == 2.0 and x.max(axis=-1).item() == 2.0
    with pytest.raises(IndexError, match=r"sum: axis 1 is out of range \(expected to be in range of \[-1, 0\], but got 1\)"):
        x.sum(axis=1)


@pytest.mark.parametrize("targets, error, message", [
    ([1, 2], TypeError, r"cross_entropy: targets must be an integer array or Tensor of class indices, got a list; "
                        r"pass numpy.array\(targets\)"),
    ((1, 2), TypeError, r"got a tuple; pass numpy.array\(targets\)"),
    (None, TypeError, r"got a NoneType; pass numpy.array\(targets\)"),
    (numpy.array([1.0, 2.0]), TypeError, r"targets must be integers \(class indices\), got dtype float64; "
                                         r"pass targets.astype\(numpy.int64\)"),
    (Tensor(numpy.array([1.0, 2.0])), TypeError, r"got dtype float64; pass targets.astype"),
    (numpy.array([0, 5]), ValueError, r"target 5 is out of range for 5 classes \(use 0..4, or -100"),
    (numpy.array([-1, 0]), ValueError, r"target -1 is out of range for 5 classes"),
    (Tensor(numpy.array([0, 9])), ValueError, r"target 9 is out of range for 5 classes"),
])
def test_cross_entropy_says_what_is_wrong_with_the_targets_in_one_line(targets, error, message):
    with pytest.raises(error, match=message) as e:
        F.cross_entropy(Tensor(numpy.ones((2, 5))), targets)
    assert "\n" not in str(e.value)


def test_cross_entropy_checks_the_range_of_one_numpy_integer_target():
    with pytest.raises(ValueError, match="target 7 is out of range for 5 classes"):
        F.cross_entropy(Tensor(numpy.ones(5)), numpy.int64(7))


def test_cross_entropy_wants_tensor_logits_with_a_class_axis():
    with pytest.raises(TypeError, match=r"cross_entropy: logits must be a Tensor, got a ndarray; wrap it"):
        F.cross_entropy(numpy.ones((2, 5)), numpy.array([0, 1]))
    with pytest.raises(ValueError, match="cross_entropy: logits must have an axis of classes, got a 0-d tensor"):
        F.cross_entropy(Tensor(numpy.array(1.0)), numpy.array(0))
