"""Recipe files: a shipped recipe by name (recipe/recipes/*.yaml) or a user's YAML file by path, read as a
mapping of config sections with one-line errors (`recipe.config` merges what they hold)."""

from __future__ import annotations

from pathlib import Path

from torchboost.errors import ConfigError, suggest
from torchboost.fileio import check_regular, read_regular
from torchboost.plaindata import MAX_BYTES, load_yaml

RECIPES_DIR = Path(__file__).parent / "recipes"


def find_recipe(name_or_path: str) -> Path:
    """A shipped recipe name (see `torchboost recipes`) or a path to a YAML file."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if path.exists():
            return check_regular(path, ConfigError)  # a FIFO or a folder: say which, never "not found"
        raise ConfigError(f"recipe file {path} not found", "check the path or run `torchboost recipes` for shipped ones")
    shipped = RECIPES_DIR / f"{name_or_path}.yaml"
    if not shipped.is_file():
        raise ConfigError(f"unknown recipe '{name_or_path}'", suggest(name_or_path, list_recipes()))
    return shipped


def list_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def read_yaml(path: Path) -> dict:
    """A YAML mapping from a file, with one-line errors for unreadable, non-UTF-8 or invalid files."""
    try:
        if path.stat().st_size > MAX_BYTES:  # before reading it whole
            raise ConfigError(f"{path} is {path.stat().st_size >> 10} kB", "a recipe is a few kB of YAML")
        data = load_yaml(read_regular(path, ConfigError).decode("utf-8"), str(path))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not UTF-8 text (byte {e.start})", "save the file as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}", "check the path and its permissions") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a {type(data).__name__}, not a mapping of config sections",
                          "a recipe maps section names (model, data, optim, ...) to their keys")
    return data
