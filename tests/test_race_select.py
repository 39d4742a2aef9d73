"""Select on a validation split, confirm frozen on fresh seeds, pool only like with like (race.select),
and the validation split itself (data.holdout): disjoint, stratified, unaugmented, augmentation streams kept."""

import json

import numpy as np
import pytest
import torch

from torchboost.cli import main
from torchboost.data import build_loader
from torchboost.data.holdout import IndexSubset, holdout_split
from torchboost.data.sampling import SampleIndex
from torchboost.data.tensors import TensorImageDataset
from torchboost.errors import ConfigError
from torchboost.recipe import load_resolved
from torchboost.race.lanes import Lane
from torchboost.race.report import final_note, summarize
from torchboost.race.select import (check_fresh_seeds, check_same_task, finalists, fixed_targets, lanes_of,
                                           fixed_targets_line, pooled_lanes, read_race, selections)


def tensor_set(n=60, shift=0):
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 1, 8, 8), dtype=torch.uint8, generator=g)
    labels = torch.arange(n) % 3
    return TensorImageDataset(images, labels, ["a", "b", "c"], (0.5,), (0.25,), shift=shift)


def test_holdout_is_disjoint_stratified_and_complete():
    train, held = holdout_split(tensor_set(), tensor_set(), 15)
    assert len(train) == 45 and len(held) == 15
    assert set(train.indices) | set(held.indices) == set(range(60)) and not set(train.indices) & set(held.indices)
    assert np.bincount(tensor_set().labels.numpy()[held.indices]).tolist() == [5, 5, 5]  # 5 of each class
    again, _ = holdout_split(tensor_set(), tensor_set(), 15)
    assert (again.indices == train.indices).all()  # the split depends on its own seed only


def test_a_subset_keeps_each_samples_augmentation_stream():
    """A shifted image drawn through the subset is the one the whole set draws for the mapped SampleIndex."""
    full = tensor_set(shift=2)
    sub = IndexSubset(full, [7, 3, 50])
    i = SampleIndex(2, seed=5, epoch=3)
    x, y = sub[i]
    want_x, want_y = full[SampleIndex(50, seed=5, epoch=3)]
    assert torch.equal(x, want_x) and y == want_y
    batch_x, batch_y = sub.__getitems__([SampleIndex(k, 5, 3) for k in range(3)])
    assert torch.equal(batch_x[2], want_x) and batch_y.tolist() == [full.labels[j].item() for j in (7, 3, 50)]
    # the shift is really drawn from the stream: another epoch moves the image
    assert not torch.equal(sub[SampleIndex(2, seed=5, epoch=4)][0], x)


def test_load_resolved_holds_out_unaugmented_training_images():
    cfg, train, held = load_resolved("mnist-lenet", holdout=500)
    assert len(train) == 3500 and len(held) == 500 and cfg.data.random_shift == 2
    plain_cfg, whole, _ = load_resolved("mnist-lenet")
    assert whole.shift == 2 and held.dataset.shift == 0 and train.dataset.shift == 2
    # the held-out images are the training split's own, unshifted, normalised as the evaluation split is
    assert torch.equal(held.dataset.images, whole.images)
    x, _ = next(iter(build_loader(held, 100, False)))
    rows = held.indices[:100].tolist()
    want = (whole.images[rows].float() / 255 - whole.mean[0]) / whole.std[0]
    assert torch.allclose(x, want, atol=1e-5)

def run(name, lr, seed, accs):
    return {"optimizer": name, "lr": lr, "seed": seed, "stopped": "epoch budget",
            "history": [{"epoch": i + 1, "seconds": float(i + 1), "val_top_1_accuracy": a} for i, a in enumerate(accs)]}


def race_json(path, holdout=500, targets=(0.9, 0.95), first_seed=0, seeds=2, runs=None, summary=None):
    """A saved race: its settings and runs (a selection is ranked from the runs; `summary` is what the file
    claims beside them)."""
    runs = [run("sgd", 0.1, 0, [0.5, 0.96])] if runs is None else runs
    data = {"settings": {"recipe": "r", "overrides": [], "targets": list(targets), "holdout": holdout,
                         "first_seed": first_seed, "seeds": seeds, "epochs": 2},
            "summary": summary or {}, "runs": list(runs)}
    path.write_text(json.dumps(data))
    return path


