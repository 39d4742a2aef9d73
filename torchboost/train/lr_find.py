"""The learning-rate range test (Smith 2017; fastai's and Lightning's lr finder): train for a few hundred updates
while the lr grows geometrically, watch the smoothed loss, and suggest one decade below the lr of its lowest
point (fastai's first rule). The lr where the loss falls fastest (Lightning's rule) is reported beside it:
measured on the default task it moved by one to two decades between two sweeps of nearly the same task (the
fastest fall there is the escape from the initial weights, at whatever lr the sweep starts), while the lowest
point moved by less than 20% (BENCHMARKS.md, "lr range test").

Written here rather than taken from a library: torch has none, and Lightning's and fastai's drive their own
trainers. This one drives a `TrainStep` (any optimizer, its lr written through the step's schedule), so the
sweep trains exactly as `train` would.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional

import numpy as np
from ..errors import ConfigError, TrainingError
from .step import TrainStep


# The bias-corrected average's first values rest on a handful of losses (the first IS one batch's loss): a
# lucky first batch can make the curve's start its lowest point, and the words said "never fell" while the plot
# showed a fall from its plateau. Only past these updates is the curve drawn and judged (fastai and Lightning
# leave them out of their suggestion too).
WARMUP = 10
NEVER_FELL = "the smoothed loss never fell below where its plotted curve starts"


@dataclass
class LrFindResult:
    """The sweep: the lr of each update, its loss, the smoothed loss, the lr of the lowest smoothed loss, the lr
    of its steepest fall, and the suggestion (a tenth of the lowest point's lr; None: the loss never fell below
    where its plotted curve starts). The last three are read from `shown()`, the series the figure draws.
    `stopped`: why the sweep ended before its last update ("" when it ran them all)."""

    lrs: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    smoothed: list[float] = field(default_factory=list)
    suggestion: Optional[float] = None
    min_loss_lr: Optional[float] = None
    steepest_lr: Optional[float] = None
    stopped: str = ""

    @property
    def shown_from(self) -> int:
        """The first update of the plotted series: past the average's warm-up, unless the sweep is too short
        to spare it."""
        return WARMUP if len(self.smoothed) > 2 * WARMUP else 0

    def shown(self) -> tuple[list[float], list[float]]:
        """(lrs, smoothed loss) as the figure draws them; the suggestion and the words are computed from
        exactly this series."""
        return self.lrs[self.shown_from:], self.smoothed[self.shown_from:]

    def to_dict(self) -> dict:
        return dict(lrs=self.lrs, losses=self.losses, smoothed=self.smoothed, shown_from=self.shown_from,
                    suggestion=self.suggestion, min_loss_lr=self.min_loss_lr, steepest_lr=self.steepest_lr,
                    stopped=self.stopped)


def lr_sweep(start: float, end: float, updates: int) -> np.ndarray:
    """`updates` lrs from start to end, evenly spaced on a log scale."""
    if not (0 < start < end and math.isfinite(end)):
        raise ConfigError(f"lr sweep from {start} to {end} is not an increasing range of positive numbers",
                          "give 0 < start < end, e.g. --start 1e-5 --end 1")
    if updates < 10:
        raise ConfigError(f"an lr sweep of {updates} updates is too short to find a slope", "use 100 or more")
    return np.geomspace(start, end, updates)


def steepest_lr(lrs: Iterable[float], smoothed: Iterable[float], skip_start: int = 10, skip_end: int = 5
                ) -> Optional[float]:
    """The lr where the smoothed loss falls fastest against log(lr) (the steepest negative slope), looked for
    before the loss's minimum and away from the sweep's noisy ends; None when the loss never falls there."""
    lrs, loss = np.asarray(list(lrs), dtype=np.float64), np.asarray(list(smoothed), dtype=np.float64)
    end = int(np.argmin(loss)) + 1  # past the minimum the loss climbs: no suggestion there
    lo, hi = min(skip_start, max(end - 2, 0)), max(min(end, len(loss) - skip_end), 0)
    if hi - lo < 3:
        return None
    slope = np.gradient(loss[lo:hi], np.log(lrs[lo:hi]))
    i = int(np.argmin(slope))
    return float(lrs[lo + i]) if slope[i] < 0 else None


def find_lr(step: TrainStep, batches: Iterable, lrs: np.ndarray, beta: float = 0.98,
            diverge: float = 4.0) -> LrFindResult:
    """Run `step` once per lr of `lrs` (batches are reused from the start when they run out), smoothing the
    loss with an exponential average (bias-corrected, as fastai does). Stops when the smoothed loss exceeds
    `diverge` times its best or turns non-finite. The step's optimizer and model are changed: run it on a
    copy, or rebuild them after."""
    step.lr_schedule = lrs
    result = LrFindResult()
    avg, best = 0.0, math.inf
    data: Iterator = itertools.cycle(batches) if isinstance(batches, (list, tuple)) else _repeat(batches)
    for k, lr in enumerate(lrs):
        try:
            loss = float(step([next(data)], k).loss)
        except TrainingError:  # the policy stops at a non-finite loss: the sweep has diverged
            result.stopped = f"non-finite loss at lr {lr:.3g}"
            break
        avg = beta * avg + (1 - beta) * loss
        smooth = avg / (1 - beta ** (k + 1))
        result.lrs.append(float(lr))
        result.losses.append(loss)
        result.smoothed.append(smooth)
        best = min(best, smooth)
        if not math.isfinite(smooth) or smooth > diverge * best:
            result.stopped = f"loss diverged at lr {lr:.3g} ({smooth:.3g} > {diverge:g} x the best {best:.3g})"
            break
    return conclude(result)


def conclude(result: LrFindResult) -> LrFindResult:
    """Fill in the lowest point, the steepest fall and the suggestion from the plotted series (`shown`)."""
    lrs, loss = result.shown()
    if loss:
        low = int(np.argmin(loss))
        result.min_loss_lr = lrs[low]
        result.steepest_lr = steepest_lr(lrs, loss, skip_start=0)  # `shown` already left out the noisy start
        if loss[low] < loss[0]:  # the plotted loss fell: a decade below its lowest point
            result.suggestion = result.min_loss_lr / 10
    return result


def _repeat(loader: Iterable) -> Iterator:
    """A loader's batches, epoch after epoch (a loader with an epoch-seeded sampler reshuffles per pass)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ConfigError("the lr sweep's training data is empty", "give a data set with training images")


