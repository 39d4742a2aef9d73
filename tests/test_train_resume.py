"""Resume mid-epoch: the resumed run's history and weights equal the uninterrupted run's; checkpoint
pruning only ever deletes the run's own files (the resumed run's included)."""

import copy
import json
import re

import pytest
import torch
from torch.utils.data import TensorDataset

from torchboost.data import build_loader
from torchboost.errors import CheckpointError
from torchboost.train.callbacks import CheckpointConfig, History, ModelCheckpoint, TimeMonitor
from torchboost.train.profiling import DataStarvationMonitor
from torchboost.train.state import Callback
from train_tiny import Capture, Scripted, StopAt, batches, tiny_data, tiny_model

EPOCHS, BATCH = 3, 8  # 48 images: 6 updates per epoch


def loaders():
    train = build_loader(TensorDataset(*tiny_data(48, seed=1)), BATCH, True, seed=3)
    test = build_loader(TensorDataset(*tiny_data(20, seed=2)), 10, False)
    return train, test


def callbacks(out, *extra, keep=10):
    # Scripted times first: the starvation monitor's sums then are exact and comparable across runs.
    return [Capture(), Scripted(), DataStarvationMonitor(), TimeMonitor(), *extra,
            ModelCheckpoint("tiny", out / "ckpt", CheckpointConfig(keep_checkpoint_max=keep)), History(out)]


def rows(out):
    """History rows without the wall-clock entry (the only one that may differ)."""
    return [{k: v for k, v in json.loads(line).items() if k != "train_time_s"}
            for line in (out / "history.jsonl").read_text().splitlines()]


def fresh_model(seed):
    return tiny_model(seed=seed, dropout=0.3, compute_accuracy=True)  # dropout: the RNG state matters too


@pytest.mark.slow
def test_resume_mid_epoch_equals_the_uninterrupted_run(tmp_path, one_thread):
    a, b = tmp_path / "a", tmp_path / "b"
    train, test = loaders()
    torch.manual_seed(7)
    straight = fresh_model(0)
    straight.train(EPOCHS, train, callbacks(a), eval_data=test)

    torch.manual_seed(7)
    first = fresh_model(0)
    state = first.train(EPOCHS, train, callbacks(b, StopAt(9)), eval_data=test)  # epoch 2, update 3 of 6
    assert (state.epoch, state.step_in_epoch) == (1, 3)
    stopped = b / "ckpt" / "tiny-2_3.pt"
    assert stopped.is_file()

    resumed = fresh_model(123)  # other initial weights: everything must come from the checkpoint
    ckpt = resumed.load_checkpoint(stopped)
    assert not ckpt["epoch_complete"] and ckpt["epoch_sums"]["samples"] == 3 * BATCH
    cbs = callbacks(b)
    resumed.train(EPOCHS, *loaders()[:1], cbs, eval_data=test)

    assert rows(b) == rows(a)  # the resumed epoch's train loss/accuracy and data-wait figures included
    assert len(rows(a)) == EPOCHS and "train_top_1_accuracy" in rows(a)[1]
    for (k, va), vb in zip(straight.network.state_dict().items(), resumed.network.state_dict().values()):
        assert torch.equal(va, vb), k
    # TimeMonitor counts the whole resumed epoch (6 updates of 8 images), whatever the clock says:
    # (ms per update) x (images/s) = 1000 x images per update
    lines = [line for line in cbs[0].lines if line.startswith("epoch time:")]
    assert len(lines) == 2  # epochs 2 (resumed) and 3
    for line in lines:
        ms, ips, _ = re.fullmatch(r"epoch time: [\d.]+ ms, per step time: ([\d.]+) ms, ([\d.]+) images/s(, lr .+)?",
                                  line).groups()
        assert float(ms) * float(ips) == pytest.approx(1000 * BATCH, rel=1e-2)


@pytest.mark.slow
def test_pruning_keeps_foreign_files_and_takes_over_the_resumed_runs_list(tmp_path, one_thread):
    out = tmp_path / "run"
    (out / "ckpt").mkdir(parents=True)
    foreign = {"tiny-1_99.pt": b"same prefix, not ours", "other-1_1.pt": b"another prefix",
               "tiny-1_1.ckpt": b"\x0amindspore"}
    for name, data in foreign.items():
        (out / "ckpt" / name).write_bytes(data)
    train, test = loaders()
    fresh_model(0).train(4, train, callbacks(out, StopAt(15), keep=2), eval_data=test)  # stops at 3_3
    names = sorted(p.name for p in (out / "ckpt").iterdir())
    assert names == sorted([*foreign, "tiny-2_6.pt", "tiny-3_3.pt"])

    resumed = fresh_model(0)
    assert resumed.load_checkpoint(out / "ckpt" / "tiny-3_3.pt")["callbacks"]["ModelCheckpoint"]["files"] == [
        "tiny-2_6.pt", "tiny-3_3.pt"]
    resumed.train(4, train, callbacks(out, keep=2), eval_data=test)
    names = sorted(p.name for p in (out / "ckpt").iterdir())
    assert names == sorted([*foreign, "tiny-3_6.pt", "tiny-4_6.pt"])  # 2_6 and 3_3 were the resumed run's
    for name, data in foreign.items():
        assert (out / "ckpt" / name).read_bytes() == data


