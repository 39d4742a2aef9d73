"""The ledger of the test split: every (configuration, seed) a race evaluated on the test split, per task.

A test split stays a test only while nothing is chosen after reading it. A confirmation (`race --frozen`) records
each (racer, lr, seed) it evaluates there in one JSON file (default: LEDGER_NAME beside the selection's race.json;
`race --ledger FILE` for another, shared by several selections), and a later race of the same task (recipe and
overrides) is refused, with one line, when it would evaluate a seed already evaluated there, or a configuration
outside the selection the task was first confirmed with (choosing again after seeing the test figures). Races on a
held-out split (`--holdout`) never read the test split and never touch the ledger. Concurrent races (one per core)
append under an exclusive lock on a file beside the ledger, so neither loses the other's runs.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from torchboost.errors import ConfigError
from torchboost.fileio import atomic_write, make_dirs, output_error, read_regular
from torchboost.plaindata import check_plain, in_float_range, load_json

LEDGER_NAME = "test-ledger.json"
MAX_LEDGER = 64 << 20  # a run a line: millions of runs
FORMAT = "torchboost test-split ledger"
Configuration = tuple[str, float]  # (racer, lr): the racer's name carries its variant options and budget


def default_ledger(selection: str | Path) -> Path:
    """Where a confirmation's ledger is kept unless --ledger names one: beside its selection's race.json."""
    return Path(selection).parent / LEDGER_NAME


def read_ledger(path: Path) -> dict:
    """The ledger at `path` as plain data ({"format", "tasks": [...]}); an empty one when there is no file yet."""
    if not path.exists() and not path.is_symlink():
        return {"format": FORMAT, "tasks": []}
    raw = read_regular(path, ConfigError)
    fix = f"give --ledger a ledger a race wrote (or a new file name); never edit {path.name} by hand"
    if len(raw) > MAX_LEDGER:
        raise ConfigError(f"{path} is {len(raw)} bytes, larger than any ledger", fix)
    try:
        data = load_json(raw)
    except ValueError as e:  # not JSON, 5,000-digit numbers kept unparsed, nesting past the parser's stack
        raise ConfigError(f"{path} is not a test-split ledger (not JSON: {e})", fix) from None
    check_plain(data, str(path))
    if not (isinstance(data, dict) and data.get("format") == FORMAT and isinstance(data.get("tasks"), list)
            and all(_is_task(t) for t in data["tasks"])):
        raise ConfigError(f"{path} is not a test-split ledger", fix)
    return data


def _is_task(task: object) -> bool:
    if not isinstance(task, dict):
        return False
    runs, chosen = task.get("runs"), task.get("selection")
    return (isinstance(task.get("recipe"), str) and isinstance(task.get("overrides"), list) and isinstance(runs, list)
            and all(isinstance(r, dict) and _is_configuration(r.get("racer"), r.get("lr"))
                    and type(r.get("seed")) is int and 0 <= r["seed"] < 2**31 and isinstance(r.get("race", ""), str)
                    for r in runs)
            and (chosen is None or isinstance(chosen, list) and all(
                isinstance(c, list) and len(c) == 2 and _is_configuration(*c) for c in chosen)))


def _is_configuration(racer: object, lr: object) -> bool:
    return (isinstance(racer, str) and 0 < len(racer) <= 200 and racer.isprintable() and type(lr) in (int, float)
            and in_float_range(lr) and lr > 0)


def _task(ledger: dict, recipe: str, overrides: Sequence[str]) -> dict | None:
    return next((t for t in ledger["tasks"] if t["recipe"] == recipe and t["overrides"] == list(overrides)), None)


def check_ledger(ledger: dict, source: Path, recipe: str, overrides: Sequence[str],
                 configurations: Sequence[Configuration], seeds: Iterable[int]) -> None:
    """Refuse a race that would read the test split of task (recipe, overrides) with a seed the ledger has, or a
    configuration outside the selection the task was first confirmed with."""
    task = _task(ledger, recipe, overrides)
    if task is None:
        return
    used = {r["seed"] for r in task["runs"]}
    again = sorted(used & set(seeds))
    if again:
        raise ConfigError(f"seed {again[0]} was already evaluated on this task's test split ({source} records "
                          f"{len(used)} seeds)", f"race fresh seeds: --first-seed {max(used) + 1} (or higher)")
    if task.get("selection") is not None:
        chosen = {(racer, float(lr)) for racer, lr in task["selection"]}
        odd = next((c for c in configurations if (c[0], float(c[1])) not in chosen), None)
        if odd is not None:
            raise ConfigError(f"{odd[0]} at lr {odd[1]:g} is not in the selection this task was confirmed with "
                              f"({source})", "confirm that selection's configurations; a new choice needs a new task "
                              "(another recipe or data), not another reading of this test split")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on LEDGER.lock for a read-check-write of the ledger (released when the process ends)."""
    make_dirs(path.parent)
    lock = path.with_name(path.name + ".lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        raise output_error(lock, e) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def record(path: Path, recipe: str, overrides: Sequence[str], configurations: Sequence[Configuration],
           seeds: Iterable[int], race: str, selection: Sequence[Configuration] | None = None) -> None:
    """Check (`check_ledger`) and record, under the ledger's lock, that `race` evaluates every configuration at every
    seed on the test split of task (recipe, overrides); `selection`: what the confirmation's selection chose (the
    task's first confirmation fixes it)."""
    seeds = list(seeds)
    with _locked(path):
        ledger = read_ledger(path)
        check_ledger(ledger, path, recipe, overrides, configurations, seeds)
        task = _task(ledger, recipe, overrides)
        if task is None:
            task = {"recipe": recipe, "overrides": list(overrides), "selection": None, "runs": []}
            ledger["tasks"].append(task)
        if task["selection"] is None and selection is not None:
            task["selection"] = [[racer, lr] for racer, lr in selection]
        task["runs"] += [{"racer": racer, "lr": lr, "seed": seed, "race": race}
                         for seed in seeds for racer, lr in configurations]
        atomic_write(path, json.dumps(ledger, indent=1))
