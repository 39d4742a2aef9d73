"""`torchboost race` end to end on tiny data (every optimizer's per-lr runs in the JSON, the plot, epoch
budget and epoch-by-epoch interleaving), and the summary's medians against hand-computed ones."""

import json
import math

import pytest
import torch

from torchboost.errors import ConfigError

from torchboost.cli import main
from torchboost.race.lanes import Lane, held_every_target, reached_at
from torchboost.race.plot import median_curve, plot, race_figure, seed_tails
from torchboost.race.report import ratio_to_best_other, summarize
from torchboost.race.select import pooled_lanes


def test_race_on_a_device_that_is_not_there_is_one_line(tmp_path, capsys):
    if torch.cuda.device_count() > 3:
        pytest.skip("this machine has a fourth GPU")
    rc = main(["race", "--config", "digits-lenet", "--set", "train.device=cuda:3", "--optimizers", "sgd",
               "--epochs", "1", "--seeds", "1", "--output", str(tmp_path / "race")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: train.device='cuda:3'") and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_race_cli_end_to_end(tmp_path, capsys):
    out = tmp_path / "race"
    rc = main(["race", "--config", "digits-lenet", "--set", "data.batch_size=256", "--optimizers", "sgd", "adamw",
               "muon", "thor", "--lr", "sgd=0.05,0.1", "--lr", "adamw=0.003", "--lr", "muon=0.02",
               "--lr", "thor=0.05", "--seeds", "2", "--epochs", "2", "--targets", "0.3", "0.999", "--output", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "thor/best-other seconds-to-target" in text and "torch threads: 1" in text
    data = json.loads((out / "race.json").read_text())
    assert (out / "race.png").stat().st_size > 1000
    runs = {(r["optimizer"], r["lr"], r["seed"]): r for r in data["runs"]}
    want = {("sgd", 0.05), ("sgd", 0.1), ("adamw", 0.003), ("muon", 0.02), ("thor", 0.05)}
    assert set(runs) == {(o, lr, s) for o, lr in want for s in (0, 1)}
    for r in runs.values():
        # 4 untimed evaluations per epoch (5 updates: after updates 1, 2, 4 and 5); 0.999 is out of reach, so the
        # epoch budget stops it
        assert [h["epoch"] for h in r["history"]] == pytest.approx([0.2, 0.4, 0.8, 1, 1.2, 1.4, 1.8, 2])
        assert r["stopped"] == "epoch budget"
        seconds = [h["seconds"] for h in r["history"]]
        assert 0 < seconds[0] and seconds == sorted(seconds)
    # interleaved: every run's epoch 1 comes before any run's epoch 2
    first = [h["order"] for r in runs.values() for h in r["history"] if h["epoch"] == 1]
    second = [h["order"] for r in runs.values() for h in r["history"] if h["epoch"] == 2]
    assert max(first) < min(second) and sorted(first + second) == list(range(20))
    assert set(data["summary"]["targets"]["0.3"]) == {"sgd", "adamw", "muon", "thor"}
    assert data["settings"]["threads"] == 1 and data["settings"]["cpu_flags"]
    assert data["settings"]["device"] == "cpu"  # train.device auto, no GPU here: named in the results
    summary = {k: v for k, v in data["summary"].items() if k != "evaluated_on"}  # the split is named beside it
    assert summarize(pooled_lanes([out / "race.json"]), (0.3, 0.999)) == summary  # re-reporting a saved race
    assert data["summary"]["evaluated_on"] == "digits, split test"


def lane(racer, lr, seed, accs, secs):
    history = [{"epoch": i + 1, "seconds": s, "val_top_1_accuracy": a} for i, (a, s) in enumerate(zip(accs, secs))]
    return Lane(racer, lr, seed, None, None, None, seconds=secs[-1], history=history)


def test_summary_medians_best_lr_and_ratios():
    lanes = [lane("a", 0.1, 0, [0.5, 0.9], [1, 2]), lane("a", 0.1, 1, [0.5, 0.6], [1, 2]),
             lane("a", 0.1, 2, [0.95, 0.97], [1, 2]),  # lr 0.1 at 0.9: epochs (2, inf, 1) -> median 2, 2 s
             lane("a", 0.2, 0, [0.4, 0.5], [1, 2]), lane("a", 0.2, 1, [0.4, 0.5], [1, 2]),
             lane("a", 0.2, 2, [0.9, 0.9], [1, 2]),  # lr 0.2: (inf, inf, 1) -> inf
             lane("b", 0.1, 0, [0.9], [4]), lane("b", 0.1, 1, [0.9], [5]), lane("b", 0.1, 2, [0.9], [3])]
    s = summarize(lanes, [0.9])
    a, b = s["targets"]["0.9"]["a"], s["targets"]["0.9"]["b"]
    assert (a["lr"], a["reached"], a["median_epochs"], a["median_seconds"]) == (0.1, 2, 2, 2)
    assert [r["median_seconds"] for r in a["per_lr"]] == [2, math.inf]
    assert (b["median_epochs"], b["median_seconds"]) == (1, 4)
    assert ratio_to_best_other(s["targets"]["0.9"], "b") == 2.0
    rows = {"sgd": {"median_seconds": 4.0}, "thor": {"median_seconds": 1.0}, "thor_muon": {"median_seconds": 2.0}}
    assert ratio_to_best_other(rows, "thor_muon") == 0.5  # a THOR variant is not THOR's rival
    assert s["seconds_per_epoch"] == {"a": 1.0, "b": 4.0}


def test_plot_median_runs_only_where_every_seed_runs_and_seeds_are_thin_beyond(tmp_path):
    """Seeds of 3, 4 and 2 evaluations: the median line covers the 2 evaluations all three ran (by hand below),
    never a "median" of the seeds still running; past it each seed that ran on is a thin line of its own, from
    its last shared evaluation; the table's median time to the target (hold rule) is marked x; the title says so."""
    lanes = [lane("a", 0.1, 0, [0.5, 0.7, 0.9], [1, 2, 3]), lane("a", 0.1, 1, [0.6, 0.9, 0.2, 0.95], [2, 4, 6, 8]),
             lane("a", 0.1, 2, [0.4, 0.9], [3, 5]), lane("a", 0.2, 0, [0.1, 0.1], [1, 2])]
    # by hand: evaluation 1 of the seeds at 1, 2, 3 s with 0.5, 0.6, 0.4; evaluation 2 at 2, 4, 5 s with 0.7, 0.9,
    # 0.9; seed 2 stopped there, so the line ends at the median of (2, 4, 5) s
    xs, ys, lo, hi = median_curve(lanes, "a", 0.1)
    assert xs == [2, 4] and ys == pytest.approx([0.5, 0.9]) and lo == [0.4, 0.7] and hi == [0.6, 0.9]
    assert seed_tails(lanes, "a", 0.1) == [([2, 3], [0.7, 0.9]), ([4, 6, 8], [0.9, 0.2, 0.95])]
    summary = summarize(lanes, (0.85,))
    ax = race_figure(lanes, summary).axes[0]
    median = next(l for l in ax.get_lines() if l.get_label() == "a (lr 0.1)")
    assert list(median.get_xdata()) == [2, 4]  # the range every seed covers, not seed 1's 8 s
    thin = sorted(list(l.get_xdata()) for l in ax.get_lines() if (l.get_alpha() or 1) < 1)
    assert thin == [[2, 3], [4, 6, 8]]
    # times to 0.85 by the hold rule: 3 s (its last evaluation), 8 s (0.9 at 4 s fell to 0.2), 5 s -> median 5
    assert summary["targets"]["0.85"]["a"]["median_seconds"] == 5
    marks = [(list(l.get_xdata()), list(l.get_ydata())) for l in ax.get_lines() if l.get_marker() == "x"]
    assert marks == [([5], [0.85])]
    assert "median over 3+ seeds while every seed runs" in ax.get_title() and "thin: single seeds" in ax.get_title()
    png = plot(lanes, summary, tmp_path / "race.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_seed_that_fell_back_to_chance_is_named_diverged_and_two_seeds_are_drawn_each(tmp_path):
    """Issue 55: a seed that diverged to 10% (finite loss) read 'final 44.0% [10.0%, 78.0%]', stopped at 'epoch
    budget', and two seeds drew a "median" neither followed. Now the run is 'diverged' (race.json's stopped), the
    table's final names the seed, and two seeds are two lines, the diverged one's end named."""
    from torchboost.race.lanes import fell_to_chance
    from torchboost.race.report import format_report

    assert fell_to_chance([{"val_top_1_accuracy": a} for a in (0.5, 0.7, 0.1)], 10)
    assert not fell_to_chance([{"val_top_1_accuracy": a} for a in (0.2, 0.25, 0.12)], 10)  # never learned
    assert not fell_to_chance([{"val_top_1_accuracy": a} for a in (0.5, 0.7, 0.2)], 10)  # still 10 points above
    lanes = [lane("sgd", 0.05, 0, [0.5, 0.78], [1, 2]), lane("sgd", 0.05, 3, [0.5, 0.1], [1, 2])]
    lanes[1].stopped = "diverged"
    summary = summarize(lanes, (0.7,))
    assert summary["final"]["sgd"]["diverged_seeds"] == [3]
    report = format_report(summary, 1)
    assert "44.0% [10.0%, 78.0%] seed 3 diverged" in report and "back at chance after learning" in report
    ax = race_figure(lanes, summary).axes[0]
    drawn = sorted(list(l.get_ydata()) for l in ax.get_lines() if l.get_marker() == ".")
    assert drawn == [[0.5, 0.1], [0.5, 0.78]]  # each seed, no median of two
    assert [t.get_text() for t in ax.texts if "diverged" in t.get_text()] == ["seed 3 diverged"]


def test_a_target_counts_as_reached_only_when_held_at_the_next_evaluation():
    """The hold rule against hand-written evaluations, and the summary, table and early stop that use it."""
    def history(accs):
        return [{"epoch": i + 1, "seconds": 10.0 * (i + 1), "val_top_1_accuracy": a} for i, a in enumerate(accs)]

    for accs, want in (([0.5, 0.91, 0.33, 0.92, 0.95], 3),  # crossed at 2, collapsed at 3, held from 4
                       ([0.5, 0.95], 1),  # the run's last evaluation counts alone
                       ([0.95, 0.3], None), ([0.91, 0.33, 0.33], None),  # crossed and fell back: never
                       ([0.9, 0.9], 0),  # at the target is at or above it
                       ([], None)):
        assert reached_at(history(accs), 0.9) == want, accs
    # the early stop needs a later evaluation's confirmation at the highest target, not the last one alone
    assert [held_every_target(history(a), (0.8, 0.9)) for a in ([0.95], [0.95, 0.3], [0.95, 0.92], [0.85, 0.91, 0.3],
                                                                 [0.85, 0.81])] == [False, False, True, False, False]
    collapsed, held = history([0.5, 0.91, 0.33, 0.33]), history([0.5, 0.8, 0.92, 0.93])
    lanes = [Lane("c", 0.1, 0, None, None, None, seconds=40.0, history=collapsed),
             Lane("h", 0.1, 0, None, None, None, seconds=40.0, history=held)]
    summary = summarize(lanes, (0.9,))
    rows = summary["targets"]["0.9"]
    assert (rows["c"]["reached"], rows["c"]["median_seconds"]) == (0, math.inf)  # first-crossing said 20 s
    assert (rows["h"]["reached"], rows["h"]["median_seconds"], rows["h"]["median_epochs"]) == (1, 30.0, 3)
    from torchboost.race.report import format_markdown, format_report

    for text in (format_report(summary, 1), format_markdown(summary)):
        assert "whose next evaluation is also at or above it" in text and "last evaluation counts alone" in text


def test_a_run_stops_at_its_targets_only_once_a_later_evaluation_held_them():
    """The early stop (no --full-budget) waits for the confirming evaluation: a run stops at the first epoch
    where the hold rule is met with an evaluation after the crossing, never at the crossing itself."""
    from torchboost.recipe import load_resolved
    from torchboost.race.lanes import builtin_racer, run_race

    cfg, train_ds, eval_ds = load_resolved("digits-lenet", ["data.batch_size=64"])
    lanes = run_race(cfg, train_ds, eval_ds, [builtin_racer("sgd", cfg, (0.05,))], [0], (0.3,), epochs=5,
                     log=lambda m: None)
    hist = lanes[0].history
    assert lanes[0].stopped == "reached and held every target" and len(hist) >= 2
    assert held_every_target(hist, (0.3,)) and not held_every_target(hist[:-1], (0.3,))
    assert hist[-2]["val_top_1_accuracy"] >= 0.3  # the crossing came one evaluation before the stop


def test_a_racer_on_its_own_epoch_budget_anneals_over_it():
    """`Racer.epochs`: that racer's schedule is built for its own budget (its lr is near zero after its last
    epoch, where the race's 3-epoch cosine is still high after one) and it stops there; `@N` names stay THOR's."""
    import dataclasses

    from torchboost.recipe import load_resolved
    from torchboost.recipe.build import build_schedule
    from torchboost.race.lanes import builtin_racer, run_race
    from torchboost.race.report import is_thor

    cfg, train_ds, eval_ds = load_resolved("digits-lenet", ["data.batch_size=256", "schedule.mode=cosine"])
    built = {}

    def keep(racer, name, epochs):
        def build(model, lr, steps, budget):
            built[name] = (racer.build(model, lr, steps, budget), budget)
            return built[name][0]
        return dataclasses.replace(racer, name=name, build=build, epochs=epochs)

    sgd = builtin_racer("sgd", cfg, (0.1,))
    lanes = run_race(cfg, train_ds, eval_ds, [keep(sgd, "sgd@1", 1), keep(sgd, "sgd", None)], [0], (0.999,),
                     epochs=3, log=lambda m: None)
    runs = {l.racer: l for l in lanes}
    assert [len(runs[n].history) for n in ("sgd@1", "sgd")] == [1, 3]
    assert runs["sgd@1"].stopped == runs["sgd"].stopped == "epoch budget"
    assert built["sgd@1"][1] == 1 and built["sgd"][1] == 3
    # the last lr each was stepped with is its own schedule's: a 1-epoch cosine's last step vs a 3-epoch one's
    steps = len(runs["sgd"].loader)
    for name, budget in (("sgd@1", 1), ("sgd", 3)):
        want = build_schedule(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=budget)), 0.1,
                              steps)[budget * steps - 1]
        assert built[name][0].param_groups[0]["lr"] == pytest.approx(want)
    three = build_schedule(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=3)), 0.1, steps)
    assert built["sgd@1"][0].param_groups[0]["lr"] < 0.5 * three[steps - 1]  # annealed within its one epoch
    assert is_thor("thor_muon[factor_samples=32]@8") and is_thor("thor@10") and not is_thor("muon@8")
    with pytest.raises(ConfigError, match="epoch budget below 1"):
        run_race(cfg, train_ds, eval_ds, [keep(sgd, "sgd@0", 0)], [0], (0.999,), log=lambda m: None)


@pytest.mark.slow
def test_race_cli_budgets_race_each_as_its_own_racer(tmp_path, capsys):
    out = tmp_path / "race"
    rc = main(["race", "--config", "digits-lenet", "--set", "data.batch_size=256", "--optimizers", "sgd", "thor",
               "--lr", "sgd=0.05", "--lr", "thor=0.05", "--budget", "thor=1,2", "--seeds", "1", "--epochs", "3",
               "--targets", "0.999", "--evals-per-epoch", "1", "--output", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "thor@1/best-other seconds-to-target" in text and "thor@2/best-other" in text
    runs = {r["optimizer"]: r for r in json.loads((out / "race.json").read_text())["runs"]}
    assert {n: len(r["history"]) for n, r in runs.items()} == {"sgd": 3, "thor@1": 1, "thor@2": 2}
    from torchboost.race.lanes import parse_budgets, parse_lr_grids

    assert parse_budgets(["thor=6", "thor=8,6", "sgd=15"]) == {"thor": (6, 8), "sgd": (15,)}  # repeats add up
    assert parse_lr_grids(["sgd=0.1", "sgd=0.2,0.1"]) == {"sgd": (0.1, 0.2)}
    for bad, message in (("thor=0", "bad epoch budget"), ("thor=x", "bad epoch budget"),
                         ("muon=2", "--budget names muon")):
        assert main(["race", "--config", "digits-lenet", "--optimizers", "sgd", "thor", "--budget", bad,
                     "--epochs", "1", "--output", str(out)]) == 2
        assert message in capsys.readouterr().err


@pytest.mark.slow
def test_race_trace_records_each_layers_last_update_and_plots_it(tmp_path, capsys):
    """race --trace: every epoch row holds the lr and, per Conv/Linear layer, |dW|/|W| of the epoch's last update
    and |W|; THOR's rows also damping x |W|^2. Re-derived here: the lr is the schedule's value at that update."""
    import json

    from torchboost.cli import main
    from torch import nn

    from torchboost.models import create_model
    from torchboost.recipe.build import build_schedule
    from torchboost.recipe.load import load_config

    argv = ["race", "-c", "digits-lenet", "--optimizers", "sgd", "thor", "--lr", "sgd=0.05", "--lr", "thor=0.01",
            "--seeds", "1", "--epochs", "2", "--trace", "--full-budget", "-o", str(tmp_path / "r")]
    assert main(argv) == 0
    assert "trace: " in capsys.readouterr().out
    assert (tmp_path / "r" / "race-trace.png").read_bytes()[:4] == b"\x89PNG"
    data = json.loads((tmp_path / "r" / "race.json").read_text())
    updates = data["settings"]["updates_per_epoch"]
    for run in data["runs"]:
        cfg = load_config("digits-lenet", ["train.epochs=2"])
        schedule = build_schedule(cfg, run["lr"], updates)
        rows = [row for row in run["history"] if "layers" in row]  # the epochs' ends, not the evaluations inside
        assert [row["epoch"] for row in rows] == [1, 2]
        for row in rows:
            assert row["lr"] == pytest.approx(schedule[row["epoch"] * updates - 1], rel=1e-9)
            layers = row["layers"]
            assert set(layers) == {n for n, m in create_model("mnist_cnn", num_classes=10, in_chans=1,
                                                              image_size=8).named_modules()
                                   if isinstance(m, (nn.Conv2d, nn.Linear))}
            for v in layers.values():
                assert 0 < v["rel_step"] < 1 and v["norm"] > 0
                assert ("damping_eff" in v) == (run["optimizer"] == "thor")


def test_every_racer_warms_up_from_the_same_fraction_of_its_own_lr():
    """The recipe's lr_init/lr_end are written for its own lr: a racer at another lr starts (and ends) at the
    same fraction of its lr, not at the recipe's absolute values."""
    from torchboost.recipe.build import build_schedule
    from torchboost.recipe.load import load_config
    from torchboost.race.lanes import relative_schedule

    cfg = load_config("mnist-lenet", ["schedule.lr_end=0.0005"])  # lr 0.05, warm-up from 0.005
    for lr in (0.001, 0.05, 0.2):
        lrs = build_schedule(relative_schedule(cfg, lr), lr, 62)
        ref = build_schedule(cfg, cfg.optim.lr, 62) * (lr / cfg.optim.lr)
        assert lrs == pytest.approx(ref, rel=1e-12) and max(lrs) <= lr * (1 + 1e-12)


def test_the_ratio_carries_a_bootstrap_interval_over_seeds():
    """Racer a's seeds reach the target in 10/12/14 s, b's in 20 s each: the ratio of medians is 0.6, and every
    resample's ratio lies in [10/20, 14/20]; one seed per side gives no interval."""
    from torchboost.race.report import ratio_interval

    def lanes(name, seconds):
        return [Lane(name, 0.1, seed, None, None, None, seconds=s,
                     history=[{"epoch": 1, "seconds": s, "val_top_1_accuracy": 0.99, "train_loss": 0.1}])
                for seed, s in enumerate(seconds)]

    rows = summarize(lanes("a", [10.0, 12.0, 14.0]) + lanes("b", [20.0, 20.0, 20.0]), [0.9])["targets"]["0.9"]
    assert ratio_to_best_other(rows, "a") == pytest.approx(0.6)
    low, high = ratio_interval(rows, "a")
    assert 0.5 <= low <= 0.6 <= high <= 0.7 and low < high
    assert ratio_interval(rows, "a") == (low, high)  # reproducible
    one = summarize(lanes("a", [10.0]) + lanes("b", [20.0]), [0.9])["targets"]["0.9"]
    assert ratio_interval(one, "a") is None


def test_each_racer_is_reported_at_one_lr_across_targets():
    """lr 0.1 reaches 90% first but never 98%; lr 0.05 reaches both: every target's row is lr 0.05's runs (one
    run achieves every ratio reported), while per_lr keeps what each lr did."""

    def lane(lr, seed, accs):
        return Lane("sgd", lr, seed, None, None, None, seconds=float(len(accs)),
                    history=[{"epoch": e + 1, "seconds": float(e + 1), "val_top_1_accuracy": a, "train_loss": 0.1}
                             for e, a in enumerate(accs)])

    lanes = [lane(0.1, s, [0.95, 0.96, 0.97]) for s in range(3)] + [lane(0.05, s, [0.5, 0.95, 0.985]) for s in range(3)]
    summary = summarize(lanes, [0.9, 0.98])
    assert summary["chosen_lr"]["sgd"] == 0.05
    assert [summary["targets"][t]["sgd"]["lr"] for t in ("0.9", "0.98")] == [0.05, 0.05]
    assert summary["targets"]["0.9"]["sgd"]["median_epochs"] == 2
    fastest_low = min(summary["targets"]["0.9"]["sgd"]["per_lr"], key=lambda r: r["median_seconds"])
    assert fastest_low["lr"] == 0.1  # still on record, not reported as the racer's figure