def test_old_torch_checkpoint_with_ckpt_extension_still_loads_and_mindspore_files_are_named(tmp_path):
    model = tiny_model()
    old = tmp_path / "tiny-1_6.ckpt"  # written by torchboost before checkpoints became .pt
    torch.save({"model": model.network.state_dict()}, old)
    assert set(tiny_model(seed=5).load_checkpoint(old, weights_only_model=True)["model"]) == set(
        model.network.state_dict())
    ms = tmp_path / "resnet.ckpt"
    ms.write_bytes(b"\x0a\x05conv1\x12\x00")  # a protobuf: field 1, length-delimited
    with pytest.raises(CheckpointError, match="not a torch checkpoint.*torchboost convert"):
        tiny_model().load_checkpoint(ms)


EDITS = {  # what a hand-edited or truncated checkpoint may look like
    "one-more-param-group": lambda sd: sd["optimizer"]["param_groups"].append(
        copy.deepcopy(sd["optimizer"]["param_groups"][0])),
    "no-param-groups": lambda sd: sd["optimizer"].update(param_groups=[]),
    "param-id-changed": lambda sd: sd["optimizer"]["param_groups"][0]["params"].__setitem__(0, 999),
    "param-missing-from-group": lambda sd: sd["optimizer"]["param_groups"][0]["params"].pop(),
    "no-rng": lambda sd: sd.pop("rng"),
    "params-not-a-list": lambda sd: sd["optimizer"]["param_groups"].__setitem__(0, {"params": 5}),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edited_checkpoint_is_refused_before_anything_is_restored(tmp_path, edit):
    model = fresh_model(0)
    model.train(1, batches(2), [ModelCheckpoint("tiny", tmp_path)])
    sd = torch.load(tmp_path / "tiny-1_2.pt", weights_only=True)
    EDITS[edit](sd)
    torch.save(sd, tmp_path / "edited.pt")
    other = fresh_model(5)
    weights = copy.deepcopy(other.network.state_dict())
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'edited.pt'} cannot be resumed"):
        other.load_checkpoint(tmp_path / "edited.pt")
    assert all(torch.equal(v, weights[k]) for k, v in other.network.state_dict().items())


def test_a_checkpoint_of_another_optimizer_layout_does_not_fit(tmp_path):
    fresh_model(0).train(1, batches(2), [ModelCheckpoint("tiny", tmp_path)])
    other = fresh_model(0)
    params = list(other.network.parameters())
    other.optimizer.param_groups.clear()  # two groups (e.g. no weight decay on biases) instead of one
    other.optimizer.add_param_group({"params": params[::2]})
    other.optimizer.add_param_group({"params": params[1::2], "weight_decay": 0.0})
    with pytest.raises(CheckpointError, match="does not fit this run .*different number of parameter groups"):
        other.load_checkpoint(tmp_path / "tiny-1_2.pt")


class KilledAfterEpoch(Callback):
    """Stands for a SIGKILL right after the epoch's checkpoint, before History writes its row."""

    def on_train_epoch_end(self, state):
        raise KeyboardInterrupt


@pytest.mark.slow
def test_a_kill_between_the_epoch_checkpoint_and_the_history_row_loses_no_row(tmp_path, one_thread):
    a, b = tmp_path / "a", tmp_path / "b"
    train, test = loaders()
    torch.manual_seed(7)
    fresh_model(0).train(2, train, callbacks(a), eval_data=test)
    torch.manual_seed(7)
    killed = callbacks(b)
    killed.insert(-1, KilledAfterEpoch())  # between ModelCheckpoint and History
    with pytest.raises(KeyboardInterrupt):
        fresh_model(0).train(2, train, killed, eval_data=test)
    assert not (b / "history.jsonl").exists()
    resumed = fresh_model(0)
    resumed.load_checkpoint(b / "ckpt" / "tiny-1_6.pt")
    resumed.train(2, train, callbacks(b), eval_data=test)
    assert rows(b) == rows(a)  # epoch 1's row came from the checkpoint
