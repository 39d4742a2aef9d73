"""torchrun restarts against one uninterrupted run (digits-lenet on 2 processes, 2 epochs, a checkpoint every 4
updates; benchmarks/soak_restarts.py's launch), which the three checks share: torch's start-up in every process is
the costliest part of these jobs.

1. Three planned crashes under --max-restarts=3 (benchmarks/soak_restarts.py, short and not random): a worker killed
   mid-epoch during an update, rank 0 killed with a checkpoint half written, a worker killed during evaluation.
2. A worker SIGKILLed from outside, mid-run, under --max-restarts=1 (`--resume auto` is implied by
   TORCHELASTIC_RESTART_COUNT > 0).
Both jobs finish by themselves and end bit-identical to the uninterrupted run: weights, optimizer state, position
and history. Each restart continues mid-epoch from the newest whole checkpoint.
3. A run continues only on the process count it was trained with: the uninterrupted run resumed on one process (by
   hand, or by a torchrun restart after an elastic `--nnodes=1:2` job lost a node) stops with one line saying why,
   before anything in its folder changes — never a silently different run."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ranks import finish, job_env

from torchboost.train.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("soak_restarts", REPO / "benchmarks" / "soak_restarts.py")
soak = importlib.util.module_from_spec(spec)
spec.loader.exec_module(soak)

EPOCHS, SAVE_EVERY = 2, 4  # digits on 2 processes: 22 updates per epoch; checkpoints at updates 4, 8, ... of the run
FAULTS = [
    {"attempt": 0, "rank": 1, "moment": "step", "at": 9},  # after 1_8 was written: a mid-epoch restart
    {"attempt": 1, "rank": 0, "moment": "checkpoint", "at": 2},  # resumed at 1_8: writes 1_12, dies writing 1_16
    {"attempt": 2, "rank": 1, "moment": "eval", "at": 2},  # resumed at 1_12: dies in epoch 1's evaluation
]


def workers(agent: subprocess.Popen) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(agent.pid)], capture_output=True, text=True).stdout
    return sorted(int(p) for p in out.split())


def kill_a_worker_mid_run(agent: subprocess.Popen, out: Path) -> None:
    """SIGKILL the agent's last worker once the run has written a checkpoint (from update 4 of its 44 on: the
    event, not a timer, and any of them, since keep_max deletes the older ones on a fast machine)."""
    deadline = time.monotonic() + 600  # a bound against a hang, not a speed claim
    while not list((out / "ckpt").glob("mnist_cnn-*_*.pt")):
        assert time.monotonic() < deadline and agent.poll() is None, "the run ended before its first checkpoint"
        time.sleep(0.02)
    os.kill(workers(agent)[-1], signal.SIGKILL)


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_process(args: list[str], **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_RESTART_COUNT"}
    environ.update(soak.env(), **env)
    proc = subprocess.Popen([sys.executable, "-m", "torchboost", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=job_env(environ))
    ((out, err),) = finish([proc], 600)  # a bound against a hang, not a speed claim
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.dist
@pytest.mark.slow
def test_restarted_jobs_end_bit_identical_and_another_process_count_is_refused(tmp_path):
    plan = {"faults": FAULTS, "kill_log": str(tmp_path / "kills.jsonl")}
    straight = soak.launch(tmp_path / "straight", EPOCHS, SAVE_EVERY, 2)
    crashed = soak.launch(tmp_path / "crashed", EPOCHS, SAVE_EVERY, 2, plan)
    killed = soak.launch(tmp_path / "killed", EPOCHS, SAVE_EVERY, 2, restarts=1)
    kill_a_worker_mid_run(killed, tmp_path / "killed")
    (_, _), (crashed_out, _), (killed_out, _) = finish([straight, crashed, killed], 600)
    assert straight.returncode == 0

    # 1. three planned crashes
    assert crashed.returncode == 0, crashed_out[-4000:]
    done = soak.kills_done(plan)
    assert [(k["attempt"], k["rank"], k["moment"]) for k in done] == [(0, 1, "step"), (1, 0, "checkpoint"),
                                                                      (2, 1, "eval")]
    assert re.fullmatch(r"checkpoint write 2: \.mnist_cnn-1_16\.pt\.\d+\.tmp half written", done[1]["detail"])
    # each restart resumed from the newest WHOLE checkpoint, mid-epoch: never the half-written 1_16
    resumed = re.findall(r"resumed from \S+/(mnist_cnn-\d+_\d+\.pt) \(epoch (\d+), step (\d+)", crashed_out)
    assert resumed == [("mnist_cnn-1_8.pt", "1", "8"), ("mnist_cnn-1_12.pt", "1", "12"),
                       ("mnist_cnn-1_20.pt", "1", "20")]
    assert soak.compare(tmp_path / "straight", tmp_path / "crashed") == []
    assert not soak.temp_files(tmp_path / "crashed")  # the half-written file was cleared by the next start

    # 2. a worker killed from outside
    assert killed.returncode == 0, killed_out[-4000:]
    assert len(re.findall(r"resumed from \S+/mnist_cnn-\d+_\d+\.pt \(epoch \d+, step", killed_out)) == 1, killed_out
    assert soak.compare(tmp_path / "straight", tmp_path / "killed") == []

    # 3. the uninterrupted run resumed on one process
    out = tmp_path / "straight"
    ckpt = soak.newest(out)
    assert load_checkpoint(ckpt)["world_size"] == 2
    before = files(out)
    longer = soak.train_args(EPOCHS + 1, SAVE_EVERY, out)  # --force: a longer schedule
    for how, extra, env in (("--resume", ["--resume", str(out)], {}),
                            ("a torchrun restart", [], {"TORCHELASTIC_RESTART_COUNT": "1"})):  # = --resume auto
        one = one_process([*longer, "--force", *extra], **env)
        assert one.returncode == 2, (how, one.stderr[-2000:])
        assert one.stderr.splitlines() == [
            f"error: {ckpt} was trained with 2 process(es), this run has 1 (the data order, the global batch of 64 "
            "and its learning rate depend on the count) — resume it with 2 process(es) (torchrun --nnodes x "
            f"--nproc_per_node = 2), or start a new run from its weights with --set train.init_weights={ckpt}"], how
        assert files(out) == before, how  # nothing written, nothing lost
