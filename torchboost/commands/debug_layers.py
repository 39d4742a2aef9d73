"""`torchboost debug-layers`: per-layer output/gradient statistics for one batch."""

from __future__ import annotations

import argparse
import json

from torchboost.fileio import atomic_write
from torchboost.commands.args import DIAGNOSTIC_BATCH, add_recipe, add_threads

NAME = "debug-layers"
HELP = "per-layer output/gradient statistics for one batch"
THREADS = True  # main applies --threads before run()


def arguments(p: argparse.ArgumentParser) -> None:
    add_recipe(p)
    p.add_argument("--checkpoint", help="weights to inspect (default: fresh initialisation)")
    p.add_argument("--batch-size", type=DIAGNOSTIC_BATCH, default=16, help="images in the batch")
    p.add_argument("--batch", choices=["random", "data"], default="data",
                   help="a batch of the evaluation data (default) or random inputs")
    p.add_argument("--eval-mode", action="store_true", help="BN in eval mode")
    p.add_argument("--json", metavar="OUT.json", help="also write the statistics as JSON")
    add_threads(p)


def run(args: argparse.Namespace) -> int:
    from ..debug import layer_stats_from_config

    report = layer_stats_from_config(args.config, args.set or [], checkpoint=args.checkpoint,
                                     batch_size=args.batch_size, batch_source=args.batch,
                                     train_mode=not args.eval_mode)
    print(report.table())
    if args.json:
        atomic_write(args.json, json.dumps(report.to_dict(), indent=2))
    return 0
