"""Racer names, read in one place: `NAME[KEY=VALUE,...]@EPOCHS` — a registered optimizer, the options its variant
changes (`thor[graft=muon_step]`) and its own epoch budget (`muon@8`, `thor[graft=grad]@12`). The race, its
reports, the select/confirm protocol and benchmarks/race.py all parse a name with `parse_racer`."""

from __future__ import annotations

from dataclasses import dataclass

from torchboost.errors import ConfigError

MAX_BUDGET = 100_000  # epochs


@dataclass(frozen=True)
class RacerName:
    base: str  # the optimizer the racer is (`thor` in `thor[graft=grad]@8`)
    options: tuple[tuple[str, str], ...] = ()  # (key, value) pairs its variant sets, as written
    epochs: int | None = None  # its own epoch budget (`@EPOCHS`), None: the race's

    @property
    def spec(self) -> str:
        """The name without its budget: `thor[graft=grad]`."""
        inner = ",".join(f"{k}={v}" for k, v in self.options)
        return f"{self.base}[{inner}]" if self.options else self.base


def parse_racer(name: str) -> RacerName:
    """`name` read as NAME[KEY=VALUE,...]@EPOCHS (the brackets and the budget optional); a name of another shape is
    one ConfigError naming it."""
    fix = "write NAME, NAME[KEY=VALUE,...] or either @EPOCHS, e.g. thor[graft=muon_step]@8"
    spec, at, budget = name.partition("@")
    if at and not (budget.isascii() and budget.isdigit() and 1 <= int(budget) <= MAX_BUDGET):  # not '²' or '٣'
        raise ConfigError(f"racer {name[:80]!r}: the budget after @ is not a whole number of epochs from 1 to "
                          f"{MAX_BUDGET}", fix)
    base, bracket, inner = spec.partition("[")
    if not base.strip() or (bracket and (not inner.endswith("]") or "[" in inner or "]" in inner[:-1])):
        raise ConfigError(f"racer {name[:80]!r} is not NAME[KEY=VALUE,...]", fix)
    options = []
    for item in filter(None, inner[:-1].split(",")) if bracket else ():
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"racer {name[:80]!r}: {item!r} is not KEY=VALUE", fix)
        options.append((key.strip(), value))
    return RacerName(base.strip(), tuple(options), int(budget) if at else None)
