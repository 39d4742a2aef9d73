"""What a training run says about itself: the start-up line (model, input, data and the split evaluated,
how the lr was derived), warnings before the first update, the lr a resume with a changed schedule continues
at, and the advice for a run stuck at chance. Each line names what it was computed on."""

from __future__ import annotations

import math
import os
from typing import Callable, Optional

import torch

from torchboost.recipe.build import global_batch
from torchboost.recipe.config import Config
from torchboost.recipe.data import eval_preprocess, split_source
from torchboost.recipe.diff import flatten
from torchboost.recipe.kinds import get_kind
from torchboost.recipe.resolve import MIN_UPDATES, more_updates
from torchboost.recipe.resume import schedule_keys
from torchboost.train.device import amp_dtype_for, cpu_has_bf16


def schedule_note(ckpt: dict, cfg: Config, schedule, path: str) -> Optional[str]:
    """The line a resume that changed the lr schedule prints (None when the schedule's keys are the run's): the
    lr the resumed update takes on the new schedule beside the one the checkpoint's last update took."""
    saved = flatten(ckpt.get("config") or {})
    now = flatten(cfg.to_dict())
    changed = schedule_keys(k for k in now if k in saved and saved[k] != now[k])
    if not changed:
        return None
    step = int(ckpt.get("global_step", 0))
    groups = ckpt.get("optimizer", {}).get("param_groups") or [{}]
    was = groups[0].get("lr", float("nan")) / groups[0].get("lr_scale", 1)
    at = f"lr {schedule[step]:.4g}" if step < len(schedule) else "no update left"
    return (f"resume: the lr schedule changed ({', '.join(f'{k} {saved[k]} -> {now[k]}' for k in changed[:3])}): "
            f"update {step + 1} continues at {at} (the checkpoint's last update took lr {was:.4g}), ending at lr "
            f"{schedule[-1]:.4g} after {len(schedule)} updates ({cfg.schedule.mode} over {cfg.train.epochs} epochs)")


def warnings_for(cfg: Config, device: torch.device, world_size: int, steps_per_epoch: int = MIN_UPDATES,
                 images: int = 0) -> list[str]:
    """What a user should know before the first update: too few updates an epoch (`steps_per_epoch` from
    `images` training images) to learn from, settings that cost speed here."""
    notes = []
    if steps_per_epoch < MIN_UPDATES:
        notes.append(f"{steps_per_epoch} update(s) per epoch are few to learn from (the lr warm-up and BatchNorm's "
                     f"running statistics count in updates); {more_updates(images, cfg.model.name)}")
    cores = os.cpu_count() or 1
    if cfg.data.workers > cores:
        notes.append(f"data.workers={cfg.data.workers} on {cores} CPU cores: more workers than cores compete "
                     f"with training for the CPU; try data.workers={max(cores - 1, 0)}")
    t = cfg.train
    dtype = None if t.amp_dtype == "none" else amp_dtype_for(device, t.amp_dtype)
    if dtype == torch.bfloat16 and device.type == "cpu" and not cpu_has_bf16():
        notes.append(f"train.amp_dtype={t.amp_dtype} uses bf16, which this CPU lacks (no AVX-512-BF16/AMX): it is "
                     "emulated and about 2x slower than fp32; use --set train.amp_dtype=none here")
    if dtype == torch.float16 and t.loss_scale == "none":
        notes.append("float16 autocast without loss scaling: its small gradients underflow (measured on CPU: "
                     "training stays at chance); add --set train.loss_scale=dynamic, or use train.amp_dtype=bfloat16")
    return notes


