"""Decoding on the device (data.decode=device, `data/device_decode.py`) against the CPU path it replaces: the same
crop boxes and flips from the same per-sample streams (checked against `rrc_params`, torchvision's draw, and by
cropping the full decode by hand), the same statistics and nearly the same pixels (tolerances measured below),
the evaluation crop, shards, a real `torchboost train` run with its resume, and hostile files.

Without CUDA `DeviceBatch.to_images` decodes with Pillow at full size, then crops and resizes with torch as on
the GPU; the nvJPEG test runs only where CUDA and torchvision are present.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from PIL import Image

from torchboost.data import (IMAGENET_MEAN, IMAGENET_STD, DeviceBatch, DeviceDecode, ImageFolder, build_loader,
                             export_shards, open_shards, set_epoch)
from torchboost.data.device_decode import EncodedImage, collate
from torchboost.data.sampling import SampleIndex, sample_rng
from torchboost.data.transforms import EvalTransform, TrainTransform, draft_scale, eval_transform, rrc_params, \
    train_transform
from torchboost.cli import main
from torchboost.errors import ConfigError, DataError

REPO = Path(__file__).resolve().parents[1]
SIZE = 64  # output side: small enough for a fast test, large enough that 4x-8x draft decoding happens
# (width, height): ImageNet's typical photo, larger ones (draft decoding applies), odd aspect ratios, a tiny one
SIZES = [(500, 375), (1024, 768), (333, 800), (1600, 400), (2048, 1536), (97, 61), (640, 480), (375, 500)]
# Measured on these images (0..255 grey levels; 12 seeds x 16 images, at 64 and 224 px), CPU path (Pillow's
# draft decode + antialiased resize) vs device path (full decode + torch's antialiased resize): a crop the CPU
# path decodes at full scale differs by rounding only (per image mean |diff| <= 0.23, no pixel by more than 1:
# float32 vs the fixed-point filter); one it decodes 2x-8x reduced (libjpeg's scaled IDCT, then a shorter
# filter) by 0.7 on average, 3.1 for the worst image (an 8x reduction of the 2048x1536 photo at 64 px), 14 for
# the worst pixel (edges, noise). Bounds with headroom: EXACT_MEAN, DRAFT_MEAN per image, BATCH_MEAN over all
# images of an epoch; batch per-channel means within CHANNEL_MEAN and stds within CHANNEL_STD. A wrong box, flip
# or channel order moves these by tens of grey levels.
EXACT_MEAN, DRAFT_MEAN, BATCH_MEAN, CHANNEL_MEAN, CHANNEL_STD = 0.5, 4.0, 1.5, 0.5, 1.0


def picture(w: int, h: int, seed: int, mode: str = "RGB") -> Image.Image:
    """Photo-like pixels: smooth colour gradients, stripes at a random scale (edges) and sensor-like noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    corners = rng.uniform(30, 225, (2, 2, 3)).astype(np.float32)
    u, v = (x / max(w - 1, 1))[..., None], (y / max(h - 1, 1))[..., None]
    arr = (corners[0, 0] * (1 - u) * (1 - v) + corners[0, 1] * u * (1 - v) + corners[1, 0] * (1 - u) * v
           + corners[1, 1] * u * v)
    arr += 25 * np.sign(np.sin((x + 0.7 * y) / rng.uniform(4, 30)))[..., None]
    arr += rng.normal(0, 6, (h, w, 1)).astype(np.float32)
    img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    return img if mode == "RGB" else img.convert(mode)


def jpeg_bytes(img: Image.Image, **kw) -> bytes:
    out = io.BytesIO()
    img.save(out, "JPEG", quality=90, **kw)
    return out.getvalue()


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """train/ and val/ of two classes: every size above as a baseline JPEG, plus (train/c1) a grayscale JPEG, a
    PNG, a CMYK JPEG and a progressive JPEG, which the workers decode on the CPU."""
    root = tmp_path_factory.mktemp("photos")
    for split in ("train", "val"):
        for i, (w, h) in enumerate(SIZES * 2):
            path = root / split / f"c{i % 2}" / f"{i:03d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(jpeg_bytes(picture(w, h, i + 100 * (split == "val"))))
    extra = root / "train" / "c1"
    (extra / "x-gray.jpg").write_bytes(jpeg_bytes(picture(400, 300, 50, "L")))
    picture(300, 200, 51).save(extra / "x-png.png")
    (extra / "x-cmyk.jpg").write_bytes(jpeg_bytes(picture(320, 240, 52, "CMYK")))
    (extra / "x-progressive.jpg").write_bytes(jpeg_bytes(picture(480, 360, 53), progressive=True))
    return root


