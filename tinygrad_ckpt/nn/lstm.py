"""The LSTM: a cell, a layer that runs it through time, checkpointed through time, and a language model.

The pieces, from the inside out:

    lstm_cell            one time step: (x_t, h, c) -> (h', c'), PyTorch's equations
    LSTMCell             that step as a module (weight_ih, weight_hh, bias_ih, bias_hh)
    LSTM                 num_layers stacked layers, each the cell over every time step
    LSTMLanguageModel    token embedding -> LSTM -> lm_head, returning (logits, loss) as the GPT does

One step of the cell (the LSTM of Hochreiter & Schmidhuber 1997 with the
forget gate of Gers, Schmidhuber & Cummins 2000, "Learning to Forget", as
PyTorch's; the gates in PyTorch's order i, f, g, o, stacked in the rows of
the weights):

    i, f, g, o = split(x_t @ W_ih.T + b_ih + h @ W_hh.T + b_hh)   # each (B, H)
    c' = sigmoid(f) * c + sigmoid(i) * tanh(g)                   # the cell state: forget, then write
    h' = sigmoid(o) * tanh(c')                                   # the output: a gated view of c'

Names, shapes and initialisation are PyTorch's: weight_ih_l{k} (4H, input
size), weight_hh_l{k} (4H, H), bias_ih_l{k} and bias_hh_l{k} (4H,), all
drawn from U(-1/sqrt(H), 1/sqrt(H)). So torch.nn.LSTM's state_dict loads as
it is, its torch tensors included: `lstm.load_state_dict(torch_lstm.state_dict())`
(LSTM.load_state_dict copies them to the host, checks every entry, then
copies). On the meta device the parameters have a shape and no values: nothing
is drawn or made on the host.
Input (T, B, input_size), or (B, T, input_size) with batch_first=True; the
initial state (h_0, c_0), each (num_layers, B, H), zeros when not given.
Not supported: PyTorch's dropout between layers, bidirectional, proj_size,
unbatched (2-D) input.

Checkpointing through time. Backpropagation through T steps keeps every
step's gates until backward reaches it: memory grows with T. Chen et al.
2016 cut the sequence into sqrt(T) segments and keep only each segment's
input, recomputing its steps in backward; Gruslys et al. 2016
("Memory-Efficient Backpropagation Through Time") plan the cuts for a
budget by dynamic programming, of which schedules.revolve(T, slots),
Griewank's nested plan, is the case of equal steps. Here the chain is the
time steps: one step runs every layer (layer k reads layer k-1's new h, the
same numbers as running layer by layer), and hands every layer's (h, c) to
the next step; checkpoint_sequential runs it, the chain every model here
uses, with the sequence read beside it (its xs: each step reads its own
slice). `lstm.gradient_checkpointing_enable(segments, policy)` takes
what the GPT's takes ('every', 'sqrt', an int, a list of boundaries, a
schedules.Plan, nested segments), counted in time steps; a checkpointed
segment keeps its steps' inputs and the state it starts from, and hands its
last state to the next segment. For a memory budget, the planner the chain
models use: `measure_time_steps` gives a schedules.LayerCost per step and
schedules.plan_checkpoints the cuts that recompute least within the budget,
its predicted peak the one memory.py measures (tests/test_lstm.py).

    >>> import numpy
    >>> from tinygrad_ckpt import Tensor
    >>> lstm = LSTM(input_size=3, hidden_size=5, num_layers=2, rng=numpy.random.default_rng(0))
    >>> x = Tensor(numpy.ones((16, 2, 3), dtype=numpy.float32))  # (T, B, input_size)
    >>> output, (h_n, c_n) = lstm(x)
    >>> output.shape, h_n.shape
    ((16, 2, 5), (2, 2, 5))
    >>> lstm.gradient_checkpointing_enable("sqrt")  # 4 segments of 4 steps
    >>> lstm.time_segments(16)
    [(0, 4, True), (4, 8, True), (8, 12, True), (12, 16, True)]
    >>> from tinygrad_ckpt.schedules import plan_checkpoints
    >>> costs = lstm.measure_time_steps(x, cost="flops")  # bytes and FLOPs of each of the 16 steps
    >>> plan = plan_checkpoints(costs, budget=4096)  # the least recompute within 4 KiB of saved activations
    >>> lstm.gradient_checkpointing_enable(plan)
    >>> plan.segments  # the last 5 steps stored, the rest cut where the budget needs
    [(0, 3, True), (3, 5, True), (5, 7, True), (7, 9, True), (9, 11, True), (11, 16, False)]
    >>> plan.peak_bytes  # what memory.py will measure
    4024

What does not live here: checkpointing (checkpoint.py), where to cut
(schedules.py), the layers the language model borrows (layers.py), the
training loop (train.py).
"""

