"""Compare two sides' recorded training steps item by item and report the first divergence (table + JSON)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from .compare import Metrics, compare_tensors, judge
from .record import Recording
from torchboost.fileio import atomic_write

@dataclass
class AlignItem:
    stage: str  # forward | loss | backward | update
    ours: str  # our module call / parameter name
    ref: str  # the reference's name for it
    shape: list[int]
    metrics: Metrics
    passed: bool
    reason: str = ""
    step: int = 1  # which training step of the run (optimizer state such as momentum acts from the 2nd)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "stage": self.stage, "ours": self.ours, "reference": self.ref, "shape": self.shape,
                "passed": self.passed, "reason": self.reason, **self.metrics.to_dict()}


@dataclass
class AlignReport:
    mode: str  # "modules" or "dump"
    single_step: bool
    items: list[AlignItem] = field(default_factory=list)
    unpaired: list[str] = field(default_factory=list)  # our items the reference has no counterpart for
    notes: list[str] = field(default_factory=list)
    steps: int = 1  # training steps compared

    @property
    def first_failure(self) -> Optional[AlignItem]:
        """The first failing item in comparison order: step by step, and within a step forward (completion
        order), loss, backward (reverse order), update."""
        return next((it for it in self.items if not it.passed), None)

    @property
    def passed(self) -> bool:
        return bool(self.items) and self.first_failure is None

    def summary(self) -> str:
        n_fail = sum(not it.passed for it in self.items)
        over = (f"over {self.steps} training steps" if self.steps > 1 else
                "over 1 training step (a difference in optimizer state, e.g. momentum, shows only from the 2nd)")
        head = f"{len(self.items)} items compared {over} ({len(self.unpaired)} without a reference counterpart)"
        f = self.first_failure
        if f is None:
            return f"PASS: {head}, all within tolerance" if self.items else "NOTHING COMPARED: no names matched"
        return (f"FAIL: {head}, {n_fail} failing; first divergence at step {f.step} {f.stage} '{f.ours}' "
                f"(reference '{f.ref}'): {f.reason}")

    def table(self, limit: Optional[int] = None, failures_only: bool = False) -> str:
        """Fixed-width table; `limit` keeps the first N rows (the first failure is always shown)."""
        rows = [it for it in self.items if not failures_only or not it.passed]
        first = self.first_failure
        if limit is not None and len(rows) > limit:
            kept = rows[:limit]
            rows = kept + ([first] if first is not None and first not in kept else [])
        header = ["step", "stage", "ours", "reference", "shape", "cosine", "max_abs", "max_rel", "rel<1e-3",
                  "rel<5e-3", "allclose", "result"]
        body = [[str(it.step), it.stage, it.ours, it.ref, "x".join(map(str, it.shape)) or "scalar",
                 f"{it.metrics.cosine:.6f}", f"{it.metrics.max_abs:.3e}", f"{it.metrics.max_rel:.3e}",
                 f"{it.metrics.rel_lt_1e3:.4f}", f"{it.metrics.rel_lt_5e3:.4f}", f"{it.metrics.allclose:.4f}",
                 ("ok" if it.passed else "FAIL " + it.reason) + (" <- first" if it is first else "")]
                for it in rows]
        widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header) - 1)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1] for r in [header, *body]]
        return "\n".join(lines + [self.summary()])

    def to_dict(self) -> dict[str, Any]:
        f = self.first_failure
        return {"passed": self.passed, "mode": self.mode, "single_step": self.single_step, "steps": self.steps,
                "summary": self.summary(), "first_failure": f.to_dict() if f else None,
                "items": [it.to_dict() for it in self.items], "unpaired": self.unpaired, "notes": self.notes}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        atomic_write(path, json.dumps(self.to_dict(), indent=1))
        return path


def _item(stage: str, ours: str, ref: str, a: torch.Tensor, b: torch.Tensor, step: int) -> AlignItem:
    m = compare_tensors(a, b)
    ok, why = judge(m)
    return AlignItem(stage, ours, ref, list(a.shape), m, ok, why, step)


def _once(entries: list[str], entry: str) -> None:
    """Add a note or an unpaired name once: every step of a run repeats the first step's."""
    if entry not in entries:
        entries.append(entry)


def compare_recordings(ours: Recording, ref: Recording, module_name: Callable[[str], str],
                       tensor_name: Callable[[str], str], report: AlignReport, step: int = 1) -> AlignReport:
    """Add to `report` every item both sides recorded of training step `step`, in our order; `*_name` map our
    names to theirs."""
    for call, outs in ours.forward.items():
        rname = module_name(call)
        theirs = ref.forward.get(rname)
        if theirs is None:
            _once(report.unpaired, f"forward:{call}")
            continue
        if len(theirs) != len(outs):
            _once(report.notes, f"{call}: {len(outs)} outputs here, {len(theirs)} in the reference; "
                                f"compared the first {min(len(outs), len(theirs))}")
        for i, (a, b) in enumerate(zip(outs, theirs)):
            suffix = f"[{i}]" if len(outs) > 1 else ""
            report.items.append(_item("forward", call + suffix, rname + suffix, a, b, step))
    if ours.loss is not None and ref.loss is not None:
        report.items.append(_item("loss", "loss", "loss", torch.tensor(ours.loss), torch.tensor(ref.loss), step))
    for stage, mine, theirs in (("backward", ours.grads, ref.grads), ("update", ours.updates, ref.updates)):
        for name, a in mine.items():
            b = theirs.get(tensor_name(name))
            if b is None:
                _once(report.unpaired, f"{stage}:{name}")
            else:
                report.items.append(_item(stage, name, tensor_name(name), a, b, step))
    return report


def compare_steps(ours: Sequence[Recording], ref: Sequence[Recording], module_name: Callable[[str], str],
                  tensor_name: Callable[[str], str], report: AlignReport) -> AlignReport:
    """`compare_recordings` for each training step both sides recorded, in order; `report.steps` says how many."""
    report.steps = min(len(ours), len(ref))
    for k, (a, b) in enumerate(zip(ours, ref)):
        compare_recordings(a, b, module_name, tensor_name, report, step=k + 1)
    return report
