"""Images/s of the ImageNet training transform read from tar shards vs from the same images in a folder.

Generates photo-like 1024×768 JPEGs (quality 90, `data_pipeline.photo`) as an image folder and exports them
with `export_shards`, once on a tmpfs (/dev/shm) and once on disk. Each row times whole epochs of a
training loader (`build_loader(..., train=True)`: RandomResizedCrop 224 + flip + normalize, JPEG draft
decoding) over the folder (`ImageFolder`) and over the shards (`ShardDataset`, default shuffle buffer),
with 1 loader worker and several. The two sources alternate epoch by epoch (rotating which goes first);
each figure is the median of --repeats epochs after one untimed epoch, and the ratio is the median over the
--repeats pairs of adjacent epochs of shards/folder. The default 320 images are 10 whole
batches and 8 whole shards, so no image is dropped and both sources decode exactly the same images with the
same random crops (drawn per (seed, epoch, image)): only the reading and the order differ.

Two figures per source: images per CPU-second (the loader's whole cost: its worker processes and the main
process, so what a dedicated core would deliver) and wall-clock images/s. Workers are persistent, as in
training (`build_loader`'s default), so an epoch's figure is its steady state, not process start-up; CPU time
is each thread's on-CPU nanoseconds from /proc/PID/task/*/schedstat, read before and after the epoch. The machine is shared, so the wall figure moves with
other people's load; the CPU figure is the comparison, and the ratio is taken on it.

warm: files in the page cache. cold (disk only): every file's cached pages are dropped before each epoch
with posix_fadvise(DONTNEED) after an fsync, which needs no root (the machine refuses
/proc/sys/vm/drop_caches); fincore, when installed, reports what is left. On a virtual disk the host may
still cache the blocks. tmpfs has no cold state (memory is its storage).

"Where the time goes": one process, no loader, µs of CPU per image: reading the bytes (folder: open + read
per file; shards: walking the tar headers through `read_samples` and reading each image, or reading each
sample with one pread through the offsets table), decoding + transforming from memory (what the shards path
does), and opening + decoding + transforming from the file (what the folder path does).

Run: .venv/bin/python benchmarks/shards_throughput.py [--images 320] [--workers 1 2 4] [--repeats 7]
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from data_pipeline import photo
from torchboost.data import ImageFolder, build_loader, export_shards, open_shards, set_epoch
from torchboost.data.folder import find_samples, open_image
from torchboost.data.shardfiles import index_split, open_shard, read_index, read_samples
from torchboost.data.shardoffsets import offsets_path, read_offsets, read_sample_at
from torchboost.data.transforms import IMAGENET_MEAN, IMAGENET_STD, train_transform

W, H, CLASSES, BATCH = 1024, 768, 10, 32


def make_data(root: Path, images: int, shard_size: int) -> None:
    for i in range(images):
        folder = root / "folder" / "train" / f"c{i % CLASSES}"
        folder.mkdir(parents=True, exist_ok=True)
        photo(W, H, seed=i).save(folder / f"{i:05d}.jpg", quality=90)
    export_shards(root / "folder", root / "shards", shard_size=shard_size)


def data_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def evict(files: list[Path]) -> None:
    """Drop the files' pages from the page cache (no root needed; only clean pages can go, hence the fsync)."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_mb(files: list[Path]) -> float | None:
    """Megabytes of the files in the page cache (fincore), None without fincore."""
    if not shutil.which("fincore"):
        return None
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *map(str, files)],
                         capture_output=True, text=True).stdout
    return sum(int(v) for v in out.split()) / 2**20


def loaders(root: Path, workers: int) -> dict:
    transform = train_transform(224, IMAGENET_MEAN, IMAGENET_STD, augment="imagenet")
    sets = {"folder": ImageFolder(root / "folder" / "train", transform),
            "shards": open_shards(root / "shards", "train", transform)}
    return {name: build_loader(ds, BATCH, True, workers=workers, seed=0) for name, ds in sets.items()}


def on_cpu_seconds(pid: int | str) -> float:
    """On-CPU time of every thread of process `pid` (schedstat's first field, nanoseconds: exact, where
    /proc/PID/stat counts 10 ms ticks)."""
    tasks = Path(f"/proc/{pid}/task")
    return sum(int((t / "schedstat").read_text().split()[0]) for t in tasks.iterdir()) / 1e9


def loader_cpu(loader) -> float:
    """CPU seconds so far of this process and the loader's (persistent) worker processes."""
    workers = loader._iterator._workers if loader._iterator is not None else []  # noqa: SLF001 - their pids
    return on_cpu_seconds("self") + sum(on_cpu_seconds(w.pid) for w in workers)


def epoch_rates(loader, epoch: int) -> tuple[float, float]:
    """(images per CPU-second, images per wall-second) of one epoch (after the first: workers exist)."""
    set_epoch(loader, epoch)
    c0, t0, n = loader_cpu(loader), time.perf_counter(), 0
    for x, _ in loader:
        n += len(x)
    wall = time.perf_counter() - t0
    return n / (loader_cpu(loader) - c0), n / wall


