"""Does every zoo network learn at its defaults? A new user's first run, measured for every name `create_model` knows.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/zoo_defaults.py --out benchmarks/results/zoo_defaults.json
    .venv/bin/python benchmarks/zoo_defaults.py --models resnet18 resnet20 --variants rgb --merge   # re-measure some

Each run is what a user types on a folder of their own, through the CLI in a child process:
`torchboost train --data DIR --set model.name=NAME --threads 1` — the default recipe, the network's folder defaults
(`torchboost.recipe.model_defaults`), 15 epochs on its schedule — stopped once its EPOCHS-th evaluation is in
history.jsonl: the first epochs of a default run, not a run squeezed into 3 epochs (whose schedule would
decay sooner). The data is generated, never one of the tests' folders: 4 classes (chance 0.25), one shape each —
disc, square, triangle, cross — at a random place and size over a noisy background; `rgb` also gives each class
its own colour (32 px, an easy task), `grey` has the shape alone (28 px, one channel). Recorded per network:
validation and training top-1 per epoch, the best validation top-1, the seconds to the EPOCHS-th evaluation,
and the folder defaults the run's note named. A network "learns" when its best validation top-1 in those
epochs reaches LEARNS (0.6; chance 0.25). Prints the machine, a table, and one headline line.

timm's names are not further networks here: `migrate.timm_names` maps timm's weight names onto the zoo networks
whose layout timm shares (timm's `regnetx_004` is a different network and is not in the zoo).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from shapes import SHAPES, draw_shape

REPO = Path(__file__).resolve().parents[1]
COLOURS = ((220, 50, 50), (50, 200, 60), (60, 80, 230), (230, 210, 40))  # rgb: one per class
VARIANTS = {"rgb": (32, "RGB"), "grey": (28, "L")}  # size, Pillow mode
LEARNS = 0.6


def draw(shape: int, size: int, mode: str, rng: np.random.Generator) -> Image.Image:
    """One image: a noisy background, one shape of random place and size; in rgb its class's colour (jittered),
    in grey a random bright level."""
    channels = 3 if mode == "RGB" else 1
    base = rng.uniform(20, 90, channels)
    pixels = np.clip(base + rng.normal(0, 15, (size, size, channels)), 0, 255).astype(np.uint8)
    img = Image.fromarray(pixels if channels == 3 else pixels[..., 0], mode)
    d = ImageDraw.Draw(img)
    r = rng.uniform(size * 0.22, size * 0.36)
    cx, cy = rng.uniform(r + 1, size - r - 1, 2)
    if mode == "RGB":
        fill = tuple(int(np.clip(v + rng.normal(0, 20), 0, 255)) for v in COLOURS[shape])
    else:
        fill = int(rng.uniform(170, 255))
    draw_shape(d, SHAPES[shape], cx, cy, r, fill)
    return img


def make_folder(root: Path, variant: str, per_class: int, val_per_class: int, seed: int = 2026) -> Path:
    """root/{train,val}/<shape>/*.png for `variant`."""
    size, mode = VARIANTS[variant]
    rng = np.random.default_rng(seed)
    for split, n in (("train", per_class), ("val", val_per_class)):
        for k, shape in enumerate(SHAPES):
            (root / split / shape).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                draw(k, size, mode, rng).save(root / split / shape / f"{i}.png")
    return root


def zoo() -> list[str]:
    from torchboost.models import list_models  # every name create_model knows
    return list_models()


def cli() -> list[str]:
    exe = Path(sys.executable).with_name("torchboost")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torchboost"]


def rows_of(history: Path) -> list[dict]:
    try:
        text = history.read_text()
    except OSError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip().endswith("}")]


def run(data: Path, out: Path, model: str, epochs: int, bound_s: float, extra: list[str]) -> dict:
    """Train `model` on `data` at its defaults (and the `extra` KEY=VALUE settings) until its `epochs`-th
    evaluation (or the run ends or overruns)."""
    argv = [*cli(), "train", "--data", str(data), "--set", f"model.name={model}", "--threads", "1", "-o", str(out),
            "--set", "train.progress_bar=false", *[a for item in extra for a in ("--set", item)]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    log = out.parent / (out.name + ".log")
    start = time.perf_counter()
    with open(log, "w") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=out.parent)
        rows: list[dict] = []
        while proc.poll() is None:
            rows = rows_of(out / "history.jsonl")
            if len(rows) >= epochs or time.perf_counter() - start > bound_s:
                break
            time.sleep(0.5)
        seconds = time.perf_counter() - start
        if proc.poll() is None:
            proc.terminate()  # the first epochs are what is measured: the rest of the default schedule is not
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    rows = rows_of(out / "history.jsonl")[:epochs]
    said = log.read_text(errors="replace")
    note = next((line for line in said.splitlines() if line.startswith("note:")), "")
    settings = re.search(r"settings for a folder: (.*?) \(each can be set", note)
    val = [round(r.get("val_top_1_accuracy", float("nan")), 4) for r in rows]
    return {"model": model, "val_top_1": val, "train_top_1": [round(r.get("train_top_1_accuracy", float("nan")), 4)
                                                               for r in rows],
            "val_loss": [round(r.get("val_loss", float("nan")), 4) for r in rows],
            "best_val_top_1": max(val) if val else None, "epochs_done": len(rows), "seconds": round(seconds, 1),
            "folder_defaults": settings.group(1).split(", ") if settings else [], "set": extra,
            "error": None if len(rows) >= epochs else said.strip().splitlines()[-1:] or ["no output"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=None, help="default: every name create_model knows")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--epochs", type=int, default=3, help="evaluations measured (of the default run's 15 epochs)")
    p.add_argument("--per-class", type=int, default=100, help="training images per class")
    p.add_argument("--val-per-class", type=int, default=25)
    p.add_argument("--bound-s", type=float, default=1200, help="stop a run that takes longer than this")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "zoo_defaults.json")
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting on top of the defaults (what a row measured without them: train.precise_bn=0)")
    p.add_argument("--keep", type=Path, default=None, help="write the data and runs (with each run's .log) here")
    p.add_argument("--size", type=int, default=None, help="images of this size instead of the variant's (rows "
                   "are recorded as VARIANT@SIZE)")
    p.add_argument("--merge", action="store_true", help="replace only the measured rows in --out's existing table")
    p.add_argument("--report", action="store_true", help="print --out's table and run nothing")
    args = p.parse_args()
    if args.report:
        return report(json.loads(args.out.read_text()))
    import torch  # after the arguments: --help needs no torch

    try:  # the benchmarks' one description of the CPU
        from torchboost.race.report import cpu_flags
    except ImportError:
        from torchboost.recipe.race_report import cpu_flags

    models = args.models or zoo()
    unknown = sorted(set(models) - set(zoo()))
    if unknown:
        p.error(f"not zoo names: {', '.join(unknown)}")
    machine = {"cpu_flags": cpu_flags(), "cpus": os.cpu_count(), "threads": 1, "torch": torch.__version__,
               "python": platform.python_version(), "load_average": [round(v, 2) for v in os.getloadavg()]}
    print(f"torch {torch.__version__}, {os.cpu_count()} cpus, 1 thread a run (--threads 1, OMP_NUM_THREADS=1), "
          f"CPU: {machine['cpu_flags']}, load {machine['load_average']}", flush=True)
    table = {"date": time.strftime("%Y-%m-%d"), "machine": machine,
             "task": {"classes": list(SHAPES), "chance": 1 / len(SHAPES), "per_class": args.per_class,
                      "val_per_class": args.val_per_class, "variants": {k: {"size": s, "mode": m}
                                                                      for k, (s, m) in VARIANTS.items()},
                      "epochs_measured": args.epochs, "learns": LEARNS,
                      "command": "torchboost train --data DIR --set model.name=NAME --threads 1 (stopped after "
                                 f"{args.epochs} evaluations)"},
             "results": {}}
    if args.merge and args.out.is_file():  # its rows and the diagnosis kept beside them
        kept = json.loads(args.out.read_text())
        table.update({key: kept[key] for key in ("results", "diagnosis") if key in kept})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="zoo-defaults-") as scratch:
        tmp = args.keep or Path(scratch)
        for variant in args.variants:
            size, mode = VARIANTS[variant]
            if args.size:
                VARIANTS[variant] = (args.size, mode)
                variant_key = f"{variant}@{args.size}"
            else:
                variant_key = variant
            data = Path(tmp) / f"shapes-{variant_key}"
            if not data.is_dir():
                make_folder(data, variant, args.per_class, args.val_per_class)
            for model in models:
                out = Path(tmp) / (f"{variant_key}-{model}" + "".join(f"+{e}" for e in args.extra).replace("/", "_"))
                shutil.rmtree(out, ignore_errors=True)  # this script's own run folder, from an earlier --keep
                row = run(data, out, model, args.epochs, args.bound_s, args.extra)
                row["chance"], row["size"] = 1 / len(SHAPES), VARIANTS[variant][0]
                table["results"].setdefault(variant_key, {})[model + "".join(f" --set {e}" for e in args.extra)] = row
                args.out.write_text(json.dumps(table, indent=1) + "\n")  # after every run: a long one may be cut
                print(f"  {variant_key:<4} {model:<18} val {row['val_top_1']} train {row['train_top_1']} "
                      f"{row['seconds']:.0f} s {row['error'] or ''}", file=sys.stderr, flush=True)
    return report(table)


def report(table: dict) -> int:
    """The table of `table`'s rows and the headline over the rows at the defaults (no --set); then the rows kept
    under "diagnosis" (the settings tried on the way, grouped by what they were tried on), without a headline."""
    epochs = table["task"]["epochs_measured"]
    for group, results in table.get("diagnosis", {}).items():
        print(f"\ndiagnosis: {group}")
        rows_table({"results": results})
    learned, total = rows_table(table)
    print(f"\n{learned} of {total} runs at their defaults reach validation top-1 >= {LEARNS} (chance 0.25) within "
          f"{epochs} epochs")
    return 0 if learned == total else 1


def rows_table(table: dict) -> tuple[int, int]:
    """Print `table`'s rows as Markdown; (rows at the defaults that learn, rows at the defaults)."""
    print("\n| data | model | folder defaults (+ --set) | val top-1 per epoch | train top-1 per epoch | best | "
          "seconds |")
    print("|---|---|---|---|---|---|---|")
    learned = total = 0
    for variant, rows in table["results"].items():
        for row in rows.values():
            ok = row["best_val_top_1"] is not None and row["best_val_top_1"] >= LEARNS
            if not row.get("set"):
                total += 1
                learned += ok
            best = "—" if row["best_val_top_1"] is None else f"{row['best_val_top_1']:.2f}"
            shown = ", ".join(row["folder_defaults"] + [f"+{e}" for e in row.get("set", [])]) or "—"
            print(f"| {variant} | {row['model']} | {shown} | {' '.join(f'{v:.2f}' for v in row['val_top_1'])} | "
                  f"{' '.join(f'{v:.2f}' for v in row['train_top_1'])} | {best if ok else f'**{best}**'} | "
                  f"{row['seconds']:.0f} |")
    return learned, total


if __name__ == "__main__":
    sys.exit(main())
