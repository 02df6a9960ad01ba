"""A TrainingPlan as text: what was asked, a table of the strategies, the recommendation (render)."""

from ..schedules import describe
from .inputs import GiB, format_size

COLUMNS = ("parameters", "gradients", "accumulation", "optimizer", "activations", "other")


def _plan_text(segments, n_layer, links="blocks"):
    """A plan in words: 'every block checkpointed', or its segments ('[0:8]* [8:10]', * = checkpointed) with
    a run of three or more alike ones written as its first and last and a count, so that a 48-block plan
    stays one short line."""
    if list(segments) == [(i, i + 1, True) for i in range(n_layer)]:
        return (f"every {links[:-1]} checkpointed, each of the {n_layer} a segment of its own (as the 'every "
                f"{links[:-1]}' row)")
    parts, k = [], 0
    while k < len(segments):
        a, b, how = segments[k]
        run = 1
        while (k + run < len(segments) and not isinstance(how, list) and segments[k + run][2] == how
               and segments[k + run][1] - segments[k + run][0] == b - a):
            run += 1
        if run >= 3:
            size = f"1 {links[:-1]}" if b - a == 1 else f"{b - a} {links}"
            parts.append(f"{describe(segments[k:k + 1])} ... {describe(segments[k + run - 1:k + run])} "
                         f"({run} segments of {size})")
        else:
            parts.append(describe(segments[k:k + run]))
        k += run
    return " ".join(parts) + f" ({links}; * = checkpointed)"


def render(plan):
    """The plan as text: what was asked, a table of the strategies, the recommendation."""
    c, prec = plan.config, plan.precision
    # GiB on a large device; MiB on a small one, or for a small kind's steps (below a GiB, GiB would show 0.00)
    small = plan.headline and max(r.memory.device_peak_bytes for r in plan.rows + plan.other_rows) < GiB
    unit, scale = ("GiB", GiB) if plan.memory_bytes >= 4 * GiB and not small else ("MiB", 1 << 20)
    lines = [
        f"Will it fit? {plan.headline}" if plan.headline else
        f"Will it fit? {plan.model_name}: {c.n_layer} blocks, width {c.n_embd}, {c.n_head} heads, vocabulary "
        f"{c.vocab_size}, {plan.parameters / 1e6:.0f}M parameters; sequence {plan.seq_len}",
        f"  on {plan.memory_label} ({format_size(plan.usable_bytes)} usable)"
        + ("" if plan.headline else f", {prec.description}"),
        f"  effective batch {plan.effective_batch_size} = {plan.batch_per_process} per process x {plan.processes} "
        f"process{'es' if plan.processes > 1 else ''}"
        + ("" if plan.zero_stage is None else f"; ZeRO stage {plan.zero_stage}: every peak is one process's"),
        "",
        f"Peak of one training step at the micro-batch used ({unit}; by category as memory.py counts it, "
        "'device' adds each op's scratch arrays):",
        "",
    ]
    head = ["strategy", "largest", "micro x steps", "peak", "device"] + list(COLUMNS) + ["time"]
    rows = []
    for r in plan.rows + plan.other_rows + plan.stage_rows:
        m = r.memory
        largest = "none" if not r.largest_micro_batch else (
            f"{r.largest_micro_batch:,}" if r.largest_micro_batch < 1 << 40 else "any")
        micro = f"{r.micro_batch} x {r.accumulation_steps}" if r.fits else "does not fit"
        rows.append([r.label, largest, micro, f"{m.peak_bytes / scale:.2f}", f"{m.device_peak_bytes / scale:.2f}"]
                    + [f"{m.at_peak[k] / scale:.2f}" for k in COLUMNS] + [f"{r.recompute_ratio - 1:+.0%}"])
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    for k, cells in enumerate([head] + rows):
        if plan.stage_rows and k == len(rows) - len(plan.stage_rows) + 1:
            lines += ["", f"Each ZeRO stage, one process of {plan.processes} (zero.py; what it shards: 1 the optimizer "
                          "state, 2 the accumulation buffers too, 3 the parameters too):", ""]
        lines.append("  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(cells, widths))))
    planner = next((r for r in plan.rows if r.key == "planner"), None)
    if planner is not None and planner.plan is not None and planner.checkpointing is not None:
        chain = (c.n_layer, "blocks") if c else (plan.seq_len, "time steps")  # a GPT's; the LSTM's (fit/kinds.py)
        lines += ["", f"planner's plan: {_plan_text(planner.plan.segments, *chain)}"]
    rec = plan.recommendation
    lines += ["", f"Recommendation: {rec.verdict} ({rec.reason})."]
    if rec.training_arguments:
        processes = rec.processes or plan.processes
        under = f", under mpiexec -n {processes}" if processes > 1 else ""
        lines.append(f"  {rec.training_arguments}{under}")
    lines += ["", "largest: the largest micro-batch that fits in the usable memory with that strategy ('none': not "
              "even one example); micro x steps: the micro-batch used, the largest that divides the batch per process "
              "and fits, x the gradient accumulation steps.",
              *(["planner at the budget: schedules.plan_checkpoints, given as its budget for saved activations the "
                 "usable memory less the rest of the step (parameters, gradients, buffers, optimizer state): the plan "
                 "that fits and recomputes least"
                 + ("; 'cuts every k blocks': it may cut only between groups of k blocks (--planner-layers)"
                    if "cuts every" in planner.label else "")
                 + ("; ': every block': checkpointing every block measured better than the planner's own plans "
                    "(--planner-layers sets where those may cut)" if planner.label.endswith(": every block") else "")
                 + "."] if planner is not None else []),
              "time: a step's FLOPs with the recomputation over a step's without (about three forwards); "
              "peaks are memory.py's count of the step run on the meta device, exact for this engine "
              + "in every precision."]
    return "\n".join(lines)


