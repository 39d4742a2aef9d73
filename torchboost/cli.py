"""`torchboost` command line: the parser assembled from the subcommands (`torchboost.commands`, one module each),
the one dispatch and the one error printer."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Callable, Optional, Sequence

from .commands import command_modules
from .commands.args import OneLineParser
from . import scratch
from .errors import TorchboostError, printable


def build_parser(complete: bool = False) -> argparse.ArgumentParser:
    """The `torchboost` parser. Subcommands whose arguments read a registry add them when used (see
    OneLineParser); `complete=True` adds them all now (for code that inspects every subcommand's actions)."""
    from . import __version__

    p = OneLineParser(prog="torchboost", description="Train image classifiers faster on PyTorch.")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    p.add_argument("--version", action="version", version=f"torchboost {__version__}")
    sub = p.add_subparsers(dest="command")
    for command in command_modules():
        parser = sub.add_parser(command.NAME, help=command.HELP, later=getattr(command, "later_arguments", None))
        command.arguments(parser)
        parser.set_defaults(func=command.run, threads_applied=getattr(command, "THREADS", False))
    if complete:
        for parser in sub.choices.values():
            parser.complete()
    return p


def _one_line(e: TorchboostError) -> str:
    """An error raised in a DataLoader worker comes back wrapped in torch's traceback text; its last line
    holds the original `Type: what — fix`."""
    lines = str(e).strip().splitlines()
    if len(lines) <= 1:
        return str(e)
    last = lines[-1]
    return last.split(": ", 1)[1] if last.startswith("torchboost.errors.") else last


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any("\0" in a for a in argv):  # a shell cannot pass one; an API caller can, and no path may hold it
        print("error: an argument holds a NUL character — remove it", file=sys.stderr)
        return 2
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, a usage error (already printed): a code, not an exception
        return int(e.code or 0)
    if args.command is None:  # `torchboost` alone = the main job
        args = parser.parse_args([*(["--debug"] if args.debug else []), "train"])
    func: Callable[[argparse.Namespace], int] = args.func
    # libraries' caches (torch's compiler folder at its import, matplotlib's fonts): in a private folder removed
    # at the end, set before anything imports them; a run's own folder still holds what it caches
    with scratch.private_folder():
        return _run(func, args)


def _run(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        if args.threads_applied and args.threads is not None:  # train, race, lr-find: their own
            import torch

            torch.set_num_threads(args.threads)
        return func(args)
    except TorchboostError as e:
        if args.debug:
            traceback.print_exc()
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `torchboost ... | head`: the reader left; say nothing, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as e:  # a file system refusal nothing above turned into a one-line error yet
        where = f"{printable(e.filename)}: " if e.filename else ""  # a name from a file: no forged lines
        print(f"error: {where}{printable(e.strerror or e)} — check the path and its permissions", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # `train` says what it left itself (see _interrupted)
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
