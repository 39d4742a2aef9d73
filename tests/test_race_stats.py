"""Reports a statistician would sign: the seed-paired bootstrap of a seconds ratio (against a hand computation),
the verdict it allows, hit rates k/n under the hold rule, and the confirmation's targets fixed by the selection."""

import json
import math
import statistics

import numpy as np
import pytest

from torchboost.errors import ConfigError
from torchboost.race.lanes import Lane
from torchboost.race.report import (fmt_hits, format_markdown, format_report, paired_bootstrap_ratio,
                                           ratio_interval, summarize, verdict)
from torchboost.race.select import confirmation_targets, fixed_targets, read_race


def lane(racer, seed, accs, seconds=None, lr=0.1):
    seconds = seconds or [float(i + 1) for i in range(len(accs))]
    history = [{"epoch": i + 1, "seconds": s, "val_top_1_accuracy": a} for i, (a, s) in enumerate(zip(accs, seconds))]
    return Lane(racer, lr, seed, None, None, None, seconds=seconds[-1], history=history, stopped="epoch budget")


def test_pairing_resamples_seeds_once_for_both_racers():
    """Seed i of b takes exactly twice seed i of a's seconds: every paired draw's ratio is 0.5, so the interval is
    [0.5, 0.5]; resampling each racer on its own would have drawn e.g. a's 40 over b's 20."""
    mine, theirs = [10.0, 20.0, 40.0], [20.0, 40.0, 80.0]
    assert paired_bootstrap_ratio(mine, theirs) == (0.5, 0.5)
    assert paired_bootstrap_ratio(mine, [80.0, 20.0, 40.0]) != (0.5, 0.5)  # other pairs, another interval


def test_paired_bootstrap_against_a_hand_computation():
    """Six draws from a fixed generator, recomputed here with statistics.median: with six draws the 5th and 95th
    nearest-rank percentiles are the smallest and largest ratio; a seed that never reached the target is inf."""
    mine, theirs = [3.0, 5.0, math.inf], [4.0, 4.0, 6.0]
    draws = np.random.default_rng(11).integers(0, 3, size=(6, 3))
    by_hand = sorted(statistics.median(mine[i] for i in row) / statistics.median(theirs[i] for i in row)
                     for row in draws.tolist())
    got = paired_bootstrap_ratio(mine, theirs, rounds=6, rng=np.random.default_rng(11))
    assert got == (by_hand[0], by_hand[-1])
    assert paired_bootstrap_ratio([1.0], [2.0]) is None  # one seed: no interval
    with pytest.raises(ValueError):
        paired_bootstrap_ratio([1.0, 2.0], [1.0])


def test_the_report_pairs_seeds_by_their_number():
    """Pooled races list runs in any order: the interval pairs seed k of one racer with seed k of the other."""
    a = [lane("a", s, [0.95], [t]) for s, t in ((2, 20.0), (0, 10.0), (1, 40.0))]
    b = [lane("b", s, [0.95], [2 * t]) for s, t in ((0, 10.0), (1, 40.0), (2, 20.0))]
    rows = summarize(a + b, [0.9])["targets"]["0.9"]
    assert ratio_interval(rows, "a") == (0.5, 0.5)


def test_faster_is_claimed_only_below_one():
    assert verdict(0.8, (0.7, 0.95)) == "faster"
    assert verdict(0.8, (0.6, 1.02)) == "undecided"  # the median says faster; the interval does not
    assert verdict(1.3, (1.1, 1.6)) == "slower"
    assert verdict(0.5, None) == "undecided"  # fewer than two seeds
    assert verdict(math.nan, (0.5, 0.6)) == "undecided"


