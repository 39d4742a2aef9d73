"""Runs a recipe: build everything from a Config, train, evaluate, predict. The CLI calls these."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import torch

from torchboost import dist
from torchboost.data import build_dataset, build_loader
from torchboost.errors import ConfigError
from torchboost.recipe.build import (build_ema, build_loss, build_loss_scale, build_model, build_optimizer,
                                     build_schedule, effective_lr)
from torchboost.recipe.config import Config, dump_config
from torchboost.seed import seed_everything
from torchboost.train.device import resolve_device
from torchboost.train.profiling import DataStarvationMonitor, ProfilerCallback
from torchboost.train.callbacks import (CheckpointConfig, EarlyStopping, History, LossMonitor, ModelCheckpoint, ProgressBar,
                        TensorBoard, TimeMonitor, is_main_process)
from torchboost.train.model import Model

if TYPE_CHECKING:
    from torchboost.boost.config import BoostPlan


@dataclass
class RunResult:
    output_dir: Path
    last_checkpoint: Optional[Path]
    eval_results: dict
    epochs_done: int
    is_main: bool = True


def output_dir(cfg: Config, override: Optional[str] = None) -> Path:
    return Path(override or cfg.output.format(name=cfg.name))


def train_from_config(cfg: Config, resume: Optional[str] = None, output: Optional[str] = None,
                      log=print, profile: Optional[str] = None) -> RunResult:
    """Train as the recipe says; under torchrun, data-parallel across the ranks. `profile`: a folder for a
    torch.profiler trace of a few steps ("" = OUTPUT/profile)."""
    info = dist.init_distributed(timeout_s=cfg.dist.timeout_s)
    out = output_dir(cfg, output)
    handler = dist.open_worklog(out / "log", info.rank) if info.world_size > 1 else None
    logger = logging.getLogger("torchboost")

    def log_all(msg: str) -> None:  # every rank keeps its own worklog; rank 0 also prints
        if info.is_main:
            log(msg)
        logger.info(msg)

    try:
        with dist.guard("training"):
            return _train(cfg, info, resume, output, log_all, profile)
    finally:
        dist.shutdown()
        if handler is not None:
            logger.removeHandler(handler)
            handler.close()


def _train(cfg: Config, info, resume, output, log, profile) -> RunResult:
    out = output_dir(cfg, output)
    device = info.device if info.world_size > 1 else resolve_device(cfg.train.device)
    seed_everything(cfg.train.seed)  # same init on every rank (DDP also broadcasts rank 0's weights)

    train_ds, eval_ds = build_dataset(cfg.data, "train"), build_dataset(cfg.data, "test")
    # Recorded in the saved config so `predict` normalizes new images exactly like training did.
    stats = train_ds if hasattr(train_ds, "mean") else getattr(train_ds, "transform", None)
    if stats is not None and cfg.data.mean is None:
        cfg.data.mean, cfg.data.std = [float(v) for v in stats.mean], [float(v) for v in stats.std]
    loader_kw = dict(workers=cfg.data.workers, pin_memory=cfg.data.pin_memory and device.type == "cuda",
                     seed=cfg.train.seed, rank=info.rank, world_size=info.world_size)
    train_loader = build_loader(train_ds, cfg.data.batch_size, True, **loader_kw)
    eval_loader = build_loader(eval_ds, cfg.data.eval_batch_size, False, **loader_kw)

    net = build_model(cfg).to(device)
    if cfg.train.init_weights:
        from torchboost.train.checkpoint import load_checkpoint, load_model_state

        state = load_checkpoint(cfg.train.init_weights, map_location=device)
        load_model_state(net, state.get("model", state), source=cfg.train.init_weights)
    hooks: list = []
    plan = None
    accumulation = cfg.train.accumulation_steps
    if cfg.boost.level != "O0" or cfg.boost.config:
        from torchboost.boost import build_boost, resolve_boost

        plan = resolve_boost(cfg.boost.level, cfg.boost.config, world_size=info.world_size)
        if plan.on("grad_accumulation"):
            if accumulation not in (1, plan.grad_accumulation_step):
                raise ConfigError(f"train.accumulation_steps={accumulation} and boost grad_accumulation_step="
                                  f"{plan.grad_accumulation_step} disagree", "set only one of them")
            accumulation = cfg.train.accumulation_steps = plan.grad_accumulation_step
    steps_per_epoch = math.ceil(len(train_loader) / accumulation)
    if plan is not None:
        net, hooks = build_boost(plan, net, total_steps=steps_per_epoch * cfg.train.epochs,
                                 world_size=info.world_size, seed=cfg.train.seed)
        log(plan.describe())
    ema = build_ema(cfg, net)
    adasum = any(type(h).__name__ == "AdasumHook" for h in hooks)
    # Adasum sums orthogonal deltas and averages parallel ones: Horovod advises against linear LR scaling.
    lr = effective_lr(cfg, 1 if adasum else info.world_size)
    optimizer = None
    if plan is not None:
        from torchboost.boost import boost_optimizer

        optimizer = boost_optimizer(plan, net)  # DimReduce when dim_reduce is on
    optimizer = optimizer or build_optimizer(cfg, net, lr, steps_per_epoch)
    loss_scale = build_loss_scale(cfg, device)
    if hasattr(optimizer, "grad_scaler") and loss_scale is not None:
        optimizer.grad_scaler = loss_scale.scaler  # THOR unscales its G factors by the live loss scale
    wrapped = net
    if info.world_size > 1 and not adasum:  # Adasum combines weight deltas itself: no gradient averaging
        freeze = plan is not None and plan.on("grad_freeze")  # frozen layers produce no gradient that step
        wrapped = dist.wrap_ddp(net, info, bucket_cap_mb=cfg.dist.bucket_cap_mb,
                                fusion_config=fusion_config(cfg, plan), sync_bn=cfg.dist.sync_bn,
                                find_unused_parameters=freeze)

    model = Model(wrapped, build_loss(cfg), optimizer, amp_level=cfg.train.amp_level,
                  loss_scale_manager=loss_scale, device=device,
                  amp_dtype=None if cfg.train.amp_dtype == "auto" else cfg.train.amp_dtype,
                  lr_schedule=build_schedule(cfg, lr, steps_per_epoch),
                  clip_global_norm=cfg.train.clip_global_norm, clip_value=cfg.train.clip_value,
                  accumulation_steps=accumulation, ema=ema, hooks=hooks,
                  channels_last=cfg.model.channels_last,
                  per_batch_accuracy=True,  # train top-1 feeds the history's train/validation gap
                  input_norm=(cfg.data.mean, cfg.data.std) if cfg.data.normalize_on_device else None,
                  compile=cfg.model.compile)
    model.extra_state = {"config": cfg.to_dict(), "classes": list(train_ds.classes)}
    if resume:
        ckpt = model.load_checkpoint(resume)
        log(f"resumed from {resume} (epoch {ckpt['epoch'] + 1}, step {ckpt['step_in_epoch']}, "
            f"update {ckpt['global_step']})")

    ckpt_cb = ModelCheckpoint(cfg.checkpoint.prefix, out / "ckpt", CheckpointConfig(
        cfg.checkpoint.save_every_steps, cfg.checkpoint.save_every_epochs, cfg.checkpoint.keep_max))
    # DataStarvationMonitor goes before History: it adds the data-wait figures that History records.
    callbacks = [ProgressBar(None if cfg.train.progress_bar else False),
                 LossMonitor(cfg.train.log_every, show_accuracy=cfg.train.per_batch_accuracy),
                 TimeMonitor(), DataStarvationMonitor(loader=train_loader), ckpt_cb, History(out)]
    if profile is not None:
        callbacks.append(ProfilerCallback(profile or out / "profile"))
    if cfg.train.early_stopping_patience:
        callbacks.append(EarlyStopping(patience=cfg.train.early_stopping_patience))
    try:
        callbacks.append(TensorBoard(out / "tensorboard"))
    except ImportError:
        log("note: TensorBoard not installed; `pip install tensorboard` for event files")
    if is_main_process():
        out.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, out / "config.yaml")
    log(f"training {cfg.model.name} on {cfg.data.dataset} ({len(train_ds)} train / {len(eval_ds)} eval images) "
        f"for {cfg.train.epochs} epochs on {device}, {info.world_size} process(es), "
        f"{steps_per_epoch} updates/epoch, lr {lr:g}")
    state = model.train(cfg.train.epochs, train_loader, callbacks=callbacks, eval_data=eval_loader,
                        eval_every=cfg.train.eval_every, log_fn=log)
    if is_main_process():
        log(f"outputs: checkpoints in {out / 'ckpt'}, history in {out / 'history.jsonl'} and "
            f"{out / 'history.png'}, resolved config in {out / 'config.yaml'}")
    return RunResult(out, ckpt_cb.last_path, state.eval_results, state.epoch + 1, info.is_main)


def model_from_checkpoint(path: str, device: str = "auto") -> tuple[Model, Config, dict]:
    """Rebuild the trained network from a checkpoint's saved config (no recipe needed)."""
    from torchboost.errors import CheckpointError
    from torchboost.recipe.config import _merge
    from torchboost.train.checkpoint import load_checkpoint, load_model_state

    ckpt = load_checkpoint(path)
    if "config" not in ckpt:
        raise CheckpointError(f"{path} has no saved config", "pass a checkpoint written by `torchboost train`")
    cfg = Config()
    _merge(cfg, ckpt["config"])
    dev = resolve_device(device)
    net = build_model(cfg)
    if cfg.boost.level != "O0" or cfg.boost.config:  # less_bn changes the structure: rebuild it first
        from torchboost.boost import resolve_boost, transform_model

        transform_model(resolve_boost(cfg.boost.level, cfg.boost.config), net)
    load_model_state(net, ckpt["model"], source=str(path))
    model = Model(net, build_loss(cfg), device=dev, channels_last=cfg.model.channels_last)
    return model, cfg, ckpt


