"""THOR's curvature options are listed once, in `ThorOptions`: no constructor restates them as parameters, the
recipe's `optim.thor` is that dataclass plus the recipe's own epoch key, overrides by name equal an options
object, an unknown name is a one-line error with a suggestion, and a removed option says it was removed."""

import copy
import dataclasses
import inspect

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from thor_nets import batch, mlp, train_step
from torchboost.cli import main
from torchboost.errors import ConfigError
from torchboost.optim.thor import THOR, ThorOptions, ThorPreconditioner, thor_muon
from torchboost.options import leaf_fields
from torchboost.recipe.config import Config, build_config
from torchboost.recipe.load import load_config
from torchboost.recipe.optimizers import ThorRecipeOptions, thor_per_update
from torchboost.recipe.validation import validate

FIELDS = [f.name for f in dataclasses.fields(ThorOptions)]
# a value of each removed option that is not what THOR does now (those are refused; the kept ones load)
REMOVED_VALUES = dict(factor_interval=2, inv_interval=2, inverse_method="eigen",
                      trace_threshold=0.05, interval_growth=2, max_interval_mult=4, loss_reduction="sum",
                      max_damping_retries=5, kl_clip=0.001, max_dim=512, batchnorm="unit_wise", first_order_after=10,
                      first_order_epoch=3)


def test_no_constructor_restates_an_option_as_a_parameter():
    for fn in (ThorPreconditioner.__init__, THOR.__init__, thor_muon):
        params = inspect.signature(fn).parameters
        assert not set(FIELDS) & set(params), fn.__qualname__
        assert "options" in params and any(p.kind is p.VAR_KEYWORD for p in params.values()), fn.__qualname__


def test_the_recipe_section_is_thor_options_plus_its_epoch_key():
    keys = [k.removeprefix("optim.thor.") for k, *_ in leaf_fields(Config()) if k.startswith("optim.thor.")]
    assert keys == [*FIELDS, "damping_decay"]
    assert set(ThorRecipeOptions.REMOVED) == set(REMOVED_VALUES) and not set(FIELDS) & set(REMOVED_VALUES)


def conv_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 6, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 25, 3)).double()


def preconditioned(pre_of, steps: int = 3) -> list[torch.Tensor]:
    net = conv_net()
    pre = pre_of(net)
    g = torch.Generator().manual_seed(0)
    grads = []
    for _ in range(steps):
        x, y = torch.randn(8, 2, 5, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (8,), generator=g)
        net.zero_grad()
        F.cross_entropy(net(x), y).backward()
        pre.step()
        grads += [p.grad.clone() for p in net.parameters()]
        with torch.no_grad():
            for p in net.parameters():
                p -= 0.1 * p.grad
    return grads


def test_overrides_and_an_options_object_precondition_identically():
    kw = dict(damping=[0.2, 0.1, 0.05], frequency=2, split_dim=4, factor_samples=6, graft="grad")
    options = ThorOptions(**kw)
    kept = copy.deepcopy(options)
    by_name = preconditioned(lambda net: ThorPreconditioner(net, **kw))
    by_object = preconditioned(lambda net: ThorPreconditioner(net, options))
    mixed = preconditioned(lambda net: ThorPreconditioner(net, ThorOptions(damping=kw["damping"], split_dim=9),
                                                          **{k: v for k, v in kw.items() if k != "damping"}))
    for a, b, c in zip(by_name, by_object, mixed):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert options == kept  # the caller's object is never changed
    assert ThorPreconditioner(conv_net(), options, frequency=7).options == dataclasses.replace(options, frequency=7)


def test_thor_takes_an_options_object_as_its_overrides():
    nets = [mlp(), mlp()]
    opts = [THOR(nets[0], 0.1, ThorOptions(damping=0.2, frequency=2, split_dim=None), weight_decay=1e-3),
            THOR(nets[1], 0.1, damping=0.2, frequency=2, split_dim=None, weight_decay=1e-3)]
    for k in range(3):
        for net, opt in zip(nets, opts):
            train_step(net, opt, *batch(k))
    for p, q in zip(*(n.parameters() for n in nets)):
        assert torch.equal(p, q)
    assert opts[0].options == opts[1].options == opts[0].preconditioner.options


@pytest.mark.parametrize("build", [lambda: ThorPreconditioner(mlp(), frequncy=3),
                                   lambda: THOR(mlp(), 0.1, frequncy=3),
                                   lambda: thor_muon(mlp(), 0.02, frequncy=3)])
def test_an_unknown_override_is_one_line_with_a_suggestion(build):
    with pytest.raises(ConfigError, match="unknown THOR option 'frequncy'") as e:
        build()
    assert "did you mean 'frequency'?" in str(e.value) and "\n" not in str(e.value)


def test_options_a_recipe_counts_in_epochs_are_refused_unconverted():
    with pytest.raises(ConfigError, match="ThorRecipeOptions carry damping_decay.*thor_per_update"):
        ThorPreconditioner(mlp(), ThorRecipeOptions(damping_decay=0.5))
    converted = thor_per_update(ThorRecipeOptions(damping_decay=0.5), updates_per_epoch=4, epochs=2)
    assert type(converted) is ThorOptions and len(converted.damping) == 8
    ThorPreconditioner(mlp(), converted)


@pytest.mark.parametrize("key", sorted(REMOVED_VALUES))
def test_a_removed_recipe_key_is_one_line_saying_so(key, capsys, tmp_path):
    value = REMOVED_VALUES[key]
    said = rf"^optim\.thor\.{key} was removed \(.+\) — delete the key$"
    with pytest.raises(ConfigError, match=said):  # --set
        build_config(None, [f"optim.thor.{key}={value}"])
    with pytest.raises(ConfigError, match=said):  # a recipe's or a saved config.yaml's mapping
        build_config({"optim": {"name": "thor", "thor": {"damping": 0.1, key: value}}})
    cfg = Config()
    cfg.optim.name, cfg.optim.options["thor"] = "thor", {key: value}  # a section written in Python
    with pytest.raises(ConfigError, match=rf"optim\.thor\.{key} was removed"):
        validate(cfg)
    assert main(["train", "--print-config", "--set", "optim.name=thor", "--set", f"optim.thor.{key}={value}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"optim.thor.{key} was removed" in err and "delete the key" in err


def test_a_config_saved_before_the_removal_loads():
    """Saved configs write every key: a removed one holding what THOR does now is dropped, not refused."""
    saved = load_config("mnist-lenet-thor").to_dict()
    saved["optim"]["thor"].update(factor_interval=None, inv_interval=None, inverse_method="cholesky",
                                  trace_threshold=None, interval_growth=1, max_interval_mult=8, loss_reduction="mean",
                                  max_damping_retries=3, kl_clip=None, max_dim=None, batchnorm="none",
                                  first_order_epoch=None)
    assert build_config(saved) == load_config("mnist-lenet-thor")


def test_a_removed_python_argument_is_one_line_saying_so():
    with pytest.raises(ConfigError, match=r"^THOR option kl_clip was removed \(.+\) — delete the argument$"):
        THOR(mlp(), 0.1, kl_clip=1e-3)
    with pytest.raises(ConfigError, match="THOR option batchnorm was removed"):
        ThorPreconditioner(mlp(), batchnorm="unit_wise")
