"""Sharded data (WebDataset tar shards): every sample once per epoch across ranks and loader workers, the
same order after a mid-epoch resume, export-shards writing the folder's bytes, training on shards as well as
on the folder, and hostile shards refused in one line.

Shards here are written by `write_shards` with tarfile directly (not by export-shards), so the reader is
checked against an independent writer; each image encodes its sample id in its pixels, so what a loader
yields can be traced back to the sample it came from.
"""

from __future__ import annotations

import io
import json
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from torchboost.data import ShardDataset, build_loader, export_folder, export_shards, open_shards, set_epoch
from torchboost.data.folder import find_samples
from torchboost.data.shardfiles import INDEX_NAME, read_index
from torchboost.data.transforms import EvalTransform, train_transform
from torchboost.errors import DataError

CLASSES = [f"c{k}" for k in range(7)]


def id_png(i: int) -> bytes:
    """A 2×2 gray PNG holding i in its first two pixels."""
    buf = io.BytesIO()
    Image.fromarray(np.array([[i // 256, i % 256], [0, 0]], np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def pixel_id(img: Image.Image, rng: np.random.Generator) -> torch.Tensor:
    """Transform: the sample id an `id_png` image holds (its random stream is not used)."""
    a = np.asarray(img.convert("L"), dtype=np.int64)
    return torch.tensor(a[0, 0] * 256 + a[0, 1])


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_shards(folder: Path, lengths: list[int], split: str = "train", image=id_png) -> list[int]:
    """Shards of `lengths` samples (ids counted across shards, label = id % 7) and their index; the labels."""
    folder.mkdir(parents=True, exist_ok=True)
    files, labels, i = [], [], 0
    for k, n in enumerate(lengths):
        files.append(f"{split}-{k:06d}.tar")
        with tarfile.open(folder / files[-1], "w") as tar:
            for _ in range(n):
                add(tar, f"s{i:06d}.png", image(i))
                add(tar, f"s{i:06d}.cls", str(i % 7).encode())
                labels.append(i % 7)
                i += 1
    index = folder / INDEX_NAME
    info = json.loads(index.read_text()) if index.exists() else {
        "sample": {"gray": 1, "color": 0, "largest_side": 2}, "splits": {}}
    info["splits"][split] = {"filenames": files, "shard_lengths": lengths, "classes": CLASSES}
    index.write_text(json.dumps(info))
    return labels


def dataset(folder: Path, lengths: list[int], transform=pixel_id, buffer: int = 10) -> ShardDataset:
    write_shards(folder, lengths)
    return open_shards(folder, "train", transform, buffer=buffer)


def ids(loader) -> list[int]:
    return [int(v) for x, _ in loader for v in x]


# --- each sample once per epoch across ranks and workers ------------------------------------------------
def test_each_sample_once_per_epoch_across_2_ranks_and_2_workers(tmp_path):
    ds = dataset(tmp_path, [12] * 8)  # 8 shards of 12: 4 per rank, 48 samples = 12 batches of 4
    loaders = [build_loader(ds, 4, True, workers=2, seed=5, rank=r, world_size=2) for r in (0, 1)]
    serial = [build_loader(ds, 4, True, workers=0, seed=5, rank=r, world_size=2) for r in (0, 1)]
    orders = {}
    for epoch in (0, 1):
        for r in (0, 1):
            set_epoch(loaders[r], epoch)
            orders[epoch, r] = ids(loaders[r])
            assert len(orders[epoch, r]) == 48 == 4 * len(loaders[r])
            set_epoch(serial[r], epoch)
            assert ids(serial[r]) == orders[epoch, r]  # the order does not depend on the worker count
        assert sorted(orders[epoch, 0] + orders[epoch, 1]) == list(range(96))
    assert orders[0, 0] != orders[1, 0]  # reshuffled every epoch
    # Labels travel with their images.
    x, y = next(iter(loaders[0]))
    assert (y == x % 7).all()


def test_evaluation_reads_every_sample_once_in_order(tmp_path):
    ds = dataset(tmp_path, [5, 3, 4])  # 3 shards, uneven, over 2 ranks: 9 and 3 samples
    seen = [ids(build_loader(ds, 2, False, workers=2, rank=r, world_size=2)) for r in (0, 1)]
    assert seen == [list(range(5)) + list(range(8, 12)), list(range(5, 8))]


@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=7), world=st.integers(1, 4),
       batch=st.integers(1, 5), buffer=st.integers(1, 8), seed=st.integers(0, 3), epoch=st.integers(0, 3))
def test_the_split_rule_on_any_shards(tmp_path_factory, lengths, world, batch, buffer, seed, epoch):
    folder = tmp_path_factory.mktemp("s")
    ds = dataset(folder, lengths, buffer=buffer)
    total = sum(lengths)
    if len(lengths) < world:
        with pytest.raises(DataError, match="training shard"):
            ds.distribute(0, world, shuffle=True, batch_size=batch, drop_last=True)
    else:
        parts = [ds.distribute(r, world, seed=seed, shuffle=True, batch_size=batch, drop_last=True)
                 for r in range(world)]
        streams = [[i for i, _ in p.stream(epoch)] for p in parts]
        expected = sum(sorted(lengths)[: len(lengths) // world]) // batch * batch  # the documented count
        assert [len(s) for s in streams] == [expected] * world  # every rank takes the same steps
        union = [i for s in streams for i in s]
        assert len(set(union)) == len(union)  # no sample twice
        if len(set(lengths)) == 1 and len(lengths) % world == 0 and (total // world) % batch == 0:
            assert sorted(union) == list(range(total))  # even shards: every sample, once
    evaluation = [ds.distribute(r, world, batch_size=batch) for r in range(world)]
    assert sorted(i for p in evaluation for i, _ in p.stream(epoch)) == list(range(total))


# --- resume --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_a_mid_epoch_resume_continues_the_same_order(tmp_path, workers):
    ds = dataset(tmp_path, [10] * 6, buffer=7)
    full = build_loader(ds, 3, True, workers=workers, seed=1)
    set_epoch(full, 2)
    order = ids(full)
    resumed = build_loader(ds, 3, True, workers=workers, seed=1)  # a new process: nothing carried over
    set_epoch(resumed, 2, skip=4 * 3)
    assert len(resumed) == len(full) - 4
    assert ids(resumed) == order[12:]
    assert ids(resumed) != order  # the next iteration is the next epoch, from its start
    set_epoch(full, 3)
    assert len(ids(full)) == len(order)


def _gray_shards(folder: Path) -> None:
    """48 learnable 6×6 images in 6 shards (the tiny training task of the resume tests)."""
    from train_tiny import tiny_data

    x, y = tiny_data(48, seed=1)
    pixels = (x[:, 0] * 40 + 128).clamp(0, 255).to(torch.uint8).numpy()

    def image(i):
        buf = io.BytesIO()
        Image.fromarray(pixels[i]).save(buf, format="PNG")
        return buf.getvalue()

    write_shards(folder, [8] * 6, image=image)
    index = json.loads((folder / INDEX_NAME).read_text())
    index["splits"]["train"]["classes"] = CLASSES[:5]
    (folder / INDEX_NAME).write_text(json.dumps(index))
    _relabel(folder, y.tolist())  # labels from the task, not id % 7


def _relabel(folder: Path, labels: list[int]) -> None:
    for shard in sorted(folder.glob("train-*.tar")):
        with tarfile.open(shard) as tar:
            members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
        with tarfile.open(shard, "w") as tar:
            for name, data in members:
                add(tar, name, str(labels[int(name[1:7])]).encode() if name.endswith(".cls") else data)


def test_training_resumed_mid_epoch_from_shards_equals_the_uninterrupted_run(tmp_path, one_thread):
    from train_tiny import StopAt, tiny_model

    from torchboost.train.callbacks import CheckpointConfig, ModelCheckpoint

    _gray_shards(tmp_path / "data")
    transform = EvalTransform(6, (0.5,), (0.25,), crop_pct=1.0)

    def loader():
        return build_loader(open_shards(tmp_path / "data", "train", transform, buffer=5), 8, True, workers=2, seed=3)

    def ckpt(out):
        return ModelCheckpoint("tiny", out / "ckpt", CheckpointConfig(keep_checkpoint_max=10))

    torch.manual_seed(7)
    straight = tiny_model(0)
    straight.train(3, loader(), [ckpt(tmp_path / "a")])
    torch.manual_seed(7)
    first = tiny_model(0)
    state = first.train(3, loader(), [ckpt(tmp_path / "b"), StopAt(9)])  # epoch 2, update 3 of 6
    assert (state.epoch, state.step_in_epoch) == (1, 3)
    resumed = tiny_model(123)
    resumed.load_checkpoint(tmp_path / "b" / "ckpt" / "tiny-2_3.pt")
    resumed.train(3, loader(), [ckpt(tmp_path / "b")])
    for (k, va), vb in zip(straight.network.state_dict().items(), resumed.network.state_dict().values()):
        assert torch.equal(va, vb), k


# --- export-shards ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    root = tmp_path_factory.mktemp("digits")
    export_folder("digits", root / "folder")
    export_shards(root / "folder", root / "shards", shard_size=300)
    return root


@pytest.mark.slow
def test_export_shards_holds_the_folders_files_byte_for_byte(digits, tmp_path):
    index = read_index(digits / "shards")
    for split in ("train", "test"):
        classes, samples = find_samples(digits / "folder" / split)
        part = index.splits[split]
        assert part.classes == classes and sum(part.lengths) == len(samples)
        assert part.lengths == [300] * (len(samples) // 300) + ([len(samples) % 300] if len(samples) % 300 else [])
        members = {}
        for name in part.filenames:
            with tarfile.open(digits / "shards" / name) as tar:
                members.update({m.name: tar.extractfile(m).read() for m in tar.getmembers()})
        assert len(members) == 2 * len(samples)
        for i, (path, label) in enumerate(samples):
            assert members[f"{i:08d}.png"] == Path(path).read_bytes()
            assert members[f"{i:08d}.cls"] == str(label).encode()
    export_shards(digits / "folder", tmp_path / "again", shard_size=300)
    for f in sorted((digits / "shards").iterdir()):
        assert (tmp_path / "again" / f.name).read_bytes() == f.read_bytes()  # reproducible bytes


def test_shards_give_each_image_the_folders_augmentation(digits):
    """Same crops, flips and pixels for an image from its shard as from its folder (same sample index)."""
    from torchboost.data import ImageFolder
    from torchboost.data.sampling import SampleIndex

    transform = train_transform(16, (0.5,), (0.5,), augment="imagenet")
    folder = ImageFolder(digits / "folder" / "train", transform)
    shards = open_shards(digits / "shards", "train", transform).distribute(seed=4, batch_size=1)
    shards.set_epoch(2)
    got = list(zip(range(40), shards))
    for i, (x, y) in got:
        fx, fy = folder[SampleIndex(i, 4, 2)]
        assert torch.equal(x, fx) and y == fy


def _train(tmp_path, name, sets):
    from torchboost.recipe.load import load_config
    from torchboost.recipe.run import train_from_config

    cfg = load_config("digits-lenet", ["train.epochs=4", *sets])
    return train_from_config(cfg, output=str(tmp_path / name), log=lambda m: None).eval_results


@pytest.mark.slow
def test_training_on_exported_shards_matches_the_folder(digits, tmp_path, one_thread):
    folder = _train(tmp_path, "f", ["data.dataset=folder", f"data.path={digits / 'folder'}"])
    shards = _train(tmp_path, "s", ["data.dataset=shards", f"data.path={digits / 'shards'}", "data.workers=2"])
    assert folder["val_samples"] == shards["val_samples"] == 360  # every test image once
    assert folder["val_top_1_accuracy"] > 0.9 and shards["val_top_1_accuracy"] > 0.9
    assert abs(folder["val_top_1_accuracy"] - shards["val_top_1_accuracy"]) < 0.03  # within noise


# --- patterns and commands ------------------------------------------------------------------------------
def test_brace_patterns_and_pipe_commands_read_the_same_samples(tmp_path):
    write_shards(tmp_path, [4, 4, 4])
    plain = ids(build_loader(open_shards(tmp_path, "train", pixel_id), 3, False))
    pattern = str(tmp_path / "train-{000000..000002}.tar")
    piped = f"pipe:cat {tmp_path}/train-{{000000..000002}}.tar"
    for p in (pattern, piped):
        got = ids(build_loader(open_shards(tmp_path, "train", pixel_id, pattern=p), 3, False))
        assert got == plain == list(range(12))
    with pytest.raises(DataError, match="names 2 shard"):
        open_shards(tmp_path, "train", pixel_id, pattern=str(tmp_path / "train-{000000..000001}.tar"))
    failing = open_shards(tmp_path, "train", pixel_id, pattern="pipe:cat /nonexistent/{a,b,c}.tar")
    with pytest.raises(DataError, match="exited with status"):
        ids(build_loader(failing, 3, False))


# --- hostile shards -------------------------------------------------------------------------------------
def _rewrite(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            add(tar, name, data)


def _read_all(folder: Path, piped: bool = False) -> None:
    """Read every sample: from the files (headers, then image bytes by offset) or through `pipe:cat` (a stream)."""
    names = read_index(folder).splits["train"].filenames
    braced = names[0] if len(names) == 1 else f"{{{','.join(names)}}}"
    pattern = f"pipe:cat {folder}/{braced}" if piped else None
    for _ in build_loader(open_shards(folder, "train", pixel_id, pattern=pattern), 2, False):
        pass


def _huge_header(path: Path) -> None:
    info = tarfile.TarInfo("s000000.png")
    info.size = 10 * 2**30  # claims 10 GiB; the file ends after 1 kB
    path.write_bytes(info.tobuf(format=tarfile.GNU_FORMAT) + b"\0" * 1024)


def _oversized_png() -> bytes:
    buf = io.BytesIO()
    Image.new("L", (1, 1)).save(buf, format="PNG")
    png = bytearray(buf.getvalue())
    png[16:24] = (11_000).to_bytes(4, "big") * 2  # the header claims 11,000 × 11,000 pixels
    png[29:33] = zlib.crc32(bytes(png[12:29])).to_bytes(4, "big")  # with a valid checksum
    return bytes(png)


HOSTILE = {
    "truncated tar": (lambda p: p.write_bytes(p.read_bytes()[:1300]), "ends inside sample s000000, which has no .cls"),
    "truncated member": (lambda p: p.write_bytes(p.read_bytes()[:600]), "not a readable tar .*end of data"),
    "huge member header": (_huge_header, "claims 10,737,418,240 bytes"),
    "non-integer cls": (lambda p: _rewrite(p, [("s000000.png", id_png(0)), ("s000000.cls", b"seven")]),
                        "s000000: .cls holds 'seven'"),
    "class index out of range": (lambda p: _rewrite(p, [("s000000.png", id_png(0)), ("s000000.cls", b"99")]),
                                 "class index 99"),
    "missing image": (lambda p: _rewrite(p, [("s000000.cls", b"1"), ("s000001.png", id_png(1)),
                                             ("s000001.cls", b"1")]), "sample s000000 has no image"),
    "missing cls": (lambda p: _rewrite(p, [("s000000.png", id_png(0))]), "s000000.* has no .cls"),
    "corrupt image": (lambda p: _rewrite(p, [("s000000.png", b"\x89PNG garbage"), ("s000000.cls", b"1")]),
                      "corrupt image in shard .* sample s000000.png"),
    "too many pixels": (lambda p: _rewrite(p, [("s000000.png", _oversized_png()), ("s000000.cls", b"1")]),
                        "100,000,000-pixel limit"),
    "fewer samples than the index": (lambda p: _rewrite(p, [("s000000.png", id_png(0)), ("s000000.cls", b"0")]),
                                     "holds 1 sample.* index says 3"),
    "not a tar": (lambda p: p.write_bytes(b"hello"), "not a readable tar"),
}


@pytest.mark.parametrize("piped", [False, True], ids=["file", "pipe"])
@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_shards_are_one_line_errors_naming_the_shard(tmp_path, case, piped):
    write_shards(tmp_path, [3, 3])
    damage, message = HOSTILE[case]
    damage(tmp_path / "train-000000.tar")
    with pytest.raises(DataError, match=message) as e:
        _read_all(tmp_path, piped)
    text = f"{e.value.what} — {e.value.fix}"
    assert "\n" not in text and "train-000000.tar" in text


@pytest.mark.parametrize("name", ["../x.tar", "/etc/passwd", "pipe:touch owned", "a\\b.tar", ""])
def test_an_index_cannot_name_paths_or_commands(tmp_path, name):
    write_shards(tmp_path, [3])
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    index["splits"]["train"]["filenames"] = [name]
    (tmp_path / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(DataError, match="not a plain file name"):
        read_index(tmp_path)
    assert not (tmp_path / "owned").exists()


@given(cut=st.integers(0, 4000), flips=st.lists(st.tuples(st.integers(0, 4000), st.integers(1, 255)), max_size=4))
def test_damaged_shards_read_or_fail_in_one_line(tmp_path_factory, cut, flips):
    folder = tmp_path_factory.mktemp("d")
    write_shards(folder, [4])
    for piped in (False, True):
        _damage_and_read(folder, flips, cut, piped)


def _damage_and_read(folder: Path, flips: list[tuple[int, int]], cut: int, piped: bool = False) -> None:
    """Flip bytes of the first shard and cut its end; reading it either works or is one line naming it."""
    shard = folder / "train-000000.tar"
    data = bytearray(shard.read_bytes())
    for at, xor in flips:
        if at < len(data):
            data[at] ^= xor
    shard.write_bytes(bytes(data[: len(data) - cut]))
    try:
        _read_all(folder, piped)
    except DataError as e:
        assert "\n" not in f"{e.what} — {e.fix}" and "train-000000.tar" in e.what


def test_cli_refuses_a_hostile_shard_in_one_line_and_exports(tmp_path, capsys, digits):
    from torchboost.cli import main

    write_shards(tmp_path / "bad", [3, 3])
    write_shards(tmp_path / "bad", [3], split="val")
    HOSTILE["non-integer cls"][0](tmp_path / "bad" / "train-000000.tar")
    argv = ["train", "-c", "digits-lenet", "--set", "data.dataset=shards", "--data", str(tmp_path / "bad"),
            "--set", "data.image_size=8", "-b", "2", "-o", str(tmp_path / "run"), "--epochs", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: shard ") and ".cls holds 'seven'" in err
    assert main(["export-shards", str(digits / "folder"), str(tmp_path / "out"), "--shard-size", "500"]) == 0
    assert "train: 1437 images, 10 classes in 3 shard(s)" in capsys.readouterr().out
    assert main(["export-shards", str(tmp_path / "nothing"), str(tmp_path / "o2")]) == 2
    assert "no train/, val/ or test/ folder" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists()


# --- real processes -------------------------------------------------------------------------------------
def _rank(folder: str) -> dict:
    from torch import nn

    from torchboost.distributed import init_distributed
    from torchboost.train.model import Model

    info = init_distributed(timeout_s=60)
    kw = dict(rank=info.rank, world_size=info.world_size)
    train = build_loader(open_shards(folder, "train", pixel_id, buffer=4), 2, True, workers=1, seed=3, **kw)
    seen, steps = [], 0
    for x, _ in train:  # a collective per step: unequal step counts would hang here (launch's timeout ends it)
        seen += x.tolist()
        torch.distributed.all_reduce(torch.ones(()))
        steps += 1
    transform = EvalTransform(2, (0.5,), (0.5,), crop_pct=1.0)
    evaluation = build_loader(open_shards(folder, "train", transform), 4, False, **kw)
    torch.manual_seed(0)
    metrics = Model(nn.Sequential(nn.Flatten(), nn.Linear(4, 7)), nn.CrossEntropyLoss(), device="cpu").eval(evaluation)
    every = ids(build_loader(open_shards(folder, "train", pixel_id), 4, False, **kw))
    return {"train": seen, "steps": steps, "eval": every, "metrics": metrics}


@pytest.mark.dist
@pytest.mark.slow
def test_two_gloo_processes_take_equal_steps_on_uneven_shards_and_evaluate_every_image_once(tmp_path):
    from torchboost.distributed import launch
    from torchboost.recipe.load import load_config
    from torchboost.recipe.resolve import fit_batch

    lengths = [5, 7, 6, 9, 4]  # uneven: 2 shards per process, the 2 smallest (4 + 5) = 9 samples each
    write_shards(tmp_path, lengths)
    ranks = launch(_rank, 2, str(tmp_path), timeout_s=120)
    assert [r["steps"] for r in ranks] == [4, 4]  # 9 // 2 whole batches on both
    assert len(set(ranks[0]["train"] + ranks[1]["train"])) == 16  # disjoint
    assert sorted(ranks[0]["eval"] + ranks[1]["eval"]) == list(range(sum(lengths)))
    assert all(r["metrics"]["samples"] == sum(lengths) for r in ranks)  # summed across processes
    # The batch rule sees the same share: a batch of 12 becomes one batch of 9 per process.
    ds = open_shards(tmp_path, "train")
    cfg, note = fit_batch(load_config("digits-lenet", ["data.batch_size=12"]), len(ds), 2, ds.share(2))
    assert cfg.data.batch_size == 9 and "9 training images" in note


# --- the offsets table -----------------------------------------------------------------------------------
def _batches(folder: Path, workers: int) -> list:
    transform = train_transform(12, (0.5,), (0.5,), augment="imagenet")
    loader = build_loader(open_shards(folder, "train", transform, buffer=50), 16, True, workers=workers, seed=2)
    set_epoch(loader, 1, skip=3 * 16)
    return list(loader)


@pytest.mark.slow
def test_reading_by_offsets_gives_what_reading_headers_gives(digits, tmp_path):
    import shutil

    from torchboost.data.shardoffsets import offsets_path

    shutil.copytree(digits / "shards", tmp_path / "plain")
    offsets_path(tmp_path / "plain", "train").unlink()  # headers only
    assert open_shards(digits / "shards", "train").starts is not None
    assert open_shards(tmp_path / "plain", "train").starts is None
    by_offsets, by_headers = _batches(digits / "shards", 2), _batches(tmp_path / "plain", 0)
    assert len(by_offsets) == len(by_headers) == 1437 // 16 - 3
    for (xa, ya), (xb, yb) in zip(by_offsets, by_headers):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def _edit_offsets(folder: Path, edit) -> None:
    from torchboost.data.shardoffsets import offsets_path

    path = offsets_path(folder, "train")
    table = np.load(path)
    path.write_bytes(b"")
    with open(path, "wb") as f:
        np.save(f, edit(table))


def _shifted(t):
    t = t.copy()
    t[5] += 512
    return t


def _past_the_end(t):
    t = t.copy()
    t[300] = t[299] + 8 * 512  # shard 0's end (its 300 samples, then the end)
    return t


@pytest.mark.parametrize("edit, message", [
    (_shifted, "(no tar header|are not one sample's members)"),
    (_past_the_end, "(ends before byte|no tar header|not one sample)"),
    (lambda t: t[:-1], "not int64"),
    (lambda t: t.astype(np.int32), "not int64"),
    (lambda t: t[::-1].copy(), "not increasing tar blocks"),
])
def test_a_tampered_offsets_table_is_one_line(digits, tmp_path, edit, message):
    import shutil

    shutil.copytree(digits / "shards", tmp_path / "s")
    with pytest.raises(DataError, match=message) as e:
        _edit_offsets(tmp_path / "s", edit)
        for _ in build_loader(open_shards(tmp_path / "s", "train", pixel_id), 64, False):
            pass
    assert "\n" not in f"{e.value.what} — {e.value.fix}"


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    for i in range(6):
        (root / "folder" / "train" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (root / "folder" / "train" / f"c{i % 2}" / f"{i}.png").write_bytes(id_png(i))
    export_shards(root / "folder", root / "shards", shard_size=3)
    return root / "shards"


@given(flips=st.lists(st.tuples(st.integers(0, 5000), st.integers(1, 255)), min_size=1, max_size=4),
       cut=st.integers(0, 3000))
def test_damaged_shards_read_by_offset_read_or_fail_in_one_line(tiny_export, tmp_path_factory, flips, cut):
    import shutil

    folder = tmp_path_factory.mktemp("o") / "s"
    shutil.copytree(tiny_export, folder)
    assert open_shards(folder, "train").starts is not None
    _damage_and_read(folder, flips, cut)


@pytest.mark.slow
def test_a_run_on_shards_resumed_mid_epoch_ends_with_the_uninterrupted_weights(digits, tmp_path, one_thread):
    """The CLI's path: `train` on shards with 2 loader workers, resumed from a mid-epoch checkpoint."""
    import shutil

    from torchboost.recipe.load import load_config
    from torchboost.recipe.run import train_from_config
    from torchboost.train.checkpoint import load_checkpoint

    sets = ["data.dataset=shards", f"data.path={digits / 'shards'}", "data.workers=2", "train.epochs=2",
            "checkpoint.save_every_steps=7", "checkpoint.keep_max=50", "train.progress_bar=false"]
    straight = train_from_config(load_config("digits-lenet", sets), output=str(tmp_path / "a"), log=lambda m: None)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    step = {int(p.stem.rsplit("_", 1)[1]): p for p in (tmp_path / "b" / "ckpt").glob("mnist_cnn-2_*.pt")}
    middle = sorted(k for k in step if 10 < k < 44)[0]  # epoch 2 has 44 updates
    for k, path in step.items():
        if k > middle:
            path.unlink()
    mid = step[middle]
    # Resumed with no loader workers: the order does not depend on them.
    resumed = train_from_config(load_config("digits-lenet", [*sets, "data.workers=0"]), resume=str(mid),
                                output=str(tmp_path / "b"), log=lambda m: None)
    a, b = load_checkpoint(straight.last_checkpoint), load_checkpoint(resumed.last_checkpoint)
    assert straight.last_checkpoint.name == resumed.last_checkpoint.name == "mnist_cnn-2_44.pt"
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert straight.eval_results["val_top_1_accuracy"] == resumed.eval_results["val_top_1_accuracy"]


@given(name=st.text(min_size=1, max_size=180), size=st.integers(0, 2**36),
       kind=st.sampled_from([tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.CONTTYPE]),
       fmt=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
       flips=st.lists(st.tuples(st.integers(0, 511), st.integers(1, 255)), max_size=3))
def test_the_offsets_readers_header_parser_agrees_with_tarfile(name, size, kind, fmt, flips):
    """parse_header (the offsets path's lean header reader) on headers tarfile writes, damaged or not: what
    it accepts, tarfile.TarInfo.frombuf reads the same (regular file or not; a regular file's name and size);
    what tarfile writes for an ordinary member it accepts."""
    from torchboost.data.shardoffsets import parse_header

    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    try:
        block = bytearray(info.tobuf(fmt, tarfile.ENCODING, "surrogateescape")[:512])
    except ValueError:  # a name or size this format cannot hold
        return
    for at, bits in flips:
        block[at] ^= bits
    block = bytes(block)
    try:
        got = parse_header(block)
    except tarfile.HeaderError:
        ordinary = not flips and kind == tarfile.REGTYPE and size < 8**11 and block[156:157] == tarfile.REGTYPE
        assert not ordinary, "an ordinary header tarfile wrote was refused"
        return
    ref = tarfile.TarInfo.frombuf(block, tarfile.ENCODING, "surrogateescape")
    regular = ref.type in (tarfile.REGTYPE, tarfile.AREGTYPE)
    assert got[2] == regular and (not regular or got[:2] == (ref.name, ref.size))  # anything else is refused
