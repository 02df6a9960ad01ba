"""The peers' models: W1 and W2 written in PyTorch, HIPS autograd and mygrad, for the comparison.

    python benchmarks/compare.py           # runs them beside this engine (tinygrad_ckpt/bench/compare.py)
    tinygrad-ckpt bench --compare          # the same, from a clone (compare.load_peers finds this file)

Each class re-implements a reference workload (tinygrad_ckpt/bench/workloads.py)
in another library, as a user of that library would write it, from the same
initial weights (ours, copied) and the same batch (compare.make_data), cut
into the segments this engine's checkpoint_sequential cuts
(compare.segments). compare.py checks every one against this engine in
float64 before it times or measures anything.

Why here and not in the package: these are models of other libraries, ~300
lines a learner of this engine never needs, and a user who installs
tinygrad_ckpt installs none of these libraries. They belong with the
benchmarks that run them; the package keeps the measuring (compare.py's
harness: the agreement check, the rounds, the memory figures, the table).

PEERS maps each library's name (compare.LIBRARIES) to its runner class.
"""

import math

import numpy

from tinygrad_ckpt.bench.compare import SEED, GradOnParams, Library, depth, make_data

BLOCK_PARAMS = ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                "mlp.c_proj.weight", "mlp.c_proj.bias")  # one GPT block's, in the order autograd's segments take them


def _gelu_tanh(x, tanh, c):
    """GELU, tanh approximation, written once for the NumPy-style peers (c casts constants)."""
    return c(0.5) * x * (c(1.0) + tanh(c(0.7978845608028654) * (x + c(0.044715) * (x * x * x))))


def _layer_norm(np, x, w, b, c):
    """LayerNorm over the last axis, eps 1e-5, written once for the NumPy-style peers (np: their array module)."""
    mu = np.mean(x, axis=-1, keepdims=True)
    xc = x - mu
    var = np.mean(xc * xc, axis=-1, keepdims=True)
    return xc / np.sqrt(var + c(1e-5)) * w + b


# -- PyTorch ----------------------------------------------------------------------------
class Torch(GradOnParams):
    """PyTorch on the CPU, written with torch.nn.functional as nanoGPT's explicit attention path.

    Checkpointed rows use torch.utils.checkpoint.checkpoint(use_reentrant=False)
    around each segment (every segment checkpointed, as ours).
    """

    name = "torch"

    def __init__(self, workload, size, weights, dtype, dropout, device="cpu"):
        import torch

        self.torch, self.F = torch, torch.nn.functional
        self.workload, self.size, self.dropout, self.dtype = workload, size, dropout, numpy.dtype(dtype)
        self.device = device
        tdtype = {numpy.float32: torch.float32, numpy.float64: torch.float64}[numpy.dtype(dtype).type]
        self.params = {k: torch.tensor(v, dtype=tdtype, device=device, requires_grad=True) for k, v in weights.items()}
        a, b = make_data(workload, size, dtype)
        self.data = (torch.from_numpy(a).to(device), torch.from_numpy(b).to(device))
        self.n = depth(workload, size)

    def grads(self):
        return {name: p.grad.cpu().numpy() for name, p in self.params.items()}

    def synchronize(self):
        if self.device != "cpu":
            self.torch.cuda.synchronize()

    def _mlp_layers(self, h, start, stop):
        P, F = self.params, self.F
        for i in range(start, stop):
            h = F.gelu(F.linear(h, P[f"blocks.{i}.0.weight"], P[f"blocks.{i}.0.bias"]), approximate="tanh")
        return h

    def _drop(self, x):
        return self.F.dropout(x, self.dropout, training=True) if self.dropout else x

    def _gpt_blocks(self, x, start, stop):
        P, F, torch = self.params, self.F, self.torch
        B, T, C = x.shape
        nh = self.size.n_head
        hs = C // nh
        for i in range(start, stop):
            p = lambda name: P[f"blocks.{i}.{name}"]  # noqa: E731 (a short local alias)
            h = F.layer_norm(x, (C,), p("ln_1.weight"), p("ln_1.bias"))
            q, k, v = F.linear(h, p("attn.c_attn.weight"), p("attn.c_attn.bias")).split(C, dim=2)
            q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
            k = k.view(B, T, nh, hs).transpose(1, 2)
            v = v.view(B, T, nh, hs).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, T)
            # The causal mask made in each block, as nanoGPT's `self.bias[:,:,:T,:T] == 0` and our model do
            # (masked_fill saves it for backward: one (T, T) mask per block).
            future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=self.device), diagonal=1)  # key after query
            att = self._drop(torch.softmax(att.masked_fill(future, float("-inf")), dim=-1))
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            x = x + self._drop(F.linear(y, p("attn.c_proj.weight"), p("attn.c_proj.bias")))
            h = F.layer_norm(x, (C,), p("ln_2.weight"), p("ln_2.bias"))
            h = F.gelu(F.linear(h, p("mlp.c_fc.weight"), p("mlp.c_fc.bias")), approximate="tanh")
            x = x + self._drop(F.linear(h, p("mlp.c_proj.weight"), p("mlp.c_proj.bias")))
        return x

    def _chain(self, run, h):
        if self.segments is None:
            return run(h, 0, self.n)
        from torch.utils.checkpoint import checkpoint

        for a, b, checkpointed in self.segments:
            h = checkpoint(run, h, a, b, use_reentrant=False) if checkpointed else run(h, a, b)
        return h

    def forward(self):
        P, F = self.params, self.F
        if self.workload == "W1":
            x, target = self.data
            h = self._chain(self._mlp_layers, x)
            return F.mse_loss(F.linear(h, P["head.weight"], P["head.bias"]), target)
        idx, targets = self.data
        T = idx.shape[1]
        x = self._drop(F.embedding(idx, P["wte.weight"]) + P["wpe.weight"][:T])
        x = self._chain(self._gpt_blocks, x)
        x = F.layer_norm(x, (x.shape[-1],), P["ln_f.weight"], P["ln_f.bias"])
        logits = F.linear(x, P["wte.weight"])  # tied: lm_head is wte
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))



