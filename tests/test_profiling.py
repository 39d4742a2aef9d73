"""Data-starvation monitor and profiler callback, through Model.train. Step and data times are scripted
(a callback overwrites what Model.train measured), so the assertions hold on any machine."""

import importlib.util
import json
import os
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from torchboost.recipe.callbacks import build_callbacks
from torchboost.recipe.config import build_config
from torchboost.train.profiling import DataStarvationMonitor, ProfilerCallback, starvation_advice, usable_cores
from torchboost.train.callbacks import Callback
from torchboost.train.model import Model


class ScriptedTimes(Callback):
    """Replaces the measured times of each update with `times(epoch, step_in_epoch)` (seconds)."""

    def __init__(self, times):
        self.times = times

    def on_train_step_end(self, state):
        state.data_time, state.step_time = self.times(state.epoch, state.step_in_epoch)


def make_model():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 5))
    return Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1), device="cpu")


def batches(n=6, size=4):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(size, 1, 6, 6, generator=g), torch.randint(0, 5, (size,), generator=g)) for _ in range(n)]


def run(data, callbacks, epochs=2):
    logs = []

    class Capture(Callback):
        def on_train_begin(self, state):
            state.log_fn = logs.append

    state = make_model().train(epochs, data, callbacks=[Capture(), *callbacks])
    return state, logs


def test_slow_data_warns_exactly_once_with_loader_specific_advice():
    images, labels = map(torch.cat, zip(*batches()))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels), batch_size=4)
    monitor = DataStarvationMonitor(loader=loader)
    state, logs = run(loader, [ScriptedTimes(lambda e, s: (0.003, 0.004)), monitor])
    # 0 workers is the default: a note, not a warning against a setting the user never chose
    warnings = [line for line in logs if line.startswith("note: loading data takes")]
    assert len(warnings) == 1 and warnings[0] == monitor.warning and not any("warning:" in l for l in logs)
    assert "3.0 ms of each 4.0 ms update (75% > 5%) over 5 updates" in warnings[0]  # 6 updates, 1 warm-up
    assert "data.workers=N" in warnings[0] and "decode" in warnings[0]  # advice fits a 0-worker loader
    summaries = [line for line in logs if line.startswith("epoch:") and "data wait" in line]
    assert summaries == ["epoch: 1 data wait 3.00 ms of 4.00 ms per update (75.0%), compute 1.00 ms",
                         "epoch: 2 data wait 3.00 ms of 4.00 ms per update (75.0%), compute 1.00 ms"]
    assert logs.index(warnings[0]) == logs.index(summaries[0]) + 1  # decided at the end of epoch 1
    assert state.eval_results["data_wait_share"] == pytest.approx(0.75)
    assert state.eval_results["data_wait_ms"] == pytest.approx(3.0)
    assert state.eval_results["step_ms"] == pytest.approx(4.0)


def test_fast_data_does_not_warn():
    monitor = DataStarvationMonitor()
    state, logs = run(batches(), [ScriptedTimes(lambda e, s: (0.0001, 0.004)), monitor])
    assert monitor.warning is None and not any(line.startswith("warning:") for line in logs)
    assert state.eval_results["data_wait_share"] == pytest.approx(0.025)
    assert sum(line.startswith("epoch:") and "data wait" in line for line in logs) == 2


def test_warmup_updates_count_in_the_summary_but_not_in_the_decision():
    monitor = DataStarvationMonitor(warmup_steps=1)
    # the first update of each epoch waits 100 ms for its workers; the rest are fed in time
    state, logs = run(batches(), [ScriptedTimes(lambda e, s: (0.1, 0.104) if s == 1 else (0.0001, 0.004)), monitor])
    assert monitor.warning is None
    assert state.eval_results["data_wait_share"] == pytest.approx(0.1005 / 0.124)  # summary: all 6 updates


def test_decision_after_check_after_updates_comes_before_the_epoch_summary():
    monitor = DataStarvationMonitor(check_after=3)
    _, logs = run(batches(), [ScriptedTimes(lambda e, s: (0.003, 0.004)), monitor], epochs=1)
    warning = next(i for i, line in enumerate(logs) if line.startswith("warning:"))
    summary = next(i for i, line in enumerate(logs) if "data wait" in line and line.startswith("epoch:"))
    assert warning < summary and "over 3 updates" in logs[warning]


def test_profiler_writes_a_trace(tmp_path):
    prof = ProfilerCallback(tmp_path / "trace", wait=1, warmup=1, active=3)
    _, logs = run(batches(7, 8), [prof], epochs=1)
    traces = list((tmp_path / "trace").glob("*.pt.trace.json"))
    assert len(traces) == 1
    events = json.loads(traces[0].read_text())["traceEvents"]
    steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"}  # after wait 1 + warmup 1
    assert any("aten::convolution" in e.get("name", "") for e in events)
    assert any("aten::convolution" in line for line in logs)  # the top-operator table was printed
    view = next(line for line in logs if line.startswith("profiler:")).split("(view: ")[1]
    plugin = importlib.util.find_spec("torch_tb_profiler") is not None  # TensorBoard shows traces only with it
    assert view.startswith("tensorboard --logdir" if plugin else "open the .pt.trace.json in https://ui.perfetto.dev")


def test_advice_fits_the_data_and_the_machine():
    """No decode advice for in-memory data; no 'more workers' once the workers match the usable cores."""
    loader = SimpleNamespace(num_workers=0, persistent_workers=False, pin_memory=False)
    cores = usable_cores()
    assert cores == len(os.sched_getaffinity(0))
    tips = starvation_advice(loader, decodes=False)
    assert tips[0] == f"load in background processes: data.workers=N (this machine has {cores} cores)"
    assert not any("decode" in t or "draft" in t for t in tips)
    assert any("pre-resized" in t for t in starvation_advice(loader, decodes=True))
    loader.num_workers = cores
    tips = starvation_advice(loader, decodes=False)
    assert not any("more loader workers" in t for t in tips)
    assert tips[0].startswith(f"the {cores} loader workers already match the {cores} cores")
    if cores > 1:
        loader.num_workers = cores - 1
        assert starvation_advice(loader)[0] == f"more loader workers (data.workers={cores - 1} now, {cores} cores)"


def test_profiler_says_when_the_run_is_too_short(tmp_path):
    _, logs = run(batches(2, 8), [ProfilerCallback(tmp_path / "trace")], epochs=1)
    assert not list((tmp_path / "trace").glob("*.json"))
    assert any("no trace written" in line for line in logs)


@pytest.mark.parametrize("dataset, decodes", [("digits", False), ("folder", True)])
def test_a_runs_monitor_knows_whether_its_data_is_decoded(tmp_path, dataset, decodes):
    cfg = build_config(overrides=[f"data.dataset={dataset}"])
    callbacks, _ = build_callbacks(cfg, tmp_path, SimpleNamespace(num_workers=0), None, print)
    (monitor,) = [c for c in callbacks if isinstance(c, DataStarvationMonitor)]
    assert monitor.decodes is decodes
