"""Callbacks on scripted metric sequences: EarlyStopping (best epoch, restore_best), ModelCheckpoint
(save_best, non-finite guard), TensorBoard events, ProgressBar, TimeMonitor, metric names."""

import io

import pytest
import torch

from torchboost.errors import ConfigError, TrainingError
from torchboost.train.callbacks import (CheckpointConfig, EarlyStopping, ModelCheckpoint, ProgressBar, TensorBoard,
                                        TimeMonitor)
from torchboost.train.checkpoint import load_checkpoint
from torchboost.train.ema import ModelEMA
from torchboost.train.state import Callback, TrainState
from torchboost.train.step import TrainStep
from train_tiny import Capture, Scripted, batches, tiny_model, tiny_net


class WeightsPerEpoch(Callback):
    def __init__(self):
        self.weights = {}

    def on_train_epoch_end(self, state):
        self.weights[state.epoch + 1] = {k: v.clone() for k, v in state.model.network.state_dict().items()}


def scripted(name, values):
    return Scripted({e: {name: v} for e, v in enumerate(values, 1)})


def same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


# --- EarlyStopping -------------------------------------------------------------------------------------

def test_early_stopping_reports_the_best_epoch_and_restores_its_weights(tmp_path):
    log, seen = Capture(), WeightsPerEpoch()
    stop = EarlyStopping(monitor="val_acc", patience=3, restore_best=True)  # alias of val_top_1_accuracy
    model = tiny_model()
    state = model.train(10, batches(2), [log, scripted("val_top_1_accuracy", [0.5, 0.7, 0.69, 0.7, 0.65, 0.9]),
                                         seen, stop, ModelCheckpoint("tiny", tmp_path)])
    assert state.epoch + 1 == 5 and sorted(seen.weights) == [1, 2, 3, 4, 5]  # 0.7 again is no improvement
    assert "early stopping: val_top_1_accuracy has not improved for 3 epochs; best 0.7000 at epoch 2" in log.lines
    assert log.lines[-1] == "early stopping: restored the weights of epoch 2 (val_top_1_accuracy=0.7000)"
    assert same(model.network.state_dict(), seen.weights[2]) and not same(seen.weights[2], seen.weights[5])
    saved = load_checkpoint(tmp_path / "tiny-5_2.pt")["callbacks"]["EarlyStopping"]  # resumable progress
    assert saved == {"best": {"value": 0.7, "epoch": 2}, "bad_epochs": 3}


@pytest.mark.parametrize("monitor, values, kwargs, stopped_after, best_epoch", [
    ("val_top_1_accuracy", [0.5, 0.505, 0.509, 0.6], dict(patience=2, min_delta=0.01), 3, 1),
    ("val_loss", [1.0, 0.8, 0.9, 0.95, 0.1], dict(patience=2), 4, 2),  # a loss: min mode by default
    ("val_loss", [1.0, 0.8, 0.9, 0.95, 0.1], dict(patience=2, mode="max"), 3, 1),
])
def test_early_stopping_modes_and_min_delta(monitor, values, kwargs, stopped_after, best_epoch):
    log = Capture()
    stop = EarlyStopping(monitor=monitor, **kwargs)
    state = tiny_model().train(10, batches(1), [log, scripted(monitor, values), stop])
    assert state.epoch + 1 == stopped_after and stop.best.epoch == best_epoch
    assert sum(line.startswith("early stopping:") for line in log.lines) == 1


def test_early_stopping_rejects_unknown_metrics_and_modes():
    with pytest.raises(ConfigError, match="unknown metric 'acuracy' — did you mean 'accuracy'"):
        EarlyStopping(monitor="val_acuracy")
    with pytest.raises(ConfigError, match="mode='up'"):
        EarlyStopping(mode="up")


# --- ModelCheckpoint -----------------------------------------------------------------------------------

