"""`torchboost convert IN OUT`: weights between any two registered formats (`migrate.formats`: MindSpore
.ckpt, PaddlePaddle .pdparams, torch state dicts, safetensors).

The direction comes from the file extensions. Leaving a framework's format renames its weights to torch
names (torchboost.migrate.names / paddle_names), entering one renames them back, so .ckpt <-> .pdparams
goes through torch names; torch <-> safetensors only changes the container. `arch="none"` keeps names as
they are (a pure container change).
"""

from __future__ import annotations

import os
from pathlib import Path

from torchboost.errors import CheckpointError, ConfigError
from torchboost.fileio import remove_stale_temps
from torchboost.migrate.formats import MINDSPORE, format_of, read_weights, source_format, write_weights
from torchboost.migrate.names import MappingReport


def _chain(first: MappingReport, second: MappingReport) -> MappingReport:
    """framework -> torch -> framework: the source side's report, plus any problem of the second step."""
    first.unmapped += second.unmapped
    first.missing += second.missing
    first.mismatched += second.mismatched
    first.notes += [n for n in second.notes if n not in first.notes]
    return first


def convert(in_path: str | os.PathLike, out_path: str | os.PathLike, arch: str | None = None,
            num_classes: int | None = None, drop_background: bool = False, convert_moments: bool = False,
            strict: bool = True, add_background: bool = False) -> MappingReport:
    """Convert weights from `in_path` to `out_path` and return what was mapped.

    arch: resnet18..resnet152, mnist_cnn (PaddlePaddle only); None: detected from the names; "none" keeps
    names untouched. The report's `model` is the create_model call of the matching torch network.
    drop_background: when reading a 1001-class MindSpore checkpoint, drop class 0 -> 1000 classes.
    add_background: when writing a MindSpore .ckpt, add the zoo's class 0 -> 1001 classes.
    strict: refuse (CheckpointError naming the first problem) unless every tensor maps cleanly.
    """
    src, dst = source_format(in_path), format_of(out_path)
    if src is dst and src.to_torch is not None:
        raise ConfigError(f"both files are {src.description}: nothing to convert", "write a .pt/.safetensors")
    if drop_background and src.name != MINDSPORE:
        raise ConfigError("drop_background only applies when reading a MindSpore .ckpt",
                          "drop --drop-background or convert from the .ckpt")
    if add_background and not (dst.name == MINDSPORE and src is not dst and arch != "none"):
        raise ConfigError("add_background only applies when writing a ResNet to a MindSpore .ckpt",
                          "drop --add-background or convert a .pt/.safetensors/.pdparams ResNet to .ckpt")
    state = read_weights(in_path)
    ms = {"drop_background": drop_background, "convert_moments": convert_moments}  # MindSpore's name-map options
    if arch == "none" or (src.to_torch is None and dst.from_torch is None):
        report = MappingReport(arch="none", mapped=list(state))
    else:
        report = None
        if src.to_torch is not None:
            state, report = src.to_torch(state, arch, num_classes, **(ms if src.name == MINDSPORE else {}))
        if dst.from_torch is not None and (report is None or report.ok):
            arch = arch or (report.arch if report else None)
            opts = {"convert_moments": convert_moments, "add_background": add_background} if dst.name == MINDSPORE else {}
            state, second = dst.from_torch(state, arch, num_classes, **opts)
            report = second if report is None else _chain(report, second)
    if strict and not report.ok:
        raise CheckpointError(f"{in_path} does not convert cleanly to {report.arch}: {report.first_problem()}",
                              "pick the right arch/num_classes (drop_background for 1001-class MindSpore "
                              "weights) or convert non-strictly")
    if not state:
        raise CheckpointError(f"no tensors of {in_path} map to {report.arch}", "pick the right arch")
    remove_stale_temps(Path(out_path).parent)  # what a killed convert left (full-size temporary files)
    write_weights(out_path, state)
    return report