import math
import numbers
from dataclasses import dataclass

import numpy

from .. import backend, random
from .. import functional as F
from .. import autocast
from ..autocast import is_float
from ..checkpoint import ChainCheckpointing, checkpoint_sequential
from ..schedules import Plan, measure_layers, segment_bounds
from ..tensor import Tensor
from .layers import Dropout, Embedding, Linear, _uniform, size
from .module import Module


def lstm_cell(x, h, c, weight_ih, weight_hh, bias_ih=None, bias_hh=None):
    """One LSTM step: x (B, input_size), h and c (B, H) -> (h', c'), each (B, H).

    Under autocast the whole cell runs in 16 bits, as PyTorch's lstm_cell
    (autocast.py's lower-precision list): x, h and c are cast first (the
    weights by F.linear), so a float32 state comes back 16-bit.
    """
    x, h, c = autocast.cast_inputs("lstm_cell", (x, h, c))
    H = h.shape[-1]
    gates = F.linear(x, weight_ih, bias_ih) + F.linear(h, weight_hh, bias_hh)  # (B, 4H)
    i, f, g, o = gates.split(H, dim=-1)  # four views (B, H): input, forget, cell, output gates
    c = f.sigmoid() * c + i.sigmoid() * g.tanh()  # (B, H)
    h = o.sigmoid() * c.tanh()  # (B, H)
    return h, c


def _dtype_fits(t, weight):
    """t's dtype is the parameters', or under autocast its 16-bit dtype (lstm_cell casts to it anyway)."""
    low = autocast.get_dtype()  # None outside autocast (and numpy.dtype(None) is float64: compare only a dtype)
    return t.dtype == weight.dtype or (low is not None and t.dtype == low)


def _zeros(like, shape):
    """A zero state (h or c) of `shape`, in like's dtype and on its device."""
    xp = backend.module_for(like.device)
    return Tensor(xp.zeros(shape, dtype=like.dtype), device=like.device)


class LSTMCell(Module):
    """One LSTM step as a module: forward(x (B, input_size), (h, c)) -> (h', c'), each (B, hidden_size).

    (h, c) defaults to zeros. Parameters as torch.nn.LSTMCell's.
    """

    def __init__(self, input_size, hidden_size, bias=True, dtype=numpy.float32, device=None, rng=None):
        super().__init__()
        input_size, hidden_size = size("LSTMCell", "input_size", input_size), size("LSTMCell", "hidden_size", hidden_size)
        rng = random.generator(rng)
        self.input_size, self.hidden_size = input_size, hidden_size
        bound = 1 / math.sqrt(hidden_size)  # PyTorch's
        self.weight_ih = _uniform(rng, (4 * hidden_size, input_size), bound, dtype, device)
        self.weight_hh = _uniform(rng, (4 * hidden_size, hidden_size), bound, dtype, device)
        self.bias_ih = _uniform(rng, (4 * hidden_size,), bound, dtype, device) if bias else None
        self.bias_hh = _uniform(rng, (4 * hidden_size,), bound, dtype, device) if bias else None

    def forward(self, x, hx=None):
        if x.ndim != 2 or x.shape[1] != self.input_size:
            raise ValueError(f"LSTMCell: expected input of shape (batch, input_size={self.input_size}), "
                             f"got {x.shape}")
        shape = (x.shape[0], self.hidden_size)  # (B, H)
        h, c = hx if hx is not None else (_zeros(self.weight_hh, shape), _zeros(self.weight_hh, shape))
        for name, t in (("h", h), ("c", c)):
            if t.shape != shape:
                raise ValueError(f"LSTMCell: expected {name} of shape {shape} (batch, hidden_size), got {t.shape}")
            if not _dtype_fits(t, self.weight_hh):
                raise TypeError(f"LSTMCell: {name} is {t.dtype}, the parameters are {self.weight_hh.dtype}; convert "
                                f"the state with {name}.to(dtype=...)")
        return lstm_cell(x, h, c, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)

    def extra_repr(self):
        return f"{self.input_size}, {self.hidden_size}, bias={self.bias_ih is not None}"


