"""Every registered extension point works, and none is named outside its registry.

Run over the registries themselves (as timm's optimizer tests run over `list_optimizers()`): each optimizer
builds, steps, round-trips its state_dict (the reloaded copy continues bit-identically) and refuses a bad
option with one line; each weight format round-trips a model bit-exactly; each data-set kind loads a split.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn

from torchboost.cli import main
from torchboost.data import build_loader
from torchboost.data.builtin import BUILTIN_SETS
from torchboost.migrate.formats import FORMATS, REFUSED, read_weights, write_weights
from torchboost.optim.groups import param_groups
from torchboost.optim.registry import OPTIMIZERS, OptimizerArgs, OptimizerEntry, build_optimizer, register, unregister
from torchboost.options import option
from torchboost.recipe.build import optimizer_from_config
from torchboost.recipe.config import build_config, dump_config
from torchboost.recipe.data import build_dataset
from torchboost.recipe.kinds import DATA_KINDS
from torchboost.recipe.load import load_config
from torchboost.recipe.optimizers import DEFAULT_LR_GRID, RACE_POLICY, race_policy
from torchboost.race.lanes import builtin_racer
from torchboost.recipe.reference import select
from torchboost.recipe.validation import validate

ROOT = Path(__file__).resolve().parents[1]


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 3))


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 1, 6, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


def train(net: nn.Module, opt: torch.optim.Optimizer, data: list) -> None:
    for x, y in data:
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_builds_steps_and_round_trips_its_state(name):
    args = OptimizerArgs(lr=0.01, weight_decay=1e-4, options=None)
    if OPTIMIZERS[name].options is not None:  # refresh curvature every 2 updates so the reload crosses one
        args = dataclasses.replace(args, options=OPTIMIZERS[name].options(frequency=2))
    data = batches(5)
    net = small_net()
    before = [p.detach().clone() for p in net.parameters()]
    opt = build_optimizer(name, net, args)
    train(net, opt, data[:3])
    assert any(not torch.equal(a, p) for a, p in zip(before, net.parameters())), "the optimizer never moved"

    twin = copy.deepcopy(net)
    twin_opt = build_optimizer(name, twin, args)
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    train(net, opt, data[3:])
    train(twin, twin_opt, data[3:])
    for a, b in zip(net.parameters(), twin.parameters()):
        assert torch.equal(a, b), f"{name}: a reloaded state_dict does not continue identically"


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_refuses_a_bad_option_with_one_line(name, capsys):
    bad = "optim.thor.frequency=0"  # a bad value for THOR-family entries; a section the others do not use
    assert main(["train", "--set", f"optim.name={name}", "--set", "optim.momentum=null", "--set", bad]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "optim.thor" in err


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_race_and_train_build_the_same_optimizer(name):
    """A race lane's optimizer is the registry's, exactly as `torchboost train` builds it."""
    cfg = build_config({"optim": {"name": name}})
    validate(cfg)
    net = small_net()
    trained = optimizer_from_config(cfg, net, 0.03, 7)
    raced = builtin_racer(name, cfg).build(small_net(), 0.03, 7, cfg.train.epochs)
    assert type(trained) is type(raced)
    assert [{k: v for k, v in g.items() if k != "params"} for g in trained.param_groups] == \
        [{k: v for k, v in g.items() if k != "params"} for g in raced.param_groups]
    assert builtin_racer(name, cfg).lrs == race_policy(name).lr_grid and len(race_policy(name).lr_grid) >= 3


def test_thor_option_that_is_not_a_thor_option_is_one_line_before_anything_is_built(capsys):
    """Regression: optim.thor={momentum: 0.8} passed validation, then raised TypeError in the builder."""
    assert main(["train", "--set", "optim.name=thor", "--set", "optim.thor={momentum: 0.8}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "optim.thor.momentum" in err and "Traceback" not in err


def test_nesterov_applies_to_thor_in_train_and_race():
    """Regression: optim.nesterov=true was recorded for THOR, ignored by train and honoured by race."""
    cfg = build_config({"optim": {"name": "thor", "nesterov": True}})
    validate(cfg)
    trained = optimizer_from_config(cfg, small_net(), 0.03, 7)
    raced = builtin_racer("thor", cfg).build(small_net(), 0.03, 7, 1)
    assert all(g["nesterov"] for g in trained.param_groups) and all(g["nesterov"] for g in raced.param_groups)


@pytest.mark.parametrize("key,value", [("momentum", "0.9"), ("nesterov", "true")])
def test_an_option_adamw_cannot_honour_is_refused(key, value, capsys):
    """Regression: optim.momentum with AdamW was recorded in config.yaml and ignored."""
    unset = [] if key == "momentum" else ["--set", "optim.momentum=null"]  # the default recipe sets momentum
    assert main(["train", "--set", "optim.name=adamw", *unset, "--set", f"optim.{key}={value}"]) == 2
    assert f"optim.{key}" in capsys.readouterr().err


def test_race_policy_names_registered_optimizers_with_grids_of_three():
    assert set(RACE_POLICY) <= set(OPTIMIZERS)
    assert all(len(race_policy(name).lr_grid) >= 3 for name in OPTIMIZERS)


@dataclasses.dataclass
class ThrowawayOptions:
    beta: float = option(0.5, gt=0, lt=1, help="the momentum it steps with")
    style: str = option("plain", choices=("plain", "fancy"), help="a choice")


def _throwaway(model: nn.Module, a: OptimizerArgs) -> torch.optim.Optimizer:
    return torch.optim.SGD(param_groups(model, a.weight_decay), lr=a.lr, momentum=a.options.beta)


@pytest.fixture
def throwaway():
    """An optimizer with an options dataclass, registered at test time: one registry line, no recipe/ edit."""
    register(OptimizerEntry("throwaway", "a test optimizer with options", _throwaway, options=ThrowawayOptions))
    yield
    unregister("throwaway")


@pytest.mark.parametrize("bad,says", [("optim.throwaway.beta=2", "optim.throwaway.beta must be > 0 and < 1, got 2"),
                                      ("optim.throwaway.style=odd", "optim.throwaway.style='odd' is not one of"),
                                      ("optim.throwaway.betta=0.2", "unknown config key 'optim.throwaway.betta'")])
def test_a_new_optimizer_with_options_needs_no_recipe_config_edit(throwaway, bad, says, capsys):
    base = ["train", "--print-config", "--set", "optim.name=throwaway", "--set", "optim.momentum=null"]
    assert main([*base, "--set", bad]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert main([*base, "--set", "optim.throwaway.beta=0.8"]) == 0
    assert "throwaway:\n    beta: 0.8\n    style: plain" in capsys.readouterr().out  # defaults shown
    cfg = load_config(None, ["optim.name=throwaway", "optim.throwaway={beta: 0.8}"])
    opt = optimizer_from_config(cfg, small_net(), 0.1)
    assert type(opt) is torch.optim.SGD and opt.param_groups[0]["momentum"] == 0.8
    assert builtin_racer("throwaway", cfg).lrs == DEFAULT_LR_GRID  # races with the default grid
    assert [r.key for r in select(["optim.throwaway"])] == ["optim.throwaway.beta", "optim.throwaway.style"]
    assert "\n  throwaway:\n    beta: 0.5\n" in dump_config(load_config(None, []))  # every section, at its defaults
    with pytest.raises(Exception, match="optim.throwaway is set but optim.name=sgd does not use it"):
        load_config(None, ["optim.throwaway.beta=0.9"])


def test_print_config_shows_thor_defaults(capsys):
    assert main(["train", "--config", "mnist-lenet-thor", "--print-config"]) == 0
    out = capsys.readouterr().out
    for key in ("frequency: 10", "factor_samples: null", "graft: none", "damping_decay: null"):
        assert key in out


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_weight_format_round_trips_a_model_bit_exactly(fmt, tmp_path):
    state = {k: v.contiguous() for k, v in small_net().state_dict().items()
             if v.dtype in FORMATS[fmt].dtypes}
    path = tmp_path / f"w{FORMATS[fmt].suffixes[0]}"
    write_weights(path, state)
    back = read_weights(path)
    assert set(back) == set(state)
    for k in state:
        assert back[k].dtype == state[k].dtype and torch.equal(back[k], state[k]), k


def test_weight_format_refuses_what_it_cannot_hold(tmp_path):
    for fmt in FORMATS.values():
        missing = next((d for d in (torch.complex128, torch.bfloat16, torch.float8_e4m3fn) if d not in fmt.dtypes), None)
        if missing is None:
            continue
        with pytest.raises(Exception) as e:
            write_weights(tmp_path / f"x{fmt.suffixes[0]}", {"w": torch.zeros(2, dtype=missing)})
        assert "cannot hold" in str(e.value) and not (tmp_path / f"x{fmt.suffixes[0]}").exists()


def test_refused_suffixes_are_one_line_everywhere(tmp_path, capsys):
    for suffix in REFUSED:
        f = tmp_path / f"opt{suffix}"
        f.write_bytes(b"\x80\x04}.")
        for argv in (["convert", str(f), str(tmp_path / "o.pt")], ["eval", "--checkpoint", str(f), "--config", "digits-lenet"]):
            assert main(argv) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and suffix in err


@pytest.mark.parametrize("kind", list(DATA_KINDS))
def test_data_kind_loads_a_sample(kind, tmp_path):
    entry = DATA_KINDS[kind]
    data = {"dataset": kind}
    if entry.needs_path:
        data["path"] = str(_tiny_source(kind, tmp_path))
    if kind == "synthetic":
        data.update(synthetic_size=20, image_size=16)
    cfg = build_config({"data": data})
    validate(cfg)
    ds = build_dataset(cfg.data, "train", num_classes=3)
    x, y = next(iter(build_loader(ds, 4, train=False)))
    assert x.shape[0] == 4 and y.shape == (4,) and int(y.max()) < (len(ds.classes) if entry.own_labels else 3)


def _tiny_source(kind: str, root: Path) -> Path:
    """A few real digits written in the kind's own file format."""
    import gzip
    import json

    import numpy as np
    from PIL import Image

    from torchboost.data.builtin import load_builtin

    ds = load_builtin(next(iter(BUILTIN_SETS)), "test")
    images, labels = ds.images[:20, 0].numpy(), ds.labels[:20].numpy()
    if kind in ("mnist_idx", "fashion_mnist"):  # one format, MNIST's IDX files
        for split, prefix in (("train", "train"), ("test", "t10k")):
            (root / f"{prefix}-images-idx3-ubyte").write_bytes(
                bytes([0, 0, 8, 3]) + np.array(images.shape, ">i4").tobytes() + images.tobytes())
            (root / f"{prefix}-labels-idx1-ubyte").write_bytes(
                bytes([0, 0, 8, 1]) + np.array([len(labels)], ">i4").tobytes() + labels.astype(np.uint8).tobytes())
        return root
    if kind == "paddle_json":
        part = [(images.reshape(len(images), -1) / 255).tolist(), labels.tolist()]
        path = root / "mnist.json.gz"
        with gzip.open(path, "wt") as f:
            json.dump([part, part, part], f)
        return path
    for split in ("train", "val"):
        for i, (img, label) in enumerate(zip(images, labels)):
            folder = root / split / str(label)
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img).save(folder / f"{i}.png")
    if DATA_KINDS[kind].streamed:
        from torchboost.data import export_shards

        export_shards(root, root / "shards", shard_size=8)
        return root / "shards"
    return root