def test_selection_takes_each_optimizers_best_budget_and_lr(tmp_path):
    runs = [run("sgd@8", 0.05, 0, [0.5, 0.92, 0.96, 0.97]),  # 0.9 at 2 s, 0.95 at 3 s
            run("sgd@10", 0.1, 0, [0.5, 0.91, 0.93, 0.94]),  # 0.9 at 2 s, never 0.95: only @8 reaches the high one
            run("sgd@10", 0.2, 0, [0.2, 0.2, 0.2, 0.2]), run("muon", 0.02, 0, [0.96, 0.97])]
    picks = {s.optimizer: s for s in selections(read_race(race_json(tmp_path / "r.json", runs=runs)), "r.json")}
    assert (picks["sgd"].lr, picks["sgd"].epochs, picks["sgd"].racer) == (0.05, 8, "sgd@8")
    assert (picks["muon"].lr, picks["muon"].epochs, picks["muon"].racer) == (0.02, 2, "muon@2")  # the race's epochs


def selection_with_budgets(tmp_path):
    """Raced targets 0.85/0.9; the best rival's final is muon@12's 0.95, so the confirmation's are 0.935/0.947."""
    runs = [run("muon@8", 0.05, 0, [0.80, 0.88, 0.91, 0.92]),  # 0.9 soonest (3 s), never 0.935
            run("muon@12", 0.05, 0, [0.70, 0.80, 0.86, 0.90, 0.93, 0.95]),  # 0.947 at 6 s (its last evaluation)
            run("thor", 0.1, 0, [0.8, 0.9, 0.94, 0.95]),  # 0.935 at 3 s, 0.947 at 4 s
            run("thor[damping_mode=trace]", 0.1, 0, [0.9, 0.95, 0.96, 0.96]),  # 0.947 at 2 s
            run("adamw", 0.01, 0, [0.7, 0.85, 0.9, 0.91]), run("sgd", 0.1, 0, [0.5, 0.6, 0.7, 0.8])]
    return read_race(race_json(tmp_path / "r.json", targets=(0.85, 0.9), runs=runs))


def test_budgets_are_chosen_at_the_confirmations_targets_best_first(tmp_path):
    """muon@8 reaches the raced 90% soonest but stops below the confirmation's 93.5%: choosing it would lose
    Muon the top line by its budget alone. Ranked at the fixed targets, muon@12 is Muon's selection."""
    data = selection_with_budgets(tmp_path)
    assert fixed_targets(summarize(lanes_of(data, "r"), (0.85, 0.9)))["targets"] == [0.935, 0.947]
    assert [s.racer for s in selections(data, "r")] == ["thor[damping_mode=trace]@2", "thor@2", "muon@12",
                                                         "adamw@2", "sgd@2"]


def test_finalists_are_the_best_thor_and_the_best_others_of_the_selection(tmp_path):
    chosen = selections(selection_with_budgets(tmp_path), "r")
    assert [s.racer for s in finalists(chosen, 3)] == ["thor[damping_mode=trace]@2", "muon@12", "adamw@2"]
    assert [s.racer for s in finalists(chosen, 2)] == ["thor[damping_mode=trace]@2", "muon@12"]
    with pytest.raises(ConfigError, match="without a rival"):
        finalists(chosen, 1)
    assert main(["race", "--finalists", "3"]) == 2  # picks among a selection's winners: --frozen is needed


