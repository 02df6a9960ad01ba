"""`tinygrad-ckpt train --model KIND`: every model kind trains from the command line, with the three techniques.

Each kind runs through cli.main at a tiny size: its loss falls; gradient
accumulation and checkpointing leave the trained parameters as the plain
run's (read back from the model.npz it writes); bf16 with checkpointing is
the plain bf16 run bit for bit; and a flag the kind does not take is a
one-line error naming it.
"""

import re

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygrad_ckpt import Tensor, cli, serialization
from tinygrad_ckpt import functional as F
from tinygrad_ckpt.data import curve_task, epoch_order
from tinygrad_ckpt.nn import MLP

# A tiny size of each kind, and the flags every run here shares (no progress bar, no sample).
TINY = {
    "gpt": ["--block-size", "8", "--n-layer", "2", "--n-head", "2", "--n-embd", "16", "--sample-chars", "0"],
    "lstm": ["--block-size", "8", "--n-embd", "8", "--hidden-size", "16"],
    "encoder": ["--block-size", "8", "--n-layer", "2", "--n-embd", "16"],
    "cnn": ["--image-size", "8", "--widths", "4,8"],
    "mlp": ["--n-layer", "3", "--n-embd", "16"],
}
COMMON = ["--disable-tqdm", "--threads", "1", "--per-device-eval-batch-size", "512"]


def run(kind, *flags, capsys):
    """cli.main(train --model kind ...) at the tiny size: its stdout, after checking exit status 0."""
    code = cli.main(["train", "--model", kind, *TINY[kind], *COMMON, *flags])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def trained(kind, tmp_path, name, *flags, capsys):
    """The parameters a short run writes to model.npz, by name."""
    run(kind, "--max-steps", "3", "--val-fraction", "0", "--output-dir", str(tmp_path / name), *flags, capsys=capsys)
    return serialization.load(tmp_path / name / "model.npz")["model"]


@pytest.mark.parametrize("kind", list(cli.KINDS))
def test_each_kind_trains_from_the_command_line_and_its_loss_falls(kind, capsys):
    out = run(kind, "--max-steps", "30", "--learning-rate", "1e-2", "--warmup-steps", "0", "--logging-steps", "10",
              capsys=capsys)
    first, last = map(float, re.search(r"training loss: (\d+\.\d+) \(step 1\) -> (\d+\.\d+) \(step 30\)", out).groups())
    assert last < first, out
    assert re.search(r"\nvalidation loss: \d+\.\d+\n", out)
    assert re.search(r"\nmodel: .*, [\d,]+ parameters ", out)


@pytest.mark.parametrize("kind", list(cli.KINDS))
def test_checkpointing_changes_no_parameter_in_float32_and_in_bfloat16(kind, tmp_path, capsys):
    """The same ops in the same order: the checkpointed run's parameters are the plain run's, bit for bit."""
    plain = trained(kind, tmp_path, "plain", capsys=capsys)
    for name, flags in [("every", []), ("sqrt", ["--gradient-checkpointing-kwargs", '{"segments": "sqrt"}'])]:
        checkpointed = trained(kind, tmp_path, name, "--gradient-checkpointing", *flags, capsys=capsys)
        assert all(numpy.array_equal(plain[p], checkpointed[p]) for p in plain), (kind, name)
    plain16 = trained(kind, tmp_path, "plain16", "--bf16", capsys=capsys)
    checkpointed16 = trained(kind, tmp_path, "every16", "--bf16", "--gradient-checkpointing", capsys=capsys)
    assert all(numpy.array_equal(plain16[p], checkpointed16[p]) for p in plain16), kind
    assert any(not numpy.array_equal(plain[p], plain16[p]) for p in plain), kind  # bf16 did run in 16 bits


@pytest.mark.parametrize("kind", ["gpt", "lstm", "encoder", "mlp"])  # the CNN: below
def test_accumulation_gives_the_whole_batchs_parameters(kind, tmp_path, capsys):
    """4 examples at once, or 2 micro-batches of 2, or 4 of 1: the same update, up to float32 rounding.

    SGD, whose step is the gradient times the learning rate, so the
    rounding of the sums stays at float32's (AdamW divides by the root of
    the squared gradients, which magnifies it where a gradient is near 0);
    the accumulation buffers in float64 (--accumulation-dtype, the dtype
    the command line lets one choose; the model is float32).
    """
    flags = ["--optim", "sgd", "--learning-rate", "0.1", "--accumulation-dtype", "float64"]
    whole = trained(kind, tmp_path, "whole", *flags, "--per-device-train-batch-size", "4", capsys=capsys)
    for micro, steps in [(2, 2), (1, 4)]:
        split = trained(kind, tmp_path, f"{micro}x{steps}", *flags, "--per-device-train-batch-size", str(micro),
                        "--gradient-accumulation-steps", str(steps), capsys=capsys)
        for p in whole:
            numpy.testing.assert_allclose(split[p], whole[p], rtol=1e-5, atol=1e-6, err_msg=f"{kind} {p}")


