"""The `tinygrad-ckpt train` command: a tiny run end to end, bad input, and the default run's first steps."""

import re
import subprocess
import sys
from dataclasses import fields

import numpy
import pytest

from tinygrad_ckpt import backend, cli, serialization
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
    assert "training: 12 optimizer steps, each of 8 examples (the effective batch) = 4 per micro-batch x 2 " \
           "accumulation steps x 1 process" in out
    assert "checkpointing: off" in out and "memory: 'mem' in a log line is what the process holds" in out
    assert "logging: every 2 optimizer steps and after the first; 'loss' is the mean per token over the " \
           "optimizer steps since the previous log line" in out
    sample = out.split("sample:\n", 1)[1].rsplit("\ntime:", 1)[0]
    assert len(sample) == 40 and set(sample) <= set("the cat sat on the mat. ")
    assert re.search(r"\ntime: \d+\.\d s wall clock, \d+\.\d s of CPU \(all threads of this process\)\n$", out)

    # the saved model loads, with the tokenizer and config needed to sample from it
    extra = serialization.load(tmp_path / "out" / "model.npz")["extra"]
    config = GPTConfig(**extra["config"])
    assert (config.n_layer, config.n_embd, config.block_size) == (1, 16, 16)
    assert CharTokenizer.from_state_dict(extra["tokenizer"]).chars == sorted(set("the cat sat on the mat. "))
    assert (tmp_path / "out" / "checkpoint-12.npz").exists()


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
    assert cli.main([*common, "--max-steps", "4", "--resume", str(tmp_path / "out" / "checkpoint-4.npz")]) == 0
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


@pytest.mark.parametrize("kwargs, says", [
    (None, "each of the 2 blocks is a segment; a segment keeps only its input, and recomputes all of its inside"),
    ('{"segments": "sqrt", "policy": "selective_attention", "split_blocks": true}',
     "2 segments (segments='sqrt') of the 4 half blocks (each block's attention and feed-forward apart); "
     "policy selective_attention: a segment keeps what the policy saves"),
    ('{"segments": 1}', "1 segment (segments=1) of the 2 blocks;"),
])
def test_the_header_says_which_checkpointing_is_in_force(kwargs, says, capsys):
    flags = ["--gradient-checkpointing"] + (["--gradient-checkpointing-kwargs", kwargs] if kwargs else [])
    assert cli.main(["train", *TINY, "--n-layer", "2", "--max-steps", "1", "--sample-chars", "0", *flags]) == 0
    assert f"checkpointing: {says}" in capsys.readouterr().out


def test_help_says_what_gradient_accumulation_steps_does_to_the_batch_and_to_memory():
    train_parser = cli.build_parser().subcommands["train"]
    text = " ".join(train_parser.format_help().split())  # argparse wraps lines
    help_of_flag = text.rsplit("--gradient-accumulation-steps GRADIENT_ACCUMULATION_STEPS", 1)[1].split(" --", 1)[0]
    assert "raises the effective batch: per_device_train_batch_size x gradient_accumulation_steps x processes" in help_of_flag
    assert "To keep the batch and cut memory, divide per_device_train_batch_size and multiply this" in help_of_flag


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy's overflow warnings, on the way to NaN
def test_detect_anomaly_names_the_op_that_made_a_nan_in_one_line(tmp_path, capsys):
    text = tmp_path / "tiny.txt"
    text.write_text("the cat sat on the mat. " * 100)
    common = ["train", "--data", str(text), *TINY, "--max-steps", "6", "--optim", "sgd", "--learning-rate", "1e30",
              "--warmup-steps", "0", "--sample-chars", "0"]  # the first step sends the weights to 1e28: NaN next
    err = one_line_error([*common, "--detect-anomaly"], capsys)
    assert re.match(r"tinygrad-ckpt train: error: anomaly mode: Function \w+ \(record #\d+ on the tape\) returned "
                    r"(nan|inf) values .* during forward.* At .*, line \d+, in forward: ", err), err
    assert "--debug" in err
    err = one_line_error([*common, "--max-consecutive-nonfinite-steps", "2"], capsys)  # without it: steps skipped
    assert "2 optimizer steps in a row" in err and "anomaly" not in err


