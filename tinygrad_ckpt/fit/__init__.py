"""Will it fit? A training step's memory, measured by running the step on arrays with no data.

    >>> plan = plan_training("gpt2-medium", effective_batch_size=32, device_memory="a10")
    >>> plan.recommendation.verdict
    'gradient accumulation'
    >>> plan.recommendation.training_arguments
    'TrainingArguments(per_device_train_batch_size=2, gradient_accumulation_steps=16)'
    >>> print(plan)                     # the table, and the recommendation  # doctest: +ELLIPSIS
    Will it fit? gpt2-medium: 24 blocks, width 1024, 16 heads, ...

fit says what it runs: every figure is read from steps run on the meta
device, each as the Trainer runs it, and the one shortcut is the batch
(every array of a GPT's step is a + b x batch bytes, so two runs give every
micro-batch size), checked against running each size in tests/test_fit.py.

One idea a file:
  inputs.py       the GPT-2 sizes, the GPUs' memory, the precisions; each input read and checked
  step.py         one training step run on the meta device: estimate_step, gpt_step
  recorder.py     what a run keeps as it goes: bytes at every check, FLOPs from the op events
  batch_sizes.py  every micro-batch from two runs: StepProfile, profile_gpt
  plan.py         plan_training: each strategy's row, the planner's, the recommendation
  kinds.py        plan_kind: the same table for the MLP, the CNN, the LSTM and the encoder (kinds.py's)
  table.py        the plan as text
  command.py      tinygrad-ckpt fit
  progress.py     the progress bar of a long fit
  sharded.py      one process of N under ZeRO: the other processes' collectives stood in for

What does not live here: the meta device (meta.py), the saved-activation
formulas (activations.py), the planner (schedules.py), the command line (cli.py).
"""

from .batch_sizes import StepProfile, profile_gpt
from .command import DESCRIPTION, add_arguments, run
from .kinds import plan_kind
from .inputs import DEFAULT_RESERVE, GPT2, GPUS, GiB, Precision, device_memory_bytes, model_config, precision
from .plan import PLANNER, STRATEGIES, VERDICTS, Recommendation, StrategyFit, TrainingPlan, plan_training, recommend
from .step import PROFILES as _PROFILES
from .step import STEPS as _STEPS
from .step import StepMemory, estimate_step, gpt_step
from .table import render

__all__ = ["DEFAULT_RESERVE", "DESCRIPTION", "GPT2", "GPUS", "GiB", "PLANNER", "STRATEGIES", "VERDICTS", "Precision",
           "Recommendation", "StepMemory", "StepProfile", "StrategyFit", "TrainingPlan", "add_arguments",
           "device_memory_bytes", "estimate_step", "gpt_step", "model_config", "plan_kind", "plan_training", "precision",
           "profile_gpt", "recommend", "render", "run", "_PROFILES", "_STEPS"]
