"""timm-named state dicts for the zoo networks whose layout timm shares (`migrate/timm_names.py`), against timm's
own model code: tests/fixtures/timm_zoo.json holds, from timm (scripts/make_timm_fixtures.py), each network's
state-dict names, shapes and dtypes in timm's order and its logits for fixed weights and images. Renamed, those
weights load strictly into ours and give timm's logits; `train.init_weights` reads such a file (a fresh head for
another class count); names that are not timm's, or not all of a network's, are never half-mapped."""

from __future__ import annotations

import functools
import json
import random
import re
from pathlib import Path

import pytest
import torch

from torchboost.cli import main
from torchboost.migrate.formats import read_torch_named
from torchboost.migrate.timm_names import TIMM_LAYOUTS, from_timm
from torchboost.models import create_model
from test_models_torchvision import fixed_weights

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "timm_zoo.json").read_text())["models"]
# timm's MobileNetV3 BatchNorm eps is 1e-5, torchvision's (and so ours) 1e-3: the same weights give logits this
# close (measured: 3e-5 of the largest logit); the other three are exact up to float32 summation order
TOLERANCE = {"mobilenet_v3_large": 1e-4, "mobilenet_v3_small": 1e-4}


@functools.lru_cache(maxsize=None)
def _timm_state(name: str) -> dict:
    zeros = {k: torch.zeros(shape, dtype=getattr(torch, dtype.removeprefix("torch."))) for k, shape, dtype in
             FIXTURE[name]["keys"]}
    state = fixed_weights(zeros)
    state.update({k: torch.full_like(v, 0.5) for k, v in state.items() if k.endswith(".gamma")})
    return state


def timm_state(name: str) -> dict:
    """The fixture network's state dict in timm's names, under the fixture's fixed weights (a fresh dict; the
    tensors are shared and never written)."""
    return dict(_timm_state(name))


@pytest.mark.parametrize("name", list(TIMM_LAYOUTS))
def test_timm_weights_renamed_give_timms_logits(name):
    net = create_model(name, num_classes=10).eval()
    renamed = from_timm(timm_state(name), name, net.state_dict())
    assert renamed is not None
    net.load_state_dict(renamed, strict=True)
    x = torch.sin(0.01 * torch.arange(2 * 3 * 64 * 64, dtype=torch.float64)).reshape(2, 3, 64, 64).float()
    with torch.no_grad():
        got = net(x).double()
    want = torch.tensor(FIXTURE[name]["logits"], dtype=torch.float64)
    assert ((got - want).abs().max() / want.abs().max()).item() <= TOLERANCE.get(name, 1e-5)


def test_init_weights_reads_a_timm_file_with_a_fresh_head(tmp_path):
    """A timm EfficientNet-B0 file (10 classes) fine-tuned on 3: every backbone tensor loaded under its torchvision
    name, the classifier re-initialised."""
    path = tmp_path / "timm_b0.pth"
    torch.save(timm_state("efficientnet_b0"), path)
    net = create_model("efficientnet_b0", num_classes=3)
    state = read_torch_named(path, "efficientnet_b0", None, net.state_dict())
    assert state.keys() == net.state_dict().keys()
    assert torch.equal(state["features.0.0.weight"], timm_state("efficientnet_b0")["conv_stem.weight"])
    assert state["classifier.1.weight"].shape == (10, 1280)  # the file's head, left to load_backbone to replace


def hostile_states(rng: random.Random, name: str) -> list[dict]:
    """timm-looking state dicts that are not a whole timm network: a name dropped, renamed, duplicated into
    another index, a shape changed, an index far out of range, a non-timm key added."""
    base = timm_state(name)
    keys = list(base)
    out = []
    for _ in range(16):
        state = dict(base)
        key = rng.choice(keys)
        kind = rng.randrange(8)
        if kind == 0:
            del state[key]
        elif kind == 1:
            state[key.replace(".", "._", 1)] = state.pop(key)
        elif kind == 2:
            state[key.replace("0", "9", 1) if "0" in key else key + "x"] = state[key]
        elif kind == 3 and state[key].ndim:
            state[key] = torch.zeros(*(s + 1 for s in state[key].shape))
        elif kind == 4:
            state["blocks.99999999999999999999.0.conv_dw.weight"] = torch.zeros(1)
        elif kind == 6:  # a module name no rule knows, inside a block (and inside its SE)
            state[re.sub(r"^(blocks\.\d+\.\d+\.|stages\.\d+\.blocks\.\d+\.|s\d+\.b\d+\.)?", r"\1foo.", key, 1)] = \
                state.pop(key)
        elif kind == 7:
            state[key.rsplit(".", 1)[0] + ".se.conv_other.weight"] = torch.zeros(1)
        else:
            state["module.extra"] = torch.zeros(1)
        out.append(state)
    return out


@pytest.mark.parametrize("name", list(TIMM_LAYOUTS))
def test_a_state_that_is_not_a_whole_timm_network_is_not_renamed(name):
    net = create_model(name, num_classes=10).state_dict()
    for state in hostile_states(random.Random(name), name):
        renamed = from_timm(state, name, net)
        # never half-mapped: either the whole network, each tensor of its expected shape, or nothing
        assert renamed is None or (renamed.keys() == net.keys() and
                                   all(renamed[k].shape == net[k].shape for k in list(net)[:-2]))
    assert from_timm(timm_state(name), "resnet18", create_model("resnet18", num_classes=10).state_dict()) is None


@pytest.mark.parametrize("extra", ["blocks.6.0.foo.weight", "blocks.1.0.se.bar.weight", "blocks.1.0.se.weight",
                                   "blocks.0.0.bn9.weight", "conv_stem", "blocks.1.0"])
def test_a_name_no_rule_knows_is_not_renamed(extra):
    state = {**timm_state("mobilenet_v3_small"), extra: torch.zeros(1)}
    net = create_model("mobilenet_v3_small", num_classes=10).state_dict()
    assert from_timm(state, "mobilenet_v3_small", net) is None


def test_a_hostile_timm_file_through_train_is_one_line(tmp_path, capsys):
    state = hostile_states(random.Random(0), "mobilenet_v3_small")[0]
    path = tmp_path / "bad.pth"
    torch.save(state, path)
    code = main(["train", "-c", "digits-lenet", "--set", "model.name=mobilenet_v3_small", "--set",
                 f"train.init_weights={path}", "--set", "train.epochs=1", "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and "Traceback" not in err, err
