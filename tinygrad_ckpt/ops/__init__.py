"""The differentiable ops, grouped by kind, one small class each:

    elementwise.py  + - * / ** neg abs sqrt exp log tanh sigmoid relu gelu where cast
    reduce.py       sum mean max (min is -max(-x): tensor.py)
    movement.py     reshape permute getitem split cat stack clone to-device
    matmul.py       batched matmul, linear
    nn.py           softmax log-softmax layer-norm cross-entropy dropout
    axes.py         what an axis means (-1 is the last), checked once for every op
    flops.py        what each op costs: its forward FLOPs, from shapes
"""
