"""Sharded data: each rank's stream of samples from WebDataset tar shards, split across loader workers.

The order of an epoch is a pure function of (seed, epoch, rank, world size, shard list), not of the worker
count, as with the folder path's sampler:

1. Training: the shards are permuted by (seed, epoch) and rank r reads positions r, r+R, r+2R, ... of that
   permutation; its samples then pass through a shuffle buffer of `buffer` samples seeded by
   (seed, epoch, rank). Evaluation: shards in index order, rank r reads shards r, r+R, ..., no shuffle.
2. The stream is cut into batches of the loader's batch size; loader worker w of W decodes batches
   w, w+W, ... (the order the DataLoader collects them in). With the offsets table export-shards writes
   (`shardoffsets`), the order is computed from the shard lengths alone and each worker reads only its own
   samples, by offset; without it (a `pipe:` command, shards from elsewhere) every worker walks the tar
   headers of its rank's shards and reads only its own samples' image bytes (a pipe's stream whole).
3. A resume at sample `skip` of the rank's stream replays the shards and the buffer without decoding
   the part already trained on, so it continues in the same order as an uninterrupted epoch.

Augmentation draws from `sample_rng(SampleIndex(i, seed, epoch))` with i the sample's position in the
split (shard offset + position in its shard): export-shards writes a folder's images in the folder's order,
so an image gets the same crops from its shards as from its folder.

Counts. A training epoch gives every rank the same number of samples, so DDP ranks run the same number of
steps and never wait on each other: the sum of the n // R smallest shard lengths (each rank reads at least
n // R shards), cut to whole batches. With equal shard lengths and n a multiple of R that is every image
(but the last partial batch, as the folder path drops it); otherwise a rank's samples past that count are
left out of that epoch (which ones changes with the epoch's shuffle). Fewer shards than ranks is refused
for training. Evaluation reads every image once: ranks read whole shards, counts may differ (metrics are
summed across ranks once, at the end).
"""

from __future__ import annotations

import copy
import io
import itertools
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from torchboost.data.device_decode import DeviceDecode, collate
from torchboost.data.folder import IMAGE_ERRORS, check_transform, open_image
from torchboost.data.sampling import SampleIndex, sample_rng
from torchboost.data.shardfiles import (PIPE, RE_EXPORT, OpenFile, Sample, expand_shards, index_split, open_shard,
                                        read_index, read_samples)
from torchboost.data.shardoffsets import offsets_path, read_offsets, read_sample_at
from torchboost.errors import DataError
from torchboost.fileio import regular_fd

T = TypeVar("T")
MAX_OPEN = 16  # open shard files per process when reading by offset (the shuffle buffer spans a few shards)


def shuffle_buffer(items: Iterable[T], size: int, rng: np.random.Generator) -> Iterator[T]:
    """Items in a shuffled order, holding at most `size` in memory: once the buffer is full, each new item
    replaces a uniformly drawn one, which is yielded; the rest leave in a random order at the end."""
    buf: list[T] = []
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        j = int(rng.integers(size))
        yield buf[j]
        buf[j] = item
    yield from (buf[j] for j in rng.permutation(len(buf)))


