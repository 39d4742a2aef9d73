"""Race files are parsed as untrusted (issue: trust, round three): a generator replaces every field of a real
selection's race.json with hostile values — wrong types, numbers past any range, NaN/Infinity, names that would
forge a table row or clear the screen, deep nesting, empty and huge lists — and feeds each to `race --report`
and `race --frozen` through the CLI under an alarm. Each ends in exit 0 with printable output (a value the
race may hold) or one `error:` line with exit 2: never a traceback, a hang or a huge allocation."""

from __future__ import annotations

import copy
import json
import signal
from pathlib import Path

import pytest

import torchboost.cli as cli
from torchboost.cli import main

HOSTILE = [None, True, -1, 0, 10**12, 10**400, 1.5, float("nan"), float("inf"), "", "x" * 300,
           "sgd\n| thor | 0.1 | fake row", "a\x1b[2Jb", "\u202eevil", [], {}, [[[[[]]]]], list(range(50))]


class Raced(Exception):
    """Raised instead of training: the file passed every check."""


@pytest.fixture(scope="module")
def selection(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("sel")
    assert main(["race", "--config", "digits-lenet", "--set", "data.batch_size=256", "--epochs", "1", "--seeds", "1",
                 "--optimizers", "sgd", "--lr", "sgd=0.05", "--holdout", "300", "--targets", "0.3", "0.5",
                 "-o", str(out)]) == 0
    return json.loads((out / "race.json").read_text())


def leaves(data, path=()):
    """Every path to a value in `data` (dicts and lists walked), the containers included."""
    yield path
    if isinstance(data, dict):
        for k, v in data.items():
            yield from leaves(v, (*path, k))
    elif isinstance(data, list):
        for i, v in enumerate(data[:2]):  # the first two elements of a list stand for the rest
            yield from leaves(v, (*path, i))


def mutated(data: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(data)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


def run_cli(argv, capsys) -> tuple[int, str, str]:
    def hang(*_):
        raise TimeoutError("the command did not end within 30 s")

    signal.signal(signal.SIGALRM, hang)
    signal.alarm(30)
    try:
        code = main(argv)
    except Raced:
        code = 0
    finally:
        signal.alarm(0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
def test_every_field_of_a_race_file_with_hostile_values(selection, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("torchboost.race.lanes.run_race", lambda *a, **k: (_ for _ in ()).throw(Raced()))
    monkeypatch.setattr(cli, "__name__", cli.__name__)  # run_race is imported inside the command
    import torchboost.race.lanes as race

    monkeypatch.setattr(race, "run_race", lambda *a, **k: (_ for _ in ()).throw(Raced()))
    paths = [p for p in leaves(selection) if p and p[0] in ("settings", "runs")]
    outcomes = {"refused": 0, "accepted": 0}
    for i, path in enumerate(paths):
        for value in HOSTILE[i % 3::3]:  # a third of the values per field, all of them across neighbours
            f = tmp_path / f"r{i}.json"
            f.write_text(json.dumps(mutated(selection, path, value)))
            for argv in (["race", "--report", str(f)],
                         ["race", "--config", "digits-lenet", "--set", "data.batch_size=256", "--epochs", "1",
                          "--seeds", "1", "--first-seed", "7", "--frozen", str(f), "-o", str(tmp_path / "c")]):
                code, out, err = run_cli(argv, capsys)
                where = (path, repr(value)[:40], argv[1])
                assert "Traceback" not in err and code in (0, 2), where
                if code == 2:
                    lines = err.strip().splitlines()
                    assert len(lines) == 1 and lines[0].startswith("error: "), (where, err[-300:])
                    outcomes["refused"] += 1
                else:
                    outcomes["accepted"] += 1
                assert "\x1b" not in out + err and "\u202e" not in out + err, where
                assert not any(line.startswith("| thor | 0.1 | fake") for line in out.splitlines()), where
    assert outcomes["refused"] > 50  # the generator reaches the checks (counts in the closing note)


def test_a_race_file_nested_past_the_parsers_stack_is_one_line(tmp_path, capsys):
    f = tmp_path / "deep.json"
    f.write_text("[" * 200_000 + "]" * 200_000)
    code, _, err = run_cli(["race", "--report", str(f)], capsys)
    assert code == 2 and "nested too deep" in err and "\n" not in err.strip()