def test_save_best_writes_on_improvement_only_and_is_never_pruned(tmp_path):
    best_epochs = []

    class ReadBest(Callback):
        def on_train_epoch_end(self, state):
            best_epochs.append(load_checkpoint(tmp_path / "tiny-best.pt")["epoch"] + 1)

    seen = WeightsPerEpoch()
    cb = ModelCheckpoint("tiny", tmp_path, CheckpointConfig(keep_checkpoint_max=1), save_best="val_loss")
    tiny_model().train(4, batches(2), [scripted("val_loss", [2.0, 1.0, 1.5, 0.5]), seen, cb, ReadBest()])
    assert best_epochs == [1, 2, 2, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-4_2.pt", "tiny-best.pt"]
    assert same(load_checkpoint(tmp_path / "tiny-best.pt")["model"], seen.weights[4])


def test_the_best_of_a_numbered_epoch_is_that_file_linked_and_a_resume_from_it_keeps_it_best(tmp_path):
    """An epoch that writes its numbered checkpoint and improves the best writes the best as that same file (one
    serialization; a hard link, so pruning the numbered one leaves it whole), and the numbered file records the
    improved value: a run resumed from epoch 2's file does not take epoch 3's worse value for a new best."""
    cb = ModelCheckpoint("tiny", tmp_path, CheckpointConfig(keep_checkpoint_max=5), save_best="val_loss")
    tiny_model().train(2, batches(2), [scripted("val_loss", [2.0, 1.0]), cb])
    best, numbered = tmp_path / "tiny-best.pt", tmp_path / "tiny-2_2.pt"
    assert best.stat().st_ino == numbered.stat().st_ino and best.read_bytes() == numbered.read_bytes()
    model = tiny_model()
    model.load_checkpoint(numbered)
    again = ModelCheckpoint("tiny", tmp_path, CheckpointConfig(keep_checkpoint_max=1), save_best="val_loss")
    model.train(3, batches(2), [scripted("val_loss", [2.0, 1.0, 1.5]), again])
    assert load_checkpoint(best)["epoch"] + 1 == 2 and not numbered.exists()  # pruned; the best still reads


def test_nonfinite_loss_stops_training_before_any_checkpoint_of_it(tmp_path):
    data = batches(3)
    data[2] = (data[2][0].clone().fill_(float("inf")), data[2][1])  # the 3rd batch of each epoch
    cb = ModelCheckpoint("tiny", tmp_path, CheckpointConfig(save_checkpoint_steps=1))
    with pytest.raises(TrainingError, match=r"^epoch 1 step 3: the loss became nan at update 3; stopped before"):
        tiny_model().train(2, data, [cb])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-1_1.pt", "tiny-1_2.pt"]
    assert all(torch.isfinite(t).all() for t in load_checkpoint(tmp_path / "tiny-1_2.pt")["model"].values())


def test_nonfinite_skip_keeps_the_epoch_loss_finite_and_exact():
    data = batches(3)
    data[1] = (data[1][0].clone().fill_(float("nan")), data[1][1])
    model = tiny_model(nonfinite="skip", max_nonfinite_steps=1)
    losses = []

    class Losses(Callback):
        def on_train_step_end(self, state):
            losses.append((state.output.loss.item(), state.output.samples, state.output.nonfinite))

    state = model.train(1, data, [Losses()])
    assert [n for *_, n in losses] == [False, True, False]
    kept = [(l, s) for l, s, n in losses if not n]
    assert state.eval_results["train_loss"] == pytest.approx(sum(l * s for l, s in kept) / sum(s for _, s in kept))


def test_model_checkpoint_refuses_a_nonfinite_state_from_a_step_that_does_not_check(tmp_path):
    class NoCheck(TrainStep):
        def loss_nonfinite(self, loss, step):
            return False

    data = batches(2)
    data[1] = (data[1][0].clone().fill_(float("nan")), data[1][1])
    model = tiny_model(step_cls=NoCheck)
    with pytest.raises(TrainingError, match="refusing to write tiny-1_2.pt: the loss or the weights at epoch 1 step 2 are "
                                            "not finite"):
        model.train(1, data, [ModelCheckpoint("tiny", tmp_path)])
    assert list(tmp_path.iterdir()) == []


# --- TensorBoard, ProgressBar, TimeMonitor -----------------------------------------------------------------

def test_tensorboard_writes_step_and_epoch_scalars(tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    tb = TensorBoard(tmp_path, every=2)
    tiny_model(lr=0.05).train(2, batches(3), [Scripted({1: {"val_loss": 2.0}, 2: {"val_loss": 1.0}}), tb])
    acc = event_accumulator.EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "epoch/train_loss", "epoch/val_loss", "epoch/train_time_s"} <= tags
    assert [e.step for e in acc.Scalars("train/loss")] == [2, 4, 6]
    assert [e.value for e in acc.Scalars("train/lr")] == pytest.approx([0.05] * 3)
    assert [(e.step, e.value) for e in acc.Scalars("epoch/val_loss")] == [(1, 2.0), (2, 1.0)]


def test_progress_bar_draws_on_a_terminal_only():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    pipe, term = io.StringIO(), Terminal()
    log = Capture()
    tiny_model().train(2, batches(3), [log, ProgressBar(file=pipe)])
    assert pipe.getvalue() == ""  # not a terminal: no bar
    tiny_model().train(2, batches(3), [log, ProgressBar(file=term)])
    out = term.getvalue()
    # the bar is drawn when each epoch starts; later redraws depend on tqdm's clock (mininterval)
    assert "epoch 1/2:   0%|" in out and "epoch 2/2:   0%|" in out and "0/3" in out
    assert ProgressBar(enabled=False, file=term).enabled is False


def test_time_monitor_line_from_the_measured_epoch():
    lines = []
    state = TrainState(model=None, epochs=1, steps_per_epoch=10, step_in_epoch=10, epoch_samples=320,
                       eval_results={"train_time_s": 2.0}, log_fn=lines.append)
    TimeMonitor().on_train_epoch_end(state)
    assert lines == ["epoch time: 2000.0 ms, per step time: 200.000 ms, 160.0 images/s"]


# --- names ---------------------------------------------------------------------------------------------

def test_metric_aliases_and_unknown_names():
    model = tiny_model(metrics=["loss", "top5", "acc"])
    assert model.metrics == ("top_1_accuracy", "top_5_accuracy", "loss")
    assert set(model.eval(batches(2))) == {"top_1_accuracy", "top_5_accuracy", "loss", "samples"}
    with pytest.raises(ConfigError, match="unknown metric 'accuracyy' — did you mean 'accuracy'"):
        tiny_model(metrics=["accuracyy"])


def test_ema_options_are_config_errors():
    with pytest.raises(ConfigError, match="unknown EMA warmup 'tim' — did you mean 'timm'"):
        ModelEMA(tiny_net(), warmup="tim")
    with pytest.raises(ConfigError, match="unknown EMA buffers mode 'avg'"):
        ModelEMA(tiny_net(), buffers="avg")


def test_nonfinite_options_reach_the_step():
    with pytest.raises(ConfigError, match="would never skip"):
        tiny_model(nonfinite="skip")
    assert tiny_model(nonfinite="skip", max_nonfinite_steps=3).train_step.max_nonfinite_steps == 3