def test_on_a_terminal_the_progress_bar_ends_before_the_summary(tmp_path):
    pty = pytest.importorskip("pty", reason="needs a pseudo-terminal (POSIX)")
    import os

    text = tmp_path / "tiny.txt"
    text.write_text("the cat sat on the mat. " * 100)
    controller, terminal = pty.openpty()
    run = subprocess.Popen([sys.executable, "-m", "tinygrad_ckpt", "train", "--data", str(text), *TINY[:-1],
                            "--max-steps", "4", "--logging-steps", "2", "--sample-chars", "0"],
                           stdout=terminal, stderr=terminal)
    os.close(terminal)
    screen = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the process closed the terminal
            break
        if not chunk:
            break
        screen += chunk
    os.close(controller)
    assert run.wait(timeout=60) == 0, screen
    screen = screen.decode()
    bar = screen.rindex("[####################] 4/4 | loss ")
    summary = screen.index("training loss:")
    assert bar < summary and "\n" in screen[bar:summary]  # the finished bar, then a new line
    assert re.search(r"\nstep 4/4 \| eval_loss [\d.]+\r?\ntraining loss: ", screen), screen[bar:]


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
        adam_beta2=d["adam_beta2"], logging_steps=5, disable_tqdm=True,
    )
    assert d["warmup_steps"] >= 15  # so these 15 steps have the full run's learning rates
    losses = [e["loss"] for e in Trainer(model, args, train).train()]
    assert losses[0] > 3.5  # about log(vocab) = 4.1 at the start
    assert losses[-1] < losses[0] - 0.5, losses


# -- the flags are TrainingArguments' fields ------------------------------------------------
def test_every_training_argument_is_a_flag_with_its_default_help_and_choices():
    parser = cli.build_parser()
    parsed = parser.parse_args(["train"])
    train_parser = parser._subparsers._group_actions[0].choices["train"]
    actions = {a.dest: a for a in train_parser._actions}
    for f in fields(TrainingArguments):
        action = actions[f.name]
        assert action.option_strings[0] == "--" + f.name.replace("_", "-")
        expected = cli.DEFAULTS.get(f.name, f.default)
        assert getattr(parsed, f.name) == expected, f.name
        assert f.metadata["help"] in action.help
        assert action.choices == f.metadata.get("choices"), f.name
    # the demo's own defaults are the ones in DEFAULTS, and --help says so
    assert parsed.adam_beta2 == cli.DEFAULTS["adam_beta2"] and parsed.seed == cli.DEFAULTS["seed"]
    assert all(f"{name}={value!r}" in train_parser.epilog for name, value in cli.DEFAULTS.items())


def test_flag_values_reach_training_arguments(tmp_path):
    args = cli.build_parser().parse_args([
        "train", "--save-total-limit", "3", "--max-consecutive-nonfinite-steps", "4", "--no-logging-first-step",
        "--gradient-checkpointing", "--gradient-checkpointing-kwargs", '{"segments": "sqrt"}', "--optim", "sgd",
        "--accumulation-dtype", "float64", "--adam-beta2", "0.95", "--output-dir", str(tmp_path),
    ])
    training = TrainingArguments(**{f.name: getattr(args, f.name) for f in fields(TrainingArguments)})
    assert (training.save_total_limit, training.max_consecutive_nonfinite_steps, training.logging_first_step) == (3, 4, False)
    assert training.gradient_checkpointing_kwargs == {"segments": "sqrt"} and training.optim == "sgd"
    assert (training.accumulation_dtype, training.adam_beta2, training.output_dir) == ("float64", 0.95, str(tmp_path))


