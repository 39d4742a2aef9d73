"""Subcommands are one module each (`torchboost.commands`): adding one is a module and a line in COMMANDS, and
every module has the parts the parser reads."""

from __future__ import annotations

import sys
import types

import torchboost.commands as commands
from torchboost.cli import build_parser, main


def test_a_new_subcommand_is_one_module_and_one_registry_line(monkeypatch, capsys):
    hello = types.ModuleType("torchboost.commands.hello")
    hello.NAME, hello.HELP = "hello", "say hello"
    hello.arguments = lambda p: p.add_argument("--name", default="world")
    hello.run = lambda args: print(f"hello {args.name}") or 0
    monkeypatch.setitem(sys.modules, "torchboost.commands.hello", hello)
    monkeypatch.setattr(commands, "COMMANDS", (*commands.COMMANDS, "hello"))
    assert main(["hello", "--name", "you"]) == 0
    assert capsys.readouterr().out == "hello you\n"
    assert "say hello" in build_parser().format_help()


def test_every_command_module_declares_its_parts():
    names = []
    for module in commands.command_modules():
        assert isinstance(module.NAME, str) and isinstance(module.HELP, str) and module.HELP
        assert callable(module.arguments) and callable(module.run)
        names.append(module.NAME)
    parser = build_parser(complete=True)
    assert list(parser._subparsers._group_actions[0].choices) == names
