"""A run continues only on the process count it was trained with: resumed with another count (by hand, or by
a torchrun restart after an elastic `--nnodes=1:2` job lost a node) it stops with one line saying why, before
anything in its folder changes — never a silently different run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ranks import finish, job_env

from torchboost.train.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[1]
TRAIN = ["-m", "torchboost", "train", "-c", "digits-lenet", "--set", "train.progress_bar=false",
         "--set", "train.log_every=1000"]


def run(cmd: list[str], **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_RESTART_COUNT"}
    environ.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **env)
    proc = subprocess.Popen([sys.executable, *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=job_env(environ))
    ((out, err),) = finish([proc], 600)  # a bound against a hang, not a speed claim
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.dist
@pytest.mark.slow
def test_a_run_resumed_on_another_process_count_stops_with_one_line(tmp_path):
    out = tmp_path / "run"
    two = run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *TRAIN, "--epochs", "1",
               "-o", str(out)])
    assert two.returncode == 0, two.stdout[-2000:] + two.stderr[-2000:]
    ckpt = out / "ckpt" / "mnist_cnn-1_22.pt"
    assert load_checkpoint(ckpt)["world_size"] == 2
    before = files(out)

    for how, extra, env in (("--resume", ["--resume", str(out)], {}),
                            ("a torchrun restart", [], {"TORCHELASTIC_RESTART_COUNT": "1"})):  # = --resume auto
        one = run([*TRAIN, "--epochs", "2", "--force", "-o", str(out), *extra], **env)  # force: a longer schedule
        assert one.returncode == 2, how
        assert one.stderr.splitlines() == [
            f"error: {ckpt} was trained with 2 process(es), this run has 1 (the data order, the global batch of 64 "
            "and its learning rate depend on the count) — resume it with 2 process(es) (torchrun --nnodes x "
            f"--nproc_per_node = 2), or start a new run from its weights with --set train.init_weights={ckpt}"], how
        assert files(out) == before, how  # nothing written, nothing lost