class LSTM(ChainCheckpointing, Module):
    """num_layers LSTM layers, each the cell over every time step; see the module docstring.

    forward(input, hx=None) -> output, (h_n, c_n), as torch.nn.LSTM:
        input   (T, B, input_size), or (B, T, input_size) with batch_first
        hx      (h_0, c_0), each (num_layers, B, hidden_size); zeros if None
        output  the last layer's h at every step: (T, B, hidden_size), or (B, T, hidden_size)
        h_n, c_n  every layer's state after the last step: (num_layers, B, hidden_size)

    The switch gradient_checkpointing_enable / _disable is ChainCheckpointing's,
    with the time steps as the chain: segments count steps.
    """

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dtype=numpy.float32, device=None, rng=None):
        super().__init__()
        input_size, hidden_size = size("LSTM", "input_size", input_size), size("LSTM", "hidden_size", hidden_size)
        num_layers = size("LSTM", "num_layers", num_layers)
        rng = random.generator(rng)
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first = bias, batch_first
        H, bound = hidden_size, 1 / math.sqrt(hidden_size)  # PyTorch's initialisation
        for k in range(num_layers):  # PyTorch's names and order: weight_ih_l0, weight_hh_l0, bias_ih_l0, ...
            width_in = input_size if k == 0 else H
            setattr(self, f"weight_ih_l{k}", _uniform(rng, (4 * H, width_in), bound, dtype, device))
            setattr(self, f"weight_hh_l{k}", _uniform(rng, (4 * H, H), bound, dtype, device))
            if bias:
                setattr(self, f"bias_ih_l{k}", _uniform(rng, (4 * H,), bound, dtype, device))
                setattr(self, f"bias_hh_l{k}", _uniform(rng, (4 * H,), bound, dtype, device))

    def layer_weights(self, k):
        """(weight_ih, weight_hh, bias_ih, bias_hh) of layer k (the biases None without bias)."""
        return tuple(getattr(self, f"{name}_l{k}", None) for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))

    # -- checkpointing through time --------------------------------------------------
    def checkpoint_chain_length(self, segments):
        """The chain is the input's time steps: segments are checked against a length they name, and
        explicit (start, stop, how) segments or a schedules.Plan are for that length only (another is
        an error in forward); 'every', 'sqrt' and an int (capped at the length) fit any length."""
        return _length_named_by(segments)

    def time_segments(self, T):
        """[(start, stop, how)] for T steps: one plain segment when checkpointing is off (see schedules.py)."""
        segments = self.checkpoint_segments
        if segments is None:
            return [(0, T, False)]
        if isinstance(segments, numbers.Integral) and not isinstance(segments, bool):
            segments = min(int(segments), T)  # a shorter sequence than the count: one step per segment
        try:
            return segment_bounds(T, segments)
        except ValueError as e:
            raise ValueError(f"LSTM: the checkpoint segments do not fit a sequence of {T} time steps ({e}); "
                             "call gradient_checkpointing_enable with segments for this length, or with "
                             "'sqrt', 'every' or an int, which fit any length") from None

    # -- forward --------------------------------------------------------------------
    def forward(self, input, hx=None):
        x = self._checked_input(input)
        x = x.transpose(0, 1) if self.batch_first else x  # (T, B, input_size)
        T = x.shape[0]  # the chain: T time steps, each reading its slice of x and the state the last one left
        output, state = checkpoint_sequential([self.time_step] * T, self.time_segments(T), self._initial_state(x, hx),
                                              xs=x, policy=self.checkpoint_policy, **(self.checkpoint_options or {}))
        output = output.transpose(0, 1) if self.batch_first else output
        return output, (F.stack(state[0::2]), F.stack(state[1::2]))  # h_n, c_n: (num_layers, B, H)

    def time_step(self, x_t, state):
        """One time step through every layer: x_t (B, I) and state [h_0, c_0, h_1, c_1, ...] -> (the last
        layer's new h, the new state). Layer k reads layer k-1's new h, as it would run layer by layer."""
        new = []
        for k in range(self.num_layers):
            h, c = lstm_cell(x_t, state[2 * k], state[2 * k + 1], *self.layer_weights(k))
            new += [h, c]
            x_t = h
        return x_t, new

    # -- what each step costs, for the planner -----------------------------------------------
    def measure_time_steps(self, input, hx=None, repeats=2, cost="time"):
        """A schedules.LayerCost per time step of `input`, for schedules.plan_checkpoints:

        >>> import numpy
        >>> from tinygrad_ckpt import Tensor
        >>> from tinygrad_ckpt.schedules import plan_checkpoints
        >>> lstm = LSTM(4, 8, rng=numpy.random.default_rng(0))
        >>> x = Tensor(numpy.ones((6, 2, 4), dtype=numpy.float32))   # (T, B, input_size), as forward takes it
        >>> costs = lstm.measure_time_steps(x, cost="flops")
        >>> len(costs)                                  # one per time step
        6
        >>> plan = plan_checkpoints(costs, 2000)        # the cuts that recompute least within 2000 bytes
        >>> plan.segments, plan.peak_bytes              # (start, stop, checkpointed); predicted peak bytes
        ([(0, 1, True), (1, 2, True), (2, 3, True), (3, 6, False)], 1920)
        >>> lstm.gradient_checkpointing_enable(plan)    # a plan for sequences of this length

        The time steps are the chain (schedules.measure_layers, with the state
        as what one step hands the next): a step's input is every layer's
        (h, c), which it saves, and what it holds is its records' saved
        arrays. The sequence itself is read by every step and kept by the
        first step's records or the first checkpoint, whichever runs: it is
        counted once, with step 0's input. cost, repeats: as measure_layers'.
        """
        x = self._checked_input(input)
        x = x.transpose(0, 1) if self.batch_first else x  # (T, B, input_size)
        x = Tensor(x.data, requires_grad=x.requires_grad, device=x.device)  # the sequence, detached
        steps = [_TimeStep(self, t, Tensor(x.data[t], requires_grad=x.requires_grad, device=x.device))
                 for t in range(x.shape[0])]  # each step reads a view of the sequence, (B, I)
        costs = measure_layers(steps, tuple(self._initial_state(x, hx)), repeats, cost, reads=(x,))
        costs[0].input_bytes += backend.storage(x.data).nbytes
        return costs

    def _initial_state(self, x, hx):
        """[h_0, c_0, h_1, c_1, ...] for x (T, B, I): hx's layers, or zeros."""
        shape = (self.num_layers, x.shape[1], self.hidden_size)
        if hx is None:
            return [_zeros(self.weight_hh_l0, shape[1:]) for _ in range(2 * self.num_layers)]  # each (B, H)
        h_0, c_0 = self._checked_state(hx, shape)
        return [t for k in range(self.num_layers) for t in (h_0[k], c_0[k])]

    # -- checks -----------------------------------------------------------------------
    def _checked_input(self, input):
        if not isinstance(input, Tensor):
            raise TypeError(f"LSTM: input must be a Tensor, got {type(input).__name__}")
        layout = "(batch, seq_len, input_size)" if self.batch_first else "(seq_len, batch, input_size)"
        if input.ndim != 3:
            raise ValueError(f"LSTM: expected input of 3 dimensions {layout}, got shape {input.shape}"
                             + (f"; add a batch axis: x.unsqueeze({int(not self.batch_first)})" if input.ndim == 2 else ""))
        if input.shape[-1] != self.input_size:
            raise ValueError(f"LSTM: input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                             f"got {input.shape[-1]} (input shape {input.shape}, read as {layout})")
        if input.shape[int(self.batch_first)] == 0:
            raise ValueError(f"LSTM: the input has no time steps (shape {input.shape}, read as {layout})")
        if not _dtype_fits(input, self.weight_ih_l0):
            raise TypeError(f"LSTM: input is {input.dtype}, the parameters are {self.weight_ih_l0.dtype}; convert "
                            f"the input with x.to(dtype=...) or build the LSTM with dtype={input.dtype}")
        return input

    def _checked_state(self, hx, shape):
        if not (isinstance(hx, (tuple, list)) and len(hx) == 2 and all(isinstance(t, Tensor) for t in hx)):
            raise TypeError("LSTM: hx must be a tuple of two Tensors (h_0, c_0), each (num_layers, batch, "
                            "hidden_size)")
        dtype = self.weight_hh_l0.dtype
        for name, t in zip(("h_0", "c_0"), hx):
            if t.shape != shape:
                raise ValueError(f"LSTM: expected {name} of shape {shape} (num_layers, batch, hidden_size), "
                                 f"got {t.shape}")
            if not _dtype_fits(t, self.weight_hh_l0):
                raise TypeError(f"LSTM: {name} is {t.dtype}, the parameters (and the input) are {dtype}; convert "
                                f"the state with {name}.to(dtype=...), as the input's dtype must match too")
        return hx

    # -- loading PyTorch's weights -------------------------------------------------------
    def load_state_dict(self, state, strict=True):
        """Module.load_state_dict, taking torch.nn.LSTM's state_dict as it is (torch tensors, as well
        as Tensors and arrays): every entry is first made a host array (a torch tensor through
        .detach().cpu().numpy(); a bfloat16 one through float32, which NumPy lacks), and an entry
        that is not numbers is refused, naming it, before anything is copied. Then Module's checks
        (missing, unexpected, wrongly shaped keys) run, also before any copy. Returns (missing,
        unexpected). Needs no torch: a torch tensor is known by its .detach and .cpu."""
        return super().load_state_dict({name: _host_values(name, value) for name, value in state.items()}, strict)

    def extra_repr(self):
        return (f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, bias={self.bias}, "
                f"batch_first={self.batch_first}")


class _TimeStep:
    """Time step t over x_t, as a link of a chain, state -> state, for schedules.measure_layers."""

    def __init__(self, lstm, t, x_t):
        self.lstm, self.x_t, self.name = lstm, x_t, f"t{t}"

    def __call__(self, *state):
        return tuple(self.lstm.time_step(self.x_t, list(state))[1])


def _host_values(name, value):
    """A state_dict entry as a host array of numbers (see LSTM.load_state_dict); a Tensor passes as it is."""
    if isinstance(value, Tensor):
        return value
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":  # NumPy has no bfloat16: widen, exactly
            value = value.float()
        value = value.numpy()
    value = value if backend.is_array(value) else numpy.asarray(value)
    if not (value.dtype.kind in "iu" or is_float(value.dtype)):
        raise TypeError(f"LSTM.load_state_dict: entry {name!r} is not numbers (dtype {value.dtype}); "
                        "nothing was copied")
    return value


def _length_named_by(segments):
    """A sequence length that `segments` fits, to check them before any sequence is seen.

    'sqrt', 'every' and counts fit any length (a count below 1 is an error); boundaries fit from their last one on; segments
    and Plans name their own.
    """
    if isinstance(segments, Plan):
        segments = segments.segments
    if isinstance(segments, (list, tuple)) and segments:
        last = segments[-1]
        if isinstance(last, tuple) and len(last) == 3:  # (start, stop, how): the last stop
            return last[1]
        if isinstance(last, numbers.Integral):  # boundaries: the last one (the length may come after it)
            return int(last)
    if isinstance(segments, numbers.Integral) and not isinstance(segments, bool):
        if segments < 1:
            raise ValueError(f"LSTM: segments must be a count of at least 1 segment of time steps, got {segments}")
        return int(segments)
    return 1  # what segment_bounds(1, segments) refuses, it refuses with its own message


# -- the language model ------------------------------------------------------------------
@dataclass
class LSTMConfig:
    vocab_size: int = 256  # number of token ids (256: one per byte)
    n_embd: int = 64  # token embedding width, the LSTM's input_size
    hidden_size: int = 128  # width of h and c
    num_layers: int = 1  # stacked LSTM layers
    dropout: float = 0.0  # dropout probability on the embeddings and on the LSTM's output


class LSTMLanguageModel(Module):
    """Token ids (B, T) -> next-token logits (B, T, vocab_size), and the loss if targets are given.

    The GPT's contract (forward returns (logits, loss); train.Trainer trains
    either), with an LSTM where the GPT has its blocks: no position
    embedding and no context limit, since the state carries the past.
    gradient_checkpointing_enable checkpoints the LSTM through time.
    """

    def __init__(self, config, rng=None, dtype=numpy.float32, device=None):
        super().__init__()
        self.config = config
        init = random.generator(rng)
        self.wte = Embedding(config.vocab_size, config.n_embd, dtype=dtype, device=device, rng=init)
        self.drop = Dropout(config.dropout, rng=rng)
        self.lstm = LSTM(config.n_embd, config.hidden_size, config.num_layers, batch_first=True, dtype=dtype,
                         device=device, rng=init)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, dtype=dtype, device=device, rng=init)

    def gradient_checkpointing_enable(self, *args, **kwargs):
        """Checkpoint the LSTM through time: LSTM.gradient_checkpointing_enable's arguments."""
        self.lstm.gradient_checkpointing_enable(*args, **kwargs)

    def gradient_checkpointing_disable(self):
        self.lstm.gradient_checkpointing_disable()

    def forward(self, idx, targets=None):
        """idx, targets: integer (B, T) (arrays or Tensors); targets of -100 are ignored.

        Returns (logits (B, T, vocab_size), mean cross-entropy loss or None).
        """
        x = self.drop(self.wte(idx))  # (B, T, n_embd)
        x, _ = self.lstm(x)  # (B, T, hidden_size)
        logits = self.lm_head(self.drop(x))  # (B, T, vocab_size)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits, targets, ignore_index=-100)  # host targets: range-checked, copied over
