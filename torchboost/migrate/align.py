"""`align`: run a few training steps (`DEFAULT_STEPS`) on two implementations and report the first divergence.

Both sides get the same seed, the same batch, the same initial weights (ours copied into the reference by
name, through a name map when the names differ), dropout off and BatchNorm in training mode, fp32. Each
side records, step after step, per-module forward outputs, parameter gradients and the optimizer's update
(w_after - w_before, plus BN running-statistic changes); items are compared in order — step by step, and
within a step forward (module completion order), loss, backward (reverse order), update — and the first
failing item names the step and both module paths. Several steps because the first update cannot show the
optimizer's state: SGD's momentum buffer starts as the first gradient whatever the momentum, so momentum 0.5
and 0.9 give the same first update and differ from the second.

Single-step mode feeds every reference module the inputs OUR module received (forward pre-hooks), so an
error does not propagate: only the module that computes differently fails. With a dump directory it is
the other way round: our modules are fed the reference's recorded inputs. Feeding keeps the autograd
path, so backward and update are still compared; a diverging module's own backward (its input gradient)
still carries its difference upstream there.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
from pathlib import Path
from typing import Callable, Mapping, Optional, Union

import torch
from torch import nn

from ..errors import ConfigError, DataError
from ..fileio import read_regular
from ..seed import seed_everything
from .align_report import AlignReport, compare_steps
from .dump import read_arrays, read_dump_steps, write_dump
from .record import ROOT, Recording, record_step

OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]
Batch = tuple[torch.Tensor, torch.Tensor]
DEFAULT_STEPS = 3  # the 2nd step shows optimizer state (momentum, Adam's moments); the 3rd its effect on the forward


class NameMap:
    """Our names -> the reference's names. `tensors` maps parameter/buffer names; module paths map through
    `modules`, by default what the tensor entries imply (`fc.weight -> end_point.weight` gives
    `fc -> end_point`). Unlisted names map to themselves."""

    def __init__(self, tensors: Optional[Mapping[str, str]] = None, modules: Optional[Mapping[str, str]] = None):
        self.tensors = dict(tensors or {})
        self.modules: dict[str, str] = {}
        for ours, ref in self.tensors.items():
            om, rm = ours.rpartition(".")[0] or ROOT, ref.rpartition(".")[0] or ROOT
            if om != rm:
                self.modules.setdefault(om, rm)
        self.modules.update(modules or {})

    def tensor(self, name: str) -> str:
        return self.tensors.get(name, name)

    def module(self, call: str) -> str:
        """A call name: an exact entry ("relu#2" -> "4" for an unrolled Sequential), else its module path
        mapped and the call suffix kept."""
        if call in self.modules:
            return self.modules[call]
        base, sep, n = call.partition("#")
        return self.modules.get(base, base) + sep + n

    @classmethod
    def from_json(cls, path: str | Path) -> "NameMap":
        """`{"tensors": {...}, "modules": {...}}`, or a flat `{our name: reference name}` (names are strings)."""
        try:
            data = json.loads(read_regular(path, ConfigError).decode("utf-8"))
        except (OSError, ValueError, RecursionError) as e:
            raise ConfigError(f"name map {path} is not readable JSON ({e})", "pass a JSON file {our name: "
                              "reference name}") from None
        nested = isinstance(data, dict) and ("tensors" in data or "modules" in data)
        parts = [data.get("tensors") or {}, data.get("modules") or {}] if nested else [data]
        if not all(isinstance(p, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in p.items())
                   for p in parts):
            raise ConfigError(f"name map {path} is not a mapping of names to names",
                              'write {"conv1.weight": "conv1.weight", ...} or {"tensors": {...}, "modules": {...}}')
        return cls(*parts) if nested else cls(data)

    @classmethod
    def mindspore_resnet(cls, arch: str, num_classes: int = 1000) -> "NameMap":
        """torchboost/torchvision ResNet -> MindSpore model-zoo names (bn gamma/beta, end_point, ...)."""
        from .names import layout

        return cls({tn: ms for tn, ms, _ in layout(arch, num_classes) if ms is not None})


NameMapLike = Union[NameMap, Mapping[str, str], None]


def _name_map(m: NameMapLike) -> NameMap:
    return m if isinstance(m, NameMap) else NameMap(m)


def default_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """Momentum SGD with weight decay: the update then depends on both the gradient and the weight."""
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)


@torch.no_grad()
def load_named(model: nn.Module, tensors: Mapping[str, torch.Tensor], key: Callable[[str], str],
               source: str) -> list[str]:
    """Copy `tensors[key(name)]` into each of `model`'s parameters and buffers. A parameter without a
    source is an error (the sides would start apart); a missing buffer is returned as a note."""
    params = dict(model.named_parameters())
    notes = []
    for name, t in model.state_dict(keep_vars=True).items():
        src = tensors.get(key(name))
        if src is None:
            if name in params:
                raise ConfigError(f"{source} has no tensor '{key(name)}' for parameter '{name}'",
                                  "pass a name map (--name-map map.json: {our name: reference name})")
            notes.append(f"buffer {name}: not in {source}, left as initialised")
            continue
        if tuple(src.shape) != tuple(t.shape):
            raise ConfigError(f"{source} tensor '{key(name)}' has shape {tuple(src.shape)}, '{name}' needs "
                              f"{tuple(t.shape)}", "the two networks differ here; fix the reference or the name map")
        t.copy_(src.to(t.device, t.dtype))
    return notes


def copy_weights(src: nn.Module, dst: nn.Module, name_map: NameMapLike = None) -> list[str]:
    """Give `dst` (the reference) `src`'s (our) weights and buffers, renamed through `name_map`."""
    nm = _name_map(name_map)
    renamed = {nm.tensor(k): v for k, v in src.state_dict().items()}
    return load_named(dst, renamed, lambda n: n, "our model")


