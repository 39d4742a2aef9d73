"""`torchboost convert`: convert weights between MindSpore .ckpt, PaddlePaddle .pdparams, torch .pt/.pth and
.safetensors; prints the create_model call of the matching torch network."""

from __future__ import annotations

import argparse

from torchboost.commands.args import positive_int
from torchboost.errors import printable

NAME = "convert"
HELP = ("convert weights between MindSpore .ckpt, PaddlePaddle .pdparams, torch .pt/.pth and .safetensors; "
        "prints the create_model call of the matching torch network")


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="weights to read (.ckpt, .pdparams, .pt/.pth, .safetensors)")
    p.add_argument("output", help="file to write; its extension picks the format")
    p.add_argument("--arch", help="resnet18/34/50/101/152, or mnist_cnn for the PaddlePaddle tutorial CNN "
                   "(default: detected from the names; none: keep names)")
    p.add_argument("--num-classes", type=positive_int, help="classes of the classifier (default: from the weights)")
    p.add_argument("--drop-background", action="store_true", help="1001 -> 1000 classes (drop MindSpore's class 0)")
    p.add_argument("--add-background", action="store_true",
                   help="1000 -> 1001 classes when writing a .ckpt (add MindSpore's never-predicted class 0)")
    p.add_argument("--moments", action="store_true", help="also convert momentum buffers (moments.*)")
    p.add_argument("--no-strict", action="store_true", help="write even when tensors are unmapped or missing")


def run(args: argparse.Namespace) -> int:
    from ..migrate.convert import convert

    report = convert(args.input, args.output, arch=args.arch, num_classes=args.num_classes,
                     drop_background=args.drop_background, convert_moments=args.moments, strict=not args.no_strict,
                     add_background=args.add_background)
    print(report.summary())
    print(f"wrote {printable(args.output)}")
    return 0
