"""`torchboost diff-config A B`: two resolved configs side by side (hyperparameter alignment).

A and B may be shipped recipe names, YAML files (a recipe or a run's saved config.yaml), run folders
(holding config.yaml) or torchboost checkpoints (which store the resolved config). Both are resolved the
same way — defaults, then the file, then overrides — so a key left at its default in one file and set
explicitly in the other is not reported as a difference.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from torchboost.errors import CheckpointError, printable
from torchboost.recipe.config import build_config
from torchboost.recipe.files import find_recipe, read_yaml

ABSENT = "(absent)"


def _source(spec: str) -> dict:
    """The raw mapping a spec stands for: recipe YAML, run folder's config.yaml, or checkpoint's config."""
    path = Path(spec)
    if path.is_dir() and (path / "config.yaml").is_file():
        path = path / "config.yaml"
    from torchboost.migrate.formats import FORMATS, TORCH  # the weight-format registry, loaded when used

    if path.suffix in FORMATS[TORCH].suffixes:  # training checkpoints carry their config
        from torchboost.train.checkpoint import load_checkpoint

        ckpt = load_checkpoint(path)
        if not isinstance(ckpt.get("config"), dict):
            raise CheckpointError(f"{path} holds no saved config", "pass a checkpoint written by `torchboost "
                                  "train`, or the run's config.yaml")
        return ckpt["config"]
    return read_yaml(find_recipe(str(path) if path.suffix in (".yaml", ".yml") else spec))


def resolve_config(spec: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Defaults <- recipe name / YAML path / run folder / checkpoint <- overrides, as a dict. Keys and
    types are checked, but not run-time requirements such as a data path: this compares hyperparameters."""
    return build_config(_source(spec), overrides).to_dict()


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{"optim": {"lr": 0.1}} -> {"optim.lr": 0.1}; free-form dicts (optim.thor, boost.config) too."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@dataclass
class ConfigDiff:
    a_name: str
    b_name: str
    rows: list[tuple[str, Any, Any]]  # every key of either side, A's order first; ABSENT where missing

    @property
    def differences(self) -> list[tuple[str, Any, Any]]:
        return [r for r in self.rows if r[1] != r[2]]

    def table(self, all_keys: bool = False) -> str:
        rows = self.rows if all_keys else self.differences
        a_name, b_name = printable(self.a_name), printable(self.b_name)
        if not rows:
            return f"{a_name} and {b_name} resolve to the same config"
        # values as JSON (every control character an escape); keys printable: a saved config's free-form keys
        # (optim.weight_decay_groups' patterns) are data
        body = [(printable(k), _fmt(a), _fmt(b), "" if a == b else "*") for k, a, b in rows]
        w = [max(len(r[i]) for r in [("key", a_name, b_name, ""), *body]) for i in range(3)]
        lines = [f"{'key':<{w[0]}}  {a_name:<{w[1]}}  {b_name}"]
        lines += [f"{k:<{w[0]}}  {a:<{w[1]}}  {b:<{w[2]}}  {m}".rstrip() for k, a, b, m in body]
        return "\n".join(lines + [f"{len(self.differences)} of {len(self.rows)} keys differ"])

    def to_dict(self, all_keys: bool = False) -> dict[str, Any]:
        rows = self.rows if all_keys else self.differences
        return {"a": self.a_name, "b": self.b_name, "n_keys": len(self.rows),
                "n_differences": len(self.differences), "rows": [{"key": k, "a": a, "b": b} for k, a, b in rows]}


def _fmt(v: Any) -> str:
    return v if v is ABSENT else json.dumps(v)  # JSON scalars read like the YAML recipes (null, true, [..])


def diff_configs(a: str, b: str, overrides_a: Sequence[str] = (), overrides_b: Sequence[str] = ()) -> ConfigDiff:
    fa, fb = flatten(resolve_config(a, overrides_a)), flatten(resolve_config(b, overrides_b))
    keys = list(fa) + [k for k in fb if k not in fa]
    return ConfigDiff(a, b, [(k, fa.get(k, ABSENT), fb.get(k, ABSENT)) for k in keys])
