"""The subcommands of `torchboost`, one module each (as pip and git keep theirs): a module declares its `NAME`, its
`HELP`, `arguments(parser)` (and `later_arguments(parser)` where they read a registry or torch: added only when
that subcommand is used, so `torchboost --help` imports neither), `THREADS = True` when `main` applies --threads
for it, and `run(args) -> int`, which parses nothing more and prints what the library returns. Adding a
subcommand is one module and one line in COMMANDS."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["COMMANDS", "command_modules"]

# in `torchboost --help`'s order
COMMANDS = ("train", "launch", "eval", "predict", "recipes", "options", "export_folder", "export_shards", "export",
            "convert", "align", "diff_config", "debug_layers", "race", "lr_find", "bench")


def command_modules() -> list[ModuleType]:
    """Every subcommand's module, in COMMANDS' order (each imports only argparse and the standard library)."""
    return [importlib.import_module(f"torchboost.commands.{name}") for name in COMMANDS]
