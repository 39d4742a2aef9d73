"""`torchboost` command line: argument parsing and dispatch only (the work is in the library).

It runs over 400 lines because every subcommand's arguments and help text live here, beside the one
dispatch and the one error printer: a user reading `--help` and a reviewer reading this file see the same
thing in one place."""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Optional, Sequence

from .errors import TorchboostError, printable
from .fileio import atomic_write, check_output_folder

DEFAULT_RECIPE = "mnist-lenet"


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


def _train_plan(args: argparse.Namespace, log: Callable[[str], None] = print):
    """(config, output folder, overwrite, checkpoint to resume or None) for `train`'s arguments."""
    from .errors import ConfigError
    from .recipe.load import recipe_with_data
    from .recipe.resume import AUTO, plan_resume, restarted_by_torchrun
    from .recipe.validation import validate

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


def _cmd_train(args: argparse.Namespace) -> int:
    from .recipe.config import dump_config
    from .recipe.data import split_source
    from .recipe.run import output_dir, train_from_config

    cfg, output, overwrite, resume = _train_plan(args)
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


def _interrupted(folder: Path, resumed: bool, overwrite: bool, started: float) -> str:
    """What a Ctrl-C of `train` leaves: this run's newest checkpoint (one it resumed from, or wrote since
    `started`) and the command that continues it, or that there is none and which command starts over."""
    from .recipe.outputs import previous_run
    from .recipe.resume import newest_checkpoint

    found = newest_checkpoint(folder)
    if found is not None and (resumed or found[0].stat().st_mtime >= started):
        return f"interrupted: checkpoint {found[0]} is complete; continue with: torchboost train --resume {folder}"
    # the run's first files (config.yaml) make a rerun without --overwrite refuse the folder
    again = "the same command" if overwrite or not previous_run(folder) else "the same command with --overwrite"
    return f"interrupted before the first checkpoint: none was written; {again} starts over"


def _cmd_launch(args: argparse.Namespace) -> int:
    from .distributed.agent import run_agent
    from .errors import ConfigError
    from .recipe.run import check_epochs_left, output_dir
    from .train.checkpoint import load_checkpoint

    if args.train[:1] != ["train"]:
        raise ConfigError("torchboost launch runs `train ...` on every process",
                          "end the command with train and its arguments: torchboost launch --nproc-per-node 2 "
                          "train -c RECIPE")
    if args.nproc_per_node < 1 or args.max_restarts < 0:
        raise ConfigError(f"--nproc-per-node {args.nproc_per_node} --max-restarts {args.max_restarts}",
                          "use at least 1 process per node and 0 or more restarts")
    if args.nnodes != "1" and args.rdzv_endpoint is None:
        raise ConfigError(f"--nnodes {args.nnodes} needs the rendezvous address", "add --rdzv-endpoint HOST:PORT "
                          "(one node's address, the same on every node)")
    host, _, port = (args.rdzv_endpoint or "").rpartition(":")
    if args.rdzv_endpoint is not None and not (host and port.isdigit() and 0 < int(port) < 65536):
        raise ConfigError(f"--rdzv-endpoint {args.rdzv_endpoint} is not HOST:PORT", "give one node's address and a "
                          "free port, e.g. --rdzv-endpoint 10.0.0.1:29500")
    train = build_parser().parse_args(args.train)
    command = list(args.train)
    if train.resume is None and not train.overwrite:  # the same command, run again, continues the run
        command += ["--resume", "auto"]
        train.resume = "auto"
    # what every process will do, checked once here: a run that cannot start is refused before any process
    # starts (torchrun would restart its failing processes --max-restarts times for nothing)
    cfg, output, _, resume = _train_plan(train, log=lambda _: None)
    if resume:
        check_epochs_left(load_checkpoint(resume), resume, cfg.train.epochs)
    run_agent(command, nnodes=args.nnodes, nproc_per_node=args.nproc_per_node, rdzv_endpoint=args.rdzv_endpoint,
              rdzv_id=args.rdzv_id, max_restarts=args.max_restarts, join_timeout_s=cfg.dist.timeout_s,
              worklogs=output_dir(cfg, output) / "log")  # a failure names the real worklog.<rank>
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from .recipe.infer import evaluate_checkpoint
    from .recipe.per_class import summary_lines, write_per_class

    res = evaluate_checkpoint(args.checkpoint, args.data, args.split, use_ema=args.ema, config=args.config,
                              overrides=args.set or [])
    report, source = res.pop("per_class"), res.pop("data")
    written = write_per_class(report, Path(args.out), f"confusion on {source}") if args.out else []
    if args.format == "json":  # full precision, what it was computed on and every per-class figure, one document
        print(json.dumps({"evaluated_on": source, **res, "per_class": report,
                          "files": [str(p) for p in written]}, indent=1))
        return 0
    print(f"evaluated {source}: {res['samples']} images")  # names the folder it read
    print(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items()))
    print("\n".join(summary_lines(report)))
    if written:
        print(f"per-class results: {', '.join(str(p) for p in written)}")
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    from .recipe.infer import predict_images

    rows = predict_images(args.checkpoint, args.images, args.topk, config=args.config, overrides=args.set or [])
    if args.format == "json":  # one JSON document: names with any characters stay one value
        print(json.dumps([{"file": path, "top": [{"class": c, "probability": p} for c, p in preds]}
                          for path, preds in rows], indent=1))
    elif args.format == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(["file", "rank", "class", "probability"])
        # names escaped as in text (a terminal shows CSV too); --format json keeps them exact, JSON-escaped
        writer.writerows([printable(path), rank + 1, printable(c), f"{p:.6f}"] for path, preds in rows
                         for rank, (c, p) in enumerate(preds))
    else:  # text: names from files (image paths, the checkpoint's class names) with control characters escaped,
        for path, preds in rows:  # so a class called "cat\nfile.png: dog 0.99" cannot print a line of its own
            print(f"{printable(path)}: " + ", ".join(f"{printable(c)} {p:.4f}" for c, p in preds))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from .recipe.export import export_checkpoint

    info, fmt = export_checkpoint(args.checkpoint, args.out, args.format, config=args.config,
                                  overrides=args.set or [])
    stats = " ".join(f"{name} ({', '.join(f'{v:.4g}' for v in values)})" for name, values in
                     (("mean", info.mean), ("std", info.std)))
    print(f"wrote {printable(args.out)} ({fmt}): {info.model} on float32 N×{'×'.join(map(str, info.input_size))}, "
          f"normalised: resize {info.resize}, centre crop {info.size}, {stats}; {len(info.classes)} classes")
    return 0


