"""Checkpoints: atomic writes, safe loading, exact RNG capture.

A checkpoint is a dict of tensors and plain values only, so `torch.load(weights_only=True)` can read it
and nothing in it can run code. Training checkpoints are `{prefix}-{epoch}_{step}.pt`: `.ckpt` means a
MindSpore protobuf everywhere in torchboost (torch checkpoints with any extension still load: the format
is recognised by content).
"""

from __future__ import annotations

import os
import random
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import CheckpointError, printable
from ..fileio import atomic_path, open_regular
from ..plaindata import in_float_range

CHECKPOINT_SUFFIX = ".pt"  # training checkpoints are torch files (the weight-format registry's torch entry)
_NAME = re.compile(r"^(?P<prefix>.+)-(?P<epoch>\d+)_(?P<step>\d+)" + re.escape(CHECKPOINT_SUFFIX) + "$")
# torch.save's zip container (torch >= 1.6), or the legacy format: a pickle (protocol 2+ opcode 0x80).
_TORCH_MAGIC = (b"PK\x03\x04", b"\x80")


def checkpoint_name(prefix: str, epoch: int, step: int) -> str:
    """MindSpore's naming with torch's extension: `{prefix}-{epoch}_{step}.pt` (epoch 1-based, step within
    the epoch)."""
    return f"{prefix}-{epoch}_{step}{CHECKPOINT_SUFFIX}"


