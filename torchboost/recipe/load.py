"""A recipe name or YAML file plus `--set` overrides -> a validated Config (`load_config`), and the
resolved one with its data sets (`load_resolved`) for tools that build a network without training."""

from __future__ import annotations

from typing import Optional, Sequence

from torch.utils.data import Dataset

from torchboost.recipe.config import Config, build_config, read_yaml, resolve_recipe
from torchboost.recipe.data import load_data
from torchboost.recipe.resolve import resolve
from torchboost.recipe.validate import validate


def load_config(recipe: Optional[str] = None, overrides: Sequence[str] = ()) -> Config:
    """Defaults <- recipe YAML <- overrides, then the one validation pass."""
    cfg = build_config(read_yaml(resolve_recipe(recipe)) if recipe is not None else None, overrides or ())
    validate(cfg)
    return cfg


def load_resolved(recipe: Optional[str] = None, overrides: Sequence[str] = ()) -> tuple[Config, Dataset, Dataset]:
    """(resolved config, training set, evaluation set): what a run would build, without boost."""
    cfg = load_config(recipe, overrides)
    data, train_ds, eval_ds = load_data(cfg)
    return resolve(cfg, data, train_ds, None), train_ds, eval_ds