def _cmd_recipes(args: argparse.Namespace) -> int:
    import itertools

    from .recipe.config import find_recipe, list_recipes

    if args.action == "show":
        if not args.name:
            raise TorchboostError("`torchboost recipes show` needs a recipe name", "run `torchboost recipes` to list them")
        print(find_recipe(args.name).read_text(), end="")
    else:
        for name in list_recipes():  # each recipe's opening comment says what it trains: its first sentence
            lines = find_recipe(name).read_text().splitlines()
            text = " ".join(l.lstrip("# ").strip() for l in itertools.takewhile(lambda l: l.startswith("#"), lines))
            first = text.split(". ")[0].split(": ")[0].rstrip(".")
            if first.count("(") > first.count(")"):  # cut where a parenthesis opens but does not close
                first = first[:first.rfind("(")].rstrip(" ,")
            print(f"{name:<24} {first[:100]}".rstrip())
    return 0


def _cmd_options(args: argparse.Namespace) -> int:
    from .recipe.reference import render_markdown, render_text, select

    print(render_markdown() if args.markdown else render_text(select(args.keys)), end="" if args.markdown else "\n")
    return 0


def _cmd_export_folder(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .data.export import export_folder
    from .errors import OutputError

    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise OutputError(f"--out {args.out} is a file, not a folder", "choose a folder path")
    out = export_folder(args.dataset, args.out)
    print(f"wrote {args.dataset} as an image folder under {out}")
    return 0


def _cmd_export_shards(args: argparse.Namespace) -> int:
    from .data.export import export_shards
    from .errors import OutputError

    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise OutputError(f"OUT {args.out} is a file, not a folder", "choose a folder path")
    index = export_shards(args.source, args.out, args.shard_size, overwrite=args.overwrite)
    for name, split in index.splits.items():
        print(f"{name}: {sum(split.lengths)} images, {len(split.classes)} classes in {len(split.filenames)} shard(s)")
    print(f"wrote shards and their index to {args.out}; train on them with "
          f"--set data.dataset=shards --set data.path={args.out}")
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from .migrate.convert import convert

    report = convert(args.input, args.output, arch=args.arch, num_classes=args.num_classes,
                     drop_background=args.drop_background, convert_moments=args.moments, strict=not args.no_strict,
                     add_background=args.add_background)
    print(report.summary())
    print(f"wrote {args.output}")
    return 0


def _cmd_align(args: argparse.Namespace) -> int:
    from .recipe.align import align_from_config

    result = align_from_config(
        args.config, reference=args.reference, reference_config=args.reference_config,
        reference_dump=args.reference_dump, dump_ours=args.dump_ours, overrides=args.set or [],
        reference_overrides=args.reference_set or [], batch_size=args.batch_size, batch_source=args.batch,
        single_step=args.single_step, name_map=args.name_map, steps=args.steps)
    if args.dump_ours:
        print(f"wrote our {args.steps} training step(s)' tensors to {result}")
        return 0
    print(result.table(limit=args.rows, failures_only=args.failures_only))  # ends with the verdict line
    if args.report:
        result.save(args.report)
        print(f"report: {args.report}")
    return 0 if result.passed else 1  # 1 = a divergence was found (usable as a CI gate)


def _cmd_diff_config(args: argparse.Namespace) -> int:
    from .recipe.diff import diff_configs

    diff = diff_configs(args.a, args.b, args.set_a or [], args.set_b or [])
    print(diff.table(all_keys=args.all))
    if args.json:
        atomic_write(args.json, json.dumps(diff.to_dict(all_keys=args.all), indent=2))
    return 0


def _cmd_debug_layers(args: argparse.Namespace) -> int:
    from .debug import layer_stats_from_config

    report = layer_stats_from_config(args.config, args.set or [], checkpoint=args.checkpoint,
                                     batch_size=args.batch_size, batch_source=args.batch,
                                     train_mode=not args.eval_mode)
    print(report.table())
    if args.json:
        atomic_write(args.json, json.dumps(report.to_dict(), indent=2))
    return 0


DEFAULT_RACE_TARGETS = (0.975, 0.98)


def _cmd_race(args: argparse.Namespace) -> int:
    import torch

    from .errors import ConfigError, suggest
    from .recipe import load_resolved
    from .recipe.data import split_source
    from .recipe.load import recipe_with_data
    from .recipe.optimizers import default_racers
    from .optim.registry import OPTIMIZERS
    from .recipe.race import budget_racers, parse_budgets, parse_lr_grids, race_setup, run_race, variant_racer
    from .recipe.racer_name import parse_racer
    from .recipe.race_report import format_report, headline, is_thor, summarize, write_results
    from .recipe.race_ledger import check_ledger, default_ledger, read_ledger, record
    from .recipe.race_select import (check_fresh_seeds, check_same_task, confirmation_targets, fixed_targets,
                                     fixed_targets_line, frozen_racers, grid_edges, read_race, selections)
    from .train.device import device_name

    if args.report:
        return _race_report(args)
    torch.set_num_threads(args.threads)  # fixed and reported: timings depend on it
    if args.frozen and (args.optimizers or args.lr or args.budget or args.lr_find or args.holdout):
        raise ConfigError("--frozen races the optimizers, lrs and budgets its selection chose, on the test split",
                          "drop --optimizers, --lr, --budget, --lr-find and --holdout (or select again)")
    if args.ledger and args.holdout:
        raise ConfigError("--ledger records races on the test split; --holdout never reads it",
                          "drop --ledger when selecting")
    optimizers = args.optimizers or default_racers()
    for name in optimizers:  # before any data is read (a variant's options are checked once the config is)
        base = parse_racer(name).base
        if base not in OPTIMIZERS:
            raise ConfigError(f"unknown optimizer {base!r} in --optimizers {name}", suggest(base, list(OPTIMIZERS)))
    grids, budgets = parse_lr_grids(args.lr or []), parse_budgets(args.budget or [])
    for flag, named in (("--lr", grids), ("--budget", budgets)):
        unused = [name for name in named if name not in optimizers]
        if unused:
            raise ConfigError(f"{flag} names {unused[0]}, which is not among --optimizers "
                              f"{' '.join(optimizers)}", suggest(unused[0], optimizers))
    batch = [] if args.batch_size is None else [f"data.batch_size={args.batch_size}"]
    built, overrides, note = recipe_with_data(args.config, [*(args.set or []), *batch], args.data)  # as `train` reads --data
    if note:
        print(note)
    targets = tuple(args.targets or DEFAULT_RACE_TARGETS)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    chosen = None
    ledger = Path(args.ledger) if args.ledger else default_ledger(args.frozen) if args.frozen else None
    if args.frozen:  # before any data is read: a wrong selection file is a one-line error at once
        selection = read_race(Path(args.frozen))
        check_same_task(selection, args.frozen, args.config, overrides)
        targets = confirmation_targets(selection, args.frozen, args.targets)
        check_fresh_seeds(selection, args.frozen, seeds)
        chosen = selections(selection, args.frozen)
    if ledger is not None:  # checked again, and written, when the test split is about to be read
        check_ledger(read_ledger(ledger), ledger, args.config, overrides,
                     [(s.racer, s.lr) for s in chosen or ()], seeds)
    # a confirmation, and any race the ledger records, reads the test split itself (refused when missing), never a
    # folder's val/
    cfg, train_ds, eval_ds = load_resolved(built=built, holdout=args.holdout,
                                           exact_split="test" if ledger else None)  # the recipe read once
    evaluated = (f"{args.holdout} training samples held out of {split_source(cfg.data, 'train')}" if args.holdout
                 else split_source(cfg.data, "test", exact=ledger is not None))
    cfg, lines = race_setup(args.config, cfg, len(train_ds), args.epochs or cfg.train.epochs)
    lines.append(f"evaluated on {evaluated}: {len(eval_ds)} images")
    if args.holdout:
        lines.append(f"selecting on {args.holdout} training samples held out (the test split is not read); confirm "
                     "with --frozen OUTPUT/race.json on fresh seeds")
    print("\n".join(lines))  # what is raced, before the first of many runs
    if chosen is not None:
        racers = frozen_racers(chosen, cfg)
        print("frozen: " + ", ".join(f"{r.name} lr {r.lrs[0]:g}" for r in racers))
    else:
        if args.lr_find:  # centre the grids the user did not give on each optimizer's lr-find suggestion
            from .recipe.lr_find import lr_find_grids

            sweep = [n for n in optimizers if n not in grids]
            if any("[" in n for n in sweep):
                raise ConfigError("--lr-find sweeps registered optimizers, not variants",
                                  f"give {next(n for n in sweep if '[' in n)} its grid with --lr")
            grids.update(lr_find_grids(cfg, train_ds, sweep))
        racers = [r for name in optimizers
                  for r in budget_racers(variant_racer(name, cfg, grids.get(name)), budgets.get(name))]
    meta = {"recipe": args.config, "overrides": overrides, "targets": targets, "seeds": args.seeds,
            "first_seed": args.first_seed, "evals_per_epoch": args.evals_per_epoch,
            "epochs": args.epochs or cfg.train.epochs, "time_budget_s": args.time_budget,
            "batch_size": cfg.data.batch_size, "updates_per_epoch": len(train_ds) // cfg.data.batch_size,
            "holdout": args.holdout, "frozen": args.frozen, "full_budget": args.full_budget,
            "evaluated_on": evaluated, "evaluation_images": len(eval_ds), "ledger": str(ledger) if ledger else None}
    out = Path(args.output or f"runs/race-{cfg.name}")
    check_output_folder(out)  # before the first epoch, not at the first save
    if ledger is not None:  # every (configuration, seed) about to be evaluated on the test split, before it is
        record(ledger, args.config, overrides, [(r.name, lr) for r in racers for lr in r.lrs], seeds,
               str(out / "race.json"), [(s.racer, s.lr) for s in chosen] if chosen is not None else None)
        print(f"test-split ledger: {ledger}")

    def save(lanes: list) -> tuple[Path, Path]:
        return write_results(lanes, {**summarize(lanes, targets), "evaluated_on": evaluated}, meta, out)

    lanes = run_race(cfg, train_ds, eval_ds, racers, seeds, targets, epochs=args.epochs,
                     time_budget_s=args.time_budget, stop_at_targets=not args.full_budget, on_round=save,
                     trace=args.trace, evals_per_epoch=args.evals_per_epoch)
    summary = {**summarize(lanes, targets), "evaluated_on": evaluated}  # every figure names its split
    print(format_report(summary, args.threads, device_name(lanes[0].device)))
    for racer in racers:
        if is_thor(racer.name) and len(racers) > 1:
            print(headline(summary, racer.name))
    if args.holdout:  # the selection ends: the confirmation's targets are fixed now, in its race.json
        meta["fixed_targets"] = fixed_targets(summary)
        print("\n".join([*grid_edges(summary, lanes), fixed_targets_line(meta["fixed_targets"])]))
    json_path, png = save(lanes)
    print(f"results: {json_path}; plot: {png}")
    if args.trace:
        from .fileio import confine_writes
        from .recipe.race_trace import trace_figure_path

        with confine_writes(out):
            print(f"trace: {trace_figure_path(lanes, summary, out / 'race-trace.png')}")
    return 0



def _race_report(args: argparse.Namespace) -> int:
    """`race --report FILE...`: the table of saved races, pooled (`recipe.race_select.pooled_lanes`), without
    training; with --output also the pooled race.json and race.png."""
    from .recipe.race_report import format_report, headline, is_thor, summarize, write_results
    from .recipe.race_select import (fixed_targets, fixed_targets_line, grid_edges, pooled_lanes, pooled_settings,
                                     raced_targets, read_race)

    lanes = pooled_lanes([Path(p) for p in args.report])
    settings = read_race(Path(args.report[0]))["settings"]
    if settings.get("holdout"):  # pooled selections: the confirmation's targets from every pooled run
        pooled = summarize(lanes, raced_targets(settings, args.report[0]))
        settings = {**settings, "fixed_targets": fixed_targets(pooled)}
        print("\n".join([*grid_edges(pooled, lanes), fixed_targets_line(settings["fixed_targets"])]))
    targets = tuple(args.targets or settings.get("targets") or DEFAULT_RACE_TARGETS)
    on = settings.get("evaluated_on")  # a race.json before this key: its split unknown, and said so
    summary = {**summarize(lanes, targets), "evaluated_on": on if isinstance(on, str) else "an unrecorded split"}
    print(format_report(summary, settings.get("threads", 0), str(settings.get("device", "cpu"))))
    names = list(dict.fromkeys(l.racer for l in lanes))
    for name in names:
        if is_thor(name) and len(names) > 1:
            print(headline(summary, name))
    if args.output:
        out = Path(args.output)
        check_output_folder(out)
        json_path, png = write_results(lanes, summary, pooled_settings(settings, lanes, args.report), out)
        print(f"results: {json_path}; plot: {png}")
    return 0


def _cmd_lr_find(args: argparse.Namespace) -> int:
    import torch

    from .recipe import load_resolved
    from .recipe.load import recipe_with_data
    from .recipe.lr_find import format_results, lr_find, write_results
    from .recipe.resolve import fit_batch

    torch.set_num_threads(args.threads)
    batch = [] if args.batch_size is None else [f"data.batch_size={args.batch_size}"]
    built, overrides, note = recipe_with_data(args.config, [*(args.set or []), *batch], args.data)
    cfg, train_ds, _ = load_resolved(built=built)
    cfg, fitted = fit_batch(cfg, len(train_ds), 1)
    for line in (note, fitted and f"note: {fitted}"):
        if line:
            print(line)
    out = Path(args.output or f"runs/lr-find-{cfg.name}")
    check_output_folder(out)
    names = args.optimizers or [cfg.optim.name]
    print(f"lr range test on recipe {args.config}: lr {args.start:g} to {args.end:g} over {args.updates} updates "
          f"(batch {cfg.data.batch_size}), {', '.join(names)}")
    results = lr_find(cfg, train_ds, names, args.start, args.end, args.updates)
    print(format_results(results))
    meta = {"recipe": args.config, "overrides": overrides, "start": args.start, "end": args.end,
            "updates": args.updates, "batch_size": cfg.data.batch_size, "threads": args.threads}
    json_path, png = write_results(results, meta, out)
    print(f"results: {json_path}; plot: {png}")
    return 0


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes get the same one-line `error: ...` as every other error (exit 2), not a usage dump.

    A subcommand whose arguments read a registry or torch (the optimizer table's names, the built-in sets,
    bench's models) gives them as `later=add(parser)`: they are added when that subcommand is used, its
    arguments parsed or its help printed, so `torchboost --help` and the other subcommands start without
    importing the registries (and torch). `complete()` adds them at once, for code that reads the actions."""

    def __init__(self, *args, later: Optional[Callable[[argparse.ArgumentParser], None]] = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._later = later

    def complete(self) -> OneLineParser:
        later, self._later = self._later, None
        if later is not None:
            later(self)
        return self

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self.complete()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self.complete()
        return super().format_usage()

    def format_help(self) -> str:
        self.complete()
        return super().format_help()

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} — see `{self.prog} --help`\n")


def int_between(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number in [low, high] (an upper bound keeps a typo from exhausting memory)."""
    def parse(text: str) -> int:
        shown = text if len(text) <= 40 else f"{text[:20]}…({len(text):,} characters)"  # one short line
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{shown!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{shown} is not between {low} and {high}")
        return value
    parse.__name__ = "int"  # argparse names the type in its messages
    return parse


positive_int = int_between(1, 2**31 - 1)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a finite number > 0")
    return value


def accuracy_target(text: str) -> float:
    """An argparse type: a top-1 accuracy to reach, in (0, 1]."""
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an accuracy in (0, 1] (0.975 is 97.5%)")
    return value
APPLIED_THREADS = ("eval", "predict", "export", "align", "debug-layers", "bench")  # train: train.threads; race, lr-find: their own


def add_threads(p: argparse.ArgumentParser) -> None:
    """--threads N on a command that computes (main applies it before the command runs)."""
    p.add_argument("--threads", type=int_between(1, 1024), help="torch's CPU threads (default: torch's choice)")


DIAGNOSTIC_BATCH = int_between(1, 1024)  # align / debug-layers look at one batch: its activations are kept


def build_parser(complete: bool = False) -> argparse.ArgumentParser:
    """The `torchboost` parser. Subcommands whose arguments read a registry add them when used (see
    OneLineParser); `complete=True` adds them all now (for code that inspects every subcommand's actions)."""
    from . import __version__

    p = OneLineParser(prog="torchboost", description="Train image classifiers faster on PyTorch.")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    p.add_argument("--version", action="version", version=f"torchboost {__version__}")
    sub = p.add_subparsers(dest="command")

    t = sub.add_parser("train", help="train from a recipe (default: mnist-lenet on built-in MNIST)")
    t.add_argument("--config", "-c", help=f"recipe name or YAML path (default {DEFAULT_RECIPE}; without one, --data "
                                          "DIR trains a model chosen from the images' size unless --set model.name)")
    t.add_argument("--set", "-s", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    t.add_argument("--data", help="data folder/file (sets data.path; with a built-in data set, trains on the "
                                   "image folder instead)")
    t.add_argument("--epochs", type=int, help="shortcut for --set train.epochs=N")
    t.add_argument("--lr", type=positive_float, help="shortcut for --set optim.lr=X")
    t.add_argument("--threads", type=int_between(1, 1024), help="torch's CPU threads (shortcut for --set "
                                                                  "train.threads=N; recorded in config.yaml)")
    t.add_argument("--batch-size", "-b", type=int, help="shortcut for --set data.batch_size=N (per process)")
    t.add_argument("--output", "-o", help="output folder (default: runs/<recipe name>)")
    t.add_argument("--resume", metavar="CHECKPOINT|RUN_FOLDER|last|auto",
                   help="continue a run in its own folder with its recorded config (+ --set): a checkpoint, a run "
                        "folder (its newest checkpoint), last (the output folder's newest) or auto (that, or start "
                        "fresh); automatic after a torchrun restart")
    t.add_argument("--force", action="store_true", help="with --resume: allow --set changes that break an exact "
                                                        "continuation (data, model, seed, batch, optimizer)")
    t.add_argument("--overwrite", action="store_true", help="replace an earlier run's files in the output folder")
    t.add_argument("--print-config", action="store_true", help="print the validated config as YAML and exit")
    t.add_argument("--profile", nargs="?", const="", default=None, metavar="DIR",
                   help="record a few steps with torch.profiler (TensorBoard trace; default OUTPUT/profile)")
    t.set_defaults(func=_cmd_train)

    la = sub.add_parser("launch", help="train on several processes and machines under torchrun's agent: restarts "
                                        "resume by themselves, a node that never arrives ends the job after "
                                        "dist.timeout_s with one line")
    la.add_argument("--nnodes", default="1", help="machines in the job: N, or MIN:MAX for an elastic job")
    la.add_argument("--nproc-per-node", type=int, default=1, help="training processes on this machine")
    la.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="where the machines meet (one of them, the same "
                                                                 "on all); unset: this machine alone")
    la.add_argument("--rdzv-id", default="torchboost", help="the job's name at the endpoint (the same on all)")
    la.add_argument("--max-restarts", type=int, default=0, help="restart the processes this many times after a "
                                                                "failure; each restart resumes from the newest checkpoint")
    la.add_argument("train", nargs=argparse.REMAINDER, help="train and its arguments, as for torchboost train "
                                                            "(--resume auto is added unless --resume/--overwrite is given)")
    la.set_defaults(func=_cmd_launch)

    e = sub.add_parser("eval", help="evaluate a checkpoint (top-1/top-5/loss)")
    e.add_argument("--checkpoint", required=True, help="a training checkpoint, or weights (.pt/.safetensors) "
                                                       "with --config")
    e.add_argument("--config", "-c", help="recipe that built plain weights (training checkpoints carry theirs)")
    e.add_argument("--set", "-s", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    e.add_argument("--data", help="image folder to evaluate on (default: the run's own data)")
    e.add_argument("--split", choices=["train", "val", "test"],
                   help="the split to evaluate, read exactly: a folder's train/, val/ or test/ (default: the run's "
                        "evaluation split, a folder's val/ or else test/)")
    e.add_argument("--ema", action="store_true", help="evaluate the EMA weights")
    e.add_argument("--format", choices=["text", "json"], default="text",
                   help="output format (json: full precision and every per-class figure)")
    e.add_argument("--out", metavar="DIR", help="write per_class.csv, confusion.csv, confusion.png and "
                                                "per_class.json there")
    add_threads(e)
    e.set_defaults(func=_cmd_eval)

    pr = sub.add_parser("predict", help="top-k classes of image files (or every image in folders)")
    pr.add_argument("--checkpoint", required=True, help="a training checkpoint, weights in any format with --config, "
                                                       "or an .onnx from `torchboost export` (run by ONNX Runtime, "
                                                       "preprocessed as it records)")
    pr.add_argument("--config", "-c", help="recipe that built plain weights (training checkpoints carry theirs)")
    pr.add_argument("--set", "-s", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    pr.add_argument("--topk", type=positive_int, default=5, help="classes to show per image (default 5)")
    pr.add_argument("--format", choices=["text", "json", "csv"], default="text", help="output format")
    pr.add_argument("images", nargs="+", help="image files or folders")
    add_threads(pr)
    pr.set_defaults(func=_cmd_predict)

    r = sub.add_parser("recipes", help="list shipped recipes or show one")
    r.add_argument("action", nargs="?", choices=["list", "show"], default="list",
                   help="list the recipes with what each trains (default), or show one's YAML")
    r.add_argument("name", nargs="?", help="the recipe to show")
    r.set_defaults(func=_cmd_recipes)

    o = sub.add_parser("options", help="every config key: type, default, allowed values, meaning")
    o.add_argument("keys", nargs="*", metavar="KEY", help="keys or sections to show (e.g. optim.thor); default: all")
    o.add_argument("--markdown", action="store_true", help="the whole reference as Markdown (docs/CONFIG.md)")
    o.set_defaults(func=_cmd_options)

    x = sub.add_parser("export-folder", help="write a built-in data set as an ImageNet-style image folder",
                       later=_export_folder_arguments)
    x.set_defaults(func=_cmd_export_folder)

    xs = sub.add_parser("export-shards", help="write an image folder as WebDataset tar shards (for data.dataset=shards)")
    xs.add_argument("source", metavar="FOLDER", help="image folder with train/ and val/ (or test/), one sub-folder per class")
    xs.add_argument("out", help="folder for OUT/{split}-000000.tar ... and the index OUT/_info.json")
    xs.add_argument("--shard-size", type=int, default=1000, help="images per shard (default 1000)")
    xs.add_argument("--overwrite", action="store_true",
                    help="replace an earlier export in OUT, deleting only its own files (its index, the shards it "
                         "lists, their offsets); without it such a folder is refused. Other files in OUT are "
                         "always left alone, as train leaves them in its output folder")
    xs.set_defaults(func=_cmd_export_shards)

    ex = sub.add_parser("export", help="write a checkpoint for deployment: ONNX, TorchScript or an ExportedProgram, "
                                       "with its input size, normalisation and class names recorded")
    ex.add_argument("checkpoint", metavar="CKPT", help="a training checkpoint, or weights with --config")
    ex.add_argument("out", metavar="OUT", help="file to write: .onnx, .pt2 (torch.export's ExportedProgram), "
                                               ".torchscript.pt or .ts (TorchScript, deprecated by torch)")
    ex.add_argument("--format", choices=["onnx", "torchscript", "exported-program"],
                    help="the format (default: from OUT's name, which must not name another)")
    ex.add_argument("--config", "-c", help="recipe that built plain weights (training checkpoints carry theirs)")
    ex.add_argument("--set", "-s", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    add_threads(ex)
    ex.set_defaults(func=_cmd_export)

    c = sub.add_parser("convert", help="convert weights between MindSpore .ckpt, PaddlePaddle .pdparams, torch "
                       ".pt/.pth and .safetensors; prints the create_model call of the matching torch network")
    c.add_argument("input", help="weights to read (.ckpt, .pdparams, .pt/.pth, .safetensors)")
    c.add_argument("output", help="file to write; its extension picks the format")
    c.add_argument("--arch", help="resnet18/34/50/101/152, or mnist_cnn for the PaddlePaddle tutorial CNN "
                   "(default: detected from the names; none: keep names)")
    c.add_argument("--num-classes", type=positive_int, help="classes of the classifier (default: from the weights)")
    c.add_argument("--drop-background", action="store_true", help="1001 -> 1000 classes (drop MindSpore's class 0)")
    c.add_argument("--add-background", action="store_true",
                   help="1000 -> 1001 classes when writing a .ckpt (add MindSpore's never-predicted class 0)")
    c.add_argument("--moments", action="store_true", help="also convert momentum buffers (moments.*)")
    c.add_argument("--no-strict", action="store_true", help="write even when tensors are unmapped or missing")
    c.set_defaults(func=_cmd_convert)

    a = sub.add_parser("align", help="run a few training steps on two implementations and report the first "
                                     "divergence")
    a.add_argument("--config", "-c", default=DEFAULT_RECIPE, help="our side: recipe name or YAML path")
    a.add_argument("--set", "-s", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    ref = a.add_mutually_exclusive_group(required=True)
    ref.add_argument("--reference", metavar="MODULE:CALLABLE", help="a torch model factory, e.g. pkg.mod:make")
    ref.add_argument("--reference-config", metavar="RECIPE", help="another torchboost recipe")
    ref.add_argument("--reference-dump", metavar="DIR", help="per-layer tensors dumped by another framework")
    ref.add_argument("--dump-ours", metavar="DIR", help="write our step in the dump layout and stop")
    a.add_argument("--reference-set", action="append", metavar="KEY=VALUE",
                   help="override a key of --reference-config (repeatable): network, loss and optimizer keys all apply")
    a.add_argument("--steps", type=int_between(1, 100), default=3,
                   help="training steps on the one batch (default 3: optimizer state such as momentum shows only "
                        "from the 2nd)")
    a.add_argument("--single-step", action="store_true", help="feed each reference layer our layer's inputs")
    a.add_argument("--name-map", metavar="FILE.json|mindspore", help="map our names to the reference's")
    a.add_argument("--batch-size", type=DIAGNOSTIC_BATCH, default=8, help="images in the one batch both sides run")
    a.add_argument("--batch", choices=["random", "data"], default="random", help="seeded noise or real images")
    a.add_argument("--report", metavar="OUT.json", help="write the JSON report")
    a.add_argument("--rows", type=int, default=40, help="table rows to print")
    a.add_argument("--failures-only", action="store_true", help="print only the rows that fail the tolerance")
    add_threads(a)
    a.set_defaults(func=_cmd_align)

    d = sub.add_parser("diff-config", help="compare two recipes/configs/checkpoints side by side")
    d.add_argument("a", help="a recipe, a YAML file, a run folder or a training checkpoint")
    d.add_argument("b", help="the other one")
    d.add_argument("--set-a", action="append", metavar="KEY=VALUE", help="override a key of A (repeatable)")
    d.add_argument("--set-b", action="append", metavar="KEY=VALUE", help="override a key of B (repeatable)")
    d.add_argument("--all", action="store_true", help="show equal keys too")
    d.add_argument("--json", metavar="OUT.json", help="also write the comparison as JSON")
    d.set_defaults(func=_cmd_diff_config)

    g = sub.add_parser("debug-layers", help="per-layer output/gradient statistics for one batch")
    g.add_argument("--config", "-c", default=DEFAULT_RECIPE, help="recipe name or YAML path")
    g.add_argument("--set", "-s", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    g.add_argument("--checkpoint", help="weights to inspect (default: fresh initialisation)")
    g.add_argument("--batch-size", type=DIAGNOSTIC_BATCH, default=16, help="images in the batch")
    g.add_argument("--batch", choices=["random", "data"], default="data",
                   help="a batch of the evaluation data (default) or random inputs")
    g.add_argument("--eval-mode", action="store_true", help="BN in eval mode")
    g.add_argument("--json", metavar="OUT.json", help="also write the statistics as JSON")
    add_threads(g)
    g.set_defaults(func=_cmd_debug_layers)

    rc = sub.add_parser("race", help="race optimizers on a recipe: time to accuracy", later=_race_arguments)
    rc.set_defaults(func=_cmd_race)

    lf = sub.add_parser("lr-find", help="lr range test: sweep the lr up over a few hundred updates and suggest one "
                                        "per optimizer (a decade below the smoothed loss's lowest point), with a plot",
                        later=_lr_find_arguments)
    lf.set_defaults(func=_cmd_lr_find)

    b = sub.add_parser("bench", help="training-step and data-pipeline images/s, and which one limits",
                       later=_bench_arguments)
    add_threads(b)
    b.set_defaults(func=_cmd_bench)
    if complete:
        for parser in sub.choices.values():
            parser.complete()
    return p


def _export_folder_arguments(x: argparse.ArgumentParser) -> None:
    from .data.builtin import BUILTIN_SETS
    from .recipe.kinds import DEFAULT_KIND

    x.add_argument("--dataset", default=DEFAULT_KIND, choices=list(BUILTIN_SETS), help="which built-in set")
    x.add_argument("--out", required=True, help="folder to write OUT/train/<class>/*.png and OUT/test/")


def _lr_find_arguments(lf: argparse.ArgumentParser) -> None:
    from .optim.registry import OPTIMIZERS
    from .recipe.lr_find import DEFAULT_RANGE, DEFAULT_UPDATES

    lf.add_argument("--config", "-c", default="mnist-lenet", help="recipe name or YAML path")
    lf.add_argument("--set", "-s", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    lf.add_argument("--data", help="data folder/file, as for train")
    lf.add_argument("--batch-size", "-b", type=positive_int, help="shortcut for --set data.batch_size=N")
    lf.add_argument("--optimizers", nargs="+", metavar="NAME", choices=list(OPTIMIZERS),
                    help=f"any of {' '.join(OPTIMIZERS)} (default: the recipe's optim.name)")
    lf.add_argument("--start", type=positive_float, default=DEFAULT_RANGE[0], help="first lr of the sweep")
    lf.add_argument("--end", type=positive_float, default=DEFAULT_RANGE[1], help="last lr of the sweep")
    lf.add_argument("--updates", type=int_between(10, 100_000), default=DEFAULT_UPDATES,
                    help="updates in the sweep (the lr grows geometrically from --start to --end)")
    lf.add_argument("--threads", type=int_between(1, 1024), default=1, help="torch threads")
    lf.add_argument("--output", "-o", help="folder for lr-find.json and lr-find.png (default runs/lr-find-<recipe "
                                           "name>)")


def _race_arguments(rc: argparse.ArgumentParser) -> None:
    from .optim.registry import OPTIMIZERS
    from .recipe.optimizers import default_racers

    rc.add_argument("--config", "-c", default="mnist-lenet-thor", help="recipe name or YAML path")
    rc.add_argument("--set", "-s", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    rc.add_argument("--data", help="data folder/file, as for train (sets data.path; with a built-in data set, races "
                                   "on the image folder instead)")
    rc.add_argument("--batch-size", "-b", type=positive_int, help="shortcut for --set data.batch_size=N (aim at 10 or "
                                                                   "more updates per epoch)")
    racers = default_racers()
    rc.add_argument("--optimizers", nargs="+", metavar="NAME",
                    help=f"any of {' '.join(OPTIMIZERS)} (default: {' '.join(racers)}), or a variant with some "
                         "options changed: 'thor[graft=muon_step]', 'muon[weight_norm=pin]'")
    rc.add_argument("--lr", action="append", metavar="NAME=LR,LR",
                    help="lr grid of one optimizer, e.g. sgd=0.01,0.02,0.05 (repeatable; defaults per optimizer)")
    rc.add_argument("--targets", nargs="+", type=accuracy_target, help="validation top-1 targets (default 0.975 0.98; with "
                                                              "--report: the saved race's; with --frozen: the ones "
                                                              "its selection fixed)")
    rc.add_argument("--seeds", type=int_between(1, 100), default=3, help="seeds FIRST..FIRST+N-1 (each racer the "
                                                                        "same inits and batch orders)")
    rc.add_argument("--first-seed", type=int_between(0, 2**31 - 1), default=0,
                    help="the first seed (fresh seeds confirm what a race on others selected)")
    rc.add_argument("--epochs", type=int_between(1, 100_000), help="epoch budget and schedule length (default train.epochs)")
    rc.add_argument("--budget", action="append", metavar="NAME=EPOCHS,EPOCHS",
                    help="one optimizer's own epoch budgets, each raced as NAME@EPOCHS with its schedule over "
                         "them, e.g. thor=6,8 (repeatable; default --epochs)")
    rc.add_argument("--time-budget", type=positive_float, help="stop a run after this many training seconds")
    rc.add_argument("--full-budget", action="store_true", help="keep training after the last target is reached")
    rc.add_argument("--evals-per-epoch", type=int_between(1, 100), default=4,
                    help="evaluations (untimed) per epoch: time to a target is read to this fraction of an epoch")
    rc.add_argument("--trace", action="store_true", help="also record each layer's |dW|/|W|, |W|, the lr and THOR's "
                                                        "effective damping every epoch (race.json, race-trace.png)")
    rc.add_argument("--lr-find", action="store_true", help="centre each optimizer's lr grid (unless --lr gives "
                                                          "it) on its lr-find suggestion (torchboost lr-find)")
    rc.add_argument("--threads", type=int_between(1, 1024), default=1, help="torch threads (fixed for fair timing)")
    rc.add_argument("--output", "-o", help="folder for race.json and race.png (default runs/race-<recipe name>)")
    rc.add_argument("--holdout", type=int_between(1, 10**9), default=0, metavar="N",
                    help="select on N training samples held out as a validation split (stratified, not augmented; "
                         "the test split is not read), then confirm with --frozen")
    rc.add_argument("--frozen", metavar="RACE_JSON",
                    help="race each optimizer at the lr and budget a --holdout race chose (its race.json), on the test "
                         "split and fresh seeds (--first-seed past the selection's)")
    rc.add_argument("--ledger", metavar="FILE",
                    help="the test-split ledger: every (configuration, seed) a race evaluates on the test split, per "
                         "task; a seed already there, or a configuration outside the task's first confirmed selection, "
                         "is refused (default with --frozen: test-ledger.json beside the selection)")
    rc.add_argument("--report", nargs="+", metavar="RACE_JSON",
                    help="only report saved races, pooled (each must have raced the same racers; a repeated run "
                         "counts once); with --output also their pooled race.json and race.png")


def _bench_arguments(b: argparse.ArgumentParser) -> None:
    from .bench import add_arguments

    add_arguments(b)


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import cmd_bench

    return cmd_bench(args)


def _one_line(e: TorchboostError) -> str:
    """An error raised in a DataLoader worker comes back wrapped in torch's traceback text; its last line
    holds the original `Type: what — fix`."""
    lines = str(e).strip().splitlines()
    if len(lines) <= 1:
        return str(e)
    last = lines[-1]
    return last.split(": ", 1)[1] if last.startswith("torchboost.errors.") else last


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any("\0" in a for a in argv):  # a shell cannot pass one; an API caller can, and no path may hold it
        print("error: an argument holds a NUL character — remove it", file=sys.stderr)
        return 2
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, a usage error (already printed): a code, not an exception
        return int(e.code or 0)
    if args.command is None:  # `torchboost` alone = the main job
        args = parser.parse_args([*(["--debug"] if args.debug else []), "train"])
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        if args.command in APPLIED_THREADS and args.threads is not None:
            import torch

            torch.set_num_threads(args.threads)
        return func(args)
    except TorchboostError as e:
        if args.debug:
            traceback.print_exc()
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `torchboost ... | head`: the reader left; say nothing, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as e:  # a file system refusal nothing above turned into a one-line error yet
        where = f"{printable(e.filename)}: " if e.filename else ""  # a name from a file: no forged lines
        print(f"error: {where}{printable(e.strerror or e)} — check the path and its permissions", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # `train` says what it left itself (see _interrupted)
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
