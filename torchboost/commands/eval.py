"""`torchboost eval`: evaluate a checkpoint (top-1/top-5/loss)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from torchboost.commands.args import add_recipe, add_threads
from torchboost.splits import SPLITS

NAME = "eval"
HELP = "evaluate a checkpoint (top-1/top-5/loss)"
THREADS = True  # main applies --threads before run()


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="a training checkpoint, or weights (.pt/.safetensors) "
                                                       "with --config")
    add_recipe(p, None, "recipe that built plain weights (training checkpoints carry theirs)")
    p.add_argument("--data", help="image folder to evaluate on (default: the run's own data)")
    p.add_argument("--split", choices=SPLITS,
                   help="the split to evaluate, read exactly: a folder's train/, val/ or test/ (default: the run's "
                        "evaluation split, a folder's val/ or else test/)")
    p.add_argument("--ema", action="store_true", help="evaluate the EMA weights")
    p.add_argument("--format", choices=["text", "json"], default="text",
                   help="output format (json: full precision and every per-class figure)")
    p.add_argument("--out", metavar="DIR", help="write per_class.csv, confusion.csv, confusion.png and "
                                                "per_class.json there")
    add_threads(p)


def run(args: argparse.Namespace) -> int:
    from ..recipe.infer import evaluate_checkpoint
    from ..recipe.per_class import summary_lines, write_per_class

    res = evaluate_checkpoint(args.checkpoint, args.data, args.split, use_ema=args.ema, config=args.config,
                              overrides=args.set or [])
    report, source = res.pop("per_class"), res.pop("data")
    written = write_per_class(report, Path(args.out), f"confusion on {source}",
                              lambda line: print(line, file=sys.stderr)) if args.out else []
    if args.format == "json":  # full precision, what it was computed on and every per-class figure, one document
        print(json.dumps({"evaluated_on": source, **res, "per_class": report,
                          "files": [str(p) for p in written]}, indent=1))
        return 0
    print(f"evaluated {source}: {res['samples']} images")  # names the folder it read
    print(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items()))
    print("\n".join(summary_lines(report)))
    if written:
        print(f"per-class results: {', '.join(str(p) for p in written)}")
    return 0
