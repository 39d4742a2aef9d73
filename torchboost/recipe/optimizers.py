"""The recipe's optimizer policy: what a recipe adds to the library's optimizer registry.

The registry (`torchboost.optim.registry`) builds and describes an optimizer from per-update arguments.
What depends on the kind of run lives here:

- option sections: `optim.<options_key>` is the registry entry's options dataclass, unless a recipe class
  below extends it with keys counted in epochs (`optim.thor.damping_decay`), which become the library's
  per-update options once the run's updates per epoch are known (`library_options`). A key a section's
  dataclass lists in its `REMOVED` table gets a one-line error that says it was removed and why
  (`drop_removed`; `recipe.config.merge` asks the same table for recipes, --set and saved configs).
  A new optimizer with options needs no line here: its section is its own dataclass.
- the race: the lr grid `torchboost race` tries, the family whose members are not each other's rivals,
  and whether it races when no `--optimizers` are given. An optimizer not listed races over
  DEFAULT_LR_GRID, so a new registry entry races without a line here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Optional

import numpy as np

from torchboost.errors import ConfigError
from torchboost.optim.registry import OPTIMIZERS, OptimizerEntry, get_optimizer, list_optimizers
from torchboost.optim.thor import get_thor_damping
from torchboost.optim.thor.args import Removed, ThorOptions
from torchboost.options import check_options, option


# --- option sections --------------------------------------------------------------------------------------
@dataclass
class ThorRecipeOptions(ThorOptions):
    """`optim.thor`: THOR's options (`ThorOptions`) plus MindSpore's damping generator, counted in epochs."""

    damping_decay: Optional[float] = option(None, gt=0, help="damping(e) = damping * damping_decay ^ (e / 10) "
                                                           "(MindSpore's recipe: 0.5467; above 1 the damping grows "
                                                           "and THOR fades into its first-order update); unset: "
                                                           "constant")

    REMOVED: ClassVar[dict[str, Removed]] = {**ThorOptions.REMOVED,
                                             "first_order_epoch": ThorOptions.REMOVED["first_order_after"]}


def drop_removed(cls: type, values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`values` for the options dataclass `cls` less the keys its `REMOVED` table lists that hold what the code
    does now (a config saved before their removal writes them); any other value of one is a one-line error
    saying it was removed, why, and to delete it. `where`: the section's dotted name (`optim.thor`)."""
    removed = getattr(cls, "REMOVED", {})
    for key in values.keys() & removed.keys():
        removed[key].check(f"{where}.{key}", values[key])
    return {k: v for k, v in values.items() if k not in removed}


def check_thor_recipe(t: ThorRecipeOptions) -> None:
    """`optim.thor`'s combinations of epoch keys and the library's (the library checks the rest)."""
    if t.damping_decay is not None and isinstance(t.damping, list):
        raise ConfigError("damping is a per-update list and damping_decay is set",
                          "give damping as one number with damping_decay, or the list alone")


def thor_per_update(t: ThorRecipeOptions, updates_per_epoch: int, epochs: int) -> ThorOptions:
    """`optim.thor` in updates: the ThorOptions THOR takes, damping_decay turned into MindSpore's per-update
    damping (get_thor_damping)."""
    options = shared_fields(t, ThorOptions)
    if t.damping_decay is not None:
        with np.errstate(over="ignore"):
            options.damping = get_thor_damping(0, t.damping, t.damping_decay, epochs, updates_per_epoch)
        if not np.isfinite(options.damping).all():
            raise ConfigError(f"optim.thor.damping_decay {t.damping_decay:g} takes the damping past the float range "
                              f"within {epochs} epochs", "use a damping_decay nearer 1 (30 grows it 30x per 10 epochs)")
    return options


@dataclass(frozen=True)
class RecipeSection:
    """A recipe's own dataclass for a registry entry's options section, and how its values become the
    library's options (given the run's updates per epoch and epochs)."""

    options: type
    to_library: Callable[[Any, int, int], Any]
    check: Callable[[Any], None] | None = None  # combinations of its own keys


RECIPE_SECTIONS: dict[str, RecipeSection] = {"thor": RecipeSection(ThorRecipeOptions, thor_per_update, check_thor_recipe)}


def section_class(key: str) -> type:
    """The dataclass a recipe's `optim.<key>` is written in: the recipe's, or the registry entry's own."""
    if key in RECIPE_SECTIONS:
        return RECIPE_SECTIONS[key].options
    return next(e.options for e in OPTIMIZERS.values() if e.options_key == key)


def section_keys() -> list[str]:
    """Every options section of the registered optimizers, in registry order."""
    return list(dict.fromkeys(e.options_key for e in OPTIMIZERS.values() if e.options_key))


