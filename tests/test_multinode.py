"""Two torchrun agents on 127.0.0.1 with c10d rendezvous (the multi-node launch, one process per "node"):
they train, checkpoint and evaluate together, and every rank's worklog names its node and rank. A node
that never arrives ends the job within the rendezvous timeout, not never."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

TRAIN = ["-m", "torchboost", "train", "-c", "digits-lenet", "--epochs", "1", "--set", "train.progress_bar=false",
         "--set", "train.log_every=1000"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent(port: int, out: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d",
           f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=test{port}", *extra, *TRAIN, "-o", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


@pytest.mark.dist
@pytest.mark.slow
def test_two_agents_train_checkpoint_and_evaluate_together(tmp_path):
    port = free_port()
    nodes = [agent(port, tmp_path / "out") for _ in range(2)]
    outs = [n.communicate(timeout=600)[0] for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], "\n".join(o[-2000:] for o in outs)
    final = [o for o in outs if "final: top-1" in o]
    assert len(final) == 1  # rank 0 reports; the evaluation counted every image once across the two
    assert "2 process(es)" in final[0] and "val_samples=360" in final[0]
    assert list((tmp_path / "out" / "ckpt").glob("mnist_cnn-1_*.pt"))
    logs = sorted((tmp_path / "out" / "log").iterdir())
    assert [p.name for p in logs] == ["worklog.0", "worklog.1"]
    for rank, log in enumerate(logs):
        first = log.read_text().splitlines()[0]
        assert f" rank{rank} " in first and f"{socket.gethostname()} node" in first


@pytest.mark.dist
@pytest.mark.slow
def test_a_node_that_never_arrives_ends_the_job(tmp_path):
    lonely = agent(free_port(), tmp_path / "out", "--rdzv-conf=join_timeout=15")
    out = lonely.communicate(timeout=300)[0]  # the bound against a hang: well past the 15 s join timeout
    assert lonely.returncode != 0
    assert "RendezvousTimeoutError" in out or "timed out" in out.lower()
    assert not (tmp_path / "out" / "ckpt").exists()  # nothing trained, nothing written
