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


@glibc
def test_the_train_command_applies_it_and_says_so(tmp_path):
    text = tmp_path / "tiny.txt"
    text.write_text("the cat sat on the mat. " * 100)
    script = textwrap.dedent(f"""
        from tinygrad_ckpt import cli
        import tinygrad_ckpt.allocator as allocator
        calls = []
        keep = allocator.keep_freed_memory
        allocator.keep_freed_memory = lambda: calls.append(1) or keep()
        code = cli.main(["train", "--data", {str(text)!r}, "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
                         "--block-size", "16", "--max-steps", "2", "--sample-chars", "0", "--keep-freed-memory"])
        print("calls", len(calls), "code", code)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "allocator: freed memory is kept for the next step" in result.stdout
    assert "calls 1 code 0" in result.stdout


@glibc
def test_bench_applies_it_and_its_notes_say_so(tmp_path):
    result = subprocess.run([sys.executable, "-m", "tinygrad_ckpt", "bench", "--profile", "--tiny", "--repeats", "1",
                             "--keep-freed-memory", "--output-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    notes = (tmp_path / "profile.md").read_text()
    assert "- allocator: glibc keeps freed memory: blocks under 32 MiB come from the heap" in notes


def test_without_the_flag_the_bench_notes_name_the_default(tmp_path):
    from tinygrad_ckpt import cli

    assert cli.main(["bench", "--profile", "--tiny", "--repeats", "1", "--output-dir", str(tmp_path)]) == 0
    assert "- allocator: the C library's default" in (tmp_path / "profile.md").read_text()
