"""The one validation pass: every key of a Config, from YAML, `--set` or Python, before anything is built.

Order: each field's type and rules (torchboost.options), then combinations of fields, then the option sets
that a library package owns (an optimizer's options section, boost's MindSpore-style dict, the device),
checked by that package's own validator so the rules live in one place. Every problem is a ConfigError
naming the key, the bad value and the allowed values or range.

Once per config: `validate` records what it passed (the config's plain data) on the config; `validated`,
which `train_from_config` calls, runs the pass only when the config it gets is not one that passed as it
is now. So a recipe loaded by `load_config` (or planned by `--resume`) is not checked again when it is
trained, and a Config built or changed in Python after its check still is: the record is a copy of the
values, not a flag that a later assignment could leave standing.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from torchboost.boost import resolve_boost
from torchboost.data.device_decode import nvjpeg
from torchboost.errors import ConfigError
from torchboost.models import has_batchnorm
from torchboost.optim.registry import OPTIMIZERS, check_installed, get_optimizer
from torchboost.options import check_rules, check_type, leaf_fields
from torchboost.recipe.config import Config, DataConfig
from torchboost.recipe.data import host_augments
from torchboost.recipe.kinds import DATA_KINDS, FOLDER, DataKind, get_kind
from torchboost.recipe.optimizers import check_section, section_class, typed_section
from torchboost.train.device import resolve_device
from torchboost.train.metrics import resolve_metric


PASSED = "_validated_as"  # the attribute holding the plain data of the config as it passed


def validated(cfg: Config) -> Config:
    """`cfg`, validated unless it already passed `validate` with the values it holds now."""
    if getattr(cfg, PASSED, None) != cfg.to_dict():
        validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Raise ConfigError on the first invalid value or combination in `cfg` (whose values are not modified;
    a passed config records them, see `validated`)."""
    for key, f, tp, value in leaf_fields(cfg):
        checked = check_type(value, tp, key)
        if isinstance(value, str) and not isinstance(checked, str):  # recipes coerce "1e-4"; Python must not
            raise ConfigError(f"{key} must be {type(checked).__name__}, got str {value!r}", "give a number")
        check_rules(checked, f, key)
        if any(isinstance(v, str) and "\0" in v for v in (checked if isinstance(checked, list) else [checked])):
            raise ConfigError(f"{key} holds a NUL character", "no path or name can contain one; fix the value")
    _check_data(cfg)
    _check_model(cfg)
    _check_optim(cfg)
    _check_train(cfg)
    _check_loggers(cfg)
    _check_checkpoint(cfg)
    _check_output(cfg)
    try:
        resolve_device(cfg.train.device)
    except ConfigError as e:
        raise ConfigError(f"train.device={cfg.train.device!r}: {e.what}", e.fix) from None
    plan = resolve_boost(cfg.boost.level, cfg.boost.config, where="boost")
    if plan.on("grad_freeze") and cfg.train.compile != "none":
        # freezing flips requires_grad on a schedule: each trainable set is a graph of its own, and past dynamo's
        # cache limit the step falls back to eager — a compiled run that silently is not
        raise ConfigError(f"boost gradient freezing (level {cfg.boost.level}) with train.compile={cfg.train.compile}: "
                          "each set of frozen layers would compile a graph of its own",
                          "set train.compile=none, or turn grad_freeze off in boost.config")
    object.__setattr__(cfg, PASSED, cfg.to_dict())


