"""Decoding JPEGs on the device (`data.decode=device`): loader workers ship each image's encoded bytes and its
crop; the training process decodes, crops and resizes the whole batch on the GPU.

A worker does only the cheap part of the CPU transform (`DeviceDecode.encode`): the file's bytes (read by the
data set through the regular-file readers, at most MAX_FILE_BYTES), the size from the header (Pillow opens
lazily, and `open_image` has refused sizes over its pixel limit) and the crop box and flip, drawn from the
sample's own stream by the CPU transform's own `draw`: the CPU path's crops, reproducible and resumable alike.
A file nvJPEG should not get — not a JPEG, CMYK or another channel count than the run's, progressive (nvJPEG
decodes those on the host, in the training process), no end marker near its end (truncated), too large —
goes through the CPU transform itself in the worker, with the same stream, and rides in the batch decoded: a
corrupt file fails there, as on the CPU path (skip_corrupt included).

`DeviceBatch.to_images(device)` decodes with torchvision.io.decode_jpeg(list, device=...) (nvJPEG; the
A100/H100 hardware decoder for baseline JPEGs) on CUDA, else with Pillow (CPU runs, tests), crops each box,
resizes it with torch's antialiased bilinear filter (Pillow's, as the CPU path) and flips it: uint8 N×C×S×S on
the device, which `prepare_input` normalises there. The CPU path decodes large JPEGs at a reduced scale
(draft mode), this one at full size, so pixels differ by a few grey levels; the crops are the same.
"""

from __future__ import annotations

import copy
import io
import os
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import default_collate

from torchboost.data.transforms import IMAGE_ERRORS, EvalTransform, FlipTransform, ImageTransform, TrainTransform
from torchboost.errors import ConfigError, DataError

MAX_FILE_BYTES = 64 * 2**20  # as shardfiles.MAX_MEMBER_BYTES; a larger file is decoded on the CPU, by Pillow
EOI = b"\xff\xd9"  # a JPEG's last marker: a file without it near its end is truncated, or carries a trailer
TAIL = 64  # bytes accepted after the end marker (writers' padding); a longer trailer goes to the CPU path
CHUNK = 64  # images resized per float32 buffer: a 500-image evaluation batch needs no 300 MB one


@dataclass(frozen=True)
class Crop:
    """Where one output image comes from: `box` (top, left, height, width) of the decoded image, resized to
    `resize` (height, width), of which the square at `cut` (top, left) is kept, mirrored if `flip`. Training:
    the random box resized to the output; evaluation: the whole image resized, then its centre."""

    box: tuple[int, int, int, int]
    resize: tuple[int, int]
    cut: tuple[int, int]
    flip: bool


@dataclass
class EncodedImage:
    """One sample as a worker ships it: a JPEG's bytes, header size (width, height) and crop, or (`ready`) the
    CPU transform's uint8 output. `shape` is the output's (channels, size, size)."""

    name: str
    shape: tuple[int, int, int]
    data: bytes | None = None
    size: tuple[int, int] = (0, 0)
    crop: Crop | None = None
    ready: torch.Tensor | None = None


def read_encoded(f: BinaryIO) -> bytes | None:
    """The bytes of an open regular file when it has at most MAX_FILE_BYTES (else None, without reading it);
    the position is left at the start, for Pillow."""
    data = f.read(MAX_FILE_BYTES + 1) if os.fstat(f.fileno()).st_size <= MAX_FILE_BYTES else b""
    f.seek(0)
    return data if 0 < len(data) <= MAX_FILE_BYTES else None  # a file that grew since fstat: the CPU path


