"""Profiling and data-starvation accounting, as training callbacks.

`ProfilerCallback`: a few updates recorded with torch.profiler into a TensorBoard trace (`--profile`).
`DataStarvationMonitor`: on every run, data wait vs the whole update per epoch, and one warning (a note at the
default of 0 loader workers) with concrete advice when the wait exceeds 5% of the step. Times are the host's
from `Model.train`, which does not wait for the GPU after each update: once the GPU's bounded queue is full the
host's step time is paced by the device, and the data wait is the time the host spent getting the batch.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path
from typing import Any, Optional

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from torchboost.distributed import is_main as is_main_process
from torchboost.fileio import check_inside, make_dirs
from torchboost.train.state import Callback, TrainState


class ProfilerCallback(Callback):
    """Profile updates wait+warmup .. wait+warmup+active-1 (one cycle), write the trace to `directory`
    (open the `.pt.trace.json` in Perfetto, or `tensorboard --logdir DIR` with the torch-tb-profiler plugin)
    and print the top operators.

    The profiler is stopped as soon as the cycle is saved, so the rest of training runs without its
    overhead. Each rank writes its own trace file (named host_pid)."""

    def __init__(self, directory: str | Path, wait: int = 1, warmup: int = 1, active: int = 3,
                 row_limit: int = 15, record_shapes: bool = False, profile_memory: bool = False,
                 with_stack: bool = False) -> None:
        self.directory = Path(directory)
        self.wait, self.warmup, self.active = wait, warmup, active
        self.row_limit = row_limit
        self.options = dict(record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack)
        self.prof: Optional[profile] = None
        self.steps = 0
        self.table: Optional[str] = None  # the top-operator table, once the cycle is recorded

    def _recorded(self) -> int:
        return min(max(self.steps - self.wait - self.warmup, 0), self.active)

    def _on_ready(self, prof: profile) -> None:
        if not self._recorded():  # stopped during wait/warmup: torch would save a trace of warm-up noise
            return
        check_inside(self.directory / "trace.json")  # torch writes into the folder itself: no link out of the run
        tensorboard_trace_handler(str(self.directory))(prof)
        # GPU time is what matters on a GPU; on CPU the operators' own (self) CPU time.
        sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        self.table = prof.key_averages().table(sort_by=sort, row_limit=self.row_limit)

    def on_train_begin(self, state: TrainState) -> None:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        make_dirs(self.directory)
        self.prof = profile(activities=activities, on_trace_ready=self._on_ready,
                            schedule=schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=1),
                            **self.options)
        self.prof.start()

    def on_train_step_end(self, state: TrainState) -> None:
        if self.prof is None:
            return
        self.steps += 1
        self.prof.step()  # one profiler step per optimizer update
        if self.steps >= self.wait + self.warmup + self.active:
            self._finish(state)

    def on_train_end(self, state: TrainState) -> None:
        self._finish(state)

    def _finish(self, state: TrainState) -> None:
        if self.prof is None:
            return
        prof, self.prof = self.prof, None
        prof.stop()
        if not is_main_process():
            return
        if self.table is None:
            need = self.wait + self.warmup + self.active
            state.log(f"profiler: only {self.steps} updates ran, the schedule needs {need}; no trace written "
                      "(train longer or lower wait/warmup/active)")
            return
        state.log(f"profiler: {self._recorded()} updates traced into {self.directory} "
                  f"(view: {trace_viewer(self.directory)})\n{self.table}")


def trace_viewer(directory: Path) -> str:
    """How to open the trace with what is installed: TensorBoard shows it only through its profiler plugin."""
    if importlib.util.find_spec("torch_tb_profiler") is not None:
        return f"tensorboard --logdir {directory}"
    return "open the .pt.trace.json in https://ui.perfetto.dev or chrome://tracing"


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, e.g. under taskset or a container's cpuset)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def starvation_advice(loader: Any = None, decodes: Optional[bool] = None) -> list[str]:
    """What to change, specific to `loader` when it is a DataLoader. `decodes`: whether samples are decoded
    from image files (False for in-memory sets, where decode advice would mislead; None: not known)."""
    workers = getattr(loader, "num_workers", None)
    cuda, cores = torch.cuda.is_available(), usable_cores()
    if workers is None:
        tips = ["more loader workers (data.workers)", "persistent workers"]
        tips += ["pinned memory (data.pin_memory=true)"] if cuda else []
    else:
        if workers == 0:
            tips = [f"load in background processes: data.workers=N (this machine has {cores} cores)"]
        elif workers < cores:
            tips = [f"more loader workers (data.workers={workers} now, {cores} cores)"]
        else:  # more workers than cores only adds contention with the training step
            tips = [f"the {workers} loader workers already match the {cores} cores and compete with the training "
                    "step: lighter augmentation or more cores"]
        if workers and not getattr(loader, "persistent_workers", False):
            tips.append("persistent workers (no restart cost each epoch)")
        if cuda and not getattr(loader, "pin_memory", False):
            tips.append("pinned memory (data.pin_memory=true) for asynchronous host-to-GPU copies")
    if decodes is not False:
        # JPEGs already decode at reduced size (draft mode, data/transforms); other formats decode whole
        tips.append("decode less: store the images pre-resized to about data.image_size, or lower data.image_size")
    return tips


class DataStarvationMonitor(Callback):
    """Per-epoch summary of data wait vs update time, and one warning per run when the wait exceeds
    `threshold` of the update (a note instead with a loader of 0 workers: that is the default, not a setting
    the user got wrong). The first `warmup_steps` updates of each epoch (worker start-up, prefetch
    refill) count in the summary but not in the warning decision. The decision is taken after
    `check_after` judged updates, or at the end of the epoch if that comes first.

    The epoch's numbers are also put in `state.eval_results` (data_wait_ms, step_ms, data_wait_share), so
    `History` records them. The sums travel in checkpoints: a run resumed mid-epoch reports the whole epoch."""

    _SUMS = ("data", "step", "n", "judged_data", "judged_step", "judged_n")  # what a checkpoint carries

    def __init__(self, threshold: float = 0.05, loader: Any = None, check_after: int = 20,
                 warmup_steps: int = 1, decodes: Optional[bool] = None) -> None:
        self.threshold, self.loader, self.decodes = threshold, loader, decodes
        self.check_after, self.warmup_steps = check_after, warmup_steps
        self.warning: Optional[str] = None  # the warning this process printed
        self.warned = False
        self._reset()

    def _reset(self) -> None:
        self.data = self.step = 0.0
        self.n = 0
        self.judged_data = self.judged_step = 0.0
        self.judged_n = 0

    def on_train_epoch_begin(self, state: TrainState) -> None:
        if state.step_in_epoch == 0:  # not when resuming mid-epoch: the sums came from the checkpoint
            self._reset()

    def state_dict(self) -> dict:
        return {**{k: getattr(self, k) for k in self._SUMS}, "warned": self.warned}

    def load_state_dict(self, state: dict) -> None:
        """Restore from a checkpoint (untrusted): each sum a finite number, at least 0."""
        for k in self._SUMS:
            value = state[k]
            if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{k} {str(value)[:20]!r} is not a finite sum")
            setattr(self, k, value)
        self.warned = bool(state["warned"])  # one warning per run, a resumed run included

    def on_train_step_end(self, state: TrainState) -> None:
        self.data += state.data_time
        self.step += state.step_time
        self.n += 1
        if self.n > self.warmup_steps:
            self.judged_data += state.data_time
            self.judged_step += state.step_time
            self.judged_n += 1
            if self.judged_n >= self.check_after:
                self._check(state)

    def on_train_epoch_end(self, state: TrainState) -> None:
        if not self.n:
            return
        share = self.data / max(self.step, 1e-12)
        data_ms, step_ms = 1000 * self.data / self.n, 1000 * self.step / self.n
        state.eval_results.update(data_wait_ms=data_ms, step_ms=step_ms, data_wait_share=share)
        state.log(f"epoch: {state.epoch + 1} data wait {data_ms:.2f} ms of {step_ms:.2f} ms per update "
                  f"({100 * share:.1f}%), compute {step_ms - data_ms:.2f} ms")
        self._check(state)

    def _check(self, state: TrainState) -> None:
        if self.warned or not self.judged_n:
            return
        share = self.judged_data / max(self.judged_step, 1e-12)
        if share <= self.threshold:
            return
        data_ms, step_ms = 1000 * self.judged_data / self.judged_n, 1000 * self.judged_step / self.judged_n
        waited = (f"{data_ms:.1f} ms of each {step_ms:.1f} ms update ({100 * share:.0f}% > "
                  f"{100 * self.threshold:.0f}%) over {self.judged_n} updates")
        advice = "; ".join(starvation_advice(self.loader, self.decodes))
        if getattr(self.loader, "num_workers", None) == 0:
            # the tool's own default, not a mistake: said once as a note, with the setting that overlaps the two
            self.warning = (f"note: loading data takes {waited}: with data.workers=0 (the default) it runs in the "
                            f"training process, between updates. To overlap it with training: {advice}")
        else:
            self.warning = f"warning: training waits for data: {waited}. Try: {advice}"
        self.warned = True
        state.log(self.warning)
