"""`torchboost export-shards`: write an image folder as WebDataset tar shards (for data.dataset=shards)."""

from __future__ import annotations

import argparse
from pathlib import Path

from torchboost.commands.args import whole_number
from torchboost.errors import printable

NAME = "export-shards"
HELP = "write an image folder as WebDataset tar shards (for data.dataset=shards)"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="FOLDER", help="image folder with train/ and val/ (or test/), one sub-folder per class")
    p.add_argument("out", help="folder for OUT/{split}-000000.tar ... and the index OUT/_info.json")
    p.add_argument("--shard-size", type=whole_number, default=1000, help="images per shard (default 1000)")
    p.add_argument("--overwrite", action="store_true",
                    help="replace an earlier export in OUT, deleting only its own files (its index, the shards it "
                         "lists, their offsets); without it such a folder is refused. Other files in OUT are "
                         "always left alone, as train leaves them in its output folder")


def run(args: argparse.Namespace) -> int:
    from ..data.export import export_shards
    from ..errors import OutputError

    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise OutputError(f"OUT {args.out} is a file, not a folder", "choose a folder path")
    index = export_shards(args.source, args.out, args.shard_size, overwrite=args.overwrite)
    for name, split in index.splits.items():
        print(f"{name}: {sum(split.lengths)} images, {len(split.classes)} classes in {len(split.filenames)} shard(s)")
    print(f"wrote shards and their index to {printable(args.out)}; train on them with "
          f"--set data.dataset=shards --set data.path={printable(args.out)}")
    return 0