def rgb_train(**kw) -> TrainTransform:
    return train_transform(SIZE, IMAGENET_MEAN, IMAGENET_STD, uint8=True, **kw)


def draft_reduced(box: tuple[int, int, int, int]) -> bool:
    """Whether the CPU path decodes this training box at a reduced scale (Pillow's draft mode)."""
    return draft_scale(box[3], box[2], SIZE, SIZE) > 1


def full_decode_crop(path: str, box: tuple[int, int, int, int], flip: bool, channels: int = 3) -> torch.Tensor:
    """The reference for a box: Pillow's full decode, cropped, resized by torch's uint8 antialiased bilinear
    kernel (the CPU path's resize), mirrored: what the CPU transform gives when no draft reduction applies."""
    with Image.open(path) as img:
        a = np.array(img.convert("RGB" if channels == 3 else "L"))
    a = a if a.ndim == 3 else a[..., None]
    top, left, h, w = box
    x = torch.from_numpy(np.ascontiguousarray(a[top : top + h, left : left + w])).permute(2, 0, 1)[None]
    y = F.interpolate(x, size=(SIZE, SIZE), mode="bilinear", antialias=True, align_corners=False)[0]
    return y.flip(-1) if flip else y


# --- (a) the same crops and flips, from the same per-sample stream --------------------------------------------
@pytest.mark.parametrize("seed,epoch", [(0, 0), (7, 3)])
@pytest.mark.slow
def test_crop_boxes_and_flips_are_the_cpu_transforms(photos, seed, epoch):
    t = rgb_train()
    cpu, dev = ImageFolder(photos / "train", t), ImageFolder(photos / "train", DeviceDecode(t))
    checked = 0
    for i, (path, _) in enumerate(dev.samples):
        index = SampleIndex(i, seed, epoch)
        enc, _ = dev[index]
        if enc.data is None:  # decoded in the worker by the CPU transform itself (next test)
            continue
        rng = sample_rng(index)  # torchvision's draw, then the flip, from the sample's own stream
        w, h = enc.size
        assert enc.crop.box == rrc_params(w, h, rng) and enc.crop.flip == (rng.random() < 0.5)
        assert enc.crop.resize == (SIZE, SIZE) and enc.crop.cut == (0, 0)
        # the CPU path used this very box and flip: exactly its pixels, or nearly after a draft reduction
        ref, got = full_decode_crop(path, enc.crop.box, enc.crop.flip), cpu[index][0]
        if draft_reduced(enc.crop.box):
            assert (ref.float() - got.float()).abs().mean() < DRAFT_MEAN
        else:
            assert torch.equal(ref, got)
            checked += 1
    assert checked >= 2
    other = dev[SampleIndex(1, seed, epoch + 1)][0].crop  # another epoch draws another crop
    assert other != dev[SampleIndex(1, seed, epoch)][0].crop


def test_files_nvjpeg_should_not_get_are_the_cpu_transforms_output(photos):
    t = rgb_train()
    cpu, dev = ImageFolder(photos / "train", t), ImageFolder(photos / "train", DeviceDecode(t))
    names = {Path(p).name: i for i, (p, _) in enumerate(dev.samples)}
    for name in ("x-gray.jpg", "x-png.png", "x-cmyk.jpg", "x-progressive.jpg"):
        index = SampleIndex(names[name], 3, 2)
        enc, _ = dev[index]
        assert enc.data is None and enc.ready.shape == (3, SIZE, SIZE), name
        assert torch.equal(enc.ready, cpu[index][0]), name  # the same transform on the same stream
    batch = DeviceBatch([dev[SampleIndex(i, 3, 2)][0] for i in (0, names["x-png.png"], 1, names["x-gray.jpg"])])
    images = batch.to_images("cpu")
    assert images.shape == (4, 3, SIZE, SIZE) and images.dtype == torch.uint8
    assert torch.equal(images[1], cpu[SampleIndex(names["x-png.png"], 3, 2)][0])
    assert torch.equal(images[3], cpu[SampleIndex(names["x-gray.jpg"], 3, 2)][0])


