"""`torchboost launch` refuses what cannot run before any process starts (one line, exit 2), and a torchrun
restart of a job started with --overwrite continues that job instead of refusing it. The launched jobs
themselves are tests/test_multinode.py's (two nodes, a missing node) and the README walk's (restart-safe)."""

from __future__ import annotations

import pytest

from torchboost.cli import main


@pytest.mark.parametrize("argv, message", [
    (["launch", "--nnodes", "2", "train"], "error: --nnodes 2 needs the rendezvous address — add --rdzv-endpoint"),
    (["launch", "eval", "--checkpoint", "x.pt"], "error: torchboost launch runs `train ...` on every process — "),
    (["launch", "--nproc-per-node", "0", "train"], "error: --nproc-per-node 0 --max-restarts 0 — use at least 1"),
    (["launch", "train", "-c", "nope"], "error: unknown recipe 'nope'"),
    (["launch", "--nnodes", "2", "--rdzv-endpoint", "10.0.0.1:295000", "train"],
     "error: --rdzv-endpoint 10.0.0.1:295000 is not HOST:PORT — give one node's address"),
    (["launch", "--nnodes", "2", "--rdzv-endpoint", "nosuchhost.invalid:29500", "train", "--set", "dist.timeout_s=5",
      "-o", "never-written"], "error: cannot reach the rendezvous at nosuchhost.invalid:29500: the host name "
                              "'nosuchhost.invalid' does not resolve"),  # at once, not after torch's retries
    # an address that resolves but answers nothing (or something else): torch's store client gives up
    (["launch", "--nnodes", "2", "--rdzv-endpoint", "10.255.255.1:29500", "train", "--set", "dist.timeout_s=2",
      "-o", "never-written"], "error: cannot reach the rendezvous at 10.255.255.1:29500: "),
])
@pytest.mark.slow
def test_launch_refuses_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(message), err


@pytest.mark.slow
def test_launch_refuses_a_finished_run_before_starting_any_process(tmp_path, capsys, one_thread):
    out = str(tmp_path / "run")
    train = ["train", "-c", "digits-lenet", "--epochs", "1", "--set", "train.progress_bar=false", "-o", out]
    assert main(train) == 0
    capsys.readouterr()
    assert main(["launch", "--nproc-per-node", "2", "--max-restarts", "3", *train]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.splitlines() == [
        f"error: {out}/ckpt/mnist_cnn-1_44.pt has already trained 1 epoch(s) and train.epochs=1: there is nothing "
        "left to train — to train on, give more epochs and --force (--epochs N --force): the lr schedule is then "
        "recomputed for N epochs, and the lr it continues at is printed"]


def test_a_restart_of_a_job_started_with_overwrite_continues_it(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    argv = ["train", "-c", "digits-lenet", "--overwrite", "--print-config", "-o", str(out)]
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # the first attempt replaced the old run, then died
    assert main(argv) == 0, capsys.readouterr().err
    assert "name: digits-lenet" in capsys.readouterr().out