def lr_find_figure(results: dict[str, LrFindResult]):
    """Smoothed loss against lr (log scale), one line per optimizer, its suggestion marked: a matplotlib Figure."""
    from ..plotting import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = {name: r.shown() for name, r in results.items()}
    for name, r in results.items():
        lrs, loss = series[name]
        if not lrs:
            continue
        line, = ax.plot(lrs, loss, label=name if r.suggestion is not None else f"{name} (never fell)")
        if r.suggestion is not None:  # marked on the curve at the sweep's nearest lr
            i = int(np.argmin(np.abs(np.log(lrs) - np.log(r.suggestion))))
            ax.plot([lrs[i]], [loss[i]], "o", color=line.get_color())
            ax.annotate(f"{r.suggestion:.2g}", (lrs[i], loss[i]), textcoords="offset points",
                        xytext=(4, 6), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    past = any(r.shown_from for r in results.values())
    ax.set_ylabel("training loss (smoothed" + (f", past its first {WARMUP} updates)" if past else ")"))
    finite = [v for _, loss in series.values() for v in loss if math.isfinite(v)]
    if finite:  # the climb after divergence would squash the interesting part
        low = min(finite)
        start = max(loss[0] for _, loss in series.values() if loss)
        ax.set_ylim(low - 0.05 * abs(low), max(start, low) * 1.5 + 1e-9)
    ax.set_title("lr range test: the dot is the suggested lr (a decade below the lowest loss)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig

