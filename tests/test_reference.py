"""docs/CONFIG.md and `torchboost options`: every key, in sync with the schema, defaults that `--set` accepts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from torchboost.boost.config import resolve_boost
from torchboost.cli import main
from torchboost.options import leaf_fields
from torchboost.recipe.config import Config, build_config
from torchboost.recipe.reference import CONFIG_DOC, render_markdown, rows

ROOT = Path(__file__).resolve().parents[1]


def doc_table() -> dict[str, list[str]]:
    """{key: [type, default, allowed, meaning]} parsed back from docs/CONFIG.md's tables."""
    table = {}
    for line in (ROOT / CONFIG_DOC).read_text().splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").replace("\\|", "\0").split("|")]
            table[cells[0].strip("`")] = [c.replace("\0", "|") for c in cells[1:]]
    return table


def test_config_doc_is_generated_from_the_schema():
    assert (ROOT / CONFIG_DOC).read_text() == render_markdown(), \
        "docs/CONFIG.md is stale: run `torchboost options --markdown > docs/CONFIG.md`"


def test_every_key_has_one_line_of_meaning():
    missing = [r.key for r in rows() if not r.help.strip() or "\n" in r.help]
    assert not missing, f"give these option() fields a one-line help=: {missing}"


def test_the_doc_lists_every_key_the_schema_accepts():
    table = doc_table()
    assert {k for k, *_ in leaf_fields(Config())} <= set(table)
    assert len(table) == len(rows()) > 120


def test_documented_defaults_are_the_schemas_and_set_accepts_them():
    """Each default as the doc writes it, fed back through `--set KEY=VALUE`, leaves the config unchanged."""
    default = Config().to_dict()
    for key, (_, shown, _, _) in doc_table().items():
        if key.startswith("boost.config."):
            continue
        value = shown.strip("`")
        cfg = build_config(overrides=[f"{key}={'null' if value == 'unset' else value}"])
        assert cfg.to_dict() == default, key


@pytest.mark.parametrize("section", ["common", "less_bn", "grad_freeze", "grad_accumulation", "dim_reduce",
                                     "adasum"])
def test_documented_boost_defaults_are_boosts(section):
    plan = resolve_boost("O0", {})
    table = doc_table()
    written = {key.rsplit(".", 1)[1]: yaml.safe_load(shown.strip("`").replace("unset", "null"))
               for key, (_, shown, _, _) in table.items() if key.startswith(f"boost.config.{section}.")}
    assert written, section
    assert dataclasses.asdict(getattr(plan, f"{section}_options")) == written
    assert resolve_boost("O0", {section: written}) == dataclasses.replace(plan, configured=frozenset({section}))


def test_options_command_shows_a_section_and_refuses_an_unknown_key(capsys):
    assert main(["options", "optim.thor"]) == 0
    out = capsys.readouterr().out.splitlines()
    keys = [line.split(":")[0] for line in out if not line.startswith(" ")]
    thor = [k for k in doc_table() if k.startswith("optim.thor.")]
    assert keys == thor and keys[-1] == "optim.thor.damping_decay"
    assert main(["options", "optim.thorr"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no config key 'optim.thorr'" in err and "optim.thor" in err.split("—")[1]
