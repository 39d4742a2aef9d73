"""Train from a Config: validate, load the data, resolve the config, build the objects, train.

`train_from_config` reads like the list of steps a run takes; each step is a small function that reads
the (resolved) config and returns what it built. Nothing here changes the Config it is given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader

from torchboost import distributed as dist
from torchboost.boost import BoostPlan, boost_optimizer, build_boost, resolve_boost
from torchboost.data import build_loader, loader_skipped
from torchboost.errors import CheckpointError, ConfigError, DataError, OutputError, TorchboostError
from torchboost.fileio import cache_dir
from torchboost.optim.registry import get_optimizer
from torchboost.recipe.build import (build_ema, build_grad_scaler, build_loss, build_model, optimizer_from_config,
                                     build_schedule, effective_lr, global_batch)
from torchboost.recipe.callbacks import build_callbacks
from torchboost.recipe.config import Config, dump_config
from torchboost.recipe.data import input_norm, load_data, split_source
from torchboost.recipe.diff import flatten
from torchboost.recipe.manifest import ManifestCallback, read_manifest, snapshot
from torchboost.recipe.outputs import claim_output, write_config
from torchboost.recipe.resolve import fit_batch, resolve_config
from torchboost.recipe.run_says import (chance_advice, describe_run, mismatch_advice, schedule_note,
                                       warnings_for)
from torchboost.recipe.validation import validated
from torchboost.scratch import users_own
from torchboost.seed import seed_everything
from torchboost.train.callbacks import ChanceMonitor
from torchboost.train.checkpoint import load_backbone, load_checkpoint, saved_classes
from torchboost.train.device import amp_dtype_for, resolve_device
from torchboost.train.model import Model
from torchboost.train.step import StepOptions

Log = Callable[[str], None]


@dataclass
class RunResult:
    output_dir: Path
    last_checkpoint: Optional[Path]
    eval_results: dict
    epochs_done: int
    config: Config  # the resolved config the run trained with
    is_main: bool = True
    final_results: dict = dataclasses.field(default_factory=dict)  # the test split's, after the last epoch


def output_dir(cfg: Config, override: Optional[str] = None) -> Path:
    return Path(override or cfg.output.format(name=cfg.name))


def train_from_config(cfg: Config, resume: Optional[str] = None, output: Optional[str] = None, log: Log = print,
                      profile: Optional[str] = None, overwrite: bool = False) -> RunResult:
    """Train as the config says; under torchrun, data-parallel across the ranks. `profile`: a folder for a
    torch.profiler trace of a few steps ("" = OUTPUT/profile). `overwrite` replaces an earlier run's
    files in the output folder (otherwise such a folder is refused unless resuming)."""
    validated(cfg)  # configs built in Python get the same checks as recipe files (once: see recipe.validation)
    out = output_dir(cfg, output)
    job = job_for(cfg, resume, out) if dist.read_env() is not None else None  # no job, no checkpoint to hash
    info = dist.init_distributed(timeout_s=cfg.dist.timeout_s, join_timeout_s=cfg.dist.join_timeout_s, job=job)
    handler = dist.open_worklog(out / "log", info.rank) if info.world_size > 1 else None
    logger = logging.getLogger("torchboost")

    def log_all(msg: str) -> None:  # every rank keeps its own worklog; rank 0 also prints
        if info.is_main:
            log(msg)
        logger.info(msg)

    try:
        with dist.guard("training"):
            return _train(cfg, info, out, resume, overwrite, log_all, profile)
    except Exception as e:  # the worklog keeps why this rank stopped (a failed `launch` points there)
        if handler is not None:
            logger.error("stopped: %s", e, exc_info=not isinstance(e, TorchboostError))
        raise
    finally:
        dist.shutdown()
        if handler is not None:
            logger.removeHandler(handler)
            handler.close()


def job_for(cfg: Config, resume: Optional[str], out: Path) -> dict[str, object]:
    """What every rank must hold before the job forms (`dist.init_distributed`): the checkpoint it resumes
    from, the output folder and the config. A rank resuming alone would otherwise fail its own checks (or train
    another run) while the others wait for it inside a collective."""
    return {"resume": resumed_from(resume), "output": str(out), **flatten(cfg.to_dict())}


def resumed_from(resume: Optional[str]) -> dist.Described:
    """The checkpoint a rank resumes from, compared by content: the same file reached by another path (relative
    on one node, absolute on another) agrees."""
    if not resume:
        return dist.Described(None, "starts fresh")
    path = Path(resume)
    try:
        if not path.is_file():  # a FIFO would block the hash; load_checkpoint says what is wrong
            return dist.Described(f"not a file: {resume}", f"resumes from {resume}, which is not a file")
        with path.open("rb") as f:
            return dist.Described(hashlib.file_digest(f, "sha256").hexdigest(), f"resumes from {resume}")
    except OSError as e:
        return dist.Described(f"unreadable: {resume}", f"cannot read {resume} ({e.strerror or e})")


def _train(cfg: Config, info: dist.DistInfo, out: Path, resume: Optional[str], overwrite: bool, log: Log,
           profile: Optional[str]) -> RunResult:
    device = info.device if info.world_size > 1 else resolve_device(cfg.train.device)
    if cfg.train.threads is not None:
        torch.set_num_threads(cfg.train.threads)
    seed_everything(cfg.train.seed)  # same init on every rank (DDP also broadcasts rank 0's weights)
    data_cfg, train_ds, eval_ds = load_data(cfg, holdout=cfg.data.holdout)
    plan = boost_plan(cfg, info.world_size)
    share = train_ds.share(info.world_size) if hasattr(train_ds, "share") else None  # shards: whole shards per rank
    run_cfg, batch_note = fit_batch(resolve_config(cfg, data_cfg, train_ds, plan), len(train_ds), info.world_size, share)
    # the folder the run writes, not the template that named it (a template's braces doubled: it stays one);
    # the threads that ran (timings depend on them)
    run_cfg = dataclasses.replace(run_cfg, output=str(out).replace("{", "{{").replace("}", "}}"),
                                  train=dataclasses.replace(run_cfg.train, threads=torch.get_num_threads()))
    if batch_note:
        log(f"note: {batch_note}")
    if share is not None and share * info.world_size < len(train_ds):
        log(f"note: {len(train_ds) - share * info.world_size} of {len(train_ds)} training images sit out each epoch "
            f"(which ones changes per epoch): each of the {info.world_size} process(es) reads whole shards and all "
            "take the same count; shards of equal size, a multiple of the process count, use every image")
    train_loader, eval_loader = build_loaders(run_cfg, train_ds, eval_ds, info, device)
    dist.agree({**flatten(run_cfg.to_dict()), "training images": len(train_ds), "evaluation images": len(eval_ds)})
    steps_per_epoch = math.ceil(len(train_loader) / run_cfg.train.accumulation_steps)
    images = share or len(train_ds) // info.world_size  # a process's training images an epoch
    for note in warnings_for(run_cfg, device, info.world_size, steps_per_epoch, images):
        log(f"warning: {note}")

    ckpt = None
    if resume:  # read once, checked before the output folder is touched, restored by Model
        ckpt = load_checkpoint(resume, map_location=device)
        check_same_run(ckpt, resume, run_cfg)
        if not get_optimizer(run_cfg.optim.name).resumable:
            raise ConfigError(f"optim.name={run_cfg.optim.name} keeps optimizer state torchboost cannot check and "
                              f"restore (per-layer eigenbases), so {resume} cannot be resumed",
                              f"start a new run from its weights with --set train.init_weights={resume}")
        check_same_world(ckpt, resume, run_cfg, info.world_size)
        check_classes_unchanged(ckpt, resume, list(train_ds.classes))
        check_epochs_left(ckpt, resume, run_cfg.train.epochs)
    with output_claimed(out, resume, overwrite, info, run_cfg.checkpoint.prefix), compiler_cache():
        before, previous = snapshot(out), read_manifest(out) if resume else {}
        net, hooks = build_network(run_cfg, plan, device, steps_per_epoch, info, log, train_loader)
        model, lr = build_trainer(run_cfg, plan, net, hooks, device, steps_per_epoch, info)
        model.extra_state = {"config": run_cfg.to_dict(), "classes": list(train_ds.classes),
                             "world_size": info.world_size}
        if ckpt is not None:
            model.load_checkpoint(resume, ckpt=ckpt)
            log(f"resumed from {resume} (epoch {ckpt['epoch'] + 1}, step {ckpt['step_in_epoch']}, "
                f"update {ckpt['global_step']})")
            note = schedule_note(ckpt, run_cfg, build_schedule(run_cfg, lr, steps_per_epoch), resume)
            if note:
                log(note)
        callbacks, ckpt_cb = build_callbacks(run_cfg, out, train_loader, profile, log)
        callbacks.append(ChanceMonitor(run_cfg.model.num_classes,
                                       chance_advice(run_cfg, net, lr, steps_per_epoch, images),
                                       mismatch=mismatch_advice(run_cfg, net, steps_per_epoch)))
        if info.is_main:  # last: it records what the others wrote (see recipe.manifest)
            callbacks.append(ManifestCallback(out, before, previous))
        if info.is_main:
            write_config(out, dump_config(run_cfg))
        log(describe_run(run_cfg, train_ds, eval_ds, device, info.world_size, steps_per_epoch, lr))
        state = model.train(run_cfg.train.epochs, train_loader, callbacks=callbacks, eval_data=eval_loader,
                            eval_every=run_cfg.train.eval_every, log_fn=log, eval_name=split_source(run_cfg.data, "test"))
    skipped = loader_skipped(train_loader) + loader_skipped(eval_loader)
    if skipped:
        log(f"skipped {skipped} corrupt image(s) (data.skip_corrupt=true); each was named in a note")
    if info.is_main:
        history = (f", history in {out / 'history.jsonl'} and {out / 'history.png'}"
                   if "csv" in run_cfg.train.loggers else "")  # train.loggers without csv writes none
        log(f"outputs: checkpoints in {out / 'ckpt'}{history}, resolved config in {out / 'config.yaml'}")
    return RunResult(out, ckpt_cb.last_path, state.eval_results, state.epoch + 1, run_cfg, info.is_main,
                     state.final_results)


def check_classes_unchanged(ckpt: dict, path: str, classes: list[str]) -> None:
    """Labels are class indices: a resumed run on data whose class folders changed would shift them."""
    saved = saved_classes(ckpt, None, path)
    if saved is not None and saved != classes:
        diff = sorted(set(map(str, saved)) ^ set(classes))[:3]
        raise DataError(f"the data's classes differ from those {path} was trained on ({', '.join(diff) or 'order'})",
                        "resume on the same class folders, or start a new run with train.init_weights")


def check_same_run(ckpt: dict, path: str, cfg: Config) -> None:
    """A checkpoint continues only the run that wrote it: same network and optimizer (their states
    would not fit otherwise). Starting elsewhere from its weights is `train.init_weights`."""
    saved = ckpt.get("config")
    if not isinstance(saved, dict):
        return  # not written by `torchboost train`: Model.load_checkpoint says what is missing
    fix = f"resume with the checkpoint's settings, or start a new run from its weights with train.init_weights={path}"
    for section, key in (("model", "name"), ("optim", "name"), ("model", "num_classes"), ("model", "padding")):
        was, now = saved.get(section, {}).get(key), getattr(getattr(cfg, section), key)
        if was is not None and was != now:
            raise CheckpointError(f"{path} was trained with {section}.{key}={was}, this run has {now}", fix)


def check_epochs_left(ckpt: dict, path: str, epochs: int) -> None:
    epoch, complete = ckpt.get("epoch", 0), ckpt.get("epoch_complete", False)
    if type(epoch) is not int or type(complete) is not bool:
        return  # not a count: Model.load_checkpoint refuses the file, naming the field
    done = epoch + (1 if complete else 0)
    if done >= epochs:
        raise ConfigError(f"{path} has already trained {done} epoch(s) and train.epochs={epochs}: there is nothing "
                          "left to train", "to train on, give more epochs and --force (--epochs N --force): the lr "
                          "schedule is then recomputed for N epochs, and the lr it continues at is printed")


def check_same_world(ckpt: dict, path: str, cfg: Config, world_size: int) -> None:
    """A run continues on as many processes as it was trained with: the data order (each process's share of
    the epoch's permutation), the global batch, the learning rate derived from it and the number of updates per
    epoch all depend on the process count, so another count would silently train a different run."""
    saved = ckpt.get("world_size")
    if not isinstance(saved, int) or saved == world_size:
        return  # checkpoints written before the count was recorded say nothing either way
    raise ConfigError(f"{path} was trained with {saved} process(es), this run has {world_size} (the data order, the "
                      f"global batch of {global_batch(cfg, saved)} and its learning rate depend on the count)",
                      f"resume it with {saved} process(es) (torchrun --nnodes x --nproc_per_node = {saved}), or start "
                      f"a new run from its weights with --set train.init_weights={path}")


def boost_plan(cfg: Config, world_size: int) -> BoostPlan | None:
    """The boost plan when boost is on (its world-size checks need the real process count)."""
    if cfg.boost.level == "O0" and not cfg.boost.config:
        return None
    return resolve_boost(cfg.boost.level, cfg.boost.config, world_size=world_size)


def build_loaders(cfg: Config, train_ds, eval_ds, info: dist.DistInfo, device: torch.device
                  ) -> tuple[DataLoader, DataLoader]:
    kw = dict(workers=cfg.data.workers, pin_memory=cfg.data.pin_memory and device.type == "cuda",
              seed=cfg.train.seed, rank=info.rank, world_size=info.world_size)
    # recipe.resolve.fit_batch made the batch fit: every epoch has at least one update
    loaders = build_loader(train_ds, cfg.data.batch_size, True, **kw), build_loader(eval_ds, cfg.data.eval_batch_size,
                                                                                    False, **kw)
    if cfg.data.decode == "device" and device.type == "cuda":  # nvJPEG one batch ahead, off the step's stream
        from torchboost.data.prefetch import DevicePrefetcher

        loaders = tuple(DevicePrefetcher(loader, device) for loader in loaders)
    return loaders


def check_stem(cfg: Config, state: dict, own: dict) -> None:
    """ImageNet ResNet weights (7x7 stem) onto small images (3x3 small-input stem), or the reverse: name the
    key that decides it rather than a tensor shape."""
    theirs, ours = state.get("conv1.weight"), own.get("conv1.weight")
    resnets = "layer1.0.conv1.weight" in state and "layer1.0.conv1.weight" in own  # another network: not a stem
    if not resnets or theirs is None or ours is None or theirs.ndim != 4 or theirs.shape[-1] == ours.shape[-1]:
        return
    k, here = theirs.shape[-1], ours.shape[-1]
    fix = ("set model.small_input=false (ImageNet-stem weights; with data.image_size >= 65, e.g. 224)" if k > here
           else "set model.small_input=true")
    raise ConfigError(f"train.init_weights {cfg.train.init_weights} has a {k}x{k} stem (conv1) but this "
                      f"{cfg.model.name} has a {here}x{here} one (model.small_input={cfg.model.small_input})", fix)


def build_network(cfg: Config, plan: BoostPlan | None, device: torch.device, steps_per_epoch: int,
                  info: dist.DistInfo, log: Log, train_loader: Iterable = ()) -> tuple[nn.Module, list]:
    """The model on its device, its whitening stem set from `train_loader`'s first images, with init_weights
    loaded and boost's structural changes and hooks."""
    net = build_model(cfg, train_loader).to(device)
    if cfg.train.init_weights:
        # any registered weight format; MindSpore/Paddle names are mapped to the network's (names only: a
        # head for another class count is left to load_backbone)
        from torchboost.migrate.formats import read_torch_named  # the weight readers: only for init_weights

        state = read_torch_named(cfg.train.init_weights, cfg.model.name, None, net.state_dict())
        check_stem(cfg, state, net.state_dict())
        fresh = load_backbone(net, state, source=cfg.train.init_weights)
        if fresh:
            shapes = "x".join(map(str, state[fresh[0]].shape))
            log(f"init_weights: loaded {len(state) - len(fresh)} tensors of {cfg.train.init_weights}; "
                f"{', '.join(fresh)} re-initialised ({shapes} in the file, {cfg.model.num_classes} classes here)")
    if plan is None:
        return net, []
    net, hooks = build_boost(plan, net, total_steps=steps_per_epoch * cfg.train.epochs,
                             world_size=info.world_size, seed=cfg.train.seed)
    log(plan.describe())
    return net, hooks


def build_trainer(cfg: Config, plan: BoostPlan | None, net: nn.Module, hooks: list, device: torch.device,
                  steps_per_epoch: int, info: dist.DistInfo) -> tuple[Model, float]:
    """(Model with optimizer, schedule, loss scaling, EMA and DDP, the learning rate it starts from)."""
    adasum = plan is not None and plan.on("adasum")
    # Adasum sums orthogonal deltas and averages parallel ones: Horovod advises against linear LR scaling.
    lr = effective_lr(cfg, 1 if adasum else info.world_size)
    ema = build_ema(cfg, net)
    optimizer = (boost_optimizer(plan, net) if plan is not None else None) or \
        optimizer_from_config(cfg, net, lr, steps_per_epoch)  # DimReduce when boost's dim_reduce is on
    scaler = build_grad_scaler(cfg, device)  # TrainStep gives it to the optimizer (optim.protocol)
    wrapped = net
    if info.world_size > 1 and not adasum:  # Adasum combines weight deltas itself: no gradient averaging
        freeze = plan is not None and plan.on("grad_freeze")  # frozen layers produce no gradient that step
        wrapped = dist.wrap_ddp(net, info, bucket_cap_mb=cfg.dist.bucket_cap_mb,
                                fusion_config=fusion_config(cfg, plan), sync_bn=cfg.dist.sync_bn,
                                find_unused_parameters=freeze)
    t = cfg.train
    step = StepOptions(lr_schedule=build_schedule(cfg, lr, steps_per_epoch), clip_global_norm=t.clip_global_norm,
                       clip_value=t.clip_value, ema=ema, hooks=hooks, channels_last=cfg.model.channels_last,
                       compute_accuracy=True,  # train top-1 feeds the history's train/validation gap
                       input_norm=input_norm(cfg.data),
                       nonfinite=t.nonfinite, max_nonfinite_steps=t.max_nonfinite_steps,
                       # the host reads the loss when it logs it anyway, and before each step checkpoint
                       check_every=math.gcd(t.log_every, cfg.checkpoint.save_every_steps), compile=t.compile)
    amp_dtype = None if t.amp_dtype == "none" else amp_dtype_for(device, t.amp_dtype)
    if t.cast_network:
        net.to(amp_dtype)  # the weights too (MindSpore's O3): DDP above wraps the same module
    model = Model(wrapped, build_loss(cfg), optimizer, metrics=t.metrics, amp_dtype=amp_dtype,
                  grad_scaler=scaler, device=device,
                  accumulation_steps=t.accumulation_steps, tta=cfg.eval.tta, precise_bn=t.precise_bn, options=step)
    return model, lr


def fusion_config(cfg: Config, plan: BoostPlan | None) -> list[int] | None:
    """All-reduce split points: dist.fusion_config, else boost common.gradient_split_groups (MindSpore's
    boost name for the same all_reduce_fusion_config), else None (DDP's byte-sized buckets)."""
    if cfg.dist.fusion_config:
        return list(cfg.dist.fusion_config)
    groups = plan.common_options.gradient_split_groups if plan is not None else ()
    return list(groups) or None


COMPILER_CACHES = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}


