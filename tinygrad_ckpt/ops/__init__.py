"""The differentiable ops, grouped by kind, one small class each:

    elementwise.py  + - * / ** neg abs sqrt exp log tanh sigmoid relu gelu where cast, and the
                    activations leaky-relu relu6 hardswish silu softplus mish exact-gelu
    special.py      erfc, for the exact GELU (NumPy has none)
    reduce.py       sum mean max (min is -max(-x): tensor.py)
    movement.py     reshape permute getitem split cat stack pad clone to-device
    matmul.py       batched matmul, linear
    nn.py           softmax log-softmax layer-norm cross-entropy dropout
    conv.py         conv2d, as a matrix product over a strided view of the windows (im2col)
    pool.py         max and average pooling over the same windows
    axes.py         what an axis means (-1 is the last), checked once for every op
    flops.py        what each op costs: its forward FLOPs, from shapes
"""
