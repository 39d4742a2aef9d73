"""Boost configuration: MindSpore levels/modes/defaults, unknown keys, impossible combinations, builder."""

import pytest
import torch
from torchboost.boost import DimReduce, GradCentralization, GradFreeze, boost_optimizer, build_boost, resolve_boost
from torchboost.boost.less_bn import FNHead
from torchboost.errors import ConfigError
from torchboost.models import create_model

pytestmark = pytest.mark.usefixtures("one_thread")



def test_levels_resolve_to_mindspore_algorithm_sets():
    assert resolve_boost("O0").enabled == frozenset()
    assert resolve_boost("O1").enabled == {"less_bn", "grad_freeze"}
    assert resolve_boost("O2").enabled == {"less_bn", "grad_freeze", "adasum"}


def test_defaults_are_mindspores():
    plan = resolve_boost("O1")
    gf, lb, dr = plan.grad_freeze_options, plan.less_bn_options, plan.dim_reduce_options
    assert (gf.param_groups, gf.freeze_type, gf.freeze_p, gf.total_steps) == (10, 1, 0.7, 65536)
    assert (lb.fn_flag, lb.gc_flag) == ("auto", True)  # MindSpore: fn_flag true (see less_bn.py)
    assert (dr.rho, dr.gamma, dr.alpha, dr.sigma, dr.n_components, dr.timeout) == (0.55, 0.9, 0.001, 0.4, 32, 1800)
    assert (dr.pca_mat_path, dr.weight_load_dir) == (None, None)
    assert plan.grad_accumulation_step == 1


def test_modes():
    manual = resolve_boost("O1", {"boost": {"mode": "manual", "grad_freeze": False}})
    assert manual.enabled == {"less_bn"}
    assert resolve_boost("O0", {"boost": {"mode": "manual", "grad_freeze": True}}).enabled == {"grad_freeze"}
    assert resolve_boost("O2", {"boost": {"mode": "disable_all"}}).enabled == frozenset()
    # auto ignores nothing silently: a switch that disagrees with the level is an error, an agreeing one is fine
    assert resolve_boost("O1", {"boost": {"less_bn": True}}).enabled == {"less_bn", "grad_freeze"}
    with pytest.raises(ConfigError, match="manual"):
        resolve_boost("O1", {"boost": {"grad_freeze": False}})
    # enable_all turns on everything, which includes combinations that cannot run: refused, with the reason
    with pytest.raises(ConfigError, match="enable_all"):
        resolve_boost("O0", {"boost": {"mode": "enable_all"}})


@pytest.mark.parametrize("config, bad, suggestion", [
    ({"grad_freez": {}}, "boost.config.grad_freez", "grad_freeze"),
    ({"boost": {"less_bm": True}}, "boost.config.boost.less_bm", "less_bn"),
    ({"grad_freeze": {"freeze_pp": 0.5}}, "boost.config.grad_freeze.freeze_pp", "freeze_p"),
    ({"dim_reduce": {"n_component": 4}}, "boost.config.dim_reduce.n_component", "n_components"),
])
def test_unknown_key_names_key_and_closest(config, bad, suggestion):
    with pytest.raises(ConfigError) as err:
        resolve_boost("O1", config)
    assert bad in err.value.what and f"'{suggestion}'" in err.value.fix


def test_unknown_level_and_mode():
    with pytest.raises(ConfigError, match="'O2'"):
        resolve_boost("O3")
    with pytest.raises(ConfigError, match="'manual'"):
        resolve_boost("O1", {"boost": {"mode": "manuel"}})


@pytest.mark.parametrize("section, value", [
    ({"grad_freeze": {"param_groups": "10"}}, "param_groups"),
    ({"grad_freeze": {"param_groups": 1}}, "param_groups"),
    ({"grad_freeze": {"freeze_p": 1}}, "freeze_p"),
    ({"grad_freeze": {"freeze_type": 2}}, "freeze_type"),
    ({"less_bn": {"fn_flag": "yes"}}, "fn_flag"),
    ({"dim_reduce": {"rho": 1.5}}, "rho"),
    ({"grad_freeze": [1, 2]}, "grad_freeze"),
])
def test_bad_values_refused(section, value):
    with pytest.raises(ConfigError, match=value):
        resolve_boost("O1", section)


def test_int_accepted_for_float_option():
    assert resolve_boost("O1", {"dim_reduce": {"alpha": 0}}).dim_reduce_options.alpha == 0.0