@pytest.mark.parametrize("value", ["0", "1", "-3", "1e9", "nan", "inf", "2.5", "", "x", "0x10", "\u0663", "9" * 400])
def test_a_hostile_finalists_count_is_one_line(tmp_path, capsys, value):
    sel = race_json(tmp_path / "r.json", targets=(0.85, 0.9))
    assert main(["race", "--frozen", str(sel), "--first-seed", "5", "--finalists", value]) == 2
    err = capsys.readouterr().err.strip()
    assert "--finalists" in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_configuration_that_collapsed_after_crossing_the_target_is_not_selected(tmp_path):
    """sgd@8 crossed 95% at 2 s and fell to 33% at the next evaluation; sgd@10 reached it at 3 s and held it.
    By the hold rule only sgd@10 reached it; the summary the file claims (first crossing: sgd@8) is not read."""
    runs = [run("sgd@8", 0.05, 0, [0.5, 0.96, 0.33, 0.33]), run("sgd@10", 0.1, 0, [0.5, 0.8, 0.96, 0.97])]
    claimed = {"chosen_lr": {"sgd@8": 0.05, "sgd@10": 0.1},
               "targets": {t: {"sgd@8": {"median_seconds": 2.0, "median_epochs": 2},
                               "sgd@10": {"median_seconds": 3.0, "median_epochs": 3}} for t in ("0.9", "0.95")}}
    data = read_race(race_json(tmp_path / "r.json", runs=runs, summary=claimed))
    assert [(s.racer, s.lr) for s in selections(data, "r.json")] == [("sgd@10", 0.1)]


@pytest.mark.parametrize("change, message", [
    (dict(holdout=0), "raced on the test split"),
    (dict(runs=[]), "holds no runs"),
    (dict(targets=()), "settings.targets is not a list of 1 to 10 accuracies"),
    (dict(runs=[run("sgd; rm -rf /", 0.1, 0, [0.9])]), "not a registered optimizer"),
    (dict(runs=[run("sgd@0", 0.1, 0, [0.9])]), "not a registered optimizer"),
    (dict(runs=[run("sgd", float("nan"), 0, [0.9])]), "lr is not a finite number > 0"),
    (dict(runs=[run("sgd", True, 0, [0.9])]), "lr is not a finite number > 0"),
    (dict(runs=[run("sgd", -1, 0, [0.9])]), "lr is not a finite number > 0"),
    (dict(runs=[run("sgd", 0.1, 0, [])]), "history is not a list of 1 to"),
])
def test_a_selection_file_that_cannot_be_trusted_is_one_line(tmp_path, change, message):
    path = race_json(tmp_path / "r.json", **change)
    with pytest.raises(ConfigError, match=message):
        selections(read_race(path), str(path))


@pytest.mark.parametrize("content", [b"", b"not json", b"[1, 2]", b'{"settings": {}}', b"\xff\xfe"])
def test_a_file_that_is_not_a_race_is_one_line(tmp_path, content):
    path = tmp_path / "r.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match="not a race result"):
        read_race(path)


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    import os

    fifo = tmp_path / "race.json"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="FIFO|not a regular"):
        read_race(fifo)


def test_confirmation_must_use_fresh_seeds_and_the_same_task(tmp_path):
    data = read_race(race_json(tmp_path / "r.json", first_seed=0, seeds=3))
    with pytest.raises(ConfigError, match="--first-seed 3"):
        check_fresh_seeds(data, "r.json", range(2, 7))
    check_fresh_seeds(data, "r.json", range(3, 8))
    check_same_task(data, "r.json", "r", [])
    for recipe, overrides, what in (("other", [], "recipe"), ("r", ["a=1"], "overrides")):
        with pytest.raises(ConfigError, match=f"selected on {what}"):
            check_same_task(data, "r.json", recipe, overrides)


