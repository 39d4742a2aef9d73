"""Answers a new user met that were silently wrong, and output that said more (or other) than was true: each
is reproduced through the CLI or the library function and the real outcome asserted (which folder was read
and how many images, the printed lines, the files left in a folder, the plot's axis, the message)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from test_own_data import make_folder
from torchboost.cli import main
from torchboost.data.folder import ImageFolder
from torchboost.race.lanes import Lane, race_setup
from torchboost.race.plot import race_figure
from torchboost.race.report import summarize
from torchboost.train.model import Model
from torchboost.train.profiling import DataStarvationMonitor

QUIET = ["--set", "train.progress_bar=false", "--set", "train.log_every=1000"]


def one_line(capsys, code: int) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err, (code, err)
    return err


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """3 classes: train/ and val/ with 18 images, test/ with 12."""
    root = make_folder(tmp_path_factory.mktemp("d") / "d")
    return make_folder(root, n=4, splits=("test",))


@pytest.fixture(scope="module")
def run(data, tmp_path_factory) -> Path:
    """One epoch on `data` at the default batch of 64, which the 18 images fit to 18 (one update an epoch)."""
    out = tmp_path_factory.mktemp("r") / "run"
    assert main(["train", "--data", str(data), "--epochs", "1", "-o", str(out), *QUIET]) == 0
    return out


@pytest.mark.slow
def test_eval_reads_the_split_it_names_and_says_which_folder(run, data, tmp_path, capsys):
    ckpt = str(run / "ckpt/resnet20-best.pt")
    capsys.readouterr()
    assert main(["eval", "--checkpoint", ckpt, "--split", "test"]) == 0
    head, scores, *per_class = capsys.readouterr().out.splitlines()
    assert per_class[0].startswith("per class: macro F1")
    assert head == f"evaluated {data / 'test'} (folder): 12 images" and "samples=12" in scores  # not val/'s 18
    assert "top_5" not in scores  # 3 classes: top-5 always reads 100%, left out as train leaves it out
    assert main(["eval", "--checkpoint", ckpt]) == 0  # no --split: the run's evaluation split, val/
    assert capsys.readouterr().out.startswith(f"evaluated {data / 'val'} (folder): 18 images\n")
    two = make_folder(tmp_path / "two")  # train/ and val/ only
    err = one_line(capsys, main(["eval", "--checkpoint", ckpt, "--data", str(two), "--split", "test"]))
    assert err == f"error: {two} has no test split (it has: train, val) — use --split val"
    shards = tmp_path / "shards"  # the same rule for shards: the index's test split, not its val
    assert main(["export-shards", str(data), str(shards)]) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", ckpt, "--set", "data.dataset=shards", "--set", f"data.path={shards}",
                 "--split", "test"]) == 0
    assert capsys.readouterr().out.startswith(f"evaluated {shards} (shards), split test: 12 images\n")


def test_race_says_what_it_races_and_warns_when_updates_are_few(data, tmp_path, capsys):
    out = tmp_path / "race"
    assert main(["race", "-c", "digits-lenet", "--data", str(data), "-b", "6", "--optimizers", "sgd", "--lr",
                 "sgd=0.05", "--seeds", "1", "--epochs", "1", "--targets", "0.5", "-o", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"note: --data {data}: training on that image folder (data.dataset=folder) instead of "
                        "the recipe's built-in digits")  # as `train` reads --data
    assert lines[1] == (f"racing recipe digits-lenet on folder {data} (18 training images): batch 6, "
                        "3 updates/epoch, 1 epochs")
    assert lines[2].startswith("warning: 3 updates per epoch are too few for a meaningful ranking")
    settings = json.loads((out / "race.json").read_text())["settings"]
    assert (settings["batch_size"], settings["updates_per_epoch"]) == (6, 3)
    from torchboost.recipe import load_resolved

    cfg, train_ds, _ = load_resolved("digits-lenet", ["data.batch_size=256"])
    _, lines = race_setup("digits-lenet", cfg, len(train_ds), 3)
    assert lines[-1] == ("warning: 5 updates per epoch are too few for a meaningful ranking; use a smaller batch, "
                         "e.g. -b 32 (44 updates/epoch)")
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, batch_size=32))
    _, lines = race_setup("digits-lenet", cfg, len(train_ds), 3)
    assert len(lines) == 1 and "44 updates/epoch" in lines[0]


def _lane(racer: str, accs: list[float]) -> Lane:
    history = [{"epoch": i + 1, "seconds": float(i + 1), "val_top_1_accuracy": a} for i, a in enumerate(accs)]
    return Lane(racer, 0.1, 0, None, None, None, seconds=float(len(accs)), history=history)  # type: ignore[arg-type]


def test_race_plot_shows_a_racer_that_stays_low(tmp_path):
    lanes = [_lane("good", [0.95, 0.98]), _lane("stuck", [0.11, 0.12])]
    fig = race_figure(lanes, summarize(lanes, (0.97, 0.98)))
    low, high = fig.axes[0].get_ylim()
    curves = {line.get_label().split()[0]: min(line.get_ydata()) for line in fig.axes[0].get_lines()
              if not line.get_label().startswith("_")}
    assert curves == {"good": 0.95, "stuck": 0.11} and low <= 0.11 and high == 1.0  # was 0.94: "stuck" unseen


def _export(capsys, source: Path, out: Path, *extra: str) -> int:
    code = main(["export-shards", str(source), str(out), *extra])
    capsys.readouterr()
    return code


def test_export_shards_owns_its_folder_like_a_run(data, tmp_path, capsys):
    out = tmp_path / "shards"
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # unrelated files: fine, and never deleted
    assert _export(capsys, data, out, "--shard-size", "4") == 0
    first = sorted(p.name for p in out.iterdir())
    assert "train-000004.tar" in first and "notes.txt" in first
    err = one_line(capsys, main(["export-shards", str(data), str(out)]))
    assert "holds an earlier export" in err and "--overwrite" in err
    assert sorted(p.name for p in out.iterdir()) == first  # refused: nothing written or deleted
    assert _export(capsys, data, out, "--overwrite") == 0  # 1 shard a split now: the old 5 must not stay
    assert sorted(p.name for p in out.iterdir()) == ["_info.json", "_offsets_test.npy", "_offsets_train.npy",
                                                     "_offsets_val.npy", "notes.txt", "test-000000.tar",
                                                     "train-000000.tar", "val-000000.tar"]
    (out / "_info.json").unlink()  # as an interrupted export leaves it: shards, no index
    err = one_line(capsys, main(["export-shards", str(data), str(out), "--overwrite"]))
    assert "holds shard files but no _info.json" in err and (out / "train-000000.tar").exists()


@pytest.mark.slow
def test_ctrl_c_says_whether_a_checkpoint_exists(run, data, tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Model, "train", interrupted)
    fresh = ["train", "--data", str(data), "--epochs", "1", "-o", str(tmp_path / "new"), *QUIET]
    assert main(fresh) == 130
    assert capsys.readouterr().err.splitlines()[-1] == ("interrupted before the first checkpoint: none was written; "
                                                        "the same command with --overwrite starts over")
    assert main([*fresh, "--overwrite"]) == 130  # what it said is true: the folder is taken, not refused
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    assert main(["train", "--force", "--resume", str(copy), "--epochs", "2", *QUIET]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (f"interrupted: checkpoint {copy / 'ckpt/resnet20-1_1.pt'} "
                                                        f"is complete; continue with: torchboost train --resume {copy}")


def test_the_data_note_is_said_once_per_run(run, data, capsys, monkeypatch):
    note = f"note: --data {data}: training on that image folder"
    assert main(["train", "--data", str(data), "--print-config"]) == 0
    assert capsys.readouterr().out.startswith(note)
    monkeypatch.setenv("RANK", "1")  # another process of the same torchrun job: rank 0 says it
    assert main(["train", "--data", str(data), "--print-config"]) == 0
    assert note not in capsys.readouterr().out
    monkeypatch.delenv("RANK")
    assert main(["train", "--force", "--resume", str(run), "--data", str(data), "--epochs", "2", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert note not in out and out.startswith("resume: train.epochs 1 -> 2 (forced)\nname:")  # that line alone


def test_resume_prints_only_what_really_changed(run, data, capsys, monkeypatch):
    # the same command again with --resume auto: 3 classes left top-5 out and the batch of 64 was fitted to 18
    # images; neither is a change, and the run is not "a different run"
    same = ["train", "--data", str(data), "-o", str(run), "--resume", "auto", *QUIET, "--print-config"]
    assert main([*same, "--epochs", "2"]) == 2  # a longer schedule is asked for with --force
    assert "recomputes the lr schedule" in capsys.readouterr().err
    assert main([*same, "--epochs", "2", "--force"]) == 0
    assert capsys.readouterr().out.startswith("resume: train.epochs 1 -> 2 (forced)\nname:")
    assert main([*same, "--epochs", "1"]) == 0
    assert capsys.readouterr().out.startswith("name:")  # nothing changed, nothing said
    monkeypatch.chdir(data.parent)  # the same folder, spelt relative: not a change of data.path
    assert main(["train", "--force", "--resume", str(run), "--data", data.name, "--epochs", "2", "--print-config"]) == 0
    assert capsys.readouterr().out.startswith("resume: train.epochs 1 -> 2 (forced)\nname:")


@pytest.mark.slow
def test_a_moved_data_set_resumes_when_its_classes_match(run, data, tmp_path, capsys):
    moved, copy = tmp_path / "moved", tmp_path / "copy"
    shutil.copytree(data, moved)
    shutil.copytree(run, copy)
    assert main(["train", "--force", "--resume", str(copy), "--data", str(moved), "--epochs", "2", *QUIET]) == 0
    out = capsys.readouterr().out
    assert f"note: the data moved: resuming on {moved} (was {data}), which has the run's 3 classes" in out
    assert "resume: data.path" not in out and f"on folder {moved} (18 train images" in out
    rows = [json.loads(line) for line in (copy / "history.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]
    other = make_folder(tmp_path / "other", classes=("0", "1", "9"))
    err = one_line(capsys, main(["train", "--resume", str(copy), "--data", str(other), "--epochs", "3"]))
    assert f"{other} holds other classes than" in err and "missing: 2; extra: 9" in err


def test_a_skipped_image_and_a_decoding_warning_are_one_note_line_each(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("torchboost.data.folder._NOTED", set())  # what this process noted before this test
    root = make_folder(tmp_path / "d")
    (root / "train/0/0.png").write_bytes(b"not an image")

    def noisy(img, rng):
        warnings.warn("Palette images with Transparency expressed in bytes should be converted to RGBA images")
        return torch.zeros(1)

    ds = ImageFolder(root / "train", noisy, skip_corrupt=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a Python warning escaping the loader would fail here
        for i in range(3):
            ds[i]
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"note: skipping corrupt image {root / 'train/0/0.png'} (UnidentifiedImageError")
    assert err[1] == f"note: {root / 'train/0/1.png'}: Palette images with Transparency expressed in bytes should " \
                     "be converted to RGBA images"
    assert len(err) == 2  # the same decoding warning from the next images is not repeated


def test_data_wait_at_the_default_workers_is_a_note_said_once():
    from test_profiling import ScriptedTimes, batches, run as train

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*map(torch.cat, zip(*batches()))),
                                         batch_size=4)  # 0 workers: the default
    _, logs = train(loader, [ScriptedTimes(lambda e, s: (0.003, 0.004)), DataStarvationMonitor(loader=loader)],
                    epochs=3)
    said = [line for line in logs if "3.0 ms of each 4.0 ms update" in line]
    assert len(said) == 1 and said[0].startswith("note: loading data takes 3.0 ms of each 4.0 ms update")
    assert "data.workers=0 (the default)" in said[0] and "data.workers=N" in said[0]
    assert not any(line.startswith("warning:") for line in logs)
