"""`TensorBoard`: training scalars as a TensorBoard event file (rank 0).

The events are written by the training process itself, not by torch's SummaryWriter: its background
thread dies on a full disk with a traceback of its own, and the error only reaches training at some later
call. Here each batch of scalars is appended in the caller's thread as it is logged (so curves are live),
and any OSError becomes one OutputError naming the folder.
"""

from __future__ import annotations

import io
import itertools
import os
import socket
import time
from pathlib import Path

from torchboost.distributed import is_main as is_main_process
from torchboost.fileio import check_inside, make_dirs, output_error
from torchboost.train.state import Callback, TrainState

_SERIAL = itertools.count()  # two event files opened in the same second by one process get two names


class EventFile:
    """An append-only TensorBoard event file of scalars."""

    def __init__(self, log_dir: str | Path) -> None:
        try:
            from tensorboard.compat.proto import event_pb2, summary_pb2
            from tensorboard.summary.writer.record_writer import RecordWriter
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("TensorBoard logging needs `pip install tensorboard`") from e
        self._event, self._summary, self._records = event_pb2.Event, summary_pb2.Summary, RecordWriter
        self.log_dir = Path(log_dir)
        # the name TensorBoard looks for: events.out.tfevents.<time>.<host>.<pid>.<serial>
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_SERIAL)}"
        self.path = self.log_dir / name
        make_dirs(self.log_dir)
        self._append([self._event(wall_time=time.time(), file_version="brain.Event:2")], mode="wb")

    def write(self, scalars: dict[str, float], step: int) -> None:
        """Append one event per scalar, all at `step`."""
        now = time.time()
        self._append([self._event(wall_time=now, step=step, summary=self._summary(
            value=[self._summary.Value(tag=tag, simple_value=float(value))])) for tag, value in scalars.items()])

    def _append(self, events: list, mode: str = "ab") -> None:
        try:
            with io.open(check_inside(self.path), mode) as f:
                writer = self._records(f)
                for event in events:
                    writer.write(event.SerializeToString())
        except OSError as e:
            raise output_error(self.log_dir, e) from e


class TensorBoard(Callback):
    """Scalars to TensorBoard (rank 0): train/loss and train/lr every `every` updates, every numeric epoch
    result as epoch/<name>. Without tensorboard installed, constructing it raises ImportError with the
    install command (never silently absent)."""

    def __init__(self, log_dir: str | Path, every: int = 10) -> None:
        self.writer = EventFile(log_dir) if is_main_process() else None
        self.every = every

    def on_train_step_end(self, state: TrainState) -> None:
        if self.writer and state.global_step % self.every == 0:
            self.writer.write({"train/loss": state.output.loss.item(),
                               "train/lr": state.model.optimizer.param_groups[0]["lr"]}, state.global_step)

    def on_train_epoch_end(self, state: TrainState) -> None:
        if self.writer:
            self.writer.write({f"epoch/{k}": v for k, v in state.eval_results.items() if isinstance(v, (int, float))},
                              state.epoch + 1)