def test_a_one_channel_run_decodes_gray_jpegs_and_converts_the_rest_on_the_cpu(photos):
    t = train_transform(SIZE, (0.5,), (0.5,), uint8=True)
    cpu, dev = ImageFolder(photos / "train", t), ImageFolder(photos / "train", DeviceDecode(t))
    names = {Path(p).name: i for i, (p, _) in enumerate(dev.samples)}
    gray, colour = SampleIndex(names["x-gray.jpg"], 0, 0), SampleIndex(0, 0, 0)
    assert dev[gray][0].data is not None and dev[colour][0].data is None  # an RGB JPEG is converted by Pillow
    images = DeviceBatch([dev[gray][0], dev[colour][0]]).to_images("cpu")
    assert images.shape == (2, 1, SIZE, SIZE) and torch.equal(images[1], cpu[colour][0])
    assert (images[0].float() - cpu[gray][0].float()).abs().mean() < DRAFT_MEAN


# --- (b) the same statistics, nearly the same pixels ------------------------------------------------------------
def epoch_batches(ds, workers: int = 0, epoch: int = 1):
    loader = build_loader(ds, 6, True, workers=workers, seed=5)
    set_epoch(loader, epoch)
    return [(x.to_images("cpu") if isinstance(x, DeviceBatch) else x, y) for x, y in loader]


def test_the_device_path_gives_the_cpu_paths_statistics_and_pixels(photos):
    t = rgb_train()
    cpu = epoch_batches(ImageFolder(photos / "train", t))
    dev = epoch_batches(ImageFolder(photos / "train", DeviceDecode(t)))
    assert [torch.equal(a[1], b[1]) for a, b in zip(cpu, dev)] == [True] * len(cpu)  # same order, labels
    xc = torch.cat([x for x, _ in cpu]).float()
    xd = torch.cat([x for x, _ in dev]).float()
    assert xc.shape == xd.shape == (len(xc), 3, SIZE, SIZE)
    mean_c, mean_d = xc.mean((0, 2, 3)), xd.mean((0, 2, 3))
    std_c, std_d = xc.std((0, 2, 3)), xd.std((0, 2, 3))
    assert (mean_c - mean_d).abs().max() < CHANNEL_MEAN, (mean_c, mean_d)
    assert (std_c - std_d).abs().max() < CHANNEL_STD, (std_c, std_d)
    per_image = (xc - xd).abs().mean((1, 2, 3))
    assert per_image.max() < DRAFT_MEAN and per_image.mean() < BATCH_MEAN, per_image


def test_worker_processes_make_the_same_device_batches(photos):
    ds = ImageFolder(photos / "train", DeviceDecode(rgb_train()))
    one, two = epoch_batches(ds, 0, epoch=4), epoch_batches(ds, 2, epoch=4)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(one, two))


# --- (c) the evaluation crop --------------------------------------------------------------------------------------
@pytest.mark.parametrize("augment", ["none", "flip"])
def test_the_evaluation_crop_matches_eval_transform(photos, augment):
    t = rgb_train(augment=augment)  # "none": EvalTransform; "flip": its crop, then a drawn flip
    cpu, dev = ImageFolder(photos / "val", t), ImageFolder(photos / "val", DeviceDecode(t))
    index = [SampleIndex(i, 1, 1) for i in range(len(dev))]
    ref = torch.stack([cpu[i][0] for i in index]).float()
    got = DeviceBatch([dev[i][0] for i in index]).to_images("cpu").float()
    crops = [dev[i][0].crop for i in index]
    assert [c.flip for c in crops] == [augment == "flip" and bool(sample_rng(i).random() < 0.5) for i in index]
    diff = (ref - got).abs().mean((1, 2, 3))
    assert diff.max() < DRAFT_MEAN, diff
    whole = [k for k, c in enumerate(crops) if draft_scale(c.box[3], c.box[2], *c.resize[::-1]) == 1]
    assert whole and diff[whole].max() < EXACT_MEAN and (ref - got)[whole].abs().max() <= 1, diff


