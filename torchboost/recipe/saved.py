"""Configs read back from files (a checkpoint's saved config, a run's config.yaml): data, never instructions.

A saved config rebuilds the run for `eval`, `predict` and `--resume`, but it came from a file that anyone may
have written (a downloaded checkpoint). Two kinds of value would make it act outside the run: a shard source
that says `pipe:` (a shell command, `data.shardfiles.open_shard`), refused; and a place data is sent to (the
MLflow tracking store, `OUTWARD_KEYS`), dropped with a note, so a resumed run logs to its own store. Either is
honoured only when the user gave it themselves, on the command line (`--set`) or in the recipe they named
(`--resume auto`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

from torchboost.data.pipes import PIPE
from torchboost.errors import CheckpointError, ConfigError, printable
from torchboost.recipe.config import Config, build_config, parse_override
from torchboost.recipe.diff import flatten

# Keys whose value may run a shell command: the shard sources (data.pipes.PIPE).
COMMAND_KEYS = ("data.train_shards", "data.eval_shards")


def names_command(value: object) -> bool:
    """Whether a value could run a command: `pipe:` anywhere in it (a brace pattern such as
    `{pipe:cmd,a.tar}` expands to a command too)."""
    return isinstance(value, str) and PIPE in value


# Keys naming a place the run sends data to (parameters, metrics, checkpoints): never chosen by a file.
OUTWARD_KEYS = ("train.mlflow.tracking_uri",)

# What a run's resolved config always records (recipe.resolve fills them from the data): eval and predict build
# the network from them without the data.
RESOLVED_KEYS = ("model.num_classes", "model.in_chans")


def check_resolved(cfg: Config, source: str) -> None:
    """Refuse a saved config that lacks what the network is built from (the file was not written by train)."""
    values = flatten(cfg.to_dict())
    missing = [k for k in RESOLVED_KEYS if values.get(k) is None]
    if missing:
        raise CheckpointError(f"the config saved in {source} leaves {missing[0]} unset, which a training run "
                              "records", f"use an unmodified checkpoint, or give it: --set {missing[0]}=N")


def config_from_file(saved: dict, overrides: Sequence[str], source: str, trusted: Optional[Config] = None,
                     log: Callable[[str], None] = lambda _: None) -> Config:
    """`build_config(saved, overrides)`, refusing in one line a command the file names that the user did not
    give (a `--set` of that key, or the same value in `trusted`, the recipe the user named), and dropping, with
    a note through `log` (silent by default: eval and predict send nothing), a place to send data to
    (OUTWARD_KEYS) the user did not give."""
    cfg = build_config(saved, overrides)
    given = {k for item in overrides for k in flatten(parse_override(item))}
    values = flatten(cfg.to_dict())
    mine = flatten(trusted.to_dict()) if trusted is not None else {}
    for key in OUTWARD_KEYS:
        value = values.get(key)
        if value is not None and key not in given and mine.get(key) != value:
            log(f"note: the config saved in {source} sends to {key}={printable(str(value))[:120]}; a file never "
                f"chooses where data goes: the run's own store is used (--set {key}=URI to choose one)")
            cfg = _without(cfg, key)
    for key in COMMAND_KEYS:
        value = values.get(key)
        if names_command(value) and key not in given and mine.get(key) != value:
            raise ConfigError(f"the config saved in {source} sets {key}={str(value)[:120]!r}, a shell command; a "
                              "config inside a file never runs one",
                              f"if you trust that command, give it yourself: --set {key}='...'; or set "
                              f"--set {key}=null to read the index's shard files")
    return cfg


def _without(cfg: Config, key: str) -> Config:
    """`cfg` with the dotted `key` set to None (its default: the run's own)."""
    head, _, rest = key.partition(".")
    if not rest:
        return dataclasses.replace(cfg, **{head: None})
    return dataclasses.replace(cfg, **{head: _without(getattr(cfg, head), rest)})
