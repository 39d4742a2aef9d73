"""Two torchrun agents on 127.0.0.1 with c10d rendezvous (the multi-node launch, one process per "node"):
they train, checkpoint and evaluate together, and every rank's worklog names its node and rank. A node
that never arrives ends a `torchboost launch` job after dist.timeout_s with one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from ranks import finish, job_env

from torchboost.distributed.launch import free_port

TRAIN = ["-m", "torchboost", "train", "-c", "digits-lenet", "--epochs", "1", "--set", "train.progress_bar=false",
         "--set", "train.log_every=1000"]


def agent(port: int, out: Path, *extra: str) -> subprocess.Popen:
    env = job_env(dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d",
           f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=test{port}", *extra, *TRAIN, "-o", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


@pytest.mark.dist
@pytest.mark.slow
def test_two_agents_train_checkpoint_and_evaluate_together(tmp_path):
    port = free_port()
    nodes = [agent(port, tmp_path / "out") for _ in range(2)]
    outs = [out for out, _ in finish(nodes, 600)]  # a bound against a hang, not a speed claim
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


def launch(port: int, out: Path, nnodes: int, nproc: int, *train: str) -> subprocess.Popen:
    """`torchboost launch`: the agent in torchboost's own process, its join timeout = dist.timeout_s."""
    env = job_env(dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    cmd = [sys.executable, "-m", "torchboost", "launch", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc),
           "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"test{port}", *TRAIN[2:], *train, "-o", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.dist
@pytest.mark.slow
def test_two_launched_nodes_of_two_processes_each_train_and_every_worklog_names_its_node_and_rank(tmp_path):
    port = free_port()
    nodes = [launch(port, tmp_path / "out", 2, 2, "--set", "data.batch_size=16") for _ in range(2)]
    outs = finish(nodes, 600)
    assert [n.returncode for n in nodes] == [0, 0], "\n".join(o[1][-2000:] for o in outs)
    final = [o for o, _ in outs if "final: top-1" in o]
    assert len(final) == 1 and "4 process(es)" in final[0] and "val_samples=360" in final[0]
    assert list((tmp_path / "out" / "ckpt").glob("mnist_cnn-1_*.pt"))
    for rank in range(4):  # torchrun numbers ranks node by node: node n holds ranks 2n and 2n + 1
        first = (tmp_path / "out" / "log" / f"worklog.{rank}").read_text().splitlines()[0]
        assert f" {socket.gethostname()} node{rank // 2} rank{rank} " in first, first


@pytest.mark.dist
@pytest.mark.slow
def test_a_node_that_never_arrives_ends_the_job_after_dist_timeout_s_with_one_line(tmp_path):
    lonely = launch(free_port(), tmp_path / "out", 2, 1, "--set", "dist.timeout_s=3")
    ((out, err),) = finish([lonely], 300)  # the bound against a hang: far below torchrun's 600 s default
    assert lonely.returncode == 2
    assert err.splitlines() == ["error: not every node joined the rendezvous at 127.0.0.1:"
                                f"{lonely.args[lonely.args.index('--rdzv-endpoint') + 1].split(':')[1]} within 3 s "
                                "(dist.timeout_s): 2 node(s) expected — start the same command on every node (--nnodes "
                                "counts them), check that the endpoint is reachable from each, or raise dist.timeout_s"]
    assert out == "" and not (tmp_path / "out").exists()  # nothing trained, nothing written
