"""The non-finite loss policy's bookkeeping: "stop" or "skip" (up to `max_nonfinite_steps` in a row), decided
by a host read per update (`host_check`) or, with deferred checks, noted on the device and read every
`check_every` updates (`note`, `count_streak`, `flush`). Every rank calls `flush` at the same updates: the
verdict costs one all-reduce there and none in between."""

from __future__ import annotations

from typing import Optional

import torch

from .. import distributed as dist
from ..errors import TrainingError

FIX = ("lower the learning rate, clip gradients (clip_global_norm) or use loss scaling, then resume from the last "
       "checkpoint (checkpoints only ever hold finite weights)")


class NonfiniteChecks:
    def __init__(self, policy: str, max_streak: int, check_every: int) -> None:
        self.policy, self.max_streak, self.check_every = policy, max_streak, check_every
        self.streak: int | torch.Tensor = 0  # consecutive non-finite updates ("skip"); a device tensor when deferred
        # deferred verdicts on the device: [first update whose loss was not finite ("stop"), first update past
        # max_streak in a row ("skip")], -1 while none
        self.pending: Optional[torch.Tensor] = None

    def host_check(self, loss: torch.Tensor, step: int) -> bool:
        """True when this update's loss is inf/NaN on any rank and the policy skips it; raises TrainingError
        when it stops (or too many in a row were skipped). One host read (and a tiny all-reduce under several
        ranks, so all decide together)."""
        local = not bool(torch.isfinite(loss))
        if not dist.any_rank(local):
            self.streak = 0
            return False
        self.streak = int(self.streak) + 1
        seen = f"the loss became {loss.item()}" if local else "the loss became non-finite on another rank"
        if self.policy == "stop":
            raise TrainingError(f"{seen} at update {step + 1}; stopped before applying it", FIX)
        if self.streak > self.max_streak:
            raise TrainingError(f"{seen} at update {step + 1}: {self.streak} non-finite updates in a row "
                                f"(max_nonfinite_steps={self.max_streak})", FIX)
        return True

    def _pending(self, device: torch.device) -> torch.Tensor:
        if self.pending is None:
            self.pending = torch.full((2,), -1, dtype=torch.long, device=device)
        return self.pending

    def note(self, bad: torch.Tensor, step: int) -> None:
        """"stop", deferred: remember on the device the first update whose loss was inf/NaN."""
        first = self._pending(bad.device)[0]
        first.copy_(torch.where(bad & (first < 0), step, first))

    def count_streak(self, bad: torch.Tensor, step: int) -> None:
        """"skip", deferred: count consecutive non-finite updates on the device; remember the first past the
        limit."""
        streak = self.streak
        if not isinstance(streak, torch.Tensor):
            streak = torch.full((), streak, dtype=torch.long, device=bad.device)
        self.streak = streak = torch.where(bad, streak + 1, 0)
        over = self._pending(bad.device)[1]
        over.copy_(torch.where((streak > self.max_streak) & (over < 0), step, over))

    def flush(self, step: int) -> None:
        """The deferred check at update `step`: raises TrainingError naming the first update whose loss was
        not finite ("stop": it and the updates after it were applied unless undone on the device, so the run
        stops; checkpoints, written only after a check, hold finite weights) or the update that went past
        max_nonfinite_steps in a row ("skip")."""
        if self.pending is None:
            return
        (first, over), self.pending = self.pending.tolist(), None
        if not dist.any_rank(first >= 0 or over >= 0):
            return
        checked = f"checked at update {step + 1}, every {self.check_every} updates"
        if over >= 0:
            raise TrainingError(f"the loss was non-finite for more than max_nonfinite_steps={self.max_streak} "
                                f"updates in a row at update {over + 1} ({checked}); stopped", FIX)
        where = f"at update {first + 1}" if first >= 0 else "on another rank"
        raise TrainingError(f"the loss became non-finite {where} ({checked}); stopped", FIX)
