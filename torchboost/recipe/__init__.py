"""The application layer: a recipe (YAML + --set overrides) -> validated config -> objects -> a run.

`config` holds the dataclasses and recipe files, `kinds` the data-set kinds, `validation` the one
validation pass, `load` reads recipes, `data` and `resolve` fill in what is inferred from the data,
`build` and `callbacks` turn a config into objects, `run` trains, `infer` evaluates and predicts,
`outputs` owns the output folder, `diff` compares configs and `align` builds `torchboost align`.
Library packages never import this one.
"""

from torchboost.recipe.config import Config
from torchboost.recipe.files import list_recipes
from torchboost.recipe.infer import evaluate_checkpoint, predict_images
from torchboost.recipe.load import load_config, load_resolved
from torchboost.recipe.run import RunResult, train_from_config
from torchboost.recipe.validation import validate

__all__ = ["Config", "load_config", "load_resolved", "validate", "list_recipes", "train_from_config",
           "evaluate_checkpoint", "predict_images", "RunResult"]
