"""Training fed by JPEGs decoded on the GPU (data.decode=device) against training on synthetic batches from host memory.

Generates a folder of full-size photo-like JPEGs (500x375 to 1024x768, quality 90: `data_pipeline.photo`, in a
process pool; an earlier set of the same count in --out is reused) and (--shards) exports them as shards. Then
trains ResNet-50 at 224 px, bf16 autocast, channels_last, batch 256, fused momentum SGD, through torchboost's
Model/TrainStep (the non-finite check every 50 updates, as `torchboost train` does with its defaults) from:
  synthetic    one uint8 batch in pinned host memory, copied to the device by every update as a loader's is
               (the step's ceiling);
  folder       the image folder, data.decode=device: every CPU core a loader worker (reading files, headers
               and crop draws), pinned memory; nvJPEG decodes, torch crops and resizes on the device, a batch
               ahead in DevicePrefetcher's thread (as `torchboost train` builds it on CUDA);
  shards       (--shards) the same images from the shards, likewise;
  folder, cpu  (--cpu-path) the folder decoded and cropped by the workers (data.decode=cpu), for contrast.
Each source keeps its loader (persistent workers) for the whole run. After one untimed warm-up block each,
the sources run in --rounds rounds (10) of one timed block each, in an order rotated every round, so a change
in machine load hits all of them; a block is synchronised at both ends and lasts --seconds / (rounds x sources),
less where --budget (the whole run's seconds) would not hold that. The ratios folder/synthetic and
shards/synthetic are taken per round (adjacent blocks): median [min, max]. Target: >= 0.90 on a GPU.
What a block cannot see: the loader's workers (reading bytes and drawing crops; decoding is the device's) and
the prefetch thread (up to 2 batches) work on while the other sources' blocks run, so a block starts with their
queues full: a loader bound by its workers would not show here (DataStarvationMonitor shows it in a real run).

Run (GPU, ~150 s with generation): python3 benchmarks/gpu_jpeg.py --out /tmp/gpu_jpeg
CPU smoke test: python3 benchmarks/gpu_jpeg.py --out /tmp/gpu_jpeg_cpu --device cpu --images 64 \\
                --model resnet18 --batch 16 --image-size 96 --seconds 8
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from data_pipeline import photo
from torchboost.data import (IMAGENET_MEAN, IMAGENET_STD, DeviceDecode, ImageFolder, build_loader, export_shards,
                             open_shards, set_epoch, train_transform)
from torchboost.data.prefetch import DevicePrefetcher
from torchboost.models import create_model
from torchboost.optim.registry import DEFAULT_OPTIMIZER, OptimizerArgs, build_optimizer
from torchboost.train.device import cpu_has_bf16, resolve_device, sync
from torchboost.train.model import Model

SIZES = [(500, 375), (640, 480), (800, 600), (1024, 768), (375, 500), (768, 1024)]  # ImageNet-like to larger
CLASSES = 100
TARGET = 0.90


def _write(job: tuple[int, str]) -> int:
    i, path = job
    w, h = SIZES[i % len(SIZES)]
    photo(w, h, seed=i).save(path, quality=90)
    return os.path.getsize(path)


def make_data(out: Path, images: int, shard_size: int, with_shards: bool) -> tuple[Path, Path, str, float]:
    """(folder, shards, how they were made, mean KB per file); an earlier set of `images` in `out` is reused, and
    its shards too (exported only when `with_shards`)."""
    folder, shards, start = out / "folder", out / "shards", time.perf_counter()
    files = [folder / "train" / f"c{i % CLASSES:03d}" / f"{i:06d}.jpg" for i in range(images)]
    have = sorted((folder / "train").rglob("*.jpg")) if folder.is_dir() else []
    made = []
    if have != sorted(files):
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(shards, ignore_errors=True)  # an earlier set's
        for f in files:
            f.parent.mkdir(parents=True, exist_ok=True)
        with Pool(os.cpu_count()) as pool:
            pool.map(_write, [(i, str(f)) for i, f in enumerate(files)], chunksize=8)
        made.append("made")
    if with_shards and not (shards / "_info.json").is_file():
        export_shards(folder, shards, shard_size=shard_size, overwrite=True)
        made.append("exported as shards")
    kb = sum(f.stat().st_size for f in files) / len(files) / 1e3
    return folder, shards, " and ".join(made) + f" in {time.perf_counter() - start:.1f} s" if made else "reused", kb


def build_model(args: argparse.Namespace, device: torch.device) -> Model:
    net = create_model(args.model, num_classes=1000, in_chans=3)
    opt = build_optimizer(DEFAULT_OPTIMIZER, net, OptimizerArgs(lr=0.1))  # fused momentum SGD, as `train` builds
    bf16 = device.type == "cuda" or cpu_has_bf16()  # emulated bf16 on other CPUs would only measure emulation
    return Model(net, nn.CrossEntropyLoss(), opt, device=device, amp_dtype=torch.bfloat16 if bf16 else None,
                 channels_last=True, input_norm=(IMAGENET_MEAN, IMAGENET_STD), check_every=50)


def batches(loader) -> Iterator:
    for epoch in itertools.count():  # persistent workers stay up across epochs
        set_epoch(loader, epoch)
        yield from loader


def sources(args, folder: Path, shards: Path, device: torch.device) -> dict[str, Iterator]:
    """Each source's endless stream of (images, labels) batches."""
    t = train_transform(args.image_size, IMAGENET_MEAN, IMAGENET_STD, uint8=True)
    kw = dict(workers=args.workers, pin_memory=device.type == "cuda", seed=0)
    x = torch.randint(0, 256, (args.batch, 3, args.image_size, args.image_size), dtype=torch.uint8)
    y = torch.randint(0, 1000, (args.batch,))
    if device.type == "cuda":  # as a loader with pin_memory hands a batch over
        x, y = x.pin_memory(), y.pin_memory()
    def device_loader(ds):  # as `torchboost train` builds it: on CUDA the next batch decoded ahead
        loader = build_loader(ds, args.batch, True, **kw)
        return DevicePrefetcher(loader, device) if device.type == "cuda" and not args.no_prefetch else loader

    out = {"synthetic": itertools.repeat((x, y)),
           "folder": batches(device_loader(ImageFolder(folder / "train", DeviceDecode(t))))}
    if args.shards:
        out["shards"] = batches(device_loader(open_shards(shards, "train", DeviceDecode(t))))
    if args.cpu_path:
        out["folder, cpu"] = batches(build_loader(ImageFolder(folder / "train", t), args.batch, True, **kw))
    return out


