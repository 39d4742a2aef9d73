"""Data-starvation monitor and profiler callback, through Model.train."""

import json
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from torchboost.train.profiling import DataStarvationMonitor, ProfilerCallback
from torchboost.train.callbacks import Callback
from torchboost.train.model import Model

SLEEP_S = 0.004


class SlowDataset(Dataset):
    """Each sample costs SLEEP_S of "decoding"."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        time.sleep(SLEEP_S)
        return torch.full((1, 6, 6), float(i % 3)), i % 5


class Timings(Callback):
    """Independent tally of what Model.train measured, per epoch."""

    def __init__(self):
        self.epochs = []

    def on_train_epoch_begin(self, state):
        self.epochs.append([0.0, 0.0, 0])

    def on_train_step_end(self, state):
        e = self.epochs[-1]
        e[0] += state.data_time
        e[1] += state.step_time
        e[2] += 1


def make_model():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 5))
    return Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1), device="cpu")


def run(data, callbacks, epochs=2):
    logs = []

    class Capture(Callback):
        def on_train_begin(self, state):
            state.log_fn = logs.append

    state = make_model().train(epochs, data, callbacks=[Capture(), *callbacks])
    return state, logs


def test_slow_dataset_warns_exactly_once():
    loader = DataLoader(SlowDataset(), batch_size=4, num_workers=0)
    monitor, timings = DataStarvationMonitor(loader=loader), Timings()
    state, logs = run(loader, [timings, monitor])
    warnings = [line for line in logs if line.startswith("warning: training waits for data")]
    assert len(warnings) == 1 and warnings[0] == monitor.warning
    assert "data.workers=N" in warnings[0] and "decode" in warnings[0]  # advice fits a 0-worker loader
    summaries = [line for line in logs if "data wait" in line and line.startswith("epoch:")]
    assert len(summaries) == 2
    data_s, step_s, n = timings.epochs[-1]
    assert n == 6
    assert state.eval_results["data_wait_share"] == pytest.approx(data_s / step_s)
    assert state.eval_results["data_wait_ms"] == pytest.approx(1000 * data_s / n)
    assert state.eval_results["data_wait_ms"] >= 4 * SLEEP_S * 1000  # 4 samples of SLEEP_S each per batch
    assert f"{1000 * data_s / n:.2f} ms of {1000 * step_s / n:.2f} ms" in summaries[-1]


def test_fast_data_does_not_warn():
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 1, 6, 6, generator=g), torch.randint(0, 5, (16,), generator=g)) for _ in range(12)]
    monitor, timings = DataStarvationMonitor(), Timings()
    state, logs = run(batches, [timings, monitor])
    assert monitor.warning is None and not any(line.startswith("warning:") for line in logs)
    assert state.eval_results["data_wait_share"] < 0.05
    assert sum(line.startswith("epoch:") and "data wait" in line for line in logs) == 2


def test_profiler_writes_a_trace(tmp_path):
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 1, 6, 6, generator=g), torch.randint(0, 5, (8,), generator=g)) for _ in range(7)]
    prof = ProfilerCallback(tmp_path / "trace", wait=1, warmup=1, active=3)
    _, logs = run(batches, [prof], epochs=1)
    traces = list((tmp_path / "trace").glob("*.pt.trace.json"))
    assert len(traces) == 1
    events = json.loads(traces[0].read_text())["traceEvents"]
    steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"}  # after wait 1 + warmup 1
    assert any("aten::convolution" in e.get("name", "") for e in events)
    assert any("aten::convolution" in line for line in logs)  # the top-operator table was printed


def test_profiler_says_when_the_run_is_too_short(tmp_path):
    batches = [(torch.randn(8, 1, 6, 6), torch.randint(0, 5, (8,))) for _ in range(2)]
    _, logs = run(batches, [ProfilerCallback(tmp_path / "trace")], epochs=1)
    assert not list((tmp_path / "trace").glob("*.json"))
    assert any("no trace written" in line for line in logs)