def test_pooling_needs_every_racer_in_every_file_and_counts_a_run_once(tmp_path):
    """On the test split every file must race every racer; stages of one selection need not."""
    a = race_json(tmp_path / "a.json", runs=[run("sgd", 0.1, 0, [0.5, 0.9]), run("muon", 0.02, 0, [0.6, 0.95])])
    b = race_json(tmp_path / "b.json", runs=[run("sgd", 0.1, 1, [0.4, 0.8]), run("muon", 0.02, 1, [0.7, 0.96]),
                                             run("sgd", 0.1, 0, [0.1, 0.1])])  # seed 0 again: counted once
    lanes = pooled_lanes([a, b])
    assert sorted((l.racer, l.seed) for l in lanes) == [("muon", 0), ("muon", 1), ("sgd", 0), ("sgd", 1)]
    assert next(l for l in lanes if (l.racer, l.seed) == ("sgd", 0)).history[-1]["val_top_1_accuracy"] == 0.9
    tested = [race_json(tmp_path / f"t{i}.json", holdout=0, runs=runs) for i, runs in enumerate((
        [run("sgd", 0.1, 0, [0.5, 0.9]), run("muon", 0.02, 0, [0.6, 0.95])], [run("muon", 0.02, 2, [0.7, 0.97])]))]
    with pytest.raises(ConfigError, match="differ in sgd"):  # a racer raced alone saw another load
        pooled_lanes(tested)
    # stages of one selection race other racers by design (a budget grid, a grid extended at its edge)
    stage = race_json(tmp_path / "c.json", runs=[run("muon", 0.05, 0, [0.7, 0.97])])
    assert sorted((l.racer, l.lr) for l in pooled_lanes([a, stage])) == [("muon", 0.02), ("muon", 0.05), ("sgd", 0.1)]
    other_split = race_json(tmp_path / "d.json", holdout=0, runs=[run("sgd", 0.1, 3, [0.5, 0.9]),
                                                               run("muon", 0.02, 3, [0.6, 0.95])])
    with pytest.raises(ConfigError, match="raced holdout 0"):
        pooled_lanes([a, other_split])


def test_final_accuracy_is_reported_and_says_when_budgets_match():
    def lane(seed, accs, stopped="epoch budget"):
        hist = [{"epoch": i + 1, "seconds": float(i + 1), "val_top_1_accuracy": a} for i, a in enumerate(accs)]
        return Lane("sgd", 0.1, seed, None, None, None, seconds=float(len(accs)), history=hist, stopped=stopped)

    final = summarize([lane(0, [0.5, 0.9, 0.92]), lane(1, [0.5, 0.8, 0.94]), lane(2, [0.6, 0.7, 0.90])],
                      (0.9,))["final"]["sgd"]
    assert final == {"median": 0.92, "lowest": 0.90, "highest": 0.94, "epochs": 3, "whole_budget": True,
                     "stopped": [], "diverged_seeds": []}
    summary = summarize([lane(0, [0.5, 0.95], "reached and held every target")], (0.9,))
    assert summary["final"]["sgd"]["whole_budget"] is False
    assert final_note(summary) == "some runs stopped at the targets: pass --full-budget to compare at matched budgets"
    # a run that diverged under --full-budget: the note says so, and does not ask for the flag the race had
    summary = summarize([lane(0, [0.5, 0.9, 0.92]), lane(1, [0.6, 0.1], "diverged")], (0.9,))
    assert summary["final"]["sgd"]["stopped"] == ["diverged"]
    assert final_note(summary) == ("some runs diverged (a non-finite loss, or back at chance after learning): their "
                                   "final is their last evaluation")
    assert "--full-budget" not in final_note(summary)
    assert "diverged" in fixed_targets_line(fixed_targets(summary))
    # a race file from before the reason was recorded: the old default
    assert final_note(summarize([lane(0, [0.5, 0.95], "")], (0.9,))).startswith("some runs stopped at the targets")


