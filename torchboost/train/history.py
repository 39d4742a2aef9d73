"""`History`: the per-epoch record of a run, as history.jsonl, history.csv and history.png.

The rows are rewritten atomically after every epoch (a crash leaves the previous version, never half a
file; a failed plot never replaces a good one). The picture is redrawn when training ends and, during training,
after an epoch once `PLOT_EVERY_S` seconds have passed since it was last drawn: drawing takes ~0.5 s, most of an
epoch of a small run (a 15-epoch MNIST job spent longer drawing than training), and a picture at most that old is
as good to a user watching the run. A resumed run continues the history: rows past the resume
point are dropped, and the row of the checkpoint's own epoch is taken from the checkpoint when a kill
came before it was written. A damaged history.jsonl is set aside as history.jsonl.damaged with a warning,
keeping the rows before the damage.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from pathlib import Path
from typing import Callable

from torchboost.distributed import is_main as is_main_process
from torchboost.errors import OutputError, printable
from torchboost.fileio import atomic_path, atomic_write, output_error, read_regular, remove_stale_temps
from torchboost.plaindata import load_json
from torchboost.plotting import pyplot
from torchboost.train.state import Callback, TrainState

PLOTTED = (("train_loss", 0, "train"), ("val_loss", 0, "validation"),
           ("train_top_1_accuracy", 1, "train top-1"), ("val_top_1_accuracy", 1, "validation top-1"),
           ("val_top_5_accuracy", 1, "validation top-5"), ("val_ema_top_1_accuracy", 1, "validation top-1 (EMA)"))
PLOT_EVERY_S = 30.0


def read_history(path: Path) -> tuple[list[dict], int | None]:
    """The rows of a history.jsonl and the 1-based line number of the first damaged line (None: intact).
    A row is damaged when it is not a JSON object with an integer "epoch"; nothing after it is trusted."""
    rows = []
    for n, line in enumerate(read_regular(path).decode(errors="replace").splitlines(), 1):
        try:
            row = load_json(line)  # a line nested 100,000 deep, or of 5,000 digits: damaged, not a traceback
        except ValueError:
            return rows, n
        if not isinstance(row, dict) or not isinstance(row.get("epoch"), int):
            return rows, n
        rows.append(row)
    return rows, None


def epoch_row(state: TrainState, epoch: int) -> dict:
    """The row of `epoch` (1-based): its number, the update count and every numeric epoch result."""
    row = {"epoch": epoch, "global_step": state.global_step}
    row.update({k: v for k, v in state.eval_results.items() if isinstance(v, (int, float))})
    return row


def to_csv(rows: list[dict]) -> str:
    """CSV text of the rows; the header is the union of their keys in first-seen order (missing = empty)."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


class History(Callback):
    """history.jsonl (one JSON line per epoch), history.csv (the same rows) and history.png (loss and
    accuracy, train vs validation) in `directory`, written by rank 0."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.records: list[dict] = []
        self.drawn_at = time.monotonic()  # when history.png was last drawn (or training began)

    @property
    def path(self) -> Path:
        return self.directory / "history.jsonl"

    def on_train_begin(self, state: TrainState) -> None:
        main = is_main_process()
        self.drawn_at = time.monotonic()
        if main:
            remove_stale_temps(self.directory)
        rows, damaged_at = read_history(self.path) if self.path.exists() else ([], None)
        done = state.epoch  # epochs completed before this run (0 when not resumed)
        self.records = [r for r in rows if r["epoch"] <= done]
        repaired = done > 0 and bool(state.eval_results) and not any(r["epoch"] == done for r in self.records)
        if repaired:  # killed after the epoch's checkpoint, before its row: the checkpoint holds the results
            self.records.append(epoch_row(state, done))
        if damaged_at is not None and main:
            aside = self.path.with_name(self.path.name + ".damaged")
            try:
                os.replace(self.path, aside)
            except OSError as e:
                raise output_error(aside, e) from e
            state.log(f"warning: {self.path} is damaged at line {damaged_at}; moved it to {aside.name} and kept "
                      f"the {len(rows)} rows before the damage")
        if main and (repaired or damaged_at is not None):
            self.write(state.log)

    def on_train_epoch_end(self, state: TrainState) -> None:
        self.records.append(epoch_row(state, state.epoch + 1))
        if is_main_process():
            self.write(state.log, draw=time.monotonic() - self.drawn_at >= PLOT_EVERY_S)

    def on_train_end(self, state: TrainState) -> None:
        """The results after training (the test split's, `state.final_results`) join the last epoch's row."""
        if self.records and is_main_process():
            self.records[-1].update(state.final_results)
            self.write(state.log)

    def write(self, log: Callable[[str], None] = print, draw: bool = True) -> None:
        """Rewrite history.jsonl, history.csv and (with `draw`) history.png from `records`, each atomically. The
        picture is a report: a failure to draw it is one line through `log` (a file system refusal stays the
        error)."""
        atomic_write(self.path, "".join(json.dumps(r) + "\n" for r in self.records))
        atomic_write(self.directory / "history.csv", to_csv(self.records))
        if not draw:
            return
        self.drawn_at = time.monotonic()
        try:
            self.plot(self.directory / "history.png")
        except OutputError:
            raise
        except Exception as e:  # matplotlib's: the epoch's checkpoint is written, its row too
            log(f"warning: {printable(self.directory / 'history.png')} not drawn ({type(e).__name__}: "
                f"{printable(str(e).strip()[:200])})")

    def plot(self, path: Path) -> None:
        plt = pyplot()
        epochs = [r["epoch"] for r in self.records]
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        try:
            for key, i, label in PLOTTED:
                pts = [(r["epoch"], r[key]) for r in self.records if key in r]
                if pts:
                    axes[i].plot(*zip(*pts), marker="o", label=label)
            axes[0].set(xlabel="epoch", ylabel="loss", title="loss")
            axes[1].set(xlabel="epoch", ylabel="accuracy", title="accuracy (gap = overfitting)")
            for ax in axes:
                ax.grid(alpha=0.3)
                if ax.get_legend_handles_labels()[0]:
                    ax.legend()
                if epochs:
                    ax.set_xticks(epochs if len(epochs) <= 20 else epochs[:: max(len(epochs) // 10, 1)])
            fig.tight_layout()
            with atomic_path(path) as tmp:
                fig.savefig(tmp, dpi=100, format="png")  # format: the temp name does not end in .png
        finally:
            plt.close(fig)
