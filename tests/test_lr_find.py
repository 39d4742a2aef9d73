"""The lr range test (torchboost lr-find, race --lr-find): the sweep's lrs, the suggestion against a formula, the
divergence stop, the CLI's outputs and refusals, and the race's grid centred on the suggestion."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from bounded import within
from torchboost.cli import main
from torchboost.errors import ConfigError
from torchboost.recipe.lr_find import centred_grid, format_results
from torchboost.train.lr_find import NEVER_FELL, find_lr, lr_find_figure, lr_sweep, steepest_lr
from torchboost.train.step import TrainStep
from train_tiny import batches, tiny_net

ROOT = Path(__file__).resolve().parents[1]


def test_the_steepest_fall_of_a_known_curve():
    """loss(x) = 2 - tanh((x - x0) / w) over x = log(lr) falls fastest at x0 (its derivative -sech^2 / w is
    most negative there): the suggestion is the sweep's lr nearest e^x0."""
    lrs = np.geomspace(1e-6, 1.0, 300)
    for x0 in (math.log(1e-4), math.log(3e-3), math.log(0.05)):
        loss = 2 - np.tanh((np.log(lrs) - x0) / 1.5)
        loss[-20:] += np.linspace(0, 5, 20)  # the climb after divergence is ignored
        got = steepest_lr(lrs, loss)
        assert got == pytest.approx(lrs[np.argmin(abs(np.log(lrs) - x0))], rel=0.05)


def test_no_suggestion_when_the_loss_never_falls():
    lrs = np.geomspace(1e-6, 1.0, 100)
    assert steepest_lr(lrs, np.linspace(2, 3, 100)) is None
    assert steepest_lr(lrs[:3], [2.0, 1.0, 3.0]) is None


def test_the_sweep_sets_each_update_to_its_geometric_lr_and_stops_when_the_loss_diverges():
    net = tiny_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    seen = []
    opt.register_step_pre_hook(lambda o, args, kwargs: seen.append(o.param_groups[0]["lr"]))
    lrs = lr_sweep(1e-4, 1e3, 60)
    assert np.allclose(np.diff(np.log(lrs)), math.log(1e7) / 59)
    result = find_lr(TrainStep(net, nn.CrossEntropyLoss(), opt), batches(4), lrs)
    assert seen == pytest.approx(list(lrs[:len(seen)]), rel=1e-12)
    assert result.lrs == seen and len(result.losses) == len(seen) < 60  # lr 1e3 diverges before the end
    assert "diverged" in result.stopped or "non-finite" in result.stopped
    beta, avg = 0.98, 0.0  # the smoothing: fastai's bias-corrected exponential average
    for k, loss in enumerate(result.losses):
        avg = beta * avg + (1 - beta) * loss
        assert result.smoothed[k] == pytest.approx(avg / (1 - beta ** (k + 1)), rel=1e-9)
    shown_lrs, shown = result.shown()  # the plotted curve: past the average's first 10 updates
    assert shown_lrs == result.lrs[10:] and shown == result.smoothed[10:]
    assert result.min_loss_lr == shown_lrs[int(np.argmin(shown))]
    assert result.suggestion == pytest.approx(result.min_loss_lr / 10)  # a decade below the lowest point


def test_no_suggestion_when_the_sweep_never_lowers_the_loss():
    net = tiny_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    result = find_lr(TrainStep(net, nn.CrossEntropyLoss(), opt), batches(2), lr_sweep(1e3, 1e6, 20))
    assert result.suggestion is None and result.stopped


class ScriptedStep:
    """A stand-in for TrainStep whose losses are given: the sweep's words and plot on a known curve."""

    def __init__(self, losses):
        self.losses, self.lr_schedule = losses, None

    def __call__(self, batches, k):
        return SimpleNamespace(loss=torch.tensor(self.losses[k]))


def plotted(result):
    """(lrs, losses) of the one line lr_find_figure draws for `result`, read back from the figure."""
    fig = lr_find_figure({"sgd": result})
    line = next(l for l in fig.axes[0].get_lines() if not l.get_label().startswith("_"))
    dots = [l for l in fig.axes[0].get_lines() if l.get_marker() == "o"]
    return line, dots