def test_the_cnns_accumulation_is_not_the_whole_batch_because_of_batchnorm(tmp_path, capsys):
    """BatchNorm normalises each micro-batch by its own statistics, so 2 x 2 is not the update of 4 at once.

    Tutorial 12 proves the alternative that holds (each micro-batch's own
    statistics, summed); here: the accumulated run trains, and differs from
    the whole batch by more than rounding.
    """
    flags = ["--optim", "sgd", "--learning-rate", "0.1", "--accumulation-dtype", "float64"]
    whole = trained("cnn", tmp_path, "whole", *flags, "--per-device-train-batch-size", "4", capsys=capsys)
    split = trained("cnn", tmp_path, "split", *flags, "--per-device-train-batch-size", "2",
                    "--gradient-accumulation-steps", "2", capsys=capsys)
    assert max(float(numpy.abs(split[p] - whole[p]).max()) for p in whole) > 1e-4


@pytest.mark.parametrize("kind", list(cli.KINDS))
def test_every_technique_at_once_trains(kind, capsys):
    """Accumulation, checkpointing and fp16 (loss scaling) together: the header says so, and the run ends."""
    out = run(kind, "--max-steps", "2", "--per-device-train-batch-size", "2", "--gradient-accumulation-steps", "2",
              "--gradient-checkpointing", "--fp16", "--logging-steps", "1", capsys=capsys)
    assert "= 2 per micro-batch x 2 accumulation steps x 1 process" in out
    assert "checkpointing: each of the" in out and "precision: mixed, float16" in out
    assert re.search(r"\nvalidation loss: \d+\.\d+\n", out)


@pytest.mark.parametrize("kind, flags, message", [
    ("lstm", ["--n-head", "2"], "--n-head does not apply to --model lstm, which takes --block-size, --dropout, "
                                "--n-layer, --n-embd, --hidden-size, --data"),
    ("cnn", ["--data", "x.txt", "--block-size", "8"], "--block-size, --data do not apply to --model cnn, which "
                                                      "takes --image-size, --widths"),
    ("mlp", ["--sample-chars", "10"], "--sample-chars does not apply to --model mlp"),
    ("gpt", ["--widths", "4,8"], "--widths does not apply to --model gpt"),
    ("encoder", ["--gradient-checkpointing", "--gradient-checkpointing-kwargs", '{"split_blocks": true}'],
     "split_blocks cuts a GPT's blocks in halves; --model encoder checkpoints its blocks"),
    ("lstm", ["--gradient-checkpointing", "--gradient-checkpointing-kwargs", '{"split_blocks": true}'],
     "--model lstm checkpoints its time steps"),
    ("cnn", ["--image-size", "10"], r"image_size 10 must be divisible by 2 \*\* 2"),
    ("cnn", ["--widths", "4,x"], "argument --widths: must be an integer, got 'x'"),
])
def test_a_flag_the_kind_does_not_take_is_a_one_line_error(kind, flags, message, capsys):
    argv = ["train", "--model", kind, *TINY[kind], *COMMON, "--max-steps", "1", *flags]
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert re.search(message, err), err


def test_help_names_the_kinds_that_take_each_flag_and_their_defaults():
    parser = cli.build_parser().subcommands["train"]
    assert "--model {gpt,lstm,encoder,cnn,mlp}" in " ".join(parser.format_help().split())
    helps = {action.dest: action.help for action in parser._actions}
    for name, kind in cli.KINDS.items():
        for flag, default in kind.flags.items():
            shown = "" if default is None else " " + (",".join(map(str, default)) if isinstance(default, tuple)
                                                       else str(default))
            assert re.search(rf"[\[ ]{name}{shown}[,\]]", helps[flag]), (name, flag, helps[flag])


@settings(max_examples=10, deadline=None)
@given(kind=st.sampled_from(list(cli.KINDS)))
def test_the_default_model_flags_are_the_kinds_own(kind):
    """Flags not given take the kind's defaults; the flags of other kinds stay unset."""
    args = cli.build_parser().parse_args(["train", "--model", kind])
    assert cli.model_flags(args) is cli.KINDS[kind]
    every = {flag for k in cli.KINDS.values() for flag in k.flags}
    assert {flag: getattr(args, flag) for flag in every} == {flag: cli.KINDS[kind].flags.get(flag) for flag in every}


def test_the_mlp_command_is_a_hand_written_loop_on_tutorial_2s_curve(tmp_path, capsys):
    """The command's MLP run is this loop: the same model, data, examples in each step, and SGD update.

    The parameters agree to float32 rounding (1e-6; the loop divides each
    gradient by the items as the accumulator does, the same ops in the same order).
    """
    B, steps, lr, seed = 4, 3, 0.1, 5
    got = trained("mlp", tmp_path, "cli", "--optim", "sgd", "--learning-rate", str(lr), "--lr-scheduler-type",
                  "constant", "--warmup-steps", "0", "--max-grad-norm", "0", "--per-device-train-batch-size", str(B),
                  "--seed", str(seed), capsys=capsys)
    model = MLP(1, 16, 1, 3, rng=numpy.random.default_rng(seed))
    x, y = curve_task(cli.GENERATED)
    order = epoch_order(len(x), seed, 0)
    for step in range(steps):
        rows = order[step * B:(step + 1) * B]
        loss = F.mse_loss(model(Tensor(x[rows])), Tensor(y[rows]), reduction="sum")
        loss.backward()
        for p in model.parameters():
            p.data -= numpy.float32(lr) * (p.grad.data / numpy.float32(B))
            p.grad = None
    for name, p in model.named_parameters():
        numpy.testing.assert_allclose(got[name], p.data, rtol=1e-6, atol=1e-7, err_msg=name)
