"""The floor of a training step: its matrix products alone, and the machine's GEMM throughput.

A step of W1 or W2 spends most of its arithmetic in matrix products. Done
on their own, on bare NumPy (CuPy on a GPU: cuBLAS), with the same shapes
and dtype, batched where the step batches them, into buffers made
beforehand, they take the time no implementation of the step can go below
without doing less arithmetic: the floor. `Floor` is that step, a run that
takes its turn in compare.py's rounds beside the libraries, and
profile.py's floor per op kind.

The products are not copied out of the models by hand: `step_records`
runs one forward of the workload in this engine on a fresh tape, and
ops/flops.py's `matrix_products` says which products each record's
forward and backward do (one per input that needs a gradient).

`gemm_throughput` is the second anchor, a property of the machine alone:
the GFLOP/s of one large square float32 product. A library's achieved
GFLOP/s on a step is the step's product FLOPs over its step time.

What does not live here: the libraries' runs and the table (compare.py),
the per-op profile (profile.py), the FLOP counts (ops/flops.py).
"""

import math
import statistics
import time

import numpy

from .. import backend, tape
from ..ops import flops

# Each operand shape gets enough distinct buffers that one product never
# finds its operands still in cache from the previous product of that shape,
# as in the step, where every layer reads its own weights and activations.
CYCLE_BYTES = 64 * 2**20


def step_records(size):
    """[(op, input shapes, needs_input_grad)]: the records of one forward of the workload, in order.

    Run in this engine, float32, on the CPU (shapes are the same on any
    device), with dropout off (it adds no matrix product), on a fresh tape.
    """
    from dataclasses import replace

    if hasattr(size, "dropout"):
        size = replace(size, dropout=0.0)
    model = size.model(numpy.random.default_rng(0))
    batch = size.data(numpy.random.default_rng(1))
    with tape.recording(tape.Tape()) as recorded:
        loss = size.loss(model, batch)
        records = [(n.name, n.input_shapes, n.ctx.needs_input_grad) for n in recorded.nodes()]
    del loss
    return records


def step_products(size):
    """[(op, phase, a shape, b shape)]: every matrix product of one step (forward, then backward)."""
    products = [(op, phase, a, b) for op, shapes, needs in step_records(size)
                for phase, a, b in flops.matrix_products(op, shapes, needs)]
    return [p for p in products if p[1] == "forward"] + [p for p in products if p[1] == "backward"]


class Floor:
    """One step's matrix products on bare NumPy or CuPy, as a run of compare.py's rounds.

    forward() runs the forward products, backward() the backward ones, each
    `xp.matmul(a, b, out=c)` into a buffer made beforehand. `products` lists
    (op, phase, a shape, b shape); `flops` is their total.
    """

    name = "floor"

    def __init__(self, size, dtype=numpy.float32, device="cpu"):
        self.dtype, self.device = numpy.dtype(dtype), device
        self.xp = backend.module_for(device)
        self.products = step_products(size)
        self.flops = sum(flops.product_flops(a, b) for _, _, a, b in self.products)
        rng = numpy.random.default_rng(0)
        uses = {}  # (role, shape) -> how many products use such an operand; outputs apart from inputs
        for _, _, a, b in self.products:
            for key in (("in", a), ("in", b), ("out", _out_shape(a, b))):
                uses[key] = uses.get(key, 0) + 1
        self._buffers = {}  # (role, shape) -> [arrays], cycled through
        for (role, shape), count in uses.items():
            nbytes = max(math.prod(shape) * self.dtype.itemsize, 1)
            copies = min(count, max(1, -(-CYCLE_BYTES // nbytes)))
            # Inputs of unit scale (no product overflows); outputs are written before they are read.
            host = [rng.uniform(-1, 1, shape).astype(self.dtype) for _ in range(copies)]
            self._buffers[(role, shape)] = [backend.to_device(h, device) for h in host]
        self._next = dict.fromkeys(uses, 0)
        self._plan = {phase: [(op, self._take("in", a), self._take("in", b), self._take("out", _out_shape(a, b)))
                              for op, p, a, b in self.products if p == phase]
                      for phase in ("forward", "backward")}

    def _take(self, role, shape):
        i = self._next[(role, shape)]
        self._next[(role, shape)] = i + 1
        arrays = self._buffers[(role, shape)]
        return arrays[i % len(arrays)]

    def run(self, phase, op=None):
        """Run one phase's products (only `op`'s, if given); returns the last product."""
        out = None
        for kind, a, b, out in self._plan[phase]:
            if op is None or kind == op:
                self.xp.matmul(a, b, out=out)
        return out

    # What compare.py's rounds call on every run:
    def forward(self):
        return self.run("forward")

    def backward(self, _):
        self.run("backward")

    def clear_grads(self, keep=False):
        pass

    def synchronize(self):
        backend.synchronize(self.device)


def _out_shape(a, b):
    return numpy.broadcast_shapes(a[:-2], b[:-2]) + (a[-2], b[-1])


def gemm_throughput(n=2048, repeats=3, dtype=numpy.float32, device="cpu"):
    """GFLOP/s of one n x n @ n x n product on this machine: 2 n^3 / (median seconds) / 1e9.

    The machine's anchor, independent of any workload: BLAS (cuBLAS on a
    GPU) at its best, on one large square product, into a buffer made
    beforehand, after one warm-up product.
    """
    xp = backend.module_for(device)
    rng = numpy.random.default_rng(0)
    a, b = (backend.to_device(rng.standard_normal((n, n), dtype=numpy.float32).astype(dtype), device) for _ in "ab")
    out = xp.empty((n, n), dtype=dtype)
    times = []
    for i in range(repeats + 1):
        backend.synchronize(device)
        start = time.perf_counter()
        xp.matmul(a, b, out=out)
        backend.synchronize(device)
        if i:  # the first is the warm-up
            times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times) / 1e9