def _notes(batch: Batch, seed: int, steps: int) -> list[str]:
    return [f"{steps} training step(s) on one batch, fp32, seed {seed}, batch {tuple(batch[0].shape)}; dropout "
            "off (eval mode), BatchNorm in train mode (batch statistics, running stats updated) on both sides"]


def record_steps(model: nn.Module, batch: Batch, loss_fn: Callable, optimizer: torch.optim.Optimizer, steps: int,
                 seed: int, feeds: Optional[list[Optional[Callable]]] = None,
                 keep_inputs: bool = False) -> list[Recording]:
    """`steps` training steps of `model` on `batch`, one optimizer throughout (its state carried from step to
    step), each recorded; `feeds[k]` feeds step k's module inputs (single-step mode)."""
    if steps < 1:
        raise ConfigError(f"align over {steps} training steps", "compare at least one step (default 3)")
    seed_everything(seed)
    return [record_step(model, batch, loss_fn, optimizer, feed=feeds[k] if feeds else None, keep_inputs=keep_inputs)
            for k in range(steps)]


def align_modules(model: nn.Module, reference: nn.Module, batch: Batch, *, loss_fn: Optional[Callable] = None,
                  optimizer: Optional[OptimizerFactory] = None, name_map: NameMapLike = None,
                  single_step: bool = False, seed: int = 0, copy_initial_weights: bool = True,
                  prepare_reference: Optional[Callable[[nn.Module], None]] = None,
                  reference_loss_fn: Optional[Callable] = None,
                  reference_optimizer: Optional[OptimizerFactory] = None,
                  steps: int = DEFAULT_STEPS) -> AlignReport:
    """`steps` training steps on `model` and `reference` (both deep-copied: the caller's modules are not changed).

    `optimizer(module)` builds the same optimizer for each side unless `reference_optimizer` (and
    `reference_loss_fn`) give the reference its own (a reference recipe with another loss or lr); `prepare_reference(ref)` runs after the
    weight copy (e.g. to set MindSpore's BN eps on the reference)."""
    nm = _name_map(name_map)
    ours_m, ref_m = copy.deepcopy(model), copy.deepcopy(reference)
    notes = _notes(batch, seed, steps)
    if copy_initial_weights:
        notes += copy_weights(ours_m, ref_m, nm)
    if prepare_reference is not None:
        prepare_reference(ref_m)
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    make_opt = optimizer or default_optimizer
    ours = record_steps(ours_m, batch, loss_fn, make_opt(ours_m), steps, seed, keep_inputs=single_step)
    feeds = [{nm.module(c): v for c, v in rec.inputs.items()}.get for rec in ours] if single_step else None
    theirs = record_steps(ref_m, batch, reference_loss_fn or loss_fn, (reference_optimizer or make_opt)(ref_m),
                          steps, seed, feeds=feeds)
    return compare_steps(ours, theirs, nm.module, nm.tensor, AlignReport("modules", single_step, notes=notes))


