"""`torchboost diff-config`: compare two recipes/configs/checkpoints side by side."""

from __future__ import annotations

import argparse
import json

from torchboost.fileio import atomic_write

NAME = "diff-config"
HELP = "compare two recipes/configs/checkpoints side by side"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help="a recipe, a YAML file, a run folder or a training checkpoint")
    p.add_argument("b", help="the other one")
    p.add_argument("--set-a", action="append", metavar="KEY=VALUE", help="override a key of A (repeatable)")
    p.add_argument("--set-b", action="append", metavar="KEY=VALUE", help="override a key of B (repeatable)")
    p.add_argument("--all", action="store_true", help="show equal keys too")
    p.add_argument("--json", metavar="OUT.json", help="also write the comparison as JSON")


def run(args: argparse.Namespace) -> int:
    from ..recipe.diff import diff_configs

    diff = diff_configs(args.a, args.b, args.set_a or [], args.set_b or [])
    print(diff.table(all_keys=args.all))
    if args.json:
        atomic_write(args.json, json.dumps(diff.to_dict(all_keys=args.all), indent=2))
    return 0
