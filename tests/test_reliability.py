"""Issue 15 (reliability), end to end through the real CLI (`torchboost.cli.main`, in-process):

- resume mid-epoch records the uninterrupted run's history; stale temp files go at start-up; a damaged
  history.jsonl is set aside, never fatal;
- an output folder belongs to one run (refused without --resume/--overwrite, a lock against two live runs,
  pruning touches only the run's own checkpoints);
- a full disk or a permission error at every write site `torchboost train` reaches is one line naming the
  path and the cause, and every earlier artifact stays intact (and resumable);
- silently-wrong values are refused or handled (non-finite loss stops the run; no checkpoint ever holds
  non-finite weights; 16-bit PNGs train on rescaled values);
- a list of bad inputs, each a one-line error with exit code 2 and no traceback.

The crash-and-resume soak with real SIGKILLs is benchmarks/soak_resume.py.
"""

from __future__ import annotations

import copy
import errno
import fcntl
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from torchboost import cli
from torchboost.train.history import read_history

pytestmark = pytest.mark.usefixtures("one_thread")

RECIPE = "digits-lenet"  # 1,437 training images, 44 updates per epoch at batch 32
QUIET = ["--set", "train.progress_bar=false"]
FULL = "no space left on device — free disk space or choose another --output; the last good checkpoint is intact"
TIMING = ("train_time_s", "data_wait_ms", "step_ms", "data_wait_share")  # differ between any two runs
REPO = Path(__file__).resolve().parents[1]


# --- helpers ------------------------------------------------------------------------------------------

