"""Select, then confirm: the race protocol that keeps the winner's curse out of a time-to-accuracy claim.

1. `race --holdout N` races lr grids (and epoch budgets) on N training samples held out as a validation split
   (from outside `data.train_subset` when one is set, so the selection trains on the images a confirmation trains
   on); the test split is never read. Its targets follow one rule (`fixed_targets`): the best rival's median
   final accuracy less 1.5 and 0.3 points. Each optimizer's lr and budget is the configuration with the fewest
   median seconds (over seeds, 3 or more; fewer is warned) to the LOWER target (`selections`); the higher one is
   reported, never ranked on. When it ends it says whether removing any one held-out image could flip a choice
   (`one_image_check`) and writes both into its race.json.
2. `race --frozen SELECTION/race.json --first-seed S` races each optimizer at the one (lr, budget) the selection
   chose, on fresh seeds, on the test split, every run its whole budget, training on the selection's images
   (its held-out ones left out). Its targets are the same rule applied to its own runs (`confirmation_targets`):
   the best rival's median final ON THE TEST SPLIT less 1.5 and 0.3 points, so the rival's median seed reaches
   both — a target carried over from the held-out split (easier than the test split, measured on fewer images,
   a maximum over racers) can lie above what the confirmation reaches. The targets depend on the rival's final
   accuracy, never on a racer's seconds, and no choice is made after reading the test split.
   Every (configuration, seed) it evaluates on the test split goes into the task's ledger (`race.ledger`).

Races run in several processes (one per core) are pooled only when every process raced the same racers, and a
(racer, lr, seed) run that appears twice is counted once (`pooled_lanes`): a racer raced alone, on a quieter
machine, or a seed counted twice would bias the medians.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from torchboost.errors import ConfigError, printable
from torchboost.fileio import read_regular
from torchboost.optim.registry import OPTIMIZERS
from torchboost.plaindata import check_plain, in_float_range, load_json
from torchboost.recipe.config import Config
from torchboost.race.choice import configurations, few_seeds, one_image_check, one_image_line, ranked
from torchboost.race.lanes import Lane, Racer, budget_racers, variant_racer
from torchboost.race.names import parse_racer
from torchboost.race.report import STOP_NOTES, fmt_target, is_thor, stop_note, summarize

MAX_RACE_FILE = 256 << 20  # a race.json of thousands of runs is a few MB


@dataclass(frozen=True)
class Selection:
    """One optimizer's frozen configuration: its lr and epoch budget (None: the race's, in a file without one)."""

    optimizer: str
    lr: float
    epochs: int | None = None

    @property
    def racer(self) -> str:
        return self.optimizer if self.epochs is None else f"{self.optimizer}@{self.epochs}"


def read_race(path: Path) -> dict:
    """A saved race.json as plain data, checked for the parts the protocol reads (settings, summary, runs)."""
    raw = read_regular(path, ConfigError)
    if len(raw) > MAX_RACE_FILE:
        raise ConfigError(f"{path} is {len(raw)} bytes, larger than any race result", "give the race.json a race wrote")
    try:
        data = load_json(raw)
    except ValueError as e:  # not JSON, or nested past the parser's stack: no race writes that
        raise ConfigError(f"{path} is not a race result (not JSON: {e})", "give the race.json a race wrote") from None
    check_plain(data, str(path))
    if not isinstance(data, dict) or not all(isinstance(data.get(k), t) for k, t in
                                             (("settings", dict), ("summary", dict), ("runs", list))):
        raise ConfigError(f"{path} is not a race result (no settings, summary and runs)",
                          "give the race.json a race wrote")
    check_race_schema(data, str(path))
    return data


# What a race.json's settings may hold where the protocol reads them: (type, low, high) — checked before use
SETTINGS_SCHEMA = {"seeds": (int, 1, 100), "first_seed": (int, 0, 2**31 - 1), "epochs": (int, 1, 100_000),
                   "holdout": (int, 0, 10**9), "evals_per_epoch": (int, 1, 100), "batch_size": (int, 1, 2**31 - 1),
                   "threads": (int, 0, 1024)}
# the other settings a race writes, each None or of its kind: text (at most MAX_TEXT characters), a number
# (finite, 0 to 2^53), a flag; lists and mappings are checked below. A key no race writes is refused.
SETTINGS_KINDS = {**dict.fromkeys(("recipe", "evaluated_on", "torch", "cpu_flags", "device", "frozen", "ledger"), str),
                  **dict.fromkeys(("time_budget_s", "updates_per_epoch", "evaluation_images", "finalists",
                                   "training_images"), float),
                  "full_budget": bool, "overrides": list, "pooled": list, "targets": list, "fixed_targets": dict,
                  "one_image_check": dict}
MAX_TEXT = 4096
MAX_RUNS, MAX_EVALUATIONS, MAX_NAME = 10_000, 100_000, 200
STOPPED = ("", "epoch budget", *STOP_NOTES)  # why a run ended (lanes.Lane.stopped): a forged one forges a note


def check_race_schema(data: dict, source: str) -> None:
    """Types, ranges, sizes and names of the parts of a race.json the race reads, in one place: a file that
    fails is one ConfigError naming the field (never a traceback, a huge allocation or a forged table row)."""
    def bad(what: str) -> ConfigError:
        return ConfigError(f"{source} is not a race result ({what})", "give the race.json a race wrote")

    settings = data["settings"]
    for key, (kind, low, high) in SETTINGS_SCHEMA.items():
        value = settings.get(key)
        if value is not None and not (type(value) is kind and low <= value <= high):
            raise bad(f"settings.{key} is not a whole number from {low} to {high}")
    for key, value in settings.items():
        kind = SETTINGS_SCHEMA[key][0] if key in SETTINGS_SCHEMA else SETTINGS_KINDS.get(key)
        if kind is None:
            raise bad(f"settings.{printable(key[:40])} is not a setting a race writes")
        if value is None or key in SETTINGS_SCHEMA:
            continue
        if not (type(value) is kind if kind is not float else type(value) in (int, float)):
            raise bad(f"settings.{key} is not {'a number' if kind is float else kind.__name__}")
        if kind is str and len(value) > MAX_TEXT:
            raise bad(f"settings.{key} is longer than any a race writes")
        if kind is float and not (in_float_range(value) and 0 <= value <= 2**53):
            raise bad(f"settings.{key} is out of range")
    for key in ("overrides", "pooled"):
        if not all(isinstance(o, str) and len(o) <= MAX_TEXT for o in settings.get(key) or []):
            raise bad(f"settings.{key} is not a list of texts")
    fixed = settings.get("fixed_targets")
    if fixed is not None and not isinstance(fixed, dict):
        raise bad("settings.fixed_targets is not a mapping")
    for key, targets in (("targets", settings.get("targets")), ("fixed_targets.targets", (fixed or {}).get("targets"))):
        if targets is not None and not (isinstance(targets, list) and 1 <= len(targets) <= 10 and all(
                type(t) in (int, float) and 0 < t <= 1 for t in targets)):
            raise bad(f"settings.{key} is not a list of 1 to 10 accuracies in (0, 1]")
    if len(data["runs"]) > MAX_RUNS:
        raise bad(f"more than {MAX_RUNS} runs")
    for r in data["runs"]:
        name = r.get("optimizer") if isinstance(r, dict) else None
        if not (isinstance(name, str) and 0 < len(name) <= MAX_NAME and name.isprintable()):
            raise bad("a run's optimizer is not a printable name of 1 to 200 characters")
        history = r.get("history")
        if not (isinstance(history, list) and 0 < len(history) <= MAX_EVALUATIONS):
            raise bad(f"a run's history is not a list of 1 to {MAX_EVALUATIONS} evaluations")
        seed = r.get("seed")
        if not (type(seed) is int and 0 <= seed < 2**31):
            raise bad("a run's seed is not a whole number from 0 to 2^31 - 1")
        lr = r.get("lr")
        if not (type(lr) in (int, float) and in_float_range(lr) and lr > 0):
            raise bad("a run's lr is not a finite number > 0")
        if r.get("stopped", "") not in STOPPED:
            raise bad(f"a run's stopped is not one of {', '.join(repr(s) for s in STOPPED[1:])}")
        for h in history:
            if not (isinstance(h, dict) and all(type(h.get(k)) in (int, float) and math.isfinite(h[k]) and h[k] >= 0
                                                for k in ("epoch", "seconds", "val_top_1_accuracy"))
                    and h["val_top_1_accuracy"] <= 1):
                raise bad("an evaluation lacks a finite epoch, seconds or an accuracy in [0, 1]")


def selections(data: dict, source: str) -> list[Selection]:
    """Per optimizer the budget and lr a selection race chose, best first (`ranked`: the fewest median seconds to
    the lower of the targets `fixed_targets` gives, from the same runs). Refused unless the race selected on a
    validation split (`--holdout`). Ranked from the file's runs (`summarize`: the hold rule, `reached_at`), not
    from the summary stored beside them, which an older version may have computed by another rule."""
    settings = data["settings"]
    if not isinstance(settings.get("holdout"), int) or settings["holdout"] <= 0:
        raise ConfigError(f"{source} was raced on the test split, so choosing from it and reporting on it would "
                          "count the same luck twice", "select with `torchboost race --holdout N` first")
    if not data["runs"]:
        raise ConfigError(f"{source} holds no runs", "give the race.json a race wrote after its first round")
    lanes = lanes_of(data, source)
    lower = fixed_targets(summarize(lanes, raced_targets(settings, source)))["targets"][0]
    picks = []
    for _, racer, lr in ranked(lanes, lower):
        try:
            parsed = parse_racer(racer)
        except ConfigError:
            parsed = None
        if parsed is None or parsed.base not in OPTIMIZERS:
            raise ConfigError(f"{source} names racer {racer!r}, which is not a registered optimizer (NAME or "
                              "NAME@EPOCHS)", "select with this version's `torchboost race --holdout N`")
        # a racer without its own budget trained the selection's epochs: frozen at that budget, so a confirmation
        # run with another --epochs (the recipe's, by default) races what was selected
        picks.append(Selection(parsed.spec, lr, parsed.epochs if parsed.epochs is not None else settings.get("epochs")))
    return picks


def finalists(chosen: Sequence[Selection], count: int) -> list[Selection]:
    """The confirmation's racers when it cannot afford them all: the selection's best THOR-family racer and its
    `count - 1` best others (`chosen` is best first, `selections`) — decided on the held-out split, so which
    rival is left out is not a choice made after seeing the test split."""
    if count < 2:
        raise ConfigError(f"--finalists {count} leaves THOR without a rival", "give --finalists 2 or more")
    thor = [s for s in chosen if is_thor(s.optimizer)][:1]
    others = [s for s in chosen if not is_thor(s.optimizer)][:count - len(thor)]
    return [s for s in chosen if s in thor or s in others]


def raced_targets(settings: dict, source: str) -> tuple[float, ...]:
    """The targets a saved race raced (its settings), each an accuracy in (0, 1]."""
    try:
        targets = tuple(float(t) for t in settings["targets"])
    except (KeyError, TypeError, ValueError):
        targets = ()
    if not targets or not all(0 < t <= 1 for t in targets):
        raise ConfigError(f"{source} does not say which targets it raced", "give the race.json a race wrote")
    return targets


def frozen_racers(chosen: Sequence[Selection], cfg: Config) -> list[Racer]:
    """Each selection as one racer at its lr, on the budget its selection chose (`selections`: its own or the
    selection race's epochs)."""
    return [budget_racers(variant_racer(s.optimizer, cfg, (s.lr,)), [s.epochs] if s.epochs else None)[0]
            for s in chosen]


def pooled_settings(settings: dict, lanes: Sequence[Lane], paths: Sequence[str]) -> dict:
    """A pooled race's settings: the first file's, with the files named and the span of every seed pooled (what
    a --frozen confirmation must stay clear of)."""
    seeds = sorted({l.seed for l in lanes}) or [0]
    return {**settings, "pooled": [str(p) for p in paths], "first_seed": seeds[0], "seeds": seeds[-1] - seeds[0] + 1}


def check_same_task(data: dict, source: str, recipe: str, overrides: Sequence[str]) -> None:
    """A frozen race must race the task its selection ran: the same recipe and overrides (its targets:
    `confirmation_targets`)."""
    settings = data["settings"]
    for what, theirs, mine in (("recipe", settings.get("recipe"), recipe),
                               ("overrides", settings.get("overrides"), list(overrides))):
        if theirs != mine:
            raise ConfigError(f"{source} selected on {what} {theirs!r}, this race has {mine!r}",
                              f"race the selection's {what} (or select again)")


TARGET_MARGINS = (0.015, 0.003)  # below the best rival's median final accuracy: the two targets
TARGET_RULE_TEXT = "the best rival's median final less 1.5 and 0.3 points"


def fixed_targets(summary: dict) -> dict:
    """The targets of a selection or a confirmation, by one rule applied to its own runs: the best rival's median
    final top-1 (at its chosen lr) less 1.5 and less 0.3 points — on a confirmation's test split, so that the
    rival's median seed reaches both there (`confirmation_targets`). The rivals are the racers outside the THOR
    family when both kinds raced (THOR's variants are not each other's rivals, `is_thor`), else every racer.
    Recorded with the rival, its median final and whether its runs trained their whole budget (the finals then
    compare at matched budgets)."""
    finals = {n: f for n, f in summary["final"].items() if math.isfinite(f["median"])}
    if not finals:
        raise ConfigError("the selection has no final accuracy to fix the confirmation's targets from",
                          "select again: every racer needs at least one evaluation")
    rivals = [n for n in finals if not is_thor(n)] if any(is_thor(n) for n in finals) else list(finals)
    order = sorted(rivals or finals, key=lambda n: -finals[n]["median"])
    rival, best = order[0], finals[order[0]]["median"]
    targets = [round(best - margin, 6) for margin in TARGET_MARGINS]
    if targets[0] <= 0:
        raise ConfigError(f"the best rival {rival} ends at {best:.1%}: no target lies 1.5 points below it",
                          "select on a task the racers learn")
    return {"targets": targets, "rival": rival, "rival_median_final": best,
            "runner_up_final": finals[order[1]]["median"] if len(order) > 1 else None,
            "whole_budget": bool(finals[rival]["whole_budget"]), "stopped": list(finals[rival].get("stopped", [""]))}


def confirmation_targets(data: dict, source: str, given: Sequence[float] | None) -> tuple[float, ...]:
    """The targets a confirmation races while it runs: its selection's (`fixed_targets` on the held-out split,
    checked against the selection's own runs), for its progress only — every run trains its whole budget, and
    when the race ends its targets are the rule applied to its own runs on the test split (`fixed_targets`), which
    the selection's held-out figures cannot promise. --targets is refused: a confirmation's targets are the rule's."""
    stored = data["settings"].get("fixed_targets")
    if not isinstance(stored, dict) or not isinstance(stored.get("targets"), list):
        raise ConfigError(f"{source} fixes no targets for its confirmation",
                          "select again with this version, or pool it with `torchboost race --report FILE -o DIR` "
                          "(which fixes them) and confirm from DIR/race.json")
    fixed = fixed_targets(summarize(lanes_of(data, source), raced_targets(data["settings"], source)))["targets"]
    if [float(t) for t in stored["targets"]] != fixed:
        raise ConfigError(f"{source} records targets {stored['targets']} but its runs give {fixed}",
                          "confirm from an unmodified selection (or select again)")
    if given is not None:
        raise ConfigError(f"--targets {' '.join(f'{t:g}' for t in given)}: a confirmation's targets are "
                          f"{TARGET_RULE_TEXT}, on the test split", "drop --targets")
    return tuple(fixed)


def check_fresh_seeds(data: dict, source: str, seeds: range) -> None:
    """A frozen race reports seeds its selection never ran."""
    settings = data["settings"]
    try:
        used = range(int(settings["first_seed"]), int(settings["first_seed"]) + int(settings["seeds"]))
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{source} does not say which seeds it raced", "select with this version's "
                          "`torchboost race --holdout N`") from None
    shared = sorted(set(used) & set(seeds))
    if shared:
        raise ConfigError(f"seeds {shared[0]}..{shared[-1]} were raced by the selection in {source}",
                          f"confirm on fresh seeds: --first-seed {used.stop} (or higher)")


