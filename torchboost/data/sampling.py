"""Per-rank sample order, and the per-sample random stream that makes augmentation reproducible.

Augmentation randomness must be a pure function of (seed, epoch, sample index), so that results do not
depend on the number of workers and resume is exact. Worker processes (persistent ones included) cannot see
an epoch counter set in the main process afterwards, so the sampler hands it over *with each index*:
it yields `SampleIndex` objects, ints that also carry `seed` and `epoch`. Datasets index with them as
plain ints and call `sample_rng(index)` for their random draws.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler


class SampleIndex(int):
    """A dataset index that also carries the (seed, epoch) its augmentation is drawn from."""

    seed: int
    epoch: int

    def __new__(cls, index: int, seed: int = 0, epoch: int = 0) -> SampleIndex:
        obj = super().__new__(cls, index)
        obj.seed, obj.epoch = seed, epoch
        return obj

    def __reduce__(self):  # indices travel to worker processes pickled
        return SampleIndex, (int(self), self.seed, self.epoch)


def set_epoch(loader: Any, epoch: int, skip: int = 0) -> None:
    """Select a loader's next epoch (and the samples of it this rank already consumed): the loader's own
    `set_epoch` (a ShardLoader) or its sampler's (a ShardSampler); no-op for loaders that have neither."""
    target = loader if hasattr(loader, "set_epoch") else getattr(loader, "sampler", None)
    if hasattr(target, "set_epoch"):
        target.set_epoch(epoch, skip)


class SampleGenerator(np.random.Generator):
    """A sample's Generator that also knows the sample (`index`), for the draws `keyed_uniform` makes."""

    index: int


def sample_rng(index: int) -> SampleGenerator:
    """The random stream of one sample: seeded by (seed, epoch, index) for a SampleIndex. A plain int (from
    another sampler) gets a stream drawn from torch's global RNG, as torchvision transforms do: fresh every
    epoch, reproducible only for a fixed worker count."""
    if isinstance(index, SampleIndex):
        rng = SampleGenerator(np.random.PCG64((index.seed, index.epoch, int(index))))
    else:
        seed = int(torch.randint(2**62, ()))
        rng, index = SampleGenerator(np.random.PCG64(seed)), SampleIndex(int(index), seed)
    rng.index = index
    return rng


def index_of(rng: np.random.Generator) -> SampleIndex:
    """The sample a `sample_rng` stream belongs to; for another Generator (a caller's own), a key drawn from it."""
    index = getattr(rng, "index", None)
    return index if isinstance(index, SampleIndex) else SampleIndex(0, int(rng.integers(2**62)))


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic): a bijection that scatters every input bit."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def keyed_uniform(indices: Sequence[int], stream: int, count: int = 1, per_epoch: bool = True) -> np.ndarray:
    """len(indices)×count floats in [0, 1), each a pure function of (seed, epoch, index, stream, column): the
    per-sample draws of `sample_rng` computed for a whole batch at once (a Generator per sample costs ~30 µs of
    Python, 2 s an epoch of 60,000 images; this is ~1 µs a sample). `per_epoch=False` leaves the epoch out: a
    draw a sample keeps for the whole run (alternating flips' first coin). Plain ints (another sampler) draw
    their key from torch's global RNG, as `sample_rng` does."""
    if len(indices) and isinstance(indices[0], SampleIndex):
        seeds = np.fromiter((i.seed for i in indices), np.uint64, len(indices))
        epochs = np.fromiter((i.epoch if per_epoch else 0 for i in indices), np.uint64, len(indices))
    else:
        seeds = np.full(len(indices), int(torch.randint(2**62, ())), np.uint64)
        epochs = np.zeros(len(indices), np.uint64)
    with np.errstate(over="ignore"):
        key = _mix(_mix(_mix(seeds ^ np.uint64(stream)) + epochs) + np.asarray(indices, np.uint64))
        cols = _mix(key[:, None] + _GOLDEN * np.arange(1, count + 1, dtype=np.uint64))
    return (cols >> np.uint64(11)).astype(np.float64) * 2.0**-53


SHIFT_STREAM, FLIP_STREAM = 0x7368, 0x666C  # "sh", "fl": keyed_uniform's streams for translations and flips