def atomic_save(obj: Any, path: str | Path) -> Path:
    """torch.save through a temp file + fsync + rename: a crash leaves the old file or the new, never half.
    A full disk or a permission problem raises OutputError and leaves the old file as it was."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(obj, f)  # a file object, not a path: write errors then arrive as OSError (errno kept)
    return Path(path)


def is_torch_file(path: str | Path) -> bool:
    """True when the file's first bytes are torch.save's (zip or legacy pickle), whatever its extension."""
    with open_regular(path, CheckpointError) as f:
        return f.read(4).startswith(_TORCH_MAGIC)


def check_torch_zip(path: str | Path) -> None:
    """Refuse (CheckpointError) a torch file whose records could inflate past its own size, before torch reads
    it: torch.save stores every record uncompressed, but torch.load also inflates deflated zip entries, so a
    4 MB file could claim 4 GiB of tensors. The legacy (pre-1.6) format reads sizes from the file as it goes
    and cannot be bounded up front: it is refused too."""
    fix = "re-save it with torch.save (torch >= 1.6, uncompressed), or use another copy"
    with open_regular(path, CheckpointError) as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(4)
        if head.startswith(_TORCH_MAGIC[1]):
            raise CheckpointError(f"{path} is a legacy (torch < 1.6) torch file, whose sizes cannot be checked "
                                  "before reading", fix)
        if not head.startswith(_TORCH_MAGIC[0]):
            raise CheckpointError(f"{path} is not a torch file (it does not start as torch.save writes)",
                                  "pass a checkpoint or state dict saved with torch.save")
        f.seek(0)
        try:
            entries = zipfile.ZipFile(f).infolist()
        except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
            raise CheckpointError(f"{path} is not a readable torch file ({type(e).__name__})", fix) from None
    declared = sum(e.file_size for e in entries)
    packed = [e for e in entries if e.compress_type != zipfile.ZIP_STORED or e.file_size != e.compress_size]
    if packed or declared > size:
        what = f"its record {packed[0].filename[:60]!r} is compressed" if packed else \
            f"its records claim {declared:,} bytes in a {size:,}-byte file"
        raise CheckpointError(f"{path} is not a plain torch file: {what}", fix)


def torch_load(path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> Any:
    """`torch.load(weights_only=True)` of a file that is checked first: a regular file (not a FIFO) whose
    records cannot inflate (`check_torch_zip`). Errors other than CheckpointError are torch's own."""
    check_torch_zip(path)
    return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """Load with weights_only=True (no unpickling of arbitrary objects)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} not found", "check the path (checkpoints are in OUTPUT/ckpt)")
    if not is_torch_file(path):
        raise CheckpointError(f"{path} is not a torch checkpoint (a MindSpore .ckpt, or a damaged file)",
                              f"convert a MindSpore checkpoint first (torchboost convert {path} {path.stem}.pt "
                              "--arch ARCH); otherwise use an earlier checkpoint")
    try:
        state = torch_load(path, map_location)
    except CheckpointError:
        raise
    except Exception as e:  # torch raises several types for corrupt/unsafe files
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"cannot read checkpoint {path} ({first[:160]})",
                              "the file is corrupt or not a torchboost checkpoint; use an earlier one") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} does not hold a dict of tensors", "pass a torchboost checkpoint or state dict")
    return state


RESUME_KEYS = ("model", "epoch", "step_in_epoch", "global_step", "epoch_complete", "rng")


def check_resumable(ckpt: dict, source: str) -> None:
    """Refuse, before anything is restored, a checkpoint that lacks what a resume needs or whose optimizer
    state contradicts itself (torch would load it silently and misassign the momentum buffers)."""
    fix = "resume from an unmodified checkpoint written by torchboost train, or start from its weights only"
    missing = [k for k in RESUME_KEYS if k not in ckpt]
    if missing:
        raise CheckpointError(f"{source} cannot be resumed: it has no {', '.join(map(repr, missing))}", fix)
    check_position(ckpt, source, fix)
    check_rng_state(ckpt["rng"], source, fix)
    opt = ckpt.get("optimizer") or {}
    try:
        ids = [i for g in opt.get("param_groups", []) for i in g.get("params", [])]
        consistent = len(set(ids)) == len(ids) and set(opt.get("state", {})) <= set(ids)
    except (TypeError, AttributeError):  # not even the structure torch writes
        consistent = False
    if not consistent:
        raise CheckpointError(f"{source} cannot be resumed: its optimizer state names parameters its parameter "
                              "groups do not hold", fix)


MAX_COUNT = 2**40  # updates, epochs or samples: far past any real run, far inside int64 and float64


def _count(value: object) -> bool:
    return type(value) is int and 0 <= value < MAX_COUNT


def check_position(ckpt: dict, source: str, fix: str) -> None:
    """The saved position is what a run could have written: counters are integers from 0 to MAX_COUNT (a
    2^70 step would overflow the schedules' tensors, a negative epoch index the history), the position in
    the epoch is consistent, the epoch's running values are finite numbers."""
    counters = {k: ckpt.get(k) for k in ("epoch", "step_in_epoch", "global_step", "samples_in_epoch") if k in ckpt}
    bad = next((k for k, v in counters.items() if not _count(v)), None)
    if bad is not None:
        raise CheckpointError(f"{source} cannot be resumed: its {bad} is {str(counters[bad])[:40]}, not a count "
                              f"from 0 to 2^40", fix)
    if type(ckpt["epoch_complete"]) is not bool:
        raise CheckpointError(f"{source} cannot be resumed: its epoch_complete is not true or false", fix)
    if ckpt["step_in_epoch"] > ckpt["global_step"]:
        raise CheckpointError(f"{source} cannot be resumed: its step_in_epoch ({ckpt['step_in_epoch']}) is past its "
                              f"global_step ({ckpt['global_step']})", fix)
    elapsed = ckpt.get("epoch_elapsed_s", 0.0)
    sums = ckpt.get("epoch_sums", {"samples": 0, "loss_sum": 0.0, "correct": 0})
    numbers = [elapsed] + ([sums.get(k) for k in ("loss_sum", "correct")] if isinstance(sums, dict) else [None])
    if not isinstance(sums, dict) or not _count(sums.get("samples")) or not all(_finite_number(v) for v in numbers) \
            or elapsed < 0:
        raise CheckpointError(f"{source} cannot be resumed: its epoch sums or elapsed time are not finite counts", fix)


def _finite_number(value: object) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.is_complex() and bool(torch.isfinite(value.float()).all())
    return type(value) in (int, float) and in_float_range(value)  # math.isfinite(10**400) is an OverflowError


def check_rng_state(state: object, source: str, fix: str) -> None:
    """The saved RNG states are ones Python, numpy and torch accept: tried on the live generators, which are
    put back as they were whatever happens (garbage would otherwise be a traceback, or a state that
    wrapped around silently)."""
    before = rng_state()
    try:
        if not isinstance(state, dict) or not all(k in state for k in ("python", "numpy", "torch")):
            raise TypeError("not a mapping of python, numpy and torch states")
        n = state["numpy"]
        key = n["key"]
        if not (isinstance(key, torch.Tensor) and key.dtype == torch.int64 and tuple(key.shape) == (624,)
                and bool(((key >= 0) & (key < 2**32)).all())):
            raise ValueError("numpy key is not 624 32-bit words")
        if not (_count(n["pos"]) and n["pos"] <= 624 and n["has_gauss"] in (0, 1) and _finite_number(n["cached_gaussian"])):
            raise ValueError("numpy position out of range")
        t = state["torch"]
        if not (isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.shape == before["torch"].shape):
            raise ValueError("torch state is not the generator's bytes")
        set_rng_state(state)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError, RuntimeError) as e:
        raise CheckpointError(f"{source} cannot be resumed: its RNG state is damaged ({printable(e)[:100]})", fix) \
            from None
    finally:
        set_rng_state(before)