def run_cli(capsys, *args) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `torchboost ARGS` run in this process (argparse's exit included)."""
    capsys.readouterr()
    try:
        code = cli.main([str(a) for a in args])
    except SystemExit as e:  # usage errors exit from argparse
        code = e.code
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def train(capsys, out: Path, *extra, epochs: int = 1) -> tuple[int, str, str]:
    return run_cli(capsys, "train", "-c", RECIPE, "--epochs", epochs, *QUIET, "-o", out, *extra)


def one_line_error(code: int, err: str, *names) -> str:
    """Exit 2 and exactly one `error: ...` line on stderr (notes/warnings aside), no traceback; the line
    names each of `names`. Returns the line."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if not line.startswith(("note:", "warning:"))]
    assert code == 2 and len(errors) == 1 and errors[0].startswith("error: "), (code, err)
    for name in names:
        assert str(name) in errors[0], (name, errors[0])
    return errors[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (except the lock, which each run rewrites) -> its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def temps(folder: Path) -> list[str]:
    return [str(p.relative_to(folder)) for p in folder.rglob("*.tmp")]


def history_rows(out: Path) -> list[dict]:
    rows, damaged_at = read_history(out / "history.jsonl")
    assert damaged_at is None
    return rows


def numeric_fields(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in TIMING}


def checkpoints(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "ckpt").iterdir())


def assert_finite_checkpoint(path: Path) -> None:
    state = torch.load(path, map_location="cpu", weights_only=True)

    def walk(obj, where):
        if isinstance(obj, torch.Tensor):
            if obj.is_floating_point() or obj.is_complex():
                assert torch.isfinite(obj).all(), f"{path.name}: {where} holds non-finite values"
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{where}.{k}")
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{where}[{i}]")

    walk({k: state[k] for k in ("model", "optimizer", "ema") if k in state}, "ckpt")


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.fixture(scope="module")
def base_run(digits_run, tmp_path_factory) -> Path:
    """One finished 1-epoch digits-lenet run: ckpt/mnist_cnn-1_44.pt + best, history.*, config.yaml, tensorboard/."""
    out = Path(shutil.copytree(digits_run, tmp_path_factory.mktemp("base") / "run"))  # the suite's one run of RECIPE
    assert checkpoints(out) == ["mnist_cnn-1_44.pt", "mnist_cnn-best.pt"]
    return out


@pytest.fixture
def run_copy(base_run, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(base_run, out)
    return out


def resume(capsys, out: Path, *extra, epochs: int = 2, ckpt: str = "mnist_cnn-1_44.pt", force: bool = True):
    """Continues the 1-epoch base run for more epochs: --force, as the lr schedule is recomputed."""
    return train(capsys, out, "--resume", out / "ckpt" / ckpt, *(["--force"] if force else []), *extra, epochs=epochs)


# --- resume, history, temp files ----------------------------------------------------------------------

@pytest.mark.slow
def test_resume_mid_epoch_records_the_uninterrupted_history(tmp_path, capsys, monkeypatch):
    """A run interrupted in epoch 2 and resumed from its newest step checkpoint ends with the history rows
    (train_loss, train_top_1_accuracy, val_*) and the weights of the run that was never interrupted."""
    from torchboost.train.callbacks import LossMonitor

    every = ["--set", "checkpoint.save_every_steps=10"]
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    assert train(capsys, straight, *every, epochs=2)[0] == 0

    real = LossMonitor.on_train_step_end

    def interrupt(self, state):
        real(self, state)
        if state.global_step == 75:  # epoch 2, update 31 of 44; newest checkpoint: epoch 2 step 26
            raise KeyboardInterrupt

    monkeypatch.setattr(LossMonitor, "on_train_step_end", interrupt)
    code, _, err = train(capsys, broken, *every, epochs=2)
    monkeypatch.setattr(LossMonitor, "on_train_step_end", real)
    assert [r["epoch"] for r in history_rows(broken)] == [1]
    newest = broken / "ckpt" / "mnist_cnn-2_26.pt"
    assert newest.is_file()
    assert code == 130 and f"interrupted: checkpoint {newest} is complete; continue with: torchboost train " \
                           f"--resume {broken}" in err  # the checkpoint it names is the one to continue from

    code, out, _ = train(capsys, broken, *every, "--resume", newest, epochs=2)
    assert code == 0, out
    want, got = history_rows(straight), history_rows(broken)
    assert [numeric_fields(r) for r in got] == [numeric_fields(r) for r in want]  # bit-exact floats
    assert {"train_loss", "train_top_1_accuracy", "val_top_1_accuracy", "val_loss"} <= set(got[1])
    final = "mnist_cnn-2_44.pt"
    a = torch.load(straight / "ckpt" / final, weights_only=True)
    b = torch.load(broken / "ckpt" / final, weights_only=True)
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    csv_lines = (broken / "history.csv").read_text().splitlines()
    assert len(csv_lines) == 3 and csv_lines[0].startswith("epoch,global_step")
    assert (broken / "history.png").read_bytes().startswith(b"\x89PNG")
    assert temps(broken) == []


@pytest.mark.slow
def test_killed_between_the_epoch_checkpoint_and_the_history_write(tmp_path, capsys, monkeypatch):
    from torchboost.train import callbacks

    out, real = tmp_path / "run", callbacks.atomic_same
    every_epoch = ["--set", "checkpoint.save_every_epochs=1"]

    def link(source, path):  # epoch 1's best: the numbered checkpoint linked as the best one
        raise KeyboardInterrupt  # what a SIGKILL at this moment leaves: 1_44.pt written, no history row

    monkeypatch.setattr(callbacks, "atomic_same", link)
    assert train(capsys, out, *every_epoch, epochs=2)[0] == 130
    monkeypatch.setattr(callbacks, "atomic_same", real)
    code, _, err = train(capsys, out, *every_epoch, "--resume", out / "ckpt" / "mnist_cnn-1_44.pt", epochs=2)
    assert code == 0, err
    assert [r["epoch"] for r in history_rows(out)] == [1, 2]


def test_stale_temp_files_of_a_killed_run_are_removed_at_start(run_copy, capsys):
    pid = dead_pid()
    stale = [run_copy / f".history.jsonl.{pid}.tmp", run_copy / f".config.yaml.{pid}.tmp",
             run_copy / f".history.png.{pid}.tmp", run_copy / "ckpt" / f".mnist_cnn-2_44.pt.{pid}.tmp",
             run_copy / "ckpt" / f".mnist_cnn-best.pt.{pid}.tmp"]
    for p in stale:
        p.write_bytes(b"half a file")
    code, out, _ = resume(capsys, run_copy)
    assert code == 0, out
    assert temps(run_copy) == []
    assert [r["epoch"] for r in history_rows(run_copy)] == [1, 2]


def test_a_fresh_folder_holding_only_temp_files_of_a_killed_first_start(tmp_path, capsys):
    """Killed while writing its very first file: the next start is not refused, and cleans up."""
    out = tmp_path / "run"
    out.mkdir()
    (out / f".config.yaml.{dead_pid()}.tmp").write_text("name: digits")
    code, stdout, _ = train(capsys, out)
    assert code == 0, stdout
    assert temps(out) == [] and [r["epoch"] for r in history_rows(out)] == [1]


@pytest.mark.parametrize("damage", [b'{"epoch": 2, "global_step": 88, "train_lo', b"\x00\xff\xfe binary junk\n",
                                    b'["not", "a", "row"]\n'], ids=["truncated", "binary", "not-a-row"])
@pytest.mark.slow
def test_damaged_history_is_set_aside_and_never_fatal(run_copy, capsys, damage):
    good = (run_copy / "history.jsonl").read_bytes()
    (run_copy / "history.jsonl").write_bytes(good + damage)
    code, out, err = resume(capsys, run_copy)
    assert code == 0, err
    warning = [line for line in out.splitlines() if line.startswith("warning:") and "damaged" in line]
    assert warning == [f"warning: {run_copy / 'history.jsonl'} is damaged at line 2; moved it to "
                       "history.jsonl.damaged and kept the 1 rows before the damage"]
    assert (run_copy / "history.jsonl.damaged").read_bytes() == good + damage  # kept for the user
    rows = history_rows(run_copy)
    assert [r["epoch"] for r in rows] == [1, 2] and json.dumps(rows[0]) + "\n" == good.decode()


# --- one run per folder ---------------------------------------------------------------------------------

def test_a_new_run_into_another_runs_folder_is_refused_and_touches_nothing(run_copy, capsys):
    before = snapshot(run_copy)
    code, _, err = train(capsys, run_copy)
    one_line_error(code, err, f"output folder {run_copy} holds another run", "--resume", "--overwrite")
    assert snapshot(run_copy) == before


def test_a_folder_holding_only_checkpoints_is_refused(tmp_path, base_run, capsys):
    out = tmp_path / "run"
    shutil.copytree(base_run / "ckpt", out / "ckpt")
    code, _, err = train(capsys, out)  # not a run (no manifest), but files where this run would write
    one_line_error(code, err, "is not this run's but has the name its checkpoints take")


@pytest.mark.slow
def test_overwrite_replaces_the_runs_artifacts_and_nothing_else(run_copy, capsys):
    """As documented in recipe/outputs.py: --overwrite removes the earlier run's files, checkpoints and
    TensorBoard/profiler folders; anything else in the folder (ckpt/ included) stays."""
    (run_copy / "notes.txt").write_text("mine")
    (run_copy / "ckpt" / "my-notes.txt").write_text("mine too")  # only the run's own checkpoints go
    (run_copy / "data").mkdir()
    (run_copy / "data" / "x.bin").write_bytes(b"\x01\x02")
    old_events = sorted((run_copy / "tensorboard").iterdir())
    code, out, err = train(capsys, run_copy, "--overwrite", "--set", "train.seed=1")
    assert code == 0, err
    assert (run_copy / "notes.txt").read_text() == "mine" and (run_copy / "data" / "x.bin").read_bytes() == b"\x01\x02"
    assert not any(p.exists() for p in old_events)
    assert checkpoints(run_copy) == ["mnist_cnn-1_44.pt", "mnist_cnn-best.pt", "my-notes.txt"]
    assert (run_copy / "ckpt" / "my-notes.txt").read_text() == "mine too"
    assert yaml.safe_load((run_copy / "config.yaml").read_text())["train"]["seed"] == 1
    assert [r["epoch"] for r in history_rows(run_copy)] == [1]


@pytest.mark.slow
def test_pruning_touches_only_this_runs_checkpoints(run_copy, capsys):
    """Foreign files, another prefix's checkpoints and an older run's checkpoints with this prefix (even one
    that sorts as the newest) survive keep_max=1 pruning of a resumed run; the run's own older file goes."""
    ck = run_copy / "ckpt"
    foreign = {"notes.txt": b"keep me", "other-1_10.pt": (ck / "mnist_cnn-1_44.pt").read_bytes(),
               "mnist_cnn-7_99.pt": (ck / "mnist_cnn-1_44.pt").read_bytes(), "mnist_cnn-0_5.pt": b"older run"}
    for name, data in foreign.items():
        (ck / name).write_bytes(data)
    code, out, err = resume(capsys, run_copy, "--set", "checkpoint.keep_max=1", epochs=3)
    assert code == 0, err
    assert checkpoints(run_copy) == sorted([*foreign, "mnist_cnn-3_44.pt", "mnist_cnn-best.pt"])
    for name, data in foreign.items():
        assert (ck / name).read_bytes() == data


def test_a_finished_run_leaves_no_lock(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = train(capsys, out)
    assert code == 0, err
    assert not (out / ".lock").exists() and (out / "config.yaml").is_file()
    code, _, err = train(capsys, out, "--set", "train.epochs=0")  # a failed command: still no lock behind
    assert code == 2 and not (out / ".lock").exists()


def test_a_lock_removed_by_a_finishing_run_is_not_held(tmp_path, monkeypatch):
    """The race a removable lock file opens: a run opens .lock, the holder finishes and unlinks it, then the
    run's flock succeeds on the unlinked file while a third run creates and locks a new one. The run must
    see its file is gone and lock the one at the path."""
    from torchboost.recipe import outputs

    path = tmp_path / ".lock"
    real_flock, calls = fcntl.flock, []

    def flock_after_the_holder_finished(f, op):
        calls.append(os.fstat(f.fileno()).st_ino)
        if len(calls) == 1:
            path.unlink()  # the previous holder finished between our open and our flock
        return real_flock(f, op)

    monkeypatch.setattr(outputs.fcntl, "flock", flock_after_the_holder_finished)
    with outputs._take_lock(path) as lock:
        assert len(calls) == 2  # the unlinked file was let go and the new one locked
        assert os.fstat(lock.fileno()).st_ino == os.stat(path).st_ino


def test_a_live_run_holds_the_folder(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    with open(out / ".lock", "a+") as lock:  # what a live run holds (an flock on a separate open file)
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write("pid 424242\n")
        lock.flush()
        code, _, err = train(capsys, out)
    one_line_error(code, err, f"output folder {out} is in use by a live run (pid 424242)")
    assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing written, nothing removed


@pytest.mark.slow
def test_two_live_runs_into_one_folder_exactly_one_runs(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torchboost", "train", "-c", RECIPE, "--epochs", "3", *QUIET, "-o", str(out)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
             for _ in range(2)]
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    codes = sorted(r[0] for r in results)
    assert codes == [0, 2], results
    _, _, loser_err = next(r for r in results if r[0] == 2)
    line = one_line_error(2, loser_err, f"output folder {out}")
    assert "is in use by a live run (pid " in line or "holds another run" in line
    # the survivor's files are whole: 3 history rows, loadable finite checkpoints, its config, no temps
    assert [r["epoch"] for r in history_rows(out)] == [1, 2, 3]
    assert checkpoints(out) == ["mnist_cnn-3_44.pt", "mnist_cnn-best.pt"]  # the recipe saves every 5 epochs + last
    for p in (out / "ckpt").iterdir():
        assert_finite_checkpoint(p)
    assert yaml.safe_load((out / "config.yaml").read_text())["train"]["epochs"] == 3
    assert temps(out) == []


# --- disk full and permission errors at every write site ---------------------------------------------

def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def _enospc(path=None):
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), *([str(path)] if path else []))


def arm(monkeypatch, how: str, name: str, error=_enospc) -> None:
    """Make the write of file `name` fail with `error` (ENOSPC by default) at the point `how`."""
    if how == "fsync":  # delayed allocation: the data is accepted, the flush to disk fails
        real_fsync = os.fsync

        def fsync(fd):
            if f"/.{name}." in _fd_path(fd):
                raise error()
            return real_fsync(fd)

        monkeypatch.setattr(os, "fsync", fsync)
    elif how == "replace":
        real_replace = os.replace

        def replace(src, dst, *a, **kw):
            if Path(dst).name == name:
                raise error(dst)
            return real_replace(src, dst, *a, **kw)

        monkeypatch.setattr(os, "replace", replace)
    elif how == "torch.save":
        real_save = torch.save

        def save(obj, f, *a, **kw):
            if f".{name}." in str(getattr(f, "name", f)):
                raise error()
            return real_save(obj, f, *a, **kw)

        monkeypatch.setattr(torch, "save", save)
    elif how == "open":  # io.open: pathlib's write_text, tensorboard's event file appends
        real_open = io.open

        def open_(file, mode="r", *a, **kw):
            text = os.fsdecode(file) if isinstance(file, (str, bytes, os.PathLike)) else ""
            if name in os.path.basename(text) and any(c in mode for c in "wa"):
                raise error(text)
            return real_open(file, mode, *a, **kw)

        monkeypatch.setattr(io, "open", open_)
    elif how == "makedirs":
        real_makedirs = os.makedirs

        def makedirs(path, *a, **kw):
            if Path(path).name == name:
                raise error(path)
            return real_makedirs(path, *a, **kw)

        monkeypatch.setattr(os, "makedirs", makedirs)
    else:
        raise ValueError(how)


# (how the write fails, the file it fails on, the path the error must name, relative to the run folder)
WRITE_SITES = [
    ("torch.save", "mnist_cnn-2_44.pt", "ckpt/mnist_cnn-2_44.pt"),
    ("fsync", "mnist_cnn-2_44.pt", "ckpt/mnist_cnn-2_44.pt"),
    ("replace", "mnist_cnn-2_44.pt", "ckpt/mnist_cnn-2_44.pt"),
    ("fsync", "mnist_cnn-best.pt", "ckpt/mnist_cnn-best.pt"),
    ("fsync", "history.jsonl", "history.jsonl"),
    ("replace", "history.jsonl", "history.jsonl"),
    ("fsync", "history.csv", "history.csv"),
    ("replace", "history.png", "history.png"),
    ("fsync", "history.png", "history.png"),
    ("fsync", "config.yaml", "config.yaml"),
    ("replace", "config.yaml", "config.yaml"),
    ("makedirs", "tensorboard", "tensorboard"),
]


def check_intact_and_resumable(capsys, out: Path, before: dict[str, bytes], target: str) -> None:
    """After a failed write: the target and every checkpoint of the earlier run are byte-identical, the
    files rewritten before the failure are whole, no temp file is left, and the run resumes to the end."""
    after = snapshot(out)
    assert temps(out) == []
    if target in before:
        assert after[target] == before[target], f"{target} changed"
    for name, data in before.items():
        if name.startswith("ckpt/mnist_cnn-1_"):  # the earlier epoch's checkpoint: never rewritten
            assert after[name] == data, f"{name} changed"
        elif name.startswith("ckpt/"):  # the best checkpoint may have been replaced before the failure: whole
            torch.load(out / name, weights_only=True)
    assert history_rows(out)[0]["epoch"] == 1
    assert (out / "history.png").read_bytes().startswith(b"\x89PNG")
    yaml.safe_load((out / "config.yaml").read_text())
    code, stdout, err = resume(capsys, out)  # the last good checkpoint continues the run
    assert code == 0, err
    assert [r["epoch"] for r in history_rows(out)] == [1, 2]


@pytest.mark.parametrize("how,name,target", WRITE_SITES, ids=[f"{h}-{n}" for h, n, _ in WRITE_SITES])
@pytest.mark.slow
def test_disk_full_at_each_write_site_is_one_line_and_keeps_every_artifact(run_copy, capsys, monkeypatch, how,
                                                                          name, target):
    before = snapshot(run_copy)
    with monkeypatch.context() as m:
        arm(m, how, name)
        code, out, err = resume(capsys, run_copy)
    line = one_line_error(code, err)
    assert line == f"error: cannot write {run_copy / target}: {FULL}"
    check_intact_and_resumable(capsys, run_copy, before, target)


def _arm_event_writes(monkeypatch, fail_from: int) -> None:
    """TensorBoard's event-file writes (from its background thread) fail from the `fail_from`-th on; the
    thread's exception goes to the captured stderr as it would in a terminal (pytest hides it otherwise)."""
    import threading

    real_open, calls = io.open, [0]

    def open_(file, mode="r", *a, **kw):
        name = os.path.basename(os.fsdecode(file)) if isinstance(file, (str, bytes, os.PathLike)) else ""
        if "events.out.tfevents" in name and any(c in mode for c in "wa"):
            calls[0] += 1
            if calls[0] >= fail_from:
                raise _enospc(os.fsdecode(file))
        return real_open(file, mode, *a, **kw)

    monkeypatch.setattr(io, "open", open_)
    monkeypatch.setattr(threading, "excepthook", threading.__excepthook__)


@pytest.mark.parametrize("fail_from", [1, 3], ids=["first-write", "later-write"])
@pytest.mark.slow
def test_disk_full_writing_tensorboard_events_is_one_line(run_copy, capsys, monkeypatch, fail_from):
    before = snapshot(run_copy)
    with monkeypatch.context() as m:
        _arm_event_writes(m, fail_from)
        code, out, err = resume(capsys, run_copy)
    line = one_line_error(code, err, run_copy / "tensorboard", "no space left on device")
    assert line.startswith(f"error: cannot write {run_copy / 'tensorboard'}")
    check_intact_and_resumable(capsys, run_copy, before, "")


@pytest.mark.parametrize("code_,reason", [(errno.EACCES, "permission denied"), (errno.EROFS, "read-only file system")])
@pytest.mark.parametrize("how,name,target", [("replace", "history.jsonl", "history.jsonl"),
                                              ("torch.save", "mnist_cnn-2_44.pt", "ckpt/mnist_cnn-2_44.pt"),
                                              ("replace", "config.yaml", "config.yaml")])
@pytest.mark.slow
def test_permission_errors_are_one_line(run_copy, capsys, monkeypatch, how, name, target, code_, reason):
    before = snapshot(run_copy)
    with monkeypatch.context() as m:
        arm(m, how, name, error=lambda path=None: OSError(code_, os.strerror(code_), *([str(path)] if path else [])))
        code, out, err = resume(capsys, run_copy)
    assert one_line_error(code, err) == (f"error: cannot write {run_copy / target}: {reason} — make the folder "
                                         "writable or choose another --output; the last good checkpoint is intact")
    check_intact_and_resumable(capsys, run_copy, before, target)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions: chmod 0o555 would not stop writes")
def test_read_only_output_folder(run_copy, capsys):
    before = snapshot(run_copy)
    for p in [run_copy, *[d for d in run_copy.rglob("*") if d.is_dir()]]:
        p.chmod(0o555)
    try:
        code, out, err = resume(capsys, run_copy)
        one_line_error(code, err, run_copy, "permission denied")
        assert snapshot(run_copy) == before
    finally:
        for p in [run_copy, *[d for d in run_copy.rglob("*") if d.is_dir()]]:
            p.chmod(0o755)


def test_an_output_folder_that_cannot_be_created(tmp_path, capsys):
    parent = tmp_path / "file"
    parent.write_text("x")
    code, _, err = train(capsys, parent / "run")
    one_line_error(code, err, parent / "run")


# --- silently-wrong values ------------------------------------------------------------------------------

def test_non_finite_loss_stops_with_the_step_and_no_checkpoint_holds_non_finite_weights(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = train(capsys, out, "--set", "optim.lr=1.0e+30", "--set", "checkpoint.save_every_steps=1")
    line = one_line_error(code, err, "epoch 1 step 2", "nan")
    assert "checkpoints only ever hold finite weights" in line
    assert checkpoints(out) == ["mnist_cnn-1_1.pt"]  # written before the loss went bad; none after
    for p in (out / "ckpt").iterdir():
        assert_finite_checkpoint(p)


def test_non_finite_loss_with_skip_policy_stops_after_the_limit(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = train(capsys, out, "--set", "optim.lr=1.0e+30", "--set", "train.nonfinite=skip",
                         "--set", "train.max_nonfinite_steps=3", "--set", "checkpoint.save_every_steps=1")
    one_line_error(code, err, "epoch 1 step 5", "max_nonfinite_steps=3")
    assert checkpoints(out)
    for p in (out / "ckpt").iterdir():
        assert_finite_checkpoint(p)


def test_poisoned_data_stops_the_run_before_any_non_finite_checkpoint(tmp_path, capsys, monkeypatch):
    """A NaN pixel in one training image (a data poison): the run stops with the step, checkpoints stay finite."""
    import torchboost.data.builtin as builtin
    import torchboost.recipe.kinds as kinds

    real = builtin.load_builtin

    def poisoned(name, split, *a, **kw):
        ds = real(name, split, *a, **kw)
        if split == "train":
            ds.images = ds.images.clone().float() if not ds.images.is_floating_point() else ds.images.clone()
            ds.images[:] = float("nan")
        return ds

    monkeypatch.setattr(kinds, "load_builtin", poisoned)
    out = tmp_path / "run"
    code, _, err = train(capsys, out, "--set", "checkpoint.save_every_steps=1")
    one_line_error(code, err, "epoch 1 step 1", "the loss became nan")
    for p in (out / "ckpt").iterdir() if (out / "ckpt").exists() else []:
        assert_finite_checkpoint(p)


def _png16_folder(root: Path, classes: int = 3, per_class: int = 8) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in range(classes):
            d = root / split / f"c{c}"
            d.mkdir(parents=True)
            for i in range(per_class):
                a = rng.integers(0, 2000, (16, 16)).astype(np.uint16)
                a[:, c * 5:c * 5 + 5] = 60000 + rng.integers(0, 5000, (16, 5)).astype(np.uint16)
                Image.fromarray(a).save(d / f"{i}.png")
    return root


@pytest.mark.slow
def test_16_bit_png_folder_trains_on_rescaled_values(tmp_path, capsys):
    from PIL import Image

    from torchboost.recipe.config import build_config
    from torchboost.recipe.data import build_dataset

    data = _png16_folder(tmp_path / "png16")
    out = tmp_path / "run"
    code, stdout, err = train(capsys, out, "--data", data, "-b", 8, "--set", "data.image_size=16",
                              "--set", "data.crop_pct=1")
    assert code == 0, err
    cfg = build_config(yaml.safe_load((out / "config.yaml").read_text()))  # what the run trained with
    assert Image.open(data / "train" / "c0" / "0.png").mode.startswith("I")
    for split in ("train", "test"):
        ds = build_dataset(cfg.data, split)
        path, _ = ds.samples[0]
        raw = np.array(Image.open(path)).astype(np.int64)
        x, _ = ds[0]
        pixels = x * torch.tensor(cfg.data.std).view(-1, 1, 1) + torch.tensor(cfg.data.mean).view(-1, 1, 1)
        # 16-bit values keep their high byte: 65535 -> 1.0, 60000 -> 234/255, not clipped to 1.0 nor ~0
        torch.testing.assert_close(pixels[0], torch.from_numpy((raw >> 8) / 255).float(), atol=1e-6, rtol=0)
        assert pixels.max() > 0.9 and pixels.min() < 0.05


# --- bad inputs: one line, exit 2 -----------------------------------------------------------------------

BAD_SETS = [  # (--set, what the error names)
    ("optim.lr=nan", "optim.lr"), ("optim.lr=.nan", "optim.lr"), ("train.label_smoothing=2", "train.label_smoothing"),
    ("optim.weight_decay=-1", "optim.weight_decay"), ("optim.lr=-0.1", "optim.lr"), ("optim.momentum=-1", "optim.momentum"),
    ("train.eval_every=0", "train.eval_every"), ("data.workers=-1", "data.workers"), ("train.device=foo", "train.device"),
]


@pytest.mark.parametrize("override,key", BAD_SETS, ids=[s for s, _ in BAD_SETS])
def test_bad_value_is_one_line_exit_2(tmp_path, capsys, override, key):
    out = tmp_path / "run"
    code, _, err = train(capsys, out, "--set", override)
    one_line_error(code, err, key)
    assert not out.exists()  # refused before anything was written


def test_exponent_without_a_dot_is_a_number(tmp_path, capsys):
    code, out, err = run_cli(capsys, "train", "-c", RECIPE, "--set", "optim.lr=1e-3", "--print-config")
    assert code == 0, err
    assert yaml.safe_load(out)["optim"]["lr"] == 0.001


def test_non_utf8_config_file(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"name: x\n# caf\xe9 \xff\n")
    code, _, err = run_cli(capsys, "train", "-c", bad, *QUIET, "-o", tmp_path / "run")
    one_line_error(code, err, bad, "UTF-8")


def test_num_classes_and_in_chans_that_contradict_the_data(tmp_path, capsys):
    data = _png16_folder(tmp_path / "png16")  # 3 classes, 1 channel
    common = ["--data", data, "--set", "data.image_size=16"]
    code, _, err = train(capsys, tmp_path / "a", *common, "--set", "model.num_classes=10")
    one_line_error(code, err, "model.num_classes=10", "3 classes")
    code, _, err = train(capsys, tmp_path / "b", *common, "--set", "model.in_chans=3")
    one_line_error(code, err, "model.in_chans=3", "1 channel")


@pytest.mark.slow
def test_image_size_that_needs_a_huge_allocation(tmp_path, capsys):
    syn = ["--set", "data.dataset=synthetic"]
    code, _, err = train(capsys, tmp_path / "a", *syn, "--set", "data.image_size=30000")
    one_line_error(code, err, "data.image_size")
    code, _, err = train(capsys, tmp_path / "b", *syn, "--set", "data.image_size=2048",
                         "--set", "data.synthetic_size=1000000000")
    one_line_error(code, err, "data.synthetic_size")  # over the key's range before any estimate
    code, _, err = train(capsys, tmp_path / "c", *syn, "--set", "data.image_size=2048",
                         "--set", "data.synthetic_size=10000000")
    one_line_error(code, err, "GiB")  # refused from an estimate, before allocating


LIMITED = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # never let a bad allocation reach the OOM killer
    from torchboost.cli import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.slow
def test_image_size_2048_with_a_big_synthetic_set_is_refused_before_allocating(tmp_path):
    cmd = [sys.executable, "-c", LIMITED, "train", "-c", RECIPE, "--epochs", "1", *QUIET, "-o", str(tmp_path / "run"),
           "--set", "data.dataset=synthetic", "--set", "data.image_size=2048", "--set", "data.synthetic_size=100000"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    one_line_error(p.returncode, p.stderr, "2048")


def test_output_and_export_paths_naming_an_existing_file(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("mine")
    code, _, err = train(capsys, f)
    one_line_error(code, err, f, "is a file")
    code, _, err = run_cli(capsys, "export-folder", "--dataset", "digits", "--out", f)
    one_line_error(code, err, f, "is a file")
    assert f.read_text() == "mine"


@pytest.mark.parametrize("k", ["0", "-3"])
def test_predict_topk_below_one(base_run, capsys, k):
    img = base_run / "history.png"
    code, out, err = run_cli(capsys, "predict", "--checkpoint", base_run / "ckpt" / "mnist_cnn-1_44.pt",
                             "--topk", k, img)
    one_line_error(code, err, "--topk", k)
    assert out == ""


@pytest.mark.parametrize("optim", ["adamw", "thor"])
def test_resuming_an_sgd_checkpoint_with_another_optimizer(run_copy, capsys, optim):
    before = snapshot(run_copy)
    unset = ["--set", "optim.momentum=null"] if optim == "adamw" else []  # AdamW takes no momentum
    code, _, err = resume(capsys, run_copy, "--set", f"optim.name={optim}", *unset, force=False)
    one_line_error(code, err, run_copy / "ckpt" / "mnist_cnn-1_44.pt", "optim.name=sgd", optim)
    assert snapshot(run_copy) == before


def _edit_param_groups_more(sd):
    sd["optimizer"]["param_groups"].append(copy.deepcopy(sd["optimizer"]["param_groups"][0]))


def _edit_param_groups_none(sd):
    sd["optimizer"]["param_groups"] = []


def _edit_param_id(sd):
    sd["optimizer"]["param_groups"][0]["params"][0] = 999


def _edit_param_group_size(sd):
    sd["optimizer"]["param_groups"][0]["params"].pop()


def _drop_rng(sd):
    del sd["rng"]


EDITS = {"one-more-param-group": _edit_param_groups_more, "no-param-groups": _edit_param_groups_none,
         "param-id-changed": _edit_param_id, "param-missing-from-group": _edit_param_group_size, "no-rng": _drop_rng}
@pytest.mark.parametrize("edit", list(EDITS))
def test_resuming_an_edited_checkpoint(run_copy, capsys, edit):
    ckpt = run_copy / "ckpt" / "edited.pt"
    sd = torch.load(run_copy / "ckpt" / "mnist_cnn-1_44.pt", weights_only=True)
    EDITS[edit](sd)
    torch.save(sd, ckpt)
    before = snapshot(run_copy)
    code, _, err = resume(capsys, run_copy, ckpt="edited.pt")
    one_line_error(code, err, ckpt)
    assert snapshot(run_copy) == before


def test_dim_reduce_basis_holding_an_object_array(tmp_path, capsys):
    npy = tmp_path / "pca.npy"
    np.save(npy, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    boost = json.dumps({"boost": {"mode": "manual", "dim_reduce": True},
                        "dim_reduce": {"pca_mat_path": str(npy), "n_components": 2}})
    code, _, err = train(capsys, tmp_path / "run", "--set", f"boost.config={boost}")
    one_line_error(code, err, npy, "object array", "float matrix")


def test_convert_of_a_complex128_tensor_to_safetensors(tmp_path, capsys):
    src, dst = tmp_path / "c.pt", tmp_path / "c.safetensors"
    torch.save({"w": torch.zeros(3, dtype=torch.complex128)}, src)
    code, _, err = run_cli(capsys, "convert", src, dst)
    one_line_error(code, err, "complex128")
    assert not dst.exists()