class ShardDataset(IterableDataset):
    """Samples of tar shards as (transform(image, rng), class index) — one rank's share once `distribute`d
    (see the module docstring for the order, the split and the counts).

    `shards` are file paths or `pipe:` commands, `lengths` their sample counts (from the index), `classes`
    the class names the `.cls` indices point into. transform=None yields the decoded PIL image.
    """

    def __init__(self, shards: Sequence[str], lengths: Sequence[int], classes: Sequence[str],
                 transform: Callable[..., Any] | None = None, buffer: int = 1000,
                 starts: list[np.ndarray] | None = None) -> None:
        if len(shards) != len(lengths) or not shards:
            raise DataError(f"{len(shards)} shard(s) for {len(lengths)} sample count(s)",
                            "give one sample count per shard (from the shard index)")
        check_transform(transform)
        # Pillow imports its common format plugins on the first open of an in-memory file (a path imports only
        # its extension's): once here, before loader workers fork, not in every worker (~0.2 s each).
        Image.preinit()
        self.shards, self.lengths, self.classes = list(shards), [int(n) for n in lengths], list(classes)
        self.transform, self.buffer = transform, max(1, int(buffer))
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).tolist()
        self.starts = starts  # per shard, where its samples start in the file (shardoffsets); None: read headers
        self._files: OrderedDict[int, OpenFile] = OrderedDict()  # a few open shards of this process
        self.rank, self.world_size, self.seed, self.shuffle, self.batch_size, self.drop_last = 0, 1, 0, False, 1, False
        # (epoch, skip), in shared memory: persistent worker processes read what the main process sets.
        self._position = torch.zeros(2, dtype=torch.int64).share_memory_()

    def distribute(self, rank: int = 0, world_size: int = 1, *, seed: int = 0, shuffle: bool = False,
                   batch_size: int = 1, drop_last: bool = False) -> ShardDataset:
        """This data set as rank `rank`'s share, batched by `batch_size` (a copy; `self` is unchanged).
        Training (drop_last) refuses fewer shards than ranks: a rank would have nothing to train on."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        if drop_last:
            self.share(world_size)  # refuses too few shards
        part = copy.copy(self)
        part.rank, part.world_size, part.seed, part.shuffle = rank, world_size, seed, shuffle
        part.batch_size, part.drop_last = batch_size, drop_last
        part._position = torch.zeros(2, dtype=torch.int64).share_memory_()
        part._files = OrderedDict()
        return part

    @property
    def epoch(self) -> int:
        return int(self._position[0])

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """Select the epoch the next iteration reads; `skip` drops this rank's first samples (already
        trained on before a resume)."""
        self._position[0], self._position[1] = epoch, skip

    def rank_shards(self, epoch: int) -> list[int]:
        """Indices of the shards this rank reads in `epoch`, in reading order."""
        n = len(self.shards)
        order = np.random.default_rng((self.seed, epoch)).permutation(n) if self.shuffle else np.arange(n)
        return order[self.rank :: self.world_size].tolist()

    def share(self, world_size: int) -> int:
        """Training samples every one of `world_size` processes reads per epoch (before whole batches): the
        sum of the n // world_size smallest shard lengths. Fewer shards than processes is refused."""
        if len(self.shards) < world_size:
            raise DataError(f"{len(self.shards)} training shard(s) for {world_size} processes: each process reads "
                            "whole shards", f"write at least {world_size} shards (export-shards --shard-size "
                            f"{max(1, sum(self.lengths) // world_size)})")
        return sum(sorted(self.lengths)[: len(self.shards) // world_size])

    @property
    def num_samples(self) -> int:
        """Samples this rank yields in a whole epoch (see the module docstring)."""
        if self.drop_last:
            return self.share(self.world_size) // self.batch_size * self.batch_size
        return sum(self.lengths[i] for i in self.rank_shards(0))

    def __len__(self) -> int:
        """Samples this rank yields in the current epoch (the whole epoch minus `skip`)."""
        return max(0, self.num_samples - int(self._position[1]))

    def _shard_samples(self, i: int) -> Iterator[tuple[int, Sample]]:
        shard, n = self.shards[i], self.lengths[i]
        count = 0
        with open_shard(shard) as stream:
            for count, sample in enumerate(read_samples(shard, stream, len(self.classes)), 1):
                if count > n:
                    break
                yield self.offsets[i] + count - 1, sample
        if count != n:
            held = f"more than {n}" if count > n else str(count)
            raise DataError(f"shard {shard} holds {held} sample(s) where the index says {n}", RE_EXPORT)

    def _read_at(self, i: int, k: int) -> Sample:
        file = self._files.pop(i, None)
        if file is None:
            try:
                file = OpenFile(regular_fd(self.shards[i]))
            except OSError as e:
                raise DataError(f"shard {self.shards[i]} cannot be read ({e.strerror})",
                                "check data.path and the shard names") from None
        self._files[i] = file
        if len(self._files) > MAX_OPEN:
            self._files.popitem(last=False)
        return read_sample_at(self.shards[i], file.fd, int(self.starts[i][k]), int(self.starts[i][k + 1]),
                              len(self.classes))

    def stream(self, epoch: int) -> Iterator[tuple[int, Sample | tuple[int, int]]]:
        """(sample position in the split, sample) of this rank's whole epoch, in order, before batching. With
        an offsets table the sample is (shard, position in it), read when decoded: the order is the same."""
        if self.starts is not None:
            samples = ((self.offsets[i] + k, (i, k)) for i in self.rank_shards(epoch) for k in range(self.lengths[i]))
        else:
            samples = itertools.chain.from_iterable(self._shard_samples(i) for i in self.rank_shards(epoch))
        if self.shuffle:
            samples = shuffle_buffer(samples, self.buffer, np.random.default_rng((self.seed, epoch, self.rank)))
        return itertools.islice(samples, self.num_samples)

    def __iter__(self) -> Iterator[Any]:
        epoch, skip = (int(v) for v in self._position)
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for pos, (index, sample) in enumerate(self.stream(epoch)):
            if pos >= skip and (pos - skip) // self.batch_size % workers == worker:
                yield self._decode(index, sample if isinstance(sample, Sample) else self._read_at(*sample), epoch)

    def _decode(self, index: int, sample: Sample, epoch: int) -> tuple[Any, int]:
        try:
            data = sample.image_bytes()
            with open_image(io.BytesIO(data)) as img:
                if self.transform is None:
                    img.load()
                    return img, sample.label
                rng = sample_rng(SampleIndex(index, self.seed, epoch))
                if isinstance(self.transform, DeviceDecode):  # the bytes and the crop, for the device to decode
                    name = f"in shard {sample.shard} sample {sample.key}.{sample.field}"
                    return self.transform.encode(img, rng, data, name), sample.label
                return self.transform(img, rng), sample.label
        except IMAGE_ERRORS as e:
            why = re.sub(r" ?<_io\.BytesIO object at \w+>", "", str(e))  # Pillow names the in-memory file
            raise DataError(f"corrupt image in shard {sample.shard} sample {sample.key}.{sample.field} "
                            f"({type(e).__name__}: {why})", RE_EXPORT) from None


class ShardLoader(DataLoader):
    """A DataLoader over a distributed ShardDataset that owns the epoch (a DataLoader over an iterable data
    set has no sampler to hold it): `set_epoch(epoch, skip)` selects the next iteration's epoch, and an
    iteration not preceded by one starts the next epoch by itself, as `ShardSampler` does."""

    def __init__(self, dataset: ShardDataset, **kw: Any) -> None:
        super().__init__(dataset, **kw)
        self._advance = False

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.dataset.set_epoch(epoch, skip)
        self._advance = False

    def __iter__(self):
        if self._advance:
            self.dataset.set_epoch(self.dataset.epoch + 1)
        self._advance = True
        return super().__iter__()


def shard_loader(dataset: ShardDataset, batch_size: int, train: bool, *, workers: int = 0,
                 pin_memory: bool = False, seed: int = 0, rank: int = 0, world_size: int = 1,
                 persistent_workers: bool = True, prefetch_factor: int = 2) -> ShardLoader:
    """`build_loader` for shards: training shuffles per epoch and yields whole batches, the same count on
    every rank; evaluation reads every sample once across ranks."""
    part = dataset.distribute(rank, world_size, seed=seed, shuffle=train, batch_size=batch_size, drop_last=train)
    return ShardLoader(part, batch_size=batch_size, drop_last=train, num_workers=workers, collate_fn=collate,
                       pin_memory=pin_memory, persistent_workers=persistent_workers and workers > 0,
                       prefetch_factor=prefetch_factor if workers > 0 else None)


def open_shards(folder: str | Path, split: str, transform: Callable[..., Any] | None = None,
                pattern: str | None = None, buffer: int = 1000) -> ShardDataset:
    """The `split` of the shards indexed in `folder`: "train", or "val"/"test" (that one, else the other).
    `pattern` (a brace pattern or `pipe:` command) replaces the index's file names, matched by position;
    the sample counts and classes always come from the index."""
    index = read_index(folder)
    name, part = index_split(index, split)
    starts = None
    if pattern:
        shards = expand_shards(pattern)
        if len(shards) != len(part.filenames):
            raise DataError(f"the shard pattern {pattern[:80]!r} names {len(shards)} shard(s) but the index's "
                            f"{name} split has {len(part.filenames)}",
                            "give one shard per entry of the index, in its order")
    else:
        shards = [str(index.folder / f) for f in part.filenames]
    if not any(s.startswith(PIPE) for s in shards):  # a command's output is a stream: no offsets into it
        starts = read_offsets(offsets_path(folder, name), part.lengths)
    return ShardDataset(shards, part.lengths, part.classes, transform, buffer, starts)
