"""What `--resume` continues: which checkpoint, in which folder, with which configuration.

A resumed run continues in its own run's folder with its own recorded (resolved) configuration; `--set`
values are applied on top, named and printed, and those that would break a bit-exact continuation (the data,
the model, the seed, the batch, accumulation, the optimizer) are refused unless `--force`. The spec may be
a checkpoint file, a run folder (its newest complete checkpoint), `last` (the newest of the recipe's output
folder) or `auto` (that, or a fresh start when there is nothing to continue). Under torchrun, a restarted
worker group (TORCHELASTIC_RESTART_COUNT > 0) resumes `auto` by itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Callable, Optional, Sequence

from torchboost.distributed import restart_count
from torchboost.errors import CheckpointError, ConfigError, DataError
from torchboost.fileio import check_regular
from torchboost.recipe.config import Config, parse_override
from torchboost.recipe.data import train_classes
from torchboost.recipe.diff import flatten
from torchboost.recipe.load import load_config
from torchboost.recipe.outputs import previous_run
from torchboost.recipe.resolve import without_top5
from torchboost.recipe.saved import config_from_file
from torchboost.recipe.validation import validate, validated
from torchboost.train.checkpoint import list_checkpoints, load_checkpoint

AUTO, LAST = "auto", "last"
# --set keys whose change makes the continuation a different run (its data order, shapes or state)
BREAKING = ("data.", "model.", "train.seed", "train.accumulation_steps", "optim.name", "boost.")
# data.decode: the same samples and crops either way, pixels within a few grey levels (data/device_decode.py)
HARMLESS = ("data.workers", "data.pin_memory", "data.eval_batch_size", "data.skip_corrupt", "data.decode")
PATH_KEYS = ("data.path", "train.init_weights")  # the same file or folder may be spelt in several ways
# keys the per-update lr array is built from (recipe.build.build_schedule): changing one on resume moves the
# lr from the checkpoint's update on, so the continuation is no longer the run it resumes
SCHEDULE = ("train.epochs", "optim.lr", "optim.lr_reference_batch", "schedule.")


def schedule_keys(keys) -> list[str]:
    """Those of `keys` that shape the lr schedule (SCHEDULE: exact keys, and every key of a section)."""
    return [k for k in keys if k in SCHEDULE or any(k.startswith(p) for p in SCHEDULE if p.endswith("."))]


@dataclasses.dataclass
class ResumePlan:
    checkpoint: Optional[Path]  # None: `auto` found nothing to continue, start fresh
    output: Path
    config: Config
    overwrite: bool = False  # `auto` restarting its own run that died before its first checkpoint


def restarted_by_torchrun() -> bool:
    """TORCHELASTIC_RESTART_COUNT > 0 (checked: a value that is not a count is one DistributedError)."""
    return restart_count() > 0


def newest_checkpoint(out: Path, prefix: Optional[str] = None) -> Optional[tuple[Path, dict]]:
    """The newest checkpoint of `out` that loads completely (a damaged newest one falls back to the one
    before), with its contents."""
    folder = out / "ckpt"
    if not folder.is_dir():
        return None
    prefixes = [prefix] if prefix else sorted({p.name.rsplit("-", 1)[0] for p in folder.glob("*-*_*.pt")})
    found = sorted((p for pre in prefixes for p in list_checkpoints(folder, pre)), key=_order)
    for path in reversed(found):
        try:
            ckpt = load_checkpoint(path)
        except CheckpointError:
            continue
        if isinstance(ckpt.get("config"), dict):
            return path, ckpt
    return None


def _order(path: Path) -> tuple[int, int]:
    epoch, step = path.stem.rsplit("-", 1)[1].split("_")
    return int(epoch), int(step)


def _run_folder(checkpoint: Path) -> Optional[Path]:
    """RUN for RUN/ckpt/PREFIX-E_S.pt (None for a checkpoint kept anywhere else)."""
    parent = checkpoint.resolve().parent
    return parent.parent if parent.name == "ckpt" else None


def _same(key: str, was: object, now: object) -> bool:
    """Equal values; paths are equal when they name the same file or folder (relative or absolute)."""
    if was == now:
        return True
    return key in PATH_KEYS and isinstance(was, str) and isinstance(now, str) and \
        os.path.realpath(was) == os.path.realpath(now)


def _resolved_from(key: str, was: object, now: object, saved: dict, ckpt: Optional[dict]) -> bool:
    """Whether the saved run's resolved value `was` is what resolving the asked `now` gave (`recipe.resolve`):
    top-5 left out at 5 classes or fewer, or a batch larger than the data fitted to it (each epoch then one
    batch; without a checkpoint to tell, a smaller saved batch is taken as fitted)."""
    if key == "train.metrics" and isinstance(now, list):
        return was == without_top5(now, int(flatten(saved).get("model.num_classes") or 0))
    if key == "data.batch_size" and isinstance(was, int) and isinstance(now, int) and was < now:
        return ckpt is None or bool(ckpt.get("epoch_complete")) and ckpt.get("step_in_epoch") == 1
    return False


def _differences(asked: Config, saved: dict, ckpt: Optional[dict] = None) -> dict[str, object]:
    """{key: asked value} for keys the user set (not left to inference: None or "auto") that differ from the
    saved run's resolved value, other than by resolution itself (`_resolved_from`)."""
    have = flatten(saved)
    return {k: v for k, v in flatten(asked.to_dict()).items()  # output: where the run is, resolved when saved
            if v is not None and v != "auto" and k in have and k != "output" and not _same(k, have[k], v)
            and not _resolved_from(k, have[k], v, saved, ckpt)}


