"""Per-class results of `eval` and of the end of `train`: a plain-data report (per-class precision, recall
and F1, the confusion matrix, the most confused pairs with example files, the most confidently wrong files),
its files (per_class.csv, confusion.csv, confusion.png, per_class.json) and the lines printed about it."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Optional, Sequence

from torchboost.errors import printable
from torchboost.fileio import atomic_path, atomic_write, confine_writes, make_dirs
from torchboost.train.per_class import ClassTally, confusion_figure

PAIRS, EXAMPLES, WORST = 10, 3, 20  # confused pairs reported, example files per pair, most wrong files


def per_class_report(tally: ClassTally, classes: Sequence[str], files: Optional[Sequence[str]] = None) -> dict:
    """The report as plain data. `files`: the evaluated samples' file names in data order (folder data), for
    example files of each confused pair and the worst files; None where samples have none."""
    true, pred = tally.true, tally.pred
    scores = tally.scores()
    named = files is not None and len(files) == len(true)

    def examples(t: int, p: int) -> list[str]:
        return [files[i] for i in ((true == t) & (pred == p)).nonzero()[0][:EXAMPLES]] if named else []

    return {
        "classes": list(classes),
        "per_class": [{"class": c, "precision": s.precision, "recall": s.recall, "f1": s.f1, "support": s.support}
                      for c, s in zip(classes, scores)],
        "macro_f1": sum(s.f1 for s in scores) / max(len(scores), 1),
        "confusion": tally.confusion().tolist(),
        "confused_pairs": [{"true": classes[t], "predicted": classes[p], "count": n, "examples": examples(t, p)}
                           for t, p, n in tally.confused_pairs(PAIRS)],
        "worst": [{"file": files[i] if named else None, "index": i, "true": classes[t], "predicted": classes[p],
                   "probability": prob} for i, t, p, prob in tally.worst(WORST)],
    }


def write_per_class(report: dict, folder: Path, title: str) -> list[Path]:
    """per_class.csv, confusion.csv (rows: true class, columns: predicted), confusion.png and per_class.json in
    `folder`, each written atomically, never through a link."""
    classes = report["classes"]
    rows = io.StringIO()
    out = csv.writer(rows, lineterminator="\n")
    out.writerow(["class", "precision", "recall", "f1", "support"])
    out.writerows([printable(r["class"]), f"{r['precision']:.6f}", f"{r['recall']:.6f}", f"{r['f1']:.6f}",
                   r["support"]] for r in report["per_class"])
    matrix = io.StringIO()
    out = csv.writer(matrix, lineterminator="\n")
    out.writerow(["true \\ predicted", *map(printable, classes)])
    out.writerows([printable(c), *row] for c, row in zip(classes, report["confusion"]))
    with confine_writes(make_dirs(folder)):
        paths = [atomic_write(folder / "per_class.csv", rows.getvalue()),
                 atomic_write(folder / "confusion.csv", matrix.getvalue()),
                 atomic_write(folder / "per_class.json", json.dumps(report, indent=1))]
        with atomic_path(folder / "confusion.png") as tmp:
            import numpy as np

            confusion_figure(np.asarray(report["confusion"]), classes, tmp, title)
        paths.append(folder / "confusion.png")
    return paths


def summary_lines(report: dict, n: int = 5) -> list[str]:
    """What is printed: macro F1, the classes with the lowest recall, the most confused pairs (with an example
    file when the data has names)."""
    per = sorted(report["per_class"], key=lambda r: (r["recall"], r["class"]))
    lines = [f"per class: macro F1 {report['macro_f1']:.4f}; lowest recall: " + ", ".join(
        f"{printable(r['class'])} {r['recall']:.3f} (precision {r['precision']:.3f}, {r['support']} images)"
        for r in per[:n])]
    pairs = report["confused_pairs"][:n]
    if pairs:
        lines.append("most confused (true -> predicted): " + "; ".join(
            f"{printable(p['true'])} -> {printable(p['predicted'])} {p['count']}x"
            + (f" (e.g. {printable(p['examples'][0])})" if p["examples"] else "") for p in pairs))
    return lines


def folder_files(dataset: Any, skipped: int) -> Optional[list[str]]:
    """The file of each evaluated sample, in order, for a data set that lists them (an image folder), when no
    corrupt image was left out (which would shift the order); else None."""
    samples = getattr(dataset, "samples", None)
    if skipped or not isinstance(samples, list):
        return None
    return [str(path) for path, _ in samples]
