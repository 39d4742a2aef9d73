"""`torchboost lr-find` and `race --lr-find`: the lr range test (train.lr_find) on a recipe's model, data and
optimizers, each optimizer built exactly as `train` and `race` build it and started from the same weights."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Iterable

from torch.utils.data import Dataset

from torchboost.data import build_loader
from torchboost.fileio import atomic_path, atomic_write, confine_writes
from torchboost.plotting import pyplot
from torchboost.recipe.build import build_loss, build_model, optimizer_from_config, with_optimizer
from torchboost.recipe.config import Config
from torchboost.recipe.data import input_norm
from torchboost.recipe.optimizers import race_policy
from torchboost.seed import seed_everything
from torchboost.train.device import resolve_device
from torchboost.train.lr_find import NEVER_FELL, LrFindResult, find_lr, lr_find_figure, lr_sweep
from torchboost.train.step import TrainStep

DEFAULT_RANGE = (1e-6, 1.0)
DEFAULT_UPDATES = 200


def lr_find(cfg: Config, train_ds: Dataset, names: Iterable[str], start: float = DEFAULT_RANGE[0],
            end: float = DEFAULT_RANGE[1], updates: int = DEFAULT_UPDATES) -> dict[str, LrFindResult]:
    """One sweep per optimizer name, each from the recipe's seed (same weights, same batch order)."""
    lrs = lr_sweep(start, end, updates)
    device = resolve_device(cfg.train.device)
    norm = input_norm(cfg.data)
    results = {}
    for name in names:
        run = with_optimizer(cfg, name)
        seed_everything(cfg.train.seed)
        loader = build_loader(train_ds, run.data.batch_size, True, seed=cfg.train.seed)
        model = build_model(run, loader).to(device)
        optimizer = optimizer_from_config(run, model, float(lrs[0]), len(loader))
        step = TrainStep(model, build_loss(run), optimizer, input_norm=norm, device=device)
        results[name] = find_lr(step, loader, lrs)
    return results


def centred_grid(grid: Iterable[float], suggestion: float) -> tuple[float, ...]:
    """`grid` moved on the log scale so that its geometric centre is `suggestion` (its ratios kept), each value
    rounded to 2 significant digits."""
    grid = tuple(grid)
    centre = math.exp(sum(math.log(g) for g in grid) / len(grid))
    return tuple(dict.fromkeys(float(f"{g * suggestion / centre:.2g}") for g in grid))


def lr_find_grids(cfg: Config, train_ds: Dataset, names: Iterable[str],
                  log: Callable[[str], None] = print) -> dict[str, tuple[float, ...]]:
    """`race --lr-find`: each optimizer's race lr grid centred on its lr-find suggestion (none: left out, so
    the race uses its default grid)."""
    grids = {}
    for name, result in lr_find(cfg, train_ds, names).items():
        if result.suggestion is None:
            log(f"lr-find: {name}: {NEVER_FELL}; racing its default grid")
            continue
        grids[name] = centred_grid(race_policy(name).lr_grid, result.suggestion)
        log(f"lr-find: {name} suggests lr {result.suggestion:.3g}; racing {','.join(f'{g:g}' for g in grids[name])}")
    return grids


def format_results(results: dict[str, LrFindResult]) -> str:
    rows = [f"{'optimizer':<14} {'suggested lr':>12} {'lowest loss at':>14} {'steepest fall':>13}  note"]
    for name, r in results.items():
        sug = f"{r.suggestion:.3g}" if r.suggestion is not None else "none"
        low = f"{r.min_loss_lr:.3g}" if r.min_loss_lr is not None else "-"
        steep = f"{r.steepest_lr:.3g}" if r.steepest_lr is not None else "-"
        note = r.stopped or f"ran all {len(r.lrs)} updates"
        if r.suggestion is None:
            note += f"; {NEVER_FELL}: widen the range (--start/--end) or check the data"
        rows.append(f"{name:<14} {sug:>12} {low:>14} {steep:>13}  {note}")
    return "\n".join(rows)


def write_results(results: dict[str, LrFindResult], meta: dict, out: Path) -> tuple[Path, Path]:
    """OUT/lr-find.json (every sweep, the settings) and OUT/lr-find.png, written inside OUT only."""
    with confine_writes(out):
        path = atomic_write(out / "lr-find.json", json.dumps(
            {"settings": meta, "results": {k: r.to_dict() for k, r in results.items()}}, indent=1))
        fig = lr_find_figure(results)
        png = out / "lr-find.png"
        with atomic_path(png) as tmp:
            fig.savefig(tmp, dpi=110, format="png")  # format: the temp name does not end in .png
        pyplot().close(fig)
    return path, png


def lr_find_from_recipe(recipe: str, overrides: Iterable[str] = (), data: str | None = None,
                        batch_size: int | None = None, optimizers: Iterable[str] | None = None,
                        start: float = DEFAULT_RANGE[0], end: float = DEFAULT_RANGE[1], updates: int = DEFAULT_UPDATES,
                        threads: int = 1, output: str | None = None,
                        log: Callable[[str], None] = print) -> dict[str, LrFindResult]:
    """`torchboost lr-find` from Python, with the command's result: the recipe read as `train` reads it (--data,
    the batch fitted to the data), each optimizer swept, the table to `log`, lr-find.json and lr-find.png written
    to `output` (default runs/lr-find-<recipe name>). Returns each optimizer's result."""
    import torch

    from torchboost.fileio import check_output_folder
    from torchboost.recipe.load import load_resolved, recipe_with_data
    from torchboost.recipe.resolve import fit_batch

    torch.set_num_threads(threads)
    batch = [] if batch_size is None else [f"data.batch_size={batch_size}"]
    built, applied, note = recipe_with_data(recipe, [*overrides, *batch], data)
    cfg, train_ds, _ = load_resolved(built=built)
    cfg, fitted = fit_batch(cfg, len(train_ds), 1)
    for line in (note, fitted and f"note: {fitted}"):
        if line:
            log(line)
    out = Path(output or f"runs/lr-find-{cfg.name}")
    check_output_folder(out)
    names = list(optimizers or [cfg.optim.name])
    log(f"lr range test on recipe {recipe}: lr {start:g} to {end:g} over {updates} updates "
        f"(batch {cfg.data.batch_size}), {', '.join(names)}")
    results = lr_find(cfg, train_ds, names, start, end, updates)
    log(format_results(results))
    meta = {"recipe": recipe, "overrides": applied, "start": start, "end": end, "updates": updates,
            "batch_size": cfg.data.batch_size, "threads": threads}
    json_path, png = write_results(results, meta, out)
    log(f"results: {json_path}; plot: {png}")
    return results
