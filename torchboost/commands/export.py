"""`torchboost export`: write a checkpoint for deployment: ONNX, TorchScript or an ExportedProgram, with its input
size, normalisation and class names recorded."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from torchboost.errors import printable
from torchboost.commands.args import add_recipe, add_threads

if TYPE_CHECKING:
    from torchboost.deploy import DeployInfo

NAME = "export"
HELP = ("write a checkpoint for deployment: ONNX, TorchScript or an ExportedProgram, with its input size, "
        "normalisation and class names recorded")
THREADS = True  # main applies --threads before run()


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", metavar="CKPT", help="a training checkpoint, or weights with --config")
    p.add_argument("out", metavar="OUT", nargs="+",
                   help="file(s) to write: .onnx, .pt2 (torch.export's ExportedProgram), .torchscript.pt or .ts "
                        "(TorchScript, deprecated by torch); several: the checkpoint read once, one trace for an "
                        ".onnx and a .pt2")
    p.add_argument("--format", choices=["onnx", "torchscript", "exported-program"],
                    help="the format of a single OUT (default: from its name, which must not name another)")
    add_recipe(p, None, "recipe that built plain weights (training checkpoints carry theirs)")
    add_threads(p)


def run(args: argparse.Namespace) -> int:
    from ..recipe.export import export_checkpoint

    export_checkpoint(args.checkpoint, args.out, args.format, config=args.config, overrides=args.set or [],
                      written=_say_written)
    return 0


def _say_written(out: str, fmt: str, info: "DeployInfo") -> None:
    """One line per file, printed as it is written."""
    stats = " ".join(f"{name} ({', '.join(f'{v:.4g}' for v in values)})" for name, values in
                     (("mean", info.mean), ("std", info.std)))
    print(f"wrote {printable(out)} ({fmt}): {info.model} on float32 N×{'×'.join(map(str, info.input_size))}, "
          f"normalised: resize {info.resize}, centre crop {info.size}, {stats}; {len(info.classes)} classes",
          flush=True)