def evaluate_checkpoint(path: str, data_path: Optional[str] = None, split: str = "test",
                        use_ema: bool = False) -> dict:
    model, cfg, ckpt = model_from_checkpoint(path)
    if data_path:
        cfg.data.path = data_path
        if cfg.data.dataset in ("mnist5k", "digits", "synthetic"):
            cfg.data.dataset = "folder"
    if use_ema:
        if "ema" not in ckpt:
            from torchboost.errors import CheckpointError

            raise CheckpointError(f"{path} has no EMA weights", "drop --ema or use a run trained with EMA")
        model.network.load_state_dict(ckpt["ema"]["module"])
    ds = build_dataset(cfg.data, split)
    return model.eval(build_loader(ds, cfg.data.eval_batch_size, False, workers=cfg.data.workers))


def fusion_config(cfg: Config, plan: BoostPlan | None) -> list[int] | None:
    """All-reduce split points: dist.fusion_config, else boost common.gradient_split_groups (MindSpore's
    boost name for the same all_reduce_fusion_config), else None (DDP's byte-sized buckets)."""
    if cfg.dist.fusion_config:
        return list(cfg.dist.fusion_config)
    groups = plan.common_options.gradient_split_groups if plan is not None else ()
    return list(groups) or None


def predict_images(path: str, images: list[str], topk: int = 5) -> list[list[tuple[str, float]]]:
    """Top-k (class, probability) for each image file, preprocessed like the run's evaluation data."""
    from torchboost.data import eval_preprocess, read_image

    model, cfg, ckpt = model_from_checkpoint(path)
    classes = ckpt.get("classes") or [str(i) for i in range(cfg.model.num_classes)]
    transform = eval_preprocess(cfg.data)
    batch = torch.stack([read_image(p, transform) for p in images])
    probs = model.predict(batch).softmax(dim=1)
    k = min(topk, probs.shape[1])
    top = probs.topk(k, dim=1)
    return [[(classes[i], float(p)) for p, i in zip(ps.tolist(), idx.tolist())]
            for ps, idx in zip(top.values, top.indices)]
