"""What an exported classifier records about itself, so that it can be deployed without torchboost's config:
the input it takes, the preprocessing that makes that input from an image, and what its outputs mean.

The exported network takes what the run's evaluation transform produces: float32 N×C×H×W, already
normalised. From an image file: resize the shorter side to `resize` (bilinear, antialiased), centre-crop
`size`×`size`, scale to [0, 1], then (x - mean) / std per channel. The network ends in logits (softmax for
probabilities), one per class, in the order of `classes`.

Stored as string key/value pairs (ONNX `metadata_props`) and as one JSON file beside a TorchScript or
ExportedProgram archive. Read back from an untrusted file, every value is checked before it is used.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from torchboost.errors import CheckpointError
from torchboost.plaindata import in_float_range, json_int

FORMAT = "torchboost-classifier/1"  # the value of the `format` key; changes when the meaning of a key does
META_FILE = "torchboost.json"  # the extra file in TorchScript / ExportedProgram archives
MAX_VALUE_CHARS = 1 << 22  # a metadata value (the class names of a 100k-class model fit)
MAX_SIDE = 16384  # pixels: a larger resize is a corrupt value, not a model
MAX_INPUT = 2048  # pixels per side of the network's input, for configs (data.image_size) and metadata alike
# per-channel normalisation on [0, 1] pixels, bounded once for configs (data.mean / data.std) and metadata alike:
# a std of 5e-324 divides a pixel into infinity
MEAN_RANGE, STD_RANGE = (-1000.0, 1000.0), (1e-4, 1000.0)


@dataclasses.dataclass(frozen=True)
class DeployInfo:
    model: str  # the zoo name (resnet50, mnist_cnn...)
    classes: tuple[str, ...]  # one per output, in output order
    channels: int  # 1 (grayscale) or 3 (RGB)
    size: int  # the network's input is channels × size × size
    resize: int  # the shorter side is resized to this before the centre crop
    mean: tuple[float, ...]  # per channel, on [0, 1] pixel values
    std: tuple[float, ...]
    version: str = ""  # torchboost's version that exported it
    normalized: bool = True  # the input is expected normalised (the network does not normalise)

    @property
    def input_size(self) -> tuple[int, int, int]:
        return (self.channels, self.size, self.size)

    @property
    def crop_pct(self) -> float:
        return self.size / self.resize

    def transform(self):
        """The evaluation transform (torchboost.data's EvalTransform) that makes this input from an image."""
        from torchboost.data.transforms import eval_transform

        t = eval_transform(self.size, self.mean, self.std, crop_pct=self.crop_pct)
        t.resize = self.resize  # exact: size / (size / resize) may round to one pixel less
        return t

    def to_props(self) -> dict[str, str]:
        """The string pairs stored as ONNX metadata (lists and the flag as JSON)."""
        return {"format": FORMAT, "model": self.model, "torchboost_version": self.version,
                "input_size": json.dumps(list(self.input_size)), "input_layout": "NCHW float32",
                "input_normalized": json.dumps(self.normalized), "resize": str(self.resize),
                "mean": json.dumps(list(self.mean)), "std": json.dumps(list(self.std)),
                "classes": json.dumps(list(self.classes)),
                "preprocessing": f"resize the shorter side to {self.resize}, centre-crop {self.size}x{self.size}, "
                                 "scale to [0, 1], subtract mean, divide by std (per channel)"}

    def to_json(self) -> str:
        return json.dumps(self.to_props(), indent=1)

    @classmethod
    def from_props(cls, props: Mapping[str, str], source: str) -> DeployInfo:
        """The info stored in `props`, each value checked: CheckpointError naming `source` when one is
        missing or out of shape (the file is untrusted)."""
        def bad(what: str) -> CheckpointError:
            return CheckpointError(f"{source}: {what}", "export it again with `torchboost export`")

        if props.get("format") != FORMAT:
            raise bad(f"no torchboost metadata (format {FORMAT!r} expected)" if "format" not in props
                      else f"metadata format {str(props['format'])[:40]!r} is not {FORMAT!r}")

        def value(key: str) -> Any:
            text = props.get(key)
            if not isinstance(text, str) or len(text) > MAX_VALUE_CHARS:
                raise bad(f"metadata {key} is missing" if text is None else f"metadata {key} is too long")
            if key in ("model", "torchboost_version"):
                return text
            try:
                return json.loads(text, parse_int=json_int)  # 5,001 digits: refused below, never parsed
            except (ValueError, RecursionError):
                raise bad(f"metadata {key} is not JSON") from None

        c, h, w = _ints(value("input_size"), 3, bad, "input_size")
        resize = _ints([value("resize")], 1, bad, "resize")[0]
        if c not in (1, 3) or h != w or not 0 < h <= min(resize, MAX_INPUT):
            raise bad(f"metadata input_size {[c, h, w]} / resize {resize} is not 1 or 3 channels of a square "
                      f"image no larger than the resize and {MAX_INPUT} pixels (as a checkpoint's data.image_size)")
        mean, std = (_floats(value(k), c, bad, k) for k in ("mean", "std"))
        for key, values, (low, high) in (("mean", mean, MEAN_RANGE), ("std", std, STD_RANGE)):
            if not all(low <= v <= high for v in values):
                raise bad(f"metadata {key} holds a value outside [{low:g}, {high:g}] (as a checkpoint's data.{key})")
        classes = value("classes")
        if not (isinstance(classes, list) and classes and all(isinstance(n, str) for n in classes)
                and len(set(classes)) == len(classes)
                and all(0 < len(n.encode(errors="replace")) <= 255 for n in classes)):  # as a checkpoint's
            raise bad("metadata classes is not a list of distinct names of 1 to 255 bytes")
        if value("input_normalized") is not True:
            raise bad("metadata input_normalized is not true (this version exports normalised inputs only)")
        for key, least in (("model", 1), ("torchboost_version", 0)):  # names, as model.name: short, one line
            if not (least <= len(value(key)) <= 200 and value(key).isprintable()):
                raise bad(f"metadata {key} is not a printable name of {least} to 200 characters")
        return cls(value("model"), tuple(classes), c, h, resize, mean, std, value("torchboost_version"))


def _ints(v: Any, n: int, bad, key: str) -> list[int]:
    if not (isinstance(v, list) and len(v) == n and all(type(i) is int and 0 < i <= MAX_SIDE for i in v)):
        raise bad(f"metadata {key} is not {n} positive whole number(s) up to {MAX_SIDE}")
    return v


def _floats(v: Any, n: int, bad, key: str) -> tuple[float, ...]:
    if not (isinstance(v, list) and len(v) == n
            and all(type(x) in (int, float) and in_float_range(x) for x in v)):  # no OverflowError on 1e400
        raise bad(f"metadata {key} is not {n} finite number(s), one per channel")
    return tuple(float(x) for x in v)
