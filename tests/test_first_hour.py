"""A newcomer's first hour: each mistake reproduced, and the one-line error or the corrected behaviour
asserted (the README walk itself is tests/test_readme.py)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import yaml
from PIL import Image

from torchboost.cli import main
from torchboost.recipe.load import load_config, load_resolved
from torchboost.recipe.build import effective_lr
from torchboost.recipe.resolve import fit_batch
from torchboost.recipe.run_says import describe_run, warnings_for

QUIET = ["--set", "train.progress_bar=false", "--set", "train.log_every=1000"]
README = Path(__file__).resolve().parents[1] / "README.md"


def one_line(capsys, code: int) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err, (code, err)
    return err


def rgb_folder(root: Path, classes=("a", "b", "c"), size=16) -> Path:
    for split in ("train", "val"):
        for k, c in enumerate(classes):
            (root / split / c).mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (size, size), color=(60 * k, 20 * i, 100)).save(root / split / c / f"{i}.png")
    return root


def test_data_with_a_builtin_recipe_trains_on_the_folder_and_says_so(tmp_path, capsys):
    root = rgb_folder(tmp_path / "imgs")
    assert main(["train", "--data", str(root), "--epochs", "1", "-b", "4", "-o", str(tmp_path / "run"), *QUIET]) == 0
    out = capsys.readouterr().out
    assert "training on that image folder (data.dataset=folder) instead of the recipe's built-in mnist5k" in out
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["data"]["dataset"] == "folder" and saved["data"]["path"] == str(root)
    assert (saved["model"]["num_classes"], saved["model"]["in_chans"]) == (3, 3)  # from the folder, not the recipe


def test_num_classes_has_one_home_and_comes_from_the_data(tmp_path, capsys):
    err = one_line(capsys, main(["train", "--set", "data.num_classes=3"]))
    assert "did you mean 'model.num_classes'" in err
    root = rgb_folder(tmp_path / "imgs")
    cfg, train, _ = load_resolved("resnet50-imagenet-sgd", [f"data.path={root}"])
    assert cfg.model.num_classes == 3 and cfg.model.in_chans == 3  # not a silent 1000-way head
    err = one_line(capsys, main(["train", "-c", "resnet50-imagenet-sgd", "--data", str(root),
                                 "--set", "model.num_classes=1000", "-o", str(tmp_path / "r")]))
    assert "model.num_classes=1000 but the training data has 3 classes" in err


@pytest.mark.slow
def test_eval_on_data_with_other_classes_is_refused(digits_run, tmp_path, capsys):
    root = rgb_folder(tmp_path / "imgs")
    err = one_line(capsys, main(["eval", "--checkpoint", str(digits_run / "ckpt/mnist_cnn-best.pt"),
                                 "--data", str(root)]))
    assert "the data has 3 classes" in err and "predicts 10" in err  # not "top-1 0.0000" and exit 0


def test_imagenet_crops_on_a_folder_are_there_when_asked_for(tmp_path):
    """Folder augmentation follows the model (28-px digits get shifts, no ImageNet crops: the README's MNIST-PNG
    run, tests/test_readme.py, trains to ≥ 93% that way), and the crops stay configurable when wanted."""
    root = rgb_folder(tmp_path / "imgs")
    cfg = load_config(None, ["data.dataset=folder", f"data.path={root}", "data.augment=imagenet",
                             "data.rrc_scale=[0.5, 1.0]"])
    assert cfg.data.augment == "imagenet" and cfg.data.rrc_scale == [0.5, 1.0]


def test_resnet_recipe_on_a_small_folder(tmp_path, capsys, monkeypatch):
    root = rgb_folder(tmp_path / "imgs")
    cfg, train, evalset = load_resolved("resnet50-imagenet-sgd", [f"data.path={root}"])
    fitted, note = fit_batch(cfg, len(train), 1)  # the batch of 256 becomes the 12 images, and lr follows it
    assert note == "data.batch_size=256 is larger than the 12 training images there are: each epoch is one batch of 12"
    assert fitted.data.batch_size == 12 and effective_lr(fitted, 1) == pytest.approx(0.256 * 12 / 256)
    cfg, train, evalset = load_resolved("resnet50-imagenet-sgd", [f"data.path={root}", "data.batch_size=4"])
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr("torchboost.recipe.run_says.cpu_has_bf16", lambda: False)
    notes = " ".join(warnings_for(cfg, __import__("torch").device("cpu"), 1))
    assert "data.workers=8 on 2 CPU cores" in notes and "bf16, which this CPU lacks" in notes
    line = describe_run(cfg, train, evalset, __import__("torch").device("cpu"), 1, 3, 0.004)
    assert "optim.lr 0.256 per 256 images, scaled to the global batch of 4" in line
    assert cfg.checkpoint.prefix == "resnet50"
    cfg18, _, _ = load_resolved("resnet50-imagenet-sgd", [f"data.path={root}", "model.name=resnet18"])
    assert cfg18.checkpoint.prefix == "resnet18"  # a resnet18 run writes resnet18-*.pt


@pytest.mark.slow
def test_resume_continues_in_its_own_folder_found_by_folder_last_or_auto(tmp_path, capsys):
    """--resume takes a run folder, `last` or `auto` too; a resumed run continues in its own folder (another
    -o is refused, nothing created there) with its own config, and the history continues."""
    a = tmp_path / "a"
    assert main(["train", "-c", "digits-lenet", "--epochs", "1", "-o", str(a), *QUIET]) == 0
    ckpt = a / "ckpt/mnist_cnn-1_44.pt"
    err = one_line(capsys, main(["train", "--epochs", "2", "--resume", str(ckpt), "-o", str(tmp_path / "b")]))
    assert "continues in its own folder" in err and not (tmp_path / "b").exists()
    err = one_line(capsys, main(["train", "--epochs", "2", "--resume", str(a), "--overwrite"]))
    assert "--overwrite replaces one" in err  # not silently ignored
    err = one_line(capsys, main(["train", "--epochs", "2", "--resume", str(a), "--set", "train.seed=3"]))
    assert "train.seed=0" in err and "--force" in err  # the run's own seed; a change is refused
    capsys.readouterr()
    assert main(["train", "--epochs", "2", "--force", "--resume", str(a), *QUIET]) == 0  # the folder: its newest checkpoint
    assert "resume: train.epochs 1 -> 2" in capsys.readouterr().out
    assert main(["train", "-c", "digits-lenet", "--epochs", "3", "-o", str(a), "--force", "--resume", "last", *QUIET]) == 0
    rows = [json.loads(line) for line in (a / "history.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    fresh = tmp_path / "c"  # auto with nothing to continue starts fresh; then it continues
    assert main(["train", "-c", "digits-lenet", "--epochs", "1", "-o", str(fresh), "--resume", "auto", *QUIET]) == 0
    assert main(["train", "-c", "digits-lenet", "--epochs", "1", "-o", str(fresh), "--resume", "auto", *QUIET]) == 2
    assert "nothing left to train" in capsys.readouterr().err
    err = one_line(capsys, main(["train", "-c", "digits-lenet", "--epochs", "1", "--set", "train.seed=5", "-o",
                                 str(fresh), "--resume", "auto"]))
    assert "holds a different run" in err and "train.seed" in err


@pytest.mark.slow
def test_metric_aliases_through_the_recipe(tmp_path, capsys):
    assert main(["train", "-c", "digits-lenet", "--epochs", "1", "--set", "train.metrics=[acc, loss]",
                 "--set", "train.monitor=val_top_1_accuracy", "-o", str(tmp_path / "r"), *QUIET]) == 0
    row = json.loads((tmp_path / "r/history.jsonl").read_text().splitlines()[0])
    assert "val_top_1_accuracy" in row and "val_top_5_accuracy" not in row
    err = one_line(capsys, main(["train", "--set", "train.metrics=[accurcy]"]))
    assert "did you mean 'accuracy'" in err


def test_the_readme_names_only_real_keys_commands_and_recipes():
    """What a newcomer copies from the README and the guide exists: every config key they set or name in prose and
    commands (a renamed key would be refused at the first try, or a section read as a key), every `torchboost`
    subcommand and every shipped recipe. Its Python examples are run by tests/test_readme.py."""
    from torchboost.cli import build_parser
    from torchboost.options import leaf_fields
    from torchboost.recipe.config import Config
    from torchboost.recipe.files import list_recipes

    pages = [README, *sorted((README.parent / "docs" / "guide").glob("*.md"))]  # the README and the user guide
    text = re.sub(r"```python\n.*?```", "", "\n".join(p.read_text() for p in pages), flags=re.S)  # Python: not keys
    code = re.findall(r"```\w*\n(.*?)```", text, flags=re.S) + re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "",
                                                                                                 text, flags=re.S))
    leaves = {key: value for key, _, _, value in leaf_fields(Config())}
    sections = sorted({key.split(".")[0] for key in leaves if "." in key})
    named = set(re.findall(rf"(?<![\w./-])((?:{'|'.join(sections)})\.[a-z_][a-z0-9_.]*[a-z0-9_])(?![\w.(])", text))
    assert {"optim.lr", "data.dataset", "boost.level"} <= named  # the walk sees the keys the README sets

    def real(name: str) -> bool:  # a key, a section of keys, or inside a mapping-valued key (boost.config)
        return name in leaves or any(key.startswith(name + ".") for key in leaves) or any(
            name.startswith(key + ".") and isinstance(value, dict) for key, value in leaves.items())

    assert not [name for name in named if not real(name)], "the docs name config keys that do not exist"
    commands = {m for block in code for m in re.findall(r"(?:^|\s|-m )torchboost ([a-z][a-z-]*)", block, flags=re.M)}
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert {"train", "eval", "predict", "convert"} <= commands
    assert commands <= set(subparsers.choices), commands - set(subparsers.choices)
    recipes = {m for block in code for m in re.findall(r"(?:--config|-c|--reference-config)[ =]([\w.-]+)", block)
               if not m.endswith((".yaml", ".yml")) and not m.isupper()}  # paths and placeholders (RECIPE)
    assert "mnist-lenet" in recipes and recipes <= set(list_recipes()), recipes - set(list_recipes())