# -- a user's mistake is one line and exit status 2; a bug is a traceback ------------------------
def one_line_error(argv, capsys):
    """Run the command; return its stderr, after checking exit status 2 and a single line without a traceback."""
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's errors exit from parse_args
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("flags, message", [
    (["--lr", "1e-3"], "unrecognized arguments: --lr 1e-3"),  # not taken for --lr-scheduler-type
    (["--learning-rat", "1e-3"], "unrecognized arguments: --learning-rat"),  # not taken for --learning-rate
    (["--max-step", "3"], "unrecognized arguments: --max-step"),
    (["--max-steps", "three"], "argument --max-steps: invalid int value: 'three'"),
    (["--lr-scheduler-type", "step"], "argument --lr-scheduler-type: invalid choice: 'step'"),
    (["--gradient-checkpointing-kwargs", "[1]"], "expected a JSON object"),
    (["--n-head", "0"], "argument --n-head: must be at least 1, got '0'"),
    (["--dropout", "1.5"], r"argument --dropout: must be in \[0, 1\), got '1.5'"),
    (["--temperature", "0"], "argument --temperature: must be a finite number > 0, got '0'"),
    (["--sample-chars", "-1"], "argument --sample-chars: must be 0 or more"),
    (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    (["--learning-rate", "nan"], "learning_rate must be a finite number > 0, got nan"),
    (["--adam-beta2", "1"], r"adam_beta2 must be a number in \[0, 1\), got 1.0"),
    (["--save-total-limit", "0"], "save_total_limit must be an integer >= 1 or None"),
    (["--accumulation-dtype", "int8"], "accumulation_dtype must be a floating dtype"),
    (["--n-head", "3"], r"n_embd \(16\) must be divisible by n_head \(3\)"),
    (["--gradient-checkpointing", "--gradient-checkpointing-kwargs", '{"segments": "sqrtt"}'],
     r"gradient_checkpointing_kwargs\['segments'\] must be 'every', 'sqrt', an int or a list of block boundaries"),
    (["--gradient-checkpointing", "--gradient-checkpointing-kwargs", '{"segments": [1, "a"]}'],
     r"gradient_checkpointing_kwargs\['segments'\] must be"),
    (["--gradient-checkpointing", "--gradient-checkpointing-kwargs", '{"segments": 0}'],
     r"gradient_checkpointing_kwargs\['segments'\] must be"),
    (["--gradient-checkpointing", "--gradient-checkpointing-kwargs", '{"split_blocks": true, "segments": 9}'],
     r"segments must be between 1 and the number of layers \(2\), got 9"),
    (["--save-steps", "2"], r"save_steps=2 needs output_dir, .* set output_dir \(--output-dir\)"),
    (["--memory-report", ""], r"memory_report must be the path of an HTML file to write"),
    (["--memory-report", "."], r"memory_report: '\.' is a directory; give the path of a file in it"),
])
def test_bad_flag_values_are_one_line_errors(flags, message, capsys):
    err = one_line_error(["train", *TINY, "--max-steps", "1", "--sample-chars", "0", *flags], capsys)
    assert re.search(message, err), err
    assert err.startswith("tinygrad-ckpt train: error: ")


def _trained_into(out, capsys):
    """Train two steps on a tiny text into `out`; the command's arguments, to run again with more."""
    text = out.parent / "tiny.txt"
    text.write_text("abcdefgh " * 100)
    common = ["train", "--data", str(text), *TINY, "--per-device-train-batch-size", "2", "--sample-chars", "0",
              "--max-steps", "2", "--output-dir", str(out)]
    assert cli.main(common) == 0
    capsys.readouterr()
    return common


def test_bad_files_and_checkpoints_are_one_line_errors(tmp_path, capsys):
    common = _trained_into(tmp_path / "out", capsys)
    assert "--n-head 2" not in common[5:]
    err = one_line_error([*common, "--resume", "--n-head", "4"], capsys)  # the same shapes, another model
    assert "its model configuration differs in 'n_head': the checkpoint has 2, this run has 4" in err
    (tmp_path / "other.txt").write_text("ABCDEFGH " * 100)
    err = one_line_error([*common, "--resume", "--data", str(tmp_path / "other.txt")], capsys)
    assert "its tokenizer differs in 'chars'" in err
    (tmp_path / "out" / "checkpoint-2.npz").write_bytes(b"PK\x03\x04 not really")
    err = one_line_error([*common, "--resume", str(tmp_path / "out" / "checkpoint-2.npz")], capsys)
    assert "checkpoint-2.npz' is corrupt or truncated" in err
    (tmp_path / "a_file").write_text("x")
    err = one_line_error([*common[:-1], str(tmp_path / "a_file" / "out")], capsys)
    assert "a_file/out' is not writable" in err
    err = one_line_error(["train", *TINY, "--data", str(tmp_path)], capsys)
    assert "is a directory" in err


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy's overflow warnings, on the way to NaN
def test_a_run_that_diverges_stops_with_one_line(tmp_path, capsys):
    text = tmp_path / "tiny.txt"
    text.write_text("abcdefgh " * 100)
    err = one_line_error(["train", "--data", str(text), *TINY, "--per-device-train-batch-size", "2", "--sample-chars",
                          "0", "--max-steps", "30", "--learning-rate", "1e30", "--warmup-steps", "0",
                          "--max-grad-norm", "0", "--max-consecutive-nonfinite-steps", "2", "--output-dir",
                          str(tmp_path / "out")], capsys)
    assert "2 optimizer steps in a row" in err and "lower the learning rate" in err
    from tinygrad_ckpt.train import sorted_checkpoints, verify_checkpoint
    for _, path in sorted_checkpoints(tmp_path / "out"):
        verify_checkpoint(path)  # whatever was written is finite


@pytest.mark.skipif(backend.cuda_is_available(), reason="a GPU is present here, so --device cuda works")
def test_a_missing_optional_dependency_is_one_line(capsys):
    err = one_line_error(["train", *TINY, "--device", "cuda", "--max-steps", "1"], capsys)
    assert 'pip install -e ".[gpu]"' in err


def test_a_bug_shows_its_traceback_and_debug_shows_every_traceback(monkeypatch, capsys):
    def buggy(self, resume_from_checkpoint=None):
        return {}["missing"]  # a KeyError: a bug, not a user's mistake

    monkeypatch.setattr(Trainer, "train", buggy)
    with pytest.raises(KeyError):
        cli.main(["train", *TINY, "--max-steps", "1"])
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be an integer >= 1"):
        cli.main(["train", *TINY, "--gradient-accumulation-steps", "0", "--debug"])


def test_the_command_line_error_is_one_line_in_a_real_process():
    run = subprocess.run([sys.executable, "-m", "tinygrad_ckpt", "train", "--lr", "1e-3"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and run.stderr.strip().splitlines() == [
        "tinygrad-ckpt train: error: unrecognized arguments: --lr 1e-3 (see tinygrad-ckpt train --help)"]


def test_a_fresh_run_into_another_runs_output_dir_is_refused_in_one_line(tmp_path, capsys):
    common = _trained_into(tmp_path / "out", capsys)
    err = one_line_error(common, capsys)
    assert f"output directory '{tmp_path / 'out'}' already holds another run (checkpoint-2.npz, model.npz)" in err
    assert "--resume" in err and "--overwrite-output-dir" in err
    assert cli.main([*common, "--overwrite-output-dir"]) == 0
    assert "deleted the previous run's 2 file(s)" in capsys.readouterr().err


def test_resume_with_a_shorter_data_file_finishes_in_a_real_process(tmp_path):
    """The position of a checkpoint past the end of the shorter data's epoch: the next epoch, not a loop."""
    text, short = tmp_path / "text.txt", tmp_path / "short.txt"
    text.write_text("the cat sat on the mat. " * 200)  # 299 examples of 16: 75 micro-batches of 4
    short.write_text(text.read_text()[:700])  # 43 examples: 11 micro-batches
    command = [sys.executable, "-m", "tinygrad_ckpt", "train", *TINY, "--per-device-train-batch-size", "4",
               "--sample-chars", "0", "--val-fraction", "0", "--output-dir", str(tmp_path / "out")]
    first = subprocess.run([*command, "--data", str(text), "--max-steps", "12"], capture_output=True, text=True,
                           timeout=120)
    assert first.returncode == 0, first.stderr
    resumed = subprocess.run([*command, "--data", str(short), "--max-steps", "15", "--resume"], capture_output=True,
                             text=True, timeout=120)  # a hang fails here
    assert resumed.returncode == 0, resumed.stderr
    assert ("resume: the training data has 43 examples, the checkpoint's run had 299; it stopped at micro-batch 12 "
            "of epoch 0, past this data's 11 per epoch: continuing at the start of epoch 1") in resumed.stderr
    assert "training loss:" in resumed.stdout and "(step 15)" in resumed.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/dev/zero and RLIMIT_AS, as on Linux")
def test_data_that_never_ends_is_named_as_such_not_as_a_batch_too_large(tmp_path):
    import resource

    def at_most_4_gib():  # were /dev/zero read, the process would stop at this, not take the machine's memory
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))

    run = subprocess.run([sys.executable, "-m", "tinygrad_ckpt", "train", "--data", "/dev/zero", *TINY],
                         capture_output=True, text=True, timeout=60, preexec_fn=at_most_4_gib)
    assert run.returncode == 2 and run.stderr.strip().splitlines() == [
        "tinygrad-ckpt train: error: data path '/dev/zero' is a character device, which may never end (as "
        "/dev/zero), not a text file; give --data a regular file (save a stream to a file first)"], run.stderr


@pytest.mark.parametrize("argv, message", [
    (["fit", "--memory", "h300"], r"--memory 'h300' is neither a GPU preset \(t4, .*h100-80gb, h200\) nor a size"),
    (["fit", "--memory", "1e400GB"], r"--memory '1e400GB' is neither a GPU preset"),
    (["fit", "--reserve", "1e400GB"], r"--reserve '1e400GB' is not a size"),
    (["verify", "--seed", "-1"], r"--seed must be 0 or more"),
    (["bench", "--tiny", "--no-plots", "--output-dir", "{file}"], r"output directory '.*a_file' is not writable "
                                                                   r"\(File exists\); choose another output directory"),
    (["train", *TINY, "--output-dir", "{file}/out"], r"output directory '.*a_file/out' is not writable"),
])
def test_every_subcommands_bad_values_are_one_line_errors(argv, message, tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    err = one_line_error([a.replace("{file}", str(tmp_path / "a_file")) for a in argv], capsys)
    assert re.search(message, err) and "Errno" not in err, err


@pytest.mark.parametrize("command, advice", [("train", "--per-device-train-batch-size"), ("verify", "--batch-size"),
                                             ("bench", "--quick")])
def test_out_of_memory_advice_names_the_commands_own_flags(command, advice):
    text = cli._one_line(MemoryError("Unable to allocate 23.3 TiB"), command)
    assert text.startswith("out of memory (Unable to allocate 23.3 TiB); try") and advice in text


def test_a_model_too_large_for_memory_names_the_model_flags_not_the_batch(monkeypatch, capsys):
    def too_large(*args, **kwargs):
        raise MemoryError("Unable to allocate 21.8 TiB for an array with shape (3000000, 1000000)")

    monkeypatch.setattr(cli, "GPT", too_large)
    err = one_line_error(["train", *TINY, "--max-steps", "1"], capsys)
    assert ("the model and its optimizer state do not fit in memory (Unable to allocate 21.8 TiB for an array with "
            "shape (3000000, 1000000)); use a smaller --n-embd, --n-layer or --block-size") in err
    assert "--per-device-train-batch-size" not in err