@pytest.mark.parametrize("config, match", [
    ({"boost": {"mode": "manual", "dim_reduce": True, "grad_freeze": True}, "dim_reduce": {"weight_load_dir": "x"}},
     "grad_freeze"),
    ({"boost": {"mode": "manual", "dim_reduce": True}}, "weight_load_dir"),
    ({"boost": {"mode": "manual", "grad_accumulation": True}}, "grad_accumulation_step"),
    ({"boost": {"mode": "manual", "loss_scale_group": True}}, "not implemented"),
])
def test_impossible_combinations_refused(config, match):
    with pytest.raises(ConfigError, match=match):
        resolve_boost("O0", config)


def test_grad_accumulation_step_exposed_for_the_trainer():
    plan = resolve_boost("O0", {"boost": {"mode": "manual", "grad_accumulation": True},
                                "grad_accumulation": {"grad_accumulation_step": 4}})
    assert plan.grad_accumulation_step == 4


def test_describe_lists_every_algorithm_and_unused_options():
    text = resolve_boost("O1", {"dim_reduce": {"n_components": 8}}).describe()
    assert "level O1" in text and "param_groups=10" in text and "fn_flag=auto" in text
    for name in ("less_bn", "grad_freeze", "adasum", "grad_accumulation", "dim_reduce", "loss_scale_group"):
        assert name in text
    assert "dim_reduce" in text and "options given but algorithm off" in text


def test_build_o1_on_resnet():
    model = create_model("resnet18", num_classes=10, in_chans=1, small_input=True)
    plan = resolve_boost("O1")
    model, hooks = build_boost(plan, model, total_steps=100)
    assert isinstance(model.fc, FNHead)
    assert [type(h) for h in hooks] == [GradFreeze, GradCentralization]
    assert boost_optimizer(plan, model) is None  # the recipe's optimizer, built after the model changed
    assert len(hooks[0].schedule) == 65536  # MindSpore's total_steps, longer than this run
    _, hooks = build_boost(plan, create_model("resnet18", num_classes=10), total_steps=70000)
    assert len(hooks[0].schedule) == 70000  # stretched to cover the run


def test_adasum_on_one_process_refused():
    with pytest.raises(ConfigError, match="world_size=1"):
        resolve_boost("O2", world_size=1)
    plan = resolve_boost("O2")  # world size not known yet: checked by the builder
    with pytest.raises(ConfigError, match="world_size=1"):
        build_boost(plan, create_model("mnist_cnn"), world_size=1)


def test_too_few_layer_groups_refused():
    with pytest.raises(ConfigError, match="at most 2"):
        build_boost(resolve_boost("O1"), create_model("mnist_cnn"))
    _, hooks = build_boost(resolve_boost("O1", {"grad_freeze": {"param_groups": 2}}), create_model("mnist_cnn"))
    assert [type(h) for h in hooks] == [GradFreeze, GradCentralization]


def test_dim_reduce_plan_gives_dim_reduce_optimizer(tmp_path):
    model = create_model("mnist_cnn", num_classes=10, in_chans=1, image_size=8)
    for i in range(4):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * torch.randn_like(p))
        torch.save({"model": model.state_dict()}, tmp_path / f"r-{i}_1.pt")
    plan = resolve_boost("O0", {"boost": {"mode": "manual", "dim_reduce": True},
                                "dim_reduce": {"n_components": 3, "weight_load_dir": str(tmp_path)}})
    model, hooks = build_boost(plan, model)
    opt = boost_optimizer(plan, model)
    assert hooks == [] and isinstance(opt, DimReduce) and opt.needs_closure
    assert opt.pca_mat.shape == (3, sum(p.numel() for p in model.parameters()))


def test_gradient_split_groups_set_the_ddp_fusion_config():
    from torchboost.recipe.load import load_config
    from torchboost.recipe.run import fusion_config

    plan = resolve_boost("O1", {"common": {"gradient_split_groups": [3, 9]}})
    assert fusion_config(load_config("digits-lenet"), plan) == [3, 9]
    assert fusion_config(load_config("digits-lenet"), resolve_boost("O1")) is None
    assert fusion_config(load_config("digits-lenet"), None) is None
    explicit = load_config("digits-lenet", ["dist.fusion_config=[5]"])
    assert fusion_config(explicit, plan) == [5]  # the dist section wins
