"""The test-split ledger (race.ledger): every (configuration, seed) a race evaluated on the test split, per
task; a seen seed and a configuration outside the task's confirmed selection are refused with one line, and races
on a held-out split never touch it."""

import json

import pytest

from torchboost.cli import main
from torchboost.errors import ConfigError
from torchboost.race.ledger import LEDGER_NAME, check_ledger, read_ledger, record

SELECTION = [("sgd@8", 0.05), ("muon", 0.02)]


def test_a_seed_already_evaluated_on_the_test_split_is_refused(tmp_path):
    ledger = tmp_path / LEDGER_NAME
    assert read_ledger(ledger)["tasks"] == []  # no file yet: an empty ledger
    record(ledger, "r", [], SELECTION, range(2, 5), "conf/race.json", SELECTION)
    with pytest.raises(ConfigError, match="seed 4 was already evaluated") as e:
        record(ledger, "r", [], SELECTION, range(4, 6), "conf2/race.json", SELECTION)
    assert "--first-seed 5" in str(e.value) and "\n" not in str(e.value)
    record(ledger, "r", [], SELECTION, range(5, 7), "conf2/race.json", SELECTION)  # fresh seeds: recorded
    record(ledger, "r", ["data.path=/other"], SELECTION, range(2, 5), "x/race.json", SELECTION)  # another task
    tasks = read_ledger(ledger)["tasks"]
    assert [sorted({r["seed"] for r in t["runs"]}) for t in tasks] == [[2, 3, 4, 5, 6], [2, 3, 4]]
    assert len(tasks[0]["runs"]) == 2 * 5  # every (configuration, seed) pair


def test_a_configuration_outside_the_confirmed_selection_is_refused(tmp_path):
    """Choosing again after reading the test split: sgd@8 at another lr, or a racer the selection never had."""
    ledger = tmp_path / LEDGER_NAME
    record(ledger, "r", [], SELECTION, [2], "conf/race.json", SELECTION)
    for odd in (("sgd@8", 0.1), ("adamw", 0.002)):
        with pytest.raises(ConfigError, match=f"{odd[0]} at lr {odd[1]:g} is not in the selection"):
            check_ledger(read_ledger(ledger), ledger, "r", [], [odd], [3])
    check_ledger(read_ledger(ledger), ledger, "r", [], [("muon", 0.02)], [3])  # part of the selection: fine


@pytest.mark.parametrize("content", [b"not json", b"[]", b'{"format": "other", "tasks": []}',
                                     b'{"format": "torchboost test-split ledger", "tasks": [{"recipe": 1}]}'])
def test_a_file_that_is_not_a_ledger_is_one_line(tmp_path, content):
    path = tmp_path / LEDGER_NAME
    path.write_bytes(content)
    with pytest.raises(ConfigError, match="not a test-split ledger"):
        read_ledger(path)


def test_confirmations_write_the_ledger_and_selections_never_touch_it(tmp_path, capsys):
    sel, conf = tmp_path / "sel", tmp_path / "conf"
    common = ["race", "--config", "digits-lenet", "--set", "data.batch_size=64", "--epochs", "1", "--seeds", "1",
              "--evals-per-epoch", "1"]
    assert main([*common, "--optimizers", "sgd", "--lr", "sgd=0.05", "--targets", "0.3", "--holdout", "300",
                 "--ledger", str(tmp_path / "l.json"), "-o", str(sel)]) == 2
    assert "--holdout never reads it" in capsys.readouterr().err
    assert main([*common, "--optimizers", "sgd", "--lr", "sgd=0.05", "--targets", "0.3", "--holdout", "300",
                 "-o", str(sel)]) == 0
    assert not list(tmp_path.rglob(LEDGER_NAME))  # a selection reads no test split
    frozen = [*common, "--frozen", str(sel / "race.json"), "--first-seed", "1", "--full-budget"]
    assert main([*frozen, "-o", str(conf)]) == 0
    ledger = json.loads((sel / LEDGER_NAME).read_text())
    (task,) = ledger["tasks"]
    # frozen at the selection's own budget (--epochs 1): the confirmation races sgd@1 whatever its --epochs
    assert task["selection"] == [["sgd@1", 0.05]] and [(r["racer"], r["seed"]) for r in task["runs"]] == [("sgd@1", 1)]
    assert json.loads((conf / "race.json").read_text())["settings"]["ledger"] == str(sel / LEDGER_NAME)
    capsys.readouterr()
    assert main([*frozen, "-o", str(tmp_path / "again")]) == 2  # the same seed on the test split again
    err = capsys.readouterr().err
    assert "seed 1 was already evaluated" in err and "--first-seed 2" in err and len(err.strip().splitlines()) == 1
