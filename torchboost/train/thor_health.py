"""THOR's health report during training: one summary line an epoch (and a warning line when a factor side or a
divisor is inert) and thor-health.jsonl, one JSON line per epoch with every layer's report
(`optim.thor.health`). Silent for optimizers without THOR's factors."""

from __future__ import annotations

import json
from pathlib import Path

from torchboost.distributed import is_main as is_main_process
from torchboost.errors import CheckpointError
from torchboost.fileio import atomic_write, read_regular
from torchboost.optim.thor.health import health_rows, health_summary, health_warning, thor_health
from torchboost.plaindata import load_json
from torchboost.train.state import Callback, TrainState

HEALTH_FILE = "thor-health.jsonl"


class ThorHealthMonitor(Callback):
    """Writes `directory`/thor-health.jsonl (rank 0) and logs the report's summary after each epoch."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / HEALTH_FILE
        self.records: list[dict] = []

    def on_train_begin(self, state: TrainState) -> None:
        """A resumed run keeps the rows of the epochs it continues from (a damaged line ends what is kept)."""
        self.records = []
        if state.epoch and self.path.is_file():
            for line in read_regular(self.path, CheckpointError).decode(errors="replace").splitlines():
                try:
                    row = load_json(line)  # a line nested past the parser's stack: damaged, not a traceback
                except ValueError:
                    break
                if isinstance(row, dict) and isinstance(row.get("epoch"), int) and row["epoch"] <= state.epoch:
                    self.records.append(row)

    def on_train_epoch_end(self, state: TrainState) -> None:
        report = thor_health(state.model.optimizer)
        if not report:
            return
        state.log(health_summary(report))
        warning = health_warning(report)
        if warning:
            state.log(warning)
        self.records.append({"epoch": state.epoch + 1, "layers": health_rows(report)})
        if is_main_process():
            atomic_write(self.path, "".join(json.dumps(r) + "\n" for r in self.records))
