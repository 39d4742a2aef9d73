"""Race results: per target the best lr of each optimizer (median seconds over seeds, a seed that never
reached the target counting as infinity; reaching is the hold rule, `race.reached_at`), its hit rate k/n, ratios
to the best other optimizer with a seed-paired bootstrap interval and the verdict it allows (faster only where
the interval's upper bound is below 1), the final accuracy beside them, per-epoch cost relative to the first
optimizer; the race's files and plot are `race.plot`'s."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from torchboost.errors import ConfigError, printable
from torchboost.optim.registry import OPTIMIZERS
from torchboost.recipe.optimizers import THOR_FAMILY, race_policy
from torchboost.race.lanes import TARGET_RULE, Lane, reached_at
from torchboost.race.names import parse_racer


def cpu_flags() -> str:
    """The SIMD features that decide CPU speed here (benchmarks print them with their results)."""
    try:
        flags = set(next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags")).split())
    except (OSError, StopIteration):
        return "unknown"
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
    return " ".join(f if f in flags else f"no-{f}" for f in wanted)


def time_to_target(lane: Lane, target: float) -> tuple[float, float]:
    """(epochs, seconds) at the evaluation where `lane` reached `target` by the hold rule (`reached_at`);
    (inf, inf) if it never did."""
    at = reached_at(lane.history, target)
    return (math.inf, math.inf) if at is None else (lane.history[at]["epoch"], lane.history[at]["seconds"])


def summarize(lanes: Sequence[Lane], targets: Sequence[float]) -> dict:
    """{target: {racer: {lr, reached, seeds, median_epochs, median_seconds, seconds, per_lr: [...]}}} plus each
    racer's median seconds per epoch (a run's training seconds over the epochs it trained: its last evaluation's
    epoch, whatever the evaluations an epoch). Each racer is reported at ONE lr across targets (`chosen_lr`), so its
    row for every target is the same runs: the lr with the fewest median seconds (then epochs) to the highest
    target it reaches on the median seed (the lowest target when it reaches none)."""
    racers = list(dict.fromkeys(l.racer for l in lanes))
    out: dict = {"targets": {}, "seconds_per_epoch": {}, "chosen_lr": {}, "final": {}}
    per_target: dict = {}
    for name in racers:
        mine = [l for l in lanes if l.racer == name]
        out["seconds_per_epoch"][name] = statistics.median(l.seconds / l.history[-1]["epoch"] for l in mine
                                                           if l.history and l.history[-1]["epoch"] > 0)
        per_target[name] = {t: _per_lr(lanes, name, t) for t in targets}
        out["chosen_lr"][name] = _chosen_lr(per_target[name], targets)
        out["final"][name] = _final([l for l in mine if l.lr == out["chosen_lr"][name]])
    for t in targets:
        out["targets"][f"{t:g}"] = {
            name: {**next(r for r in per_target[name][t] if r["lr"] == out["chosen_lr"][name]),
                   "per_lr": per_target[name][t]} for name in racers}
    return out


def _per_lr(lanes: Sequence[Lane], name: str, target: float) -> list[dict]:
    rows = []
    for lr in dict.fromkeys(l.lr for l in lanes if l.racer == name):
        hits = [time_to_target(l, target) for l in lanes if l.racer == name and l.lr == lr]
        rows.append({"lr": lr, "reached": sum(math.isfinite(e) for e, _ in hits), "seeds": len(hits),
                     "median_epochs": statistics.median(e for e, _ in hits),
                     "median_seconds": statistics.median(s for _, s in hits),
                     "median_best": statistics.median(max((r["val_top_1_accuracy"] for r in l.history), default=0.0)
                                                      for l in lanes if l.racer == name and l.lr == lr),
                     "seconds": [s for _, s in hits],  # per seed, for the ratio's interval
                     "seed_ids": [l.seed for l in lanes if l.racer == name and l.lr == lr]})  # pairs seeds across racers
    return rows


def reach_key(rows: dict[float, dict]) -> tuple:
    """Sort key of one configuration's rows by target: the highest target reached on the median seed first, then
    the fewest median seconds (then epochs) to it; configurations that reach none sort last, by their median
    best accuracy (the highest first: an lr that learned beats one that diverged)."""
    for i, t in enumerate(sorted(rows, reverse=True)):
        r = rows[t]
        if math.isfinite(r["median_seconds"]):
            return (i, r["median_seconds"], r["median_epochs"])
    return (len(rows), -max(r.get("median_best", 0.0) for r in rows.values()), 0.0)


def _chosen_lr(per_target: dict, targets: Sequence[float]) -> float:
    """The lr of the fewest median seconds (then epochs) at the highest target reached on the median seed."""
    lrs = [r["lr"] for r in per_target[targets[0]]]
    by_lr = {lr: {t: next(r for r in per_target[t] if r["lr"] == lr) for t in targets} for lr in lrs}
    return min(lrs, key=lambda lr: reach_key(by_lr[lr]))


def _final(lanes: Sequence[Lane]) -> dict:
    """The accuracy each run ended with (its last evaluation) and the epochs it trained: median, lowest and
    highest over seeds, whether every run trained its whole budget (then runs compare at matched budgets), and
    why the others stopped (a race file without the reason: "")."""
    last = [l.history[-1] for l in lanes if l.history]
    stopped = sorted({l.stopped for l in lanes if l.stopped != "epoch budget"})
    why = {"stopped": stopped, "diverged_seeds": sorted(l.seed for l in lanes if l.stopped == "diverged")}
    if not last:
        return {"median": math.nan, "lowest": math.nan, "highest": math.nan, "epochs": 0.0, "whole_budget": False,
                **why}
    acc = [r["val_top_1_accuracy"] for r in last]
    return {"median": statistics.median(acc), "lowest": min(acc), "highest": max(acc),
            "epochs": statistics.median(r["epoch"] for r in last), "whole_budget": not stopped, **why}


def is_thor(name: str) -> bool:
    """THOR and its variants (race family "thor" in `recipe.optimizers`: thor_muon, `thor[...]` option variants)
    are one family: a variant is not THOR's rival. `NAME@EPOCHS` is that racer on its own epoch budget."""
    try:
        base = parse_racer(name).base.removesuffix("-all-convs")  # benchmarks/race.py's muon-all-convs family
    except ConfigError:  # not a racer's name (a saved race is read defensively)
        return False
    return base in OPTIMIZERS and race_policy(base).family == THOR_FAMILY