def _check_data(cfg: Config) -> None:
    d = cfg.data
    kind = get_kind(d.dataset)
    if kind.needs_path and not d.path:
        raise ConfigError(f"data.dataset={d.dataset} needs a data path", "pass --data DIR (or --set data.path=...)")
    if not kind.needs_path and d.path:
        raise ConfigError(f"data.path={d.path} is set but data.dataset={d.dataset} is built in and reads no path",
                          f"set data.dataset={FOLDER} (or {' / '.join(k for k, e in DATA_KINDS.items() if e.needs_path and k != FOLDER)}) to train on your data")
    if (d.mean is None) != (d.std is None):
        raise ConfigError("data.mean and data.std must be given together", "set both, one value per channel")
    if d.mean is not None and len(d.mean) != len(d.std):
        raise ConfigError(f"data.mean has {len(d.mean)} values but data.std has {len(d.std)}",
                          "give one mean and one std per channel")
    if d.mean is not None and d.channels is not None and len(d.mean) != d.channels:
        raise ConfigError(f"data.channels={d.channels} but data.mean/std have {len(d.mean)} values",
                          "give one mean and one std per channel")
    if len(d.rrc_scale) != 2 or d.rrc_scale[0] > d.rrc_scale[1]:
        raise ConfigError(f"data.rrc_scale={d.rrc_scale} is not [min, max] with min <= max", "e.g. [0.08, 1.0]")
    if d.augment not in kind.augments:
        raise ConfigError(f"data.augment={d.augment} does not apply to data.dataset={d.dataset}",
                          f"use one of {', '.join(kind.augments)}")
    if d.random_shift and d.augment not in ("auto", "shift"):
        raise ConfigError(f"data.random_shift={d.random_shift} but data.augment={d.augment}",
                          "set data.augment=shift (or auto), or data.random_shift=0")
    if d.flip != "none" and not kind.in_memory:
        raise ConfigError(f"data.flip={d.flip} applies to in-memory sets, not data.dataset={d.dataset}",
                          "flip a folder's or shards' images with data.augment=flip (or imagenet), or set data.flip=none")
    if d.augment == "shift" and not d.random_shift:
        raise ConfigError("data.augment=shift needs data.random_shift > 0", "e.g. --set data.random_shift=2")
    if d.random_shift and not kind.shift:
        raise ConfigError(f"data.random_shift does not apply to data.dataset={d.dataset}", "drop data.random_shift")
    _check_augmentations(d, kind)
    _check_decode(cfg, kind)
    if not kind.streamed and (d.train_shards or d.eval_shards):
        streamed = ", ".join(k for k, e in DATA_KINDS.items() if e.streamed)
        raise ConfigError(f"data.train_shards / data.eval_shards do not apply to data.dataset={d.dataset}",
                          f"use a data set read from shards ({streamed}) or drop them")
    if not kind.carvable and d.train_subset:  # a stream is read in order: no draw across it
        raise ConfigError(f"data.train_subset cannot be drawn from streamed {d.dataset} data",
                          "train on a folder or an in-memory set, or export the subset as shards")
    if kind.streamed and d.skip_corrupt:
        raise ConfigError(f"data.skip_corrupt is not supported for data.dataset={d.dataset}",
                          "export the shards from a folder without corrupt images (export-shards checks each file)")
    cores = os.cpu_count() or 1
    if d.workers > 4 * cores:
        raise ConfigError(f"data.workers={d.workers} on a machine with {cores} CPU cores",
                          f"use at most {cores} (each worker is a process decoding images)")


def _check_augmentations(d: DataConfig, kind: DataKind) -> None:
    """The photo policies, random erasing and mixup/cutmix: where they apply, and no option that would be
    recorded in config.yaml while nothing reads it."""
    default = {f.name: f.default for f in dataclasses.fields(DataConfig)}
    for key in ("auto_augment", "random_erasing"):
        if getattr(d, key) != default[key] and not kind.decoded:
            kinds = " or ".join(k for k, e in DATA_KINDS.items() if e.decoded)
            raise ConfigError(f"data.{key}={getattr(d, key)} does not apply to data.dataset={d.dataset} (its images "
                              "stay in memory as tensors; these run on images decoded per sample)",
                              f"drop data.{key}, or train on {kinds} data")
    changed = [k for k in ("randaugment_ops", "randaugment_magnitude") if getattr(d, k) != default[k]]
    if changed and d.auto_augment != "randaugment":
        raise ConfigError(f"data.{changed[0]}={getattr(d, changed[0])} is set but data.auto_augment={d.auto_augment}",
                          f"set data.auto_augment=randaugment, or drop data.{changed[0]}")
    mixing = d.mixup_alpha > 0 or d.cutmix_alpha > 0
    if mixing and not kind.mixing:
        raise ConfigError(f"data.mixup_alpha / data.cutmix_alpha are not supported for data.dataset={d.dataset}",
                          f"set them to 0, or train on {FOLDER} data (--data DIR)")
    if not mixing and d.mixup_prob != default["mixup_prob"]:
        raise ConfigError(f"data.mixup_prob={d.mixup_prob} but mixup and cutmix are off",
                          "set data.mixup_alpha or data.cutmix_alpha > 0, or drop data.mixup_prob")
    if d.mixup_switch_prob != default["mixup_switch_prob"] and not (d.mixup_alpha > 0 and d.cutmix_alpha > 0):
        raise ConfigError(f"data.mixup_switch_prob={d.mixup_switch_prob} only chooses between mixup and cutmix",
                          "set both data.mixup_alpha and data.cutmix_alpha > 0, or drop data.mixup_switch_prob")


