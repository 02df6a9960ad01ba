"""SIGKILL `tinygrad-ckpt train` at any moment, saves included: nothing is lost, and --resume ends where it would have.

One uninterrupted run gives the reference losses. Another run, with the same
flags, is killed with SIGKILL several times (no handler can run: the
process stops wherever it is) and started again with --resume each time.
Some kills land while a checkpoint is being written (the moment its
temporary file appears), some a few milliseconds after a step's checkpoint
has landed, some while the process starts up and reads its checkpoint back. After every kill the newest checkpoint must verify in
full; at the end, the killed-and-resumed run's losses must equal the
reference's exactly, step by step (the same data order, dropout masks and
optimizer state), and no temporary file may be left behind.

Bounded in time: a 1-layer model of width 16 on a short text, 40 steps, a
checkpoint after every step. Each process startup costs about a third of a
second; the whole test takes a few seconds.
"""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from tinygrad_ckpt.train import sorted_checkpoints, verify_checkpoint

STEPS = 40
KILLS = 4
TIMEOUT = 60  # seconds for any one wait; a hang fails instead of blocking CI
FLAGS = ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "16", "--dropout", "0.1",
         "--per-device-train-batch-size", "4", "--max-steps", str(STEPS), "--learning-rate", "1e-2",
         "--warmup-steps", "3", "--lr-scheduler-type", "cosine", "--save-steps", "1", "--save-total-limit", "2",
         "--logging-steps", "1", "--val-fraction", "0", "--sample-chars", "0", "--disable-tqdm"]

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="SIGKILL is a POSIX signal")


def train(text, out, resume=False):
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "tinygrad_ckpt", "train", "--data", str(text), *FLAGS, "--output-dir", str(out)]
    return subprocess.Popen(command + (["--resume"] if resume else []), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)


def losses(out):
    """[(step, loss)] from the log history in the final checkpoint."""
    history = verify_checkpoint(out / f"checkpoint-{STEPS}.npz")["extra"]["trainer_state"]["log_history"]
    return [(e["step"], e["loss"]) for e in history if "loss" in e]


def newest_step(out):
    found = sorted_checkpoints(out) if out.exists() else []
    return found[0][0] if found else 0


def wait_for(condition, process):
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if process.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def test_sigkill_at_any_moment_loses_nothing_and_resume_gives_the_same_losses(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog; " * 40)
    reference = train(text, tmp_path / "reference")
    assert reference.wait(TIMEOUT) == 0, reference.stderr.read()
    expected = losses(tmp_path / "reference")
    assert [step for step, _ in expected] == list(range(1, STEPS + 1))

    out, rng, killed = tmp_path / "killed", random.Random(0), []
    for k in range(KILLS):
        before = newest_step(out)
        process = train(text, out, resume=before > 0)
        if k % 3 == 2:  # early: while it starts, removes leftovers, or reads the checkpoint back
            time.sleep(rng.uniform(0, 0.5))
        else:  # first one step further than the last run got, so the runs make progress, then:
            wait_for(lambda: newest_step(out) > before, process)
            if k % 3 == 0:  # during a save: as soon as its temporary file exists
                wait_for(lambda: any(name.endswith(".tmp") for name in os.listdir(out)), process)
            else:  # anywhere in the next step or save
                time.sleep(rng.uniform(0, 0.03))
        process.send_signal(signal.SIGKILL)
        code = process.wait(TIMEOUT)
        if code == 0:  # it finished first: nothing left to kill
            break
        assert code == -signal.SIGKILL, process.stderr.read()
        killed.append(newest_step(out))
        verify_checkpoint(sorted_checkpoints(out)[0][1])  # the newest checkpoint is whole
        assert len(sorted_checkpoints(out)) <= 3  # save_total_limit 2, and one more if killed between a save and a deletion
    assert killed, "no run was killed before it finished"

    final = train(text, out, resume=True)
    assert final.wait(TIMEOUT) == 0, final.stderr.read()
    assert losses(out) == expected  # exactly: the same arithmetic on the same examples
    assert not [name for name in os.listdir(out) if name.endswith(".tmp")]  # leftovers of a killed save removed
