"""Everyday training on your own image folder: what the data says is checked, never silently wrong.
Each test drives the CLI on real PNG files and asserts the outcome (labels, channels, sizes, what was
written), not only the exit code."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from torchboost.cli import main
from torchboost.data.folder import ImageFolder
from torchboost.errors import DataError
from torchboost.recipe.config import build_config
from torchboost.recipe.resolve import fit_batch

QUIET = ["--set", "train.progress_bar=false", "--set", "train.log_every=1000", "--epochs", "1"]


def make_folder(root: Path, classes=("0", "1", "2"), n=6, size=12, mode="L", splits=("train", "val")) -> Path:
    rng = np.random.default_rng(0)
    for split in splits:
        for k, c in enumerate(classes):
            (root / split / c).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                shape = (size, size) if mode == "L" else (size, size, 3)
                pixels = np.clip(rng.normal(40 + 60 * k, 10, shape), 0, 255).astype(np.uint8)
                Image.fromarray(pixels, mode).save(root / split / c / f"{i}.png")
    return root


def one_line(capsys, argv) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err, (code, err)
    return err


def test_val_split_with_other_class_folders_is_refused_naming_them(tmp_path, capsys):
    data = make_folder(tmp_path / "d")
    for f in (data / "val" / "1").iterdir():
        f.unlink()
    (data / "val" / "1").rmdir()
    (data / "val" / "9").mkdir()
    Image.new("L", (12, 12)).save(data / "val" / "9" / "x.png")
    err = one_line(capsys, ["train", "--data", str(data), *QUIET, "-o", str(tmp_path / "o")])
    assert "missing: 1" in err and "extra: 9" in err
    assert not (tmp_path / "o").exists()  # refused before anything was written


@pytest.mark.slow
def test_channels_come_from_the_majority_not_the_first_file(tmp_path, capsys):
    data = make_folder(tmp_path / "d", mode="L")
    Image.new("RGB", (12, 12), (200, 10, 10)).save(data / "train" / "0" / "000-first.png")  # sorts first
    assert main(["train", "--data", str(data), *QUIET, "-o", str(tmp_path / "o"), "--set", "data.batch_size=6"]) == 0
    out = capsys.readouterr().out
    assert "mixed (11 grayscale, 1 colour)" in out  # 4 sampled per class, the odd one among them
    assert "final: top-1 " in out and "top-5" not in out.split("final: ")[1]
    cfg = yaml.safe_load((tmp_path / "o" / "config.yaml").read_text())
    assert "top_5_accuracy" not in cfg["train"]["metrics"]  # 3 classes: top-5 would always read 100%
    assert cfg["data"]["channels"] == 1 and cfg["model"]["in_chans"] == 1 and cfg["data"]["mean"] == [0.5]


def test_one_class_folder_is_one_line_and_writes_nothing(tmp_path, capsys):
    data = make_folder(tmp_path / "d", classes=("only",))
    err = one_line(capsys, ["train", "--data", str(data), *QUIET, "-o", str(tmp_path / "o")])
    assert "at least 2" in err and not (tmp_path / "o").exists()


def test_a_symlink_loop_does_not_multiply_a_class(tmp_path):
    data = make_folder(tmp_path / "d")
    os.symlink(data / "train" / "0", data / "train" / "0" / "loop")  # a link back to its own folder
    ds = ImageFolder(data / "train", None)
    counts = np.bincount([label for _, label in ds.samples])
    assert counts.tolist() == [6, 6, 6]


@pytest.mark.parametrize("target", ["train", ".", "train/1"])
def test_a_link_to_other_classes_images_is_refused(tmp_path, capsys, target):
    """A folder link up the tree (or into a sibling class) would label every image it reaches as class 0."""
    data = make_folder(tmp_path / "d")
    os.symlink(data / target, data / "train" / "0" / "more")
    err = one_line(capsys, ["train", "--data", str(data), *QUIET, "-o", str(tmp_path / "o")])
    assert "train/0/more in class folder" in err and "labelled 0" in err and "remove the link" in err
    assert not (tmp_path / "o").exists()
    os.unlink(data / "train" / "0" / "more")
    os.symlink(data / "train" / "0", tmp_path / "shared")  # a link from outside into a class is fine
    os.symlink(tmp_path / "shared", data / "train" / "1" / "outside")
    with pytest.raises(DataError, match="labelled 1"):  # ...unless it leads to another class's images
        ImageFolder(data / "train", None)
    os.unlink(data / "train" / "1" / "outside")
    extra = make_folder(tmp_path / "elsewhere", classes=("x",), n=2, splits=("s",)) / "s" / "x"
    os.symlink(extra, data / "train" / "2" / "extra")  # images kept outside the data set: followed
    assert np.bincount([label for _, label in ImageFolder(data / "train", None).samples]).tolist() == [6, 6, 8]


@pytest.mark.slow
def test_small_images_keep_their_native_size_with_a_resnet(tmp_path, capsys):
    data = make_folder(tmp_path / "d", size=28)
    assert main(["train", "--data", str(data), "--set", "model.name=resnet18", *QUIET, "-o", str(tmp_path / "o"),
                 "--set", "data.batch_size=6"]) == 0
    cfg = yaml.safe_load((tmp_path / "o" / "config.yaml").read_text())
    assert cfg["data"]["image_size"] == 28 and cfg["model"]["small_input"] is True
    assert (cfg["data"]["augment"], cfg["data"]["random_shift"]) == ("shift", 2)  # not 8%-area crops of 28 px


def test_predict_formats_and_a_newline_in_a_file_name(tmp_path, capsys):
    data = make_folder(tmp_path / "d")
    assert main(["train", "--data", str(data), *QUIET, "-o", str(tmp_path / "o"), "--set", "data.batch_size=6"]) == 0
    (ckpt,) = (tmp_path / "o" / "ckpt").glob("*-best.pt")
    odd = tmp_path / "a\nb.png"
    Image.new("L", (12, 12)).save(odd, format="PNG")
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(ckpt), str(odd), "--topk", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "a\\nb.png: " in lines[0]  # one line: the newline is written as its escape
    assert main(["predict", "--checkpoint", str(ckpt), str(odd), "--topk", "2", "--format", "json"]) == 0
    rows = __import__("json").loads(capsys.readouterr().out)
    assert rows[0]["file"] == str(odd) and len(rows[0]["top"]) == 2
    assert abs(sum(t["probability"] for t in rows[0]["top"])) <= 1.0 + 1e-6


def test_eval_says_what_it_read_and_refuses_a_path_as_split(tmp_path, capsys):
    data = make_folder(tmp_path / "d")
    assert main(["train", "--data", str(data), *QUIET, "-o", str(tmp_path / "o"), "--set", "data.batch_size=6"]) == 0
    (ckpt,) = (tmp_path / "o" / "ckpt").glob("*-best.pt")
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(ckpt), "--split", "val"]) == 0
    assert f"evaluated {data / 'val'} (folder): 18 images" in capsys.readouterr().out
    assert main(["eval", "--checkpoint", str(ckpt), "--split", "../../x"]) == 2


@pytest.mark.slow
def test_fine_tuning_onto_other_classes_reinitialises_the_head_and_can_freeze_the_backbone(tmp_path, capsys):
    """timm's behaviour: everything that fits loads, the classifier head for another class count starts fresh
    (one line says so); with train.freeze_backbone_epochs=1 the first epoch trains the head only."""
    import torch

    from torchboost.train.checkpoint import load_checkpoint

    assert main(["train", "-c", "digits-lenet", *QUIET, "-o", str(tmp_path / "src")]) == 0  # 10 classes, 8 px
    (src,) = (tmp_path / "src" / "ckpt").glob("*-best.pt")
    data = make_folder(tmp_path / "d", size=8)  # 3 classes
    capsys.readouterr()
    assert main(["train", "--data", str(data), "-c", "digits-lenet", "--epochs", "2", "-o", str(tmp_path / "ft"),
                 "--set", "train.progress_bar=false", "--set", f"train.init_weights={src}",
                 "--set", "train.freeze_backbone_epochs=1", "--set", "data.batch_size=6",
                 "--set", "data.image_size=8", "--set", "checkpoint.keep_max=5", "--set", "checkpoint.save_every_epochs=1"]) == 0
    out = capsys.readouterr().out
    assert "fc.weight, fc.bias re-initialised" in out and "only the head (fc.bias, fc.weight) trains" in out
    before = load_checkpoint(src)["model"]
    ckpts = sorted((tmp_path / "ft" / "ckpt").glob("mnist_cnn-*_*.pt"))
    first, second = (load_checkpoint(p)["model"] for p in ckpts[:2])
    assert torch.equal(first["conv1.weight"], before["conv1.weight"])  # frozen in epoch 1
    assert not torch.equal(second["conv1.weight"], before["conv1.weight"])  # trained in epoch 2
    assert first["fc.weight"].shape[0] == 3


def test_a_shift_as_large_as_half_the_image_is_refused(tmp_path, capsys):
    err = one_line(capsys, ["train", "-c", "digits-lenet", "--set", "data.random_shift=4", "-o", str(tmp_path / "o")])
    assert "data.random_shift=4" in err and "8-px" in err and not (tmp_path / "o").exists()


def test_fp16_autocast_without_loss_scaling_is_warned_about():
    import torch

    from torchboost.recipe.config import build_config
    from torchboost.recipe.run_says import warnings_for

    def warned(train: dict) -> bool:
        return any("float16 autocast without loss scaling" in n
                   for n in warnings_for(build_config({"train": train}), torch.device("cpu"), 1))

    assert warned({"amp_dtype": "float16"}) and warned({"amp_level": "O3", "amp_dtype": "float16"})
    assert not warned({"amp_dtype": "float16", "loss_scale": "dynamic"})
    assert not warned({"amp_level": "O2", "amp_dtype": "float16"})  # MindSpore's O2 adds dynamic scaling
    assert not warned({"amp_dtype": "bfloat16"}) and not warned({})


@pytest.mark.parametrize("train, want", [
    ({"amp_level": "O0"}, ("none", False, "none")),
    ({"amp_level": "O1"}, ("auto", False, "none")),
    ({"amp_level": "O2", "amp_dtype": "float16"}, ("float16", False, "dynamic")),
    ({"amp_dtype": "float16", "amp_level": "O2"}, ("float16", False, "dynamic")),  # key order does not matter
    ({"amp_level": "O2", "amp_dtype": "bfloat16"}, ("bfloat16", False, "none")),
    ({"amp_level": "O2", "amp_dtype": "float16", "loss_scale": "fixed"}, ("float16", False, "fixed")),
    ({"amp_level": "O3"}, ("auto", True, "none")),
])
def test_mindspore_amp_levels_become_torch_keys(train, want):
    from torchboost.recipe.config import build_config, dump_config

    cfg = build_config({"train": train})
    assert (cfg.train.amp_dtype, cfg.train.cast_network, cfg.train.loss_scale) == want
    assert "amp_level" not in dump_config(cfg) and "pending" not in dump_config(cfg)  # torch's keys only
    # the same keys as separate --set overrides, in either order, and split between recipe and --set
    items = [f"train.{k}={v}" for k, v in train.items()]
    for overrides in (items, items[::-1]):
        cfg = build_config(None, overrides)
        assert (cfg.train.amp_dtype, cfg.train.cast_network, cfg.train.loss_scale) == want, overrides
    first, *rest = train.items()
    cfg = build_config({"train": dict([first])}, [f"train.{k}={v}" for k, v in rest])
    assert (cfg.train.amp_dtype, cfg.train.cast_network, cfg.train.loss_scale) == want


@pytest.mark.slow
def test_a_batch_larger_than_the_data_is_one_batch_per_epoch(tmp_path, capsys):
    data = make_folder(tmp_path / "d")  # 18 training images (a folder's own batch would be 16: asked for here)
    assert main(["train", "--data", str(data), *QUIET, "--epochs", "2", "-b", "64", "-o", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "note: data.batch_size=64 is larger than the 18 training images there are: each epoch is one batch of 18" in out
    assert yaml.safe_load((tmp_path / "o" / "config.yaml").read_text())["data"]["batch_size"] == 18
    # one update per epoch: checkpoints are named PREFIX-EPOCH_STEP
    assert sorted(p.name for p in (tmp_path / "o" / "ckpt").glob("*-?_*.pt")) == ["resnet20-1_1.pt", "resnet20-2_1.pt"]
    assert main(["train", "--force", "--resume", str(tmp_path / "o"), *QUIET, "--epochs", "3"]) == 0  # the recorded batch resumes
    assert (tmp_path / "o" / "ckpt" / "resnet20-3_1.pt").is_file()


def test_fewer_than_two_images_per_process_is_refused():
    cfg = build_config()
    assert fit_batch(cfg, 64, 1) == (cfg, None)  # a full batch: unchanged, drop_last does the rest
    with pytest.raises(DataError, match="3 training image\\(s\\) for 2 process\\(es\\): each process needs at least 2"):
        fit_batch(cfg, 3, 2)
    fitted, note = fit_batch(cfg, 40, 2)
    assert fitted.data.batch_size == 20 and "larger than the 20 training images of each process" in note


@pytest.mark.slow
def test_fine_tuning_a_mindspore_resnet_checkpoint_onto_a_folder(tmp_path, capsys):
    """The README's fine-tuning workflow with a framework's file: a 10-class ResNet-18 in MindSpore's .ckpt
    (MindSpore names) onto a 3-class RGB folder: names mapped, head re-initialised, backbone frozen for
    epoch 1, the head at 10x the lr."""
    import torch

    from torchboost.models import create_model
    from torchboost.train.checkpoint import load_checkpoint

    torch.manual_seed(0)
    src = create_model("resnet18", num_classes=10, in_chans=3)  # the ImageNet stem
    torch.save(src.state_dict(), tmp_path / "src.pt")
    assert main(["convert", str(tmp_path / "src.pt"), str(tmp_path / "resnet18.ckpt"), "--arch", "resnet18"]) == 0
    data = make_folder(tmp_path / "d", size=12, mode="RGB")
    capsys.readouterr()
    argv = ["train", "--data", str(data), "--epochs", "2", "-o", str(tmp_path / "ft"), *QUIET[:4],
            "--set", "model.name=resnet18", "--set", f"train.init_weights={tmp_path / 'resnet18.ckpt'}",
            "--set", "train.freeze_backbone_epochs=1", "--set", "optim.head_lr_mult=10"]
    err = one_line(capsys, argv)  # 12-px images get the small-input stem: the key to change is named
    assert "has a 7x7 stem (conv1) but this resnet18 has a 3x3 one" in err and "model.small_input=false" in err
    assert not (tmp_path / "ft").exists()  # nothing written: the corrected command runs as it is
    assert main([*argv, "--set", "model.small_input=false", "--set", "data.image_size=32"]) == 0
    out = capsys.readouterr().out
    assert "fc.weight, fc.bias re-initialised" in out and "only the head (fc.bias, fc.weight) trains" in out
    first, second = (load_checkpoint(p)["model"] for p in sorted((tmp_path / "ft" / "ckpt").glob("resnet18-*_*.pt")))
    for name in ("conv1.weight", "layer4.1.conv2.weight"):
        assert torch.equal(first[name], src.state_dict()[name])  # loaded through the name map, frozen in epoch 1
        assert not torch.equal(second[name], first[name])  # trained in epoch 2
    assert first["fc.weight"].shape == (3, 512)
    saved = yaml.safe_load((tmp_path / "ft" / "config.yaml").read_text())
    assert saved["optim"]["head_lr_mult"] == 10 and saved["model"]["small_input"] is False


@pytest.mark.parametrize("old, want", [(True, "default"), (False, "none")])
def test_the_earlier_model_compile_key_reads_as_train_compile(old, want):
    from torchboost.recipe.config import build_config, dump_config

    cfg = build_config({"model": {"compile": old}})
    assert cfg.train.compile == want and "compile: " + want in dump_config(cfg)
    assert build_config({"model": {"compile": True}, "train": {"compile": "max-autotune"}}).train.compile == \
        "max-autotune"  # the new key, when given, wins

