"""The READMEs as a new user follows them: the Python example runs, and the commands are the ones CI runs."""

import importlib.metadata
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TUTORIALS_README = ROOT / "tutorials" / "README.md"
CI = ROOT / ".ci" / "run"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README should show the two techniques in code"
    for block in blocks:
        namespace = {}
        exec(compile(block, str(README), "exec"), namespace)
        assert namespace["optimizer"].params  # it built a model and took optimizer steps
        assert namespace["acc"].items == 0  # the last group was stepped and zeroed


def _bash_blocks(text, after):
    """The ```bash blocks of `text` in the section that starts with the heading `after`, as lists of commands."""
    section = text.split(after, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [[re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines() if line.strip()] for block in blocks]


def _ci_commands():
    return {re.sub(r"\s+#.*$", "", line).strip() for line in CI.read_text().splitlines()}


def test_ci_installs_the_course_with_the_readmes_line():
    for text, heading in ((README.read_text(), "## Tutorials"), (TUTORIALS_README.read_text(), "# Tutorials")):
        installs = [c for block in _bash_blocks(text, heading) for c in block if c.startswith("pip install")]
        assert installs == ['pip install -e ".[tutorials]"'], installs
        assert installs[0] in _ci_commands()


def test_ci_runs_the_tutorials_every_documented_way_with_the_documented_commands():
    text = TUTORIALS_README.read_text()
    ran = _ci_commands()
    run_them = [c for block in _bash_blocks(text, "## Run them") for c in block]
    assert "python tutorials/harness.py" in ran and any(c.startswith("python tutorials/harness.py") for c in run_them)
    assert any(c.endswith("&& python -m pytest") for c in ran)  # the suite collects tutorials/ too (testpaths)
    notebook = _bash_blocks(text, "## Open one as a notebook")[0]
    assert [c.split()[0] for c in notebook] == ["python", "jupytext", "jupyter", "python"]
    for command in notebook:
        assert command in ran, f"tutorials/README.md says `{command}`, which .ci/run does not run"


def test_ci_runs_the_tutorials_and_numerical_tests_under_two_blas_kernels_and_two_thread_counts():
    """What the tutorials print survives another BLAS kernel and thread count; CI proves it."""
    text = CI.read_text()
    assert 'kernels="Haswell SkylakeX"' in text and "for threads in 1 2; do" in text
    ran = [line.strip() for line in text.splitlines() if line.strip().startswith("OPENBLAS_CORETYPE=$kernel")]
    assert "OPENBLAS_CORETYPE=$kernel OPENBLAS_NUM_THREADS=$threads python tutorials/harness.py" in ran
    assert any("python -m pytest" in line for line in ran)
    assert 'git status --porcelain -- tutorials' in text  # the committed pictures are left as they were


def test_every_install_instruction_works_from_the_clone():
    """The package is not on an index: installing it by name would not resolve; an editable install of the clone, with its extras, does."""
    extras = set(importlib.metadata.metadata("tinygrad_ckpt").get_all("Provides-Extra"))
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        path = ROOT / name
        if path.suffix not in (".py", ".md", ".sh", ".toml", "") or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        assert not re.search(r"pip install ['\"]?tinygrad[-_]ckpt", text), name
        for extra in re.findall(r"pip install -e ['\"]?\.\[([\w,-]+)\]", text):
            assert set(extra.split(",")) <= extras, (name, extra)


def test_the_readme_is_a_front_door():
    """What it is, set up, the four commands, the map, where next: about 250 lines at most."""
    lines = len(README.read_text().splitlines())
    print(f"README.md: {lines} lines")
    assert lines <= 250, f"README.md has {lines} lines; methods and results belong in benchmarks/README.md, " \
                         "testing in tests/README.md, the teaching in the tutorials"


def test_the_map_names_every_module_of_the_package():
    """A learner finds each file by the map: every module and folder of tinygrad_ckpt/ has its row."""
    text = README.read_text()
    package = ROOT / "tinygrad_ckpt"
    names = [f"`{p.name}`" for p in package.glob("*.py") if not p.name.startswith("__")]
    names += [f"`{p.name}/`" for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    missing = [name for name in names if name not in text]
    assert not missing, f"README.md's map of the package has no row for {', '.join(sorted(missing))}"


# -- the figures the text shows are what the commands print --------------------------------
GPT_WITH_BOTH = ROOT / "tutorials" / "06_gpt_with_both.md"


def _train_peak(capsys, *flags):
    """Run `tinygrad-ckpt train --max-steps 2 ...`: the loss and the peak its step-2 log line prints."""
    from tinygrad_ckpt import cli

    assert cli.main(["train", "--max-steps", "2", "--sample-chars", "0", *flags]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("step 2/2 | epoch")][0]
    return re.search(r"loss (\S+)", line).group(1), re.search(r"peak (\S+ MiB)", line).group(1)


def test_the_peak_memory_table_is_what_train_prints(capsys):
    """Tutorial 6's table of `train --max-steps 2` peaks, by split of the batch, with and without checkpointing."""
    text = GPT_WITH_BOTH.read_text()
    rows = re.findall(r"^\| (\d+) × (\d+)(?: \(the default\))? \| ([\d.]+ MiB) \| ([\d.]+ MiB)? ?\|$", text, flags=re.M)
    assert len(rows) == 5, rows
    assert "the loss at step 2 is 4.0090 in every row below" in text
    for batch, steps, plain, checkpointed in rows:
        flags = ["--per-device-train-batch-size", batch, "--gradient-accumulation-steps", steps]
        assert _train_peak(capsys, *flags) == ("4.0090", plain), (batch, steps)
        if checkpointed:
            assert _train_peak(capsys, *flags, "--gradient-checkpointing") == ("4.0090", checkpointed), (batch, steps)


def _console_blocks():
    return re.findall(r"```console\n(.*?)```", README.read_text(), flags=re.S)


def _shown(block):
    return [line.rstrip() for line in block.splitlines() if line.strip() and line.strip() != "..."]


def test_the_train_excerpt_is_what_train_prints(capsys):
    """The README's excerpt of `tinygrad-ckpt train --max-steps 2`: every line but the speed, as printed."""
    from tinygrad_ckpt import cli

    assert "`tinygrad-ckpt train --max-steps 2`" in README.read_text()
    assert cli.main(["train", "--max-steps", "2", "--sample-chars", "0"]) == 0
    speed = re.compile(r"\d+ tok/s")
    printed = {speed.sub("N tok/s", line.rstrip()) for line in capsys.readouterr().out.splitlines()}
    for line in _shown(_console_blocks()[0]):
        assert speed.sub("N tok/s", line) in printed, line


def test_the_fit_excerpt_is_what_fit_prints(capsys):
    """The README's excerpt of `tinygrad-ckpt fit --model gpt2-large --memory v100-16gb --effective-batch-size 32`."""
    from tinygrad_ckpt import cli

    command = "tinygrad-ckpt fit --model gpt2-large\n--memory v100-16gb --effective-batch-size 32"
    assert command in README.read_text()
    assert cli.main(command.split()[1:]) == 0
    printed = {line.rstrip() for line in capsys.readouterr().out.splitlines()}
    for line in _shown(_console_blocks()[2]):
        assert line in printed, line


def test_the_verify_excerpt_is_what_verify_prints_with_its_errors_within_the_tolerance(capsys):
    """The README's `tinygrad-ckpt verify` rows: model, strategy, tolerance and verdict as printed.

    Their errors are rounding, different with each BLAS kernel and thread
    count, so the excerpt's errors are not compared with
    this machine's: each is checked to be within its row's tolerance, as
    the verdict says.
    """
    from tinygrad_ckpt import cli

    assert cli.main(["verify", "--no-mpi"]) == 0
    rows = lambda lines: {tuple(c[:2]): c for c in ([x.strip() for x in line.strip("|").split("|")]  # noqa: E731
                                                    for line in lines if line.startswith(("| GPT", "| MLP")))}
    excerpt = next(b for b in _console_blocks() if b.startswith("| model | strategy |"))
    printed, shown = rows(capsys.readouterr().out.splitlines()), rows(_shown(excerpt))
    assert len(shown) >= 3, shown
    for key, cells in shown.items():
        assert printed[key][5:] == cells[5:], key  # the tolerance and the verdict
        rtol64, rtol32 = (float(t) for t in cells[5].split(" / "))
        assert float(cells[3]) <= rtol64 and float(cells[4]) <= rtol32, key


def test_the_size_the_readme_states():
    """'the engine is about N lines ..., checkpointing about M, accumulation K': lines of the files, docstrings in."""
    package = ROOT / "tinygrad_ckpt"
    parts = {
        "the engine is about": ["tensor.py", "function.py", "tape.py", "versions.py", "anomaly.py", "autograd.py",
                                "backend.py", "memory.py", "functional.py", *[f"ops/{p.name}" for p in (package / "ops").glob("*.py")]],
        "checkpointing about": ["checkpoint.py", "recompute.py", "determinism.py", "policies.py", "schedules.py"],
        "accumulation": ["accumulate.py"],
    }
    text = " ".join(README.read_text().split())
    for words, files in parts.items():
        stated = int(re.search(re.escape(words) + r" ([\d,]+)", text).group(1).replace(",", ""))
        lines = sum(len((package / name).read_text().splitlines()) for name in files)
        print(f"{words}: {lines} lines (the README says {stated})")
        assert abs(lines - stated) <= 0.1 * stated, (words, lines, stated)


# -- benchmarks/README.md: the table `tinygrad-ckpt fit` computes for GPT-2 on five GPUs ---------
BENCHMARKS = ROOT / "benchmarks" / "README.md"
FIT_MODELS = {"GPT-2 (124M)": "gpt2", "GPT-2 medium (355M)": "gpt2-medium", "GPT-2 large (774M)": "gpt2-large",
              "GPT-2 XL (1.6B)": "gpt2-xl"}
FIT_GPUS = ["t4", "a10", "a100-40gb", "a100-80gb", "h200"]
VERDICTS = {"nothing": "no technique needed", "accumulation": "gradient accumulation",
            "both": "gradient accumulation and checkpointing"}


def _fit_cell(model, gpu):
    """A cell as benchmarks/README.md writes it, from fit.plan_training."""
    from tinygrad_ckpt.fit import plan_training

    plan = plan_training(model, effective_batch_size=32, device_memory=gpu)
    rec = plan.recommendation
    if rec.shortfall_bytes:  # one GPU falls short; the ZeRO stage and GPUs that make one example fit
        stage = re.search(r"zero_stage=(\d)", rec.training_arguments).group(1)
        return (f"does not fit: {rec.shortfall_bytes / 2**30:.1f} GiB short (ZeRO stage {stage} on "
                f"{rec.processes} GPUs fits)")
    largest = {}
    for line in str(plan).splitlines():
        for name in ("no checkpointing", "every block"):
            if re.match(re.escape(name) + r"\s{2,}", line):
                value = line[len(name):].split()[0]
                largest[name] = 0 if value == "none" else int(value)
    args = rec.training_arguments  # as it prints: "TrainingArguments(per_device_train_batch_size=4, ...)"
    micro = int(re.search(r"per_device_train_batch_size=(\d+)", args).group(1))
    steps = re.search(r"gradient_accumulation_steps=(\d+)", args)
    word = {v: k for k, v in VERDICTS.items()}[rec.verdict]
    if word == "both":
        policy = re.search(r"'policy': '([a-z]+)_", args).group(1)  # 'selective_attention': "selective policy"
        word = f"both ({policy} policy)"
    return (f"{word}, {micro} x {int(steps.group(1)) if steps else 1} "
            f"(at most {largest['no checkpointing']} / {largest['every block']})")


def test_the_fit_table_is_what_fit_computes():
    rows = [line for line in BENCHMARKS.read_text().splitlines() if line.startswith("| GPT-2")]
    assert [r.split(" | ")[0][2:] for r in rows] == list(FIT_MODELS), rows
    for row in rows:
        name, *cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells == [_fit_cell(FIT_MODELS[name], gpu) for gpu in FIT_GPUS], name