@contextlib.contextmanager
def compiler_cache() -> Iterator[None]:
    """While a run trains, the compiler's caches (torch.compile's, and the fused optimizers' CPU kernels) go
    under the run (`fileio.cache_dir`), not $TMPDIR (the user's own variables win); the environment is put
    back after."""
    set_here = {k: os.environ.get(k) for k in COMPILER_CACHES if not users_own(k) and cache_dir(k) is not None}
    for key in set_here:
        os.environ[key] = str(cache_dir(COMPILER_CACHES[key]))
    try:
        yield
    finally:
        for key, before in set_here.items():  # the command's private folder's, or unset
            if before is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = before





@contextlib.contextmanager
def output_claimed(out: Path, resume: Optional[str], overwrite: bool, info: dist.DistInfo,
                   prefix: Optional[str] = None) -> Iterator[None]:
    """Rank 0 claims the output folder; every rank learns whether it could, so all stop together."""
    with contextlib.ExitStack() as stack:
        problem = None
        if info.is_main:
            try:
                stack.enter_context(claim_output(out, resume, overwrite, prefix))
            except TorchboostError as e:
                problem = (type(e).__name__, e.what, e.fix)
        problem = dist.broadcast_object(problem)
        if problem is not None:
            kind = OutputError if problem[0] == "OutputError" else ConfigError
            raise kind(problem[1], problem[2])
        yield