def sample_shifts(indices: Sequence[int], shift: int) -> np.ndarray:
    """Each sample's (dy, dx), uniform on [-shift, shift]²: the one draw of the shift augmentation, for an
    in-memory batch and a decoded image alike (a folder of exported digits is translated as the set in memory)."""
    return np.floor(keyed_uniform(indices, SHIFT_STREAM, 2) * (2 * shift + 1)).astype(np.int64) - shift


FLIPS = ("none", "random", "alternate")


def sample_flips(indices: Sequence[int], mode: str) -> np.ndarray:
    """Which samples are mirrored left-right: random = a coin per sample and epoch; alternate = airbench's
    alternating flip, a coin per sample for the first epoch and the opposite every other epoch (each image seen
    both ways in every two epochs); none = no sample."""
    if mode == "none":
        return np.zeros(len(indices), bool)
    if mode == "random":
        return keyed_uniform(indices, FLIP_STREAM)[:, 0] < 0.5
    coin = keyed_uniform(indices, FLIP_STREAM, per_epoch=False)[:, 0] < 0.5
    odd = np.fromiter((getattr(i, "epoch", 0) % 2 for i in indices), bool, len(indices))
    return coin ^ odd


BATCH_STREAM = 0x6D6978  # the spawn key that keeps batch streams apart from per-sample ones ("mix")


def batch_rng(indices: Sequence[int]) -> np.random.Generator:
    """The random stream of one batch (mixup/cutmix): seeded by (seed, epoch, the batch's sample indices)
    when they are SampleIndex objects, so it does not depend on the worker that builds the batch and a
    resumed run's batch draws what the uninterrupted run's drew; under a spawn key, so it is never a
    sample's stream. Plain ints (another sampler) get a stream from torch's global RNG, as `sample_rng`."""
    first = indices[0] if len(indices) else None
    if isinstance(first, SampleIndex):
        entropy = [first.seed, first.epoch, *(int(i) for i in indices)]
        return np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(BATCH_STREAM,)))
    return np.random.default_rng(int(torch.randint(2**62, ())))


def shuffle_seed(seed: int, epoch: int) -> int:
    """The permutation seed of (seed, epoch): a SeedSequence of both, so seed s's epoch e never shuffles like
    seed s+1's epoch e-1 (a sum of the two would give runs with neighbouring seeds the same batch orders)."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1, np.uint64)[0] >> 1)


class ShardSampler(Sampler[SampleIndex]):
    """This rank's share of `range(n)` for one epoch.

    Shuffling uses a torch.Generator seeded from (seed, epoch) (`shuffle_seed`), so every rank draws the same
    permutation and takes positions rank::world_size of it. drop_last=True (training) first cuts the permutation to a
    multiple of world_size so all ranks yield the same count; drop_last=False (evaluation) covers every
    sample exactly once across ranks, without padding (shard lengths may differ by one).

    Epochs: `set_epoch(epoch, skip)` selects the next iteration's epoch (the trainer calls it, for exact
    resume). An iteration not preceded by a `set_epoch` call since the previous one starts the next epoch
    (skip 0) by itself, so a hand-written `for x, y in loader` loop reshuffles every epoch. Iterating the
    sampler to look at its order counts as an iteration too.
    """

    def __init__(self, n: int, rank: int = 0, world_size: int = 1, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.n, self.rank, self.world_size = n, rank, world_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch, self.skip = 0, 0
        self._advance = False  # True once an iteration has used (epoch, skip) and no set_epoch came since

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """Select the epoch; `skip` drops this rank's first samples (already consumed before a resume)."""
        self.epoch, self.skip, self._advance = epoch, skip, False

    @property
    def num_samples(self) -> int:
        """Length of this rank's full shard (before `skip`)."""
        if self.drop_last:
            return self.n // self.world_size
        return len(range(self.rank, self.n, self.world_size))

    def _shard(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(shuffle_seed(self.seed, self.epoch))
            order = torch.randperm(self.n, generator=g)
        else:
            order = torch.arange(self.n)
        if self.drop_last:
            order = order[: self.num_samples * self.world_size]
        return order[self.rank :: self.world_size][self.skip :].tolist()

    def __iter__(self) -> Iterator[SampleIndex]:
        if self._advance:
            self.epoch, self.skip = self.epoch + 1, 0
        self._advance = True
        seed, epoch = self.seed, self.epoch
        return (SampleIndex(i, seed, epoch) for i in self._shard())

    def __len__(self) -> int:
        """Samples this rank yields in the current epoch (the shard minus `skip`)."""
        return max(0, self.num_samples - self.skip)
