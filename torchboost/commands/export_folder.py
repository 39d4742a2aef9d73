"""`torchboost export-folder`: write a built-in data set as an ImageNet-style image folder."""

from __future__ import annotations

import argparse

from torchboost.errors import printable

NAME = "export-folder"
HELP = "write a built-in data set as an ImageNet-style image folder"


def arguments(p: argparse.ArgumentParser) -> None:
    pass


def later_arguments(x: argparse.ArgumentParser) -> None:
    from ..data.builtin import BUILTIN_SETS
    from ..recipe.kinds import DEFAULT_KIND

    x.add_argument("--dataset", default=DEFAULT_KIND, choices=list(BUILTIN_SETS), help="which built-in set")
    x.add_argument("--out", required=True, help="folder to write OUT/train/<class>/*.png and OUT/test/")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..data.export import export_folder
    from ..errors import OutputError

    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise OutputError(f"--out {args.out} is a file, not a folder", "choose a folder path")
    out = export_folder(args.dataset, args.out)
    print(f"wrote {args.dataset} as an image folder under {printable(out)}")
    return 0