class DeviceDecode:
    """The sample transform of device decoding, around the CPU transform whose crops it reproduces: a
    TrainTransform (random resized crop + flip), FlipTransform or EvalTransform, without a photo policy or
    random erasing (both need the decoded image in the worker). Image folders and shards call `encode`."""

    def __init__(self, transform: ImageTransform) -> None:
        extra = transform.policy is not None or transform.erasing is not None
        if type(transform) not in (TrainTransform, FlipTransform, EvalTransform) or extra:
            what = "a photo policy or random erasing" if extra else type(transform).__name__
            raise ConfigError(f"device decoding cannot apply {what}: it needs the decoded image in the loader",
                              "decode on the CPU, or use the random resized crop, flip or evaluation crop")
        self.transform = copy.copy(transform)
        self.transform.uint8 = True  # device batches are uint8: the device normalises them
        self.shape = (len(transform.mean), transform.size, transform.size)

    @property
    def max_side(self) -> int:
        """The largest side an image is resized to (see `folder.check_transform`)."""
        return self.transform.max_side

    def on_device(self, img: Image.Image, data: bytes | None) -> bool:
        """Whether nvJPEG should decode this file (the module docstring says what it should not get)."""
        return (data is not None and img.format == "JPEG" and img.mode == self.transform.mode
                and not img.info.get("progressive") and data.rfind(EOI, max(0, len(data) - TAIL)) >= 0)

    def encode(self, img: Image.Image, rng: np.random.Generator, data: bytes | None, name: str) -> EncodedImage:
        """One sample: `img` opened on `data` (not decoded), `rng` its stream. Its bytes and the crop drawn as
        the CPU transform draws it; or, for a file nvJPEG should not get, the CPU transform's output (the
        same draws from the same stream)."""
        t = self.transform
        if not self.on_device(img, data):
            return EncodedImage(name, self.shape, ready=t(img, rng))
        w, h = img.size
        if isinstance(t, TrainTransform):
            box, flip = t.draw(w, h, rng)
            crop = Crop(box, (t.size, t.size), (0, 0), flip)
        else:  # the evaluation resize + centre crop, as EvalTransform.crop; FlipTransform then draws its flip
            (nw, nh), (left, top, _, _) = t.geometry(w, h)
            crop = Crop((0, 0, h, w), (nh, nw), (top, left), isinstance(t, FlipTransform) and t.draw_flip(rng))
        return EncodedImage(name, self.shape, data, (w, h), crop)


class DeviceBatch:
    """A batch as workers ship it: the JPEGs' bytes in one buffer (one shared-memory block between processes,
    not one per image), their header sizes and crops, and the images decoded on the CPU with their positions.
    `to_images(device)` (alias `to`, so `prepare_input` moves it like a tensor) makes the uint8 batch there."""

    def __init__(self, samples: Sequence[EncodedImage]) -> None:
        self.n, self.shape = len(samples), samples[0].shape
        self.jpegs = [i for i, s in enumerate(samples) if s.data is not None]
        self.ready_at = [i for i, s in enumerate(samples) if s.data is None]
        self.names = [samples[i].name for i in self.jpegs]
        self.sizes = [samples[i].size for i in self.jpegs]
        self.crops = [samples[i].crop for i in self.jpegs]
        chunks = [samples[i].data for i in self.jpegs]
        self.offsets = np.cumsum([0, *map(len, chunks)]).tolist()
        joined = bytearray().join(chunks)  # writable: torch warns on read-only buffers
        self.data = torch.frombuffer(joined, dtype=torch.uint8) if joined else torch.empty(0, dtype=torch.uint8)
        self.ready = torch.stack([samples[i].ready for i in self.ready_at]) if self.ready_at else None
        self._images: torch.Tensor | None = None  # the last to_images result (a closure optimizer asks twice)

    def __len__(self) -> int:
        return self.n

    def pin_memory(self) -> DeviceBatch:
        """The batch in page-locked memory (the DataLoader's pin-memory thread calls this)."""
        out = copy.copy(self)
        out.data, out._images = self.data.pin_memory(), None
        out.ready = None if self.ready is None else self.ready.pin_memory()
        return out

    def to_images(self, device: torch.device | str) -> torch.Tensor:
        """The batch as uint8 N×C×S×S on `device`: the JPEGs decoded, cropped, resized and flipped there."""
        device = torch.device(device)
        if self._images is not None and self._images.device == device:
            return self._images
        resized = self._decoded(device) if self.jpegs else None
        if self.ready is None:
            out = resized
        else:
            out = torch.empty((self.n, *self.shape), dtype=torch.uint8, device=device)
            out.index_copy_(0, _index(self.ready_at, device), self.ready.to(device, non_blocking=True))
            if resized is not None:
                out.index_copy_(0, _index(self.jpegs, device), resized)
        self._images = out
        return out

    def _decoded(self, device: torch.device) -> torch.Tensor:
        encoded = [self.data[a:b] for a, b in zip(self.offsets, self.offsets[1:])]
        images = decode_jpegs(encoded, self.names, self.shape[0], device)
        for img, (w, h), name in zip(images, self.sizes, self.names):
            if tuple(img.shape[-2:]) != (h, w):  # the crop boxes were drawn from the header's size
                raise DataError(f"image {name} decodes to {img.shape[-1]}×{img.shape[-2]} pixels but its header "
                                f"says {w}×{h}", "re-encode or remove it")
        return resize_crops(images, self.crops, self.shape[-1])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> torch.Tensor:
        """`to_images(device)`: copies are asynchronous where the batch is pinned, whatever `non_blocking`."""
        return self.to_images(device)