def _moved_data(cfg: Config, was: object, classes: object, path: Path) -> Optional[str]:
    """The note for a data set that moved (data.path changed, the new training split has the run's classes);
    a DataError naming the difference when its classes are others. None when the run recorded no classes."""
    if not isinstance(classes, list):
        return None
    now, had = train_classes(cfg.data), [str(c) for c in classes]
    if now != had:
        missing, extra = sorted(set(had) - set(now))[:3], sorted(set(now) - set(had))[:3]
        diff = "; ".join(part for part in (f"missing: {', '.join(missing)}" if missing else "",
                                           f"extra: {', '.join(extra)}" if extra else "") if part)
        raise DataError(f"{cfg.data.path} holds other classes than {path} was trained on ({diff or 'their order'})",
                        "resume on the run's data (the same class folders), or start a new run from its weights "
                        f"with --set train.init_weights={path}")
    return f"note: the data moved: resuming on {cfg.data.path} (was {was}), which has the run's {len(now)} classes"


def _breaking(keys) -> list[str]:
    return [k for k in keys if k.startswith(BREAKING) and not k.startswith(HARMLESS)]


def plan_resume(spec: str, recipe: Optional[str], overrides: Sequence[str], output: Optional[str],
                overwrite: bool = False, force: bool = False, log: Callable[[str], None] = print,
                built: Optional[Config] = None) -> ResumePlan:
    """`built`: the recipe + overrides already built (`recipe_with_data`), validated instead of read again."""
    if overwrite:
        raise ConfigError("--resume continues a run and --overwrite replaces one", "choose one of them")
    if spec in (AUTO, LAST):
        asked = load_config(recipe, overrides) if built is None else validated(built)
        out = Path(output or asked.output.format(name=asked.name))
        found = newest_checkpoint(out, asked.checkpoint.prefix)
        if found is None:
            return _fresh(spec, asked, out)
        path, ckpt = found
        differ = _differences(asked, ckpt["config"], ckpt)
        other = [k for k in _breaking(differ) if k != "data.path"]  # a moved data set: checked by _config
        if other:
            raise ConfigError(f"{out} holds a different run ({', '.join(other[:3])} differ from {path.name})",
                              f"choose another --output, or resume that run with --resume {out}")
        settings = [f"{k}={json.dumps(v)}" for k, v in differ.items()]  # e.g. more epochs: applied and printed
        return ResumePlan(path, out, _config(ckpt["config"], settings, path, force, log, trusted=asked,
                                             classes=ckpt.get("classes")))
    path = Path(spec)
    if path.is_dir() and path.name == "ckpt" and not (path / "ckpt").is_dir():
        path = path.parent  # RUN/ckpt given for RUN
    if path.is_dir():
        found = newest_checkpoint(path)
        if found is None:
            raise CheckpointError(f"no complete checkpoint in {path / 'ckpt'}", "resume from a checkpoint file, or "
                                  "start the run again")
        (path, ckpt), home = found, path
    else:
        if not path.exists():
            raise CheckpointError(f"checkpoint {path} not found", "give a checkpoint file, a run folder, "
                                  "'last' or 'auto'")
        check_regular(path, CheckpointError)
        ckpt, home = load_checkpoint(path), _run_folder(path)
        if not isinstance(ckpt.get("config"), dict):
            raise CheckpointError(f"{path} holds no saved config: it was not written by torchboost train",
                                  f"start a new run from its weights with --set train.init_weights={path}")
    if home is None and output is None:
        raise ConfigError(f"{path} is not inside a run's ckpt/ folder", "say where the continued run goes with -o")
    out = Path(output) if output else home
    if home is not None and out.resolve() != home.resolve():
        raise ConfigError(f"{path} belongs to the run in {home}; a resumed run continues in its own folder",
                          f"drop -o (or use -o {home}), or start a new run from its weights with "
                          f"--set train.init_weights={path}")
    if home is None and previous_run(out):
        raise ConfigError(f"output folder {out} holds another run", "choose an empty --output")
    return ResumePlan(path, out, _config(ckpt["config"], overrides, path, force, log, classes=ckpt.get("classes")))


