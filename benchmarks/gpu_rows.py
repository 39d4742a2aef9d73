"""The GPU rows of issue 43 (item 4), one stage per call, for benchmarks/gpu_checks.sh. Each stage appends its rows
(figure, target, PASS/FAIL/unsure/info, device) to OUT/rows.jsonl as soon as they are measured, so a stage cut off
by its timeout keeps what it had; `table` prints them all (and each stage's exit from OUT/stages.tsv).

    python3 benchmarks/gpu_rows.py STAGE --out DIR [--device cuda|cpu] [--small] [--budget SECONDS]

Every loop compared takes its batches from host memory (pinned CPU tensors on CUDA) and copies them in each
update: the plain loop with x.to(device, non_blocking=True), Model.train through TrainStep.to_device (the
same call; DevicePrefetcher only applies to JPEGs decoded on the device, the jpeg stage). A Model here is the
one `torchboost train -c RECIPE` builds (recipe.run.build_network and build_trainer: its optimizer, lr
schedule, loss, precision, train top-1, check_every = log_every), and Model.train runs with the callbacks that
command gives it (recipe.callbacks.build_callbacks: progress bar, LossMonitor, TimeMonitor,
DataStarvationMonitor) less those that write files at an epoch's end (checkpoints, history, TensorBoard, the
final test): a timed block is one Model.train call over a short epoch, where a real epoch (5,004 updates of
ImageNet) spreads those writes over thousands of updates. The block still pays each call's start and end
(the epoch's sums read, TimeMonitor's line); the plain loop's block ends with one read of its last loss.

  r50      rows 1-2: ResNet-50 224 px b256, the resnet50-imagenet-sgd recipe (bf16 autocast, channels_last,
           fused momentum SGD in one param group, label smoothing 0.1, cosine lr, check_every 100); the plain
           loop on the same network builder with torch's fused SGD at the Model's hyperparameters and a constant
           lr. 1a: Model.train / plain loop, both eager (>= 1.00x); 1b: Model.train with train.compile=default
           / the plain loop over torch.compile(network), both compiled (>= 1.00x); 2: Model.train compiled /
           eager (>= 1.20x); 1c: img/s of each (info). Compile times are printed; the eager rows are written
           before anything compiles
  thor     row 4: ResNet-20 b128 28 px, the resnet20-mnist5k recipe with optim.name=thor (THOR's defaults:
           frequency 100) vs as it is (SGD), lr 0.01 for both; Model.train epochs of 100 updates, each holding
           exactly one THOR refresh (<= 1.15x). --thor-compile builds both with train.compile
  syncs    row 5: host synchronisations per 100 updates (torch.cuda.set_sync_debug_mode): TrainStep check_every
           1 and 50, nonfinite=skip (max_nonfinite_steps=10), fp16 autocast + GradScaler, and the
           resnet20-mnist5k(-thor) recipes' Model (target <= 2 x ceil(100 / check_every); the sites are printed)
  graphs   (optional) ResNet-20 b128 28 px, resnet20-mnist5k recipe: eager / train.compile=cudagraphs Model.train
           (>= 2x)
  factors  (optional) THOR's factor products (optim.thor.factors.gram: fp16 tensor cores, fp32 result) vs strict
           fp32, TF32 (set_float32_matmul_precision('high'), scoped and restored) and bf16 bmm (its fp32->bf16
           cast included): time, and error against float64
  jpeg-rows  row 3: the rows of benchmarks/gpu_jpeg.py's output (--log FILE)
  table    the final table from OUT/rows.jsonl and OUT/stages.tsv

Every ratio comes from ROUNDS (10) interleaved rounds: one block of each variant per round, the order rotated
every round (A B, B A, ...; A B C, B C A, C A B, ...), each block synchronised at both ends; the row gives the
median of the per-round ratios with [min, max] and the rounds, and judges the median. --budget is the stage's
deadline: blocks shrink (fewer updates) so that the rounds fit it, and a round that would end past it is not
started; a row with fewer than ROUNDS rounds is "unsure", neither PASS nor FAIL. --small shrinks every size for
a CPU smoke test (DEVICE=cpu SMALL=1 bash benchmarks/gpu_checks.sh); CUDA-only parts then print "skipped: no
CUDA". Over 400 lines: one file per lent-GPU run keeps what a row measures next to the row.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import statistics
import sys
import time
import traceback
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

ROUNDS = 10  # interleaved rounds per ratio: fewer decide nothing (a 3-4% effect needs them; issue 43)
MNIST5K_TRAIN = 4000  # mnist5k's training split (data/builtin.py): 31 updates an epoch at batch 128
IMAGENET_TRAIN = 1_281_167  # the length of the recipes' schedules: 5,004 updates an epoch at batch 256
MEASURED = ("r50", "thor", "syncs", "graphs", "factors")
# every recipe here: nothing written at an epoch's end (see the module's docstring), and the classifier and input
# the data would set
QUIET = ("train.loggers=[]", "train.test_at_end=false")
MNIST = ("model.num_classes=10", "model.in_chans=1")
# resnet50-imagenet-sgd with one param group (a plain loop's optimizer) and a folder it never reads
R50 = ("data.path=/nonexistent", "model.num_classes=1000", "model.in_chans=3", "optim.decay_bn_and_bias=true")


class Run:
    """The stage's output folder, device, size and deadline; `emit` writes one row."""

    def __init__(self, args: argparse.Namespace, stage: str) -> None:
        self.out, self.small, self.stage, self.args = Path(args.out), args.small, stage, args
        self.out.mkdir(parents=True, exist_ok=True)
        self.deadline = time.perf_counter() + args.budget
        self.device_name = args.device
        if stage in MEASURED:
            import torch

            from torchboost.train.device import device_name
            self.device = torch.device(args.device)
            self.cuda = self.device.type == "cuda"
            if args.device.startswith("cuda") and not torch.cuda.is_available():
                raise SystemExit("--device cuda, but this torch sees no CUDA device (DEVICE=cpu for a smoke test)")
            self.device_name = device_name(self.device) if self.cuda else \
                f"cpu ({torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads)"

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def emit(self, key: str, row: str, figure: str, target: str = "info", ok: bool | None = None,
             value: float | None = None, verdict: str = "") -> None:
        verdict = verdict or ("info" if ok is None else ("PASS" if ok else "FAIL"))
        rec = {"key": key, "row": row, "figure": figure, "target": target, "pass": verdict,
               "device": self.device_name, "stage": self.stage, "value": value}
        with open(self.out / "rows.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        print(f"ROW {key} | {row} | {figure} | {target} | {verdict} | {self.device_name}", flush=True)

    def skip(self, key: str, row: str, why: str) -> None:
        self.emit(key, row, f"skipped: {why}", "-", verdict="skip")


@contextmanager
def guarded(run: Run, key: str, row: str) -> Iterator[None]:
    """A failing part becomes a FAIL row (its error in one line) and the stage goes on to the next part."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - reported, then the next part runs
        traceback.print_exc()
        msg = str(e).splitlines()[0][:160] if str(e) else ""
        run.emit(key, row, f"error: {type(e).__name__}: {msg}".replace("|", "/"), "runs", False)


# --- timing ---------------------------------------------------------------------------------------------------
def block(step: Callable[[], Any], n: int, device: Any) -> float:
    """Seconds per call of `n` calls of `step`, synchronised at both ends."""
    from torchboost.train.device import sync

    sync(device)
    t = time.perf_counter()
    for _ in range(n):
        step()
    sync(device)
    return (time.perf_counter() - t) / n


def interleave(run: Run, steps: dict[str, Callable[[], Any]], n: int = 1, rounds: int = ROUNDS,
               reserve: float = 0.0) -> dict[str, list[float]]:
    """Per-call seconds of each step: `rounds` rounds of one `n`-call block each, the order rotated every round.
    A round that would end past the deadline (less `reserve`) is not started: its rows then say "unsure"."""
    names, times = list(steps), {k: [] for k in steps}
    start = time.perf_counter()
    for r in range(rounds):
        if r and run.left() - reserve < 1.2 * (time.perf_counter() - start) / r:
            print(f"deadline: {r} of {rounds} rounds ran", flush=True)
            break
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(block(steps[name], n, run.device))
    print(f"{len(times[names[0]])} interleaved rounds of {n}-call blocks: " + ", ".join(
        f"{k} {1e3 * statistics.median(v):.2f} ms" for k, v in times.items()), flush=True)
    return times


def ratio(times: dict[str, list[float]], num: str, den: str) -> tuple[float, float, float]:
    """Median, min, max over rounds of times[num] / times[den] (per-round pairs)."""
    r = [a / b for a, b in zip(times[num], times[den])]
    return statistics.median(r), min(r), max(r)


def fmt(r: tuple[float, float, float], extra: str = "") -> str:
    return f"{r[0]:.3f}x [{r[1]:.3f}, {r[2]:.3f}]" + (f"; {extra}" if extra else "")


def ms(times: dict[str, list[float]], name: str, per: int = 1) -> float:
    """Median milliseconds of one of `per` updates in a block of `name`."""
    return 1e3 * statistics.median(times[name]) / per


def emit_ratio(run: Run, key: str, row: str, times: dict[str, list[float]], num: str, den: str, target: float,
               at_most: bool = False, note: str = "") -> None:
    """The row of times[num] / times[den]: median over the rounds [min, max], the median judged against
    `target` (at least, or at most), "unsure" with fewer than ROUNDS rounds."""
    r = ratio(times, num, den)
    rounds = len(times[num])
    ok = r[0] <= target if at_most else r[0] >= target
    run.emit(key, row, fmt(r, f"{rounds} rounds" + (f"; {note}" if note else "")),
             f"{'<=' if at_most else '>='} {target:.2f}x", ok, r[0], "" if rounds >= ROUNDS else "unsure")


def warm(step: Callable[[], Any], n: int, device: Any) -> list[float]:
    """Seconds of each of `n` warm-up calls (the first includes compiling, cuDNN's search, allocations)."""
    return [block(step, 1, device) for _ in range(n)]


def updates_per_block(run: Run, per_update: float, variants: int, most: int, share: float = 1.0) -> int:
    """Updates in each timed block: `most`, or fewer (2 at least) where ROUNDS rounds of `variants` blocks would
    not end within `share` of the time left."""
    fit = int(share * (run.left() - 3) / (1.2 * ROUNDS * variants * max(per_update, 1e-6)))
    return max(2, min(most, fit))


def dynamo_stats() -> str:
    """What torch.compile did so far (graphs, recompiles): a recompiling step shows here, not only in its time."""
    try:
        from torch._dynamo.utils import counters

        return "dynamo " + ", ".join(f"{k} {v}" for k, v in {**counters["stats"], **{
            f"recompiles({k})": v for k, v in counters["recompiles"].items()}}.items())
    except Exception as e:  # noqa: BLE001 - a private counter; its absence costs only this line
        return f"dynamo counters unavailable ({type(e).__name__})"


def usable(run: Run, fns: dict[str, Callable[[], Any]], warmups: int, required: tuple[str, ...] = ()
           ) -> dict[str, Callable[[], Any]]:
    """Warm each variant up; one that raises is reported and left out (a required one ends the stage)."""
    kept = {}
    for name, fn in fns.items():
        try:
            warm(fn, warmups, run.device)
            kept[name] = fn
        except Exception as e:  # noqa: BLE001 - the other variants still run
            if name in required:
                raise
            traceback.print_exc()
            print(f"{name}: left out: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
    return kept


def smoke_compile(run: Run) -> None:
    """--small on the CPU: torch.compile through aot_eager (dynamo and AOTAutograd, no code generation), so the
    smoke test runs the compiled code paths in seconds instead of minutes of C++ compiling on 2 cores."""
    import torch

    if run.cuda or not run.small or getattr(torch.compile, "smoke", False):
        return
    real = torch.compile

    def compile_(fn: Any = None, *, mode: Any = None, backend: Any = None, **kw: Any) -> Any:
        return real(fn, backend="aot_eager", **kw)
    compile_.smoke = True  # type: ignore[attr-defined]
    torch.compile = compile_  # type: ignore[assignment]
    print("torch.compile: backend aot_eager (CPU smoke test)")


# --- what every timed loop is made of -------------------------------------------------------------------------------
def host_batches(run: Run, shape: tuple[int, ...], classes: int, count: int = 2) -> list[tuple[Any, Any]]:
    """`count` (images, labels) batches in host memory, pinned on CUDA (as a loader with pin_memory hands them
    over), so that every update copies its batch to the device."""
    import torch

    torch.manual_seed(0)
    out = []
    for _ in range(count):
        x, y = torch.randn(shape), torch.randint(0, classes, (shape[0],))
        out.append((x.pin_memory(), y.pin_memory()) if run.cuda else (x, y))
    return out


def epoch_of(batches: Sequence[Any], updates: int) -> list[Any]:
    """An epoch of `updates` batches, cycling through `batches`."""
    return [batches[i % len(batches)] for i in range(updates)]


def recipe_model(run: Run, recipe: str, overrides: Sequence[str], train_images: int) -> tuple[Any, Any]:
    """(Model, Config) as `torchboost train -c RECIPE --set OVERRIDES` builds them (recipe.run.build_network and
    build_trainer) for a training set of `train_images` (the schedule's length)."""
    import torch

    from torchboost.distributed import DistInfo
    from torchboost.recipe.load import load_config
    from torchboost.recipe.run import build_network, build_trainer

    cfg = load_config(recipe, [*QUIET, *overrides])
    per_epoch = train_images // cfg.data.batch_size
    info = DistInfo(device=run.device)
    torch.manual_seed(0)
    net, hooks = build_network(cfg, None, run.device, per_epoch, info, print)
    model, _ = build_trainer(cfg, None, net, hooks, run.device, per_epoch, info)
    ts = model.train_step
    print(f"{recipe} {' '.join(overrides)}: {cfg.model.name}, {type(model.optimizer).__name__} "
          f"({len(model.optimizer.param_groups)} group(s)), amp {model.autocast_dtype}, check_every "
          f"{ts.check_every}, compile {ts.options.compile}, undo on device {ts.masks_on_device}", flush=True)
    return model, cfg


def trainer(run: Run, model: Any, cfg: Any, data: list[Any], log: list[str]) -> Callable[[], Any]:
    """One call: Model.train for one epoch of `data` with `torchboost train`'s callbacks less the file writers
    (the module's docstring says why); its log lines go to `log`."""
    from torchboost.recipe.callbacks import build_callbacks

    callbacks, ckpt = build_callbacks(cfg, run.out, data, None, log.append)
    callbacks = [c for c in callbacks if c is not ckpt]  # QUIET left the checkpoint as the only writer
    return lambda: model.train(1, data, callbacks=callbacks, log_fn=log.append)


def hand_loop(run: Run, model: Any, cfg: Any, compiled: bool = False) -> Callable[[list[Any]], float]:
    """The plain hand-written loop beside `model` (recipe_model's): the same network builder, torch's fused SGD
    at the Model's hyperparameters (constant lr), the recipe's loss and the Model's precision and memory format;
    each batch copied from host memory in its update; the epoch's last loss read at its end, as a hand loop
    prints it. compiled: over torch.compile(network), as a plain loop is compiled."""
    import torch
    import torch.nn.functional as F

    from torchboost.distributed import DistInfo
    from torchboost.recipe.run import build_network

    dev, dtype, smoothing = run.device, model.autocast_dtype, cfg.train.label_smoothing
    torch.manual_seed(0)
    net, _ = build_network(cfg, None, dev, 1, DistInfo(device=dev), print)
    net = net.to(memory_format=torch.channels_last)
    (g,) = model.optimizer.param_groups  # one group: R50's decay_bn_and_bias=true
    opt = torch.optim.SGD(net.parameters(), lr=g["lr"], momentum=g["momentum"], weight_decay=g["weight_decay"],
                          nesterov=g["nesterov"], fused=True)
    forward = torch.compile(net) if compiled else net

    def epoch(batches: list[Any]) -> float:
        for x, y in batches:
            x = x.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last)
            y = y.to(dev, non_blocking=True)
            with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
                loss = F.cross_entropy(forward(x), y, label_smoothing=smoothing)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss.item()
    return epoch


# --- rows 1-2: ResNet-50 ----------------------------------------------------------------------------------------
def stage_r50(run: Run) -> None:
    import torch

    # --small: ResNet-20 at 32 px (the code paths, in seconds on a CPU)
    size, batch, most, smaller = (32, 4, 3, ("model.name=resnet20",)) if run.small else (224, 256, 10, ())
    sets = (*R50, f"data.batch_size={batch}", *smaller)
    torch.backends.cudnn.benchmark = True
    host = host_batches(run, (batch, 3, size, size), 1000)
    eager, cfg = recipe_model(run, "resnet50-imagenet-sgd", sets, IMAGENET_TRAIN)
    plain = hand_loop(run, eager, cfg)
    tag = (f"{cfg.model.name} {size}px b{batch} {str(eager.autocast_dtype).replace('torch.', '')} channels_last, "
           f"fused SGD, batches copied from host memory")
    print(f"{tag}: cudnn.benchmark on for every loop; torch {torch.__version__}", flush=True)
    log: list[str] = []
    two = epoch_of(host, 2)
    first = {"plain": warm(lambda: plain(two), 2, run.device),
             "train": warm(trainer(run, eager, cfg, two, log), 2, run.device)}
    print("warm-up (2-update epochs): " + "; ".join(f"{k} " + ", ".join(f"{t:.2f}" for t in v) + " s"
                                                    for k, v in first.items()), flush=True)
    # the eager rows first, in a quarter of what is left: the compiled ones need their compiling time after them
    n = updates_per_block(run, max(v[-1] for v in first.values()) / 2, 2, most, share=0.25)
    data = epoch_of(host, n)
    times = interleave(run, {"plain": lambda: plain(data), "train": trainer(run, eager, cfg, data, log)})
    print("Model.train's last lines: " + " / ".join(log[-3:]), flush=True)
    emit_ratio(run, "1a", f"{tag}: Model.train (callbacks) speed / plain loop, both EAGER", times, "plain", "train",
               1.0, note=f"{n}-update epochs, {ms(times, 'train', n):.1f} vs {ms(times, 'plain', n):.1f} ms/update")
    rates = {f"{k} eager": batch * n / statistics.median(v) for k, v in times.items()}
    plain = None  # noqa: F841 - frees its network before the compiled ones are built
    if run.cuda:
        torch.cuda.empty_cache()
    with guarded(run, "2", f"{tag}: Model.train with train.compile=default"):  # the Model's compile failing
        r50_compiled(run, eager, sets, host, tag, most, rates)
    run.emit("1c", f"{tag}: img/s", ", ".join(f"{k} {v:.0f}" for k, v in rates.items()), "info", None)


def r50_compiled(run: Run, eager: Any, sets: tuple[str, ...], host: list[Any], tag: str, most: int,
                 rates: dict[str, float]) -> None:
    """Rows 1b and 2: Model.train with train.compile=default against the plain loop over torch.compile(network)
    and against the eager Model.train, in the same rounds. The Model compiles first (both rows need it), the
    plain loop only where the time left holds its compile (taken to be as long as the Model's) and the rounds."""
    row_1b = f"{tag}: Model.train (train.compile=default) speed / plain loop over torch.compile(net), both COMPILED"
    row_2 = f"{tag}: Model.train compiled (train.compile=default) / eager speed"
    if run.left() < (15 if run.small else 60):
        for key, row in (("1b", row_1b), ("2", row_2)):
            run.skip(key, row, f"{run.left():.0f} s left in the stage, too little to compile")
        return
    smoke_compile(run)
    two = epoch_of(host, 2)
    compiled, cfg = recipe_model(run, "resnet50-imagenet-sgd", (*sets, "train.compile=default"), IMAGENET_TRAIN)
    log: list[str] = []
    first = warm(trainer(run, compiled, cfg, two, log), 2, run.device)
    print(f"train.compile=default: first 2-update epoch (compiling) {first[0]:.1f} s, then {first[1]:.2f} s; "
          f"{dynamo_stats()}", flush=True)
    plain: Callable[[list[Any]], float] | None = None
    if run.left() > first[0] + 1.2 * ROUNDS * 3 * first[1]:
        with guarded(run, "1b", row_1b):
            loop = hand_loop(run, eager, cfg, compiled=True)
            t = warm(lambda: loop(two), 2, run.device)
            print(f"plain loop over torch.compile(net): first 2-update epoch (compiling) {t[0]:.1f} s, then "
                  f"{t[1]:.2f} s; {dynamo_stats()}", flush=True)
            plain = loop
    else:
        run.skip("1b", row_1b, f"{run.left():.0f} s left after the Model's {first[0]:.0f} s compile: too little "
                               "for the plain loop's and the rounds")
    n = updates_per_block(run, first[1] / 2, 2 if plain is None else 3, most)
    data = epoch_of(host, n)
    steps = {"train_c": trainer(run, compiled, cfg, data, log), "train": trainer(run, eager, cfg, data, [])}
    if plain is not None:
        steps["plain_c"] = lambda: plain(data)
    times = interleave(run, steps)
    print("compiled Model.train's last lines: " + " / ".join(log[-4:]) + f"; {dynamo_stats()}", flush=True)
    note = f"{n}-update epochs, compile {first[0]:.0f} s, {ms(times, 'train_c', n):.1f} vs "
    if plain is not None:
        emit_ratio(run, "1b", row_1b, times, "plain_c", "train_c", 1.0,
                   note=note + f"{ms(times, 'plain_c', n):.1f} ms/update")
    emit_ratio(run, "2", row_2, times, "train", "train_c", 1.2, note=note + f"{ms(times, 'train', n):.1f} ms/update")
    batch = len(host[0][1])
    rates.update({f"{k[:-2]} compiled": batch * n / statistics.median(v) for k, v in times.items() if k != "train"})


# --- row 4: THOR's update against SGD's -----------------------------------------------------------------------------
def stage_thor(run: Run) -> None:
    frequency = 10 if run.small else 100  # THOR's default; --small: the same code paths, a tenth of the updates
    mode = run.args.thor_compile
    how = "eager" if mode == "none" else f"train.compile={mode}"
    if mode != "none":
        smoke_compile(run)
    # one recipe, only the optimizer differs. lr 0.01 for both (an update costs the same at any lr): the rounds fit
    # two random batches for over a thousand updates, and a non-finite loss there would stop the stage
    common = (*MNIST, "optim.lr=0.01", f"train.compile={mode}", *(("data.batch_size=16",) if run.small else ()))
    sgd, sgd_cfg = recipe_model(run, "resnet20-mnist5k", common, MNIST5K_TRAIN)
    thor, thor_cfg = recipe_model(run, "resnet20-mnist5k", (*common, "optim.name=thor",
                                                            f"optim.thor.frequency={frequency}"), MNIST5K_TRAIN)
    batch = sgd_cfg.data.batch_size
    data = epoch_of(host_batches(run, (batch, 1, 28, 28), 10), frequency)  # one refresh in each THOR epoch
    log: list[str] = []
    steps = {"sgd": trainer(run, sgd, sgd_cfg, data, log), "thor": trainer(run, thor, thor_cfg, data, log)}
    row = (f"ResNet-20 b{batch} 28px update, THOR (defaults, frequency {frequency}) / SGD, resnet20-mnist5k recipe, "
           f"Model.train epochs of {frequency} updates ({how})")
    with guarded(run, "4", row):
        for step in steps.values():  # THOR's first update refreshes; cuDNN's choices; compiling
            warm(step, 1, run.device)
        layers, before = len(thor.optimizer.preconditioner.layers), thor.optimizer.counters["refreshes"]
        times = interleave(run, steps)
        refreshes = (thor.optimizer.counters["refreshes"] - before) / max(layers, 1) / len(times["thor"])
        print(f"{refreshes:.2f} refreshing updates per THOR epoch; last lines: " + " / ".join(log[-4:]), flush=True)
        emit_ratio(run, "4", row, times, "thor", "sgd", 1.15, at_most=True,
                   note=f"{ms(times, 'thor', frequency):.2f} vs {ms(times, 'sgd', frequency):.2f} ms/update, "
                        f"{refreshes:.2f} refresh per epoch")


# --- row 5: host synchronisations ---------------------------------------------------------------------------------
def count_syncs(run: Run, step: Callable[[], Any], updates: int) -> tuple[int, Counter]:
    """Host synchronisations in `updates` calls (after one untimed), and where the five most frequent come from."""
    import torch

    step()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(updates):
                step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    syncs = [w for w in seen if "synchroniz" in str(w.message)]
    return len(syncs), Counter(f"{Path(w.filename).name}:{w.lineno}" for w in syncs)


def updates_of(step: Any, batch: tuple[Any, Any]) -> Callable[[], Any]:
    """One update of TrainStep `step` on `batch` per call (copied from host memory by its to_device)."""
    k = itertools.count()
    return lambda: step([batch], next(k))


def stage_syncs(run: Run) -> None:
    import torch
    from torch import nn

    from torchboost.models import create_model
    from torchboost.train.step import TrainStep

    dev, batch, updates = run.device, (16 if run.small else 128), 100
    (host,) = host_batches(run, (batch, 1, 28, 28), 10, count=1)

    def train_step(**options: Any) -> tuple[TrainStep, Callable[[], Any]]:
        torch.manual_seed(0)
        net = create_model("resnet20", num_classes=10, in_chans=1).to(dev)
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4, fused=True)
        ts = TrainStep(net, nn.CrossEntropyLoss(), opt, device=dev, **options)
        return ts, updates_of(ts, host)

    def recipe(name: str) -> tuple[TrainStep, Callable[[], Any]]:
        model, _ = recipe_model(run, name, MNIST, MNIST5K_TRAIN)
        return model.train_step, updates_of(model.train_step, host)

    variants: list[tuple[str, str, Callable[[], tuple[Any, Callable[[], Any]]], int | None]] = [
        ("5a", "TrainStep check_every=1", lambda: train_step(check_every=1), None),
        ("5b", "TrainStep check_every=50", lambda: train_step(check_every=50), 50),
        ("5c", "TrainStep nonfinite=skip (max_nonfinite_steps=10), check_every=50",
         lambda: train_step(nonfinite="skip", max_nonfinite_steps=10, check_every=50), 50),
        ("5d", "TrainStep fp16 autocast + GradScaler, check_every=50",
         lambda: train_step(autocast_dtype=torch.float16, grad_scaler=torch.amp.GradScaler(dev.type),
                            check_every=50), 50),
        ("5e", "resnet20-mnist5k recipe's Model (SGD, check_every=10)", lambda: recipe("resnet20-mnist5k"), 10),
        ("5f", "resnet20-mnist5k-thor recipe's Model (THOR, check_every=10)",
         lambda: recipe("resnet20-mnist5k-thor"), None),
    ]
    for key, name, build, every in variants:
        row = f"host syncs per {updates} updates, ResNet-20 b{batch}, batch from pinned host memory: {name}"
        with guarded(run, key, row):
            ts, step = build()
            undo = getattr(ts, "masks_on_device", None)
            if not run.cuda:
                for _ in range(3):
                    step()
                run.skip(key, row, f"no CUDA (3 updates ran; undo on device {undo})")
                continue
            count, sites = count_syncs(run, step, updates)
            print(f"{name}: {count} syncs (undo on device {undo}); most frequent sites: {sites.most_common(5)}")
            target = "reference (~100)" if every is None and key == "5a" else (
                "info (refreshes)" if every is None else f"<= {2 * math.ceil(updates / every)} (O(100/{every}))")
            ok = None if every is None else count <= 2 * math.ceil(updates / every)
            run.emit(key, row, f"{count}" + (f"; top site {sites.most_common(1)[0][0]}" if count else ""), target,
                     ok, count)


# --- optional: CUDA graphs on ResNet-20 ----------------------------------------------------------------------------
def stage_graphs(run: Run) -> None:
    n = 3 if run.small else 50
    eager, cfg = recipe_model(run, "resnet20-mnist5k", MNIST, MNIST5K_TRAIN)
    batch = 16 if run.small else cfg.data.batch_size
    data = epoch_of(host_batches(run, (batch, 1, 28, 28), 10), n)
    row = f"ResNet-20 b{batch} 28px update (resnet20-mnist5k recipe, Model.train): eager / train.compile=cudagraphs"
    steps = {"eager": trainer(run, eager, cfg, data, [])}
    warm(steps["eager"], 2, run.device)
    smoke_compile(run)  # the CPU smoke test runs the compiled path through aot_eager
    with guarded(run, "6", row):
        graphs, _ = recipe_model(run, "resnet20-mnist5k", (*MNIST, "train.compile=cudagraphs"), MNIST5K_TRAIN)
        steps["cudagraphs"] = trainer(run, graphs, cfg, data, [])
        first = warm(steps["cudagraphs"], 3, run.device)
        print(f"compile=cudagraphs: first {n}-update epoch (compiling) {first[0]:.1f} s, then "
              + ", ".join(f"{t:.2f}" for t in first[1:]) + f" s; {dynamo_stats()}", flush=True)
        times = interleave(run, steps)
        if run.cuda:
            emit_ratio(run, "6", row, times, "eager", "cudagraphs", 2.0,
                       note=f"{ms(times, 'eager', n):.2f} vs {ms(times, 'cudagraphs', n):.2f} ms/update, "
                            f"compile {first[0]:.0f} s")
        else:
            run.skip("6", row, f"no CUDA (aot_eager on the CPU: {fmt(ratio(times, 'eager', 'cudagraphs'))})")


# --- optional: THOR's factor products ------------------------------------------------------------------------------
@contextmanager
def matmul_precision(precision: str) -> Iterator[None]:
    """torch.set_float32_matmul_precision for a scope ('highest': strict fp32; 'high': TF32), restored after."""
    import torch

    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def stage_factors(run: Run) -> None:
    import torch

    from torchboost.optim.thor.factors import gram

    dev = run.device
    rows = 4096 if run.small else 802_816  # ResNet-50's first stage at batch 256: 256 x 56 x 56 positions
    n = 2 if run.small else 10
    torch.manual_seed(0)
    x = torch.randn(5, 128, rows, device=dev) * torch.logspace(-6, 3, 128, device=dev)[None, :, None]
    out_dtype = run.cuda and hasattr(torch.ops.aten.bmm, "dtype")

    def strict() -> torch.Tensor:
        with matmul_precision("highest"):
            return torch.bmm(x, x.transpose(1, 2))

    def tf32() -> torch.Tensor:
        with matmul_precision("high"):
            return torch.bmm(x, x.transpose(1, 2))

    def bf16() -> torch.Tensor:
        b = x.to(torch.bfloat16)
        if out_dtype:
            return torch.bmm(b, b.transpose(1, 2), out_dtype=torch.float32)
        return torch.bmm(b, b.transpose(1, 2)).float()

    fns = {"gram": lambda: gram(x), "fp32": strict, "tf32": tf32, "bf16": bf16}
    fns = usable(run, fns, 2, required=("gram",))
    errs: dict[str, float] = {}
    with guarded(run, "7e", "factor products: max error vs float64"):
        xd = x.double()
        ref = torch.bmm(xd, xd.transpose(1, 2))
        del xd
        d = ref.diagonal(dim1=1, dim2=2).sqrt()
        norm = d[:, :, None] * d[:, None, :]
        errs = {k: ((f().double() - ref).abs() / norm).max().item() for k, f in fns.items()}
        del ref, norm
    times = interleave(run, fns, n)
    base = f"factors.gram ({'fp16 tensor cores, fp32 result' if run.cuda else 'CPU: plain bmm'}) speed /"
    for key, other in (("7b", "fp32"), ("7c", "tf32"), ("7d", "bf16")):
        if other not in times:
            run.emit(key, f"{base} {other} bmm", "error: the comparison failed to run (see checks.log)", "runs", False)
            continue
        label = {"fp32": "strict fp32 bmm", "tf32": "TF32 bmm (precision 'high')",
                 "bf16": "bf16 bmm (cast included)"}[other]
        r = ratio(times, other, "gram")
        run.emit(key, f"{base} {label}, {rows} rows",
                 fmt(r, f"{len(times['gram'])} rounds; {ms(times, 'gram'):.2f} vs {ms(times, other):.2f} ms"),
                 "info", None, r[0])
    if errs:
        run.emit("7e", f"factor products 5x128x128 over {rows} rows: max error vs float64 (/ sqrt(A_ii A_jj))",
                 ", ".join(f"{k} {v:.1e}" for k, v in errs.items()), "info", None, errs["gram"])


# --- row 3 and the table -------------------------------------------------------------------------------------------
def stage_jpeg_rows(run: Run) -> None:
    """Rows from gpu_jpeg.py's printed table ('folder  img/s  min  max  median [min, max]' per source, after a line
    naming its interleaved rounds): the folder's row always (a FAIL without it), the shards' where it ran."""
    log = Path(run.args.log)
    text = log.read_text(errors="replace") if log.is_file() else ""
    m = re.search(r"^device: \S+ \((.*?)\);", text, re.M)
    run.device_name = m.group(1) if m else run.device_name
    m = re.search(r"^(\S+) (\d+)px batch (\d+)", text, re.M)
    what = f"{m.group(1)} {m.group(2)}px b{m.group(3)}" if m else "ResNet-50 224px b256"
    m = re.search(r"(\d+) interleaved rounds", text)
    rounds = int(m.group(1)) if m else 0
    for key, name in (("3a", "folder"), ("3b", "shards")):
        row = (f"JPEG-fed training (data.decode=device, DevicePrefetcher) {name} / synthetic pinned-host batches, "
               f"img/s, {what} (gpu_jpeg.py)")
        t = re.search(rf"^{name}\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+([\d.]+) \[([\d.]+), ([\d.]+)\]", text, re.M)
        if t:
            r = (float(t.group(1)), float(t.group(2)), float(t.group(3)))
            run.emit(key, row, fmt(r, f"{rounds} rounds"), ">= 0.90", r[0] >= 0.90, r[0],
                     "" if rounds >= ROUNDS else "unsure")
        elif name == "folder":
            run.emit(key, row, f"no result in {log.name}", ">= 0.90", False)


def stage_table(run: Run) -> None:
    path, stages = run.out / "rows.jsonl", run.out / "stages.tsv"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    status = [line.split("\t") for line in stages.read_text().splitlines() if line.strip()] \
        if stages.is_file() else []
    have = {r["stage"] for r in rows} | {"jpeg" for r in rows if r["stage"] == "jpeg-rows"}
    for stage, rc, secs, limit in (s[:4] for s in status if len(s) >= 4):
        if rc != "0":
            why = f"timed out at {limit} s" if rc in ("124", "137") else f"exit {rc} after {secs} s"
            rows.append({"key": "-", "row": f"stage {stage}" + (" (rows above are what it measured)" if stage
                                                                   in have else ", no row measured"),
                         "figure": why, "target": "completes", "pass": "FAIL", "device": "-"})
    lines = ["| # | row | figure | target | pass | device |", "|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["key"], r["row"], r["figure"], r["target"], r["pass"], r["device"]]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    count = Counter(r["pass"] for r in rows)
    spent = ", ".join(f"{s[0]} {s[2]}/{s[3]} s{'' if s[1] == '0' else ' rc ' + s[1]}" for s in status if len(s) >= 4)
    lines.append("")
    lines.append(f"PASS {count['PASS']}, FAIL {count['FAIL']}, unsure (< {ROUNDS} rounds) {count['unsure']}, info "
                 f"{count['info']}, skip {count['skip']}; stages: {spent}")
    text = "\n".join(lines)
    (run.out / "table.md").write_text(text + "\n")
    print(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=[*MEASURED, "jpeg-rows", "table"])
    ap.add_argument("--out", required=True, help="folder of rows.jsonl / stages.tsv / table.md")
    ap.add_argument("--device", default="cuda", help="cuda or cpu")
    ap.add_argument("--small", action="store_true", help="tiny sizes for a CPU smoke test")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds this stage may take (the deadline)")
    ap.add_argument("--thor-compile", default="none", choices=["none", "default"],
                    help="thor: build both Models with this train.compile (default none: as the recipe runs)")
    ap.add_argument("--log", help="jpeg-rows: gpu_jpeg.py's output")
    args = ap.parse_args()
    run = Run(args, args.stage)
    start = time.perf_counter()
    {"r50": stage_r50, "thor": stage_thor, "syncs": stage_syncs, "graphs": stage_graphs, "factors": stage_factors,
     "jpeg-rows": stage_jpeg_rows, "table": stage_table}[args.stage](run)
    if args.stage in MEASURED:
        print(f"stage {args.stage} took {time.perf_counter() - start:.0f} s on {run.device_name}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
