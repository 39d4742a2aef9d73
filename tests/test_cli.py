"""Every `torchboost` subcommand through `main()`, with what each must print or write."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from torchboost import __version__
from torchboost.cli import main
from torchboost.data.builtin import load_builtin
from torchboost.migrate.formats import all_suffixes
from torchboost.train.checkpoint import load_checkpoint

FAST = ["--set", "train.progress_bar=false", "--set", "train.log_every=1000"]


@pytest.fixture(scope="module")
def run(digits_run, tmp_path_factory):
    """The suite's one short digits run, copied for the commands that read a checkpoint."""
    return Path(shutil.copytree(digits_run, tmp_path_factory.mktemp("run") / "run"))


def test_version_and_recipes(capsys):
    assert main(["--version"]) == 0 and capsys.readouterr().out.strip() == f"torchboost {__version__}"
    assert main(["recipes"]) == 0
    assert {"mnist-lenet", "digits-lenet", "mnist-lenet-thor"} <= set(capsys.readouterr().out.split())
    assert main(["recipes", "show", "digits-lenet"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["name"] == "digits-lenet"


def test_print_config_applies_shortcuts_last(capsys):
    assert main(["train", "-c", "digits-lenet", "--set", "train.epochs=9", "--epochs", "2", "--lr", "0.01",
                 "-b", "16", "--print-config"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert (cfg["train"]["epochs"], cfg["optim"]["lr"], cfg["data"]["batch_size"]) == (2, 0.01, 16)


def test_train_writes_pt_checkpoints_best_and_logs(run):
    names = sorted(p.name for p in (run / "ckpt").iterdir())
    assert names == ["mnist_cnn-1_44.pt", "mnist_cnn-best.pt"]
    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    csv = (run / "history.csv").read_text().splitlines()
    assert len(rows) == 1 and len(csv) == 2 and "val_top_1_accuracy" in csv[0].split(",")
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["num_classes"] == 10


def test_eval_checkpoint_and_plain_weights(run, tmp_path, capsys):
    ckpt = str(run / "ckpt" / "mnist_cnn-1_44.pt")
    assert main(["eval", "--checkpoint", ckpt]) == 0
    line = capsys.readouterr().out
    acc = float(line.split("top_1_accuracy=")[1].split()[0])
    hist = json.loads((run / "history.jsonl").read_text().splitlines()[-1])
    assert acc == pytest.approx(hist["val_top_1_accuracy"], abs=1e-4) and "samples=360" in line
    weights = tmp_path / "w.safetensors"
    assert main(["convert", ckpt, str(weights), "--arch", "none"]) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(weights)]) == 2
    assert "--config" in capsys.readouterr().err  # plain weights need the recipe that built them
    assert main(["eval", "--checkpoint", str(weights), "--config", "digits-lenet"]) == 0
    assert f"top_1_accuracy={acc:.4f}" in capsys.readouterr().out


@pytest.mark.parametrize("suffix", all_suffixes())
def test_eval_and_predict_read_every_registered_weight_format(run, suffix, tmp_path, capsys):
    """The training checkpoint converted to each format, with torch names (--arch none) and, where the
    format has a name map for this network, with the framework's own names: the same scores and predictions."""
    ckpt = str(run / "ckpt" / "mnist_cnn-1_44.pt")
    image = tmp_path / "0.png"
    Image.fromarray(load_builtin("digits", "test").images[0, 0].numpy()).save(image)
    assert main(["eval", "--checkpoint", ckpt]) == 0 and main(["predict", "--checkpoint", ckpt, str(image)]) == 0
    expected = capsys.readouterr().out.splitlines()
    for arch in ("none", None):
        weights = tmp_path / f"{arch}{suffix}"
        if main(["convert", ckpt, str(weights), *(["--arch", arch] if arch else [])]) != 0:
            assert arch is None and "--arch none" in capsys.readouterr().err  # no name map for the MNIST CNN
            continue
        capsys.readouterr()
        assert main(["eval", "--checkpoint", str(weights), "--config", "digits-lenet"]) == 0
        assert main(["predict", "--checkpoint", str(weights), "--config", "digits-lenet", str(image)]) == 0
        out = capsys.readouterr().out.splitlines()
        assert [l for l in out if not l.startswith("data:")] == [l for l in expected if not l.startswith("data:")]


def test_predict_files_and_folders(run, tmp_path, capsys):
    ds = load_builtin("digits", "test")
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(3):
        Image.fromarray(ds.images[i, 0].numpy()).save(folder / f"{i}.png")
    ckpt = str(run / "ckpt" / "mnist_cnn-best.pt")
    assert main(["predict", "--checkpoint", ckpt, "--topk", "2", str(folder)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == [str(folder / f"{i}.png") for i in range(3)]
    probs = [float(x) for x in lines[0].split(": ")[1].replace(",", "").split()[1::2]]
    assert len(probs) == 2 and probs[0] >= probs[1] and 0 < sum(probs) <= 1 + 1e-6
    assert main(["predict", "--checkpoint", ckpt, "--topk", "0", str(folder)]) == 2
    assert "--topk" in capsys.readouterr().err


@pytest.mark.slow
def test_export_folder_then_train_on_it(tmp_path, capsys):
    out = tmp_path / "digits"
    assert main(["export-folder", "--dataset", "digits", "--out", str(out)]) == 0
    assert len(list((out / "train").iterdir())) == 10
    (tmp_path / "file").write_text("x")
    assert main(["export-folder", "--dataset", "digits", "--out", str(tmp_path / "file")]) == 2
    assert "is a file" in capsys.readouterr().err


def test_diff_config(capsys, tmp_path):
    assert main(["diff-config", "digits-lenet", "mnist-lenet", "--json", str(tmp_path / "d.json")]) == 0
    assert "data.dataset" in capsys.readouterr().out
    assert json.loads((tmp_path / "d.json").read_text())["n_differences"] > 0


def test_align_a_recipe_with_itself_passes(capsys):
    assert main(["align", "-c", "digits-lenet", "--reference-config", "digits-lenet", "--batch-size", "4",
                 "--rows", "100"]) == 0
    out = capsys.readouterr().out
    # the MNIST CNN: 6 parameter tensors, compared after forward/backward/update, plus activations and loss, in
    # each of 3 training steps (optimizer state shows from the 2nd)
    assert "PASS: 63 items compared over 3 training steps (0 without a reference counterpart)" in out
    rows = [l.split() for l in out.splitlines() if l.split()[1:2] in (["backward"], ["update"])]
    assert len(rows) == 36 and all(r[6] == "0.000e+00" and r[-1] == "ok" for r in rows)  # identical: max error 0
    assert sorted({r[0] for r in rows}) == ["1", "2", "3"]


def test_debug_layers(capsys, tmp_path):
    assert main(["debug-layers", "-c", "digits-lenet", "--batch-size", "4", "--json", str(tmp_path / "l.json")]) == 0
    report = json.loads((tmp_path / "l.json").read_text())
    out = capsys.readouterr().out
    # one record per module call of the MNIST CNN, in call order, with the batch's shapes
    assert [m["call"] for m in report["modules"]][:2] == ["conv1", "relu"]
    assert report["modules"][0]["shape"] == [4, 20, 8, 8] and report["flagged"] == []
    assert f"loss {report['loss']:.5f}" in out and 0 < report["loss"] < 10


def test_bench_reports_images_per_second(capsys, tmp_path):
    assert main(["bench", "--model", "mnist_cnn", "--image-size", "28", "--batch-size", "8", "--steps", "2",
                 "--warmup", "1", "--mode", "train", "--json", str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "b.json").read_text())
    steps = result["train"]["step_s"]
    assert len(steps) == 2 and all(s > 0 for s in steps)  # --steps 2 timed, --warmup 1 not
    assert result["train"]["images_per_s"] == pytest.approx(8 / float(np.median(steps)))
    assert "img/s" in out


def test_convert_round_trip_keeps_tensors(run, tmp_path, capsys):
    ckpt = run / "ckpt" / "mnist_cnn-1_44.pt"
    pt = tmp_path / "w.pt"
    assert main(["convert", str(ckpt), str(pt), "--arch", "none"]) == 0
    want = load_checkpoint(ckpt)["model"]
    got = torch.load(pt, weights_only=True)
    assert set(got) <= set(want) and all(torch.equal(got[k], want[k]) for k in got)


def test_convert_reads_torch_files_by_content(run, tmp_path, capsys):
    """A torch checkpoint named .ckpt (torchboost's old training-checkpoint name) is read as torch, not
    refused as a malformed MindSpore file."""
    old = tmp_path / "mnist-12_62.ckpt"
    old.write_bytes((run / "ckpt" / "mnist_cnn-1_44.pt").read_bytes())
    assert main(["convert", str(old), str(tmp_path / "x.safetensors"), "--arch", "none"]) == 0
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize("planted,where", [("train.label_smoothing=0.1", "at step 1 loss"),
                                            ("optim.lr=0.1", "at step 1 update")])
def test_align_finds_a_planted_loss_or_optimizer_difference(planted, where, capsys):
    """Regression: --reference-set applied only to the network, so another loss or lr still PASSed."""
    assert main(["align", "-c", "digits-lenet", "--reference-config", "digits-lenet", "--reference-set", planted,
                 "--batch-size", "4"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and f"first divergence {where}" in out
