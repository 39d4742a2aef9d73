"""README.md as a new user meets it: every code block and command is extracted from the file and run
(in a fresh folder), and the documented claims are asserted. Blocks that need what a test cannot have
(ImageNet, a GPU cluster, the user's MindSpore/Paddle files, `make` itself) are listed with the reason and
the test that covers them instead."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from torchboost.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"

# Commands that need something a test cannot have, and where their path is covered.
NOT_RUN = {
    "make ": "the Makefile itself is what CI runs",
    "torchrun": "multi-process: tests/test_dist.py and tests/test_reliability_dist.py launch gloo ranks",
    "/data/imagenet": "needs ImageNet; the folder path is tested on generated folders (tests/test_recipe_data.py)",
    "resnet50.ckpt": "needs a MindSpore checkpoint: tests/test_migrate_real_clients.py uses real-framework fixtures",
    "resnet50.pt": "needs a converted MindSpore checkpoint: tests/test_migrate_real_clients.py",
    "resnet50.pdparams": "needs a paddle.vision checkpoint: tests/test_migrate_real_clients.py",
    "mnist.pdparams": "needs the user's Paddle file: tests/test_migrate_pdparams.py reads a real-Paddle fixture",
    "mnist.pt": "follows from mnist.pdparams (above)",
    "my.yaml": "a placeholder for the user's own recipe and reference model",
    "dump_from_mindspore": "needs a dump written by another framework",
    "lr-find --optimizers sgd adamw muon": "the same sweep as docs/guide/around-training.md's: tests/test_lr_find.py "
                                           "runs it once and checks its figures (one run of the suite's costliest "
                                           "sweep, not two)",
}


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def commands() -> list[str]:
    """Every `torchboost ...` line of the bash blocks (continuations joined, comments dropped)."""
    out = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].split(" # ")[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def skip_reason(cmd: str) -> str | None:
    return next((why for key, why in NOT_RUN.items() if key in cmd), None)


def run_example(epochs: int, seed: int) -> float:
    """The first Python block with its EPOCHS and SEED set; returns its test top-1."""
    example = blocks("python")[0]
    assert "EPOCHS, SEED = 15, 0" in example
    scope: dict = {}
    exec(compile(example.replace("EPOCHS, SEED = 15, 0", f"EPOCHS, SEED = {epochs}, {seed}"), "README.md", "exec"),
         scope)
    return scope["model"].eval(scope["test"])["top_1_accuracy"]


@pytest.mark.parametrize("seed", [1])
@pytest.mark.slow
def test_python_example_is_the_cli_job_written_out(seed, tmp_path, monkeypatch, capsys):
    """The same data, network, optimizer (the fused SGD kernel the CLI builds), schedule and seed as
    `torchboost train`: the same weights, so the same accuracy exactly, as the README says (3-epoch runs: the
    schedule is the job's, shortened alike on both sides). With the CLI job's 15-epoch accuracy checked against the
    README's "≥ 96.5%" (`test_every_command_runs_in_a_fresh_folder`), this is the example's accuracy too: one seed
    (not 0, the job's own) is enough, since the seed changes no code path."""
    import json

    assert "so it\nreaches exactly the same accuracy" in README.read_text()
    monkeypatch.chdir(tmp_path)
    ours = run_example(1, seed)
    capsys.readouterr()
    assert main(["train", "--epochs", "1", "--set", f"train.seed={seed}", "--set", "train.progress_bar=false",
                 "-o", str(tmp_path / "cli")]) == 0
    cli = json.loads((tmp_path / "cli" / "history.jsonl").read_text().splitlines()[-1])["val_top_1_accuracy"]
    assert ours == cli, (seed, ours, cli)


def test_the_guide_holds_the_custom_step_and_thor_examples():
    """The README keeps the default job; the custom step, callback/hook and THOR examples moved to the guide,
    whose every Python block tests/test_docs_site.py runs."""
    guide = README.parent / "docs" / "guide"
    api, choose = (guide / "python-api.md").read_text(), (guide / "choose-optimizer.md").read_text()
    assert "(TrainStep):" in api and "(StepHook):" in api and "THOR(model" in choose
    assert len(blocks("python")) == 1


@pytest.mark.slow
def test_every_command_runs_in_a_fresh_folder(tmp_path, monkeypatch, capsys):
    """In README order, as a new user would type them; each must exit 0 (the race and train lines are
    the documented ones, epochs included)."""
    monkeypatch.chdir(tmp_path)
    ran, skipped = [], []
    for cmd in commands():
        why = skip_reason(cmd)
        if why or not cmd.startswith("torchboost"):
            skipped.append((cmd, why))
            continue
        argv = shlex.split(cmd)[1:]
        if argv[:1] == ["train"] and "train.progress_bar=false" not in cmd:
            argv += ["--set", "train.progress_bar=false"]
        code = main(argv)
        out = capsys.readouterr()
        if "--reference-set optim.lr" in cmd:  # the planted difference align must find
            assert code == 1 and "first divergence at update" in out.out, (cmd, out.out[-2000:])
            ran.append(cmd)
            continue
        assert code == 0, (cmd, out.err[-2000:])
        ran.append(cmd)
        if cmd == "torchboost train":  # the default job's documented claims
            acc = float(out.out.split("final: top-1 ")[1].split(",")[0])
            assert "(≥ 96.5% test top-1 after 15 epochs;" in README.read_text()  # the example's claim, this job's run
            assert acc >= 0.965 and "epoch: 1 step: 25, loss is" in out.out  # MindSpore's LossMonitor line
            files = {p.name for p in (tmp_path / "runs/mnist-lenet").iterdir()}
            assert {"config.yaml", "history.jsonl", "history.csv", "history.png", "ckpt"} <= files
            ckpts = sorted(p.name for p in (tmp_path / "runs/mnist-lenet/ckpt").iterdir())
            assert ckpts == ["mnist_cnn-13_62.pt", "mnist_cnn-14_62.pt", "mnist_cnn-15_62.pt", "mnist_cnn-best.pt"]
            assert main(["train", "--set", "train.progress_bar=false"]) == 2  # run again: refused, not lost
            assert "--overwrite" in capsys.readouterr().err
        if "--data data/mnist5k" in cmd:  # the same digits as PNGs: augmentation follows the 28-px model
            acc = float(out.out.split("final: top-1 ")[1].split(",")[0])
            saved = yaml.safe_load((tmp_path / "runs/mnist-folder/config.yaml").read_text())["data"]
            assert saved["augment"] == "shift" and acc >= 0.93  # shifts, no ImageNet crops (those gave 76%)
    assert len(ran) >= 8, ran
    assert all(why for _, why in skipped if _.startswith("torchboost") or _.startswith(("make", "torchrun")))
