"""The application layer: a recipe (YAML + --set overrides) -> validated config -> objects -> a run.

`config` holds the dataclasses, recipe files and the one validation pass; `build` turns a config into
objects; `run` trains/evaluates/predicts from a config; `diff` compares configs; `align` builds the
`torchboost align` comparison from recipes. Library packages never import this one.
"""

from torchboost.recipe.config import Config, list_recipes, load_config
from torchboost.recipe.run import RunResult, evaluate_checkpoint, predict_images, train_from_config

__all__ = ["Config", "load_config", "list_recipes", "train_from_config", "evaluate_checkpoint", "predict_images",
           "RunResult"]