def best_other(rows: dict, name: str) -> str | None:
    """The fastest racer `name` is compared with (for a THOR racer: the fastest non-THOR one)."""
    others = [n for n in rows if n != name and not (is_thor(name) and is_thor(n))]
    return min(others, key=lambda n: rows[n]["median_seconds"]) if others else None


def ratio_to_best_other(rows: dict, name: str) -> float:
    """name's median seconds / the fastest other racer's (for a THOR racer: the fastest non-THOR one);
    inf/nan when a side never got there."""
    other = best_other(rows, name)
    if other is None:
        return math.nan
    mine, theirs = rows[name]["median_seconds"], rows[other]["median_seconds"]
    if math.isinf(mine) and math.isinf(theirs):
        return math.nan
    return mine / theirs


def paired_bootstrap_ratio(mine: Sequence[float], theirs: Sequence[float], rounds: int = 2000, level: float = 0.9,
                           rng: np.random.Generator | None = None) -> tuple[float, float] | None:
    """A percentile bootstrap interval (`level`) of median(mine) / median(theirs) where mine[i] and theirs[i] are one
    seed's (the same initial weights, batch order and augmentation): each draw resamples the seed indices once, with
    replacement, and applies them to both racers, so what the seeds share cancels in the ratio. A seed that never
    reached the target is inf, as in the medians; a draw where both medians are inf has no ratio and is left out.
    None with fewer than two seeds or no draw with a ratio. `rng`: default_rng(0), so a race's interval repeats."""
    a, b = np.asarray(mine, dtype=float), np.asarray(theirs, dtype=float)
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length ({len(a)} vs {len(b)})")
    if len(a) < 2:
        return None
    rng = np.random.default_rng(0) if rng is None else rng
    idx = rng.integers(0, len(a), size=(rounds, len(a)))  # one draw of seeds, the same for both racers
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = np.median(a[idx], axis=1) / np.median(b[idx], axis=1)
    ratios = ratios[~np.isnan(ratios)]
    if not len(ratios):
        return None
    tail = (1 - level) / 2 * 100  # "nearest": a draw with a seed that never got there is inf, never interpolated
    return (float(np.percentile(ratios, tail, method="nearest")),
            float(np.percentile(ratios, 100 - tail, method="nearest")))


