"""`torchboost bench`: images/s of the training step (synthetic data), of the data pipeline alone (decode +
augment per DataLoader worker count on an image folder) and of both together — and which of the two limits.

The CLI registers `add_arguments(parser)` and calls `cmd_bench(args)` (or `run_bench(args)` for the result
dict and the printed table). benchmarks/throughput.py compares settings side by side with `make_step`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
from torch import nn

from .data import ImageFolder, SyntheticImages, build_loader, set_epoch
from .data.folder import MAX_SIDE
from .data.synthetic import MEMORY_SHARE, physical_memory
from .errors import ConfigError, DataError
from .fileio import atomic_write
from .models import create_model, list_models, training_bytes
from .recipe.config import Config, DataConfig, ModelConfig
from .recipe.data import DEFAULT_SIZE, DEFAULT_STATS, FOLDER_SIZE, folder_train_transform, infer_data, small_stem
from .recipe.kinds import FOLDER
from .optim.registry import DEFAULT_OPTIMIZER, OptimizerArgs, build_optimizer
from .train.device import resolve_device, sync
from .train.model import Model

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
MODES = ("train", "data", "both")
WAIT_WARN = 0.05  # data wait above 5% of the step is starvation


@dataclass
class BenchOptions:
    """What to measure; the CLI's argparse Namespace carries the same names."""

    model: str = "resnet50"
    image_size: Optional[int] = None  # None: with --data what `train` would use, else the model's size (224)
    channels: Optional[int] = None  # None: with --data the images', else 1 for the MNIST CNN, 3 otherwise
    batch_size: int = 32
    precision: str = "fp32"
    channels_last: bool = False
    compile: bool = False
    steps: int = 20
    warmup: int = 5
    data: Optional[str] = None
    workers: Sequence[int] = field(default_factory=lambda: [0, 2])
    mode: Optional[str] = None  # None: "both" when a data folder is given, else "train"
    num_classes: int = 1000
    device: Optional[str] = None  # None: cuda when available

    @classmethod
    def from_params(cls, params: Any) -> BenchOptions:
        """From a BenchOptions, a dict or any object with these attributes (unset/None ones take defaults)."""
        get = params.get if isinstance(params, dict) else lambda k: getattr(params, k, None)
        opts = cls(**{f.name: get(f.name) for f in fields(cls) if get(f.name) is not None})
        opts.mode = opts.mode or ("both" if opts.data else "train")
        if opts.precision not in PRECISIONS:
            raise ConfigError(f"precision {opts.precision!r} is not one of {', '.join(PRECISIONS)}",
                              "use fp32, bf16 or fp16")
        if opts.mode not in MODES:
            raise ConfigError(f"bench mode {opts.mode!r} is not one of {', '.join(MODES)}", "use train, data or both")
        if opts.mode != "train" and not opts.data:
            raise ConfigError(f"bench --mode {opts.mode} needs an image folder", "pass --data DIR (root/<class>/*.jpg)")
        size = opts.image_size or 1
        if min(opts.batch_size, opts.steps, size) < 1 or opts.warmup < 0 or min(opts.workers, default=0) < 0:
            raise ConfigError("batch size, steps and image size must be >= 1; warmup and workers >= 0",
                              "fix --batch-size/--steps/--image-size/--warmup/--workers")
        if size > MAX_SIDE or max(opts.steps, opts.warmup) > 1_000_000 or max(opts.workers, default=0) > 1024 \
                or opts.num_classes > 1_000_000:
            raise ConfigError("bench sizes are out of range (image size <= 8192, steps and warmup <= 1e6, "
                              "workers <= 1024, classes <= 1e6)", "fix --image-size/--steps/--warmup/--workers")
        if opts.channels not in (None, 1, 3):
            raise ConfigError(f"channels={opts.channels} is not 1 or 3", "use 1 (grayscale) or 3 (RGB)")
        opts.workers = sorted(set(opts.workers)) or [0]
        return opts

    def settle(self) -> None:
        """Fill what the data did not decide (the model's size and channels) and check one batch fits."""
        self.image_size = self.image_size or DEFAULT_SIZE.get(self.model, FOLDER_SIZE)
        self.channels = self.channels or (1 if self.model == "mnist_cnn" else 3)
        batch_bytes = 4 * self.batch_size * self.channels * self.image_size ** 2
        if batch_bytes > MEMORY_SHARE * physical_memory():
            raise ConfigError(f"one batch of {self.batch_size} images of {self.image_size} px takes "
                              f"{batch_bytes / 2**30:.1f} GiB, over {MEMORY_SHARE:.0%} of this machine's memory",
                              "lower --batch-size or --image-size")


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `torchboost bench` options (names match BenchOptions)."""
    d = BenchOptions()
    parser.add_argument("--model", default=d.model, help=f"one of {', '.join(list_models())}")
    parser.add_argument("--image-size", type=int, help="image side in pixels (default: with --data what `train` "
                        "would use, e.g. the native size of small images; else the model's, 224 for ResNets)")
    parser.add_argument("--batch-size", "-b", type=int, default=d.batch_size, help="images per step")
    parser.add_argument("--precision", choices=list(PRECISIONS), default=d.precision,
                        help="fp32; bf16 autocast; fp16 autocast with dynamic loss scaling")
    parser.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=d.channels_last,
                        help="NHWC memory format (faster convolutions on many CPUs and GPUs)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=d.compile,
                        help="torch.compile the model")
    parser.add_argument("--steps", type=int, default=d.steps, help="timed steps/batches (the median step is reported)")
    parser.add_argument("--warmup", type=int, default=d.warmup, help="untimed steps/batches first")
    parser.add_argument("--data", help="image folder (root/<class>/*.jpg or root/train/<class>/*.jpg)")
    parser.add_argument("--workers", type=_int_list, default=d.workers, help="DataLoader worker counts, e.g. 0,2,4")
    parser.add_argument("--mode", choices=MODES, help="train (synthetic), data, both (default: both with --data)")
    parser.add_argument("--num-classes", type=int, default=d.num_classes, help="classes of the classifier")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda when available)")
    parser.add_argument("--json", help="also write the result as JSON to this file")


def build_model(opts: BenchOptions, device: torch.device,
                optimizer: Optional[Callable[[nn.Module], torch.optim.Optimizer]] = None) -> Model:
    """torchboost's Model with the options' fast paths; `optimizer(net)` defaults to the registry's SGD (the
    fused momentum SGD `torchboost train` builds)."""
    opts.settle()
    channels = opts.channels
    kw = {"image_size": opts.image_size} if opts.model == "mnist_cnn" else {"small_input": small_stem(opts.model,
                                                                                                    opts.image_size)}
    need = training_bytes(opts.model, opts.num_classes, channels, **kw)
    if need > MEMORY_SHARE * physical_memory():
        raise ConfigError(f"{opts.model} at {opts.image_size} px with {opts.num_classes} classes needs "
                          f"{need / 2**30:.1f} GiB to train, over {MEMORY_SHARE:.0%} of this machine's memory",
                          "lower --image-size (or use a ResNet, whose size does not grow with the image)")
    net = create_model(opts.model, num_classes=opts.num_classes, in_chans=channels, **kw).to(device)
    opt = optimizer(net) if optimizer else build_optimizer(DEFAULT_OPTIMIZER, net, OptimizerArgs(lr=1e-3))
    dtype = PRECISIONS[opts.precision]
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None  # fp16 needs loss scaling
    # check_every: the host reads the loss's finiteness every 50 updates, as `torchboost train` does at its log
    # interval; a read per update would drain a GPU's queue each step and measure that instead
    return Model(net, nn.CrossEntropyLoss(), opt, device=device, amp_dtype=dtype, grad_scaler=scaler,
                 channels_last=opts.channels_last, input_norm=DEFAULT_STATS[channels],
                 compile="default" if opts.compile else "none", check_every=50)


def make_step(opts: BenchOptions, device: torch.device,
              optimizer: Optional[Callable[[nn.Module], torch.optim.Optimizer]] = None
              ) -> tuple[Callable[[], None], Model]:
    """(one training update on a fixed synthetic batch, the Model). The batch is uint8 already on the
    device and normalized there by the step (data.normalize_on_device), so only the step is measured."""
    model = build_model(opts, device, optimizer)
    data = SyntheticImages(opts.batch_size, opts.num_classes, opts.channels, opts.image_size, uint8=True)
    x, y = (t.to(device) for t in data.__getitems__(range(opts.batch_size)))
    counter = itertools.count()
    return (lambda: model.train_step([(x, y)], next(counter))), model


def time_steps(step: Callable[[], None], steps: int, warmup: int, device: torch.device) -> list[float]:
    """Wall seconds of each of `steps` calls, after `warmup` untimed ones (compilation, allocator, autotune)."""
    for _ in range(warmup):
        step()
    sync(device)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
    return times


def folder_dataset(opts: BenchOptions) -> tuple[DataConfig, ImageFolder]:
    """The folder through the training transform `train` would use for it (size, channels and augmentation
    inferred from the images and the model as a run does; draft-mode JPEG decoding), shipping uint8 batches.
    Fills opts.image_size and opts.channels with what was decided."""
    root = Path(opts.data)
    root = root / "train" if (root / "train").is_dir() else root
    if not root.is_dir():
        raise DataError(f"data folder {root} does not exist", "pass --data DIR (root/<class>/*.jpg)")
    cfg = Config(model=ModelConfig(name=opts.model),
                 data=DataConfig(dataset=FOLDER, path=str(root), image_size=opts.image_size, channels=opts.channels,
                                 normalize_on_device=True))
    d = infer_data(cfg, train_root=root)
    opts.image_size, opts.channels = d.image_size, d.channels
    ds = ImageFolder(root, folder_train_transform(d, opts.model))
    if len(ds) < opts.batch_size:
        raise DataError(f"{root} has {len(ds)} images, fewer than one batch of {opts.batch_size}",
                        "use a smaller --batch-size or a folder with more images")
    return d, ds


def _cycle(loader: Any) -> Iterator:
    for epoch in itertools.count():  # small folders: keep going over epochs (persistent workers stay up)
        set_epoch(loader, epoch)
        yield from loader


def data_rate(ds: ImageFolder, opts: BenchOptions, workers: int, pin: bool = False) -> float:
    """Images/s the loader delivers with `workers` processes, after `warmup` batches (worker start-up)."""
    batches = _cycle(build_loader(ds, opts.batch_size, True, workers=workers, pin_memory=pin))
    for _ in range(max(1, opts.warmup)):
        next(batches)
    t0 = time.perf_counter()
    for _ in range(opts.steps):
        next(batches)
    rate = opts.steps * opts.batch_size / (time.perf_counter() - t0)
    batches.close()  # drops the loader: its workers shut down now, not while the next count is timed
    return rate


def end_to_end(model: Model, ds: ImageFolder, opts: BenchOptions, workers: int) -> dict[str, float]:
    """The real loader feeding the step: images/s and the share of time spent waiting for batches."""
    device = model.device
    batches = _cycle(build_loader(ds, opts.batch_size, True, workers=workers, pin_memory=device.type == "cuda"))
    wait = total = 0.0
    for i in range(opts.warmup + opts.steps):
        t0 = time.perf_counter()
        batch = next(batches)
        t1 = time.perf_counter()
        model.train_step([batch], i)
        sync(device)
        if i >= opts.warmup:
            wait, total = wait + t1 - t0, total + time.perf_counter() - t0
    batches.close()
    return {"workers": workers, "images_per_s": opts.steps * opts.batch_size / total, "data_wait_share": wait / total}


def diagnose(step_ips: float, data_ips: dict[int, float], wait_share: Optional[float] = None,
             e2e_workers: Optional[int] = None) -> tuple[str, str]:
    """("data" | "step", advice): data-bound when the best worker count delivers fewer images/s than the step
    consumes. Worker needs are extrapolated linearly from the best count's per-worker rate."""
    best_w = max(data_ips, key=data_ips.get)
    best = data_ips[best_w]
    if best < step_ips:
        need = math.ceil(step_ips / (best / max(best_w, 1)))
        advice = (f"data-bound: the loader delivers {best:.1f} img/s at {best_w} workers but the step takes "
                  f"{step_ips:.1f} img/s; use about {need} workers (data.workers) on free cores, store images "
                  "near the training size (draft decoding then skips more work); on CUDA ship uint8 batches "
                  "(data.normalize_on_device=true) with pin_memory")
        return "data", advice
    advice = (f"step-bound: the loader has {best / step_ips:.1f}x headroom at {best_w} workers; speed up the step "
              "(--precision bf16 --channels-last on CUDA or CPUs with AVX-512-bf16/AMX; --compile on CUDA)")
    if wait_share is not None and wait_share > WAIT_WARN:
        why = ("with 0 workers loading runs between steps: use data.workers >= 1" if e2e_workers == 0 else
               "workers share CPU cores with the step: give the loader its own cores")
        advice += f"; but end to end the step waited {wait_share:.0%} of the time for data ({why})"
    return "step", advice