def option_sections() -> dict[str, Any]:
    """`optim`'s option sections at their defaults: one per section of the registered optimizers."""
    return {key: section_class(key)() for key in section_keys()}


def typed_section(key: str, value: Any) -> Any:
    """`optim.<key>` as its dataclass: an instance as it is (its fields were checked by the validation pass),
    or a mapping / another dataclass (written in Python) checked key by key and laid over the defaults."""
    if key not in section_keys():
        raise ConfigError(f"optim.{key} is not the options section of any optimizer",
                          f"sections: {', '.join(section_keys()) or 'none'}")
    cls = section_class(key)
    if isinstance(value, cls):
        return value
    values = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    if not isinstance(values, Mapping):
        raise ConfigError(f"optim.{key} must be a mapping of options, got {type(value).__name__} {value!r}",
                          f"write e.g. optim.{key}={{key: value}}")
    values = drop_removed(cls, values, f"optim.{key}")
    return dataclasses.replace(cls(), **check_options(values, cls, f"optim.{key}"))


def shared_fields(section: Any, cls: type) -> Any:
    """An instance of `cls` from the fields `section` shares with it (a recipe section's epoch keys left out)."""
    if type(section) is cls:
        return section
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in dataclasses.asdict(section).items() if k in names})


def library_view(section: Any, entry: OptimizerEntry) -> Any:
    """The entry's own options from the fields a recipe section shares with them (epoch keys left out): what
    the entry's check can judge before the run's length is known."""
    return shared_fields(section, entry.options)


def check_section(entry: OptimizerEntry, section: Any) -> None:
    """The options section of `entry` as a whole: the recipe's combinations, then the entry's own check."""
    recipe = RECIPE_SECTIONS.get(entry.options_key)
    if recipe is not None and recipe.check is not None:
        recipe.check(section)
    if entry.check is not None:
        entry.check(library_view(section, entry))


def library_options(entry: OptimizerEntry, section: Any, updates_per_epoch: int, epochs: int) -> Any:
    """The options instance the entry's builder gets: the recipe section converted to updates, or as it is."""
    if entry.options_key is None:
        return None
    recipe = RECIPE_SECTIONS.get(entry.options_key)
    section = typed_section(entry.options_key, section)
    if recipe is not None:
        return recipe.to_library(section, updates_per_epoch, epochs)
    return section


# --- the race ---------------------------------------------------------------------------------------------
DEFAULT_LR_GRID = (0.01, 0.02, 0.05)
THOR_FAMILY = "thor"


@dataclass(frozen=True)
class RacePolicy:
    lr_grid: tuple[float, ...] = DEFAULT_LR_GRID  # what `torchboost race` tries when no --lr is given
    family: str = ""  # entries of one family (THOR and its variants) are not each other's rivals in a race
    by_default: bool = True  # raced when `torchboost race` is given no --optimizers
    # after the recipe's warm-up the lr holds at its peak instead of following the recipe's decay: schedule-free
    # optimizers average their iterates in place of a decay (a decay on top is not how they are used)
    hold_lr: bool = False


RACE_POLICY: dict[str, RacePolicy] = {
    "adamw": RacePolicy((0.001, 0.002, 0.005)),
    "normuon": RacePolicy(by_default=False),
    "thor": RacePolicy(family=THOR_FAMILY),
    "thor_muon": RacePolicy(family=THOR_FAMILY, by_default=False),
    "thor_normuon": RacePolicy(family=THOR_FAMILY, by_default=False),
    "thor_ekfac": RacePolicy(family=THOR_FAMILY, by_default=False),
    "thor_soap": RacePolicy((0.001, 0.003, 0.01), family=THOR_FAMILY, by_default=False),  # SOAP's (Adam's) lrs
    # optional packages (the `optimizers` extra): never raced unless named, so a default race needs no extra.
    # Grids from the packages' advice: schedule-free SGD 10-50x SGD's lr, schedule-free AdamW 1-10x AdamW's
    "sgd_schedulefree": RacePolicy((0.5, 1.0, 2.0), by_default=False, hold_lr=True),
    "adamw_schedulefree": RacePolicy((0.002, 0.005, 0.01), by_default=False, hold_lr=True),
    "soap": RacePolicy((0.001, 0.003, 0.01), by_default=False),
}


def race_policy(name: str) -> RacePolicy:
    """The race policy of registered optimizer `name` (the defaults when none is listed)."""
    get_optimizer(name)
    return RACE_POLICY.get(name, RacePolicy())


def default_racers() -> list[str]:
    """What `torchboost race` races when given no --optimizers."""
    return [name for name in list_optimizers() if race_policy(name).by_default]
