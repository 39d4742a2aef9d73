"""`torchboost options`: every config key: type, default, allowed values, meaning."""

from __future__ import annotations

import argparse

NAME = "options"
HELP = "every config key: type, default, allowed values, meaning"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("keys", nargs="*", metavar="KEY", help="keys or sections to show (e.g. optim.thor); default: all")
    p.add_argument("--markdown", action="store_true", help="the whole reference as Markdown (docs/CONFIG.md)")


def run(args: argparse.Namespace) -> int:
    from ..recipe.reference import render_markdown, render_text, select

    print(render_markdown() if args.markdown else render_text(select(args.keys)), end="" if args.markdown else "\n")
    return 0