# -- HIPS autograd ----------------------------------------------------------------------
class Autograd(Library):
    """HIPS autograd: the loss as a NumPy function of the parameters, make_vjp for the gradient.

    The parameters are a list with one list per layer (block) and one for the
    rest, so a segment's parameters are one argument, `values[a:b]`.
    Checkpointed rows wrap each segment in autograd.checkpoint, the library's
    wrapper. Note what it does (autograd 1.x, differential_operators.py):
    the wrapper's VJP is built when the forward records it, by re-tracing
    the segment once per differentiable argument (here two: its input and
    its parameters), and the traces are kept until backward, so it costs
    time and saves no memory. The figures show it.
    """

    name = "autograd"

    def __init__(self, workload, size, weights, dtype, dropout):
        import autograd
        import autograd.numpy as anp
        from autograd.scipy.special import logsumexp

        self.ag, self.np, self.logsumexp = autograd, anp, logsumexp
        self.workload, self.size, self.dropout, self.dtype = workload, size, dropout, numpy.dtype(dtype)
        self.n = depth(workload, size)
        own = ("0.weight", "0.bias") if workload == "W1" else BLOCK_PARAMS
        self.names = [[f"blocks.{i}.{name}" for name in own] for i in range(self.n)]
        self.names.append([k for k in weights if not k.startswith("blocks.")])  # the rest
        self.values = [[weights[k].astype(dtype) for k in names] for names in self.names]
        self.data = make_data(workload, size, dtype)
        self.rng = numpy.random.default_rng(SEED + 2)
        self._grads = None

    def _c(self, v):
        return self.dtype.type(v)

    def _mlp_segment(self, h, layers):
        np = self.np
        for W, b in layers:
            h = _gelu_tanh(np.dot(h, W.T) + b, np.tanh, self._c)
        return h

    def _layer_norm(self, x, w, b):
        return _layer_norm(self.np, x, w, b, self._c)

    def _gpt_segment(self, first, masks):
        """The blocks first, first + 1, ... as a function of (x, their parameter lists)."""
        np = self.np
        C, nh = self.size.n_embd, self.size.n_head
        hs = C // nh

        def run(x, blocks):
            B, T, _ = x.shape
            future = numpy.triu(numpy.ones((T, T), dtype=bool), k=1)
            for i, (ln1w, ln1b, aw, ab, apw, apb, ln2w, ln2b, fw, fb, pw, pb) in enumerate(blocks, start=first):
                qkv = np.matmul(self._layer_norm(x, ln1w, ln1b), aw.T) + ab
                q, k, v = (np.transpose(np.reshape(qkv[:, :, m * C:(m + 1) * C], (B, T, nh, hs)), (0, 2, 1, 3))
                           for m in range(3))
                att = np.matmul(q, np.swapaxes(k, -1, -2)) * self._c(1.0 / math.sqrt(hs))
                att = np.where(future, -np.inf, att)
                att = np.exp(att - np.max(att, axis=-1, keepdims=True))
                att = self._drop(att / np.sum(att, axis=-1, keepdims=True), masks, f"{i}.attn")
                y = np.reshape(np.transpose(np.matmul(att, v), (0, 2, 1, 3)), (B, T, C))
                x = x + self._drop(np.matmul(y, apw.T) + apb, masks, f"{i}.resid")
                h = _gelu_tanh(np.matmul(self._layer_norm(x, ln2w, ln2b), fw.T) + fb, np.tanh, self._c)
                x = x + self._drop(np.matmul(h, pw.T) + pb, masks, f"{i}.mlp")
            return x
        return run

    def _drop(self, x, masks, key):
        return x * masks[key] if self.dropout else x

    def _draw_masks(self):
        """This step's dropout masks (scaled keep-masks), drawn before the forward so a
        segment re-traced by autograd.checkpoint sees the same ones."""
        if not self.dropout or self.workload == "W1":
            return {}
        s, p = self.size, self.dropout
        B, T, C, nh = s.batch, s.seq, s.n_embd, s.n_head
        shapes = {"emb": (B, T, C)}
        for i in range(self.n):
            shapes.update({f"{i}.attn": (B, nh, T, T), f"{i}.resid": (B, T, C), f"{i}.mlp": (B, T, C)})
        scale = self._c(1.0 / (1.0 - p))
        return {k: (self.rng.random(shape, dtype=numpy.float32) >= p) * scale for k, shape in shapes.items()}

    def loss_fn(self, masks):
        np = self.np
        chain_segments = [(0, self.n, False)] if self.segments is None else self.segments

        def chain(h, values, make):
            for a, b, checkpointed in chain_segments:
                run = make(a)
                if checkpointed:
                    run = self.ag.checkpoint(run)
                h = run(h, values[a:b])
            return h

        def loss(values):
            rest = dict(zip(self.names[-1], values[-1]))
            if self.workload == "W1":
                x, target = self.data
                h = chain(x, values, lambda a: self._mlp_segment)
                out = np.dot(h, rest["head.weight"].T) + rest["head.bias"]
                return np.mean((out - target) ** 2)
            idx, targets = self.data
            B, T = idx.shape
            x = self._drop(rest["wte.weight"][idx] + rest["wpe.weight"][:T], masks, "emb")
            x = chain(x, values, lambda a: self._gpt_segment(a, masks))
            x = self._layer_norm(x, rest["ln_f.weight"], rest["ln_f.bias"])
            logits = np.reshape(np.matmul(x, rest["wte.weight"].T), (B * T, -1))  # tied: lm_head is wte
            logp = logits - self.logsumexp(logits, axis=1, keepdims=True)
            return -np.mean(logp[numpy.arange(B * T), targets.reshape(-1)])

        return loss

    def forward(self):
        vjp, loss = self.ag.make_vjp(self.loss_fn(self._draw_masks()))(self.values)
        return vjp, loss

    def backward(self, state):
        vjp, loss = state
        self._grads = vjp(numpy.ones_like(loss))

    def loss_value(self, state):
        return float(state[1])

    def grads(self):
        return {k: g for names, grads in zip(self.names, self._grads) for k, g in zip(names, grads)}

    def clear_grads(self, keep=False):
        self._grads = None


