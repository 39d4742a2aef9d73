"""The bad-value sweep: for every config key, invalid values generated from the config schema (not a hand
list) go through `torchboost train --set` and must give exit code 2 and one line on stderr, before
anything is built. The same pass catches them in configs built in Python."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import yaml

from torchboost import cli
from torchboost.errors import ConfigError
from torchboost.recipe import config as config_mod
from torchboost.recipe.config import Config
from torchboost.options import leaf_fields
from torchboost.recipe.validation import validate

# Free-form sections: one bad entry each, of the kind their owner validates.
DICT_CASES = {"optim.weight_decay_groups": {"layer4.*": "lots"}, "boost.config": {"grad_freez": {}}}
# Free-text keys whose rule is checked by what uses them.
TEXT_CASES = {"train.device": "foo", "train.init_weights": "/nonexistent/weights.pt", "output": ["a", "b"],
              "name": ["a"], "data.path": ["a"], "checkpoint.prefix": ["a"]}


def _base_type(tp):
    """Optional[X] -> X."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if type(None) in typing.get_args(tp) else tp


def bad_values(key: str, f: dataclasses.Field, tp) -> list:
    """Invalid values for one key: a wrong type (no scalar or list key takes a mapping), a value outside
    its choices, one past each bound, NaN for floats; list keys get each bad item in a list."""
    if key in DICT_CASES:
        return [DICT_CASES[key], "not-a-mapping"]
    if key in TEXT_CASES:
        return [TEXT_CASES[key]]
    base = _base_type(tp)
    is_list = typing.get_origin(base) is list
    item = typing.get_args(base)[0] if is_list else base
    bad_items: list = []
    if f.metadata.get("choices"):
        bad_items.append(99 if item is int else "bogus")
    for rule, step in (("ge", -1), ("gt", 0), ("le", 1), ("lt", 0)):
        bound = f.metadata.get(rule)
        if bound is not None:
            # one step past the bound (relative for large floats, where bound + 0.5 == bound)
            bad_items.append(int(bound + step) if item is int else float(bound + step * max(0.5, abs(bound))))
    if item is float:
        bad_items.append(float("nan"))
    return [{"a": 1}, *([v] if is_list else v for v in bad_items)]


SWEEP = [(key, v) for key, f, tp, _ in leaf_fields(Config()) for v in bad_values(key, f, tp)]


def as_override(key: str, value) -> str:
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    return f"{key}={text.removesuffix('...').strip()}"


def test_sweep_covers_every_key():
    keys = {k for k, _ in SWEEP}
    assert keys == {k for k, *_ in leaf_fields(Config())} and len(keys) > 70


@pytest.mark.parametrize("key,value", SWEEP, ids=[f"{k}={v!r}" for k, v in SWEEP])
def test_bad_value_is_one_line_exit_2(key, value, monkeypatch, capsys, tmp_path):
    import torchboost.recipe.run as run

    def never(*a, **k):
        raise AssertionError(f"{key}={value!r} reached training")

    monkeypatch.setattr(run, "train_from_config", never)
    rc = cli.main(["train", "--set", as_override(key, value), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), (rc, err)
    assert "Traceback" not in err[0]
    assert key.split(".")[-1].split("[")[0] in err[0] or key in DICT_CASES, err[0]  # names the key


def test_python_built_configs_get_the_same_pass():
    cfg = Config()
    cfg.optim.lr = -0.1
    with pytest.raises(ConfigError, match=r"optim.lr must be > 0, got -0.1"):
        validate(cfg)
    cfg = Config()
    cfg.train.ema.warmup = "tim"
    with pytest.raises(ConfigError, match=r"train.ema.warmup='tim' is not one of .*did you mean 'timm'"):
        validate(cfg)
    cfg = Config()
    cfg.optim.name, cfg.optim.options["thor"] = "thor", {"frequency": 0}
    with pytest.raises(ConfigError, match="optim.thor"):
        validate(cfg)


def test_validation_does_not_change_the_config():
    cfg = config_mod.build_config({"optim": {"lr": 1}})
    before = cfg.to_dict()
    validate(cfg)
    assert cfg.to_dict() == before
