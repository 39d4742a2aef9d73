"""Write a built-in data set as an ImageNet-style folder of real PNG files (lossless: pixels round-trip), and
an image folder as WebDataset tar shards (the image files' bytes as they are: no re-encoding).

A shard export owns its output folder as a run owns its own: an earlier export there (its index, or shard
files named as an export names them) is refused unless `overwrite`, which deletes that export's own files (the
index, the shards it lists, their offsets tables) and nothing else; other files in the folder are left alone.
Old shards beside new ones would be read twice by a `*.tar` pattern."""

from __future__ import annotations

import io
import os
import re
import tarfile
from pathlib import Path

from PIL import Image

from torchboost.data.builtin import load_builtin
from torchboost.data.folder import IMAGE_ERRORS, find_samples, open_image, sample_folder
from torchboost.data.shardfiles import INDEX_NAME, ShardIndex, ShardSplit, index_json, read_index
from torchboost.data.shardoffsets import offsets_path, write_offsets
from torchboost.splits import IN_MEMORY_SPLITS, SPLITS
from torchboost.errors import ConfigError, DataError, TorchboostError
from torchboost.fileio import atomic_path, atomic_write, check_inside, confine_writes, read_regular, remove_file


def export_folder(name: str, out: str | Path, split: str | None = None) -> Path:
    """Write `out/{split}/{class}/{i:05d}.png` for split "train", "test" or both (None); i is the sample's
    index in the built-in split, so file k of the folder is `load_builtin(name, split)[k]`. Returns `out`."""
    out = Path(out)
    with confine_writes(out):  # a split or class folder that is a link is refused, never written through
        for part in IN_MEMORY_SPLITS if split is None else (split,):
            data = load_builtin(name, part)
            for i, (image, label) in enumerate(zip(data.images, data.labels.tolist())):
                pixels = image[0].numpy() if image.shape[0] == 1 else image.permute(1, 2, 0).numpy()
                # compress_level=1: ~5x faster to write than the default, files barely larger.
                with atomic_path(out / part / data.classes[label] / f"{i:05d}.png", sync=False) as tmp:
                    Image.fromarray(pixels).save(tmp, format="PNG", compress_level=1)
    os.sync()  # every image to the disk at once, not one fsync each
    return out


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    # Fixed metadata (no time, owner or mode of the source): the same folder always gives the same bytes.
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o444
    tar.addfile(info, io.BytesIO(data))


def _check_image(path: str) -> None:
    """Read the header only (cheap): a shard must not carry a file that is not an image, or too large a one."""
    try:
        with open_image(path):
            pass
    except IMAGE_ERRORS as e:
        raise DataError(f"corrupt image {path} ({type(e).__name__}: {e})",
                        "replace or delete it before exporting") from None


# The files an export writes besides its index: {split}-{k:06d}.tar and _offsets_{split}.npy.
EXPORT_FILE = re.compile(r"(train|val|test)-\d{6}\.tar|_offsets_(train|val|test)\.npy")


def earlier_export(out: Path) -> list[Path]:
    """The files of an earlier export in `out` (index first), refused in one line when they cannot be told
    apart from other files: an index that cannot be read, or export-named files no index lists (an export
    that was interrupted before its index)."""
    named = sorted(p for p in out.iterdir() if EXPORT_FILE.fullmatch(p.name)) if out.is_dir() else []
    index = out / INDEX_NAME
    if not index.exists():
        if named:
            raise ConfigError(f"{out} holds shard files but no {INDEX_NAME} ({', '.join(p.name for p in named[:3])}"
                              f"{', ...' if len(named) > 3 else ''}): an export that did not finish",
                              "delete them, or export into another folder")
        return []
    try:
        splits = read_index(out).splits
    except TorchboostError as e:
        raise ConfigError(f"{index} of an earlier export cannot be read ({e.what}), so its files are not known",
                          "delete the earlier export by hand, or export into another folder") from None
    own = [index, *(out / f for s in splits.values() for f in s.filenames), *(offsets_path(out, n) for n in splits)]
    stray = [p for p in named if p not in own]
    if stray:
        raise ConfigError(f"{out} holds shard files its {INDEX_NAME} does not list ({stray[0].name})",
                          "delete them, or export into another folder")
    return [p for p in own if p.exists() or p.is_symlink()]


def claim_export(out: Path, overwrite: bool) -> None:
    """Refuse `out` when it holds an earlier export, unless `overwrite`: then delete that export's files only
    (the index first, so an interrupted deletion never leaves an index naming missing shards)."""
    files = earlier_export(out)
    if files and not overwrite:
        raise ConfigError(f"{out} holds an earlier export ({INDEX_NAME} and {len(files) - 1} other file(s))",
                          "add --overwrite to replace it (only its own files are deleted), or export into "
                          "another folder")
    for path in files:  # all checked first: a refusal leaves the earlier export whole
        check_inside(path)
    for path in files:
        remove_file(path)


def export_shards(folder: str | Path, out: str | Path, shard_size: int = 1000, overwrite: bool = False
                  ) -> ShardIndex:
    """Write the image folder `folder` (train/ and val/ or test/, one sub-folder per class) as WebDataset tar
    shards `out/{split}-{k:06d}.tar` of `shard_size` samples (`{i:08d}.jpg|png|...` + `{i:08d}.cls`, i the
    image's index in the folder's order), each split's sample offsets `out/_offsets_{split}.npy` (see
    `shardoffsets`) and the index `out/_info.json`, written last, so an interrupted export leaves no index.
    Every file is written atomically. An earlier export in `out` is refused unless `overwrite` (see
    `claim_export`). Returns the index."""
    folder, out = Path(folder), Path(out)
    if shard_size < 1:
        raise DataError(f"--shard-size {shard_size} is not a positive sample count", "use e.g. --shard-size 1000")
    present = [name for name in SPLITS if (folder / name).is_dir()]
    if not present:
        raise DataError(f"no train/, val/ or test/ folder in {folder}",
                        "export an image-folder data set: FOLDER/train/<class>/*.jpg and FOLDER/val/<class>/")
    # after the source checks: a mistyped source deletes nothing; no write or delete through a link out of `out`
    with confine_writes(out):
        claim_export(out, overwrite)
        splits = _write_shards(folder, out, present, shard_size)
        atomic_write(out / INDEX_NAME, index_json(splits, sample_folder(folder / present[0])))
    return read_index(out)


def _write_shards(folder: Path, out: Path, present: list[str], shard_size: int) -> dict[str, ShardSplit]:
    """Each split's shards and offsets table; the splits' file lists."""
    splits = {}
    for name in present:
        classes, samples = find_samples(folder / name)
        files, lengths, starts = [], [], []
        for k, start in enumerate(range(0, len(samples), shard_size)):
            chunk = samples[start : start + shard_size]
            files.append(f"{name}-{k:06d}.tar")
            lengths.append(len(chunk))
            starts.append([])
            with atomic_path(out / files[-1]) as tmp, tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
                for i, (path, label) in enumerate(chunk, start):
                    _check_image(path)
                    field = Path(path).suffix.lower().lstrip(".").replace("jpeg", "jpg")  # webdataset's/timm's jpg
                    starts[-1].append(tar.offset)
                    _add(tar, f"{i:08d}.{field}", read_regular(path))
                    _add(tar, f"{i:08d}.cls", str(label).encode())
                starts[-1].append(tar.offset)  # the end of the last sample (the end-of-archive blocks follow)
        with atomic_path(offsets_path(out, name)) as tmp, open(tmp, "wb") as f:
            write_offsets(f, starts)
        splits[name] = ShardSplit(files, lengths, classes)
    return splits