def pooled_lanes(paths: Sequence[Path]) -> list[Lane]:
    """The runs of several race.json files as one race: only when every file raced the same racers (a racer
    raced in one process alone saw another machine load) or every file is a stage of one selection (`--holdout`),
    each (racer, lr, seed) run counted once."""
    files = [(p, read_race(p)) for p in paths]
    for path, data in files[1:]:  # one task, one evaluation split (a selection never pools with a confirmation)
        for key in ("recipe", "overrides", "holdout", "epochs"):
            if data["settings"].get(key) != files[0][1]["settings"].get(key):
                raise ConfigError(f"{path} raced {key} {data['settings'].get(key)!r}, {files[0][0]} "
                                  f"{files[0][1]['settings'].get(key)!r}", "pool only races of one task")
    racers = [frozenset(str(r.get("optimizer")) for r in data["runs"] if isinstance(r, dict)) for _, data in files]
    # stages of one selection (a budget grid at the lrs an lr grid chose, a grid extended at its winning edge) race
    # other racers by design: each stage's processes race the same racers (so each saw the same load), and
    # a selection compares a racer's own configurations, never a time across racers
    stages = all(isinstance(data["settings"].get("holdout"), int) and data["settings"]["holdout"] > 0
                 for _, data in files)
    for (path, _), mine in zip(files, racers):
        if mine != racers[0] and not stages:
            odd = sorted(mine ^ racers[0])
            raise ConfigError(f"{path} raced {sorted(mine)}, {files[0][0]} raced {sorted(racers[0])} "
                              f"(differ in {', '.join(odd)})", "pool only races of the same racers (race the "
                              "missing ones in every process)")
    lanes, seen = [], set()
    for path, data in files:
        for lane in lanes_of(data, path):
            key = (lane.racer, lane.lr, lane.seed)
            if key not in seen:
                seen.add(key)
                lanes.append(lane)
    return lanes


