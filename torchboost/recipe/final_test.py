"""The end of `train` (`train.test_at_end`): the best checkpoint evaluated once on the test split when the
data has one beside its validation split — never used for any choice (the best checkpoint and early stopping
read the validation split) — else on the validation split itself, said as such; with per-class results
(`recipe.per_class`) written to OUTPUT/<split>/ and the figures added to the history and tracking."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from torchboost.data import build_loader, loader_skipped
from torchboost.recipe.config import Config
from torchboost.recipe.data import build_dataset, eval_split_name, has_test_split, split_source
from torchboost.recipe.per_class import folder_files, per_class_report, summary_lines, write_per_class
from torchboost.train.callbacks import ModelCheckpoint
from torchboost.train.checkpoint import load_checkpoint, load_model_state
from torchboost.train.per_class import ClassTally
from torchboost.train.state import Callback, TrainState


class FinalTest(Callback):
    """After the last epoch (on the main process of a one-process run): the best checkpoint (else the last
    weights) on the test split, or on the validation split when there is no other; the network keeps its
    last weights afterwards."""

    def __init__(self, cfg: Config, out: Path, ckpt_cb: ModelCheckpoint, log: Callable[[str], None],
                 world_size: int) -> None:
        self.cfg, self.out, self.ckpt_cb, self.log, self.world_size = cfg, out, ckpt_cb, log, world_size

    def on_train_end(self, state: TrainState) -> None:
        if self.world_size > 1:
            self.log("note: the test split is not evaluated at the end of a run on several processes: "
                     f"torchboost eval --checkpoint {self.ckpt_cb.best_path} --split test")
            return
        d, k = self.cfg.data, self.cfg.model.num_classes
        if d.holdout:  # a run that makes choices reads no split but its held-out training images
            self.log(f"note: data.holdout={d.holdout}: the held-out images were evaluated each epoch and no other split "
                     "is read (the test split stays unseen)")
            return
        test = has_test_split(d)
        split = "test" if test else eval_split_name(d)
        ds = build_dataset(d, "test", k, exact=test)
        loader = build_loader(ds, d.eval_batch_size, False, workers=d.workers)
        best = self.ckpt_cb.best_path if self.ckpt_cb.best is not None and self.ckpt_cb.best_path.is_file() else None
        model = state.model
        last = {name: t.detach().clone() for name, t in model.module.state_dict().items()}
        tally = ClassTally(k)
        try:
            if best is not None:
                load_model_state(model.module, load_checkpoint(best, map_location="cpu")["model"], str(best))
            results = model.eval(loader, tally=tally)
        finally:
            model.module.load_state_dict(last)
        source = split_source(d, "test", exact=test)
        weights = f"the best checkpoint ({best.name})" if best is not None else "the last weights"
        role = "never used for any choice" if test else "the split the best checkpoint was chosen on: no other split"
        self.log(f"{split} ({role}): top-1 {results['top_1_accuracy']:.4f}, loss {results['loss']:.4f} on {source}, "
                 f"{results['samples']} images, {weights}")
        report = per_class_report(tally, list(ds.classes), folder_files(ds, loader_skipped(loader)))
        for line in summary_lines(report):
            self.log(line)
        written = write_per_class(report, self.out / split, f"{split}: {source}, {weights}", self.log)
        self.log(f"per-class results: {', '.join(str(p) for p in written)}")
        if test:  # the validation split's figures are already the epochs' own
            state.final_results = {f"test_{key}": float(v) for key, v in results.items()
                                   if isinstance(v, (int, float)) and not isinstance(v, bool)}

