"""Writes tests/fixtures/timm_zoo.json from timm's own model code: for each zoo network whose layout timm shares
(`torchboost.migrate.timm_names.TIMM_LAYOUTS`), timm's state-dict names, shapes and dtypes in order, and the
logits of 2 fixed images under fixed weights (`make_zoo_fixtures.fixed_weights`, ConvNeXt's `gamma` layer scales
0.5 as torchvision's are). tests/test_timm_names.py renames those weights and compares.

timm imports torchvision, whose wheels reachable here fail beside the pinned CPU torch; timm's model code for these
networks never calls it, so this script installs an inert stand-in for every `torchvision` module before importing
timm (any call into it raises). Run it with timm on the path, not in the project's venv:

    pip install --no-deps --target /tmp/timm_pkg timm==1.0.31
    PYTHONPATH=/tmp/timm_pkg .venv/bin/python scripts/make_timm_fixtures.py
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import math
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_zoo_fixtures import fixed_input, fixed_weights  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "timm_zoo.json"


class _Inert(type):
    def __getattr__(cls, name):  # a distinct placeholder per name (enum members must differ)
        if name.startswith("__"):
            raise AttributeError(name)
        sub = _Inert(f"{cls.__name__}.{name}", (cls,), {})
        type.__setattr__(cls, name, sub)
        return sub


class Placeholder(metaclass=_Inert):
    def __init__(self, *args, **kwargs):
        raise RuntimeError("the torchvision stand-in was called: this timm model needs the real torchvision")


class _StandIn(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandIn(spec.name)
        module.__path__, module.__version__ = [], "stand-in"
        return module

    def exec_module(self, module):
        pass


def main() -> None:
    sys.meta_path.insert(0, _Finder())
    import timm

    from torchboost.migrate.timm_names import TIMM_LAYOUTS

    torch.set_num_threads(1)
    result = {"timm": timm.__version__, "torch": torch.__version__, "models": {}}
    for ours, theirs in TIMM_LAYOUTS.items():
        net = timm.create_model(theirs, pretrained=False, num_classes=10).eval()
        state = net.state_dict()
        weights = fixed_weights(state)
        weights.update({k: torch.full_like(v, 0.5) for k, v in weights.items() if k.endswith(".gamma")})
        net.load_state_dict(weights)
        with torch.no_grad():
            logits = net(fixed_input()).double()
        assert all(math.isfinite(v) for v in logits.flatten().tolist())
        result["models"][ours] = {"timm": theirs, "logits": logits.tolist(),
                                  "keys": [[k, list(t.shape), str(t.dtype)] for k, t in state.items()]}
    OUT.write_text(json.dumps(result))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
