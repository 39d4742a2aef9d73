"""The reference of every config key, generated from the schema: `torchboost options` and docs/CONFIG.md.

Rows come from the dataclasses themselves (type, default, rules and the one-line `help` of each `option`
field), so the reference cannot drift from what `--set` accepts; a test compares docs/CONFIG.md with
`render_markdown()`. boost.config is MindSpore's free-form dict: its rows come from boost's own option
classes and switch list.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any, Union

import yaml

from torchboost.boost.config import ALGORITHMS, MODES, SECTIONS
from torchboost.errors import ConfigError, suggest
from torchboost.options import describe_rules, leaf_fields
from torchboost.recipe.config import Config
from torchboost.recipe.model_defaults import BATCH_WHY, FOLDER_DEFAULTS

CONFIG_DOC = "docs/CONFIG.md"


@dataclass(frozen=True)
class Row:
    key: str
    type: str
    default: str
    allowed: str
    help: str


def type_name(tp: Any) -> str:
    """'int', 'float or list of float', 'str, or unset' for a field's type hint."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        name = " or ".join(type_name(a) for a in args)
        return f"{name}, or unset" if len(args) < len(typing.get_args(tp)) else name
    if origin is list:
        return f"list of {type_name(typing.get_args(tp)[0])}"
    if tp is dict or origin is dict:
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def show(value: Any) -> str:
    """A default as it is written in a recipe (YAML flow style); None is 'unset'."""
    if value is None:
        return "unset"
    return yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("\n...").strip()


def rows() -> list[Row]:
    """Every key a recipe or `--set` can write, in schema order, then boost.config's keys."""
    out = [Row(key, type_name(tp), show(value), describe_rules(f), f.metadata.get("help", ""))
           for key, f, tp, value in leaf_fields(Config())]
    out.append(Row("boost.config.boost.mode", "str", "auto", "one of " + ", ".join(MODES),
                   "auto: the algorithms of boost.level; manual: the switches below; enable_all; disable_all"))
    out += [Row(f"boost.config.boost.{name}", "bool", "unset", "", f"mode=manual: turn {name} on or off")
            for name in ALGORITHMS]
    for section, cls in SECTIONS.items():
        out += [Row(f"boost.config.{section}.{key}", type_name(tp), show(value), describe_rules(f),
                    f.metadata.get("help", "")) for key, f, tp, value in leaf_fields(cls())]
    return out


def select(prefixes: typing.Sequence[str]) -> list[Row]:
    """Rows whose key is one of `prefixes` or lies under one (`optim` -> every optim.* key)."""
    every = rows()
    if not prefixes:
        return every
    picked = []
    for p in prefixes:
        p = p.rstrip(".")
        match = [r for r in every if r.key == p or r.key.startswith(p + ".")]
        if not match:
            raise ConfigError(f"no config key '{p}'", suggest(p, sorted({r.key for r in every}
                                                                          | {r.key.rsplit('.', 1)[0] for r in every})))
        picked += [r for r in match if r not in picked]
    return picked


def render_text(selected: list[Row]) -> str:
    """Two lines per key for a terminal: key, type, default and rules; then its meaning."""
    lines = []
    for r in selected:
        rule = f"  ({r.allowed})" if r.allowed else ""
        lines += [f"{r.key}: {r.type} = {r.default}{rule}", f"    {r.help}"]
        if r.key == "model.name":  # each network's own settings on a folder (recipe.model_defaults)
            lines.append("    each network's settings on a folder with no recipe named (train --data DIR), for the "
                         "keys left unset:")
            lines.append(f"      every network: data.batch_size from the folder's training images, {BATCH_WHY} (unless "
                         "its own, below, names one)")
            lines += [f"      {name}: {', '.join(items) or 'none'}" for name, items in FOLDER_DEFAULTS.items()]
    return "\n".join(lines)


def render_markdown() -> str:
    """docs/CONFIG.md: one table per top-level section."""
    head = ["# Configuration reference", "",
            "Every key a recipe (YAML) or `--set KEY=VALUE` can set, with its type, default, allowed values and",
            "meaning. Generated from the schema by `torchboost options --markdown > docs/CONFIG.md` (a test keeps",
            "it in sync); `torchboost options PREFIX` prints the same for the keys under PREFIX, and",
            "`torchboost train --config RECIPE --print-config` prints a recipe's values.", "",
            "Unset keys are decided when the run starts, from the data or the model (what was decided is",
            "printed at start and saved in the run's `config.yaml`).", ""]
    body, section = [], None
    for r in rows():
        top = ("boost.config" if r.key.startswith("boost.config.") else
               r.key.split(".")[0] if "." in r.key else "top level")
        if top != section:
            section = top
            body += ["", f"## {section}", "", "| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
        cells = [f"`{r.key}`", r.type, f"`{r.default}`", r.allowed, r.help]
        body.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(head + body[1:]) + "\n"

