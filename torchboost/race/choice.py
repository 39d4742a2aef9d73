"""How a selection chooses, and whether one held-out image could change its mind.

Each optimizer's configuration (its lrs, and its budgets raced as `NAME@EPOCHS`) is ranked at the LOWER of the
selection's two targets by the median seconds over seeds to reach it (`selection_key`, `ranked`); the higher target
is reported, never ranked on. A configuration raced on fewer than 3 seeds is warned (`few_seeds`).

`one_image_check` is a bound, not a recomputation (a race keeps each evaluation's accuracy, not which images it got
right): removing one of N held-out images moves an accuracy a = H/N to (H - c)/(N - 1), by (a - c)/(N - 1), at most
1/(N - 1); the targets, a rival's median final less fixed margins, move by at most as much. So a comparison of an
accuracy with a target can turn only within 2/(N - 1) of it. Each configuration's key is bounded by its best case
(reached at the lower target less 2/(N - 1), its best accuracy 1/(N - 1) higher) and its worst (at the target plus
2/(N - 1), 1/(N - 1) lower); a choice survives when the chosen key's worst case still beats every other's best case.
Also checked: the rival whose final sets the targets stays ahead of the next (their medians more than 2/(N - 1)
apart). The rival's own lr is taken as chosen. "yes" is safe; "no" names each choice the bound cannot keep.
"""

from __future__ import annotations

import math
from typing import Sequence

from torchboost.errors import ConfigError
from torchboost.race.lanes import Lane
from torchboost.race.names import parse_racer
from torchboost.race.report import fmt_target, summarize

MIN_SEEDS = 3  # seeds a configuration needs before its median decides a choice


def selection_key(row: dict) -> tuple:
    """How a configuration ranks at the lower target: reached on the median seed first, by the fewest median
    seconds (then epochs); the others after, by their median best accuracy (an lr that learned beats one that
    diverged)."""
    if math.isfinite(row["median_seconds"]):
        return (0, row["median_seconds"], row["median_epochs"])
    return (1, -row["median_best"], 0.0)


def configurations(lanes: Sequence[Lane], target: float, shift: float = 0.0) -> dict[tuple[str, float], tuple]:
    """{(racer, lr): `selection_key` at `target`}. `shift` > 0: the key's best case when every accuracy and the
    target may each move by `shift` / 2 (reached at target - shift, the best accuracy `shift` / 2 higher);
    `shift` < 0: its worst case."""
    at = target - shift
    summary = summarize(lanes, [at])
    return {(racer, r["lr"]): selection_key({**r, "median_best": r["median_best"] + shift / 2})
            for racer, row in summary["targets"][f"{at:g}"].items() for r in row["per_lr"]}


def _optimizer(racer: str) -> str:
    """The optimizer a racer is, its budget dropped (`thor[graft=grad]@8` -> `thor[graft=grad]`); a name that is
    not a racer's stays itself (`select.selections` refuses it by name)."""
    try:
        return parse_racer(racer).spec
    except ConfigError:
        return racer


def best_of(keys: dict[tuple[str, float], tuple]) -> dict[str, tuple[tuple, str, float]]:
    """Per optimizer its best (key, racer, lr) among `keys`."""
    best: dict[str, tuple[tuple, str, float]] = {}
    for (racer, lr), key in keys.items():
        name = _optimizer(racer)
        if name not in best or key < best[name][0]:
            best[name] = (key, racer, lr)
    return best


def ranked(lanes: Sequence[Lane], lower: float) -> list[tuple[tuple, str, float]]:
    """(key, racer, lr) of each optimizer's best configuration at the lower target (`selection_key`), best first.
    The higher target is reported, never ranked on: a budget that reaches the lower target soonest is not passed
    over for a longer one whose merit is a higher target the confirmation may not reach."""
    return sorted(best_of(configurations(lanes, lower)).values(), key=lambda row: row[0])


def one_image_check(lanes: Sequence[Lane], fixed: dict, images: int | None) -> dict:
    """Whether removing any one of the `images` held-out images could flip a choice: each optimizer's configuration,
    the order of the optimizers (which `--finalists` reads) and the rival behind the targets (`fixed`, from
    `select.fixed_targets`). A bound (this module's docstring); {"survives": None} when the count is unknown."""
    if not images or images < 2:
        return {"method": "bound", "images": images, "survives": None, "flips": []}
    images = int(images)
    slack = 2 / (images - 1)
    lower = fixed["targets"][0]
    best_case, worst_case = configurations(lanes, lower, slack), configurations(lanes, lower, -slack)
    picks = ranked(lanes, lower)
    flips = []
    for key, racer, lr in picks:
        name = _optimizer(racer)
        others = [(r, l) for (r, l) in best_case if _optimizer(r) == name and (r, l) != (racer, lr)
                  and not worst_case[(racer, lr)] < best_case[(r, l)]]
        if others:
            flips.append(f"{name}: {racer} lr {lr:g} or {others[0][0]} lr {others[0][1]:g}")
    for (_, a, la), (_, b, lb) in zip(picks, picks[1:]):
        if not worst_case[(a, la)] < best_case[(b, lb)]:
            flips.append(f"order: {_optimizer(a)} before {_optimizer(b)}")
    runner_up = fixed.get("runner_up_final")
    if runner_up is not None and fixed["rival_median_final"] - runner_up <= slack:
        flips.append(f"rival: {fixed['rival']} ({fmt_target(fixed['rival_median_final'])}) or the next "
                     f"({fmt_target(runner_up)})")
    return {"method": "bound", "images": images, "survives": not flips, "flips": flips}


def one_image_line(check: dict) -> str:
    """The check for people: 'survives removing any one held-out image: yes/no (which choice flips)'."""
    if check["survives"] is None:
        return "survives removing any one held-out image: unknown (the race did not record how many it held out)"
    if check["survives"]:
        return (f"survives removing any one held-out image: yes (a bound: every accuracy and target moves by at most "
                f"1/{check['images'] - 1})")
    return ("survives removing any one held-out image: no (a bound, each accuracy and target within "
            f"1/{check['images'] - 1}; may flip: {'; '.join(check['flips'])})")


def few_seeds(lanes: Sequence[Lane]) -> list[str]:
    """A warning when a configuration raced on fewer than MIN_SEEDS seeds (its median is one or two draws)."""
    seeds: dict[tuple[str, float], set[int]] = {}
    for lane in lanes:
        seeds.setdefault((lane.racer, lane.lr), set()).add(lane.seed)
    thin = sorted(f"{racer} lr {lr:g}" for (racer, lr), s in seeds.items() if len(s) < MIN_SEEDS)
    if not thin:
        return []
    return [f"warning: {len(thin)} of {len(seeds)} configurations raced on fewer than {MIN_SEEDS} seeds "
            f"({', '.join(thin[:3])}{', ...' if len(thin) > 3 else ''}): a choice from one or two seeds is noise; "
            f"race --seeds {MIN_SEEDS} or more"]
