"""The race's files: race.json (every run's history, the summary, the settings) and race.png, validation top-1
against training seconds per optimizer at its chosen lr — the median over seeds where three or more ran (a
median of two is a curve neither seed followed), else each seed's own line; a run that diverged named where it
ended."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Sequence

import torch

from torchboost.errors import printable
from torchboost.escape import plot_label
from torchboost.fileio import atomic_path, atomic_write, confine_writes
from torchboost.plotting import pyplot
from torchboost.race.lanes import Lane
from torchboost.race.report import cpu_flags, fmt_target
from torchboost.train.device import device_name

MEDIAN_SEEDS = 3  # seeds a median line needs


def write_results(lanes: Sequence[Lane], summary: dict, meta: dict, out: Path) -> tuple[Path, Path]:
    """race.json (every run's per-epoch history, the summary, the settings) and race.png. The torch threads
    recorded are the runs' (`meta["threads"]`: a pooled report's files'), else this process's (a live race)."""
    runs = [{"optimizer": l.racer, "lr": l.lr, "seed": l.seed, "stopped": l.stopped, "history": l.history}
            for l in lanes]
    meta = {**meta, "torch": torch.__version__, "threads": meta.get("threads", torch.get_num_threads()),
            "cpu_flags": cpu_flags(), "device": device_name(lanes[0].device) if lanes else "cpu"}
    path = out / "race.json"
    with confine_writes(out):  # race.json or race.png a link out of the race's folder: refused, not followed
        atomic_write(path, json.dumps({"settings": meta, "summary": summary, "runs": runs}, indent=1,
                                   default=lambda v: None))
        return path, plot(lanes, summary, out / "race.png")


def _histories(lanes: Sequence[Lane], name: str, lr: float) -> tuple[list[list[dict]], int]:
    """The seeds' histories of `name` at `lr`, and how many evaluations every one of them ran (each seed
    evaluates at the same epochs, so the i-th rows of all seeds belong together)."""
    hist = [l.history for l in lanes if l.racer == name and l.lr == lr]
    return hist, min((len(h) for h in hist), default=0)


def median_curve(lanes: Sequence[Lane], name: str, lr: float) -> tuple[list[float], ...]:
    """(seconds, accuracy, lowest, highest) of `name` at `lr` over the evaluations EVERY seed ran: medians over
    the seeds of cumulative seconds and of validation top-1, and the accuracy's spread. It ends where the first
    seed stopped: past that a "median" would be of the seeds still running (`seed_tails` draws those)."""
    hist, shared = _histories(lanes, name, lr)
    cols = [[h[i] for h in hist] for i in range(shared)]
    accs = [[r["val_top_1_accuracy"] for r in c] for c in cols]
    return ([statistics.median(r["seconds"] for r in c) for c in cols], [statistics.median(a) for a in accs],
            [min(a) for a in accs], [max(a) for a in accs])


def seed_tails(lanes: Sequence[Lane], name: str, lr: float) -> list[tuple[list[float], list[float]]]:
    """(seconds, accuracy) of each seed that ran past the evaluations every seed ran, from the last shared one
    on (so its line starts where the median line ends); none when every seed ran as long."""
    hist, shared = _histories(lanes, name, lr)
    start = max(shared - 1, 0)
    return [([r["seconds"] for r in h[start:]], [r["val_top_1_accuracy"] for r in h[start:]])
            for h in hist if len(h) > shared]


FIGURE_TITLE = ("race: validation top-1 vs training seconds\nline: median over 3+ seeds while every seed runs "
                "(min-max shaded), thin: single seeds after; fewer seeds: each its own line\nx: median time to "
                "target (reached and held at the next evaluation)")


def race_figure(lanes: Sequence[Lane], summary: dict):
    """The race plot as a matplotlib Figure: validation top-1 vs training seconds, per optimizer at its chosen
    lr the median over MEDIAN_SEEDS or more seeds where every seed still runs (their spread shaded), each seed a
    thin line beyond that; with fewer seeds each seed's own line; a diverged run's last point named; the
    table's median time to each target it reached marked x; each target a dashed line. The y-axis reaches down
    to the lowest point of any curve or spread: a racer that stays low is in the picture."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.8))
    rows = next(iter(summary["targets"].values()))
    lowest = min(float(t) for t in summary["targets"])
    for name, row in rows.items():
        label = plot_label(f"{name} (lr {row['lr']:g})")
        runs = [l for l in lanes if l.racer == name and l.lr == row["lr"] and l.history]
        if len(runs) >= MEDIAN_SEEDS:
            xs, ys, lo, hi = median_curve(lanes, name, row["lr"])
            color = ax.plot(xs, ys, marker=".", label=label)[0].get_color()
            ax.fill_between(xs, lo, hi, color=color, alpha=0.15, lw=0)
            tails = seed_tails(lanes, name, row["lr"])
            for tx, ty in tails:
                ax.plot(tx, ty, color=color, lw=0.8, alpha=0.35)
            lowest = min([lowest, *lo, *(y for _, ty in tails for y in ty)])
        else:
            color = None
            for k, run in enumerate(runs):
                ys = [r["val_top_1_accuracy"] for r in run.history]
                color = ax.plot([r["seconds"] for r in run.history], ys, marker=".", lw=1, color=color,
                                label=label if k == 0 else None)[0].get_color()
                lowest = min(lowest, *ys)
        for run in runs:
            if run.stopped == "diverged":
                end = run.history[-1]
                ax.annotate(f"seed {run.seed} diverged", (end["seconds"], end["val_top_1_accuracy"]), fontsize=7,
                            color=color, va="top")
        for t, by_racer in summary["targets"].items():  # the table's own figure, where the table puts it
            if math.isfinite(by_racer[name]["median_seconds"]):
                ax.plot([by_racer[name]["median_seconds"]], [float(t)], "x", color=color, ms=7, mew=1.5)
    for t in summary["targets"]:
        ax.axhline(float(t), color="grey", lw=0.6, ls="--")
        ax.annotate(f"target {fmt_target(t)}", (0, float(t)), xycoords=("axes fraction", "data"), fontsize=7,
                    color="grey", va="bottom")
    ax.set_xlabel("training seconds")
    ax.set_ylabel("validation top-1")
    on = printable(summary.get("evaluated_on", "an unrecorded split"))[:90]
    ax.set_title(f"{FIGURE_TITLE}\ntop-1 on {on}", fontsize=8)
    ax.set_ylim(max(0.0, lowest - 0.03), 1.0)
    ax.legend()
    fig.tight_layout()
    return fig


def plot(lanes: Sequence[Lane], summary: dict, path: Path) -> Path:
    """`race_figure` saved as a PNG at `path`."""
    fig = race_figure(lanes, summary)
    plt = pyplot()

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")  # format: the temp name does not end in .png
    plt.close(fig)
    return path
