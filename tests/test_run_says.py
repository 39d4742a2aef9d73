"""What a run says about itself is what it did: the start-up line, the resolved config, a resume that
changes the schedule, a run stuck at chance, and exports predict cannot run (issue: every number means what
it says). Each test checks the words against an independent computation or the files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from torchboost.cli import main

QUIET = ["--set", "train.progress_bar=false", "--set", "train.log_every=1000"]


def shapes(root: Path, size: int = 40, n: int = 24, mode: str = "RGB") -> Path:
    """An easy 3-class set of small colour images: a bright disc, square or bar on a dark noisy ground."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[:size, :size]
    for split, count in (("train", n), ("val", 8)):
        for k, name in enumerate(("disc", "square", "bar")):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                cy, cx, r = *rng.uniform(size * 0.35, size * 0.65, 2), size * 0.25
                mask = [(yy - cy) ** 2 + (xx - cx) ** 2 < r * r, (abs(yy - cy) < r) & (abs(xx - cx) < r),
                        abs(xx - cx) < r / 3][k]
                a = rng.integers(0, 80, (size, size, 3)).astype(np.float64)
                a[mask] = rng.integers(160, 256, 3)
                Image.fromarray(a.astype(np.uint8), "RGB").convert(mode).save(root / split / name / f"{i}.png")
    return root


@pytest.mark.slow
def test_own_colour_images_first_try_pick_a_model_from_the_data_and_learn(tmp_path, capsys):
    data = shapes(tmp_path / "d", n=64)
    out = tmp_path / "run"
    # the default command on a short schedule: at the folder's batch (16: 12 updates an epoch) resnet20 learns
    # these within its first epochs (benchmarks/zoo_defaults.py measures the 15-epoch default's first epochs)
    assert main(["train", "--data", str(data), "--epochs", "4", "-o", str(out), *QUIET]) == 0
    said = capsys.readouterr().out
    assert "model resnet20, chosen from the data (the sampled images are at most 40 px, 3 channel(s)" in said
    assert "training resnet20 (3 classes, 3 channel(s), 40×40 px input)" in said
    assert f"evaluated on {data / 'val'} (folder): 24 images, shorter side resized to 40 px, the centre 40×40" in said
    rows = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert rows[-1]["val_top_1_accuracy"] >= 0.8  # chance is 1/3 (where the MNIST CNN stayed)
    assert "warning: validation top-1" not in said
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["output"] == str(out) and cfg["model"]["name"] == "resnet20" and cfg["data"]["crop_pct"] == 1.0


