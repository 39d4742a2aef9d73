"""Imports on demand (issue 34): a training run on a built-in set imports no weight-migration reader (pickle,
protobuf) and no shard reader, and `torchboost --help` imports no torch. Each runs in a fresh interpreter and
reports the modules it ended with; the module sets are asserted (times on a shared machine are noise: the CPU
time is printed for information only)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARD_READERS = {"torchboost.data.shards", "torchboost.data.shardfiles", "torchboost.data.shardoffsets",
                 "torchboost.data.braces", "torchboost.data.export"}
REPORT = ("import json, sys; "
          "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchboost', 'numpy'))))")


def modules_after(what: str, code: str, cwd: Path, timeout: int = 300) -> tuple[set[str], str]:
    """(modules loaded once `code` ran, its stdout) in a fresh interpreter that imports this checkout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", f"{code}\n{REPORT}"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(f"{what}: {cpu:.2f} s CPU (information only, not asserted)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    return set(json.loads(lines[-1])), "\n".join(lines[:-1])


@pytest.mark.slow
def test_a_builtin_training_run_imports_no_migration_or_shard_reader(tmp_path):
    argv = ["train", "-c", "digits-lenet", "--epochs", "1", "-b", "256", "-o", str(tmp_path / "run"),
            "--set", "train.progress_bar=false"]
    code = f"from torchboost.cli import main\nassert main({argv!r}) == 0"
    loaded, out = modules_after("train digits-lenet, 1 epoch", code, tmp_path)
    assert "final: top-1" in out and "torchboost.train.model" in loaded  # it trained, through the real path
    assert not sorted(m for m in loaded if m == "torchboost.migrate" or m.startswith("torchboost.migrate."))
    assert not sorted(loaded & SHARD_READERS)
    assert "sklearn" not in loaded  # the digits are read from scikit-learn's file, not through its ~1.3 s import


def test_help_imports_no_torch(tmp_path):
    loaded, out = modules_after("torchboost --help", "from torchboost.cli import main\nassert main(['--help']) == 0",
                                tmp_path, 120)
    assert "usage: torchboost" in out and "race" in out  # the whole list of subcommands was printed
    assert not sorted(m for m in loaded if m == "torch" or m.startswith("torch."))
    assert "numpy" not in loaded  # nor numpy: argparse and the help text only


@pytest.mark.slow
def test_names_imported_on_first_use_arrive_when_used(tmp_path):
    """The checks above are not vacuous: the lazily exported names load their modules when read."""
    loaded, _ = modules_after("lazy names", "import torchboost, torchboost.data\n"
                              "assert torchboost.Model.__module__ == 'torchboost.train.model'\n"
                              "assert torchboost.data.ShardDataset.__module__ == 'torchboost.data.shards'", tmp_path)
    assert {"torch", "torchboost.train.model", "torchboost.data.shards", "torchboost.data.shardfiles"} <= loaded