def _fresh(spec: str, asked: Config, out: Path) -> ResumePlan:
    if spec == LAST:
        raise CheckpointError(f"no complete checkpoint in {out / 'ckpt'}", "start the run without --resume")
    if not previous_run(out):
        return ResumePlan(None, out, asked)
    saved = out / "config.yaml"
    from torchboost.recipe.files import read_yaml

    if saved.is_file() and not _breaking(_differences(asked, read_yaml(saved))):
        return ResumePlan(None, out, asked, overwrite=True)  # this run died before its first checkpoint
    raise ConfigError(f"{out} holds a different run and no checkpoint of this one", "choose another --output")


def _config(saved: dict, overrides: Sequence[str], path: Path, force: bool, log: Callable[[str], None],
            trusted: Optional[Config] = None, classes: object = None) -> Config:
    """The run's own config with `--set` applied; the changes are printed, breaking ones refused (a data set
    that moved to another path with the run's classes is not one: `_moved_data`). A command it names must be
    the user's own (`recipe.saved`): on the command line, or in `trusted` (their recipe)."""
    before = flatten(saved)
    cfg = config_from_file(saved, overrides, str(path), trusted, log)
    after = flatten(cfg.to_dict())
    asked = dict.fromkeys(k for item in overrides for k in flatten(parse_override(item)))  # in the given order
    changed = [k for k in asked if not _same(k, before.get(k), after.get(k))]
    breaking = _breaking(changed)
    moved = _moved_data(cfg, before.get("data.path"), classes, path) if breaking == ["data.path"] else None
    if moved:
        log(moved)
        changed, breaking = [k for k in changed if k != "data.path"], []
    if breaking and not force:
        k = breaking[0]
        raise ConfigError(f"{path} was trained with {k}={before.get(k)}; --set {k}={after.get(k)} would not "
                          "continue it bit-exactly", "drop that --set, pass --force to change it anyway, or start "
                          f"a new run from its weights with --set train.init_weights={path}")
    rescheduled = schedule_keys(changed)
    if rescheduled and not force:
        k = rescheduled[0]
        raise ConfigError(f"{path} was trained with {k}={before.get(k)}; {k}={after.get(k)} recomputes the lr "
                          "schedule, so the lr jumps at the resumed update and the run is not the one it continues",
                          "drop that change, or pass --force to continue on the new schedule (the lr it continues "
                          "at is printed)")
    for k in changed:
        log(f"resume: {k} {before.get(k)} -> {after.get(k)}" + (" (forced)" if k in breaking + rescheduled else ""))
    validate(cfg)
    return cfg