def ratio_interval(rows: dict, name: str, rounds: int = 2000, level: float = 0.9) -> tuple[float, float] | None:
    """The seed-paired bootstrap interval (`paired_bootstrap_ratio`) of name's seconds-ratio to the best other
    racer, over the seeds both raced. None when there is no ratio (both never got there) or fewer than two shared
    seeds."""
    other = best_other(rows, name)
    if other is None or math.isnan(ratio_to_best_other(rows, name)):
        return None
    mine, theirs = (dict(zip(rows[n].get("seed_ids", []), rows[n].get("seconds", []))) for n in (name, other))
    shared = [seed for seed in mine if seed in theirs]
    return paired_bootstrap_ratio([mine[s] for s in shared], [theirs[s] for s in shared], rounds, level)


def verdict(ratio: float, interval: tuple[float, float] | None) -> str:
    """What a ratio of seconds lets one claim: faster only where the interval's upper bound is below 1, slower
    only where its lower bound is above 1; anything else (an interval across 1, too few seeds) is undecided."""
    if interval is None or math.isnan(ratio):
        return "undecided"
    if interval[1] < 1.0:
        return "faster"
    return "slower" if interval[0] > 1.0 else "undecided"


def fmt_target(t: float | str) -> str:
    """A target as raced: 90.65% stays 90.65% (one decimal would show a target the runs were not held to)."""
    return f"{float(t) * 100:.4g}%"


def fmt_hits(row: dict) -> str:
    """The hit rate: seeds that reached the target (hold rule) of those raced, k/n."""
    return f"{row['reached']}/{row['seeds']}"


def fmt_interval(interval: tuple[float, float] | None) -> str:
    if interval is None:
        return ""
    return " [" + ", ".join("inf" if math.isinf(v) else f"{v:.2f}" for v in interval) + "]"


def fmt_ratio(r: float) -> str:
    """A ratio for people: 'never' when this racer missed the target, 'only one' when every rival did."""
    if math.isnan(r):
        return "n/a"
    if math.isinf(r):
        return "never"
    return "only one" if r == 0 else f"{r:.2f}x"


def headline(summary: dict, name: str) -> str:
    """The one-line result: name's median seconds-to-target over the best other (non-THOR, for THOR
    racers) optimizer's, per target, each with its seed-paired 90% interval and verdict."""
    parts = []
    for t, rows in summary["targets"].items():
        ratio, interval = ratio_to_best_other(rows, name), ratio_interval(rows, name)
        parts.append(f"{fmt_target(t)} {fmt_ratio(ratio)}{fmt_interval(interval)} {verdict(ratio, interval)}")
    return (f"{name}/best-other seconds-to-target (90% seed-paired bootstrap interval; faster only where it lies below "
            "1): " + ", ".join(parts))


def format_report(summary: dict, threads: int | str, device: str = "cpu") -> str:
    """The table users read: per target and racer the best lr, hit rate k/n, median epochs/seconds, the ratio to
    the best other with its interval and verdict, and the final top-1 beside them."""
    first = next(iter(summary["seconds_per_epoch"]))
    gpu = "" if device == "cpu" else f"; device: {printable(device)[:80]}"  # a name from a file, maybe
    w = max(12, *(len(n) for n in summary["seconds_per_epoch"]))  # the optimizer column fits every name
    lines = [f"accuracy on {printable(summary.get('evaluated_on', 'an unrecorded split'))}",
             f"(torch threads: {threads}; CPU: {cpu_flags()}{gpu}; seconds = training time, medians over seeds)",
             f"{'target':>7} {'optimizer':<{w}} {'best lr':>8} {'hits':>6} {'med epochs':>11} {'med s':>8} "
             f"{'s/best other [90%]':>26} {'verdict':>10} {'final top-1':>22} {f's/epoch vs {first}':>18}"]
    for t, name, r, ratio, claim, final, cost in table_rows(summary):
        lines.append(f"{fmt_target(t):>7} {name:<{w}} {r['lr']:>8g} {fmt_hits(r):>6} {r['median_epochs']:>11.3g} "
                     f"{r['median_seconds']:>8.1f} {ratio:>26} {claim:>10} {final:>22} {cost:>17.2f}x")
    lines += [f"reached: {TARGET_RULE}", VERDICT_RULE]
    lines.append(f"final top-1 at each optimizer's lr ({final_note(summary)}): " + "; ".join(
        f"{name} {fmt_final(f)}" for name, f in summary.get("final", {}).items()))
    return "\n".join(lines)