@pytest.mark.slow
def test_select_then_confirm_end_to_end(tmp_path, capsys):
    """A --holdout race never reads the test split; --frozen races only the chosen (lr, budget) per optimizer."""
    sel, conf = tmp_path / "sel", tmp_path / "conf"
    common = ["race", "--config", "digits-lenet", "--set", "data.batch_size=64", "--epochs", "2",
              "--targets", "0.3", "0.6", "--seeds", "2"]
    assert main([*common, "--optimizers", "sgd", "muon", "--lr", "sgd=0.05,0.1", "--lr", "muon=0.02",
                 "--budget", "sgd=1,2", "--holdout", "300", "-o", str(sel)]) == 0
    out = capsys.readouterr().out
    assert "selecting on 300 training samples held out" in out and "(1137 training images)" in out
    data = json.loads((sel / "race.json").read_text())
    assert data["settings"]["holdout"] == 300
    picks = {s.optimizer: s for s in selections(data, "sel")}
    confirm = [t for t in common if t not in ("--targets", "0.3", "0.6")]
    assert main([*confirm, "--frozen", str(sel / "race.json"), "-o", str(conf)]) == 2
    assert "confirm on fresh seeds: --first-seed 2" in capsys.readouterr().err
    assert main([*common, "--frozen", str(sel / "race.json"), "--first-seed", "2", "-o", str(conf)]) == 2
    assert "drop --targets" in capsys.readouterr().err
    assert main([*confirm, "--frozen", str(sel / "race.json"), "--first-seed", "2", "--full-budget", "-o", str(conf)]) == 0
    out = capsys.readouterr().out
    assert "(1137 training images)" in out and "final top-1" in out  # the selection's images: 1437 less 300
    runs = json.loads((conf / "race.json").read_text())["runs"]
    assert {(r["optimizer"], r["lr"]) for r in runs} == {(picks[o].racer, picks[o].lr) for o in ("sgd", "muon")}
    assert {r["seed"] for r in runs} == {2, 3}
    finals = {}  # the targets: the best rival's median final on the test split, by hand, less 1.5 and 0.3 points
    for r in runs:
        finals.setdefault(r["optimizer"], []).append(r["history"][-1]["val_top_1_accuracy"])
    best = max((a + b) / 2 for a, b in finals.values())
    targets = json.loads((conf / "race.json").read_text())["settings"]["targets"]
    assert targets == [round(best - 0.015, 6), round(best - 0.003, 6)]
    assert main([*confirm, "--frozen", str(sel / "race.json"), "--first-seed", "2", "--lr", "sgd=0.1"]) == 2
    assert "--frozen races the optimizers" in capsys.readouterr().err


def test_a_pooled_report_records_every_seed_it_pooled(tmp_path, capsys):
    """Selections raced in two processes, pooled by --report: a confirmation must clear the seeds of both."""
    a = race_json(tmp_path / "a.json", first_seed=0, seeds=1, runs=[run("sgd", 0.1, 0, [0.5, 0.96])])
    b = race_json(tmp_path / "b.json", first_seed=4, seeds=1, runs=[run("sgd", 0.1, 4, [0.5, 0.97])])
    assert main(["race", "--report", str(a), str(b), "-o", str(tmp_path / "pooled")]) == 0
    out = capsys.readouterr().out
    assert "sgd" in out  # and what was raced (issue 55): the file records no batch, and says so
    assert "raced recipe r (overrides []): batch unrecorded, unrecorded updates/epoch, 2 epochs, seeds 0, 4 (2 file(s))" \
        in out
    pooled = read_race(tmp_path / "pooled" / "race.json")
    assert (pooled["settings"]["first_seed"], pooled["settings"]["seeds"]) == (0, 5)
    with pytest.raises(ConfigError, match="--first-seed 5"):
        check_fresh_seeds(pooled, "pooled", range(3, 6))
    assert [s.lr for s in selections(pooled, "pooled")] == [0.1]


def test_a_variant_racer_is_the_config_train_would_run():
    """`sgd[weight_norm=pin]`: the optim key set for that racer only; a BatchNorm-fed conv keeps its norm."""
    from torchboost.recipe.build import build_model
    from torchboost.race.lanes import variant_racer

    cfg, _, _ = load_resolved("resnet20-mnist5k")
    pinned, plain = variant_racer("sgd[weight_norm=pin]", cfg, (0.1,)), variant_racer("sgd", cfg, (0.1,))
    assert (pinned.name, pinned.lrs, plain.name) == ("sgd[weight_norm=pin]", (0.1,), "sgd")
    norms = []
    for racer in (pinned, plain):
        torch.manual_seed(0)
        model = build_model(cfg)
        conv = model.conv1.weight if hasattr(model, "conv1") else next(m.weight for m in model.modules()
                                                                       if isinstance(m, torch.nn.Conv2d))
        before = conv.norm().item()
        opt = racer.build(model, 0.5, 10, 2)
        model(torch.randn(4, 1, 28, 28)).square().mean().backward()
        opt.step()
        norms.append((before, conv.norm().item()))
    assert norms[0][1] == pytest.approx(norms[0][0], rel=1e-5)  # pinned
    assert norms[1][1] != pytest.approx(norms[1][0], rel=1e-5)  # the plain racer's moved
    assert cfg.optim.weight_norm == "none"  # the race's config is untouched
    with pytest.raises(ConfigError, match="not one of none, pin"):
        variant_racer("sgd[weight_norm=pinned]", cfg)
    with pytest.raises(ConfigError, match="not NAME"):
        variant_racer("sgd[weight_norm=pin", cfg)
    for key in ("lr=1", "name=thor"):  # set by the race for every lane: a variant's value would be overruled
        with pytest.raises(ConfigError, match="which the race sets"):
            variant_racer(f"sgd[{key}]", cfg)