def _check_decode(cfg: Config, kind: DataKind) -> None:
    """data.decode=device: on the kinds that decode image files, without an augmentation that needs the decoded
    image in the loader, and on CUDA only with torchvision's nvJPEG (`auto` picks cpu for each of these)."""
    d = cfg.data
    if d.decode != "device":
        return
    if not kind.decoded:
        kinds = " or ".join(k for k, e in DATA_KINDS.items() if e.decoded)
        raise ConfigError(f"data.decode=device does not apply to data.dataset={d.dataset} (it decodes no image "
                          "files)", f"drop data.decode, or train on {kinds} data")
    found = host_augments(d)
    if found:
        raise ConfigError(f"data.decode=device cannot be combined with {found[0]}: it needs the decoded image in "
                          "the loader", f"set data.decode=cpu, or drop {found[0].split('=')[0]}")
    try:
        cuda = resolve_device(cfg.train.device).type == "cuda"
    except ConfigError:
        return  # `validate` says what is wrong with train.device
    if cuda:
        nvjpeg(3)  # a one-line ConfigError when torchvision does not import


def _check_model(cfg: Config) -> None:
    m = cfg.model
    resnet = m.name.startswith("resnet")
    if m.init is not None:
        allowed = ("torchvision", "mindspore") if resnet else ("torch", "paddle") if m.name == "mnist_cnn" else ()
        if m.init not in allowed:
            raise ConfigError(f"model.init={m.init} does not apply to {m.name}", f"use one of {', '.join(allowed)}"
                              if allowed else "leave model.init unset: this network has torchvision's init")
    if not resnet and (m.padding != "torch" or m.zero_init_last_bn or m.small_input):
        raise ConfigError(f"model.padding / zero_init_last_bn / small_input apply to ResNets, not {m.name}",
                          f"leave them at their defaults for {m.name}")
    bn_keys = [k for k, on in (("freeze_bn_scale", cfg.optim.freeze_bn_scale),
                               ("bn_bias_lr_mult", cfg.optim.bn_bias_lr_mult != 1)) if on]
    if bn_keys and not has_batchnorm(m.name):
        raise ConfigError(f"optim.{bn_keys[0]} is set but {m.name} has no BatchNorm",
                          f"drop optim.{bn_keys[0]}, or choose a network with BatchNorm")


def _check_optim(cfg: Config) -> None:
    """What the chosen optimizer's registry entry takes: an option it cannot honour is refused, never
    recorded in config.yaml and silently ignored."""
    o = cfg.optim
    entry = get_optimizer(o.name)
    check_installed(entry)
    for pattern, wd in o.weight_decay_groups.items():
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError(f"optim.weight_decay_groups key {pattern!r} is not a parameter-name pattern",
                              "write e.g. {'layer4.*': 1e-4} (quote the pattern)")
        if isinstance(wd, bool) or not isinstance(wd, (int, float)) or not 0 <= wd < float("inf"):
            raise ConfigError(f"optim.weight_decay_groups['{pattern}']={wd!r} is not a finite number >= 0",
                              "write e.g. {'layer4.*': 1e-4}")
    if o.momentum is not None and entry.momentum is None:
        raise ConfigError(f"optim.momentum={o.momentum} does not apply to optim.name={o.name}", "remove optim.momentum (--set optim.momentum=null)")
    if o.nesterov is not None and entry.nesterov is None:
        raise ConfigError(f"optim.nesterov does not apply to optim.name={o.name}",
                              "remove optim.nesterov (--set optim.nesterov=null)")
    if o.nesterov and (o.momentum if o.momentum is not None else entry.momentum) == 0:
        raise ConfigError("optim.nesterov=true needs optim.momentum > 0", "set optim.momentum (e.g. 0.9) or drop nesterov")
    if o.weight_decay_groups and not entry.weight_decay_groups:
        raise ConfigError(f"optim.weight_decay_groups is not supported with optim.name={o.name}",
                          "it takes one optim.weight_decay; remove optim.weight_decay_groups")
    if o.decay_bn_and_bias and not entry.decay_bn_and_bias:
        raise ConfigError(f"optim.decay_bn_and_bias is not supported with optim.name={o.name} (it never decays "
                          "biases and normalisation parameters)", "remove optim.decay_bn_and_bias")
    for key, value in o.options.items():  # each section against its own dataclass (those of Python too)
        section = typed_section(key, value)
        if key != entry.options_key and section != section_class(key)():
            users = ", ".join(n for n, e in OPTIMIZERS.items() if e.options_key == key)
            raise ConfigError(f"optim.{key} is set but optim.name={o.name} does not use it",
                              f"set optim.name to one that does ({users}) or remove optim.{key}")
    if entry.options_key is not None:
        try:
            check_section(entry, typed_section(entry.options_key, o.options.get(entry.options_key, {})))
        except ConfigError as e:
            raise ConfigError(f"optim.{entry.options_key}: {e.what}", e.fix) from None
    if cfg.schedule.mode == "step" and not cfg.schedule.milestones:
        raise ConfigError("schedule.mode=step needs schedule.milestones", "e.g. --set schedule.milestones=[30,60]")