def test_eval_batches_and_the_eval_transform_size(photos):
    ev = eval_transform(SIZE, IMAGENET_MEAN, IMAGENET_STD, uint8=True)
    dev = ImageFolder(photos / "val", DeviceDecode(ev))
    x, y = next(iter(build_loader(dev, 5, False)))
    assert isinstance(x, DeviceBatch) and len(x) == 5 and y.tolist() == [0] * 5  # in order: c0's images first
    enc = dev[0][0]
    assert enc.crop.resize[::-1] == EvalTransform(SIZE, IMAGENET_MEAN, IMAGENET_STD).geometry(*enc.size)[0]


# --- (d) shards ---------------------------------------------------------------------------------------------------
def test_shards_ship_the_folders_bytes_and_crops(photos, tmp_path):
    export_shards(photos, tmp_path / "shards", shard_size=7)
    t = rgb_train()
    folder = ImageFolder(photos / "train", DeviceDecode(t))
    shards = open_shards(tmp_path / "shards", "train", DeviceDecode(t)).distribute(seed=4, batch_size=1)
    shards.set_epoch(2)
    seen = 0
    for enc, label in shards:
        i = int(enc.name.rsplit("sample ", 1)[1].split(".")[0])  # the sample's index in the folder's order
        ref, ref_label = folder[SampleIndex(i, 4, 2)]
        assert label == ref_label and enc.data == ref.data and enc.crop == ref.crop, enc.name
        if enc.data is None:
            assert torch.equal(enc.ready, ref.ready)
        seen += 1
    assert seen == len(folder)
    loader = build_loader(open_shards(tmp_path / "shards", "train", DeviceDecode(t)), 6, True, workers=2, seed=1)
    x, y = next(iter(loader))
    assert isinstance(x, DeviceBatch) and x.to_images("cpu").shape == (6, 3, SIZE, SIZE) and y.shape == (6,)


