"""THOR's factor outer products with a partial last block: padded to the block size (the earlier way) vs
multiplied at its own size (`outer_blocks` now), on ResNet-20's factor shapes, and what it does to a
THOR-Muon[factor_samples=32] epoch against a Muon epoch (ResNet-20, 28 px, batch 128, 31 updates,
frequency 10). Interleaved repeats, medians; 1 torch thread.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/thor_factor_blocks.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from torchboost.optim.registry import OptimizerArgs, build_optimizer
from torchboost.recipe import load_resolved
from torchboost.recipe.build import build_model
from torchboost.recipe.optimizers import thor_per_update
from torchboost.race.report import cpu_flags

# torchboost.optim.thor is also the name of THOR's factory function: import the module by its path
factors = importlib.import_module("torchboost.optim.thor.factors")
partial_blocks = factors.outer_blocks


def padded_blocks(cols: torch.Tensor, groups: int, b: int) -> torch.Tensor:
    """The earlier outer products: the columns zero-padded to whole blocks, every block b x b."""
    n = cols.shape[0] // groups
    nb = -(-n // b)
    x = cols.reshape(groups, n, -1)
    if nb * b != n:
        x = F.pad(x, (0, 0, 0, nb * b - n))
    return factors.gram(x.reshape(groups * nb, b, -1)).reshape(groups, nb, b, b)


def median_seconds(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, CPU: {cpu_flags()}")
    # ResNet-20's A factors at factor_samples=32: 16/32/64 channels x 3x3 over 28/14/7 px positions
    for n, rows in ((144, 32 * 784), (288, 32 * 196), (576, 32 * 49)):
        cols = torch.randn(n, rows)
        torch.testing.assert_close(padded_blocks(cols, 1, 128), partial_blocks(cols, 1, 128), rtol=1e-4, atol=1e-2)
        t = median_seconds({"padded": lambda: padded_blocks(cols, 1, 128),
                            "partial": lambda: partial_blocks(cols, 1, 128)}, 3 * args.repeats)
        print(f"A factor {n} wide, {rows} rows, blocks of 128: padded {1e3 * t['padded']:.1f} ms, partial block "
              f"at its size {1e3 * t['partial']:.1f} ms ({t['padded'] / t['partial']:.2f}x)")

    cfg, _, _ = load_resolved("resnet20-mnist5k", ["optim.name=thor_muon", "optim.thor={damping: 0.1, frequency: 10, "
                                                   "split_dim: 128, factor_samples: 32}"])
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(128, 1, 28, 28, generator=g), torch.randint(0, 10, (128,), generator=g)) for _ in range(31)]

    def epoch(name: str, blocks: Callable) -> Callable[[], None]:
        def run() -> None:
            factors.outer_blocks = blocks  # what LayerCapture calls
            torch.manual_seed(0)
            model = build_model(cfg)
            opt = build_optimizer(name, model, OptimizerArgs(
                0.02, momentum=0.95, nesterov=True, weight_decay=5e-4,
                options=None if name == "muon" else thor_per_update(cfg.optim.options["thor"], 31, 8)))
            for x, y in data:
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
        return run

    t = median_seconds({"muon": epoch("muon", partial_blocks), "thor_muon padded": epoch("thor_muon", padded_blocks),
                        "thor_muon partial": epoch("thor_muon", partial_blocks)}, args.repeats)
    factors.outer_blocks = partial_blocks
    for k, v in t.items():
        print(f"{k:<20} {v:6.2f} s/epoch  {v / t['muon']:.3f}x Muon")
    print(f"headline: THOR-Muon epoch, partial blocks / padded = {t['thor_muon partial'] / t['thor_muon padded']:.3f}x")


if __name__ == "__main__":
    main()