def test_when_no_lr_reaches_a_target_the_one_that_learned_most_is_chosen():
    """Not the first of the grid: an lr that diverged to chance must not stand for the optimizer."""
    def lane(lr, seed, accs):
        hist = [{"epoch": i + 1, "seconds": float(i + 1), "val_top_1_accuracy": a} for i, a in enumerate(accs)]
        return Lane("sgd", lr, seed, None, None, None, seconds=float(len(accs)), history=hist)

    lanes = [lane(0.1, s, [0.1, 0.1]) for s in (0, 1)] + [lane(0.02, s, [0.8, 0.9 + s / 100]) for s in (0, 1)]
    summary = summarize(lanes, (0.97, 0.98))
    assert summary["chosen_lr"]["sgd"] == 0.02
    assert summary["targets"]["0.97"]["sgd"]["median_best"] == pytest.approx(0.905)


def test_a_confirmation_on_a_folder_reads_test_and_every_figure_names_it(tmp_path, capsys):
    """A folder with val/ (6 images) and test/ (9): --frozen confirms on test/ — every accuracy a multiple of
    1/9, the live lines, the table, race.json and the plot title name it — and a folder without test/ is
    refused in one line."""
    import numpy as np
    from PIL import Image

    root = tmp_path / "d"
    rng = np.random.default_rng(0)
    for split, n in (("train", 16), ("val", 2), ("test", 3)):
        for k in range(3):
            (root / split / f"c{k}").mkdir(parents=True)
            for i in range(n):
                a = rng.normal(40 + 80 * k, 15, (8, 8)).clip(0, 255).astype(np.uint8)
                Image.fromarray(a, "L").save(root / split / f"c{k}" / f"{i}.png")
    common = ["race", "--config", "digits-lenet", "--data", str(root), "--set", "data.batch_size=8",
              "--set", "model.name=mnist_cnn", "--epochs", "1", "--seeds", "1", "--optimizers", "sgd", "--lr",
              "sgd=0.05"]
    sel, conf = tmp_path / "sel", tmp_path / "conf"
    assert main([*common, "--holdout", "9", "--targets", "0.3", "0.5", "-o", str(sel)]) == 0
    assert main([*common[:-4], "--frozen", str(sel / "race.json"), "--first-seed", "1", "--full-budget",
                 "-o", str(conf)]) == 0
    out = capsys.readouterr().out
    named = f"{root / 'test'} (folder)"
    assert f"evaluated on {named}: 9 images" in out and f"accuracy on {named}" in out
    data = json.loads((conf / "race.json").read_text())
    assert data["settings"]["evaluated_on"] == named and data["summary"]["evaluated_on"] == named
    accs = [h["val_top_1_accuracy"] for r in data["runs"] for h in r["history"]]
    assert accs and all(abs(a * 9 - round(a * 9)) < 1e-9 for a in accs)
    import shutil

    shutil.rmtree(root / "test")
    assert main([*common[:-4], "--frozen", str(sel / "race.json"), "--first-seed", "2", "-o",
                 str(tmp_path / "c2")]) == 2
    err = capsys.readouterr().err.strip()
    assert "has no test split" in err and "\n" not in err


