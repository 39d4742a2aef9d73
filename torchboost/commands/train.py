"""`torchboost train`: train from a recipe (default: mnist-lenet on built-in MNIST)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable

from torchboost.commands.args import DEFAULT_RECIPE, int_between, positive_float, whole_number

NAME = "train"
HELP = "train from a recipe (default: mnist-lenet on built-in MNIST)"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help=f"recipe name or YAML path (default {DEFAULT_RECIPE}; without one, --data "
                                          "DIR trains a model chosen from the images' size unless --set model.name)")
    p.add_argument("--set", "-s", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    p.add_argument("--data", help="data folder/file (sets data.path; with a built-in data set, trains on the "
                                   "image folder instead)")
    p.add_argument("--epochs", type=whole_number, help="shortcut for --set train.epochs=N")
    p.add_argument("--lr", type=positive_float, help="shortcut for --set optim.lr=X")
    p.add_argument("--threads", type=int_between(1, 1024), help="torch's CPU threads (shortcut for --set "
                                                                  "train.threads=N; recorded in config.yaml)")
    p.add_argument("--batch-size", "-b", type=whole_number, help="shortcut for --set data.batch_size=N (per process)")
    p.add_argument("--output", "-o", help="output folder (default: runs/<recipe name>)")
    p.add_argument("--resume", metavar="CHECKPOINT|RUN_FOLDER|last|auto",
                   help="continue a run in its own folder with its recorded config (+ --set): a checkpoint, a run "
                        "folder (its newest checkpoint), last (the output folder's newest) or auto (that, or start "
                        "fresh); automatic after a torchrun restart")
    p.add_argument("--force", action="store_true", help="with --resume: allow --set changes that break an exact "
                                                        "continuation (data, model, seed, batch, optimizer)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier run's files in the output folder")
    p.add_argument("--print-config", action="store_true", help="print the validated config as YAML and exit")
    p.add_argument("--profile", nargs="?", const="", default=None, metavar="DIR",
                   help="record a few steps with torch.profiler (TensorBoard trace; default OUTPUT/profile)")


def run(args: argparse.Namespace) -> int:
    from ..recipe.config import dump_config
    from ..recipe.data import split_source
    from ..recipe.run import output_dir, train_from_config

    cfg, output, overwrite, resume = train_plan(args)
    if args.print_config:
        print(dump_config(cfg), end="")
        return 0
    folder, started = output_dir(cfg, output), time.time()
    try:
        result = train_from_config(cfg, resume=resume, output=output, profile=args.profile, overwrite=overwrite)
    except KeyboardInterrupt:
        print(_interrupted(folder, resume is not None, overwrite, started), file=sys.stderr)
        return 130
    acc = result.eval_results.get("val_top_1_accuracy")
    if acc is not None and result.is_main:
        top5 = result.eval_results.get("val_top_5_accuracy")  # absent with 5 classes or fewer
        test = result.final_results.get("test_top_1_accuracy")
        print(f"final: top-1 {acc:.4f}" + ("" if top5 is None else f", top-5 {top5:.4f}") +
              f", the last epoch's on {split_source(result.config.data, 'test')}" +
              ("" if test is None else f"; test top-1 {test:.4f} (best checkpoint, {result.output_dir}/test/)"))
    return 0


def train_overrides(args: argparse.Namespace) -> list[str]:
    """`--set` items plus the shortcuts (--epochs, --lr, --batch-size, --data), shortcuts last so they win."""
    overrides = list(args.set or [])
    for flag, key in (("epochs", "train.epochs"), ("lr", "optim.lr"), ("batch_size", "data.batch_size"),
                      ("threads", "train.threads")):
        if getattr(args, flag) is not None:
            overrides.append(f"{key}={getattr(args, flag)}")
    return overrides


def main_process() -> bool:
    """Rank 0, or no torchrun at all (read from its environment: the process group does not exist yet)."""
    return os.environ.get("RANK", "0").strip() in ("", "0")


def train_plan(args: argparse.Namespace, log: Callable[[str], None] = print):
    """(config, output folder, overwrite, checkpoint to resume or None) for `train`'s arguments."""
    from ..errors import ConfigError
    from ..recipe.load import recipe_with_data
    from ..recipe.resume import AUTO, plan_resume, restarted_by_torchrun
    from ..recipe.validation import validate

    say = log if main_process() else (lambda _: None)  # every process plans; one says what it planned
    if args.output is not None and not args.output.strip():
        raise ConfigError("-o/--output is empty", "give a folder, or leave -o out for runs/<recipe name>")
    restarted = args.resume is None and restarted_by_torchrun()
    resume = AUTO if restarted else args.resume
    overwrite = args.overwrite and not restarted  # the first attempt replaced the old run; restarts continue it
    recipe, choose = args.config or DEFAULT_RECIPE, args.config is None  # no recipe named: --data picks the model
    if not resume:
        cfg, _, note = recipe_with_data(recipe, train_overrides(args), args.data, choose)  # the recipe built once
        if note:
            say(note)
        validate(cfg)  # the one pass (train_from_config does not repeat it: recipe.validation.validated)
        return cfg, args.output, overwrite, None
    built, overrides, note = recipe_with_data(recipe, train_overrides(args), args.data, choose)  # read once
    # the run's own folder and recorded config (+ --set), see recipe.resume
    plan = plan_resume(resume, recipe, overrides, args.output, overwrite, args.force, say, built=built)
    if note and plan.checkpoint is None:  # `auto` found nothing to continue: a new run, told what it reads
        say(note)
    return plan.config, str(plan.output), plan.overwrite, str(plan.checkpoint) if plan.checkpoint else None


def _interrupted(folder: Path, resumed: bool, overwrite: bool, started: float) -> str:
    """What a Ctrl-C of `train` leaves: this run's newest checkpoint (one it resumed from, or wrote since
    `started`) and the command that continues it, or that there is none and which command starts over."""
    from ..recipe.outputs import previous_run
    from ..recipe.resume import newest_checkpoint

    found = newest_checkpoint(folder)
    if found is not None and (resumed or found[0].stat().st_mtime >= started):
        return f"interrupted: checkpoint {found[0]} is complete; continue with: torchboost train --resume {folder}"
    # the run's first files (config.yaml) make a rerun without --overwrite refuse the folder
    again = "the same command" if overwrite or not previous_run(folder) else "the same command with --overwrite"
    return f"interrupted before the first checkpoint: none was written; {again} starts over"