def test_the_words_and_the_suggestion_come_from_the_plotted_curve():
    """A lucky first batch (0.9) under a plateau at 1.2 that falls to 0.7 at the end: the smoothed loss's first
    point (one batch's loss) stays its lowest, so a rule reading the whole series said "never fell" while the
    plot showed the fall. Now the words, the suggestion and its dot are read from the drawn curve itself."""
    losses = [0.9] + [1.2] * 39 + list(np.linspace(1.2, 0.7, 20))
    lrs = lr_sweep(1e-5, 1.0, 60)
    result = find_lr(ScriptedStep(losses), [None], lrs)
    assert int(np.argmin(result.smoothed)) == 0  # the old rule's "never fell"
    line, dots = plotted(result)
    xs, ys = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
    assert ys.min() < ys[0]  # the plot falls below where it starts ...
    assert result.min_loss_lr == xs[np.argmin(ys)] and result.suggestion == pytest.approx(xs[np.argmin(ys)] / 10)
    assert "never fell" not in format_results({"sgd": result}) and line.get_label() == "sgd"  # ... and so say the words
    (dot,) = dots  # the dot sits on the drawn curve at the sweep's lr nearest the suggestion
    i = int(np.argmin(abs(np.log(xs) - math.log(result.suggestion))))
    assert (dot.get_xdata()[0], dot.get_ydata()[0]) == (xs[i], ys[i])
    assert result.to_dict()["shown_from"] == len(lrs) - len(xs) == 10

    rising = find_lr(ScriptedStep([0.5] + [1.0 + 0.01 * k for k in range(59)]), [None], lrs)
    line, dots = plotted(rising)
    ys = np.asarray(line.get_ydata())
    assert ys.min() == ys[0] and rising.suggestion is None and not dots  # a curve that never falls ...
    assert NEVER_FELL in format_results({"sgd": rising}) and line.get_label() == "sgd (never fell)"  # ... says so


@pytest.mark.parametrize("start, end, updates", [(0.0, 1.0, 100), (1.0, 0.1, 100), (1e-3, float("inf"), 100),
                                                 (1e-5, 1.0, 5)])
def test_a_bad_sweep_is_refused(start, end, updates):
    with pytest.raises(ConfigError):
        lr_sweep(start, end, updates)


def test_a_race_grid_is_centred_on_the_suggestion_with_its_ratios_kept():
    centre = (0.01 * 0.02 * 0.05) ** (1 / 3)  # the grid's geometric mean moves onto the suggestion
    assert centred_grid((0.01, 0.02, 0.05), 0.1) == pytest.approx([g * 0.1 / centre for g in (0.01, 0.02, 0.05)],
                                                                  rel=0.01)
    grid = centred_grid((0.001, 0.002, 0.005), 0.0007)
    assert math.exp(np.mean(np.log(grid))) == pytest.approx(0.0007, rel=0.05)


def test_lr_find_cli_writes_the_sweeps_and_the_plot(tmp_path, capsys):
    out = tmp_path / "lf"
    argv = ["lr-find", "-c", "digits-lenet", "--optimizers", "sgd", "adamw", "--updates", "40", "-o", str(out)]
    with within(240, argv):
        assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "suggested lr" in printed and "sgd" in printed and "adamw" in printed
    saved = json.loads((out / "lr-find.json").read_text())
    assert set(saved["results"]) == {"sgd", "adamw"} and saved["settings"]["updates"] == 40
    for r in saved["results"].values():
        assert r["lrs"] == pytest.approx(list(np.geomspace(1e-6, 1.0, 40)[:len(r["lrs"])]))
    assert (out / "lr-find.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("extra, words", [(["--start", "0"], "finite number > 0"),
                                          (["--start", "nan"], "finite number > 0"),
                                          (["--start", "1", "--end", "0.1"], "increasing range"),
                                          (["--updates", "3"], "--updates"),
                                          (["--optimizers", "sgdd"], "sgdd")])
def test_lr_find_refuses_bad_arguments_in_one_line(tmp_path, capsys, extra, words):
    argv = ["lr-find", "-c", "digits-lenet", "--updates", "20", "-o", str(tmp_path / "o"), *extra]
    with within(120, argv):
        assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and words in err, err