def block(model: Model, data: Iterator, seconds: float, counter: Iterator[int], device: torch.device,
          batch: int) -> float:
    """Images/s of training from `data` for about `seconds` (at least 2 updates), synchronised at both ends."""
    sync(device)
    start, steps = time.perf_counter(), 0
    while steps < 2 or time.perf_counter() - start < seconds:
        model.train_step([next(data)], next(counter))
        steps += 1
    sync(device)
    return steps * batch / (time.perf_counter() - start)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for the generated images and shards")
    ap.add_argument("--images", type=int, default=3072, help="JPEGs to generate (whole batches of --batch)")
    ap.add_argument("--seconds", type=float, help="timed seconds in all, split over the blocks (default: 60 on "
                    "CUDA, 10 on the CPU)")
    ap.add_argument("--rounds", type=int, default=10, help="rounds of one timed block per source")
    ap.add_argument("--budget", type=float, help="seconds the whole run may take: blocks shrink to fit the rounds")
    ap.add_argument("--shards", action=argparse.BooleanOptionalAction, default=True,
                    help="also export the images as shards and time training from them")
    ap.add_argument("--device", default="cuda", help="cuda or cpu")
    ap.add_argument("--no-prefetch", action="store_true", help="decode inside the step (no DevicePrefetcher)")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="loader workers per source (all cores)")
    ap.add_argument("--cpu-path", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the folder decoded on the CPU (data.decode=cpu)")
    args = ap.parse_args()
    device = resolve_device(args.device)
    args.seconds = args.seconds or (60.0 if device.type == "cuda" else 10.0)
    t0 = time.perf_counter()
    folder, shards, made, kb = make_data(args.out, args.images, max(1, args.images // 16), args.shards)
    model = build_model(args, device)
    streams = sources(args, folder, shards, device)
    counter = itertools.count()
    warm = max(0.5, args.seconds / (4 * args.rounds * len(streams)))
    for data in streams.values():  # worker start-up, cuDNN's choices, the allocator, nvJPEG's buffers
        block(model, data, warm, counter, device, args.batch)
    rates: dict[str, list[float]] = {name: [] for name in streams}
    names = list(streams)
    seconds = args.seconds / (args.rounds * len(names))
    if args.budget is not None:  # what is left of it, less the table's second, over the blocks (each >= 2 updates)
        seconds = min(seconds, (args.budget - (time.perf_counter() - t0) - 1) / (1.1 * args.rounds * len(names)))
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            rates[name].append(block(model, streams[name], seconds, counter, device, args.batch))
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none (CPU run)"
    print(f"device: {device} ({gpu}); CPU: {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores, load "
          f"average {os.getloadavg()[0]:.1f}, bf16 units {cpu_has_bf16()}; torch {torch.__version__}")
    print(f"{args.model} {args.image_size}px batch {args.batch} {model.autocast_dtype or 'fp32'} channels_last, "
          f"{args.workers} loader workers per source; {args.images} JPEGs ({kb:.0f} KB each) {made}")
    print(f"{args.rounds} interleaved rounds of {max(seconds, 0):.2f} s blocks (at least 2 updates each), the "
          f"order rotated every round: {', '.join(names)}")
    print(f"{'source':<14}{'img/s median':>14}{'min':>10}{'max':>10}{'/ synthetic per round':>34}")
    for name, values in rates.items():
        ratio = "" if name == "synthetic" else spread([v / s for v, s in zip(values, rates["synthetic"])])
        print(f"{name:<14}{statistics.median(values):>14.1f}{min(values):>10.1f}{max(values):>10.1f}{ratio:>34}")
    per_round = {name: statistics.median(v / s for v, s in zip(rates[name], rates["synthetic"]))
                 for name in ("folder", "shards") if name in rates}
    print("headline: " + ", ".join(f"{k}/synthetic {v:.3f}" for k, v in per_round.items()) + " with "
          f"data.decode=device (target >= {TARGET:.2f} on a GPU); {time.perf_counter() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