def lanes_of(data: dict, source: Path | str) -> list[Lane]:
    """The runs of a read race.json as lanes (history only), each field checked."""
    lanes = []
    for r in data["runs"]:
        try:
            history = [dict(epoch=float(h["epoch"]), seconds=float(h["seconds"]),
                            val_top_1_accuracy=float(h["val_top_1_accuracy"]),
                            **{k: v for k, v in h.items() if k not in ("epoch", "seconds", "val_top_1_accuracy")})
                       for h in r["history"]]
            lr = float(r["lr"])
            if isinstance(r["lr"], bool) or not (math.isfinite(lr) and lr > 0) or not history:
                raise ValueError("an lr that is not a finite number > 0, or no evaluation")
            lane = Lane(str(r["optimizer"]), lr, int(r["seed"]), None, None, None,  # type: ignore[arg-type]
                        seconds=history[-1]["seconds"], history=history, stopped=str(r.get("stopped") or ""))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ConfigError(f"{source} holds a run that is not a race run", "give the race.json a race wrote") from None
        lanes.append(lane)
    return lanes


def fixed_targets_line(fixed: dict, split: str = "the held-out split") -> str:
    """The targets a selection (`split`: its held-out split) or a confirmation (the test split) fixed and why."""
    shown = " and ".join(fmt_target(t) for t in fixed["targets"])
    note = "" if fixed["whole_budget"] else f"; {stop_note(fixed.get('stopped', ['']))}"
    why = ("the rival's median seed reaches both" if split == "the test split" else
           "ranked at the lower, the higher reported only; a confirmation applies the rule to its own runs on the "
           "test split")
    return (f"targets: {shown} = {TARGET_RULE_TEXT} on {split} (rival {fixed['rival']}, median final "
            f"{fmt_target(fixed['rival_median_final'])}{note}): {why}")