def test_lr_find_never_writes_through_a_link_out_of_its_folder(tmp_path, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "lf"
    out.mkdir()
    os.symlink(outside / "planted.json", out / "lr-find.json")
    argv = ["lr-find", "-c", "digits-lenet", "--updates", "20", "-o", str(out)]
    with within(120, argv):
        assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert list(outside.iterdir()) == []


@pytest.mark.slow
def test_race_lr_find_races_the_grid_centred_on_each_suggestion(tmp_path, capsys):
    from torchboost.recipe import load_resolved
    from torchboost.recipe.load import recipe_with_data
    from torchboost.recipe.lr_find import lr_find
    from torchboost.recipe.optimizers import race_policy
    from torchboost.recipe.resolve import fit_batch

    argv = ["race", "-c", "digits-lenet", "--optimizers", "sgd", "adamw", "--lr", "adamw=0.001", "--lr-find",
            "--seeds", "1", "--epochs", "1", "--targets", "0.5", "-o", str(tmp_path / "r")]
    with within(300, argv):
        assert main(argv) == 0
    printed = capsys.readouterr().out
    built, _, _ = recipe_with_data("digits-lenet", [], None)
    cfg, train_ds, _ = load_resolved(built=built)
    suggestion = lr_find(fit_batch(cfg, len(train_ds), 1)[0], train_ds, ["sgd"])["sgd"].suggestion
    grid = centred_grid(race_policy("sgd").lr_grid, suggestion)
    assert f"racing {','.join(f'{g:g}' for g in grid)}" in printed
    assert "lr-find: adamw" not in printed  # a grid the user gave is raced as given
    runs = json.loads((tmp_path / "r" / "race.json").read_text())["runs"]
    assert sorted(r["lr"] for r in runs if r["optimizer"] == "sgd") == sorted(grid)
    assert [r["lr"] for r in runs if r["optimizer"] == "adamw"] == [0.001]


@pytest.mark.parametrize("command", [["lr-find", "-c", "digits-lenet", "--updates", "20"],
                                     ["race", "-c", "digits-lenet", "--optimizers", "sgd", "--seeds", "1",
                                      "--epochs", "1"]])
@pytest.mark.parametrize("shape", ["fifo", "file", "dangling"])
def test_an_output_that_is_not_a_folder_is_refused_before_any_work(tmp_path, capsys, monkeypatch, command, shape):
    def no_work(*args, **kwargs):
        raise AssertionError("work started before the output folder was checked")

    monkeypatch.setattr("torchboost.recipe.lr_find.find_lr", no_work)
    monkeypatch.setattr("torchboost.race.lanes.Lane.train_epoch", no_work)
    out = tmp_path / "out"
    {"fifo": lambda: os.mkfifo(out), "file": lambda: out.write_text("mine"),
     "dangling": lambda: os.symlink(tmp_path / "gone", out)}[shape]()
    argv = [*command, "-o", str(out)]
    with within(120, argv):
        assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and str(out) in err, err
    assert ("a link to nothing" if shape == "dangling" else "is not a folder") in err


@pytest.mark.slow
def test_the_guides_lr_find_figures_are_what_the_command_prints(tmp_path, capsys):
    """docs/guide/around-training.md quotes the default task's suggestions and shows img/lr-find.png, made from
    img/lr-find.json. What holds on any machine: the quoted figures are the file's (the same file, compared
    exactly), and the command run now, at the file's thread count, suggests within x sqrt(2) of them. Not equal:
    another CPU's kernels (AVX2 against AVX-512) sum in another order, which moves the smoothed loss's lowest point
    by a few sweep steps (x1.072 each; seen: 1-2 on a second machine). x sqrt(2) is 5 steps, half the race grids'
    x2 spacing, the precision `race --lr-find` uses the suggestion at."""
    import json
    import re

    recorded = json.loads((ROOT / "docs" / "guide" / "img" / "lr-find.json").read_text())
    guide = (ROOT / "docs" / "guide" / "around-training.md").read_text()
    said = guide[guide.index("On the default task"):guide.index("on the machine that made the plot")]
    quoted = dict(re.findall(r"(SGD|AdamW|Muon) (0\.\d+)", said))
    pairs = (("SGD", "sgd"), ("Muon", "muon"), ("AdamW", "adamw"))
    for name, key in pairs:  # the words are the plot's data
        assert f"{recorded['results'][key]['suggestion']:.2g}" == quoted[name], (name, quoted[name])
    threads = recorded["settings"]["threads"]
    assert main(["lr-find", "--optimizers", "sgd", "adamw", "muon", "--threads", str(threads),
                 "-o", str(tmp_path / "lf")]) == 0
    ran = json.loads((tmp_path / "lf" / "lr-find.json").read_text())["results"]
    for name, key in pairs:
        ratio = ran[key]["suggestion"] / recorded["results"][key]["suggestion"]
        assert 2 ** -0.5 <= ratio <= 2 ** 0.5, (name, ran[key]["suggestion"], quoted[name])