NAME_MAX = 255  # bytes in one file name on Linux/macOS file systems
LONGEST_SUFFIX = "-99999_999999.pt.tmp-9999999999"  # checkpoint name + atomic temp suffix, generously


def _check_loggers(cfg: Config) -> None:
    """train.mlflow.* only with the mlflow logger; that logger only with MLflow installed (what its store needs)."""
    t, m = cfg.train, cfg.train.mlflow
    if "mlflow" not in t.loggers:
        unused = [k for k in ("tracking_uri", "experiment") if getattr(m, k) is not None]
        if unused:
            raise ConfigError(f"train.mlflow.{unused[0]} is set but train.loggers={t.loggers} has no mlflow",
                              "add mlflow to train.loggers, or leave train.mlflow unset")
        return
    from torchboost.train.tracking import INSTALL, missing_modules, required_modules, tracking_uri_from_env

    uri = m.tracking_uri or tracking_uri_from_env() or "sqlite:"  # unset: a SQLite store in the run folder
    missing = missing_modules(required_modules(uri))
    if missing:
        raise ConfigError(f"train.loggers has mlflow but {', '.join(missing)} is not installed",
                          f"{INSTALL}, or drop mlflow from train.loggers")


def _check_checkpoint(cfg: Config) -> None:
    """checkpoint.prefix is a file name inside the run's ckpt/ folder, never a path out of it."""
    prefix = cfg.checkpoint.prefix
    if prefix is None:
        return
    if not prefix or prefix in (".", "..") or "/" in prefix or "\\" in prefix or "\0" in prefix:
        raise ConfigError(f"checkpoint.prefix={prefix!r} is not a file name", "use a plain name such as resnet50 "
                          "(checkpoints always go to OUTPUT/ckpt/; choose the folder with --output)")
    if not prefix.isprintable():
        raise ConfigError(f"checkpoint.prefix={prefix!r} holds control characters", "use a plain name")
    if len((prefix + LONGEST_SUFFIX).encode()) > NAME_MAX:
        raise ConfigError(f"checkpoint.prefix is {len(prefix.encode())} bytes: its file names would pass the "
                          f"{NAME_MAX}-byte limit", f"use at most {NAME_MAX - len(LONGEST_SUFFIX)} bytes")


def _check_output(cfg: Config) -> None:
    """`output` may name the recipe as {name}; any other placeholder is a typo, not a crash later."""
    import string

    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(cfg.output) if f is not None]
    except ValueError as e:
        raise ConfigError(f"output={cfg.output!r}: {e}", "write {name} for the recipe's name, {{ }} for braces") from None
    if any(f != "name" for f in fields):
        raise ConfigError(f"output={cfg.output!r} has the placeholder {{{next(f for f in fields if f != 'name')}}}",
                          "the only placeholder is {name} (the recipe's name)")
    if not cfg.output.strip():
        raise ConfigError("output is empty", "give a folder, e.g. runs/{name}")
    # the name becomes one folder under runs/ (and race-NAME): never a path that climbs out of it
    name = cfg.name
    if not name.strip() or name in (".", "..") or any(c in name for c in "/\\") or not name.isprintable() \
            or len(f"race-{name}".encode()) > NAME_MAX:
        raise ConfigError(f"name={name[:80]!r} is not a folder name", "use letters, digits, '-', '_' and '.' "
                          f"(no '/' or '..', at most {NAME_MAX - 5} bytes); choose the folder itself with -o")


def _check_train(cfg: Config) -> None:
    t = cfg.train
    if t.monitor.removeprefix("val_") not in {resolve_metric(m) for m in t.metrics}:
        raise ConfigError(f"train.monitor={t.monitor} is not among train.metrics={t.metrics}",
                          f"add {t.monitor.removeprefix('val_')} to train.metrics or change train.monitor")
    if t.init_weights and not Path(t.init_weights).is_file():
        raise ConfigError(f"train.init_weights={t.init_weights} does not exist", "give the path of a weights file")
    if t.average != "none" and t.compile != "none":  # its step reads host counts: a graph per value
        raise ConfigError(f"train.average={t.average} with train.compile={t.compile}: the averaging step is not "
                          "compiled", "set train.compile=none, or train.average=none")
    if t.clip_global_norm is not None and t.clip_value is not None:
        raise ConfigError("train.clip_global_norm and train.clip_value are both set", "choose one way to clip")

    if t.cast_network and t.amp_dtype == "none":
        raise ConfigError("train.cast_network=true needs a low-precision type, but train.amp_dtype=none",
                          "set train.amp_dtype (auto, bfloat16 or float16), or cast_network=false")
