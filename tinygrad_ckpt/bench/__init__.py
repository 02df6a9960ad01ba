"""The instruments: what measures the techniques, kept apart from the techniques themselves.

    workloads.py   the reference workloads W1, W2, W3 in code, and the sets of
                   sizes a run measures (full, quick, tiny)
    strategies.py  the strategy bench: checkpointing and accumulation
                   strategies on the workloads, memory and time per row
    compare.py     the same workloads in PyTorch, HIPS autograd and mygrad, beside the floor
                   (the peers' models: benchmarks/peers.py, in a clone)
    profile.py     where a step's time goes, op by op, against its floor
    kinds.py       every model kind (CNN, LSTM, encoder, GPT): what checkpointing
                   saves and costs, on real arrays and at full sizes on the meta device
    floor.py       the floor: a step's matrix products alone, and the machine's GEMM throughput
    plots.py       the bench's pictures (matplotlib, the optional `plot` extra)
    explorer.py    the memory explorer: report.html, one step event by event, the
                   tape listing linked to it (Plotly, the optional `report` extra;
                   its CSS and JS in templates/)
    palette.py     one colour per memory category, strategy and phase
    machine.py     the machine, its load, and the one thread limiter
    report.py      the one Markdown table renderer, and results files written atomically
    command.py     `tinygrad-ckpt bench`: its flags, what it runs and writes

Nothing below this floor imports it: the engine, the techniques, the
models and training know nothing of how they are measured. The command
line (cli.py) reaches it through the three names imported here; the checks
above it (testing/) print with report.py's table renderer. A memory.Timeline
is drawn by plots.plot_timeline and explorer.write_timeline; a training run
records one for the page through explorer.MemoryReport, a Trainer callback.

What does not live here: the saved-activations report (saved.py) and the
analytic activation counts (activations.py), which are part of what a
learner uses directly, and so sit beside the techniques they explain.
"""

from .command import DESCRIPTION, add_arguments, run

__all__ = ["DESCRIPTION", "add_arguments", "run"]
