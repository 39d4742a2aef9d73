"""Per-class results of `eval` and of the end of `train`: a plain-data report (per-class precision, recall
and F1, the confusion matrix, the most confused pairs with example files, the most confidently wrong files),
its files (per_class.csv, confusion.csv, confusion.png, per_class.json) and the lines printed about it.

The class count is input (a folder of 10,000 class folders): past MATRIX_CLASSES classes the K×K matrix is
neither built nor written (10,000 classes made a 200 MB confusion.csv): the report holds the TOP_CONFUSIONS
largest confusions instead, written as top_confusions.csv, and no picture. The picture is a report: a failure
to draw it is one warning line, never the end of a run (a file system refusal stays the one-line error every
write gives)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from torchboost.errors import OutputError, printable
from torchboost.escape import csv_cell
from torchboost.fileio import atomic_path, atomic_write, confine_writes, make_dirs
from torchboost.train.per_class import ClassTally, confusion_figure

PAIRS, EXAMPLES, WORST = 10, 3, 20  # confused pairs reported, example files per pair, most wrong files
MATRIX_CLASSES, TOP_CONFUSIONS = 1000, 1000  # the largest class count with a full matrix; pairs listed past it


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
        "confusion": tally.confusion().tolist() if len(classes) <= MATRIX_CLASSES else None,
        "top_confusions": None if len(classes) <= MATRIX_CLASSES else [
            {"true": classes[t], "predicted": classes[p], "count": n}
            for t, p, n in tally.confused_pairs(TOP_CONFUSIONS)],
        "confused_pairs": [{"true": classes[t], "predicted": classes[p], "count": n, "examples": examples(t, p)}
                           for t, p, n in tally.confused_pairs(PAIRS)],
        "worst": [{"file": files[i] if named else None, "index": i, "true": classes[t], "predicted": classes[p],
                   "probability": prob} for i, t, p, prob in tally.worst(WORST)],
    }


def write_per_class(report: dict, folder: Path, title: str, warn: Callable[[str], None]) -> list[Path]:
    """per_class.csv, confusion.csv (rows: true class, columns: predicted; past MATRIX_CLASSES,
    top_confusions.csv), confusion.png and per_class.json in `folder`, each written atomically, never through
    a link. A picture that cannot be drawn is said through `warn`, in one line."""
    classes, full = report["classes"], report["confusion"] is not None
    rows = io.StringIO()
    out = csv.writer(rows, lineterminator="\n")
    out.writerow(["class", "precision", "recall", "f1", "support"])
    out.writerows([csv_cell(r["class"]), f"{r['precision']:.6f}", f"{r['recall']:.6f}", f"{r['f1']:.6f}",
                   r["support"]] for r in report["per_class"])
    matrix = io.StringIO()
    out = csv.writer(matrix, lineterminator="\n")
    if full:
        out.writerow(["true \\ predicted", *map(csv_cell, classes)])
        out.writerows([csv_cell(c), *row] for c, row in zip(classes, report["confusion"]))
    else:
        out.writerow(["true", "predicted", "count"])
        out.writerows([csv_cell(p["true"]), csv_cell(p["predicted"]), p["count"]] for p in report["top_confusions"])
    with confine_writes(make_dirs(folder)):
        paths = [atomic_write(folder / "per_class.csv", rows.getvalue()),
                 atomic_write(folder / ("confusion.csv" if full else "top_confusions.csv"), matrix.getvalue()),
                 atomic_write(folder / "per_class.json", json.dumps(report, indent=1))]
        if full and _drawn(folder / "confusion.png", report["confusion"], classes, title, warn):
            paths.append(folder / "confusion.png")
    return paths


def _drawn(path: Path, matrix: list, classes: Sequence[str], title: str, warn: Callable[[str], None]) -> bool:
    """Whether the confusion picture was written to `path`; a drawing failure is one warning line."""
    import numpy as np

    try:
        with atomic_path(path) as tmp:
            confusion_figure(np.asarray(matrix), classes, tmp, title)
    except OutputError:  # disk full, permissions: the one-line error of every write
        raise
    except Exception as e:  # matplotlib's: a report never ends the run
        warn(f"warning: {printable(path)} not drawn ({type(e).__name__}: {printable(str(e).strip()[:200])}); "
             "the per-class files beside it are written")
        return False
    return True


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
