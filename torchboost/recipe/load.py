"""A recipe name or YAML file plus `--set` overrides -> a validated Config (`load_config`), the same with
what `--data FOLDER` means (`recipe_with_data`, built once: the data set it replaces is the built config's),
and the resolved one with its data sets (`load_resolved`) for tools that build a network without training."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional, Sequence

from torch.utils.data import Dataset

from torchboost.data.folder import class_files, find_classes
from torchboost.errors import DataError
from torchboost.models import list_models
from torchboost.recipe.config import Config, build_config, merge, parse_override
from torchboost.recipe.files import find_recipe, read_yaml
from torchboost.recipe.data import load_data, model_for_data
from torchboost.recipe.kinds import FOLDER, get_kind
from torchboost.recipe.model_defaults import FULL_BATCH_IMAGES, folder_defaults
from torchboost.recipe.resolve import resolve_config
from torchboost.recipe.validation import validate, validated
from torchboost.train.checkpoint import torch_load


SET_KEYS = ("train_subset",)  # a recipe's keys about its own data set, dropped when --data replaces it by a folder


def load_config(recipe: Optional[str] = None, overrides: Sequence[str] = ()) -> Config:
    """Defaults <- recipe YAML <- overrides, then the one validation pass."""
    cfg = build_config(read_yaml(find_recipe(recipe)) if recipe is not None else None, overrides or ())
    validate(cfg)
    return cfg


def recipe_with_data(recipe: Optional[str], overrides: Sequence[str], data: Optional[str], choose_model: bool = False
                     ) -> tuple[Config, list[str], Optional[str]]:
    """(the config of `recipe` + `overrides` with what `--data FOLDER` means applied: data.path, and when the
    recipe's data set is built in and reads no path, or FOLDER is an image folder (FOLDER/train/) and the recipe's
    set is stored otherwise (IDX files), also data.dataset=folder, "this image folder instead", with the recipe's
    keys about its own set (`SET_KEYS`) dropped unless the overrides set them;
    the overrides including those, for applying to a run's saved config; the note saying so, or None).
    With `choose_model` (the user named no recipe) and no model.name override, the model is chosen from a
    sample of the images (`model_for_data`) and the note says which and why; with `choose_model`, the model's
    folder defaults (`model_defaults`: a batch from the count of the folder's training images, then the network's
    own) fill the keys the overrides leave unset, and the note names them. Keys and types are checked,
    values not yet (`validate`). The recipe is read and built once."""
    cfg = build_config(read_yaml(find_recipe(recipe)) if recipe is not None else None, overrides or ())
    overrides, note = list(overrides), None
    if not data:
        return cfg, overrides, None
    extra = [f"data.path={data}"]
    kind, given = get_kind(cfg.data.dataset), {o.partition("=")[0].strip() for o in overrides}
    # an image folder (DIR/train/<class>/) given to a recipe whose set is built in or stored otherwise (IDX files)
    replaced = not kind.needs_path or (not kind.folder and not kind.streamed and (Path(data) / "train").is_dir())
    if replaced:
        note = (f"note: --data {data}: training on that image folder (data.dataset={FOLDER}) instead of the "
                f"recipe's {'built-in ' if not kind.needs_path else ''}{cfg.data.dataset}")
        extra.insert(0, f"data.dataset={FOLDER}")
        dropped = [f"data.{k}" for k in SET_KEYS if getattr(cfg.data, k) is not None and f"data.{k}" not in given]
        extra += [f"{k}=null" for k in dropped]
        if dropped:
            note += f" (its {', '.join(f'{k}={getattr(cfg.data, k[5:])}' for k in dropped)} dropped: that set's)"
    for item in extra:
        merge(cfg, parse_override(item))
    if choose_model and "model.name" not in given:
        chosen = checkpoint_input(cfg.train.init_weights)
        if chosen is None:
            name, why = model_for_data(cfg.data)
            chosen = [f"model.name={name}"]
            said = f"model {name}, chosen from the data ({why})"
        else:
            name = chosen[0].partition("=")[2]
            said = (f"model {name}, the network of train.init_weights {cfg.train.init_weights} "
                    f"({', '.join(chosen[1:])}: its input)")
        for item in chosen:
            merge(cfg, parse_override(item))
        extra += chosen
        note = (note + "; " if note else f"note: --data {data}: ") + f"{said}; choose another with --set model.name=NAME"
    images = training_images(cfg, FULL_BATCH_IMAGES) if choose_model else None
    defaults = folder_defaults(cfg.model.name, overrides, images) if choose_model else []
    for item in defaults:  # the network's own settings where the default recipe's do not suit it
        merge(cfg, parse_override(item))
    if defaults:
        batch = f"data.batch_size={cfg.data.batch_size}"  # the folder's batch, when it is one of them: why
        why = (f"; {batch}: {images // cfg.data.batch_size} updates an epoch of {images} training images"
               if batch in defaults and images is not None else "")
        note = (note + "; " if note else f"note: --data {data}: ") + \
            f"{cfg.model.name}'s settings for a folder: {', '.join(defaults)} (each can be set{why})"
    if replaced and choose_model and "name" not in given:
        name = run_name(cfg.model.name, data)  # not the recipe's job any more: runs/NAME, the MLflow experiment
        merge(cfg, parse_override(f"name={name}"))
        extra.append(f"name={name}")
        note += f"; the run is named {name} (its folder runs/{name} unless -o, its MLflow experiment)"
    return cfg, overrides + extra + defaults, note


def training_images(cfg: Config, enough: int) -> Optional[int]:
    """The images of an image folder's train/ split, counted class by class up to `enough` (past it a folder's
    batch is the default recipe's: a big folder is not listed twice); None for other kinds or without train/."""
    root = Path(cfg.data.path or "") / "train"
    if not get_kind(cfg.data.dataset).folder or not root.is_dir():
        return None
    count = 0
    try:
        for name in find_classes(root):
            count += len(class_files(root / name))
            if count >= enough:
                break
    except DataError:  # no class folders, an empty one: the data set's own reader says so, in the run's words
        return None
    return count


def checkpoint_input(path: Optional[str]) -> Optional[list[str]]:
    """[model.name=, data.channels= (and the MNIST CNN's data.image_size=, which sizes its classifier)] of the
    network a torchboost training checkpoint at `path` holds; None for any other file (or none): the data
    then chooses the model."""
    if not path or not Path(path).is_file():
        return None
    try:
        saved = torch_load(path, mmap=True).get("config") or {}
        model, data = saved["model"], saved["data"]
    except Exception:  # plain weights, another format, a damaged file: init_weights' own reader says which
        return None
    name, channels, size = model.get("name"), data.get("channels"), data.get("image_size")
    if name not in list_models() or type(channels) is not int or (name == "mnist_cnn" and type(size) is not int):
        return None
    return [f"model.name={name}", f"data.channels={channels}"] + ([f"data.image_size={size}"] if name == "mnist_cnn"
                                                                   else [])


def run_name(model: str, data: str) -> str:
    """MODEL-FOLDER for a run on the folder `data`: letters, digits, '.', '_' and '-' of the folder's name."""
    folder = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(os.path.abspath(data)).name).strip("-.")[:60]
    return f"{model}-{folder}" if folder else model


def load_resolved(recipe: Optional[str] = None, overrides: Sequence[str] = (), built: Optional[Config] = None,
                  holdout: int = 0, exact_split: Optional[str] = None, leave_out: int = 0
                  ) -> tuple[Config, Dataset, Dataset]:
    """(resolved config, training set, evaluation set): what a run would build, without boost. `built`: the
    recipe + overrides already built (`recipe_with_data`), validated here instead of read again. `holdout` > 0:
    the evaluation set is that many samples held out of the training split (outside `data.train_subset`);
    `leave_out`: training without the samples such a holdout holds; `exact_split`: the split of that name,
    refused when missing (`recipe.data.load_data`)."""
    cfg = load_config(recipe, overrides) if built is None else validated(built)
    data, train_ds, eval_ds = load_data(cfg, holdout=holdout, exact_split=exact_split, leave_out=leave_out)
    return resolve_config(cfg, data, train_ds, None), train_ds, eval_ds
