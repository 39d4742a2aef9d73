"""The fashion-speedrun recipe's choices, recomputed from the committed held-out runs (issue 56).

Each folder under benchmarks/results/fashion-speedrun-tuning/ is one `torchboost train -c fashion-speedrun
--set data.holdout=10000 --set train.eval_every=1 --set train.threads=1 [--set ...]` run, seed 0: its resolved
config.yaml and history.jsonl (10,000 training images held out, the test split unread). Prints what each run
changed from the recipe's choices, its held-out top-1 after every epoch and its training seconds (1 thread on a
busy machine: compare accuracies here, not seconds; the speedrun's seconds are measured by fashion_speedrun.py).

    .venv/bin/python benchmarks/speedrun_tuning.py
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent / "results" / "fashion-speedrun-tuning"
KEYS = (("model", "name"), ("optim", "name"), ("optim", "lr"), ("train", "epochs"), ("schedule", "mode"),
        ("train", "average"))


def main() -> None:
    print("| run | network | optimizer | lr | epochs | schedule | averaging | held-out top-1 by epoch | final | train s |")
    print("|---|---|---|---:|---:|---|---|---|---:|---:|")
    for run in sorted(ROOT.iterdir(), key=lambda p: int(p.name[1:])):
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines() if line.strip()]
        accs = [r["val_top_1_accuracy"] for r in rows if "val_top_1_accuracy" in r]
        values = " | ".join(str(cfg[a][b]) for a, b in KEYS)
        by_epoch = " ".join(f"{100 * a:.2f}" for a in accs)
        print(f"| {run.name} | {values} | {by_epoch} | {100 * accs[-1]:.2f} | "
              f"{sum(r['train_time_s'] for r in rows):.0f} |")


if __name__ == "__main__":
    main()