def close_selection(lanes: Sequence[Lane], raced: Sequence[float], images: int | None) -> tuple[dict, dict, list[str]]:
    """What a selection (or a pool of its stages) fixes when it ends, and says: its targets (`fixed_targets`, from
    the runs at the raced targets), the choices (`ranked` at the lower target), whether removing one of the
    `images` held-out images could flip one (`one_image_check`), a warning under 3 seeds a configuration
    (`few_seeds`), and the grids whose winner at the lower target sits at an edge (`grid_edges`)."""
    fixed = fixed_targets(summarize(lanes, raced))
    lower = fixed["targets"][0]
    check = one_image_check(lanes, fixed, images)
    chosen = "; ".join(f"{racer} (lr {lr:g}): " + (f"{key[1]:.1f} s" if key[0] == 0 else "never")
                       for key, racer, lr in ranked(lanes, lower))
    return fixed, check, [*grid_edges(lanes, lower), fixed_targets_line(fixed),
                          f"chosen, best first (median seconds to {fmt_target(lower)}): {chosen}",
                          one_image_line(check), *few_seeds(lanes)]


def grid_edges(lanes: Sequence[Lane], lower: float) -> list[str]:
    """One line per racer whose lr chosen at the lower target (`configurations`, the rule `selections` picks by) is
    the lowest or highest of the two or more it raced: the best may lie beyond the grid, so the line names the next
    lr out (the grid's own step there) to race in another stage. A budget racer (`NAME@EPOCHS`) has no grid of its
    own: it races the lrs its optimizer's grid chose."""
    best: dict[str, tuple[tuple, float]] = {}
    for (racer, lr), key in configurations(lanes, lower).items():
        if racer not in best or key < best[racer][0]:
            best[racer] = (key, lr)
    lines = []
    for racer, (_, lr) in best.items():
        raced = sorted({l.lr for l in lanes if l.racer == racer})
        if len(raced) < 2 or lr not in (raced[0], raced[-1]) or parse_racer(racer).epochs is not None:
            continue
        step = raced[1] / raced[0] if lr == raced[0] else raced[-1] / raced[-2]
        beyond = float(f"{(lr / step if lr == raced[0] else lr * step):.3g}")
        side = "lowest" if lr == raced[0] else "highest"
        lines.append(f"grid edge: {racer} chose lr {lr:g}, the {side} it raced: race --lr '{racer}={beyond:g}' in "
                     "another selection stage and pool it (--report) before confirming")
    return lines
