"""What each augmentation policy does to accuracy on a small photo-like image folder.

    .venv/bin/python benchmarks/augment_policies.py                      # 6 policies x 3 seeds, ~10 min on 1 core
    .venv/bin/python benchmarks/augment_policies.py --seeds 2 --epochs 20 --policies none mixup

The data is generated, not downloaded: 32x32 RGB images of 6 shape classes (disc, square, triangle, cross,
ring, bar), each drawn at a random position, size and colour over a textured background with noise, so the
class lives in the shape only (colour and place are nuisances). Few training images (--per-class, default
100) make it a small-data task, where augmentation is meant to help. Every policy trains the same recipe
(the MNIST CNN, `flip` as the base augmentation, SGD at lr 0.01 with a cosine schedule) through `train_from_config`,
at 1 torch thread, loader in-process; the table gives the final validation top-1 (median and min-max over
seeds) and the median seconds of a run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from shapes import SHAPES as FILLED, draw_shape

from torchboost.recipe.load import load_config
from torchboost.recipe.run import train_from_config

SIZE = 32
SHAPES = (*FILLED, "ring", "bar")
POLICIES = {
    "none": [],
    "randaugment": ["data.auto_augment=randaugment"],
    "trivialaugment": ["data.auto_augment=trivialaugment"],
    "random erasing": ["data.random_erasing=0.5"],
    "mixup": ["data.mixup_alpha=0.2"],
    "cutmix": ["data.cutmix_alpha=1.0"],
}


def draw(shape: str, rng: np.random.Generator) -> Image.Image:
    """One image: a textured, noisy background and one shape of random colour, size and place."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    base = rng.uniform(30, 200, 3)
    waves = 25 * np.sin(xx * rng.uniform(0.2, 0.9) + yy * rng.uniform(0.2, 0.9) + rng.uniform(0, 6))
    img = Image.fromarray(np.clip(base + waves[..., None] + rng.normal(0, 12, (SIZE, SIZE, 3)), 0, 255)
                          .astype(np.uint8))
    d = ImageDraw.Draw(img)
    r = rng.uniform(6, 11)
    cx, cy = rng.uniform(r + 1, SIZE - r - 1, 2)
    colour = tuple(int(v) for v in rng.integers(0, 256, 3))
    box = (cx - r, cy - r, cx + r, cy + r)
    if shape in FILLED:
        draw_shape(d, shape, cx, cy, r, colour)
    elif shape == "ring":
        d.ellipse(box, outline=colour, width=max(2, int(r / 3)))
    else:  # bar: a long thin box, horizontal or vertical
        w = r / 4
        d.rectangle((cx - r, cy - w, cx + r, cy + w) if rng.random() < 0.5 else (cx - w, cy - r, cx + w, cy + r),
                    fill=colour)
    return img


def make_folder(root: Path, per_class: int, val_per_class: int) -> Path:
    rng = np.random.default_rng(12345)
    for split, n in (("train", per_class), ("val", val_per_class)):
        for shape in SHAPES:
            (root / split / shape).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                draw(shape, rng).save(root / split / shape / f"{i}.png")
    return root


def run(data: Path, out: Path, policy: str, seed: int, epochs: int) -> tuple[float, float]:
    sets = ["data.dataset=folder", f"data.path={data}", "data.augment=flip", "data.crop_pct=1.0",
            "data.batch_size=32", "optim.lr=0.01", "train.label_smoothing=0.0", f"train.epochs={epochs}",
            f"train.seed={seed}", "train.progress_bar=false", "train.loggers=[]", "checkpoint.save_best=false",
            "checkpoint.keep_max=1", *POLICIES[policy]]
    start = time.perf_counter()
    result = train_from_config(load_config("mnist-lenet", sets), output=str(out), log=lambda m: None)
    return result.eval_results["val_top_1_accuracy"], time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--per-class", type=int, default=100, help="training images per class")
    p.add_argument("--val-per-class", type=int, default=100)
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        data = make_folder(Path(tmp) / "shapes", args.per_class, args.val_per_class)
        results: dict[str, list[tuple[float, float]]] = {k: [] for k in args.policies}
        for seed in range(args.seeds):  # interleaved: machine load drifts over all policies alike
            for policy in args.policies:
                acc, secs = run(data, Path(tmp) / f"run-{policy}-{seed}".replace(" ", "_"), policy, seed, args.epochs)
                results[policy].append((acc, secs))
                print(f"  {policy:<15} seed {seed}: top-1 {acc:.4f}  {secs:.1f} s", file=sys.stderr, flush=True)
    print(f"{len(SHAPES)} shape classes, {args.per_class} train / {args.val_per_class} val images per class, 32x32 RGB; "
          f"mnist_cnn, {args.epochs} epochs, batch 32, lr 0.01, {args.seeds} seed(s), 1 thread")
    print("| policy | top-1 median | top-1 min-max | seconds (median) |\n|---|---|---|---|")
    for policy, rows in results.items():
        accs, secs = [a for a, _ in rows], [s for _, s in rows]
        print(f"| {policy} | {statistics.median(accs):.4f} | {min(accs):.4f}-{max(accs):.4f} | "
              f"{statistics.median(secs):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
