"""Write a classifier for deployment: ONNX, TorchScript, or torch.export's ExportedProgram (.pt2).

Each format takes the batch size as a free dimension and records the `DeployInfo` (input, preprocessing,
class names): ONNX in its `metadata_props`, the two torch archives as the extra file `torchboost.json`.
Files are written atomically (`fileio.atomic_path`); onnx and onnxscript are imported only for ONNX.
TorchScript is still written for runtimes that load it (LibTorch), though torch deprecates torch.jit.save.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path
from typing import Iterator, Optional

import torch
from torch import nn

from torchboost.deploy.metadata import META_FILE, DeployInfo
from torchboost.errors import ConfigError, printable
from torchboost.fileio import atomic_path, atomic_write

ONNX, TORCHSCRIPT, EXPORTED_PROGRAM = "onnx", "torchscript", "exported-program"
# format -> the file name endings that name it (a bare .pt is refused: a checkpoint or TorchScript?)
SUFFIXES = {ONNX: (".onnx",), TORCHSCRIPT: (".torchscript.pt", ".ts"), EXPORTED_PROGRAM: (".pt2",)}
EXTRA = "pip install 'torchboost[export]'"
EXAMPLE_BATCH = 2  # torch.export specialises a dimension traced at 1; the exported batch is free, from 1 up


def format_for(path: str | Path, fmt: Optional[str] = None) -> str:
    """The format `path`'s name gives (or `fmt`, which the name must not contradict): ConfigError when the
    name gives none and `fmt` is None."""
    name = Path(path).name.lower()
    named = [f for f, endings in SUFFIXES.items() if any(name.endswith(e) for e in endings)]
    if fmt is not None:
        if fmt not in SUFFIXES:
            raise ConfigError(f"unknown export format {fmt!r}", f"use one of {', '.join(SUFFIXES)}")
        if named and named != [fmt]:
            raise ConfigError(f"the name {printable(str(path))} says {named[0]} but --format is {fmt}",
                              f"name it {SUFFIXES[fmt][0]}, or drop --format")
        return fmt
    if len(named) != 1:
        raise ConfigError(f"cannot tell the export format of {printable(str(path))} from its name",
                          "name it .onnx, .pt2 (ExportedProgram), .torchscript.pt or .ts (TorchScript), or pass "
                          "--format onnx|torchscript|exported-program")
    return named[0]


def export_network(net: nn.Module, info: DeployInfo, path: str | Path, fmt: Optional[str] = None,
                   program: Optional[torch.export.ExportedProgram] = None) -> str:
    """Write `net` (put in eval mode; on the CPU) to `path` in `fmt` (default: from the name); returns the
    format written. Its input: float32 N×C×H×W as `info` describes, any N >= 1. `program`: `net`'s
    `export_program`, when the caller traced it already (one trace for a .pt2 and an .onnx of the same network)."""
    fmt = format_for(path, fmt)
    if fmt == ONNX:
        _import_onnx()  # a missing package is said before any work
    if fmt == TORCHSCRIPT:
        save_torchscript(net, info, path)
    elif fmt == EXPORTED_PROGRAM:
        save_program(program or export_program(net, info), info, path)
    else:
        atomic_write(path, onnx_bytes(program or export_program(net, info), info))
    return fmt


def example_input(info: DeployInfo) -> torch.Tensor:
    """The batch the tracers run (seeded noise; its batch size is not the exported one's)."""
    return torch.randn(EXAMPLE_BATCH, *info.input_size, generator=torch.Generator().manual_seed(0))


def export_program(net: nn.Module, info: DeployInfo) -> torch.export.ExportedProgram:
    """torch.export's graph of `net` in eval mode, the batch dimension free (checked by the tracer)."""
    net = net.eval()
    with _quiet(), torch.no_grad():
        return _traced(info, "torch.export", lambda: torch.export.export(
            net, (example_input(info),), dynamic_shapes=({0: torch.export.Dim("batch", min=1)},)))


def save_program(program: torch.export.ExportedProgram, info: DeployInfo, path: str | Path) -> None:
    """An ExportedProgram archive (.pt2; torch.export.load reads it) with `info` as torchboost.json."""
    with _quiet(), atomic_path(path) as tmp, open(tmp, "wb") as f:  # a file object: torch warns at the temp name
        torch.export.save(program, f, extra_files={META_FILE: info.to_json()})


def save_torchscript(net: nn.Module, info: DeployInfo, path: str | Path) -> None:
    """`net` traced in eval mode (torch.jit.load reads it) with `info` as torchboost.json. A trace records the
    operations run, not the Python: the zoo's networks have no data-dependent control flow."""
    net = net.eval()
    with _quiet(), torch.no_grad():
        traced = _traced(info, "torch.jit.trace", lambda: torch.jit.trace(net, example_input(info)))
    with atomic_path(path) as tmp:
        torch.jit.save(traced, str(tmp), _extra_files={META_FILE: info.to_json()})


def onnx_bytes(program: torch.export.ExportedProgram, info: DeployInfo) -> bytes:
    """The ONNX model of an exported program, with `info` in its metadata_props.

    The exporter: torch's dynamo one (`dynamo=True`, the default since torch 2.9, built on onnxscript), not
    the TorchScript-based one (`dynamo=False`, which torch 2.13 warns is legacy and deprecated). It translates
    the graph torch.export traced, which checked that the batch dimension really is free (a network that
    fixes it fails here, loudly, where jit.trace records the traced size without a word and the .onnx fails
    later, in the deployer's runtime), and that graph is the one the .pt2 holds. Its cost: seconds where the
    old exporter takes a fraction (ResNet-152: ~7 s on one CPU thread, against ~1.6 s)."""
    _import_onnx()
    with _quiet():
        exported = _traced(info, "torch.onnx.export", lambda: torch.onnx.export(
            program, (), None, dynamo=True, input_names=["input"], output_names=["logits"], verbose=False,
            optimize=True))
    proto = exported.model_proto
    _name_batch(proto)
    for key, value in info.to_props().items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    return proto.SerializeToString()


def _name_batch(proto) -> None:
    """Call the free batch dimension `batch` (the exporter names it after its tracing symbol, e.g. s77)."""
    graph = proto.graph
    symbol = graph.input[0].type.tensor_type.shape.dim[0].dim_param
    if not symbol:
        return
    for value in (*graph.input, *graph.output, *graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == symbol:
                dim.dim_param = "batch"


def _import_onnx() -> None:
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"ONNX export needs the onnx and onnxscript packages ({e.name or 'one'} is missing)",
                          EXTRA) from None


def _traced(info: DeployInfo, step: str, run):
    """run(); a failure of the tracer or exporter as one line naming the model and the step."""
    try:
        return run()
    except Exception as e:  # torch's tracers raise many types; each ends the export
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise ConfigError(f"{step} cannot export {info.model}: {type(e).__name__}: {first}",
                          "try another format (--format torchscript or onnx), or report the model") from e


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporters' progress and deprecation notes kept off the user's terminal (failures still raise)."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
