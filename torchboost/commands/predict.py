"""`torchboost predict`: top-k classes of image files (or every image in folders)."""

from __future__ import annotations

import argparse
import csv
import json
import sys

from torchboost.errors import printable
from torchboost.escape import csv_cell
from torchboost.commands.args import add_recipe, add_threads, positive_int

NAME = "predict"
HELP = "top-k classes of image files (or every image in folders)"
THREADS = True  # main applies --threads before run()


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="a training checkpoint, weights in any format with --config, "
                                                       "or an .onnx from `torchboost export` (run by ONNX Runtime, "
                                                       "preprocessed as it records)")
    add_recipe(p, None, "recipe that built plain weights (training checkpoints carry theirs)")
    p.add_argument("--topk", type=positive_int, default=5, help="classes to show per image (default 5)")
    p.add_argument("--format", choices=["text", "json", "csv"], default="text", help="output format")
    p.add_argument("images", nargs="+", help="image files or folders")
    add_threads(p)


def run(args: argparse.Namespace) -> int:
    from ..recipe.infer import predict_images

    rows = predict_images(args.checkpoint, args.images, args.topk, config=args.config, overrides=args.set or [])
    if args.format == "json":  # one JSON document: names with any characters stay one value
        print(json.dumps([{"file": path, "top": [{"class": c, "probability": p} for c, p in preds]}
                          for path, preds in rows], indent=1))
    elif args.format == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(["file", "rank", "class", "probability"])
        # names escaped as in text (a terminal shows CSV too) and never a formula; --format json keeps them exact,
        writer.writerows([csv_cell(path), rank + 1, csv_cell(c), f"{p:.6f}"] for path, preds in rows
                         for rank, (c, p) in enumerate(preds))
    else:  # text: names from files (image paths, the checkpoint's class names) with control characters escaped,
        for path, preds in rows:  # so a class called "cat\nfile.png: dog 0.99" cannot print a line of its own
            print(f"{printable(path)}: " + ", ".join(f"{printable(c)} {p:.4f}" for c, p in preds))
    return 0
