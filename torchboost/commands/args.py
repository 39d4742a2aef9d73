"""What every subcommand's arguments share: the parser that keeps usage mistakes to one line and loads a
subcommand's registry-reading arguments only when it is used, and the argument types with their bounds."""

from __future__ import annotations

import argparse
import math
from typing import Callable, Optional

from torchboost.plaindata import ascii_number

DEFAULT_RECIPE = "mnist-lenet"


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes get the same one-line `error: ...` as every other error (exit 2), not a usage dump.

    A subcommand whose arguments read a registry or torch (the optimizer table's names, the built-in sets,
    bench's models) gives them as `later=add(parser)`: they are added when that subcommand is used, its
    arguments parsed or its help printed, so `torchboost --help` and the other subcommands start without
    importing the registries (and torch). `complete()` adds them at once, for code that reads the actions."""

    def __init__(self, *args, later: Optional[Callable[[argparse.ArgumentParser], None]] = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._later = later

    def complete(self) -> OneLineParser:
        later, self._later = self._later, None
        if later is not None:
            later(self)
        return self

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self.complete()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self.complete()
        return super().format_usage()

    def format_help(self) -> str:
        self.complete()
        return super().format_help()

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} — see `{self.prog} --help`\n")


def _shown(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:20]}…({len(text):,} characters)"  # one short line


def whole_number(text: str) -> int:
    """An argparse type: a whole number in ASCII digits (`plaindata.ascii_number`: '٣' is refused as
    `--set train.epochs=٣` is); its range is the config key's to check."""
    try:
        return int(ascii_number(text, int))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{_shown(text)!r} is not a whole number") from None


whole_number.__name__ = "int"  # argparse names the type in its messages


def int_between(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number in [low, high] (an upper bound keeps a typo from exhausting memory)."""
    def parse(text: str) -> int:
        value = whole_number(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{_shown(text)} is not between {low} and {high}")
        return value
    parse.__name__ = "int"
    return parse


positive_int = int_between(1, 2**31 - 1)


def positive_float(text: str) -> float:
    try:
        value = float(ascii_number(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a finite number > 0")
    return value


def accuracy_target(text: str) -> float:
    """An argparse type: a top-1 accuracy to reach, in (0, 1]."""
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an accuracy in (0, 1] (0.975 is 97.5%)")
    return value


def add_recipe(p: argparse.ArgumentParser, default: Optional[str] = DEFAULT_RECIPE,
               what: str = "recipe name or YAML path") -> None:
    """--config/-c (the recipe) and --set/-s (its overrides), as every command that reads a recipe takes them."""
    p.add_argument("--config", "-c", default=default, help=what)
    p.add_argument("--set", "-s", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")


def add_threads(p: argparse.ArgumentParser) -> None:
    """--threads N on a command that computes (main applies it before the command runs)."""
    p.add_argument("--threads", type=int_between(1, 1024), help="torch's CPU threads (default: torch's choice)")


DIAGNOSTIC_BATCH = int_between(1, 1024)  # align / debug-layers look at one batch: its activations are kept
