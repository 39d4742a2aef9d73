"""What training writes: atomic files, stale temp clean-up, history.jsonl/csv/png, a damaged history on
resume, and disk-full / permission errors at every write site (OutputError, earlier files intact)."""

import csv
import errno
import json
import os
import subprocess
import sys

import pytest
import torch

from torchboost.errors import OutputError
from torchboost.fileio import atomic_write, output_error, remove_stale_temps, temp_path
from torchboost.train.callbacks import CheckpointConfig, History, ModelCheckpoint, TensorBoard
from torchboost.train.state import Callback, TrainState
from train_tiny import Capture, Scripted, batches, tiny_model

FULL = "no space left on device — free disk space or choose another --output; the last good checkpoint is intact"


def leftovers(folder):
    return sorted(p.name for p in folder.rglob("*.tmp"))


def fail_on_call(real, n, target_arg=1):
    """`real`, except that call number `n` (1-based) writes a few bytes to its target and raises ENOSPC
    (a function, so it also works patched in as a method)."""
    calls = []

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) != n:
            return real(*args, **kwargs)
        target = args[target_arg]
        if hasattr(target, "write"):
            target.write(b"partial")
        else:
            with open(target, "wb") as f:
                f.write(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return wrapper


# --- fileio ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("code, reason, fix", [
    (errno.ENOSPC, "no space left on device", "free disk space"), (errno.EDQUOT, "disk quota exceeded", "free disk"),
    (errno.EACCES, "permission denied", "make the folder writable"),
    (errno.EROFS, "read-only file system", "make the folder writable"),
    (errno.EPERM, "operation not permitted", "make the folder writable"),
    (errno.EIO, os.strerror(errno.EIO), "make the folder writable")])
def test_output_error_names_the_path_and_the_reason(code, reason, fix):
    e = output_error("/out/x.pt", OSError(code, os.strerror(code)))
    assert isinstance(e, OutputError) and e.what == f"cannot write /out/x.pt: {reason}"
    assert e.fix.startswith(fix) and e.fix.endswith("the last good checkpoint is intact")


def test_atomic_write_replaces_and_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "a.txt"
    atomic_write(path, "one\n")
    assert path.read_text() == "one\n" and leftovers(tmp_path) == []
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EDQUOT, "Disk quota exceeded")))
    with pytest.raises(OutputError, match=f"cannot write {path}: disk quota exceeded"):
        atomic_write(path, "two\n")
    assert path.read_text() == "one\n" and leftovers(tmp_path) == []


def test_remove_stale_temps_keeps_live_writers(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ours = temp_path(tmp_path / "live.pt")  # this process, being written now
    files = {"dead": tmp_path / f".ck-1_6.pt.{dead.pid}.tmp", "ours": ours,
             "old": tmp_path / f".history.jsonl.{os.getppid()}.tmp",  # live PID, but from before our start
             "plain": tmp_path / "notes.tmp", "other": tmp_path / ".hidden.tmp"}
    for p in files.values():
        p.write_bytes(b"x")
    os.utime(files["old"], (1, 1))
    removed = remove_stale_temps(tmp_path)
    assert sorted(removed) == sorted([files["dead"], files["old"]])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files[k].name for k in ("ours", "plain", "other"))
    assert remove_stale_temps(tmp_path / "missing") == []