def _index(positions: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(positions, dtype=torch.long).to(device, non_blocking=True)


def collate(batch: list[Any]) -> Any:
    """default_collate, except that (EncodedImage, label) samples become (DeviceBatch, labels)."""
    if batch and isinstance(batch[0], tuple) and isinstance(batch[0][0], EncodedImage):
        return DeviceBatch([b[0] for b in batch]), default_collate([b[1] for b in batch])
    return default_collate(batch)


def decode_jpegs(encoded: list[torch.Tensor], names: list[str], channels: int, device: torch.device
                 ) -> list[torch.Tensor]:
    """Each JPEG (a uint8 1-D CPU tensor) as uint8 C×H×W on `device`: nvJPEG on CUDA (a batch it refuses is
    decoded image by image, Pillow taking what nvJPEG cannot, so that a bad file is named), Pillow elsewhere."""
    if device.type != "cuda":
        return [pil_decode(e, name, channels).to(device) for e, name in zip(encoded, names)]
    decode_jpeg, mode = nvjpeg(channels)
    try:
        return decode_jpeg(encoded, device=device, mode=mode)
    except RuntimeError:  # one bad file fails the whole call
        pass
    out = []
    for e, name in zip(encoded, names):
        try:
            out += decode_jpeg([e], device=device, mode=mode)
        except RuntimeError:
            out.append(pil_decode(e, name, channels).to(device))
    return out


def pil_decode(encoded: torch.Tensor, name: str, channels: int) -> torch.Tensor:
    """A JPEG decoded by Pillow at full size as uint8 C×H×W (the CPU stand-in for nvJPEG); a file Pillow cannot
    decode raises a one-line DataError naming it."""
    try:
        with Image.open(io.BytesIO(encoded.numpy())) as img:
            a = np.array(img.convert("RGB" if channels == 3 else "L"))  # writable, for torch
    except IMAGE_ERRORS as e:
        why = str(e).split(" <_io.BytesIO", 1)[0]  # Pillow names the in-memory file
        raise DataError(f"corrupt image {name} ({type(e).__name__}: {why})", "replace or delete it") from None
    return torch.from_numpy(a if a.ndim == 3 else a[..., None]).permute(2, 0, 1)


def nvjpeg(channels: int) -> tuple[Callable[..., list[torch.Tensor]], Any]:
    """(torchvision.io.decode_jpeg, the read mode for `channels`), imported when first needed: CPU runs never
    import torchvision. A torchvision that does not import is a one-line ConfigError, not a silent CPU decode."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except Exception as e:  # not installed, or built for another torch (RuntimeError, OSError)
        raise ConfigError(f"decoding JPEGs on CUDA needs torchvision's nvJPEG decoder, which does not import "
                          f"({type(e).__name__}: {e})", "install the torchvision built for this torch, or decode "
                          "on the CPU (data.decode=cpu)") from None
    return decode_jpeg, ImageReadMode.RGB if channels == 3 else ImageReadMode.GRAY


def resize_crops(images: Sequence[torch.Tensor], crops: Sequence[Crop], size: int) -> torch.Tensor:
    """uint8 N×C×size×size: each image's box resized with torch's antialiased bilinear filter (Pillow's, which
    the CPU path uses; in float32, as CUDA has no uint8 kernel), its square cut out and mirrored if asked.
    Two kernels per image (convert, resize); stacking, flips and rounding run once per CHUNK images."""
    n, c, device = len(images), images[0].shape[0], images[0].device
    out = torch.empty((n, c, size, size), dtype=torch.uint8, device=device)
    flips = torch.tensor([k.flip for k in crops]).view(-1, 1, 1, 1).to(device, non_blocking=True)
    for lo in range(0, n, CHUNK):
        parts = []
        for img, k in zip(images[lo : lo + CHUNK], crops[lo : lo + CHUNK]):
            top, left, h, w = k.box
            region = img[None, :, top : top + h, left : left + w].float()  # crop first: no pixel outside filtered
            y = F.interpolate(region, size=k.resize, mode="bilinear", antialias=True, align_corners=False)
            parts.append(y[0, :, k.cut[0] : k.cut[0] + size, k.cut[1] : k.cut[1] + size])
        x = torch.stack(parts)
        x = torch.where(flips[lo : lo + len(parts)], x.flip(-1), x)
        out[lo : lo + len(parts)] = x.clamp_(0, 255).add_(0.5)  # the uint8 cast truncates: rounds half up, as Pillow
    return out
