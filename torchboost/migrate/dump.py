"""The align dump directory: a few training steps written as `.npz`/`.npy` files any framework can produce.

Layout (all arrays C-order; floats as float32/float64; names are module paths / parameter names of the
side that wrote them, e.g. MindSpore cell paths `layer1.0.conv1`, `end_point`, params `bn1.gamma`):

    DIR/meta.json                  {"format": "torchboost-align-dump", "version": 1, "loss": <float>,
                                    "forward_order": [call names in completion order], "framework": "...",
                                    "steps": <training steps in the dump>}
                                   (optional; loss is compared when present; without "steps", every
                                   stepK/ folder present counts)
    DIR/batch.npz                  "x": the input batch, "y": the labels — the same batch for both sides
    DIR/weights.npz                initial weights and buffers, by parameter name (optional: when present,
                                   `align_dump` loads them into our model so both sides start equal)
    DIR/forward/<call>.npz         "output" (or "output_0", "output_1", ... for several outputs) and,
                                   for single-step mode, "input_0", "input_1", ... (positional inputs)
    DIR/grad/<param>.npy           the parameter's gradient after backward of the mean loss
    DIR/update/<name>.npy          value after the optimizer step minus value before (parameters, and
                                   floating buffers such as BN running statistics, which the forward updates)
    DIR/step2/, DIR/step3/, ...    the next training steps on the same batch, the optimizer's state carried
                                   over (momentum, Adam's moments: a difference there shows only from the
                                   2nd step), each with its own meta.json, forward/, grad/ and update/ as above
                                   (optional: a dump without them is compared over its one step, and says so)

<call> is the module path, "(root)" for the whole network, "path#2" for a module's second call.
Recipe for another framework: load batch.npz and weights.npz written by `dump_step` on our side, run as many
steps on that batch with the same optimizer settings (dropout off, BN in training mode), write the files above (forward
hooks in PyTorch; `Cell.register_forward_hook` or msprobe dumps in MindSpore; `register_forward_post_hook`
in Paddle), then `torchboost align --config A --reference-dump DIR`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError
from .record import Recording
from torchboost.fileio import atomic_path, atomic_write, check_regular, output_error, read_regular
from torchboost.plaindata import load_json

FORMAT, VERSION = "torchboost-align-dump", 1


def _np(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype in (torch.bfloat16, torch.float16):  # numpy has no bfloat16: widen (exact)
        t = t.float()
    return t.numpy()


def _savez(path: Path, **arrays: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:  # a file object: np.savez would append .npz to a path
        np.savez(f, **arrays)


def write_dump(rec: Recording, out: str | Path, batch: tuple[torch.Tensor, torch.Tensor] | None = None,
               weights: dict[str, torch.Tensor] | None = None, steps: int = 1) -> Path:
    """Write a Recording (already in the names the reader expects) in the layout above: `out` is DIR (with the
    batch, and `steps` the dump holds) or one of its stepK/ folders (no batch)."""
    out = Path(out)
    for sub in ("forward", "grad", "update"):
        try:
            (out / sub).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise output_error(out / sub, e) from None
    if batch is not None:
        _savez(out / "batch.npz", x=_np(batch[0]), y=_np(batch[1]))
    if weights is not None:
        _savez(out / "weights.npz", **{k: _np(v) for k, v in weights.items()})
    for call, outputs in rec.forward.items():
        arrays = {"output": _np(outputs[0])} if len(outputs) == 1 else {
            f"output_{i}": _np(t) for i, t in enumerate(outputs)}
        arrays.update({f"input_{i}": _np(t) for i, t in enumerate(rec.inputs.get(call, ()))})
        _savez(out / "forward" / f"{call}.npz", **arrays)
    for sub, tensors in (("grad", rec.grads), ("update", rec.updates)):
        for name, t in tensors.items():
            with atomic_path(out / sub / f"{name}.npy") as tmp, open(tmp, "wb") as f:
                np.save(f, _np(t))
    meta = {"format": FORMAT, "version": VERSION, "loss": rec.loss, "forward_order": list(rec.forward),
            "framework": f"torch {torch.__version__}", "steps": steps}
    atomic_write(out / "meta.json", json.dumps(meta, indent=1))  # last: a dump with meta.json is complete
    return out


def _load(path: Path) -> dict[str, np.ndarray]:
    try:  # allow_pickle=False: a dump is untrusted input and must never run code
        obj = np.load(check_regular(path), allow_pickle=False)
        if not hasattr(obj, "files"):  # a .npy file: one array
            return {"": obj}
        with obj:
            return {k: obj[k] for k in obj.files}
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read {path} ({e})", "rewrite it with numpy.save/savez (no pickled objects)") from None


def _indexed(arrays: dict[str, np.ndarray], prefix: str) -> tuple[torch.Tensor, ...]:
    keys = sorted((k for k in arrays if k.startswith(prefix + "_")), key=lambda k: int(k.rsplit("_", 1)[1]))
    return tuple(torch.from_numpy(arrays[k]) for k in keys)


def _read_meta(path: Path) -> dict:
    """A dump's meta.json as a mapping: anything else (not JSON, nested past the parser's stack, not an object)
    is one DataError line."""
    try:
        meta = load_json(read_regular(path, DataError))
    except ValueError as e:
        raise DataError(f"{path} is not a dump's meta.json ({e})", "pass the folder written by dump_step") from None
    fields = {"loss": (int, float, type(None)), "forward_order": list, "steps": int}
    wrong = [k for k, kind in fields.items() if isinstance(meta, dict) and k in meta and
             (not isinstance(meta[k], kind) or isinstance(meta[k], bool))]
    if not isinstance(meta, dict) or wrong or not all(isinstance(c, str) for c in meta.get("forward_order", [])):
        what = f"{', '.join(wrong) or 'forward_order'} of the wrong kind" if isinstance(meta, dict) else \
            "not a JSON object"
        raise DataError(f"{path} is not a dump's meta.json ({what})", "pass the folder written by dump_step")
    return meta


def read_dump(directory: str | Path) -> tuple[Recording, dict]:
    """(Recording, meta) from a dump directory; missing parts are simply empty."""
    d = Path(directory)
    if not d.is_dir():
        raise DataError(f"dump directory {d} not found", "pass the folder written by dump_step or your script")
    meta = _read_meta(d / "meta.json") if (d / "meta.json").is_file() else {}
    rec = Recording(loss=meta.get("loss"))
    forward_files = {p.name[: -len(".npz")]: p for p in sorted((d / "forward").glob("*.npz"))}
    order = [c for c in meta.get("forward_order", []) if c in forward_files]
    for call in order + sorted(set(forward_files) - set(order)):
        arrays = _load(forward_files[call])
        rec.forward[call] = (torch.from_numpy(arrays["output"]),) if "output" in arrays else _indexed(arrays, "output")
        if any(k.startswith("input_") for k in arrays):
            rec.inputs[call] = _indexed(arrays, "input")
    for sub, target in (("grad", rec.grads), ("update", rec.updates)):
        for p in sorted((d / sub).glob("*.npy")):
            target[p.name[: -len(".npy")]] = torch.from_numpy(_load(p)[""])
    if not (rec.forward or rec.grads or rec.updates):
        raise DataError(f"dump directory {d} holds no forward/, grad/ or update/ files",
                        "see torchboost.migrate.dump for the layout")
    return rec, meta


def read_dump_steps(directory: str | Path, steps: int) -> list[Recording]:
    """Up to `steps` training steps of a dump directory: DIR's own, then step2/, step3/, ... as far as the
    dump holds them (its meta.json's "steps", else every stepK/ folder present, in order)."""
    d = Path(directory)
    first, meta = read_dump(d)
    held = meta.get("steps")
    limit = min(steps, held) if isinstance(held, int) and not isinstance(held, bool) and held >= 1 else steps
    recs = [first]
    while len(recs) < limit and (d / f"step{len(recs) + 1}").is_dir():
        recs.append(read_dump(d / f"step{len(recs) + 1}")[0])
    return recs


def read_arrays(path: str | Path) -> dict[str, torch.Tensor]:
    """A `.npz` file (batch.npz, weights.npz) as tensors."""
    return {k: torch.from_numpy(v) for k, v in _load(Path(path)).items()}
