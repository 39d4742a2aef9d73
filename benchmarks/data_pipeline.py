"""Data pipeline per worker: naive full-resolution decode + RandomResizedCrop vs draft-mode decode.

Generates photo-like JPEGs (quality 90, smooth structure + sensor-like noise, ~3.5 bits/pixel) in a
temporary folder, then measures images per CPU-second of one single-threaded process (what one DataLoader
worker gets) for
  naive: Image.open().convert("RGB") at full resolution (torchvision's loader), crop + bilinear resize to
         the output size, flip, float tensor, normalize;
  draft: torchboost's TrainTransform: the same crop draws, decoded in JPEG draft mode at the largest 1/2,
         1/4, 1/8 reduction whose crop region still covers the output size;
  draft uint8: the same with uint8=True, what the loader ships with data.normalize_on_device=true (the
         step normalizes the batch on its device instead).
CPU time, not wall time, because the machine may be shared; the pipelines alternate image by image in
rotating order; medians of --repeats runs.

Run: .venv/bin/python benchmarks/data_pipeline.py [--images 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from torchboost.data.transforms import IMAGENET_MEAN, IMAGENET_STD, TrainTransform, draft_scale, rrc_params

# (width, height, output size): ImageNet's typical Flickr size, then larger originals (camera photos,
# user folders); 128 px is the low-resolution phase of progressive-resizing recipes (FFCV-style).
CASES = [(500, 375, 224), (500, 375, 128), (1024, 768, 224), (2048, 1536, 224)]
# Draft mode can only help once a crop covers 2x the output: the headline is the smallest such photo size.
# ImageNet's typical 500x375 never gets there at 224 px (its short side is < 448), so the last line also
# states that case.
HEADLINE, TYPICAL = (1024, 768, 224), (500, 375, 224)


def photo(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    base, detail = (Image.fromarray(rng.integers(0, 256, (gh, gw, 3), dtype=np.uint8)).resize((w, h), Image.BICUBIC)
                    for gh, gw in ((6, 8), (h // 16, w // 16)))  # large shapes + mid-frequency detail
    arr = np.asarray(Image.blend(base, detail, 0.4), np.float32)
    arr += 10 * rng.standard_normal((h, w, 1), dtype=np.float32)  # sensor-like noise
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def naive(path: Path, rng: np.random.Generator, t: TrainTransform) -> torch.Tensor:
    """Full-resolution decode, then the same crop draw, resize, flip and tensor conversion as `t`."""
    img = Image.open(path).convert("RGB")
    top, left, h, w = rrc_params(img.width, img.height, rng)
    flip = rng.random() < 0.5
    out = img.crop((left, top, left + w, top + h)).resize((t.size, t.size), Image.BILINEAR)
    return t.to_tensor(np.asarray(out.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else out))


def rates(pipelines: dict, paths: list[Path]) -> dict[str, float]:
    """Images per CPU-second of each pipeline, alternating pipelines image by image so that a change in
    machine load hits all of them alike; image i uses seed i in every pipeline (identical crops). The order
    rotates per image: whichever pipeline runs right after the naive full decode finds its caches evicted
    and measured ~5% slower, so a fixed order would bias the comparison."""
    spent = dict.fromkeys(pipelines, 0.0)
    names = list(pipelines)
    for i, p in enumerate(paths):
        for name in names[i % len(names):] + names[:i % len(names)]:
            fn = pipelines[name]
            start = time.process_time()
            fn(p, np.random.default_rng(i))
            spent[name] += time.process_time() - start
    return {name: len(paths) / t for name, t in spent.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)  # DataLoader workers run single-threaded
    print(f"{'image':>10} {'out':>4} {'KB/img':>7} {'mean draft':>10} {'naive img/s':>12} {'draft img/s':>12} "
          f"{'ratio':>6} {'uint8 img/s':>12} {'ratio':>6}")
    ratios, uint8_ratios = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for w, h, size in CASES:
            folder = Path(tmp) / f"{w}x{h}"
            if not folder.exists():
                folder.mkdir()
                for i in range(args.images):
                    photo(w, h, i).save(folder / f"{i:03d}.jpg", quality=90)
            paths = sorted(folder.glob("*.jpg"))
            kb = sum(p.stat().st_size for p in paths) / len(paths) / 1e3
            draft = TrainTransform(size, IMAGENET_MEAN, IMAGENET_STD)
            draft_u8 = TrainTransform(size, IMAGENET_MEAN, IMAGENET_STD, uint8=True)
            crops = [rrc_params(w, h, np.random.default_rng(i)) for i in range(len(paths))]
            scales = [draft_scale(cw, ch, size, size) for _, _, ch, cw in crops]
            pipelines = {"naive": lambda p, r: naive(p, r, draft),
                         "draft": lambda p, r: draft(Image.open(p), r),
                         "draft uint8": lambda p, r: draft_u8(Image.open(p), r)}
            runs = [rates(pipelines, paths) for _ in range(args.repeats)]
            a, b, c = (statistics.median(run[name] for run in runs) for name in pipelines)
            ratios[(w, h, size)], uint8_ratios[(w, h, size)] = b / a, c / a
            print(f"{w:>5}x{h:<4} {size:>4} {kb:>7.0f} {np.mean(scales):>9.2f}x {a:>12.1f} {b:>12.1f} "
                  f"{b / a:>5.2f}x {c:>12.1f} {c / a:>5.2f}x")
    (w, h, size), (tw, th, ts) = HEADLINE, TYPICAL
    print(f"headline: draft / naive = {ratios[HEADLINE]:.2f}x images/s per worker on {w}x{h} JPEGs -> "
          f"RandomResizedCrop {size} (target >= 1.5x; {uint8_ratios[HEADLINE]:.2f}x shipping uint8); "
          f"{ratios[TYPICAL]:.2f}x on {tw}x{th} -> {ts}, where no crop allows a reduction")


if __name__ == "__main__":
    main()
