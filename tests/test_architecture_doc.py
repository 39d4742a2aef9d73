"""docs/ARCHITECTURE.md states facts the code can derive: the protocol's answers and their defaults, the packages of
each layer, the subcommands. Each is derived here and compared with the document, so the map fails a test when it
drifts from the code."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from torchboost.commands import COMMANDS
from torchboost.optim.protocol import TrainerProtocol

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text()


def protocol_block() -> str:
    start = DOC.index("class TrainerProtocol:")
    return DOC[start:DOC.index("```", start)]


def test_the_protocol_listed_is_the_protocols_answers_and_defaults():
    block = protocol_block()
    listed_flags = dict(re.findall(r"^\s+(\w+): ClassVar\[bool\] = (True|False)", block, re.M))
    listed_methods = set(re.findall(r"^\s+def (\w+)\(", block, re.M))
    flags = {n: v for n, v in vars(TrainerProtocol).items() if isinstance(v, bool)}
    methods = {n for n, v in vars(TrainerProtocol).items() if inspect.isfunction(v) and not n.startswith("_")}
    assert listed_flags == {n: str(v) for n, v in flags.items()}
    assert listed_methods == methods


def test_the_layer_diagram_names_every_package_and_top_module():
    diagram = DOC[DOC.index("## Layers"):DOC.index("```", DOC.index("```", DOC.index("## Layers")) + 3)]
    tops = {p.name + "/" for p in (ROOT / "torchboost").iterdir() if (p / "__init__.py").is_file()}
    tops |= {p.name for p in (ROOT / "torchboost").glob("*.py") if p.name != "__init__.py"}
    missing = sorted(t for t in tops if not re.search(rf"(?<![\w/]){re.escape(t)}", diagram))
    assert missing == [], f"docs/ARCHITECTURE.md's layer diagram does not place {missing}"


def test_the_subcommands_are_the_command_modules():
    modules = {p.stem for p in (ROOT / "torchboost" / "commands").glob("*.py")} - {"__init__", "args"}
    assert set(COMMANDS) == modules
