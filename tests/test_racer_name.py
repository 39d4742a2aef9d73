"""Racer names have one parser (`race.names.parse_racer`), which the race, its reports, the select/confirm
protocol and benchmarks/race.py all use; choices listed once (the config's choices are the step's)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from torchboost.errors import ConfigError
from torchboost.race.names import RacerName, parse_racer

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name, want", [
    ("sgd", RacerName("sgd")),
    ("muon@8", RacerName("muon", (), 8)),
    ("thor[graft=muon_step]", RacerName("thor", (("graft", "muon_step"),))),
    ("thor_muon[ekfac_decay=0.95,inverse_root=2,graft=none]@12",
     RacerName("thor_muon", (("ekfac_decay", "0.95"), ("inverse_root", "2"), ("graft", "none")), 12)),
    ("thor[]", RacerName("thor")),
])
def test_names_parse_and_print_back(name, want):
    got = parse_racer(name)
    assert got == want
    assert got.spec == name.partition("@")[0].replace("[]", "")


@pytest.mark.parametrize("name, words", [
    ("", "is not NAME"), ("[a=1]", "is not NAME"), ("thor[graft=grad", "is not NAME"), ("thor[a=1]]", "is not NAME"),
    ("thor[[a=1]", "is not NAME"), ("thor[graft]", "is not KEY=VALUE"), ("thor[=1]", "is not KEY=VALUE"),
    ("sgd@0", "budget after @"), ("sgd@x", "budget after @"), ("sgd@100001", "budget after @"), ("sgd@", "budget"),
])
def test_a_malformed_name_is_one_line(name, words):
    with pytest.raises(ConfigError, match=words):
        parse_racer(name)


def test_no_other_module_takes_racer_names_apart():
    """The shapes `partition("[")` / `partition("@")` on a name appear only in the parser."""
    offenders = []
    for path in [*(ROOT / "torchboost").rglob("*.py"), ROOT / "benchmarks" / "race.py"]:
        if path == ROOT / "torchboost" / "race" / "names.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "partition"
                    and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in ("[", "@")):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == [], offenders


def test_choices_the_config_offers_are_the_steps():
    import dataclasses

    from torchboost.optim.averaging import AVERAGES
    from torchboost.options import choices_of
    from torchboost.recipe.config import TrainConfig
    from torchboost.train.step import COMPILE_MODES, NONFINITE_POLICIES

    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    assert choices_of(fields["compile"]) == tuple(COMPILE_MODES)
    assert choices_of(fields["nonfinite"]) == NONFINITE_POLICIES
    assert choices_of(fields["average"]) == AVERAGES


def test_split_names_are_listed_once():
    """A tuple, list or set of two or more of a data set's split names is written only in `splits.py`:
    the folder layout, eval's --split choices, the shards' evaluation-split fallback and the holdout all import
    it (one place to add a split)."""
    from torchboost.splits import SPLITS

    found = []
    for path in sorted((ROOT / "torchboost").rglob("*.py")):
        if path.relative_to(ROOT).as_posix() == "torchboost/splits.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                names = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in SPLITS]
                if len(names) >= 2:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found
