"""`torchboost export`: a checkpoint written for deployment (ONNX, TorchScript, ExportedProgram).

The checkpoint is read as `eval` and `predict` read it (`infer.model_from_weights`: its saved config gives
the network, the class names and the evaluation transform). The exported network takes what that transform
makes of an image, float and normalised, whatever `data.normalize_on_device` says for training: the input
size, resize, mean and std it needs are recorded beside it (`deploy.metadata`), so `predict` on the .onnx
preprocesses exactly as `predict` on the checkpoint.

Where the file goes: the user names it. No write goes through a link out of the folder OUT is named in (OUT
itself a link elsewhere is refused, not replaced), nor, for an OUT inside the checkpoint's own run folder
(RUN/ckpt/X.pt -> RUN/...), through a link out of that run folder, as `train` never writes through one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Callable, Optional, Sequence

from torchboost.deploy import DeployInfo
from torchboost.deploy.export import EXPORTED_PROGRAM, ONNX, export_network, export_program, format_for
from torchboost.train.tta import with_tta
from torchboost.errors import ConfigError, OutputError, printable
from torchboost.fileio import confine_writes, within
from torchboost.recipe.config import Config
from torchboost.recipe.data import eval_preprocess
from torchboost.recipe.infer import model_from_weights
from torchboost.train.checkpoint import saved_classes


def export_checkpoint(path: str, outs: Sequence[str], fmt: Optional[str] = None, config: Optional[str] = None,
                      overrides: Sequence[str] = (),
                      written: Callable[[str, str, DeployInfo], None] = lambda out, fmt, info: None) -> DeployInfo:
    """Write the network of checkpoint `path` to each of `outs` (the checkpoint read once, one torch.export trace
    for an .onnx and a .pt2), calling `written(out, format, info)` after each file (so a refusal of a later OUT
    follows the word on the earlier ones); returns what was recorded."""
    if fmt is not None and len(outs) > 1:
        raise ConfigError(f"--format {fmt} names the format of one OUT, and {len(outs)} are given",
                          "drop --format: each OUT's name gives its format")
    formats = [format_for(out, fmt) for out in outs]  # a name that says no format: refused before the reading
    if len({os.path.abspath(out) for out in outs}) < len(outs):
        raise ConfigError("an OUT is named twice", "give each export its own file name")
    for out in outs:
        if Path(out).is_dir():
            raise OutputError(f"OUT {printable(out)} is a folder", "give a file name, e.g. model.onnx")
        if Path(out).exists() and Path(path).exists() and os.path.samefile(out, path):
            raise OutputError(f"OUT {printable(out)} is the checkpoint itself", "give the export another name")
    model, cfg, ckpt = model_from_weights(path, config, overrides, device="cpu")
    info = deploy_info(cfg, saved_classes(ckpt, cfg.model.num_classes, path))
    net = with_tta(model.network, cfg.eval.tta)  # TTA travels in the file
    shared = sum(f in (ONNX, EXPORTED_PROGRAM) for f in formats) > 1  # both trace the same torch.export graph
    program = export_program(net, info) if shared else None
    for out, f in zip(outs, formats):
        with contextlib.ExitStack() as stack:
            for folder in _owned(path, out):
                stack.enter_context(confine_writes(folder))
            export_network(net, info, out, f, program)
        written(out, f, info)
    return info


def deploy_info(cfg: Config, classes: Optional[list[str]]) -> DeployInfo:
    """What a deployer needs, from a resolved config: `predict`'s evaluation transform, made float."""
    from torchboost import __version__

    transform = eval_preprocess(dataclasses.replace(cfg.data, normalize_on_device=False))
    names = classes or [str(i) for i in range(cfg.model.num_classes)]
    return DeployInfo(cfg.model.name, tuple(names), len(transform.mean), transform.size, transform.resize,
                      tuple(transform.mean), tuple(transform.std), __version__)


def _owned(checkpoint: str, out: str) -> list[Path]:
    """The folders `out`'s write is confined to: the one it is named in, and the checkpoint's run folder
    when `out` lies inside it (compared as named: a run folder that is itself a link is the user's)."""
    target = Path(os.path.abspath(out))
    folders = [target.parent]
    ckpt = Path(os.path.abspath(checkpoint))
    if ckpt.parent.name == "ckpt" and within(target, ckpt.parent.parent):
        folders.append(ckpt.parent.parent)
    return folders
