"""allocator.keep_freed_memory: the memory a step frees stays with the process, so the next step does not fault it in.

Each check runs in a fresh Python process: the setting belongs to the whole
process, and the test session's own must stay glibc's default.
"""

import platform
import re
import subprocess
import sys
import textwrap

import pytest

from tinygrad_ckpt.train import TrainingArguments

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

# A step's pattern: 64 arrays of 1 MiB made, written, then all freed; three
# rounds. Prints, for the third round, the minor page faults and the bytes the
# heap (main arena) holds once everything is freed again, from mallinfo2.
STEPS = textwrap.dedent("""
    import ctypes, resource, sys
    import numpy
    if sys.argv[1] == "keep":
        from tinygrad_ckpt import allocator
        print("applied", allocator.keep_freed_memory()[0])
    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")]
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = Mallinfo2
    for round in range(3):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        arrays = [numpy.ones(1 << 18, dtype=numpy.float32) for _ in range(64)]
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        del arrays
    print("faults", faults, "heap", libc.mallinfo2().arena)
""")


def run_steps(mode):
    result = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    faults, heap = map(int, re.search(r"faults (\d+) heap (\d+)", result.stdout).groups())
    return result.stdout, faults, heap


@glibc
def test_with_the_setting_a_step_reuses_the_memory_the_last_one_freed():
    out, faults, heap = run_steps("keep")
    assert "applied True" in out
    step = 64 << 20
    assert heap >= step  # what the rounds freed is still the heap's, for the next round
    assert faults < (step >> 12) // 10  # so the third round wrote to pages already mapped: few faults


@glibc
def test_without_it_glibc_hands_the_freed_top_of_the_heap_back():
    """The default the setting changes: the heap shrinks after each round (so each round faults its pages in)."""
    _, _, heap = run_steps("default")
    assert heap < 16 << 20


def test_keep_freed_memory_must_be_a_bool():
    with pytest.raises(ValueError, match="keep_freed_memory must be True or False, got 'yes'"):
        TrainingArguments(keep_freed_memory="yes")


def counting_calls(body):
    """A script that counts allocator.keep_freed_memory's calls while `body` runs, then prints 'calls N'."""
    return textwrap.dedent("""
        import tinygrad_ckpt.allocator as allocator
        calls = []
        keep = allocator.keep_freed_memory
        allocator.keep_freed_memory = lambda: calls.append(1) or keep()
    """) + textwrap.dedent(body) + '\nprint("calls", len(calls))\n'


@glibc
@pytest.mark.parametrize("flag, calls, says", [
    ([], 1, "allocator: freed memory is kept for the next step (glibc's malloc, tinygrad_ckpt.allocator; this "
            "command's default, --no-keep-freed-memory leaves the C library's)"),
    (["--no-keep-freed-memory"], 0, "allocator: the C library's default (--no-keep-freed-memory)"),
])
def test_the_train_command_owns_its_process_it_keeps_freed_memory_unless_told_not_to(tmp_path, flag, calls, says):
    text = tmp_path / "tiny.txt"
    text.write_text("the cat sat on the mat. " * 100)
    script = counting_calls(f"""
        from tinygrad_ckpt import cli
        code = cli.main(["train", "--data", {str(text)!r}, "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
                         "--block-size", "16", "--max-steps", "2", "--sample-chars", "0", *{flag!r}])
        print("code", code)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert says in result.stdout
    assert f"code 0\ncalls {calls}" in result.stdout


def test_the_library_changes_nothing_unless_asked(tmp_path):
    """Importing every module, building the command line's parser, and training with default arguments: no call."""
    script = counting_calls("""
        import numpy
        import tinygrad_ckpt, tinygrad_ckpt.cli, tinygrad_ckpt.bench, tinygrad_ckpt.fit
        from tinygrad_ckpt.data import CharDataset
        from tinygrad_ckpt.nn import GPT, GPTConfig
        from tinygrad_ckpt.train import TrainingArguments, Trainer
        tinygrad_ckpt.cli.build_parser()
        model = GPT(GPTConfig(block_size=8, vocab_size=5, n_layer=1, n_head=2, n_embd=8),
                    rng=numpy.random.default_rng(0))
        data = CharDataset(numpy.arange(100) % 5, block_size=8)
        Trainer(model, TrainingArguments(max_steps=1, disable_tqdm=True, logging_steps=0), data).train()
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("calls 0")


@glibc
def test_bench_keeps_freed_memory_by_default_and_its_notes_say_so(tmp_path):
    result = subprocess.run([sys.executable, "-m", "tinygrad_ckpt", "bench", "--profile", "--tiny", "--repeats", "1",
                             "--output-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    notes = (tmp_path / "profile.md").read_text()
    assert "- allocator: glibc keeps freed memory: blocks under 32 MiB come from the heap" in notes


def test_with_no_keep_freed_memory_the_bench_notes_name_the_default(tmp_path):
    from tinygrad_ckpt import cli

    assert cli.main(["bench", "--profile", "--tiny", "--repeats", "1", "--no-keep-freed-memory",
                     "--output-dir", str(tmp_path)]) == 0
    assert "- allocator: the C library's default" in (tmp_path / "profile.md").read_text()