VERDICT_RULE = ("verdict: faster where the 90% interval of the seconds ratio (seeds resampled in pairs) lies below "
                "1.0, slower where it lies above, else undecided")


def fmt_final(f: dict) -> str:
    """'98.8% [98.5, 99.0] after 8 epochs': the median final accuracy, its range over seeds, the epochs."""
    if not math.isfinite(f["median"]):
        return "no evaluation"
    return f"{fmt_final_range(f)} after {f['epochs']:.3g} epochs"


def fmt_final_range(f: dict) -> str:
    """'98.8% [98.5, 99.0]': the median final accuracy and its range over seeds (the table's column), and the seeds
    that diverged: '44.0% [10.0%, 78.0%] seed 3 diverged'."""
    diverged = "".join(f" seed {s} diverged" for s in f.get("diverged_seeds", ()))
    return ("none" if not math.isfinite(f["median"]) else f"{f['median']:.1%} [{f['lowest']:.1%}, {f['highest']:.1%}]") \
        + diverged


def final_note(summary: dict) -> str:
    """Whether the final accuracies compare at matched budgets (every run trained its whole budget), else why not."""
    finals = list(summary.get("final", {}).values())
    epochs = {f["epochs"] for f in finals}
    if finals and all(f["whole_budget"] for f in finals):
        return "every run its whole budget" + (", the same for all" if len(epochs) == 1 else "")
    return stop_note(r for f in finals for r in f.get("stopped", [""]))


# why a run stopped before its budget (`lanes.Lane.stopped`) -> what that means for its final accuracy
STOP_NOTES = {
    "reached and held every target": "some runs stopped at the targets: pass --full-budget to compare at matched "
                                     "budgets",
    "diverged": "some runs diverged (a non-finite loss, or back at chance after learning): their final is their last "
                "evaluation",
    "time budget": "some runs stopped at --time-budget: their finals are after fewer epochs",
}


def stop_note(reasons: Iterable[str]) -> str:
    """The notes for why runs stopped early, each once; an unknown or unrecorded reason reads as the targets'."""
    notes = dict.fromkeys(STOP_NOTES.get(r, STOP_NOTES["reached and held every target"]) for r in sorted(set(reasons)))
    return "; ".join(notes) or "every run its whole budget"


def table_rows(summary: dict) -> Iterator[tuple[float, str, dict, str, str, str, float]]:
    """(target, optimizer, its summary row, seconds ratio to the best other with its interval, the verdict, the
    final top-1 at its lr, epoch cost vs the first)."""
    per_epoch = summary["seconds_per_epoch"]
    first = next(iter(per_epoch))
    finals = summary.get("final", {})
    for t, rows in summary["targets"].items():
        for name, r in rows.items():
            ratio, interval = ratio_to_best_other(rows, name), ratio_interval(rows, name)
            final = fmt_final_range(finals[name]) if name in finals else ""
            yield (float(t), name, r, fmt_ratio(ratio) + fmt_interval(interval), verdict(ratio, interval), final,
                   per_epoch[name] / per_epoch[first])


def format_markdown(summary: dict) -> str:
    """The same table as Markdown (for BENCHMARKS.md-style reports)."""
    first = next(iter(summary["seconds_per_epoch"]))
    rows = ["| target | optimizer | best lr | hits | median epochs | median s | s / best other [90%] | verdict | "
            f"final top-1 | s per epoch vs {first} |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for t, name, r, ratio, claim, final, cost in table_rows(summary):
        rows.append(f"| {fmt_target(t)} | {name} | {r['lr']:g} | {fmt_hits(r)} | {r['median_epochs']:.3g} | "
                    f"{r['median_seconds']:.1f} | {ratio} | {claim} | {final} | {cost:.2f}x |")
    rows += ["", f"Reached: {TARGET_RULE}.", "", f"{VERDICT_RULE[0].upper()}{VERDICT_RULE[1:]}.", "",
             f"Final top-1 ({final_note(summary)}): " + "; ".join(
                 f"{name} {fmt_final(f)}" for name, f in summary.get("final", {}).items())]
    return "\n".join(rows)