def chance_advice(cfg: Config, net: torch.nn.Module, lr: float, steps_per_epoch: int, images: int
                  ) -> Callable[[dict], str]:
    """The likely cause and fix of a run whose validation and training stay at chance, from an epoch's results
    (`ChanceMonitor`): a loss that diverged (a smaller lr), too few updates an epoch (a smaller batch), else a
    smaller lr and the folders checked. A network without BatchNorm (the MNIST CNN) is also offered one with
    it, which trains from any image statistics."""
    bn = has_batchnorm_layers(net)

    def advice(results: dict) -> str:
        loss = float(results.get("val_loss", float("nan")))
        if not math.isfinite(loss) or loss > 3 * math.log(cfg.model.num_classes):
            fix = f"the loss diverged (validation loss {loss:.4g}): lower the lr (--lr {lr / 10:g})"
        elif steps_per_epoch < MIN_UPDATES:
            fix = (f"{steps_per_epoch} update(s) an epoch are too few to learn from: "
                   f"{more_updates(images, cfg.model.name)}, or train more epochs")
        else:
            fix = f"lower the lr (--lr {lr / 10:g}), and check that each class folder holds its own class's images"
        if bn:
            return fix
        return (f"{cfg.model.name} has no BatchNorm, and diverges or stalls on data unlike its recipe's: {fix}, or "
                "train a BatchNorm network (--set model.name=resnet20)")
    return advice


def mismatch_advice(cfg: Config, net: torch.nn.Module, steps_per_epoch: int) -> Callable[[dict], str]:
    """The likely cause and fix of validation at chance while training accuracy rises (`ChanceMonitor`): for a
    BatchNorm network evaluated with its running averages, those averages trailing weights that moved fast in
    few updates (recomputed by train.precise_bn); else validation images unlike the training ones."""
    check = ("check that val/ holds images like train/'s under the same class names (the same size, colours "
             "and preprocessing)")

    def advice(results: dict) -> str:
        if has_batchnorm_layers(net) and not cfg.train.precise_bn:
            return (f"BatchNorm's running statistics, which evaluation normalises with, trail weights that moved "
                    f"fast ({steps_per_epoch} update(s) an epoch): recompute them before each evaluation with "
                    f"--set train.precise_bn=10, or train more updates; else {check}")
        return check + ", and that the network does not memorise its few training images (add images)"
    return advice


def has_batchnorm_layers(net: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in net.modules())


def describe_run(cfg: Config, train_ds, eval_ds, device: torch.device, world_size: int, steps_per_epoch: int,
                 lr: float) -> str:
    """The start-up line: what trains on what, and how the learning rate was derived."""
    lr_text = f"lr {lr:g}"
    if cfg.optim.lr_reference_batch is not None:
        lr_text += (f" (optim.lr {cfg.optim.lr:g} per {cfg.optim.lr_reference_batch} images, scaled to the "
                    f"global batch of {global_batch(cfg, world_size)})")
    d = cfg.data
    prep = "" if get_kind(d.dataset).in_memory else ", " + eval_preprocess(d).describe()
    where = f"{d.dataset} {d.path}" if d.path else d.dataset
    size = f"{d.image_size}×{d.image_size} px input" if d.image_size else "native-size input"
    return (f"training {cfg.model.name} ({cfg.model.num_classes} classes, {cfg.model.in_chans} channel(s), {size}) "
            f"on {where} ({len(train_ds)} train images; evaluated on {split_source(d, 'test')}: {len(eval_ds)} "
            f"images{prep}) for {cfg.train.epochs} epochs on {device}, {world_size} "
            f"process(es), {steps_per_epoch} updates/epoch, {how_trained(cfg, lr_text)}, "
            f"{torch.get_num_threads()} thread(s)")


def how_trained(cfg: Config, lr_text: str) -> str:
    """The optimizer and lr, augmentation, weight averaging and test-time augmentation of a resolved config."""
    o, d, t = cfg.optim, cfg.data, cfg.train
    optimizer = o.name + (f" (momentum {o.momentum:g})" if o.momentum else "")
    augment = {"shift": f"shift ±{d.random_shift} px", "imagenet": "imagenet (random resized crop + flip)"
               }.get(d.augment, d.augment)
    extra = [f"{d.auto_augment}" if d.auto_augment != "none" else "",
             f"random erasing {d.random_erasing:g}" if d.random_erasing else "",
             f"mixup {d.mixup_alpha:g}" if d.mixup_alpha else "", f"cutmix {d.cutmix_alpha:g}" if d.cutmix_alpha else ""]
    augment = " + ".join([augment, *filter(None, extra)])
    averaging = [t.average] if t.average != "none" else []
    averaging += [f"EMA {t.ema.decay:g}"] if t.ema.enabled else []
    return (f"optimizer {optimizer}, {lr_text}, augmentation {augment}, averaging {' + '.join(averaging) or 'none'}, "
            f"TTA {cfg.eval.tta}")
