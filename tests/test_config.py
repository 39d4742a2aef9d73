"""Config loading, overrides and validation errors."""

import pytest
from PIL import Image

from torchboost.recipe.config import Config, build_config, parse_override
from torchboost.recipe.files import list_recipes
from torchboost.recipe.load import load_config
from torchboost.errors import ConfigError


def test_shipped_recipes_load_and_validate():
    names = list_recipes()
    assert {"mnist-lenet", "digits-lenet", "resnet50-imagenet-sgd"} <= set(names)
    for name in names:
        folder = name.startswith("resnet50")  # the ImageNet recipes need the user's folder
        cfg = load_config(name, ["data.path=/tmp/x"] if folder else [])
        assert cfg.name == name


def test_overrides_are_typed_yaml():
    cfg = load_config("mnist-lenet", ["train.epochs=3", "optim.lr=0.1", "schedule.milestones=[1, 2.5]",
                                      "train.clip_global_norm=null"])
    assert cfg.train.epochs == 3 and cfg.optim.lr == 0.1
    assert cfg.schedule.milestones == [1.0, 2.5] and cfg.train.clip_global_norm is None
    assert parse_override("a.b=[1,2]") == {"a": {"b": [1, 2]}}


def test_int_is_accepted_for_float():
    assert load_config(None, ["optim.lr=1"]).optim.lr == 1.0


@pytest.mark.parametrize("override, needle", [
    ("train.epoch=3", "did you mean 'train.epochs'"),
    ("optim.learning_rate=3", "unknown config key 'optim.learning_rate'"),
    ("trian.epochs=3", "did you mean 'train'"),
    ("train.epochs=abc", "train.epochs must be int"),
    ("train.epochs=true", "train.epochs must be int"),
    ("train.epochs=0", "train.epochs must be >= 1"),
    ("schedule.mode=cosin", "did you mean 'cosine'"),
    ("data.dataset=folder", "needs a data path"),
    ("data.path=/x", "data.dataset=mnist5k is built in"),
    ("train.amp_level=O4", "is not one of O0, O1, O2, O3"),
    ("noequals", "is not key=value"),
])
def test_bad_config_is_one_clear_line(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_unknown_recipe_suggests(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'mnist-lenet'"):
        load_config("mnist-lenat")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {epochs: [}\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(bad))
    nested = tmp_path / "nested.yaml"
    nested.write_text("train:\n  ema: {decay: 0.99, decy: 1}\n")
    with pytest.raises(ConfigError, match="train.ema.decy.*train.ema.decay"):
        load_config(str(nested))


def test_to_dict_round_trip():
    cfg = load_config("resnet50-imagenet-sgd", ["data.path=/x"])
    assert build_config(cfg.to_dict()) == cfg


def test_free_form_sections_merge_instead_of_replacing():
    cfg = load_config("mnist-lenet-thor", ["optim.thor.frequency=50",
                                           "boost.config.dim_reduce.weight_load_dir=runs/x/ckpt"])
    t = cfg.optim.options["thor"]
    assert (t.damping, t.frequency, t.split_dim) == (0.1, 50, 128)
    assert cfg.boost.config == {"dim_reduce": {"weight_load_dir": "runs/x/ckpt"}}


def test_the_resnet20_thor_recipe_is_the_races_thor_lane():
    """resnet20-mnist5k-thor is the THOR lane the race selected and confirmed (BENCHMARKS.md, "select, then
    confirm"): the resnet20-mnist5k task at the race's 8-epoch budget, THOR with factor_samples 32 and
    graft=muon_step at lr 0.02, its warm-up start scaled by the race's rule (race.lanes.relative_schedule)."""
    import dataclasses

    from torchboost.race.lanes import relative_schedule

    task = load_config("resnet20-mnist5k", ["optim.name=thor", "train.label_smoothing=0.0", "train.epochs=8",
                                            "optim.thor={damping: 0.1, frequency: 10, split_dim: 128}",
                                            "optim.thor.factor_samples=32", "optim.thor.graft=muon_step"])
    lane = relative_schedule(task, 0.02)
    lane = dataclasses.replace(lane, optim=dataclasses.replace(lane.optim, lr=0.02))
    assert dataclasses.replace(load_config("resnet20-mnist5k-thor"), name=lane.name) == lane


class _Started(BaseException):
    """Raised where training would begin."""


def _count_passes(monkeypatch) -> list:
    import importlib

    v = importlib.import_module("torchboost.recipe.validation")  # the package re-exports the function as `validate`
    calls, real = [], v.validate
    monkeypatch.setattr(v, "validate", lambda cfg: (calls.append(cfg), real(cfg))[1])
    return calls


def test_a_config_passes_validation_once_unless_it_changes(monkeypatch):
    from torchboost.recipe.validation import validated

    cfg = load_config(None, [])
    calls = _count_passes(monkeypatch)
    assert validated(cfg) is cfg and calls == []  # load_config's pass stands
    cfg.optim.lr = -1.0  # changed after its pass (Python): checked again, not trusted
    with pytest.raises(ConfigError, match="optim.lr must be > 0"):
        validated(cfg)
    assert validated(Config()) is not None and len(calls) == 2  # built in Python: checked


@pytest.mark.parametrize("data", [False, True])
@pytest.mark.parametrize("resume", [None, "auto"])
def test_train_reads_the_recipe_once_and_validates_once(data, resume, monkeypatch, tmp_path):
    """`train` (also with --data) builds the recipe once and validates it once; train_from_config trusts it."""
    import torchboost.recipe.load as load
    import torchboost.recipe.run as run
    from torchboost.cli import main

    calls, reads, real_read = _count_passes(monkeypatch), [], load.read_yaml
    monkeypatch.setattr(load, "read_yaml", lambda path: (reads.append(path), real_read(path))[1])
    monkeypatch.setattr(run, "_train", lambda *a, **k: (_ for _ in ()).throw(_Started()))
    folder = tmp_path / "images"
    for split in ("train", "val"):
        for label in ("a", "b"):
            (folder / split / label).mkdir(parents=True)
            Image.new("L", (8, 8)).save(folder / split / label / "0.png")  # sampled to choose the model
    argv = ["train", "-o", str(tmp_path / "out"), *(["--data", str(folder)] if data else []),
            *(["--resume", resume] if resume else [])]  # `auto` with nothing to continue: a new run
    with pytest.raises(_Started):
        main(argv)
    assert len(reads) == 1 and len(calls) == 1
    assert calls[0].data.path == (str(folder) if data else None)


def test_saved_configs_with_an_optim_thor_section_load_unchanged():
    saved = load_config("mnist-lenet-thor").to_dict()
    assert "thor" in saved["optim"] and "options" not in saved["optim"]
    again = build_config(saved)
    assert again == load_config("mnist-lenet-thor") and again.optim.options["thor"].frequency == 10
    with pytest.raises(ConfigError, match="unknown config key 'optim.options'"):
        build_config({"optim": {"options": {}}})  # the Python field is not a recipe key
    with pytest.raises(ConfigError, match=r"unknown config key 'optim.thor.frequncy'.*optim.thor.frequency"):
        build_config(None, ["optim.thor.frequncy=3"])
    with pytest.raises(ConfigError, match=r"optim.thorr.*did you mean 'optim.thor'"):
        build_config(None, ["optim.thorr.frequency=3"])
    with pytest.raises(AttributeError):
        Config().optim.thor = {"frequency": 3}  # OptimConfig has slots: no silent attribute
