"""`torchboost bench`: training-step and data-pipeline images/s, and which one limits."""

from __future__ import annotations

import argparse

from torchboost.commands.args import add_threads

NAME = "bench"
HELP = "training-step and data-pipeline images/s, and which one limits"
THREADS = True  # main applies --threads before run()


def arguments(p: argparse.ArgumentParser) -> None:
    add_threads(p)


def later_arguments(b: argparse.ArgumentParser) -> None:
    from ..bench import add_arguments

    add_arguments(b)


def run(args: argparse.Namespace) -> int:
    from ..bench import cmd_bench

    return cmd_bench(args)