def test_a_run_at_chance_says_so_once_with_a_fix_for_its_network(tmp_path, capsys):
    data = shapes(tmp_path / "d", n=8)
    # the MNIST CNN at 100x the lr: its loss diverges whatever the draws; the warning names the lr and a BatchNorm
    # network (at 10x it diverged or stalled at chance, as the shifts fell)
    assert main(["train", "--data", str(data), "--set", "model.name=mnist_cnn", "--lr", "5", "--epochs", "3",
                 "-o", str(tmp_path / "run"), *QUIET]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning: validation top-1")]
    assert len(lines) == 1 and "chance for 3 classes" in lines[0] and "--lr 0.5" in lines[0]
    assert "mnist_cnn has no BatchNorm" in lines[0] and "model.name=resnet20" in lines[0] and " -b " not in lines[0]


def test_validation_at_chance_while_training_learns_names_batchnorm_and_a_fix_that_works(tmp_path, capsys):
    """Issue 55's MobileNetV3 (BatchNorm momentum 0.01, few updates) without its folder setting: training top-1
    rises, validation sits at chance; the warning says why and the fix it names (train.precise_bn) is the
    setting tests/test_zoo_defaults.py measures it learning with. Too few updates an epoch are said first."""
    from test_zoo_generator import make_colours

    data = make_colours(tmp_path / "d", train=32, val=8)
    assert main(["train", "--data", str(data), "--set", "model.name=mobilenet_v3_small", "--set",
                 "train.precise_bn=0", "--epochs", "2", "-b", "16", "-o", str(tmp_path / "run"), *QUIET]) == 0
    said = capsys.readouterr().out
    few = [line for line in said.splitlines() if line.startswith("warning: 6 update(s) per epoch are few")]
    assert len(few) == 1 and "96 training images are too few for 10 batches of 16" in few[0]
    lines = [line for line in said.splitlines() if line.startswith("warning: validation top-1")]
    assert len(lines) == 1 and "while training top-1 reached" in lines[0], said
    assert "--set train.precise_bn=10" in lines[0] and "--lr" not in lines[0]


def test_the_start_up_line_names_what_trains_how(tmp_path, capsys):
    """Issue 55: the optimizer and its lr, the augmentation, averaging, TTA and the thread count, as they ran."""
    from test_zoo_generator import make_colours

    data = make_colours(tmp_path / "d")
    assert main(["train", "--data", str(data), "--epochs", "1", "-b", "4", "--threads", "1", "--set",
                 "optim.name=adamw", "--set", "optim.momentum=null", "--lr", "0.002", "--set", "train.ema.enabled=true", "--set", "train.ema.decay=0.99",
                 "--set", "eval.tta=flip", "--set", "data.random_erasing=0.25", "-o", str(tmp_path / "run"),
                 *QUIET]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("training "))
    assert line.endswith("3 updates/epoch, optimizer adamw, lr 0.002, augmentation shift ±2 px + "
                         "random erasing 0.25, averaging EMA 0.99, TTA flip, 1 thread(s)"), line


def test_a_folder_run_is_named_after_its_model_and_folder_not_the_default_recipe(tmp_path):
    """Issue 55: every run without -c was filed under MLflow experiment (and folder) "mnist-lenet"."""
    from test_zoo_generator import make_colours
    from torchboost.recipe.callbacks import mlflow_logger
    from torchboost.recipe.load import recipe_with_data
    from torchboost.train.callbacks import ModelCheckpoint

    data = make_colours(tmp_path / "my photos!")
    cfg, overrides, note = recipe_with_data("mnist-lenet", ["train.loggers=[mlflow]"], str(data), choose_model=True)
    assert cfg.name == "resnet20-my-photos" and "name=resnet20-my-photos" in overrides and "runs/resnet20-my-photos" in note
    assert mlflow_logger(cfg, tmp_path / "run", ModelCheckpoint("m", tmp_path / "ckpt")).experiment == cfg.name
    named, _, _ = recipe_with_data("mnist-lenet", ["name=mine"], str(data), choose_model=True)
    assert named.name == "mine"
    recipe, _, _ = recipe_with_data("resnet50-imagenet-sgd", [], str(data))  # a recipe for folders keeps its name
    assert recipe.name == "resnet50-imagenet-sgd"


def test_init_weights_of_a_checkpoint_trains_its_network_when_no_model_is_chosen(tmp_path, capsys):
    """Issue 55: an MNIST-CNN checkpoint (grey, 28 px) as train.init_weights on a folder of 40 px colour images
    picked resnet20 from the data and refused the weights; the checkpoint's network and input are used."""
    from test_zoo_generator import make_colours

    first = tmp_path / "first"
    assert main(["train", "--data", str(make_colours(tmp_path / "a")), "--set", "model.name=mnist_cnn", "--set",
                 "data.channels=1", "--epochs", "1", "-b", "4", "-o", str(first), *QUIET]) == 0
    ckpt = first / "ckpt" / "mnist_cnn-best.pt"
    capsys.readouterr()
    assert main(["train", "--data", str(make_colours(tmp_path / "b", size=40)), "--set", f"train.init_weights={ckpt}",
                 "--epochs", "1", "-b", "4", "-o", str(tmp_path / "second"), *QUIET]) == 0
    said = capsys.readouterr().out
    assert f"model mnist_cnn, the network of train.init_weights {ckpt} (data.channels=1, data.image_size=28" in said
    assert "training mnist_cnn (3 classes, 1 channel(s), 28×28 px input)" in said


def test_a_recipe_for_idx_files_trains_on_an_image_folder_in_one_step(tmp_path, capsys):
    """Issue 55: `-c fashion10k-lenet-thor --data DIR` needed data.dataset=folder and data.train_subset=null, one
    error at a time; its 10,000-image subset is that set's, dropped with a note."""
    from test_zoo_generator import make_colours

    assert main(["train", "-c", "fashion10k-lenet-thor", "--data", str(make_colours(tmp_path / "d")), "--epochs", "1",
                 "-o", str(tmp_path / "run"), *QUIET]) == 0
    said = capsys.readouterr().out
    assert ("training on that image folder (data.dataset=folder) instead of the recipe's fashion_mnist (its "
            "data.train_subset=10000 dropped: that set's)") in said
    cfg = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert cfg["name"] == "fashion10k-lenet-thor" and cfg["data"]["train_subset"] is None  # a recipe keeps its name


def test_photos_between_65_and_223_px_train_at_their_native_size(tmp_path):
    """Issue 55: 100 px photos trained upscaled to 224 (15 s a step on one thread)."""
    from test_zoo_generator import make_colours

    from torchboost.recipe.load import load_resolved, recipe_with_data

    data = make_colours(tmp_path / "d", size=100, train=2, val=1)
    built, _, note = recipe_with_data("mnist-lenet", [], str(data), choose_model=True)
    assert "the sampled images reach 100 px, 3 channel(s) (0 grey / 6 colour sampled): resnet18 at 100 px, their " \
           "native size" in note
    cfg, _, _ = load_resolved(built=built)
    assert (cfg.model.name, cfg.data.image_size, cfg.model.small_input, cfg.data.crop_pct) == ("resnet18", 100, False, 1.0)
    for model in ("mobilenet_v3_small", "convnext_tiny"):  # a chosen model: the same size
        built, _, _ = recipe_with_data("mnist-lenet", [f"model.name={model}"], str(data), choose_model=True)
        assert load_resolved(built=built)[0].data.image_size == 100


@pytest.mark.parametrize("results, steps, says", [
    ({"val_loss": 7.7e6}, 40, "the loss diverged (validation loss 7.7e+06): lower the lr (--lr 0.005)"),
    ({"val_loss": float("nan")}, 40, "the loss diverged"),
    ({"val_loss": 1.1}, 3, "3 update(s) an epoch are too few to learn from: use a smaller batch, e.g. -b 16"),
    ({"val_loss": 1.1}, 40, "lower the lr (--lr 0.005), and check that each class folder"),
])
def test_the_chance_warning_names_the_cause_it_sees(results, steps, says):
    from torchboost.models import create_model
    from torchboost.recipe.load import load_config
    from torchboost.recipe.run_says import chance_advice

    cfg = load_config("mnist-lenet", ["model.name=resnet20", "model.num_classes=3"])
    advice = chance_advice(cfg, create_model("resnet20", 3), 0.05, steps, 640)(results)
    assert advice.startswith(says), advice


def test_chance_rule_against_the_binomial_bound():
    from torchboost.train.callbacks import ChanceMonitor

    m = ChanceMonitor(10, "fix")
    se = math.sqrt(0.1 * 0.9 / 1000)
    assert m.at_chance(0.1 + 1.9 * se, None, 1000) and not m.at_chance(0.1 + 2.1 * se, None, 1000)
    assert m.at_chance(0.9, math.log(10) * 1.01, 1000)  # the uniform prediction's loss
    assert not m.at_chance(0.9, math.log(10) * 0.9, 1000)


def cosine(lr: float, lr_init: float, total: int, warmup: int) -> list[float]:
    """The recipe's warm-up + cosine, written out: linear from lr_init to lr over `warmup`, then to 0."""
    out = []
    for i in range(total):
        if i < warmup:
            out.append(lr_init + (lr - lr_init) * i / warmup)
        else:
            out.append(0.5 * lr * (1 + math.cos(math.pi * (i - warmup) / max(total - warmup, 1))))
    return out


def test_a_resume_that_changes_the_schedule_is_refused_then_states_its_lr(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "-c", "digits-lenet", "--epochs", "2", "-b", "256", "-o", str(out), *QUIET]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--epochs", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "train.epochs=4 recomputes the lr schedule" in err
    assert "--force" in err
    assert main(["train", "--resume", str(out), "--epochs", "4", "--force", *QUIET]) == 0
    said = capsys.readouterr().out
    line = next(s for s in said.splitlines() if s.startswith("resume: the lr schedule changed"))
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    steps = 1437 // 256  # digits' training split, full batches: the updates of an epoch
    s = cfg["schedule"]
    new = cosine(cfg["optim"]["lr"], s["lr_init"], 4 * steps, int(s["warmup_epochs"] * steps))
    old = cosine(cfg["optim"]["lr"], s["lr_init"], 2 * steps, int(s["warmup_epochs"] * steps))
    assert f"update {2 * steps + 1} continues at lr {new[2 * steps]:.4g}" in line
    assert f"the checkpoint's last update took lr {old[-1]:.4g}" in line
    rows = [json.loads(r) for r in (out / "history.jsonl").read_text().splitlines()]
    assert rows[2]["lr"] == pytest.approx(new[3 * steps - 1])  # what the third epoch really ran at its end


@pytest.mark.parametrize("suffix, loader", [(".ts", "torch.jit.load"), (".pt2", "torch.export.load")])
def test_predict_refuses_torch_exports_as_the_guide_says(tmp_path, capsys, suffix, loader):
    out = tmp_path / "run"
    assert main(["train", "-c", "digits-lenet", "--epochs", "1", "-b", "512", "-o", str(out), *QUIET]) == 0
    model = tmp_path / f"m{suffix}"
    assert main(["export", str(out / "ckpt" / "mnist_cnn-best.pt"), str(model)]) == 0
    Image.new("L", (8, 8)).save(tmp_path / "x.png")
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(model), str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "eval and predict do not run" in err and loader in err and "compressed" not in err
    guide = (Path(__file__).parents[1] / "docs" / "guide" / "around-training.md").read_text()
    assert "It refuses `.pt2` and\n`.ts` exports" in guide and loader in guide


@pytest.mark.parametrize("model, images, advice", [
    ("resnet20", 100, "race on more data"),  # 10 batches would be under 16 images: never -b 8 for BatchNorm
    ("resnet20", 200, "-b 16"),
    ("resnet20", 2000, "-b 32"),
    ("mnist_cnn", 200, "-b 4"),  # no BatchNorm: a small batch is fine
])
def test_a_race_suggests_only_batches_its_network_can_take(model, images, advice):
    from torchboost.recipe.load import load_config
    from torchboost.race.lanes import race_setup

    cfg = load_config("mnist-lenet", [f"model.name={model}", "data.batch_size=256"])
    _, lines = race_setup("mnist-lenet", cfg, images, 2)
    warning = next(line for line in lines if line.startswith("warning:"))
    assert advice in warning
    if model == "resnet20":
        assert all(f"-b {b} " not in warning for b in (2, 4, 8))


def test_the_optimizer_guide_says_where_it_recommends_an_optimizer_that_it_cannot_be_resumed():
    """Issue 55: the guide recommends SOAP, which `--resume` refuses; only the race guide said so."""
    from torchboost.optim.registry import get_optimizer, list_optimizers

    guide = (Path(__file__).parents[1] / "docs" / "guide" / "choose-optimizer.md").read_text()
    table = [line for line in guide.splitlines() if line.startswith("| ") and "`" in line.split("|")[2]]
    for row in table:
        name = row.split("|")[2].split("`")[1]
        if name in list_optimizers() and not get_optimizer(name).resumable:
            assert "cannot be resumed" in row, row
    assert "SOAP's runs cannot be resumed" in guide and "train.init_weights" in guide
