"""Seconds to 93% and 94% Fashion-MNIST test top-1, side by side in one run on one machine (issue 56):

  (a) baseline  the PyTorch MNIST example pointed at Fashion-MNIST (`benchmarks/pytorch_mnist_example.py`);
  (b) folder    torchboost's default folder command, `torchboost train --data DIR`, on the 70,000 images written
                as PNG files (train/<class>/, test/<class>/; made once, outside the timing);
  (c) speedrun  `torchboost train -c fashion-speedrun` (its evaluation only at the end).

Every arm is a child process timed by this script's own stopwatch from its start: each evaluation's wall time is
when its line reaches the script (the example's JSON lines; torchboost's history.jsonl rows, polled), so loading,
compiling and evaluating count. An arm stops at its own end or once it has reached the highest target, and is cut
at --cap-s (then its time to a target it did not reach is "> cap"). Arms run one at a time, their order rotated
seed by seed (shared machines drift), each at --threads threads. The hit rate and the median and range of the
speedrun's whole command (its one evaluation is at the end) come from --seeds; the ratios from the medians.

    .venv/bin/python benchmarks/fashion_speedrun.py --arms speedrun --seeds 0 1 2 3 4 5 6 7 8 9
    .venv/bin/python benchmarks/fashion_speedrun.py --arms baseline folder speedrun --seeds 0 --cap-s 900

Writes every event to --out (JSON) and prints the machine, a table and the ratios.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TARGETS = (0.93, 0.94)
CLASSES = ("T-shirt_top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle_boot")


def cpu_flags() -> str:
    flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[-1].split("\n", 1)[0] if Path("/proc/cpuinfo").exists() else ""
    return " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in flags)


def write_folder(data: Path, out: Path) -> Path:
    """The IDX files as PNG images in out/{train,test}/<class>/<index>.png (arm b's data), once."""
    from PIL import Image

    if (out / "done").exists():
        return out
    for split, prefix in (("train", "train"), ("test", "t10k")):
        raw = gzip.open(data / f"{prefix}-images-idx3-ubyte.gz").read()
        images = np.frombuffer(raw, np.uint8, offset=16).reshape(-1, 28, 28)
        labels = np.frombuffer(gzip.open(data / f"{prefix}-labels-idx1-ubyte.gz").read(), np.uint8, offset=8)
        for k, name in enumerate(CLASSES):
            (out / split / name).mkdir(parents=True, exist_ok=True)
        for i, (img, label) in enumerate(zip(images, labels)):
            Image.fromarray(img).save(out / split / CLASSES[label] / f"{i}.png")
    (out / "done").write_text("")
    return out


def arm_command(arm: str, seed: int, args: argparse.Namespace, run_dir: Path) -> list[str]:
    tb = [str(REPO / ".venv" / "bin" / "torchboost")]
    threads = ["--threads", str(args.threads)]
    if arm == "baseline":
        return [sys.executable, str(REPO / "benchmarks" / "pytorch_mnist_example.py"), "--data", str(args.data),
                "--seed", str(seed + 1)]  # the example's own seed is 1
    if arm == "folder":
        return [*tb, "train", "--data", str(write_folder(args.data, args.folder)), *threads,
                "-o", str(run_dir), "--overwrite", "--set", f"train.seed={seed}", "--set", "train.progress_bar=false"]
    extra = [a for item in args.set for a in ("--set", item)]
    return [*tb, "train", "-c", "fashion-speedrun", "--data", str(args.data), *threads, "--set", f"train.seed={seed}",
            "-o", str(run_dir), "--overwrite", *extra]


def run_arm(arm: str, seed: int, args: argparse.Namespace) -> dict:
    """One child process: its evaluations as (seconds since its start, test top-1), its end and its last lines."""
    run_dir = args.work / f"{arm}-s{seed}"
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    events: list[tuple[float, float]] = []
    lines: list[str] = []
    start = time.perf_counter()
    proc = subprocess.Popen(arm_command(arm, seed, args, run_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, cwd=REPO)

    def read() -> None:
        for line in proc.stdout:
            lines.append(line.rstrip())
            if arm == "baseline" and line.startswith("{"):
                events.append((time.perf_counter() - start, json.loads(line)["test_accuracy"]))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    history, seen = run_dir / "history.jsonl", 0
    while proc.poll() is None:
        if arm != "baseline" and history.exists():
            rows = [json.loads(r) for r in history.read_text().splitlines() if r.strip()]
            for row in rows[seen:]:
                if "val_top_1_accuracy" in row:
                    events.append((time.perf_counter() - start, row["val_top_1_accuracy"]))
            seen = len(rows)
        wall = time.perf_counter() - start
        if wall > args.cap_s or any(acc >= max(TARGETS) for _, acc in events):
            proc.terminate()
            break
        time.sleep(0.2)
    proc.wait()
    wall = time.perf_counter() - start
    reader.join(timeout=10)
    if arm != "baseline" and history.exists():  # a row written in the last poll interval
        rows = [json.loads(r) for r in history.read_text().splitlines() if r.strip()]
        events += [(wall, row["val_top_1_accuracy"]) for row in rows[seen:] if "val_top_1_accuracy" in row]
    return {"arm": arm, "seed": seed, "wall_s": wall, "returncode": proc.returncode, "capped": wall > args.cap_s,
            "evaluations": events, "final": events[-1][1] if events else None, "tail": lines[-3:]}


def time_to(run: dict, target: float) -> float | None:
    return next((t for t, acc in run["evaluations"] if acc >= target), None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arms", nargs="+", default=["baseline", "folder", "speedrun"],
                   choices=["baseline", "folder", "speedrun"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cap-s", type=float, default=900.0, help="an arm still running after this is stopped")
    p.add_argument("--data", type=Path, default=Path("/usr/share/datasets/fashion-mnist"))
    p.add_argument("--folder", type=Path, default=Path("/tmp/fashion-png"), help="arm b's PNG folder (made once)")
    p.add_argument("--work", type=Path, default=Path("/tmp/fashion-speedrun-runs"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="passed to the speedrun arm")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "fashion_speedrun.json")
    args = p.parse_args()
    import torch

    machine = (f"torch {torch.__version__}, {os.cpu_count()} cpus, {args.threads} threads an arm, CPU: {cpu_flags()}, "
               f"{platform.processor() or platform.machine()}, load {[round(v, 2) for v in os.getloadavg()]}")
    print(machine, flush=True)
    if "folder" in args.arms:
        write_folder(args.data, args.folder)
    runs = []
    for k, seed in enumerate(args.seeds):
        order = args.arms[k % len(args.arms):] + args.arms[:k % len(args.arms)]
        for arm in order:
            run = run_arm(arm, seed, args)
            runs.append(run)
            hits = "  ".join(f"{t:.0%}: {time_to(run, t):.1f} s" if time_to(run, t) else f"{t:.0%}: -" for t in TARGETS)
            print(f"seed {seed} {arm:8s} wall {run['wall_s']:7.1f} s  final {run['final']}  {hits}", flush=True)
    summary = {}
    for arm in args.arms:
        mine = [r for r in runs if r["arm"] == arm]
        row = {"runs": len(mine), "wall_s": [r["wall_s"] for r in mine], "finals": [r["final"] for r in mine]}
        for t in TARGETS:
            times = [time_to(r, t) for r in mine]
            row[f"hits_{t}"] = sum(x is not None for x in times)
            row[f"median_s_{t}"] = statistics.median(x if x is not None else float("inf") for x in times)
        summary[arm] = row
    print("\n| arm | runs | median wall s (range) | finals median | to 93%: hits, median s | to 94%: hits, median s |")
    print("|---|---:|---|---:|---|---|")
    for arm, row in summary.items():
        finals = [f for f in row["finals"] if f is not None]
        print(f"| {arm} | {row['runs']} | {statistics.median(row['wall_s']):.1f} ({min(row['wall_s']):.1f}-"
              f"{max(row['wall_s']):.1f}) | {statistics.median(finals) if finals else '-'} | "
              f"{row['hits_0.93']}/{row['runs']}, {row['median_s_0.93']:.1f} | "
              f"{row['hits_0.94']}/{row['runs']}, {row['median_s_0.94']:.1f} |")
    if "speedrun" in summary:
        for arm in (a for a in summary if a != "speedrun"):
            for t in TARGETS:
                mine, theirs = summary["speedrun"][f"median_s_{t}"], summary[arm][f"median_s_{t}"]
                if mine != float("inf"):
                    bound = "> " if theirs == float("inf") else ""
                    theirs = args.cap_s if theirs == float("inf") else theirs
                    print(f"to {t:.0%}: speedrun {mine:.1f} s, {arm} {bound}{theirs:.1f} s: {bound}{theirs / mine:.1f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine, "args": {k: str(v) for k, v in vars(args).items()},
                                    "runs": runs, "summary": summary}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