def run_bench(params: Any) -> tuple[dict[str, Any], str]:
    """Run what `params` (BenchOptions, argparse Namespace or dict) asks; returns (result dict, table)."""
    opts = BenchOptions.from_params(params)
    device = resolve_device(opts.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {opts.device} but this torch sees no CUDA device", "use --device cpu")
    data_cfg, ds = folder_dataset(opts) if opts.mode in ("data", "both") else (None, None)
    opts.settle()
    result: dict[str, Any] = {"options": asdict(opts), "device": str(device), "threads": torch.get_num_threads(),
                              "small_input": opts.model != "mnist_cnn" and small_stem(opts.model, opts.image_size)}
    if data_cfg is not None:
        result["data_config"] = {k: getattr(data_cfg, k) for k in ("path", "image_size", "channels", "augment",
                                                                   "random_shift")}
    model = None
    if opts.mode in ("train", "both"):
        step, model = make_step(opts, device)
        times = time_steps(step, opts.steps, opts.warmup, device)
        median = statistics.median(times)
        result["train"] = {"images_per_s": opts.batch_size / median, "step_s_median": median, "step_s": times}
    if ds is not None:
        rates = {w: data_rate(ds, opts, w, pin=device.type == "cuda") for w in opts.workers}
        result["data"] = [{"workers": w, "images_per_s": r} for w, r in rates.items()]
    if opts.mode == "both":
        # Only worker processes overlap loading with the step: feed it from the best count > 0 if measured.
        overlapped = {w: r for w, r in rates.items() if w > 0} or rates
        workers = max(overlapped, key=overlapped.get)
        result["both"] = end_to_end(model, ds, opts, workers)
        result["limiter"], result["advice"] = diagnose(result["train"]["images_per_s"], rates,
                                                       result["both"]["data_wait_share"], workers)
    return result, format_table(result)


def format_table(result: dict[str, Any]) -> str:
    o = result["options"]
    flags = [o["precision"], "channels_last" if o["channels_last"] else "NCHW", "compiled" if o["compile"] else "eager"]
    stem = " (small-input stem)" if result["small_input"] else ""
    lines = [f"torchboost bench: {o['model']}{stem} {o['image_size']}px batch {o['batch_size']} {' '.join(flags)} "
             f"on {result['device']} ({result['threads']} threads), {o['steps']} timed + {o['warmup']} warmup"]
    if "data_config" in result:
        d = result["data_config"]
        shift = f" by up to {d['random_shift']} px" if d["augment"] == "shift" else ""
        lines.append(f"data: {d['path']} as `train` reads it: {d['image_size']} px, {d['channels']} channel(s), "
                     f"augment {d['augment']}{shift}")
    if "train" in result:
        t = result["train"]
        lines.append(f"{'train step (synthetic)':<28}{t['images_per_s']:>10.1f} img/s  "
                     f"median {1e3 * t['step_s_median']:.1f} ms/step")
    for row in result.get("data", []):
        lines.append(f"{'data, ' + str(row['workers']) + ' workers':<28}{row['images_per_s']:>10.1f} img/s  "
                     "decode + augment")
    if "both" in result:
        b = result["both"]
        lines.append(f"{'both, ' + str(b['workers']) + ' workers':<28}{b['images_per_s']:>10.1f} img/s  "
                     f"data wait {b['data_wait_share']:.0%} of the time")
        lines.append(f"limiter: {result['limiter']} — {result['advice']}")
    return "\n".join(lines)


def cmd_bench(args: argparse.Namespace) -> int:
    """`torchboost bench`: print the table (and write JSON with --json)."""
    result, table = run_bench(args)
    print(table)
    if getattr(args, "json", None):
        atomic_write(args.json, json.dumps(result, indent=2))
    return 0
