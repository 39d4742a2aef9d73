"""`torchboost recipes`: list shipped recipes or show one."""

from __future__ import annotations

import argparse

from torchboost.errors import TorchboostError

NAME = "recipes"
HELP = "list shipped recipes or show one"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", nargs="?", choices=["list", "show"], default="list",
                   help="list the recipes with what each trains (default), or show one's YAML")
    p.add_argument("name", nargs="?", help="the recipe to show")


def run(args: argparse.Namespace) -> int:
    import itertools

    from ..recipe.files import find_recipe, list_recipes

    if args.action == "show":
        if not args.name:
            raise TorchboostError("`torchboost recipes show` needs a recipe name", "run `torchboost recipes` to list them")
        print(find_recipe(args.name).read_text(), end="")
    else:
        for name in list_recipes():  # each recipe's opening comment says what it trains: its first sentence
            lines = find_recipe(name).read_text().splitlines()
            text = " ".join(l.lstrip("# ").strip() for l in itertools.takewhile(lambda l: l.startswith("#"), lines))
            first = text.split(". ")[0].split(": ")[0].rstrip(".")
            if first.count("(") > first.count(")"):  # cut where a parenthesis opens but does not close
                first = first[:first.rfind("(")].rstrip(" ,")
            print(f"{name:<24} {first[:100]}".rstrip())
    return 0