def _same_kind(built: object, loaded: object) -> bool:
    if isinstance(built, bool) or built is None or isinstance(built, str):
        return type(loaded) is type(built)
    if isinstance(built, (int, float)):
        return type(loaded) in (int, float) and in_float_range(loaded)
    return True  # tensors (a capturable lr), tuples (betas): torch's own loader checks what it casts


def check_optimizer_state(optimizer: torch.optim.Optimizer, built: list[dict], source: str) -> None:
    """After torch's `load_state_dict`: each group's hyperparameters are of the kind the optimizer was built
    with (`built`: its groups before loading; a `None` weight decay reached the fused kernel as a TypeError),
    and each parameter's state tensors have its size (a momentum or moment buffer, in any shape), one value
    per row (a row statistic such as NorMuon's) or one value: torch's loader checks no shapes, and its fused
    kernels (SGD's, Adam's) write past the end of a smaller buffer (a segfault, not an error)."""
    fix = "resume from an unmodified checkpoint written by torchboost train, or start from its weights only"
    for i, (before, group) in enumerate(zip(built, optimizer.param_groups)):
        bad = next((k for k, v in before.items() if k != "params" and not _same_kind(v, group.get(k))), None)
        if bad is not None:
            raise CheckpointError(f"{source} cannot be resumed: its optimizer group {i} has {bad}="
                                  f"{str(group.get(bad))[:40]!r} where the optimizer holds a "
                                  f"{type(before[bad]).__name__}", fix)
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                sizes = (1, p.numel(), p.shape[0] if p.dim() else 1)
                # a buffer is a tensor; only a step count may be a plain number (as older torch stored it)
                number = key == "step" and type(value) in (int, float) and in_float_range(value) and value >= 0
                if not isinstance(value, torch.Tensor) and not number:
                    raise CheckpointError(f"{source} cannot be resumed: its optimizer state {key!r} is "
                                          f"{type(value).__name__}, not a tensor", fix)
                if isinstance(value, torch.Tensor) and value.numel() not in sizes:
                    raise CheckpointError(f"{source} cannot be resumed: its optimizer state {key!r} has "
                                          f"{value.numel()} values for a parameter of shape {tuple(p.shape)}", fix)


def saved_classes(ckpt: dict, num_classes: int | None, source: str) -> list[str] | None:
    """The class names a checkpoint records (None when it records none): distinct strings, one per output
    of the network (`num_classes`, when known), each short enough to be a folder name. Anything else is
    refused, not indexed into."""
    names = ckpt.get("classes")
    if names is None:
        return None
    num_classes = len(names) if num_classes is None and isinstance(names, list) else num_classes
    if not (isinstance(names, list) and len(names) == num_classes and all(isinstance(n, str) for n in names)
            and len(set(names)) == len(names) and all(0 < len(n.encode(errors="replace")) <= 255 for n in names)):
        count = len(names) if isinstance(names, list) else type(names).__name__
        raise CheckpointError(f"{source} records class names that are not {num_classes} distinct names "
                              f"({count})", "use an unmodified checkpoint written by torchboost train")
    return names