# -- mygrad -----------------------------------------------------------------------------
class Mygrad(Library):
    """mygrad: tensors with .backward(); its nnet softmax and softmax_crossentropy.

    mygrad has no checkpoint wrapper: its checkpointed rows say so. Its memory
    guard (which locks arrays against in-place writes) is left on, as installed.
    Constants are NumPy scalars of the working dtype: a Python float becomes a
    float64 array in mygrad and would upcast float32 work.
    """

    name = "mygrad"

    def __init__(self, workload, size, weights, dtype, dropout):
        import mygrad
        from mygrad.nnet import softmax, softmax_crossentropy

        self.mg, self.softmax, self.softmax_crossentropy = mygrad, softmax, softmax_crossentropy
        self.workload, self.size, self.dropout, self.dtype = workload, size, dropout, numpy.dtype(dtype)
        self.params = {k: mygrad.tensor(v.astype(dtype)) for k, v in weights.items()}
        self.data = make_data(workload, size, dtype)
        self.n = depth(workload, size)
        self.rng = numpy.random.default_rng(SEED + 2)

    def _c(self, v):
        return self.dtype.type(v)

    def _drop(self, x):
        if not self.dropout:
            return x
        keep = self.rng.random(x.shape, dtype=numpy.float32) >= self.dropout
        return x * (keep * self._c(1.0 / (1.0 - self.dropout)))

    def _layer_norm(self, x, w, b):
        return _layer_norm(self.mg, x, w, b, self._c)

    def forward(self):
        if self.segments is not None:
            raise ValueError("mygrad has no checkpoint wrapper: run it with strategy 'none'")
        mg, P = self.mg, self.params
        if self.workload == "W1":
            x, target = self.data
            h = x
            for i in range(self.n):
                h = _gelu_tanh(mg.matmul(h, P[f"blocks.{i}.0.weight"].T) + P[f"blocks.{i}.0.bias"], mg.tanh, self._c)
            out = mg.matmul(h, P["head.weight"].T) + P["head.bias"]
            return mg.mean((out - target) * (out - target))
        idx, targets = self.data
        B, T = idx.shape
        C, nh = self.size.n_embd, self.size.n_head
        hs = C // nh
        future = numpy.triu(numpy.ones((T, T), dtype=bool), k=1)
        x = self._drop(P["wte.weight"][idx] + P["wpe.weight"][:T])
        for i in range(self.n):
            p = lambda name: P[f"blocks.{i}.{name}"]  # noqa: E731 (a short local alias)
            qkv = mg.matmul(self._layer_norm(x, p("ln_1.weight"), p("ln_1.bias")), p("attn.c_attn.weight").T) + p("attn.c_attn.bias")
            q, k, v = (qkv[:, :, m * C:(m + 1) * C].reshape(B, T, nh, hs).transpose(0, 2, 1, 3) for m in range(3))
            att = mg.matmul(q, k.transpose(0, 1, 3, 2)) * self._c(1.0 / math.sqrt(hs))
            att = self._drop(self.softmax(mg.where(future, self._c(-numpy.inf), att), axis=-1))
            y = mg.matmul(att, v).transpose(0, 2, 1, 3).reshape(B, T, C)
            x = x + self._drop(mg.matmul(y, p("attn.c_proj.weight").T) + p("attn.c_proj.bias"))
            h = mg.matmul(self._layer_norm(x, p("ln_2.weight"), p("ln_2.bias")), p("mlp.c_fc.weight").T) + p("mlp.c_fc.bias")
            h = _gelu_tanh(h, mg.tanh, self._c)
            x = x + self._drop(mg.matmul(h, p("mlp.c_proj.weight").T) + p("mlp.c_proj.bias"))
        x = self._layer_norm(x, P["ln_f.weight"], P["ln_f.bias"])
        logits = mg.matmul(x, P["wte.weight"].T).reshape(B * T, -1)
        return self.softmax_crossentropy(logits, targets.reshape(-1))

    def backward(self, loss):
        loss.backward()

    def loss_value(self, loss):
        return float(loss.item())

    def grads(self):
        return {k: p.grad for k, p in self.params.items()}

    def clear_grads(self, keep=False):
        for p in self.params.values():
            p.null_grad()


PEERS = {"torch": Torch, "autograd": Autograd, "mygrad": Mygrad}