def align_dump(model: nn.Module, directory: str | Path, *, batch: Optional[Batch] = None,
               loss_fn: Optional[Callable] = None, optimizer: Optional[OptimizerFactory] = None,
               name_map: NameMapLike = None, single_step: bool = False, seed: int = 0,
               steps: int = DEFAULT_STEPS) -> AlignReport:
    """Up to `steps` training steps on `model` against a dump directory (layout: torchboost.migrate.dump): as
    many as the dump holds, a note saying so when it holds fewer. The batch and, when present, the initial
    weights come from the dump."""
    nm, d = _name_map(name_map), Path(directory)
    theirs = read_dump_steps(d, steps)
    ours_m = copy.deepcopy(model)
    if batch is None:
        if not (d / "batch.npz").is_file():
            raise DataError(f"{d} has no batch.npz", "copy the batch.npz that dump_step wrote into it")
        arrays = read_arrays(d / "batch.npz")
        batch = (arrays["x"], arrays["y"])
    notes = _notes(batch, seed, len(theirs))
    if len(theirs) < steps:
        notes.append(f"the dump holds {len(theirs)} of the {steps} training steps asked: a difference in "
                     "optimizer state (momentum) shows only from the 2nd; write step2/, ... (migrate/dump.py)")
    if (d / "weights.npz").is_file():
        notes += load_named(ours_m, read_arrays(d / "weights.npz"), nm.tensor, "weights.npz")
        notes.append("initial weights loaded from weights.npz")
    else:
        notes.append("no weights.npz: our weights were used as they are; the reference must have started equal")
    if single_step and not all(rec.inputs for rec in theirs):
        raise ConfigError("single-step needs the reference's module inputs", "write 'input_0', ... into "
                          "forward/<call>.npz of every step (dump_step does this by default)")
    feeds = [(lambda call, rec=rec: rec.inputs.get(nm.module(call))) for rec in theirs] if single_step else None
    ours = record_steps(ours_m, batch, loss_fn or nn.CrossEntropyLoss(), (optimizer or default_optimizer)(ours_m),
                        len(theirs), seed, feeds=feeds)
    return compare_steps(ours, theirs, nm.module, nm.tensor, AlignReport("dump", single_step, notes=notes))


def dump_step(model: nn.Module, batch: Batch, out: str | Path, *, loss_fn: Optional[Callable] = None,
              optimizer: Optional[OptimizerFactory] = None, name_map: NameMapLike = None,
              with_inputs: bool = True, seed: int = 0, steps: int = DEFAULT_STEPS) -> Path:
    """Record `steps` training steps of `model` and write them (plus batch.npz and the initial weights.npz) in
    the dump layout, names mapped through `name_map` — the other framework's script loads batch and weights
    from it."""
    nm, m, out = _name_map(name_map), copy.deepcopy(model), Path(out)
    initial = {nm.tensor(k): v.detach().clone() for k, v in m.state_dict().items()}
    recs = record_steps(m, batch, loss_fn or nn.CrossEntropyLoss(), (optimizer or default_optimizer)(m), steps,
                        seed, keep_inputs=with_inputs)
    mapped = [Recording(forward={nm.module(c): v for c, v in rec.forward.items()},
                        inputs={nm.module(c): v for c, v in rec.inputs.items()},
                        grads={nm.tensor(n): v for n, v in rec.grads.items()},
                        updates={nm.tensor(n): v for n, v in rec.updates.items()}, loss=rec.loss) for rec in recs]
    for k, rec in enumerate(mapped[1:], start=2):
        write_dump(rec, out / f"step{k}")
    return write_dump(mapped[0], out, batch, initial, steps)  # last: its meta.json marks a complete dump


def load_reference(spec: str) -> nn.Module:
    """`package.module:factory` or `path/to/file.py:factory`; factory() must return an nn.Module."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise ConfigError(f"reference '{spec}' is not module:callable", "write e.g. mypkg.nets:build_resnet")
    try:
        if target.endswith(".py"):
            sp = importlib.util.spec_from_file_location(Path(target).stem, target)
            if sp is None or sp.loader is None or not Path(target).is_file():
                raise ImportError(f"no file {target}")
            module = importlib.util.module_from_spec(sp)
            sp.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
        net = getattr(module, attr)()
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"cannot load reference '{spec}' ({e})", "check the module path and callable name") from None
    if not isinstance(net, nn.Module):
        raise ConfigError(f"reference '{spec}' returned {type(net).__name__}, not an nn.Module",
                          "make the callable return the network")
    return net