# --- the tables cannot drift: nothing outside a registry names what it registers -------------------
REGISTRY_MODULES = {"optimizer": {"torchboost/optim/registry.py", "torchboost/recipe/optimizers.py"},
                    "data-set kind": {"torchboost/recipe/kinds.py", "torchboost/data/builtin.py"},
                    "weight format": {"torchboost/migrate/formats.py", "torchboost/train/checkpoint.py"}}
# The same words used for other things (each reviewed): not an optimizer/kind/format name.
OTHER_MEANINGS = {
    ("torchboost/optim/muon.py", "adamw"), ("torchboost/optim/muon.py", "muon"),  # Muon's parameter roles
    ("torchboost/optim/thor/wrap.py", "adamw"),  # thor_muon's input_layer default: a Muon parameter role
    ("torchboost/optim/thor/optimizer.py", "thor"), ("torchboost/optim/thor/wrap.py", "thor"),  # state_dict key
    ("torchboost/optim/thor/soap.py", "thor"), ("torchboost/optim/thor/preconditioner.py", "thor"),  # state_dict key
    ("torchboost/recipe/build.py", "thor"), ("torchboost/recipe/config.py", "thor"),  # schedule.mode=thor
}


def _names() -> dict[str, set[str]]:
    return {"optimizer": set(OPTIMIZERS), "data-set kind": set(DATA_KINDS),
            "weight format": {s for f in FORMATS.values() for s in f.suffixes} | set(REFUSED)}


def _literals(path: Path):
    tree = ast.parse(path.read_text())
    exported = {id(n) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id in ("__all__", "_EXPORTS") for t in node.targets)
                for n in ast.walk(node.value)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in exported:
            yield node.lineno, node.value


def test_no_registered_name_is_spelled_outside_its_registry():
    found = []
    for path in sorted((ROOT / "torchboost").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for line, text in _literals(path):
            for what, names in _names().items():
                if text in names and rel not in REGISTRY_MODULES[what] and (rel, text) not in OTHER_MEANINGS:
                    found.append(f"{rel}:{line}: {what} {text!r}")
    assert not found, "read these from the registry instead:\n" + "\n".join(found)


def test_the_drift_check_finds_a_planted_name(tmp_path):
    planted = tmp_path / "x.py"
    planted.write_text('if cfg.optim.name == "sgd":\n    pass\n__all__ = ["thor"]\n')
    assert [t for _, t in _literals(planted)] == ["sgd"]
