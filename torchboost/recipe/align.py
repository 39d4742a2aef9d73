"""`torchboost align` from recipes: build our side from a config, pick the reference, run `align`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import nn
from torch.utils.data import Dataset

from torchboost.errors import ConfigError
from torchboost.migrate.align import (DEFAULT_STEPS, Batch, NameMap, align_dump, align_modules, dump_step,
                                      load_reference)
from torchboost.migrate.align_report import AlignReport
from torchboost.recipe.build import build_loss, build_model, effective_lr, optimizer_from_config
from torchboost.recipe.config import Config
from torchboost.recipe.load import load_resolved
from torchboost.seed import seed_everything


def config_batch(cfg: Config, eval_ds: Dataset, batch_size: int, source: str = "random", seed: int = 0) -> Batch:
    """The batch both sides see. "random": seeded N(0,1) images of the recipe's shape (no data needed;
    alignment checks the implementation, not the data). "data": the first images of the recipe's test
    split `eval_ds` (deterministic evaluation preprocessing, unlike the random training augmentation).
    `cfg` is a resolved config (`recipe.load.load_resolved`)."""
    if source == "random":
        g = torch.Generator().manual_seed(seed)
        size = cfg.data.image_size
        x = torch.randn(batch_size, cfg.model.in_chans, size, size, generator=g)
        return x, torch.randint(0, cfg.model.num_classes, (batch_size,), generator=g)
    if source == "data":
        xs, ys = zip(*(eval_ds[i] for i in range(min(batch_size, len(eval_ds)))))
        return torch.stack(xs), torch.as_tensor(ys, dtype=torch.long)
    raise ConfigError(f"unknown batch source '{source}'", "use random or data")


def _name_map(spec: Optional[str], cfg: Config) -> Optional[NameMap]:
    if spec is None:
        return None
    if spec == "mindspore":
        return NameMap.mindspore_resnet(cfg.model.name, cfg.model.num_classes)
    if not Path(spec).is_file():
        raise ConfigError(f"name map {spec} not found", "pass a JSON file {our name: reference name} or 'mindspore'")
    return NameMap.from_json(spec)


def _build(cfg: Config) -> nn.Module:
    seed_everything(cfg.train.seed)
    return build_model(cfg)


def align_from_config(config: str, *, reference: Optional[str] = None, reference_config: Optional[str] = None,
                      reference_dump: Optional[str] = None, overrides: Sequence[str] = (),
                      reference_overrides: Sequence[str] = (), batch_size: int = 8, batch_source: str = "random",
                      single_step: bool = False, name_map: Optional[str] = None,
                      dump_ours: Optional[str] = None, steps: int = DEFAULT_STEPS) -> AlignReport | Path:
    """What `torchboost align` runs: `steps` training steps on each side. Exactly one of reference /
    reference_config / reference_dump, or dump_ours alone (write our steps as a dump directory for another
    framework; returns its path).
    Loss and optimizer come from `config`; a `reference_config` side is rebuilt whole from its own recipe and
    `reference_overrides` (network, loss and optimizer), so a difference in any of them shows."""
    chosen = [s for s in (reference, reference_config, reference_dump, dump_ours) if s]
    if len(chosen) != 1:
        raise ConfigError("align needs exactly one of --reference, --reference-config, --reference-dump, "
                          "--dump-ours", "pick the reference implementation to compare with")
    cfg, _, eval_ds = load_resolved(config, overrides)
    model, nm = _build(cfg), _name_map(name_map, cfg)
    batch = config_batch(cfg, eval_ds, batch_size, batch_source, cfg.train.seed)
    kw = dict(loss_fn=build_loss(cfg), optimizer=lambda m: optimizer_from_config(cfg, m, effective_lr(cfg, 1)),
              name_map=nm, seed=cfg.train.seed, steps=steps)
    if dump_ours:
        return dump_step(model, batch, dump_ours, **kw)
    if reference_dump:
        return align_dump(model, reference_dump, single_step=single_step, **kw)
    if reference:
        return align_modules(model, load_reference(reference), batch, single_step=single_step, **kw)
    ref_cfg = load_resolved(reference_config, reference_overrides)[0]
    return align_modules(model, _build(ref_cfg), batch, single_step=single_step, reference_loss_fn=build_loss(ref_cfg),
                         reference_optimizer=lambda m: optimizer_from_config(ref_cfg, m, effective_lr(ref_cfg, 1)), **kw)