def test_callbacks_remove_stale_temps_at_start(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = [tmp_path / f".history.png.{dead.pid}.tmp", tmp_path / "ckpt" / f".tiny-1_6.pt.{dead.pid}.tmp"]
    (tmp_path / "ckpt").mkdir()
    for p in stale:
        p.write_bytes(b"half")
    tiny_model().train(1, batches(2), [ModelCheckpoint("tiny", tmp_path / "ckpt"), History(tmp_path)])
    assert not any(p.exists() for p in stale) and leftovers(tmp_path) == []


# --- history -----------------------------------------------------------------------------------------

def test_history_jsonl_csv_and_png_hold_the_same_rows(tmp_path):
    results = {1: {"val_loss": 1.5}, 2: {"val_loss": 1.0, "val_top_1_accuracy": 0.5}}
    tiny_model().train(2, batches(3), [Scripted(results), History(tmp_path)])
    rows = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r["global_step"], r["val_loss"]) for r in rows] == [(1, 3, 1.5), (2, 6, 1.0)]
    with open(tmp_path / "history.csv", newline="") as f:
        reader = csv.DictReader(f)
        header, table = reader.fieldnames, list(reader)
    assert header == list(dict.fromkeys(k for r in rows for k in r))  # union, first-seen order
    assert header[-1] == "val_top_1_accuracy"  # first seen in epoch 2
    assert table[0]["val_top_1_accuracy"] == "" and float(table[1]["val_top_1_accuracy"]) == 0.5
    assert [float(t["train_loss"]) for t in table] == [r["train_loss"] for r in rows]  # repr round-trips
    assert (tmp_path / "history.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert leftovers(tmp_path) == []


def test_damaged_history_is_set_aside_with_one_warning_and_the_good_rows_kept(tmp_path):
    good = [{"epoch": 1, "train_loss": 2.0}, {"epoch": 2, "train_loss": 1.5}]
    text = "".join(json.dumps(r) + "\n" for r in good) + '{"epoch": 3, "train_lo\n' + json.dumps({"epoch": 4}) + "\n"
    (tmp_path / "history.jsonl").write_text(text)
    lines = []
    state = TrainState(model=None, epochs=5, steps_per_epoch=1, epoch=3, log_fn=lines.append)  # resumed at 4
    history = History(tmp_path)
    history.on_train_begin(state)
    assert history.records == good
    assert (tmp_path / "history.jsonl.damaged").read_text() == text
    assert [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()] == good
    assert len(lines) == 1 and lines[0].startswith("warning:") and "line 3" in lines[0] and "2 rows" in lines[0]


def test_resumed_history_drops_the_rows_after_the_resume_point(tmp_path):
    rows = [{"epoch": e, "train_loss": 1.0 / e} for e in (1, 2, 3)]
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    history, lines = History(tmp_path), []
    history.on_train_begin(TrainState(model=None, epochs=5, steps_per_epoch=1, epoch=2, log_fn=lines.append))
    assert history.records == rows[:2] and lines == [] and not (tmp_path / "history.jsonl.damaged").exists()


# --- disk full at every write site ---------------------------------------------------------------------

class Snapshot(Callback):
    """The bytes of `path` when epoch 2 begins (what a failed write in epoch 2 must leave as it was)."""

    def __init__(self, path):
        self.path, self.data = path, None

    def on_train_epoch_begin(self, state):
        if state.epoch == 1:
            self.data = self.path.read_bytes()


def train_two_epochs(*callbacks):
    scripted = Scripted({1: {"val_loss": 2.0}, 2: {"val_loss": 1.0}})  # epoch 2 improves
    return tiny_model().train(2, batches(2), [Capture(), scripted, *callbacks])


def test_disk_full_writing_a_checkpoint(tmp_path, monkeypatch):
    ckdir = tmp_path / "ckpt"
    monkeypatch.setattr(torch, "save", fail_on_call(torch.save, 2))
    snap = Snapshot(ckdir / "tiny-1_2.pt")
    with pytest.raises(OutputError) as info:
        train_two_epochs(ModelCheckpoint("tiny", ckdir), snap)
    assert str(info.value) == f"cannot write {ckdir / 'tiny-2_2.pt'}: {FULL}"
    assert sorted(p.name for p in ckdir.iterdir()) == ["tiny-1_2.pt"]  # no temp file, no half checkpoint
    assert (ckdir / "tiny-1_2.pt").read_bytes() == snap.data


@pytest.mark.parametrize("how", ["written", "linked"])
def test_disk_full_writing_the_best_checkpoint_keeps_the_previous_best(tmp_path, monkeypatch, how):
    ckdir = tmp_path / "ckpt"
    # the best after epoch 1 is torch.save's call 1 (every=3: no numbered file); epoch 2 improves and saves it
    # itself ("written": call 2, of 3 epochs) or, as the last epoch's numbered file was just written, links it
    if how == "linked":
        monkeypatch.setattr(os, "link", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    else:
        monkeypatch.setattr(torch, "save", fail_on_call(torch.save, 2))
    snap = Snapshot(ckdir / "tiny-best.pt")
    scripted = Scripted({1: {"val_loss": 2.0}, 2: {"val_loss": 1.0}, 3: {"val_loss": 0.5}})
    saver = ModelCheckpoint("tiny", ckdir, CheckpointConfig(save_checkpoint_epochs=3), save_best="val_loss")
    with pytest.raises(OutputError, match="tiny-best.pt: no space left on device"):
        tiny_model().train(2 if how == "linked" else 3, batches(2), [Capture(), scripted, saver, snap])
    assert (ckdir / "tiny-best.pt").read_bytes() == snap.data and leftovers(tmp_path) == []


@pytest.mark.parametrize("name", ["history.jsonl", "history.csv"])
def test_disk_full_writing_history_text(tmp_path, monkeypatch, name):
    real_write = os.write

    class Arm(Callback):  # from epoch 2 on, writes to the temp file of `name` fail half-way
        def on_train_epoch_begin(self, state):
            if state.epoch == 1:
                monkeypatch.setattr(os, "write", write)

    def write(fd, data):
        if f".{name}." in os.readlink(f"/proc/self/fd/{fd}"):
            real_write(fd, data[:5])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    snap = Snapshot(tmp_path / name)
    with pytest.raises(OutputError) as info:
        train_two_epochs(Arm(), snap, History(tmp_path))
    assert str(info.value) == f"cannot write {tmp_path / name}: {FULL}"
    assert (tmp_path / name).read_bytes() == snap.data and leftovers(tmp_path) == []


def test_disk_full_writing_the_plot_keeps_the_previous_plot(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    monkeypatch.setattr("torchboost.train.history.PLOT_EVERY_S", 0.0)  # drawn after every epoch
    monkeypatch.setattr(Figure, "savefig", fail_on_call(Figure.savefig, 2))
    snap = Snapshot(tmp_path / "history.png")
    with pytest.raises(OutputError, match=f"cannot write {tmp_path / 'history.png'}: no space left"):
        train_two_epochs(snap, History(tmp_path))
    assert (tmp_path / "history.png").read_bytes() == snap.data and leftovers(tmp_path) == []


def test_the_picture_is_drawn_when_training_ends_and_at_most_every_plot_every_s(tmp_path, monkeypatch):
    """Rows after every epoch; history.png once for a run faster than PLOT_EVERY_S (at its end), after every epoch
    and at the end when the interval is 0."""
    from matplotlib.figure import Figure

    drawn = []
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (drawn.append(1), real(fig, *a, **k))[1])
    train_two_epochs(History(tmp_path / "a"))
    assert len(drawn) == 1 and len((tmp_path / "a" / "history.jsonl").read_text().splitlines()) == 2
    monkeypatch.setattr("torchboost.train.history.PLOT_EVERY_S", 0.0)
    train_two_epochs(History(tmp_path / "b"))
    assert len(drawn) == 1 + 3 and (tmp_path / "b" / "history.png").exists()


def test_tensorboard_folder_that_cannot_be_created(tmp_path, monkeypatch):
    def mkdir(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(args[0]))

    monkeypatch.setattr(os, "mkdir", mkdir)
    with pytest.raises(OutputError, match=f"cannot write {tmp_path / 'tb'}: permission denied — make the folder"):
        TensorBoard(tmp_path / "tb")


def test_disk_full_writing_tensorboard_events_raises_in_the_training_thread(tmp_path, monkeypatch):
    import io

    real_open = io.open

    def open_(file, mode="r", *args, **kwargs):
        if "tfevents" in str(file) and "a" in mode:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(file, mode, *args, **kwargs)

    class Arm(Callback):  # from epoch 2 on, appending to the event file fails
        def on_train_epoch_begin(self, state):
            if state.epoch == 1:
                monkeypatch.setattr(io, "open", open_)

    with pytest.raises(OutputError) as info:
        train_two_epochs(Arm(), TensorBoard(tmp_path / "tb", every=1))
    monkeypatch.undo()
    assert str(info.value) == f"cannot write {tmp_path / 'tb'}: {FULL}"
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator").EventAccumulator(
        str(tmp_path / "tb"))
    ea.Reload()
    assert [e.step for e in ea.Scalars("train/loss")] == [1, 2]  # epoch 1's events are intact


@pytest.mark.slow
def test_cli_reports_a_full_disk_in_one_line_and_exits_2(tmp_path, monkeypatch, capsys):
    from torchboost.cli import main

    monkeypatch.setattr(torch, "save", fail_on_call(torch.save, 1))
    out = tmp_path / "run"
    code = main(["train", "--config", "digits-lenet", "--output", str(out), "--set", "train.epochs=1",
                 "--set", "checkpoint.save_every_steps=2", "--set", "train.progress_bar=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1] == f"error: cannot write {out / 'ckpt' / 'mnist_cnn-1_2.pt'}: {FULL}"
    assert leftovers(out) == []
