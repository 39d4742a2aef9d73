"""Writes tests/fixtures/torchvision_zoo.json from torchvision's own model code: for each zoo network laid out
as torchvision's, the state dict's names and shapes in order, and the logits of 2 fixed images under fixed
weights (`fixed_weights`, re-implemented in tests/test_models_torchvision.py). Run it with a Python that has
torchvision (not this project's venv: torchvision's wheels fail to import beside the pinned CPU torch), e.g.

    python3 -m venv /tmp/tvenv && /tmp/tvenv/bin/pip install torch==2.14.1 torchvision==0.29.1
    /tmp/tvenv/bin/python scripts/make_zoo_fixtures.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

NAMES = ["mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny", "regnet_y_400mf",
         "regnet_x_400mf"]
OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "torchvision_zoo.json"


def fixed_weights(state: dict) -> dict:
    """Every tensor from its position and name alone: 0.05·sin(0.37·i + k) (k: the tensor's index); BatchNorm
    variances in [1, 1.5]; counters 0; ConvNeXt's layer scales 0.5 (so every block contributes)."""
    out = {}
    for k, (name, t) in enumerate(state.items()):
        if not t.is_floating_point():
            out[name] = torch.zeros_like(t)
            continue
        wave = torch.sin(0.37 * torch.arange(t.numel(), dtype=torch.float64) + k).reshape(t.shape)
        if name.endswith("running_var"):
            out[name] = (1.25 + 0.25 * wave).float()
        elif name.endswith("layer_scale"):
            out[name] = torch.full_like(t, 0.5)
        else:
            out[name] = (0.05 * wave).float()
    return out


def fixed_input() -> torch.Tensor:
    return torch.sin(0.01 * torch.arange(2 * 3 * 64 * 64, dtype=torch.float64)).reshape(2, 3, 64, 64).float()


def main() -> None:
    import torchvision  # only here: tests import fixed_weights from this file where torchvision cannot load

    torch.set_num_threads(1)
    result = {"torchvision": torchvision.__version__, "torch": torch.__version__, "models": {}}
    for name in NAMES:
        net = getattr(torchvision.models, name)(num_classes=10).eval()
        state = net.state_dict()
        net.load_state_dict(fixed_weights(state))
        with torch.no_grad():
            logits = net(fixed_input()).double()
        assert all(math.isfinite(v) for v in logits.flatten().tolist())
        result["models"][name] = {"keys": [[k, list(t.shape)] for k, t in state.items()],
                                  "logits": logits.tolist()}
    OUT.write_text(json.dumps(result))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