def test_hit_rates_count_seeds_by_the_hold_rule():
    """Of a's three seeds, one holds 90%, one crosses and collapses, one never gets there: 1/3 (2/3 at 50%)."""
    lanes = [lane("a", 0, [0.5, 0.92, 0.93]), lane("a", 1, [0.5, 0.91, 0.3]), lane("a", 2, [0.4, 0.45, 0.48]),
             lane("b", 0, [0.95, 0.96]), lane("b", 1, [0.95, 0.96]), lane("b", 2, [0.95, 0.96])]
    summary = summarize(lanes, [0.5, 0.9])
    rows = summary["targets"]
    assert [fmt_hits(rows[t]["a"]) for t in ("0.5", "0.9")] == ["2/3", "1/3"]
    assert fmt_hits(rows["0.9"]["b"]) == "3/3"
    for text in (format_report(summary, 1), format_markdown(summary)):
        assert "1/3" in text and "verdict" in text.lower() and "48.0% [30.0%, 93.0%]" in text  # final beside


def race_file(path, runs, targets=(0.5, 0.9), fixed=None):
    settings = {"recipe": "r", "overrides": [], "targets": list(targets), "holdout": 100, "first_seed": 0,
                "seeds": 2, "epochs": 2}
    if fixed is not None:
        settings["fixed_targets"] = fixed
    path.write_text(json.dumps({"settings": settings, "summary": {}, "runs": runs}))
    return read_race(path)


def run(name, seed, accs):
    return {"optimizer": name, "lr": 0.1, "seed": seed, "stopped": "epoch budget",
            "history": [{"epoch": i + 1, "seconds": float(i + 1), "val_top_1_accuracy": a} for i, a in enumerate(accs)]}


def test_targets_are_the_best_rivals_median_final_less_1_5_and_0_3_points():
    """THOR's family is not its own rival: the best rival is muon (median final 0.93 of 0.92/0.94), not thor."""
    lanes = [lane("sgd", 0, [0.5, 0.90]), lane("sgd", 1, [0.5, 0.91]), lane("muon", 0, [0.6, 0.92]),
             lane("muon", 1, [0.6, 0.94]), lane("thor", 0, [0.7, 0.99]), lane("thor", 1, [0.7, 0.98])]
    fixed = fixed_targets(summarize(lanes, [0.5]))
    assert fixed["rival"] == "muon" and fixed["targets"] == [pytest.approx(0.915), pytest.approx(0.927)]
    assert fixed["whole_budget"] is True
    no_thor = fixed_targets(summarize(lanes[:4], [0.5]))
    assert no_thor["rival"] == "muon"
    only_thor = fixed_targets(summarize(lanes[4:], [0.5]))  # no rival outside the family: the best of all
    assert only_thor["rival"] == "thor" and only_thor["targets"] == [pytest.approx(0.97), pytest.approx(0.982)]


def test_a_confirmation_races_the_fixed_targets_and_no_others(tmp_path):
    runs = [run("sgd", 0, [0.5, 0.90]), run("sgd", 1, [0.5, 0.92]), run("muon", 0, [0.6, 0.93])]
    fixed = fixed_targets(summarize([lane(r["optimizer"], r["seed"], [h["val_top_1_accuracy"] for h in r["history"]])
                                     for r in runs], [0.5, 0.9]))
    data = race_file(tmp_path / "sel.json", runs, fixed=fixed)
    assert confirmation_targets(data, "sel", None) == tuple(fixed["targets"])  # its progress; the rule sets its own
    for given in (fixed["targets"], [0.5, 0.9]):
        with pytest.raises(ConfigError, match="a confirmation's targets are the best rival's median final"):
            confirmation_targets(data, "sel", given)
    with pytest.raises(ConfigError, match="fixes no targets"):
        confirmation_targets(race_file(tmp_path / "old.json", runs), "old", None)
    edited = dict(fixed, targets=[0.5, 0.6])  # written by hand, not by the rule from its runs
    with pytest.raises(ConfigError, match="but its runs give"):
        confirmation_targets(race_file(tmp_path / "edited.json", runs, fixed=edited), "edited", None)