# --- (e) the real CLI: train, resume, no torchvision on CPU ---------------------------------------------------
def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    code = ("import sys\nfrom torchboost.cli import main\nrc = main(sys.argv[1:])\n"
            "print('torchvision loaded:', any(m.split('.')[0] == 'torchvision' for m in sys.modules))\n"
            "sys.exit(rc)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_train_and_resume_with_device_decoding_on_the_cpu(tmp_path):
    data = tmp_path / "data"
    for split, n in (("train", 16), ("val", 6)):
        for i in range(n):
            path = data / split / f"c{i % 2}" / f"{i}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(jpeg_bytes(picture(*SIZES[i % len(SIZES)], i)))
    common = ["--set", "train.progress_bar=false"]
    first = run_cli(["train", "--data", str(data), "-o", str(tmp_path / "run"), "--epochs", "1", "-b", "8",
                     "--set", "model.name=resnet18", "--set", "data.image_size=72", "--set", "data.decode=device",
                     "--set", "data.workers=1", *common], tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "final: top-1" in first.stdout and "torchvision loaded: False" in first.stdout
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["data"]
    assert saved["decode"] == "device" and saved["normalize_on_device"] is False  # uint8 batches regardless
    # the default recipe's random_shift (for digits) is not recorded beside the crops `auto` chose, so the
    # saved config passes validation again on resume
    assert saved["augment"] == "imagenet" and saved["random_shift"] == 0
    # the resumes in this process (the fresh interpreter above is what shows torchvision is never imported)
    assert main(["train", "--force", "--resume", str(tmp_path / "run"), "--epochs", "2", *common]) == 0
    # the same samples and crops either way: switching the decoder is not a different run (no --force)
    assert main(["train", "--force", "--resume", str(tmp_path / "run"), "--epochs", "3", "--set", "data.decode=cpu",
                 *common]) == 0
    history = [yaml.safe_load(line) for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in history] == [1, 2, 3] and history[-1]["val_samples"] == 6


def test_decode_auto_is_cpu_without_cuda_and_device_refuses_what_needs_the_cpu(tmp_path):
    from torchboost.recipe.load import load_config
    from torchboost.recipe.data import infer_data

    base = ["data.dataset=folder", f"data.path={tmp_path}", "model.name=resnet18", "data.image_size=32",
            "data.channels=3", "data.crop_pct=0.875"]  # all set: nothing to sample in this empty folder
    cfg = load_config("digits-lenet", [*base, "data.decode=auto", "train.device=cpu"])
    assert infer_data(cfg, log=lambda m: None).decode == "cpu"
    for extra, key in (("data.auto_augment=randaugment", "data.auto_augment"), ("data.random_erasing=0.25",
                       "data.random_erasing"), ("data.mixup_alpha=0.2", "data.mixup_alpha")):
        with pytest.raises(ConfigError, match=f"data.decode=device cannot be combined with {key}"):
            load_config("digits-lenet", [*base, "data.decode=device", extra])
    with pytest.raises(ConfigError, match="data.decode=device does not apply to data.dataset=digits"):
        load_config("digits-lenet", ["data.decode=device"])
    # `augment: auto` gives small images shifts: passes validation, refused once inferred
    cfg = load_config("digits-lenet", [*base[:3], "data.channels=3", "data.image_size=28", "data.random_shift=2",
                                        "data.decode=device", "data.crop_pct=1.0"])
    with pytest.raises(ConfigError, match="data.decode=device cannot apply data.augment=shift"):
        infer_data(cfg, log=lambda m: None)


# --- (f) hostile files --------------------------------------------------------------------------------------------
def one_class(tmp_path: Path, name: str, data: bytes | None = None) -> Path:
    folder = tmp_path / "set" / "a"
    folder.mkdir(parents=True)
    (folder / "0-good.jpg").write_bytes(jpeg_bytes(picture(200, 150, 0)))
    if data is not None:
        (folder / name).write_bytes(data)
    return folder.parent


def test_a_truncated_jpeg_fails_or_is_skipped_as_on_the_cpu_path(tmp_path):
    whole = jpeg_bytes(picture(400, 300, 1))
    root = one_class(tmp_path, "1-cut.jpg", whole[: len(whole) // 2])
    t = DeviceDecode(rgb_train())
    with pytest.raises(DataError, match=r"corrupt image .*1-cut\.jpg \(OSError: image file is truncated"):
        ImageFolder(root, t)[1]
    skipping = ImageFolder(root, t, skip_corrupt=True)
    batches = [x.to_images("cpu") for x, _ in build_loader(skipping, 2, True)]
    assert len(batches) == 1 and batches[0].shape == (2, 3, SIZE, SIZE) and skipping.skipped == 1


def test_a_jpeg_with_an_end_marker_but_bad_data_is_one_line_naming_it(tmp_path):
    whole = jpeg_bytes(picture(400, 300, 2))
    root = one_class(tmp_path, "1-bad.jpg", whole[:600] + bytes(range(256)) * 20 + b"\xff\xd9")
    ds = ImageFolder(root, DeviceDecode(rgb_train()))
    assert ds[1][0].data is not None  # the header and the end marker look right: the worker ships it
    batch = collate([ds[0], ds[1]])[0]
    with pytest.raises(DataError) as e:
        batch.to_images("cpu")
    assert e.value.what == f"corrupt image {root / 'a' / '1-bad.jpg'} (OSError: cannot load this image)"


@pytest.mark.parametrize("width,height,why", [
    (12000, 10000, "12000×10000 pixels is over the 100,000,000-pixel limit"),  # ours, from the header
    (40000, 30000, "DecompressionBombError: Image size"),  # past Pillow's own limit, which checks first
])
def test_a_header_claiming_a_huge_image_is_refused_before_decoding(tmp_path, width, height, why):
    data = bytearray(jpeg_bytes(picture(64, 48, 3)))
    sof = data.index(b"\xff\xc0")  # baseline frame header: marker, length, precision, height, width
    data[sof + 5 : sof + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    root = one_class(tmp_path, "1-bomb.jpg", bytes(data))
    for t in (rgb_train(), DeviceDecode(rgb_train())):
        with pytest.raises(DataError, match=rf"corrupt image .*1-bomb\.jpg .*{why}"):
            ImageFolder(root, t)[1]


def test_fifos_and_links_to_them_are_refused_and_links_to_files_read(tmp_path):
    root = one_class(tmp_path, "unused")
    os.mkfifo(root / "a" / "1-fifo.jpg")
    t = DeviceDecode(rgb_train())
    with pytest.raises(DataError, match=r"1-fifo\.jpg is a FIFO"):
        ImageFolder(root, t)[1]
    (root / "a" / "1-fifo.jpg").unlink()
    os.mkfifo(tmp_path / "pipe")
    (root / "a" / "1-link.jpg").symlink_to(tmp_path / "pipe")
    with pytest.raises(DataError, match=r"1-link\.jpg is a FIFO"):
        ImageFolder(root, t)[1]
    (root / "a" / "1-link.jpg").unlink()
    (root / "a" / "1-link.jpg").symlink_to(root / "a" / "0-good.jpg")  # a link to an image reads like the image
    ds = ImageFolder(root, t)
    assert ds[SampleIndex(1, 0, 0)][0].data == ds[SampleIndex(0, 0, 0)][0].data


def test_a_file_over_the_byte_limit_is_decoded_on_the_cpu(tmp_path, monkeypatch):
    import torchboost.data.device_decode as dd

    root = one_class(tmp_path, "unused")
    monkeypatch.setattr(dd, "MAX_FILE_BYTES", 1000)  # the photo's JPEG is larger
    enc = ImageFolder(root, DeviceDecode(rgb_train()))[0][0]
    assert isinstance(enc, EncodedImage) and enc.data is None and enc.ready.shape == (3, SIZE, SIZE)


def test_transforms_device_decoding_cannot_reproduce_are_refused():
    for t in (train_transform(SIZE, IMAGENET_MEAN, IMAGENET_STD, augment="shift", shift=2),
              train_transform(SIZE, IMAGENET_MEAN, IMAGENET_STD, auto_augment="randaugment"),
              train_transform(SIZE, IMAGENET_MEAN, IMAGENET_STD, random_erasing=0.5)):
        with pytest.raises(ConfigError, match="device decoding cannot apply"):
            DeviceDecode(t)


# --- nvJPEG (CUDA + torchvision only) -------------------------------------------------------------------------
def nvjpeg_available() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import torchvision.io  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.skipif(not nvjpeg_available(), reason="needs CUDA and torchvision (nvJPEG)")
def test_nvjpeg_batches_match_the_cpu_decoder(photos):
    ds = ImageFolder(photos / "train", DeviceDecode(rgb_train()))
    batch = collate([ds[SampleIndex(i, 2, 0)] for i in range(len(ds))])[0]
    cpu = batch.to_images("cpu").float()
    gpu = batch.to_images("cuda").float().cpu()
    # nvJPEG's IDCT and chroma upsampling are not libjpeg-turbo's: a few grey levels on average
    assert (cpu - gpu).abs().mean((1, 2, 3)).max() < DRAFT_MEAN
    assert (cpu.mean((0, 2, 3)) - gpu.mean((0, 2, 3))).abs().max() < CHANNEL_MEAN
    pinned = batch.pin_memory()
    assert pinned.data.is_pinned() and torch.equal(pinned.to_images("cuda").cpu(), gpu.to(torch.uint8))
    x, _ = next(iter(build_loader(ds, 8, True, workers=2, pin_memory=True)))  # the pin-memory thread pins it
    assert isinstance(x, DeviceBatch) and x.data.is_pinned() and x.to_images("cuda").is_cuda


# --- the prefetcher: the next batch's images made ahead, in a thread ------------------------------------------
def test_the_prefetcher_gives_the_loaders_batches_with_their_images_made(photos):
    from torchboost.data.prefetch import DevicePrefetcher
    ds = ImageFolder(photos / "train", DeviceDecode(rgb_train()))
    loader = build_loader(ds, 6, True, workers=0, seed=5)
    ahead = DevicePrefetcher(loader, torch.device("cpu"))
    assert len(ahead) == len(loader) and ahead.sampler is loader.sampler and ahead.dataset is ds
    set_epoch(ahead, 2)  # the loader's sampler, through the wrapper
    got = [(x._images, y) for x, y in ahead]  # made by the prefetcher's thread
    want = epoch_batches(ds, 0, epoch=2)
    assert len(got) == len(want) and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                                         for a, b in zip(got, want))


def test_the_prefetcher_raises_a_batchs_error_where_it_is_read_and_stops_when_left(tmp_path):
    from torchboost.data.prefetch import DevicePrefetcher
    whole = jpeg_bytes(picture(400, 300, 2))
    root = one_class(tmp_path, "1-bad.jpg", whole[:600] + bytes(range(256)) * 20 + b"\xff\xd9")
    ds = ImageFolder(root, DeviceDecode(rgb_train()))
    with pytest.raises(DataError, match="1-bad.jpg"):
        list(DevicePrefetcher(build_loader(ds, 2, False), torch.device("cpu")))
    many = [(torch.zeros(1), torch.zeros(1)) for _ in range(50)]  # plain batches pass through untouched
    it = iter(DevicePrefetcher(many, torch.device("cpu"), depth=1))
    assert next(it) is many[0]
    it.close()  # the consumer leaves early: the thread ends instead of waiting on a full queue
    assert not any(t.name == "torchboost-prefetch" and t.is_alive() for t in __import__("threading").enumerate())


def test_the_prefetch_thread_waits_for_its_stream_before_each_decode(photos, monkeypatch):
    """nvJPEG writes without waiting on the side stream, where the last batch's resize kernels may still read
    decoded images already freed: the thread synchronises the stream before every decode (the order checked here
    with a stand-in stream; the pixels on a GPU by the CUDA test below and benchmarks/gpu_checks.sh)."""
    import contextlib

    from torchboost.data import prefetch
    from torchboost.data.prefetch import DevicePrefetcher

    calls: list[str] = []

    class Stream:
        def synchronize(self) -> None:
            calls.append("sync")

    class Event:
        def record(self, stream) -> None:
            calls.append("event")

    monkeypatch.setattr(prefetch.torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(prefetch.torch.cuda, "Event", Event)
    made = DeviceBatch.to_images
    monkeypatch.setattr(DeviceBatch, "to_images", lambda self, d: calls.append("decode") or made(self, d))
    ds = ImageFolder(photos / "train", DeviceDecode(rgb_train()))
    ahead = DevicePrefetcher(build_loader(ds, 4, False), torch.device("cpu"))
    stream = Stream()
    for batch in build_loader(ds, 4, False):
        ahead._make(batch, stream)
    assert calls and calls == ["sync", "decode", "event"] * (len(calls) // 3)


@pytest.mark.skipif(not nvjpeg_available(), reason="needs CUDA and torchvision (nvJPEG)")
def test_on_cuda_prefetched_batches_equal_the_cpu_decode_while_the_gpu_is_busy(tmp_path):
    """1,000 JPEGs decoded on the device one batch ahead while the training stream is kept busy: every batch's
    pixels equal the CPU path's decode within the stated tolerance (a recycled block overwritten by the next
    decode would differ by far more)."""
    from torchboost.data.prefetch import DevicePrefetcher

    root = tmp_path / "many" / "train" / "a"
    root.mkdir(parents=True)
    for i in range(1000):
        picture(96 + i % 64, 80 + (i * 7) % 64, i).save(root / f"{i:04d}.jpg", quality=90)
    ds = ImageFolder(root.parent, DeviceDecode(rgb_train()))
    busy = torch.randn(2048, 2048, device="cuda")
    for x, _ in DevicePrefetcher(build_loader(ds, 50, False, seed=1), torch.device("cuda")):
        for _ in range(4):  # the training stream's work, while the thread decodes the next batch
            busy = (busy @ busy).tanh_()
        gpu = x.to_images("cuda").float().cpu()
        cpu = x.to_images("cpu").float()
        assert (cpu - gpu).abs().mean((1, 2, 3)).max() < DRAFT_MEAN