def is_checkpoint_name(name: object, prefix: str) -> bool:
    """True for a bare file name `{prefix}-{epoch}_{step}.pt`: no folder, no `..`, this prefix only."""
    if not isinstance(name, str) or Path(name).name != name:
        return False
    m = _NAME.match(name)
    return m is not None and m["prefix"] == prefix


def list_checkpoints(directory: str | Path, prefix: str) -> list[Path]:
    """This prefix's checkpoints, oldest first (by epoch, then step)."""
    found = []
    for p in Path(directory).glob(f"{prefix}-*.pt"):
        m = _NAME.match(p.name)
        if m and m["prefix"] == prefix:
            found.append((int(m["epoch"]), int(m["step"]), p))
    return [p for _, _, p in sorted(found)]


def rng_state() -> dict:
    """Python, numpy and torch RNG states as tensors/plain values (loadable with weights_only)."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"key": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def classifier_head(model: nn.Module) -> list[str]:
    """Parameter names of the model's last Linear layer: the part fine-tuning replaces for new classes."""
    last = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not last:
        return []
    prefix = f"{last[-1]}." if last[-1] else ""
    return [f"{prefix}{n}" for n, _ in dict(model.named_modules())[last[-1]].named_parameters()]


def load_backbone(model: nn.Module, state: dict, source: str = "checkpoint") -> list[str]:
    """Fine-tuning: load every tensor of `state`, except a classifier head whose shape differs (another class
    count), which keeps its fresh initialisation. Returns the head tensors left out; any other mismatch is an
    error as in `load_model_state`."""
    own = model.state_dict()
    head = [n for n in classifier_head(model) if n in state and state[n].shape != own[n].shape]
    kept = {n: t for n, t in state.items() if n not in head}
    load_model_state(model, {**kept, **{n: own[n] for n in head}}, source)
    return head


def load_model_state(model: nn.Module, state: dict, source: str = "checkpoint") -> None:
    """Strict load that names the first mismatching tensor instead of torch's wall of text."""
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise CheckpointError(f"{source} does not hold a mapping of tensor names to tensors",
                              "pass an unmodified checkpoint or a state dict saved with model.state_dict()")
    own = model.state_dict()
    for name, tensor in own.items():
        if name not in state:
            raise CheckpointError(f"{source} has no tensor '{name}' (model expects {len(own)} tensors, "
                                  f"{source} has {len(state)})", "it was saved for another architecture; "
                                  "check model.name / model.num_classes or convert it with `torchboost convert`")
        if state[name].shape != tensor.shape:
            raise CheckpointError(f"{source} tensor '{name}' has shape {tuple(state[name].shape)}, model expects "
                                  f"{tuple(tensor.shape)}", "check model.name / model.num_classes match the checkpoint")
        if _kind(state[name]) != _kind(tensor):  # load_state_dict would cast int8 or bool weights without a word
            raise CheckpointError(f"{source} tensor '{name}' holds {str(state[name].dtype).removeprefix('torch.')}, "
                                  f"the model's is {str(tensor.dtype).removeprefix('torch.')}",
                                  "pass weights saved from this architecture (floating point, in any precision)")
    extra = [k for k in state if k not in own]
    if extra:
        raise CheckpointError(f"{source} has unexpected tensor '{extra[0]}' ({len(extra)} extra)",
                              "it was saved for another architecture; check model.name")
    model.load_state_dict(state)


def _kind(t: torch.Tensor) -> str:
    """A dtype's kind: tensors of one kind load into each other (float16 weights into float32), not across."""
    return ("float" if t.is_floating_point() else "complex" if t.is_complex() else "bool" if t.dtype == torch.bool
            else "int")


def weights_finite(module: torch.nn.Module) -> bool:
    """Every floating-point weight and buffer of `module` is finite (one host read)."""
    tensors = [t for t in module.state_dict().values() if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return not tensors or bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())
