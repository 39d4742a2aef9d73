"""`Model(network, loss_fn, optimizer, metrics).train/eval/predict` — MindSpore's high-level API on torch.

The epoch loop lives here; everything about one update lives in `TrainStep` (override that, not this).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch
from torch import nn

from ..data.sampling import set_epoch
from ..errors import CheckpointError, ConfigError, TrainingError, printable
from .per_class import ClassTally
from .state import Callback, TrainState, keyed_callbacks, summarize_epoch
from .checkpoint import check_optimizer_state, check_resumable, load_checkpoint, load_model_state, rng_state, set_rng_state
from .metrics import METRIC_NAMES, MetricAccumulator
from .device import StepClock, amp_dtype_for, cpu_has_bf16, resolve_device
from .eval_weights import to_eval_weights, to_train_weights
from .step import StepOptions, TrainStep, compile_counts, prepare_input
from .tta import with_tta

class Model:
    """High-level train/eval/predict around a network, in torch's vocabulary.

    amp_dtype: None trains in float32; "bfloat16", "float16" or a torch dtype runs the forward under
    torch.autocast in it; "auto" picks bfloat16, or float16 on GPUs without it. MindSpore's
    `amp_level`/`loss_scale_manager` are accepted by `torchboost.compat.mindspore.Model`, which translates them.
    tta: "flip" evaluates and predicts with the logits averaged over each image and its mirror (`train.tta`).
    precise_bn: before each epoch's evaluation and checkpoint, BatchNorm's running statistics recomputed at the
    current weights from up to that many training batches (0: the running averages the forward passes kept;
    `train.precise_bn`, `train.eval_weights.to_eval_weights`).
    The update's own options (a `grad_scaler` for float16, clipping, EMA, schedule, hooks, non-finite
    policy...) are `StepOptions`, given as `options=` or as its keyword arguments
    (`Model(net, loss, opt, grad_scaler=torch.amp.GradScaler(), clip_global_norm=1.0)`); Model sets the
    autocast dtype from amp_dtype.
    """

    def __init__(self, network: nn.Module, loss_fn: Optional[nn.Module] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None,
                 metrics: Optional[Iterable[str]] = None, *,
                 device: Optional[str | torch.device] = None, amp_dtype: Optional[str | torch.dtype] = None,
                 accumulation_steps: int = 1, step_cls: type[TrainStep] = TrainStep, tta: str = "none",
                 precise_bn: int = 0, options: Optional[StepOptions] = None, **step_options: Any) -> None:
        options = StepOptions.of(options, **step_options)
        if accumulation_steps < 1:
            raise ConfigError(f"accumulation_steps must be >= 1, got {accumulation_steps}", "use 1 to disable")
        self.device = resolve_device(device)
        self.network = network.to(self.device)
        self.module = getattr(network, "module", network)  # the bare model under a DDP wrapper
        if options.channels_last:
            self.network.to(memory_format=torch.channels_last)
        self.input_norm = options.input_norm
        self.loss_fn, self.optimizer = loss_fn, optimizer
        # resolves aliases ("acc", "top5") and rejects unknown names now rather than at the first evaluation
        self.metrics = tuple(MetricAccumulator(metrics).names) if metrics is not None else METRIC_NAMES
        self.autocast_dtype = None if amp_dtype is None else amp_dtype_for(self.device, amp_dtype)
        if self.autocast_dtype == torch.bfloat16 and self.device.type == "cpu" and not cpu_has_bf16():
            warnings.warn("amp_dtype=bfloat16: this CPU has no bf16 units (no AVX-512-BF16/AMX), so bf16 is "
                          "emulated and about 2x slower than fp32 here; train in float32 (amp_dtype=None) on "
                          "this machine", stacklevel=2)
        self.grad_scaler = options.grad_scaler
        self.accumulation_steps = accumulation_steps
        self.channels_last = options.channels_last
        self.ema = options.ema
        self.train_step: Optional[TrainStep] = None
        # with StepOptions.compile the step compiles its own forward; eval and predict use a compiled copy too
        # (the bare module keeps the state dict and the EMA/hook targets)
        self.compiled = self.network if options.compile == "none" else torch.compile(self.network)
        with_tta(self.network, tta)  # an unknown mode is refused here, not at the first evaluation
        self.tta = tta
        if precise_bn < 0:
            raise ConfigError(f"precise_bn must be >= 0, got {precise_bn}", "use 0 to keep the running averages")
        self.precise_bn = precise_bn
        if optimizer is not None and loss_fn is not None:
            options = dataclasses.replace(options, autocast_dtype=self.autocast_dtype)
            self.train_step = step_cls(self.network, loss_fn, optimizer, options, device=self.device,
                                       ema_model=self.module)
        self.extra_state: dict[str, Any] = {}  # plain values saved in checkpoints (e.g. the resolved config)
        self._resume: Optional[dict] = None

    # --- checkpoints ----------------------------------------------------------------------------------
    def checkpoint_state(self, state: TrainState, epoch_complete: bool) -> dict:
        """Everything needed to continue exactly: weights, optimizer, scaler, hooks, EMA, position, RNG,
        the epoch's running metric sums and time, and the callbacks' progress."""
        ckpt = {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else {},
            "train_step": self.train_step.state_dict() if self.train_step is not None else {},
            "epoch": state.epoch, "step_in_epoch": state.step_in_epoch, "global_step": state.global_step,
            "samples_in_epoch": state.samples_in_epoch, "epoch_complete": epoch_complete, "rng": rng_state(),
            "epoch_sums": state.epoch_sums(), "epoch_elapsed_s": time.perf_counter() - state.epoch_start,
            "callbacks": {k: sd for k, cb in keyed_callbacks(state.callbacks) if (sd := cb.state_dict())},
        }
        if epoch_complete:  # the epoch's results: a resumed History adds the row a kill may have cost
            ckpt["epoch_results"] = {k: v for k, v in state.eval_results.items() if isinstance(v, (int, float))}
        if self.ema is not None:
            ckpt["ema"] = self.ema.state_dict()
        ckpt.update(self.extra_state)
        return ckpt

    def load_checkpoint(self, path: str | Path, weights_only_model: bool = False, ckpt: dict | None = None) -> dict:
        """Restore a checkpoint written by ModelCheckpoint. With weights_only_model, restore weights only
        (for eval/predict/fine-tuning); otherwise the next `train()` continues where the checkpoint stopped.
        `ckpt`: the checkpoint already loaded from `path` (a caller that inspected it first), not read again."""
        ckpt = ckpt if ckpt is not None else load_checkpoint(path, map_location=self.device)
        if "model" not in ckpt:
            raise CheckpointError(f"{path} has no 'model' entry", "pass a checkpoint written by torchboost train")
        if not weights_only_model:  # refuse an incomplete checkpoint before restoring anything from it
            check_resumable(ckpt, str(path))
            if self.ema is not None and "ema" not in ckpt:
                raise CheckpointError(f"{path} has no EMA weights", "train without EMA or resume from a run that had it")
        load_model_state(self.module, ckpt["model"], source=str(path))
        if weights_only_model:
            return ckpt
        try:
            if self.optimizer is not None and ckpt.get("optimizer"):
                built = [dict(g) for g in self.optimizer.param_groups]
                self.optimizer.load_state_dict(ckpt["optimizer"])
                check_optimizer_state(self.optimizer, built, str(path))
            if self.train_step is not None:
                self.train_step.load_state_dict(ckpt.get("train_step", {}))
            if self.ema is not None:
                self.ema.load_state_dict(ckpt["ema"])
        except (ValueError, TypeError, KeyError, IndexError, RuntimeError) as e:  # what torch raises on a misfit
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CheckpointError(f"{path} does not fit this run ({first[:160]})",
                                  "resume with the settings it was written with (optimizer, parameter groups, "
                                  "loss scaling, boost, EMA), or start from its weights only") from e
        self._resume = ckpt
        return ckpt

    # --- training -------------------------------------------------------------------------------------
    def train(self, epochs: int, train_data: Iterable, callbacks: Sequence[Callback] = (),
              eval_data: Optional[Iterable] = None, eval_every: int = 1, log_fn: Callable[[str], None] = print,
              eval_name: str = "") -> TrainState:
        """Train for `epochs` epochs in total (a resumed run counts the epochs already done). Callbacks'
        messages go through `log_fn` (the CLI sends them to rank 0's terminal and every rank's worklog).
        `eval_name`: what `eval_data` is (a split and its folder), named on every evaluation line."""
        if self.train_step is None:
            raise ConfigError("Model.train needs a loss_fn and an optimizer", "pass them to Model(...)")
        k = self.accumulation_steps
        steps_per_epoch = math.ceil(len(train_data) / k)
        callbacks = list(callbacks)
        state = TrainState(model=self, epochs=epochs, steps_per_epoch=steps_per_epoch, log_fn=log_fn,
                           callbacks=callbacks)
        state.batch_size = getattr(train_data, "batch_size", 0) or 0
        start_epoch, skip = self._resume_position(state, len(train_data) * max(state.batch_size, 1))
        compiled = self.train_step.options.compile != "none"
        compiling = compiled and not self.train_step.compiled_once  # said once, at the step's first compiled update
        compiled_before = compile_counts() if compiled else None  # the run reports its graphs and recompiles
        for cb in callbacks:
            cb.on_train_begin(state)

        for epoch in range(start_epoch, epochs):
            state.epoch = epoch
            if not skip:  # a run resumed mid-epoch keeps the sums and time restored from the checkpoint
                state.epoch_loss_sum, state.epoch_samples, state.epoch_correct = 0.0, 0, 0
                state.epoch_start = time.perf_counter()
            # reshuffle per epoch; skip the samples a resumed run already consumed (counted in samples, not
            # updates: a resume with --force and another batch size or accumulation skips the same images)
            state.samples_in_epoch = skip
            set_epoch(train_data, epoch, skip=skip)
            for cb in callbacks:
                cb.on_train_epoch_begin(state)
            self.network.train()
            to_train_weights(self.optimizer)  # schedule-free: back to the weights the step moves
            batches = iter(train_data)
            state.clock = StepClock(self.device)
            state.clock.mark()
            while True:
                t0 = time.perf_counter()
                window = list(itertools.islice(batches, k))
                if not window:
                    break
                t_data = time.perf_counter()
                try:
                    out = self.train_step(window, state.global_step)
                except TrainingError as e:  # say where, in the user's terms
                    raise TrainingError(f"epoch {epoch + 1} step {state.step_in_epoch + 1}: {e.what}", e.fix) from None
                # No device sync here: the host queues the next update while the GPU runs this one. These step
                # times are the host's, which the GPU's bounded queue paces once it is full; the device's own
                # (CUDA events) are `state.clock`'s, read at log time
                state.clock.mark()
                state.output, state.data_time, state.step_time = out, t_data - t0, time.perf_counter() - t0
                if compiling and self.train_step.ran_compiled:  # (THOR's first update, a refresh, is eager)
                    compiling, self.train_step.compiled_once = False, True
                    state.log(f"compile={self.train_step.options.compile}: the first compiled update took "
                              f"{state.step_time:.1f} s, compiling included")
                state.step_in_epoch += 1
                state.global_step += 1
                state.samples_in_epoch += out.samples
                state.add_update(out)
                for cb in callbacks:
                    cb.on_train_step_end(state)
                if state.stop_training:
                    break
            try:  # the deferred non-finite check (StepOptions.check_every) before anything reads the epoch
                self.train_step.flush_nonfinite(state.global_step - 1)
            except TrainingError as e:
                raise TrainingError(f"epoch {epoch + 1}: {e.what}", e.fix) from None
            summary = summarize_epoch(state)  # reads the device's sums: the queued updates are done after it
            state.eval_results = {"train_time_s": time.perf_counter() - state.epoch_start, **summary}
            # every epoch, evaluated or not (untimed, as evaluation): checkpoints and the final weights are the
            # ones to evaluate
            to_eval_weights(self.optimizer, self.module, lambda: self._inputs(train_data), self.precise_bn)
            if self.optimizer is not None and self.optimizer.param_groups:  # the lr the epoch's last update used
                state.eval_results["lr"] = float(self.optimizer.param_groups[0]["lr"])
            if eval_data is not None and ((epoch + 1) % eval_every == 0 or epoch + 1 == epochs):
                state.eval_results.update({f"val_{k_}": v for k_, v in self.eval(eval_data).items()})
                if self.ema is not None:
                    ema = self.eval(eval_data, use_ema=True)
                    state.eval_results.update({f"val_ema_{k_}": v for k_, v in ema.items()})
                state.log(_format_eval(epoch, state.eval_results, eval_name))
            if compiled_before is not None:
                self._say_recompiles(state, compiled_before)
            for cb in callbacks:
                cb.on_train_epoch_end(state)
            if state.stop_training:
                break  # the returned state says where training stopped
            state.step_in_epoch, skip = 0, 0
        for cb in callbacks:
            cb.on_train_end(state)
        return state

    def _say_recompiles(self, state: TrainState, before: tuple[int, int, str]) -> None:
        """The epoch's line on compilation: graphs compiled and recompiles since training began (with the latest
        recompile's reason when there are any), kept as `state.compile_stats`."""
        graphs, recompiles, reason = compile_counts()
        graphs, recompiles = graphs - before[0], recompiles - before[1]
        if (graphs, recompiles) != state.compile_stats:
            state.compile_stats = (graphs, recompiles)
            why = f" (latest: {reason[:160]})" if recompiles else ""
            state.log(f"compile={self.train_step.options.compile}: {graphs} graph(s) compiled, {recompiles} "
                      f"recompile(s) so far{why}")

    def _inputs(self, data: Iterable) -> Iterator[torch.Tensor]:
        """The inputs of `data`'s batches, on the device as the step sees them (BatchNorm's statistics are
        recomputed from them, `train.eval_weights`)."""
        for batch in data:
            if batch is not None:  # every sample a dropped corrupt image
                yield prepare_input(batch[0], self.device, self.channels_last, self.input_norm)

    def _resume_position(self, state: TrainState, epoch_samples: int) -> tuple[int, int]:
        """(first epoch to run, samples of it already done) from a loaded checkpoint, else (0, 0); restores
        the RNG, the callbacks' progress and, mid-epoch, the epoch's running sums and time. `epoch_samples`:
        the samples an epoch holds on this process (a position past it is refused, not silently an empty
        epoch)."""
        ckpt, self._resume = self._resume, None
        if ckpt is None:
            return 0, 0
        set_rng_state(ckpt["rng"])
        state.global_step = int(ckpt["global_step"])
        saved = ckpt.get("callbacks", {})
        for key, cb in keyed_callbacks(state.callbacks):
            if key in saved:
                try:  # a callback's progress is data from the file: anything it cannot take is a damaged file
                    cb.load_state_dict(saved[key])
                except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
                    raise CheckpointError(f"the checkpoint's {key} progress is damaged ({printable(e)[:100]})",
                                          "resume from an unmodified checkpoint written by torchboost train, or "
                                          "start from its weights only") from None
        if ckpt["epoch_complete"]:
            state.epoch = int(ckpt["epoch"]) + 1
            state.eval_results = dict(ckpt.get("epoch_results", {}))
            return state.epoch, 0
        state.epoch, state.step_in_epoch = int(ckpt["epoch"]), int(ckpt["step_in_epoch"])
        # checkpoints before samples were counted: the updates times their size (then unchanged by --force)
        skip = int(ckpt.get("samples_in_epoch", state.step_in_epoch * self.accumulation_steps * state.batch_size))
        if skip > epoch_samples:
            raise CheckpointError(f"the checkpoint is {skip:,} samples into epoch {state.epoch + 1}, which holds "
                                  f"{epoch_samples:,} here", "resume on the data it was trained on, or start from "
                                  "its weights with train.init_weights")
        if "epoch_sums" in ckpt:  # absent in checkpoints written before they were saved
            sums = ckpt["epoch_sums"]
            loss_sum, correct = (v.to(self.device) if isinstance(v, torch.Tensor) else v
                                 for v in (sums["loss_sum"], sums["correct"]))
            state.epoch_loss_sum, state.epoch_samples, state.epoch_correct = loss_sum, int(sums["samples"]), correct
        state.epoch_start = time.perf_counter() - float(ckpt.get("epoch_elapsed_s", 0.0))
        return state.epoch, skip

    # --- evaluation and prediction --------------------------------------------------------------------
    @torch.no_grad()
    def eval(self, data: Iterable, use_ema: bool = False, tally: Optional[ClassTally] = None) -> dict[str, float]:
        """Top-1/top-5/loss over every sample of `data` (exact across ranks when `data` is sharded); `tally`
        also keeps each of this process's samples' prediction (per-class results, `train.per_class`)."""
        if use_ema and self.ema is None:
            raise ConfigError("use_ema=True but this Model has no EMA", "enable train.ema.enabled")
        net = with_tta(self.ema.module if use_ema else self.compiled, self.tta)
        was_training = net.training
        net.eval()
        acc = MetricAccumulator(self.metrics)
        loss_fn = self.loss_fn or nn.CrossEntropyLoss()
        for batch in data:
            if batch is None:  # every sample of this batch was a dropped corrupt image
                continue
            x, y = batch
            x = prepare_input(x, self.device, self.channels_last, self.input_norm)
            y = y.to(self.device, non_blocking=True)
            with torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
                logits = net(x)
            logits = logits.float()
            per_sample = _per_sample_loss(loss_fn, logits, y)
            acc.update(logits, y, per_sample.sum())
            if tally is not None:
                tally.update(logits, y)
        net.train(was_training)
        return acc.compute()

    @torch.no_grad()
    def predict(self, batch: torch.Tensor, use_ema: bool = False) -> torch.Tensor:
        """Logits for a batch (eval mode)."""
        net = with_tta(self.ema.module if use_ema and self.ema is not None else self.compiled, self.tta)
        was_training = net.training
        net.eval()
        x = prepare_input(batch, self.device, self.channels_last, self.input_norm)
        with torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
            out = net(x).float()
        net.train(was_training)
        return out


def _per_sample_loss(loss_fn: nn.Module, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loss per sample, so the evaluation mean is exact whatever the batch sizes."""
    if hasattr(loss_fn, "reduction"):
        saved, loss_fn.reduction = loss_fn.reduction, "none"
        try:
            return loss_fn(logits, y)
        finally:
            loss_fn.reduction = saved
    return loss_fn(logits, y).expand(y.shape[0])  # an opaque loss: its mean stands for each sample


def _format_eval(epoch: int, results: dict, eval_name: str = "") -> str:
    parts = [f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in results.items()
             if k.startswith(("val_", "train_")) and k != "train_time_s"]
    return f"epoch: {epoch + 1} " + " ".join(parts) + (f" (val: {eval_name})" if eval_name else "")
