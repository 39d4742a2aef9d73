"""torchrun --max-restarts=3 with three planned crashes (benchmarks/soak_restarts.py, short and not random):
a worker killed mid-epoch during an update, rank 0 killed with a checkpoint half written, a worker killed
during evaluation. The job finishes by itself and ends bit-identical to the uninterrupted run: weights,
optimizer state, position and history. Each restart continues mid-epoch from the newest whole checkpoint."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from ranks import finish

spec = importlib.util.spec_from_file_location("soak_restarts", Path(__file__).parents[1] / "benchmarks" /
                                              "soak_restarts.py")
soak = importlib.util.module_from_spec(spec)
spec.loader.exec_module(soak)

SAVE_EVERY = 4  # digits on 2 processes: 22 updates per epoch; checkpoints at updates 4, 8, ... of the run
FAULTS = [
    {"attempt": 0, "rank": 1, "moment": "step", "at": 9},  # after 1_8 was written: a mid-epoch restart
    {"attempt": 1, "rank": 0, "moment": "checkpoint", "at": 2},  # resumed at 1_8: writes 1_12, dies writing 1_16
    {"attempt": 2, "rank": 1, "moment": "eval", "at": 2},  # resumed at 1_12: dies in epoch 1's evaluation
]


@pytest.mark.dist
@pytest.mark.slow
def test_three_crashes_under_torchrun_end_bit_identical_to_the_uninterrupted_run(tmp_path):
    plan = {"faults": FAULTS, "kill_log": str(tmp_path / "kills.jsonl")}
    straight = soak.launch(tmp_path / "straight", 2, SAVE_EVERY, 2)
    job = soak.launch(tmp_path / "killed", 2, SAVE_EVERY, 2, plan)
    (out, _), (straight_out, _) = finish([job, straight], 600)  # a bound against a hang, not a speed claim
    assert straight_out and straight.returncode == 0
    assert job.returncode == 0, out[-4000:]

    done = soak.kills_done(plan)
    assert [(k["attempt"], k["rank"], k["moment"]) for k in done] == [(0, 1, "step"), (1, 0, "checkpoint"),
                                                                      (2, 1, "eval")]
    assert re.fullmatch(r"checkpoint write 2: \.mnist_cnn-1_16\.pt\.\d+\.tmp half written", done[1]["detail"])
    # each restart resumed from the newest WHOLE checkpoint, mid-epoch: never the half-written 1_16
    resumed = re.findall(r"resumed from \S+/(mnist_cnn-\d+_\d+\.pt) \(epoch (\d+), step (\d+)", out)
    assert resumed == [("mnist_cnn-1_8.pt", "1", "8"), ("mnist_cnn-1_12.pt", "1", "12"),
                       ("mnist_cnn-1_20.pt", "1", "20")]
    assert soak.compare(tmp_path / "straight", tmp_path / "killed") == []
    assert not soak.temp_files(tmp_path / "killed")  # the half-written file was cleared by the next start
