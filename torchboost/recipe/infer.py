"""Evaluate and predict with trained weights: rebuild the network from the run's resolved config.

A torchboost training checkpoint carries its resolved config, so it needs nothing else. Plain weight
files (safetensors, a torch state dict) carry none: pass the recipe that built them (`--config`). `predict`
also runs an exported .onnx (`torchboost export`) through ONNX Runtime, preprocessed as its metadata says.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from torchboost.boost import resolve_boost, transform_model
from torchboost.data import build_loader, loader_skipped, read_image
from torchboost.errors import CheckpointError, ConfigError, DataError, printable
from torchboost.recipe.build import build_loss, build_model
from torchboost.recipe.config import Config
from torchboost.recipe.data import build_dataset, eval_preprocess, input_norm, load_data, split_source
from torchboost.fileio import check_regular
from torchboost.recipe.kinds import FOLDER
from torchboost.recipe.per_class import folder_files, per_class_report
from torchboost.recipe.load import load_config
from torchboost.recipe.resolve import resolve_config, without_top5
from torchboost.recipe.saved import check_resolved, config_from_file
from torchboost.recipe.validation import validate
from torchboost.train.checkpoint import check_torch_zip, is_torch_file, load_checkpoint, load_model_state, saved_classes
from torchboost.train.metrics import METRIC_NAMES
from torchboost.train.model import Model
from torchboost.train.per_class import ClassTally

ONNX_SUFFIX = ".onnx"  # an exported model (`torchboost export`), run through ONNX Runtime
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


def model_from_weights(path: str, config: Optional[str] = None, overrides: Sequence[str] = (),
                       device: str = "auto") -> tuple[Model, Config, dict]:
    """(Model, resolved config, checkpoint dict) from a training checkpoint, or from a plain weights
    file plus the recipe that built it."""
    if not Path(path).is_file():
        raise CheckpointError(f"{path} not found" if not Path(path).exists() else f"{path} is not a file",
                              "check the path of the checkpoint or weights file")
    if Path(path).suffix.lower() == ONNX_SUFFIX:
        raise CheckpointError(f"{path} is an exported ONNX model, not a checkpoint",
                              "predict with it (torchboost predict --checkpoint MODEL.onnx IMAGES); eval and "
                              "export read the training checkpoint it came from")
    refuse_torch_export(path)
    ckpt = _training_checkpoint(path)
    if ckpt is not None:
        cfg = config_from_file(ckpt["config"], overrides, path)
        check_resolved(cfg, path)
        # the saved config is untrusted data and --set values need train's checks; the weights it started
        # from (init_weights) need not exist where it is evaluated
        validate(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, init_weights=None)))
    else:
        if config is None:
            raise CheckpointError(f"{path} holds weights but no saved config",
                                  "pass --config RECIPE (and --set overrides) describing the network")
        recipe_cfg = load_config(config, overrides)
        data_cfg, train_ds, _ = load_data(recipe_cfg)
        cfg = resolve_config(recipe_cfg, data_cfg, train_ds, None)
    net = build_model(cfg)
    if cfg.boost.level != "O0" or cfg.boost.config:  # less_bn changes the structure: rebuild it first
        transform_model(resolve_boost(cfg.boost.level, cfg.boost.config), net)
    if ckpt is None:  # any registered format; MindSpore/Paddle names are mapped to the network's
        from torchboost.migrate.formats import read_torch_named

        ckpt = {"model": read_torch_named(path, cfg.model.name, cfg.model.num_classes, net.state_dict()),
                "classes": list(train_ds.classes)}
    load_model_state(net, ckpt["model"], source=str(path))
    # top-5 of 5 classes or fewer always reads 100%: left out, as training leaves it out
    # a run that normalised on the device reads uint8 images here too (eval_preprocess): the same statistics
    norm = input_norm(cfg.data)
    model = Model(net, build_loss(cfg), metrics=without_top5(METRIC_NAMES, cfg.model.num_classes), device=device,
                  channels_last=cfg.model.channels_last, input_norm=norm, tta=cfg.eval.tta)
    return model, cfg, ckpt


def refuse_torch_export(path: str) -> None:
    """A TorchScript (.ts, .torchscript.pt) or ExportedProgram (.pt2) export holds code that loading runs
    (TorchScript's, and the pickles torch.export.load reads): never loaded here, from a file that may not be
    the user's. CheckpointError saying what to use instead."""
    from torchboost.deploy.export import EXPORTED_PROGRAM, SUFFIXES, TORCHSCRIPT

    name = Path(path).name.lower()
    for fmt, what, loader in ((TORCHSCRIPT, "TorchScript", "torch.jit.load"),
                              (EXPORTED_PROGRAM, "ExportedProgram", "torch.export.load")):
        if name.endswith(SUFFIXES[fmt]):
            raise CheckpointError(f"{path} is a {what} export, which eval and predict do not run (loading one runs "
                                  "the code it holds)", f"predict with the training checkpoint it came from or an "
                                  f".onnx export of it; in your serving code, {loader} it if you trust the file")


def _training_checkpoint(path: str) -> dict | None:
    """The checkpoint, when `path` is one written by `torchboost train` (it carries its config), else None."""
    from torchboost.migrate.formats import TORCH, source_format  # the weight readers: only for weights files

    try:
        if source_format(path).name != TORCH:  # only torch files carry a training checkpoint's config
            return None
    except ConfigError:  # an unregistered suffix: try it as a torch file
        pass
    if is_torch_file(path):  # one torch would inflate past its size is refused, not tried as plain weights
        check_torch_zip(path)
    try:
        ckpt = load_checkpoint(path)
    except CheckpointError:
        return None
    return ckpt if isinstance(ckpt.get("config"), dict) and "model" in ckpt else None


def evaluate_checkpoint(path: str, data_path: Optional[str] = None, split: Optional[str] = None,
                        use_ema: bool = False, config: Optional[str] = None, overrides: Sequence[str] = ()) -> dict:
    """Top-1/top-5/loss of the weights on the run's evaluation data, or on an image folder `data_path`
    (read with the run's preprocessing; its classes must be the run's). `split`: "train", "val" or "test",
    read exactly (a folder without it is refused, naming those it has); None: the run's evaluation split
    (a folder's val/, else test/; a run with data.holdout: its held-out training images). The result's "data" says what was read (a folder's split folder), its
    "per_class" the per-class report (`recipe.per_class`)."""
    model, cfg, ckpt = model_from_weights(path, config, overrides)
    data = cfg.data
    if data_path:
        data = dataclasses.replace(data, dataset=FOLDER, path=data_path)
    if use_ema:
        if "ema" not in ckpt:
            raise CheckpointError(f"{path} has no EMA weights", "drop --ema or use a run trained with EMA")
        model.network.load_state_dict(ckpt["ema"]["module"])
    name, exact = split or "test", split is not None
    if data.holdout and not exact and not data_path:  # the run evaluated its held-out training images: so does eval
        ds = load_data(dataclasses.replace(cfg, data=data), log=lambda _: None, holdout=data.holdout)[2]
    else:
        ds = build_dataset(data, name, cfg.model.num_classes, exact=exact)
    check_classes(ds.classes, saved_classes(ckpt, cfg.model.num_classes, path), cfg.model.num_classes, path)
    loader = build_loader(ds, data.eval_batch_size, False, workers=data.workers)
    tally = ClassTally(cfg.model.num_classes)
    result = model.eval(loader, tally=tally)
    if not np.isfinite(tally.prob).all():  # NaN logits: argmax says class 0, an accuracy of nothing
        raise CheckpointError(f"{printable(path)} gave an output that is not a finite number (NaN or infinity) on "
                              f"{split_source(data, name, exact)}", "check the model: its weights make no prediction")
    report = per_class_report(tally, list(ds.classes), folder_files(ds, loader_skipped(loader)))
    return {**result, "data": split_source(data, name, exact), "per_class": report}


def check_classes(data_classes: list[str], run_classes: Optional[list[str]], num_classes: int, path: str) -> None:
    """Evaluating on data whose classes are not the network's gives a meaningless score: refuse it."""
    if len(data_classes) != num_classes:
        raise DataError(f"the data has {len(data_classes)} classes but {path} predicts {num_classes}",
                        "evaluate on data with the classes the network was trained on")
    if run_classes and list(run_classes) != list(data_classes):
        diff = sorted(set(data_classes) ^ set(run_classes))[:3]
        raise DataError(f"the data's class folders differ from the run's (e.g. {', '.join(diff) or 'their order'})",
                        "use folders named like the training classes")


def image_files(paths: Sequence[str]) -> list[str]:
    """Image files from a mix of files and folders (folders searched recursively, sorted)."""
    files: list[str] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(str(f) for f in _walk(p) if f.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise DataError(f"no images in folder {p}", f"supported: {', '.join(IMAGE_SUFFIXES)}")
            files += found
        elif p.exists():
            files.append(str(check_regular(p)))
        else:
            raise DataError(f"{p} does not exist", "pass image files or folders")
    return files


def _walk(root: Path) -> list[Path]:
    """Every file under `root`. A folder that cannot be read is a DataError naming it, as eval and train say:
    skipped silently, its images would be missing from the results with nothing to show for it."""
    def refuse(e: OSError) -> None:
        raise DataError(f"cannot read the folder {e.filename} ({e.strerror})",
                        "give it read permission, or predict on the other folders by name")

    return [Path(d, f) for d, _, names in os.walk(root, onerror=refuse) for f in names]


def predict_images(path: str, images: Sequence[str], topk: int = 5, config: Optional[str] = None,
                   overrides: Sequence[str] = (), batch_size: int = 64) -> list[tuple[str, list[tuple[str, float]]]]:
    """[(image file, top-k (class, probability))] for image files and folders, preprocessed like the
    run's evaluation data."""
    if topk < 1:
        raise ConfigError(f"--topk {topk} must be >= 1", "e.g. --topk 5")
    if Path(path).suffix.lower() == ONNX_SUFFIX:
        return _predict_onnx(path, images, topk, config, overrides, batch_size)
    model, cfg, ckpt = model_from_weights(path, config, overrides)
    classes = saved_classes(ckpt, cfg.model.num_classes, path) or [str(i) for i in range(cfg.model.num_classes)]
    return _top_k(path, image_files(images), eval_preprocess(cfg.data), model.predict, classes, topk, batch_size)


def _predict_onnx(path: str, images: Sequence[str], topk: int, config: Optional[str], overrides: Sequence[str],
                  batch_size: int) -> list[tuple[str, list[tuple[str, float]]]]:
    """`predict` with an exported .onnx (`torchboost export`) through ONNX Runtime: its preprocessing and
    class names from its own metadata, so the command checks the file that is deployed."""
    from torchboost.deploy.onnxrun import OnnxClassifier

    if config is not None or overrides:
        raise ConfigError(f"{path} is an exported model: it records its own preprocessing and classes",
                          "drop --config/--set")
    model = OnnxClassifier(path, threads=torch.get_num_threads())
    try:
        files = image_files(images)  # after the model is checked, as for a checkpoint
        return _top_k(path, files, model.info.transform(), lambda x: torch.from_numpy(model.logits(x.numpy())),
                      list(model.info.classes), topk, batch_size)
    finally:
        model.close()  # its process and private folder gone before the command returns


def _top_k(model: str, files: list[str], transform, logits, classes: list[str], topk: int,
           batch_size: int) -> list[tuple[str, list[tuple[str, float]]]]:
    """[(file, top-k (class, probability))]: `logits` of each batch of preprocessed files, softmaxed; a
    CheckpointError naming `model` and the file when an output is not a finite number (NaN weights, a graph
    that divides by zero): softmax would print NaN as a probability."""
    results = []
    for start in range(0, len(files), batch_size):
        chunk = files[start:start + batch_size]
        out = logits(torch.stack([read_image(p, transform) for p in chunk]))
        finite = torch.isfinite(out).all(dim=1)
        if not finite.all():
            bad = chunk[int((~finite).nonzero()[0])]
            raise CheckpointError(f"{printable(model)} gave an output that is not a finite number (NaN or infinity) "
                                  f"for {printable(bad)}", "check the model: its weights or graph make no prediction")
        probs = out.softmax(dim=1)
        top = probs.topk(min(topk, probs.shape[1]), dim=1)
        results += [(f, [(classes[i], float(p)) for p, i in zip(ps.tolist(), idx.tolist())])
                    for f, ps, idx in zip(chunk, top.values, top.indices)]
    return results
