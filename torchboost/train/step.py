"""TrainStep: one optimizer update, as one readable function. Subclass it (or replace it) for custom steps.

forward (autocast) -> loss / n_micro -> scaled backward (no DDP sync until the last micro-batch)
-> non-finite loss check (stop, or skip the update) -> unscale -> [overflow check] -> hooks.on_gradients
-> clip -> hooks.before_optimizer -> optimizer.step -> hooks.after_optimizer -> scaler.update -> zero_grad -> EMA

With `check_every` > 1 the host reads nothing between checks: the non-finite loss is noted on the device, and
an update to skip (policy "skip", or an overflow under loss scaling) is applied and then undone on the device
(`masked_update`, `train.undo`), the way GradScaler skips inside fused optimizers.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn

from .. import distributed as dist
from ..errors import ConfigError, suggest
from ..optim.lr import follows_schedule, lrs_as_tensors, set_lr
from ..optim.protocol import maskable_of, protocol_of
from .ema import ModelEMA
from .hooks import StepHook
from .loss_scale import skips_overflow
from .nonfinite import NonfiniteChecks
from .undo import UpdateUndo


def prepare_input(x: torch.Tensor, device: torch.device, channels_last: bool = False,
                  input_norm: Optional[tuple[Sequence[float], Sequence[float]]] = None) -> torch.Tensor:
    """Move a batch to the device (non-blocking: overlaps with compute when the loader pins memory),
    normalize uint8 batches there (4x fewer bytes through the loader and the host-to-device copy),
    and switch to channels_last when asked."""
    x = x.to(device, non_blocking=True)
    if x.dtype == torch.uint8:
        if input_norm is None:
            raise ConfigError("a uint8 batch needs input_norm=(mean, std) to be normalized on the device",
                          "pass input_norm=(mean, std) to Model/TrainStep, or give float batches")
        from ..data.transforms import normalize_batch

        x = normalize_batch(x, *input_norm)
    if channels_last and x.ndim == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


@dataclass
class StepOutput:
    loss: torch.Tensor  # mean loss over the update's samples (detached, fp32)
    samples: int
    correct: Optional[torch.Tensor] = None  # top-1 hits, when the step computes accuracy
    # update dropped: gradients overflowed, or the loss was non-finite. With deferred checks (check_every > 1)
    # both are 0-d bool tensors on the device, read only by whoever prints them
    skipped: bool | torch.Tensor = False
    nonfinite: bool | torch.Tensor = False  # the loss was inf/NaN (not counted in the epoch's sums)


NONFINITE_POLICIES = ("stop", "skip")
# StepOptions.compile -> torch.compile's mode ("reduce-overhead" is inductor with CUDA graphs)
COMPILE_MODES = {"none": None, "default": "default", "max-autotune": "max-autotune", "cudagraphs": "reduce-overhead"}


def compile_counts() -> tuple[int, int, str]:
    """(graphs dynamo compiled, recompiles, the latest recompile's reason) in this process so far: a compiled step
    that recompiles (a guard failed: a new shape, a flag, a Python value) is slower than it looks, and past
    dynamo's cache limit runs eagerly."""
    from torch._dynamo.utils import counters, guard_failures

    reasons = [r for found in guard_failures.values() for r in found]
    return counters["stats"]["unique_graphs"], len(reasons), str(reasons[-1]) if reasons else ""


@dataclass(frozen=True)
class StepOptions:
    """What one update does besides forward, backward and the optimizer's step, each off by default: the one
    statement of these options, which `TrainStep`, `Model` and the recipe builder share (as an object, or as
    keyword arguments that become one)."""

    autocast_dtype: Optional[torch.dtype] = None  # forward under torch.autocast in this dtype
    grad_scaler: Optional[torch.amp.GradScaler] = None  # scaled backward, unscale, overflow check
    clip_global_norm: Optional[float] = None
    clip_value: Optional[float] = None
    ema: Optional[ModelEMA] = None  # updated after each applied update
    hooks: Sequence[StepHook] = ()  # boost's gradient and update hooks, in order
    lr_schedule: Optional[Sequence[float]] = None  # lr per update index (times each group's lr_scale)
    channels_last: bool = False
    compute_accuracy: bool = False  # top-1 hits of the training batches (the epoch's train accuracy)
    input_norm: Optional[tuple[Sequence[float], Sequence[float]]] = None  # (mean, std) for uint8 batches
    nonfinite: str = "stop"  # a non-finite loss: "stop" before applying it, or "skip" the update
    max_nonfinite_steps: int = 0  # with "skip": consecutive skipped updates allowed
    # the host reads the loss's finiteness every this many updates (and at `flush_nonfinite`), not after each:
    # between reads the step queues work without waiting for the device (a GPU's queue stays full). "stop" then
    # names the first bad update at the check; "skip" and loss-scale overflows undo the update on the device
    check_every: int = 1
    # torch.compile the forward + loss (its backward through AOTAutograd) and the optimizer's step: none,
    # default, max-autotune or cudagraphs (inductor with CUDA graphs); hooks, clipping and EMA stay eager
    compile: str = "none"

    def __post_init__(self) -> None:
        if self.nonfinite not in NONFINITE_POLICIES:
            raise ConfigError(f"nonfinite={self.nonfinite!r} is not a policy", "use 'stop' or 'skip'")
        if self.compile not in COMPILE_MODES:
            raise ConfigError(f"compile={self.compile!r} is not a mode", f"use one of {', '.join(COMPILE_MODES)}")
        if self.check_every < 1:
            raise ConfigError(f"check_every={self.check_every} must be >= 1", "use 1 to check every update")
        if self.nonfinite == "skip" and self.max_nonfinite_steps < 1:
            raise ConfigError(f"nonfinite='skip' with max_nonfinite_steps={self.max_nonfinite_steps} would never "
                              "skip", "set max_nonfinite_steps to the consecutive skipped updates to allow (e.g. 10)")

    @classmethod
    def of(cls, options: Optional["StepOptions"], **changes: Any) -> "StepOptions":
        """`options` (default: all off) with keyword changes; an unknown name is a one-line error."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise ConfigError(f"unknown step option {unknown[0]!r}", suggest(unknown[0], sorted(names)))
        return dataclasses.replace(options or cls(), **changes)


class TrainStep:
    """Everything one update needs, with each feature off by default (`StepOptions`, given as an object or as
    its keyword arguments: `TrainStep(net, loss, opt, clip_global_norm=1.0)`)."""

    # On the CPU a host read waits for nothing, and undoing an update costs a copy of the weights and the
    # optimizer state (measured by benchmarks/overhead.py, BENCHMARKS.md): it is done on accelerators only,
    # unless this says otherwise (the tests check the device path on the CPU with it)
    undo_on_cpu: bool = False

    def __init__(self, model: nn.Module, loss_fn: Callable, optimizer: torch.optim.Optimizer,
                 options: Optional[StepOptions] = None, *, device: torch.device | str = "cpu",
                 ema_model: Optional[nn.Module] = None, **changes: Any) -> None:
        o = self.options = StepOptions.of(options, **changes)
        self.model, self.loss_fn, self.optimizer = model, loss_fn, optimizer
        self.device = torch.device(device)
        # the options as attributes: what the step's pieces (and a subclass's) read
        self.autocast_dtype, self.grad_scaler = o.autocast_dtype, o.grad_scaler
        self.clip_global_norm, self.clip_value = o.clip_global_norm, o.clip_value
        self.ema, self.hooks, self.lr_schedule = o.ema, list(o.hooks), o.lr_schedule
        self.channels_last, self.compute_accuracy, self.input_norm = o.channels_last, o.compute_accuracy, o.input_norm
        self.nonfinite, self.max_nonfinite_steps, self.check_every = o.nonfinite, o.max_nonfinite_steps, o.check_every
        # EMA tracks the bare module even when `model` is a DDP wrapper.
        self.ema_model = ema_model if ema_model is not None else getattr(model, "module", model)
        self.last_grad_norm: Optional[torch.Tensor] = None
        self.checks = NonfiniteChecks(o.nonfinite, o.max_nonfinite_steps, o.check_every)
        # the optimizer's side of the contract (torchboost.optim.protocol): what it needs from the step
        self.protocol = protocol_of(optimizer)
        self.protocol.attach_grad_scaler(o.grad_scaler)
        self.undo = UpdateUndo(model, optimizer, o.ema)
        self.masks_on_device = self._masks_on_device()
        self.compiled_step: Optional[Callable[[], Any]] = None
        self.eager_forward_loss = self.forward_loss  # a subclass's override included
        self.ran_compiled = False  # whether the last update ran the compiled forward
        self.compiled_once = False  # whether a compiled update ran (its compile time said once, not per train())
        if o.compile != "none":
            self._compile(COMPILE_MODES[o.compile])
        if o.lr_schedule is not None and follows_schedule(optimizer):  # optim.lr: one schedule writes the lr
            raise ConfigError("the optimizer already follows its own per-update lr schedule (an lr array or "
                              "callable given to it), and an lr_schedule was given to the step too",
                              "give the schedule once: a number as the optimizer's lr, and lr_schedule here")

    def _masks_on_device(self) -> bool:
        """Whether an update to drop is undone on the device (`masked_update`) rather than decided by a host
        read before it is applied: with deferred checks, for an optimizer that declares it safe (`maskable_of`), without boost hooks (their state is the host's), under one process or DDP (whose gradient
        all-reduce gives every rank the same verdict: a non-finite loss on one rank makes everyone's averaged
        gradients non-finite, so no collective is added)."""
        scaler = self.grad_scaler
        if scaler is not None and not skips_overflow(scaler):  # overflows applied: nothing to undo for them
            return False
        return ((self.nonfinite == "skip" or scaler is not None) and self.check_every > 1 and maskable_of(self.optimizer)
                and not self.hooks and (self.device.type != "cpu" or self.undo_on_cpu)
                and (dist.get_world_size() == 1 or hasattr(self.model, "no_sync")))

    def _compile(self, mode: str) -> None:
        if not self.protocol.compilable:
            raise ConfigError(f"{type(self.optimizer).__name__}'s step cannot be compiled (it hooks the model or "
                              "re-runs the forward)", "train it with compile=none")
        # instance attributes over the methods: a subclass's override is what gets compiled
        self.forward_loss = torch.compile(self.forward_loss, mode=mode)  # type: ignore[method-assign]
        if self.protocol.compile_own_step(mode):  # e.g. THOR: its update between refreshes; step() stays eager
            return
        self.compiled_step = torch.compile(self.optimizer.step, mode=mode)
        # the compiled step reads each group's lr from one 0-d tensor per group, refilled before each call:
        # a float there would be a constant of the graph, recompiled at every new value of the schedule
        self.lr_tensors = [torch.zeros((), device=self.device) for _ in self.optimizer.param_groups]

    def run_compiled_step(self) -> None:
        with lrs_as_tensors(self.optimizer, self.lr_tensors):
            self.compiled_step()

    # --- pieces a subclass may override -------------------------------------------------------------
    def to_device(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = prepare_input(x, self.device, self.channels_last, self.input_norm)
        return x, y.to(self.device, non_blocking=True)

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def forward_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with self.autocast():
            logits = self.model(x)
            loss = self.loss_fn(logits, y)
        return loss, logits

    def set_lr(self, step: int) -> None:
        if self.lr_schedule is None:
            return
        set_lr(self.optimizer, float(self.lr_schedule[min(step, len(self.lr_schedule) - 1)]))

    def params_with_grad(self) -> list[torch.Tensor]:
        return [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]

    # --- the step -----------------------------------------------------------------------------------
    def __call__(self, micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]], step: int) -> StepOutput:
        model, opt, scaler = self.model, self.optimizer, self.grad_scaler
        self.set_lr(step)
        for h in self.hooks:
            h.before_update(step)

        if self.masks_on_device:
            self.undo.save()  # what the update writes, before the forward writes BatchNorm's statistics
        elif self.nonfinite == "skip":
            self.undo.save(whole=False)  # a skipped update leaves BatchNorm's statistics as they were too
        n = len(micro_batches)  # a short last window at epoch end divides by what it really has
        loss_sum = torch.zeros((), device=self.device)
        correct = torch.zeros((), dtype=torch.long, device=self.device) if self.compute_accuracy else None
        samples = 0
        for i, (x, y) in enumerate(micro_batches):
            x, y = self.to_device(x, y)
            last = i == n - 1
            # DDP: all-reduce gradients only once, on the final micro-batch (MindSpore reduces every one).
            sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
            # an optimizer may need an eager forward (THOR's refresh updates capture statistics through hooks)
            forward_loss = self.eager_forward_loss if self.protocol.eager_forward() else self.forward_loss
            self.ran_compiled = forward_loss is not self.eager_forward_loss
            with sync:
                loss, logits = forward_loss(x, y)
                scaled = loss / n
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
            loss_sum += loss.detach().float() * y.shape[0]
            samples += y.shape[0]
            if correct is not None:
                correct += (logits.detach().argmax(1) == (y.argmax(1) if y.ndim > 1 else y)).sum()  # soft: argmax
        loss = loss_sum / max(samples, 1)
        if self.masks_on_device:
            return self.masked_update(loss, samples, correct, step)
        if self.nonfinite == "stop" and self.check_every > 1:  # noted on the device, read at the next check
            self.checks.note(~torch.isfinite(loss), step)
        elif self.loss_nonfinite(loss, step):  # skip: no optimizer, scaler, hook or EMA change
            self.undo.restore()
            opt.zero_grad(set_to_none=True)
            return StepOutput(loss=loss, samples=samples, correct=correct, skipped=True, nonfinite=True)

        drop = self.unscale_and_check()
        if not drop:
            for h in self.hooks:
                h.on_gradients(model)
            self.clip()
            for h in self.hooks:
                h.before_optimizer(model)
            self.optimizer_step(micro_batches[-1])
            for h in self.hooks:
                h.after_optimizer(model)
        if scaler is not None:
            scaler.update()
        opt.zero_grad(set_to_none=True)
        if self.ema is not None and not drop:
            self.ema.update(self.ema_model)
        self.check_now(step)
        return StepOutput(loss=loss, samples=samples, correct=correct, skipped=drop)

    def masked_update(self, loss: torch.Tensor, samples: int, correct: Optional[torch.Tensor], step: int
                      ) -> StepOutput:
        """The update with no host read (`masks_on_device`): applied, then undone on the device when its
        gradients (after DDP's averaging: the same on every rank) or, under one process, its loss are not
        finite. The policy's verdicts wait on the device for the next check (`flush_nonfinite`)."""
        opt, scaler = self.optimizer, self.grad_scaler
        if scaler is not None:
            scaler.unscale_(opt)
        norm = self.grad_norm()
        norm = loss * 0 if norm is None else norm
        grad_bad, loss_bad = ~torch.isfinite(norm), ~torch.isfinite(loss)
        drop = grad_bad | loss_bad if dist.get_world_size() == 1 else grad_bad
        nonfinite = loss_bad if scaler is not None else loss_bad | grad_bad  # under loss scaling: an overflow
        if self.nonfinite == "skip":
            self.checks.count_streak(nonfinite, step)
        else:
            self.checks.note(nonfinite, step)
        self.clip(norm)
        self.apply_step()
        if self.ema is not None:
            self.ema.update(self.ema_model)
        self.undo.restore_where(drop, loss_bad)
        if scaler is not None:
            scaler.update()  # reads the overflow flags unscale_ left on the device
        opt.zero_grad(set_to_none=True)
        self.check_now(step)
        return StepOutput(loss=loss, samples=samples, correct=correct, skipped=drop, nonfinite=nonfinite)

    def check_now(self, step: int) -> None:
        """The deferred checks' read, every `check_every` updates (every rank at the same updates)."""
        if self.check_every > 1 and (step + 1) % self.check_every == 0:
            self.flush_nonfinite(step)

    def loss_nonfinite(self, loss: torch.Tensor, step: int) -> bool:
        """True when this update's loss is inf/NaN on any rank and the policy skips it; raises TrainingError
        when the policy stops (or too many consecutive updates were skipped). One host read per update."""
        return self.checks.host_check(loss, step)

    def flush_nonfinite(self, step: int) -> None:
        """The deferred check at update `step` (`NonfiniteChecks.flush`): raises naming the update."""
        self.checks.flush(step)

    @property
    def nonfinite_streak(self) -> int | torch.Tensor:
        return self.checks.streak

    def grad_norm(self) -> Optional[torch.Tensor]:
        """The gradients' global 2-norm, on the device (None without gradients); kept as `last_grad_norm`."""
        grads = [p.grad for p in self.params_with_grad()]
        if not grads:
            return None
        self.last_grad_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)).float())
        return self.last_grad_norm

    def unscale_and_check(self) -> bool:
        """Unscale gradients in place; True when they hold inf/NaN and the scaler drops such updates. This is
        the per-update host read of the path that cannot undo an update on the device (`masks_on_device`:
        check_every=1, the CPU, THOR, boost hooks)."""
        if self.grad_scaler is None:
            return False
        self.grad_scaler.unscale_(self.optimizer)
        if not skips_overflow(self.grad_scaler):  # applied either way: nothing to read
            return False
        norm = self.grad_norm()
        # Every rank must drop the same updates: without DDP averaging (Adasum, THOR's collectives) one
        # rank overflowing alone would leave the others waiting in a collective until the timeout.
        return norm is not None and dist.any_rank(not bool(torch.isfinite(norm)))

    def clip(self, norm: Optional[torch.Tensor] = None) -> None:
        """Clip by value, then by global norm; `norm`: the gradients' norm already computed this update (not
        computed twice: it is one pass over every gradient)."""
        params = self.params_with_grad()
        if self.clip_value is not None:
            torch.nn.utils.clip_grad_value_(params, self.clip_value)
            norm = None  # the values changed
        if self.clip_global_norm is not None:
            if norm is None:
                self.last_grad_norm = torch.nn.utils.clip_grad_norm_(params, self.clip_global_norm)
            else:
                torch.nn.utils.clip_grads_with_norm_(params, self.clip_global_norm, norm)

    def apply_step(self) -> None:
        """optimizer.step() on gradients ready to apply (compiled when asked)."""
        if self.compiled_step is not None:
            self.run_compiled_step()
        else:
            self.optimizer.step()

    def optimizer_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        opt, scaler = self.optimizer, self.grad_scaler
        if self.protocol.needs_closure:  # e.g. DimReduce's line search re-evaluates the loss
            x, y = self.to_device(*batch)

            @torch.no_grad()
            def closure() -> torch.Tensor:
                return self.forward_loss(x, y)[0].float()

            opt.step(closure)
        elif scaler is not None:
            scaler.step(opt)  # gradients are already unscaled; GradScaler skips on inf (FixedGradScaler may not)
        else:
            self.apply_step()

    def state_dict(self) -> dict:
        state = {f"hook{i}": h.state_dict() for i, h in enumerate(self.hooks)}
        state["nonfinite_streak"] = int(self.checks.streak)
        if self.grad_scaler is not None:
            state["loss_scale"] = self.grad_scaler.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        for i, h in enumerate(self.hooks):
            h.load_state_dict(state.get(f"hook{i}", {}))
        self.checks.streak = int(state.get("nonfinite_streak", 0))
        if self.grad_scaler is not None and "loss_scale" in state:
            self.grad_scaler.load_state_dict(state["loss_scale"])
