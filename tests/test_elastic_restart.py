"""torchrun --max-restarts: a worker SIGKILLed mid-run; the restarted group resumes by itself (`--resume
auto` is implied by TORCHELASTIC_RESTART_COUNT > 0) and ends bit-identical to the uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from ranks import finish, job_env

from torchboost.train.checkpoint import list_checkpoints, load_checkpoint

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--max-restarts=1"]
TRAIN = ["-m", "torchboost", "train", "-c", "digits-lenet", "--epochs", "4", "--set", "train.progress_bar=false",
         "--set", "train.log_every=1000", "--set", "checkpoint.save_every_epochs=1", "--set", "checkpoint.keep_max=10"]


def launch(out: Path) -> subprocess.Popen:
    env = job_env(dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    return subprocess.Popen([*TORCHRUN, *TRAIN, "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True)


def workers(agent: subprocess.Popen) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(agent.pid)], capture_output=True, text=True).stdout
    return sorted(int(p) for p in out.split())


@pytest.mark.dist
@pytest.mark.slow
def test_a_killed_worker_is_restarted_and_the_run_ends_as_if_never_interrupted(tmp_path):
    straight = launch(tmp_path / "straight")
    victim = launch(tmp_path / "killed")
    deadline = time.monotonic() + 600  # a bound against a hang, not a speed claim
    while not list(Path(tmp_path / "killed" / "ckpt").glob("mnist_cnn-2_*.pt")):  # the event: epoch 2 saved
        assert time.monotonic() < deadline and victim.poll() is None, "the run ended before epoch 2's checkpoint"
        time.sleep(0.1)
    os.kill(workers(victim)[-1], signal.SIGKILL)
    ((out, _),) = finish([victim], 600)
    assert victim.returncode == 0, out[-3000:]
    assert "resumed from" in out and "final: top-1" in out
    finish([straight], 600)
    assert straight.returncode == 0
    a = load_checkpoint(list_checkpoints(tmp_path / "straight" / "ckpt", "mnist_cnn")[-1])
    b = load_checkpoint(list_checkpoints(tmp_path / "killed" / "ckpt", "mnist_cnn")[-1])
    assert a["epoch"] == b["epoch"] == 3  # zero-based: the 4th epoch
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    timing = {"train_time_s", "data_wait_ms", "step_ms", "data_wait_share"}
    rows = [[{k: v for k, v in json.loads(line).items() if k not in timing}
             for line in (p / "history.jsonl").read_text().splitlines()] for p in (tmp_path / "straight",
                                                                                 tmp_path / "killed")]
    assert rows[0] == rows[1] and len(rows[0]) == 4  # the same history (losses, accuracies, lr), times aside