def row(root: Path, workers: int, cold: bool, repeats: int) -> dict:
    files = data_files(root)
    pair = loaders(root, workers)
    for loader in pair.values():
        epoch_rates(loader, 0)  # fills the cache and starts the workers
    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in pair}
    left = []
    for rep in range(repeats):
        for name in (list(pair) if rep % 2 == 0 else list(pair)[::-1]):
            if cold:
                evict(files)
                left.append(resident_mb(files))
            rates[name].append(epoch_rates(pair[name], rep + 1))
    if cold and left and left[0] is not None:
        print(f"    (cold: at most {max(left):.1f} MB of the data left in the page cache after eviction)")
    out = {name: (statistics.median(c for c, _ in r), statistics.median(w for _, w in r)) for name, r in rates.items()}
    # The ratio of each interleaved pair of epochs (adjacent in time: slow drifts of the machine cancel), median.
    out["ratio"] = statistics.median(s[0] / f[0] for f, s in zip(rates["folder"], rates["shards"]))
    return out


def breakdown(root: Path) -> dict[str, float]:
    """Microseconds per image: reading bytes (each source), decoding + transforming them (shared)."""
    _, samples = find_samples(root / "folder" / "train")
    t0 = time.process_time()
    blobs = [Path(p).read_bytes() for p, _ in samples]
    folder_read = time.process_time() - t0
    t0 = time.process_time()
    n = 0
    for shard in sorted((root / "shards").glob("*.tar")):
        with open_shard(str(shard)) as stream:
            n += sum(len(s.image_bytes()) > 0 for s in read_samples(str(shard), stream, CLASSES))
    shard_read = time.process_time() - t0
    assert n == len(blobs)
    t0 = time.process_time()
    name, part = index_split(read_index(root / "shards"), "train")
    starts = read_offsets(offsets_path(root / "shards", name), part.lengths)
    for f, table in zip(part.filenames, starts):
        fd = os.open(root / "shards" / f, os.O_RDONLY)
        try:
            n -= sum(len(read_sample_at(f, fd, int(a), int(b), CLASSES).image_bytes()) > 0
                     for a, b in zip(table[:-1], table[1:]))
        finally:
            os.close(fd)
    offset_read = time.process_time() - t0
    transform = train_transform(224, IMAGENET_MEAN, IMAGENET_STD, augment="imagenet")
    rng = np.random.default_rng(0)
    t0 = time.process_time()
    for b in blobs:
        with open_image(io.BytesIO(b)) as img:
            transform(img, rng)
    decode = time.process_time() - t0
    t0 = time.process_time()
    for path, _ in samples:  # what the folder path does: the decoder reads the file itself, in chunks
        with open_image(path) as img:
            transform(img, rng)
    from_path = time.process_time() - t0
    assert n == 0  # every sample read both ways
    us = 1e6 / len(blobs)
    return {"folder open+read": folder_read * us, "shards header walk+read": shard_read * us,
            "shards read by offset": offset_read * us, "decode+transform from bytes in memory": decode * us,
            "open+decode+transform from the file": from_path * us}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=320)
    ap.add_argument("--shard-size", type=int, default=40)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--disk", default=tempfile.gettempdir(), help="a folder on disk (default: the temp folder)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # more workers than cores: on purpose
    flags = sorted(set(re.findall(r"avx512\w*|amx\w*", Path("/proc/cpuinfo").read_text())))
    print(f"cpus {os.cpu_count()}, torch threads {torch.get_num_threads()}, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, flags: {' '.join(flags) or 'none of avx512/amx'}")
    print(f"{args.images} JPEGs {W}x{H} q90 in {CLASSES} classes, shards of {args.shard_size}, batch {BATCH}, "
          f"median of {args.repeats} epochs per figure")
    ratios = []
    print(f"{'storage':<8} {'cache':<5} {'workers':>7} {'folder img/CPU-s':>17} {'shards img/CPU-s':>17} "
          f"{'shards/folder':>14} {'folder img/s':>13} {'shards img/s':>13}")
    for place, base in (("tmpfs", "/dev/shm"), ("disk", args.disk)):
        root = Path(tempfile.mkdtemp(prefix="shards-bench-", dir=base))
        try:
            make_data(root, args.images, args.shard_size)
            mb = sum(f.stat().st_size for f in data_files(root / "shards")) / 2**20
            print(f"  {place}: {root} ({mb:.0f} MB of shards, the same again as files)")
            for cold in ((False, True) if place == "disk" else (False,)):
                for workers in args.workers:
                    r = row(root, workers, cold, args.repeats)
                    ratios.append(r["ratio"])
                    print(f"{place:<8} {'cold' if cold else 'warm':<5} {workers:>7} {r['folder'][0]:>17.1f} "
                          f"{r['shards'][0]:>17.1f} {ratios[-1]:>13.3f}x {r['folder'][1]:>13.1f} "
                          f"{r['shards'][1]:>13.1f}", flush=True)
            if place == "tmpfs":
                parts = breakdown(root)
                print("  where the time goes (one process, tmpfs, µs of CPU per image): " +
                      ", ".join(f"{k} {v:,.0f}" for k, v in parts.items()))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print(f"headline: shards / folder images per CPU-second = {min(ratios):.3f}x at worst, "
          f"{statistics.median(ratios):.3f}x median, {max(ratios):.3f}x at best over {len(ratios)} rows")


if __name__ == "__main__":
    sys.exit(main())
