"""`torchboost lr-find`: lr range test: sweep the lr up over a few hundred updates and suggest one per optimizer (a
decade below the smoothed loss's lowest point), with a plot."""

from __future__ import annotations

import argparse

from torchboost.commands.args import int_between, positive_int, positive_float

NAME = "lr-find"
HELP = ("lr range test: sweep the lr up over a few hundred updates and suggest one per optimizer (a decade "
        "below the smoothed loss's lowest point), with a plot")


def arguments(p: argparse.ArgumentParser) -> None:
    pass


def later_arguments(lf: argparse.ArgumentParser) -> None:
    from ..optim.registry import OPTIMIZERS
    from ..recipe.lr_find import DEFAULT_RANGE, DEFAULT_UPDATES

    lf.add_argument("--config", "-c", default="mnist-lenet", help="recipe name or YAML path")
    lf.add_argument("--set", "-s", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    lf.add_argument("--data", help="data folder/file, as for train")
    lf.add_argument("--batch-size", "-b", type=positive_int, help="shortcut for --set data.batch_size=N")
    lf.add_argument("--optimizers", nargs="+", metavar="NAME", choices=list(OPTIMIZERS),
                    help=f"any of {' '.join(OPTIMIZERS)} (default: the recipe's optim.name)")
    lf.add_argument("--start", type=positive_float, default=DEFAULT_RANGE[0], help="first lr of the sweep")
    lf.add_argument("--end", type=positive_float, default=DEFAULT_RANGE[1], help="last lr of the sweep")
    lf.add_argument("--updates", type=int_between(10, 100_000), default=DEFAULT_UPDATES,
                    help="updates in the sweep (the lr grows geometrically from --start to --end)")
    lf.add_argument("--threads", type=int_between(1, 1024), default=1, help="torch threads")
    lf.add_argument("--output", "-o", help="folder for lr-find.json and lr-find.png (default runs/lr-find-<recipe "
                                           "name>)")


def run(args: argparse.Namespace) -> int:
    from ..recipe.lr_find import lr_find_from_recipe

    lr_find_from_recipe(args.config, args.set or [], args.data, args.batch_size, args.optimizers, args.start, args.end,
                        args.updates, args.threads, args.output)
    return 0