def test_a_grid_whose_winner_sits_at_its_edge_names_the_next_lr_out():
    from torchboost.race.select import grid_edges

    def lane(name, lr, accs):
        hist = [{"epoch": i + 1, "seconds": float(i + 1), "val_top_1_accuracy": a} for i, a in enumerate(accs)]
        return Lane(name, lr, 0, None, None, None, seconds=float(len(accs)), history=hist)

    lanes = [lane("sgd", 0.05, [0.5, 0.8]), lane("sgd", 0.1, [0.6, 0.9]), lane("sgd", 0.2, [0.95, 0.96]),
             lane("muon", 0.01, [0.95, 0.96]), lane("muon", 0.02, [0.6, 0.9]),
             lane("adamw", 0.001, [0.5, 0.9]), lane("adamw", 0.002, [0.95, 0.96]), lane("adamw", 0.005, [0.5, 0.9]),
             lane("sgd@5", 0.2, [0.95, 0.96])]  # one lr raced: no grid to extend
    lines = grid_edges(lanes, 0.9)  # chosen at the lower target
    assert lines == [
        "grid edge: sgd chose lr 0.2, the highest it raced: race --lr 'sgd=0.4' in another selection stage and pool "
        "it (--report) before confirming",
        "grid edge: muon chose lr 0.01, the lowest it raced: race --lr 'muon=0.005' in another selection stage and "
        "pool it (--report) before confirming"]


def test_the_race_flow_from_python_gives_the_commands_result(tmp_path, capsys):
    """`race(RaceRequest(...))` is `torchboost race` with the same arguments: the same runs, lrs, seeds and
    accuracies (the seconds differ: they are measured), and it says what the command prints."""
    from torchboost.race.run import RaceRequest, race

    args = dict(config="digits-lenet", set=["data.batch_size=64"], optimizers=["sgd", "muon"],
                lr=["sgd=0.05", "muon=0.02"], epochs=1, seeds=1, targets=[0.3], holdout=300, evals_per_epoch=1)
    said: list[str] = []
    summary = race(RaceRequest(**args, output=str(tmp_path / "py")), log=said.append)
    assert main(["race", "-c", "digits-lenet", "--set", "data.batch_size=64", "--optimizers", "sgd", "muon",
                 "--lr", "sgd=0.05", "--lr", "muon=0.02", "--epochs", "1", "--seeds", "1", "--targets", "0.3",
                 "--holdout", "300", "--evals-per-epoch", "1", "-o", str(tmp_path / "cli")]) == 0
    printed = capsys.readouterr().out
    runs = {d: json.loads((tmp_path / d / "race.json").read_text())["runs"] for d in ("py", "cli")}
    accs = {d: [(r["optimizer"], r["lr"], r["seed"], [h["val_top_1_accuracy"] for h in r["history"]])
                for r in rs] for d, rs in runs.items()}
    assert accs["py"] == accs["cli"]
    assert summary["chosen_lr"] == {"sgd": 0.05, "muon": 0.02}
    assert any(line.startswith("targets: ") for line in said) and "\ntargets: " in printed
    assert "survives removing any one held-out image" in printed


def test_a_variant_of_another_optimizer_than_the_recipes_races():
    """`thor[damping_mode=trace]` on a recipe of SGD: the variant is THOR's config with that option (it was refused,
    "optim.thor is set but optim.name=sgd does not use it"), and the recipe's own config is untouched."""
    from torchboost.recipe.build import build_model
    from torchboost.race.lanes import variant_racer

    cfg, _, _ = load_resolved("digits-lenet")
    assert cfg.optim.name == "sgd"
    racer = variant_racer("thor[damping_mode=trace]", cfg, (0.02,))
    opt = racer.build(build_model(cfg), 0.02, 10, 1)
    assert racer.name == "thor[damping_mode=trace]" and type(opt).__name__ == "THOR"
    assert opt.preconditioner.options.damping_mode == "trace"
    assert cfg.optim.name == "sgd" and cfg.optim.options["thor"].damping_mode == "absolute"
