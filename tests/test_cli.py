"""The `tinygrad-ckpt train` command: a tiny run end to end, bad input, and the default run's first steps."""

import re
import subprocess
import sys

import numpy
import pytest

from tinygrad_ckpt import cli, serialization
from tinygrad_ckpt.data import CharTokenizer, load_char_datasets
from tinygrad_ckpt.nn import GPT, GPTConfig
from tinygrad_ckpt.train import TrainingArguments, Trainer

TINY = ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "16", "--disable-tqdm"]


def printed_losses(out):
    return [float(x) for x in re.findall(r"\| loss (\d+\.\d+)", out)]


def test_train_command_tiny_run(tmp_path, capsys):
    text = tmp_path / "tiny.txt"
    text.write_text("the cat sat on the mat. " * 200)
    code = cli.main([
        "train", "--data", str(text), *TINY, "--max-steps", "12", "--per-device-train-batch-size", "4",
        "--gradient-accumulation-steps", "2", "--learning-rate", "1e-2", "--warmup-steps", "0",
        "--logging-steps", "2", "--output-dir", str(tmp_path / "out"), "--sample-chars", "40",
    ])
    out = capsys.readouterr().out
    assert code == 0, out
    losses = printed_losses(out)
    assert len(losses) == 7 and losses[-1] < losses[0] - 0.3, out  # steps 1, 2, 4, ..., 12: the printed loss falls
    assert re.search(r"training loss: \d+\.\d+ \(step 1\) -> \d+\.\d+ \(step 12\)", out)
    assert re.search(r"validation loss: \d+\.\d+", out)
    assert "4 per micro-batch x 2 accumulation steps" in out
    sample = out.split("sample:\n", 1)[1].rsplit("\ntime:", 1)[0]
    assert len(sample) == 40 and set(sample) <= set("the cat sat on the mat. ")

    # the saved model loads, with the tokenizer and config needed to sample from it
    extra = serialization.load(tmp_path / "out" / "model.npz")["extra"]
    config = GPTConfig(**extra["config"])
    assert (config.n_layer, config.n_embd, config.block_size) == (1, 16, 16)
    assert CharTokenizer.from_state_dict(extra["tokenizer"]).chars == sorted(set("the cat sat on the mat. "))
    assert (tmp_path / "out" / "checkpoint.npz").exists()


def test_train_command_resumes(tmp_path, capsys):
    text = tmp_path / "tiny.txt"
    text.write_text("abcdefgh " * 100)
    common = ["train", "--data", str(text), *TINY, "--per-device-train-batch-size", "2", "--logging-steps", "1",
              "--sample-chars", "0", "--output-dir", str(tmp_path / "out"), "--save-steps", "2",
              "--gradient-checkpointing"]
    assert cli.main([*common, "--max-steps", "4"]) == 0
    full = printed_losses(capsys.readouterr().out)
    assert cli.main([*common, "--max-steps", "4", "--resume", "--output-dir", str(tmp_path / "out2")]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    assert cli.main([*common, "--max-steps", "4", "--output-dir", str(tmp_path / "out2")]) == 0
    capsys.readouterr()
    assert cli.main([*common, "--max-steps", "4", "--resume", str(tmp_path / "out" / "checkpoint.npz")]) == 0
    # a finished run resumed: nothing left to do, the history is the saved one
    assert printed_losses(capsys.readouterr().out) == []
    assert len(full) == 4


def test_bad_input_is_a_one_line_error(tmp_path, capsys):
    assert cli.main(["train", "--data", str(tmp_path / "missing.txt")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err
    assert cli.main(["train", *TINY, "--gradient-accumulation-steps", "0"]) == 2
    assert "gradient_accumulation_steps must be an integer >= 1" in capsys.readouterr().err
    short = tmp_path / "short.txt"
    short.write_text("too short")
    assert cli.main(["train", "--data", str(short)]) == 2
    assert "fewer than one block" in capsys.readouterr().err


def test_gradient_checkpointing_kwargs_are_json(capsys):
    assert cli.main(["train", *TINY, "--gradient-checkpointing",
                     "--gradient-checkpointing-kwargs", '{"segments": "sqrt", "policy": "selective_attention"}']) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["train", *TINY, "--gradient-checkpointing", "--gradient-checkpointing-kwargs", "{segments: sqrt}"])
    assert "--gradient-checkpointing-kwargs: not valid JSON" in capsys.readouterr().err
    assert cli.main(["train", *TINY, "--gradient-checkpointing", "--gradient-checkpointing-kwargs", '{"policy": "x"}']) == 2
    assert "unknown checkpoint policy 'x'" in capsys.readouterr().err


def test_python_dash_m_runs_the_same_command():
    result = subprocess.run([sys.executable, "-m", "tinygrad_ckpt", "train", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for flag in ("--per-device-train-batch-size", "--gradient-accumulation-steps", "--gradient-checkpointing",
                 "--max-steps", "--learning-rate", "--output-dir", "--seed", "--resume", "--data", "--device"):
        assert flag in result.stdout


def test_default_training_run_loss_falls_in_its_first_steps():
    """The default command's data, model and optimizer settings, for its first 15 steps."""
    d = cli.DEFAULTS
    tokenizer, train, _ = load_char_datasets(None, d["block_size"], 0.1)
    config = GPTConfig(block_size=d["block_size"], vocab_size=tokenizer.vocab_size, n_layer=d["n_layer"],
                       n_head=d["n_head"], n_embd=d["n_embd"], dropout=d["dropout"])
    model = GPT(config, rng=numpy.random.default_rng(0))
    args = TrainingArguments(
        per_device_train_batch_size=d["per_device_train_batch_size"], learning_rate=d["learning_rate"],
        warmup_steps=d["warmup_steps"], lr_scheduler_type=d["lr_scheduler_type"], max_steps=15,
        adam_beta2=0.99, logging_steps=5, disable_tqdm=True,
    )
    assert d["warmup_steps"] >= 15  # so these 15 steps have the full run's learning rates
    losses = [e["loss"] for e in Trainer(model, args, train).train()]
    assert losses[0] > 3.5  # about log(vocab) = 4.1 at the start
    assert losses[-1] < losses[0] - 0.5, losses
