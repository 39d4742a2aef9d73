"""The race's flows — select on a held-out split, confirm on the test split, report saved races — as functions
callable from Python with the command line's result (`torchboost race` maps its arguments to a RaceRequest and
calls `race`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from torchboost.errors import ConfigError, printable, suggest
from torchboost.fileio import check_output_folder, confine_writes
from torchboost.optim.registry import OPTIMIZERS
from torchboost.recipe.data import split_source
from torchboost.recipe.load import load_resolved, recipe_with_data
from torchboost.recipe.optimizers import default_racers
from torchboost.race.lanes import (Lane, budget_racers, parse_budgets, parse_lr_grids, race_setup, run_race,
                                    variant_racer)
from torchboost.race.ledger import check_ledger, default_ledger, read_ledger, record
from torchboost.race.plot import write_results
from torchboost.race.report import format_report, headline, is_thor, summarize
from torchboost.race.choice import few_seeds
from torchboost.race.select import (check_fresh_seeds, check_same_task, close_selection, confirmation_targets,
                                    finalists, fixed_targets, fixed_targets_line, frozen_racers, lanes_of,
                                    pooled_lanes, pooled_settings, raced_targets, read_race, selections)
from torchboost.race.trace import trace_figure_path
from torchboost.race.names import parse_racer
from torchboost.train.device import device_name

DEFAULT_RACE_TARGETS = (0.975, 0.98)


@dataclass
class RaceRequest:
    """What `torchboost race` is asked (its arguments, by the same names and defaults)."""

    config: str = "mnist-lenet-thor"
    set: list[str] = field(default_factory=list)
    data: Optional[str] = None
    batch_size: Optional[int] = None
    optimizers: Optional[list[str]] = None
    lr: list[str] = field(default_factory=list)
    targets: Optional[list[float]] = None
    seeds: int = 3
    first_seed: int = 0
    epochs: Optional[int] = None
    budget: list[str] = field(default_factory=list)
    time_budget: Optional[float] = None
    full_budget: bool = False
    evals_per_epoch: int = 4
    trace: bool = False
    lr_find: bool = False
    threads: int = 1
    output: Optional[str] = None
    holdout: int = 0
    frozen: Optional[str] = None
    finalists: Optional[int] = None
    ledger: Optional[str] = None
    report: Optional[list[str]] = None

    @classmethod
    def of(cls, namespace: object) -> "RaceRequest":
        """The request an argparse namespace holds (None for a list argument not given: its empty list)."""
        values = {f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if v is not None or k not in ("set", "lr", "budget")})


def race(request: RaceRequest, log: Callable[[str], None] = print) -> dict:
    """`torchboost race` from Python, with the command's result: what it prints goes to `log`, what it writes to
    `request.output`; returns the race's summary (`race.report.summarize`, with the split it was evaluated on).
    A --holdout race selects (`race.select`: ranked at the lower target, the one-image check); --frozen confirms on
    the test split, recorded in the ledger first, every run its whole budget on the selection's training images,
    at targets the rule sets from its own runs; --report pools saved races (`race_report` below)."""
    if request.report:
        return race_report(request, log)
    torch.set_num_threads(request.threads)  # fixed and reported: timings depend on it
    if request.frozen and (request.optimizers or request.lr or request.budget or request.lr_find or request.holdout):
        raise ConfigError("--frozen races the optimizers, lrs and budgets its selection chose, on the test split",
                          "drop --optimizers, --lr, --budget, --lr-find and --holdout (or select again)")
    if request.finalists and not request.frozen:
        raise ConfigError("--finalists picks among a selection's winners", "give --frozen SELECTION/race.json too")
    if request.ledger and request.holdout:
        raise ConfigError("--ledger records races on the test split; --holdout never reads it",
                          "drop --ledger when selecting")
    optimizers = request.optimizers or default_racers()
    for name in optimizers:  # before any data is read (a variant's options are checked once the config is)
        base = parse_racer(name).base
        if base not in OPTIMIZERS:
            raise ConfigError(f"unknown optimizer {base!r} in --optimizers {name}", suggest(base, list(OPTIMIZERS)))
    grids, budgets = parse_lr_grids(request.lr or []), parse_budgets(request.budget or [])
    for flag, named in (("--lr", grids), ("--budget", budgets)):
        unused = [name for name in named if name not in optimizers]
        if unused:
            raise ConfigError(f"{flag} names {unused[0]}, which is not among --optimizers "
                              f"{' '.join(optimizers)}", suggest(unused[0], optimizers))
    batch = [] if request.batch_size is None else [f"data.batch_size={request.batch_size}"]
    built, overrides, note = recipe_with_data(request.config, [*(request.set or []), *batch], request.data)  # as `train` reads --data
    if note:
        log(note)
    targets = tuple(request.targets or DEFAULT_RACE_TARGETS)
    seeds = range(request.first_seed, request.first_seed + request.seeds)
    chosen, leave_out, selected_on = None, 0, None
    ledger = Path(request.ledger) if request.ledger else default_ledger(request.frozen) if request.frozen else None
    if request.frozen:  # before any data is read: a wrong selection file is a one-line error at once
        selection = read_race(Path(request.frozen))
        check_same_task(selection, request.frozen, request.config, overrides)
        targets = confirmation_targets(selection, request.frozen, request.targets)
        check_fresh_seeds(selection, request.frozen, seeds)
        chosen = selections(selection, request.frozen)
        for line in few_seeds(lanes_of(selection, request.frozen)):
            log(f"{line} (in the selection {request.frozen})")
        leave_out = selection["settings"]["holdout"]  # trained on what the selection trained on
        selected_on = selection["settings"].get("training_images")
        if request.finalists:
            kept = finalists(chosen, request.finalists)
            log(f"finalists (the selection's best THOR-family racer and best others, on its held-out split): "
                f"{', '.join(s.racer for s in kept)}; not confirmed: "
                f"{', '.join(s.racer for s in chosen if s not in kept) or 'none'}")
            chosen = kept
    if ledger is not None:  # checked again, and written, when the test split is about to be read
        check_ledger(read_ledger(ledger), ledger, request.config, overrides,
                     [(s.racer, s.lr) for s in chosen or ()], seeds)
    # a confirmation, and any race the ledger records, reads the test split itself (refused when missing), never a
    # folder's val/
    cfg, train_ds, eval_ds = load_resolved(built=built, holdout=request.holdout, leave_out=leave_out,
                                           exact_split="test" if ledger else None)  # the recipe read once
    if selected_on is not None and selected_on != len(train_ds):
        raise ConfigError(f"{request.frozen} selected training on {selected_on:g} images, this confirmation "
                          f"would train on {len(train_ds)}", "confirm with the selection's data and version (or select again)")
    evaluated = (f"{request.holdout} training samples held out of {split_source(cfg.data, 'train')}" if request.holdout
                 else split_source(cfg.data, "test", exact=ledger is not None))
    selected = sorted({s.epochs for s in chosen or () if s.epochs})  # a frozen racer trains its selected budget
    epochs = (f"{' or '.join(map(str, selected))} (each racer its selected budget)" if chosen and selected
              and all(s.epochs for s in chosen) else request.epochs or cfg.train.epochs)
    cfg, lines = race_setup(request.config, cfg, len(train_ds), epochs)
    lines.append(f"evaluated on {evaluated}: {len(eval_ds)} images; training on {len(train_ds)}"
                 + (" (the selection's: its held-out images left out)" if leave_out else ""))
    if request.holdout:
        lines.append(f"selecting on {request.holdout} training samples held out (the test split is not read); confirm "
                     "with --frozen OUTPUT/race.json on fresh seeds")
    log("\n".join(lines))  # what is raced, before the first of many runs
    if chosen is not None:
        racers = frozen_racers(chosen, cfg)
        log("frozen: " + ", ".join(f"{r.name} lr {r.lrs[0]:g}" for r in racers))
    else:
        if request.lr_find:  # centre the grids the user did not give on each optimizer's lr-find suggestion
            from torchboost.recipe.lr_find import lr_find_grids

            sweep = [n for n in optimizers if n not in grids]
            if any("[" in n for n in sweep):
                raise ConfigError("--lr-find sweeps registered optimizers, not variants",
                                  f"give {next(n for n in sweep if '[' in n)} its grid with --lr")
            grids.update(lr_find_grids(cfg, train_ds, sweep))
        racers = [r for name in optimizers
                  for r in budget_racers(variant_racer(name, cfg, grids.get(name)), budgets.get(name))]
    meta = {"recipe": request.config, "overrides": overrides, "targets": targets, "seeds": request.seeds,
            "first_seed": request.first_seed, "evals_per_epoch": request.evals_per_epoch,
            "epochs": request.epochs or cfg.train.epochs, "time_budget_s": request.time_budget,
            "batch_size": cfg.data.batch_size, "updates_per_epoch": len(train_ds) // cfg.data.batch_size,
            "holdout": request.holdout, "frozen": request.frozen, "finalists": request.finalists,
            "full_budget": request.full_budget or chosen is not None, "training_images": len(train_ds),
            "threads": request.threads,
            "evaluated_on": evaluated, "evaluation_images": len(eval_ds), "ledger": str(ledger) if ledger else None}
    out = Path(request.output or f"runs/race-{cfg.name}")
    check_output_folder(out)  # before the first epoch, not at the first save
    if ledger is not None:  # every (configuration, seed) about to be evaluated on the test split, before it is
        record(ledger, request.config, overrides, [(r.name, lr) for r in racers for lr in r.lrs], seeds,
               str(out / "race.json"), [(s.racer, s.lr) for s in chosen] if chosen is not None else None)
        log(f"test-split ledger: {ledger}")

    def save(lanes: list) -> tuple[Path, Path]:
        return write_results(lanes, {**summarize(lanes, meta["targets"]), "evaluated_on": evaluated}, meta, out)

    # a confirmation trains every run its whole budget: its targets are set by its own runs when they end
    lanes = run_race(cfg, train_ds, eval_ds, racers, seeds, targets, epochs=request.epochs,
                     time_budget_s=request.time_budget, stop_at_targets=not meta["full_budget"], on_round=save,
                     trace=request.trace, evals_per_epoch=request.evals_per_epoch)
    if chosen is not None:  # the rule on the test split: the best rival's median seed reaches both targets
        meta["fixed_targets"] = fixed_targets(summarize(lanes, targets))
        targets = meta["targets"] = tuple(meta["fixed_targets"]["targets"])
        log(fixed_targets_line(meta["fixed_targets"], "the test split"))
    summary = {**summarize(lanes, targets), "evaluated_on": evaluated}  # every figure names its split
    log(format_report(summary, request.threads, device_name(lanes[0].device)))
    for racer in racers:
        if is_thor(racer.name) and len(racers) > 1:
            log(headline(summary, racer.name))
    if request.holdout:  # the selection ends: its targets, choices and their one-image check, in its race.json
        meta["fixed_targets"], meta["one_image_check"], lines = close_selection(lanes, targets, len(eval_ds))
        log("\n".join(lines))
    json_path, png = save(lanes)
    log(f"results: {json_path}; plot: {png}")
    if request.trace:
        with confine_writes(out):
            log(f"trace: {trace_figure_path(lanes, summary, out / 'race-trace.png')}")
    return summary


def raced_line(settings: dict, lanes: Sequence[Lane], files: Sequence[str]) -> str:
    """What the saved races raced, from the first file's settings (names from files escaped): recipe and its
    overrides, batch, updates an epoch, epochs and the seeds pooled."""
    def said(key: str) -> str:
        value = settings.get(key)
        return "unrecorded" if value is None else printable(str(value))[:160]

    seeds = sorted({l.seed for l in lanes})
    return (f"raced recipe {said('recipe')} (overrides {said('overrides')}): batch {said('batch_size')}, "
            f"{said('updates_per_epoch')} updates/epoch, {said('epochs')} epochs, seeds "
            f"{', '.join(map(str, seeds)) or 'none'} ({len(files)} file(s))")


def race_report(request: RaceRequest, log: Callable[[str], None] = print) -> dict:
    """`race --report FILE...`: the table of saved races, pooled (`race.select.pooled_lanes`), without training;
    with `request.output` also the pooled race.json and race.png. Returns the pooled summary."""
    lanes = pooled_lanes([Path(p) for p in request.report])
    files = [read_race(Path(p))["settings"] for p in request.report]
    threads = {f.get("threads") for f in files}  # the runs' threads, not this process's
    settings = {**files[0], "threads": next(iter(threads)) if len(threads) == 1 else None}
    if settings.get("holdout"):  # pooled selections: targets, choices and the one-image check from every pooled run
        fixed, check, lines = close_selection(lanes, raced_targets(settings, request.report[0]),
                                              settings.get("evaluation_images"))
        settings = {**settings, "fixed_targets": fixed, "one_image_check": check}
        log("\n".join(lines))
    elif settings.get("frozen") and isinstance(settings.get("fixed_targets"), dict):  # pooled confirmations (of
        # this rule: an older one raced its selection's targets and stopped there): the rule on every pooled run
        fixed = fixed_targets(summarize(lanes, raced_targets(settings, request.report[0])))
        settings = {**settings, "fixed_targets": fixed, "targets": fixed["targets"]}
        log(fixed_targets_line(fixed, "the test split"))
    targets = tuple(request.targets or settings.get("targets") or DEFAULT_RACE_TARGETS)
    on = settings.get("evaluated_on")  # a race.json before this key: its split unknown, and said so
    summary = {**summarize(lanes, targets), "evaluated_on": on if isinstance(on, str) else "an unrecorded split"}
    log(raced_line(settings, lanes, request.report))
    shown = settings["threads"] if settings["threads"] is not None else "mixed" if len(threads) > 1 else "unrecorded"
    log(format_report(summary, shown, str(settings.get("device", "cpu"))))
    names = list(dict.fromkeys(l.racer for l in lanes))
    for name in names:
        if is_thor(name) and len(names) > 1:
            log(headline(summary, name))
    if request.output:
        out = Path(request.output)
        check_output_folder(out)
        json_path, png = write_results(lanes, summary, pooled_settings(settings, lanes, request.report), out)
        log(f"results: {json_path}; plot: {png}")
    return summary
