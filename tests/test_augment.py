"""Photo policies (RandAugment, TrivialAugmentWide), random erasing and mixup/cutmix against their reference
definitions (torchvision's autoaugment.py and RandomErasing, timm's Mixup), written out here independently:
magnitude tables, op frequencies, each op's output against Pillow's own call, erasing boxes, mixed batches and
their soft targets; then a run with all of them on, resumed mid-epoch, ends with the uninterrupted weights."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image, ImageEnhance, ImageOps

from torchboost.cli import main
from torchboost.data import build_loader
from torchboost.data.augment import OPS, Policy, RandomErasing, apply_op, inverse_affine, magnitudes
from torchboost.data.mixup import MixedBatches, Mixup, cutmix_box, mix_target
from torchboost.data.sampling import SampleIndex, batch_rng
from torchboost.data.tensors import TensorImageDataset
from torchboost.data.transforms import IMAGENET_MEAN, IMAGENET_STD, normalize_batch, train_transform
from torchboost.losses import CrossEntropySmooth
from torchboost.train.step import TrainStep

NEAREST = Image.Resampling.NEAREST
CHI2_999 = {13: 34.528, 30: 59.703}  # chi-square quantile 0.999 (scipy.stats.chi2.ppf(0.999, df))


def texture(size: int = 32, seed: int = 0, mode: str = "RGB") -> Image.Image:
    """A photo-like image: smooth colour gradients, a bright square and noise (every op changes it)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    a = np.stack([xx * 200 / size, yy * 180 / size, 90 + 60 * np.sin(xx / 3.0)], -1) + rng.normal(0, 12, (size, size, 3))
    a[size // 4: size // 2, size // 3: 2 * size // 3] += 70
    img = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
    return img if mode == "RGB" else img.convert(mode)


def within_binomial(k: int, n: int, p: float, sigmas: float = 4.0) -> bool:
    return abs(k - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


def chi_square(counts: np.ndarray) -> float:
    expected = counts.sum() / len(counts)
    return float(((counts - expected) ** 2 / expected).sum())


# --- magnitudes: torchvision's tables ------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["randaugment", "trivialaugment"])
def test_magnitude_tables_are_torchvisions(policy):
    h, w = 24, 40
    table = magnitudes(policy, 31, h, w)
    assert tuple(table) == OPS and all(not table[k] for k in ("Identity", "AutoContrast", "Equalize"))
    wide = policy == "trivialaugment"
    ends = {"ShearX": 0.99 if wide else 0.3, "Rotate": 135.0 if wide else 30.0, "Brightness": 0.99 if wide else 0.9,
            "TranslateX": 32.0 if wide else 150 / 331 * w, "TranslateY": 32.0 if wide else 150 / 331 * h}
    for b in range(31):
        for name, end in ends.items():
            assert table[name][b] == pytest.approx(end * b / 30, rel=1e-6, abs=1e-7), (name, b)
        for name in ("ShearY", "Color", "Contrast", "Sharpness"):
            assert table[name][b] == table["ShearX" if name == "ShearY" else "Brightness"][b]
        assert table["Posterize"][b] == 8 - round(b / (30 / (6 if wide else 4)))  # no ties at 31 bins
        assert table["Solarize"][b] == pytest.approx(255 - 255 * b / 30, abs=1e-4)
    if not wide:  # the defaults' bin 9: 9 degrees, 7 bits, threshold 178.5
        assert (table["Rotate"][9], table["Posterize"][9], table["Solarize"][9]) == (9.0, 7, 178.5)
    else:
        assert (table["Rotate"][30], table["Posterize"][30], table["Posterize"][0]) == (135.0, 2, 8)


def test_torchvisions_shear_and_translate_matrices_are_the_plain_affine_ones():
    m = 0.27
    shear = math.degrees(math.atan(m))
    assert inverse_affine([0, 0], 0.0, [0, 0], 1.0, [shear, 0.0]) == pytest.approx([1, m, 0, 0, 1, 0], abs=1e-15)
    assert inverse_affine([0, 0], 0.0, [0, 0], 1.0, [0.0, shear]) == pytest.approx([1, 0, 0, m, 1, 0], abs=1e-15)
    assert inverse_affine([16.0, 12.0], 0.0, [5, -3], 1.0, [0.0, 0.0]) == [1, 0, -5, 0, 1, 3]


# --- op choice and sign frequencies ----------------------------------------------------------------------------
def test_randaugment_picks_each_op_uniformly_at_the_fixed_bin_with_random_signs():
    policy, rng = Policy("randaugment", num_ops=2, magnitude=9), np.random.default_rng(0)
    table = magnitudes("randaugment", 31, 32, 32)
    counts, negative, signed = np.zeros(len(OPS)), 0, 0
    draws = [policy.draws(rng, 32, 32) for _ in range(7000)]
    assert all(len(d) == 2 for d in draws)
    for name, magnitude in (op for d in draws for op in d):
        counts[OPS.index(name)] += 1
        assert abs(magnitude) == (table[name][9] if table[name] else 0.0)
        if name in ("Posterize", "Solarize"):
            assert magnitude > 0
        if name in OPS[1:10]:
            signed, negative = signed + 1, negative + (magnitude < 0)
    assert chi_square(counts) < CHI2_999[13], counts
    assert within_binomial(negative, signed, 0.5)


def test_trivialaugment_picks_one_op_and_a_uniform_bin():
    policy, rng = Policy("trivialaugment"), np.random.default_rng(1)
    table = magnitudes("trivialaugment")
    ops, bins, negative, signed = np.zeros(len(OPS)), np.zeros(31), 0, 0
    for _ in range(14000):
        (name, magnitude), = policy.draws(rng, 32, 32)
        ops[OPS.index(name)] += 1
        if table[name]:
            if name == "Posterize":  # bins share values: count the ones that are unique
                continue
            bins[table[name].index(abs(magnitude)) if name != "Solarize" else table[name].index(magnitude)] += 1
        if name in OPS[1:10]:
            signed, negative = signed + 1, negative + (magnitude < 0)
    assert chi_square(ops) < CHI2_999[13], ops
    assert chi_square(bins) < CHI2_999[30], bins
    assert within_binomial(negative, signed, 0.5)


# --- each op is Pillow's call with torchvision's parameters -----------------------------------------------------
def pillow_reference(img: Image.Image, name: str, m: float) -> Image.Image:
    fill = (0,) * len(img.getbands()) if len(img.getbands()) > 1 else 0
    affine = {"ShearX": (1, m, 0, 0, 1, 0), "ShearY": (1, 0, 0, m, 1, 0), "TranslateX": (1, 0, -int(m), 0, 1, 0),
              "TranslateY": (1, 0, 0, 0, 1, -int(m))}
    if name in affine:
        return img.transform(img.size, Image.Transform.AFFINE, affine[name], NEAREST, fillcolor=fill)
    if name == "Rotate":
        return img.rotate(m, NEAREST, fillcolor=fill)
    enhance = {"Brightness": ImageEnhance.Brightness, "Color": ImageEnhance.Color, "Contrast": ImageEnhance.Contrast,
               "Sharpness": ImageEnhance.Sharpness}
    if name in enhance:
        return enhance[name](img).enhance(1 + m)
    return {"Posterize": lambda: ImageOps.posterize(img, int(m)), "Solarize": lambda: ImageOps.solarize(img, m),
            "AutoContrast": lambda: ImageOps.autocontrast(img), "Equalize": lambda: ImageOps.equalize(img),
            "Identity": lambda: img}[name]()


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("policy", ["randaugment", "trivialaugment"])
def test_each_op_equals_pillows_output_with_the_same_parameters(policy, mode):
    img = texture(32, mode=mode)
    table = magnitudes(policy, 31, 32, 32)
    for name in OPS:
        for b in ((9, 30) if table[name] else (0,)):
            for sign in ((1, -1) if name in OPS[1:10] else (1,)):
                m = sign * table[name][b] if table[name] else 0.0
                got, want = np.asarray(apply_op(img, name, m)), np.asarray(pillow_reference(img, name, m))
                assert np.array_equal(got, want), (name, b, sign)
                if mode == "RGB" and b:  # every op with a magnitude changes the image (Color is a no-op on L)
                    assert not np.array_equal(got, np.asarray(img)), (name, b)


def test_a_policy_applies_its_draws_in_order():
    img = texture(32, seed=3)
    for name in ("randaugment", "trivialaugment"):
        policy = Policy(name, num_ops=3, magnitude=14)
        for seed in range(20):
            want = img
            for op, m in policy.draws(np.random.default_rng(seed), 32, 32):
                want = pillow_reference(want, op, m)
            assert np.array_equal(np.asarray(policy(img, np.random.default_rng(seed))), np.asarray(want))


# --- the training transform: crop, flip, policy, erasing, in torchvision's order --------------------------------
@pytest.mark.parametrize("augment", ["imagenet", "flip", "none"])
def test_the_transform_applies_the_policy_then_erasing_to_the_flipped_crop(augment):
    img = texture(48, seed=4)
    plain = train_transform(32, IMAGENET_MEAN, IMAGENET_STD, uint8=True, augment=augment, crop_pct=0.75)
    full = train_transform(32, IMAGENET_MEAN, IMAGENET_STD, uint8=True, augment=augment, crop_pct=0.75,
                           auto_augment="trivialaugment", random_erasing=0.7)
    erasing = RandomErasing(0.7, fill=[round(m * 255) for m in IMAGENET_MEAN])
    for seed in range(12):
        rng = np.random.default_rng(seed)
        crop = plain(img.copy(), rng).permute(1, 2, 0).numpy()  # the same geometry draws, flip included
        want = erasing(np.asarray(full.policy(Image.fromarray(crop), rng)), rng)
        assert np.array_equal(full(img.copy(), np.random.default_rng(seed)).permute(1, 2, 0).numpy(), want)


def test_off_by_default_draws_exactly_what_it_always_drew():
    img = texture(48, seed=5)
    a = train_transform(32, IMAGENET_MEAN, IMAGENET_STD)
    b = train_transform(32, IMAGENET_MEAN, IMAGENET_STD, auto_augment="none", random_erasing=0.0)
    assert a.policy is None and a.erasing is None
    ra, rb = np.random.default_rng(0), np.random.default_rng(0)
    assert torch.equal(a(img.copy(), ra), b(img.copy(), rb))
    assert ra.random() == rb.random()


def test_uint8_and_float_pipelines_agree_with_policies_and_erasing_on():
    img = texture(40, seed=6)
    kw = dict(augment="imagenet", auto_augment="randaugment", random_erasing=1.0)
    u8 = train_transform(32, IMAGENET_MEAN, IMAGENET_STD, uint8=True, **kw)
    f32 = train_transform(32, IMAGENET_MEAN, IMAGENET_STD, uint8=False, **kw)
    for seed in range(6):
        x = u8(img.copy(), np.random.default_rng(seed))[None]
        assert torch.equal(normalize_batch(x, IMAGENET_MEAN, IMAGENET_STD)[0], f32(img.copy(), np.random.default_rng(seed)))
    fill = torch.tensor([[[round(m * 255)]] for m in IMAGENET_MEAN], dtype=torch.uint8)
    assert normalize_batch(fill[None].expand(1, 3, 1, 1), IMAGENET_MEAN, IMAGENET_STD).abs().max() < 0.01  # ~ value=0


# --- random erasing ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_random_erasing_boxes_follow_torchvisions_distribution():
    erasing, rng = RandomErasing(0.5, fill=(7, 8, 9)), np.random.default_rng(2)
    size, erased, areas, aspects = 400, 0, [], []
    a = np.full((size, size, 3), 200, np.uint8)
    for _ in range(2000):
        out = erasing(a, rng)
        mask = out[..., 0] != 200
        if not mask.any():
            assert out is a  # untouched: not even copied
            continue
        erased += 1
        rows, cols = np.nonzero(mask.any(1))[0], np.nonzero(mask.any(0))[0]
        h, w = rows[-1] - rows[0] + 1, cols[-1] - cols[0] + 1
        want = a.copy()  # one box of the fill over the bounding box of what changed, the rest untouched
        want[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1] = (7, 8, 9)
        assert np.array_equal(out, want)
        areas.append(h * w / size**2)
        aspects.append(h / w)
    assert within_binomial(erased, 2000, 0.5)
    assert 0.02 * 0.98 <= min(areas) and max(areas) <= 0.33 * 1.02
    assert 0.3 * 0.97 <= min(aspects) and max(aspects) <= 3.3 * 1.03
    log_aspect = np.log(aspects)  # log-uniform over [log 0.3, log 3.3] (less its tails that do not fit)
    assert abs(log_aspect.mean() - (math.log(0.3) + math.log(3.3)) / 2) < 0.1


def test_a_box_that_never_fits_leaves_the_image():
    erasing = RandomErasing(1.0, scale=(0.9, 1.0), ratio=(5.0, 6.0))
    a = np.zeros((10, 10), np.uint8)
    assert erasing.box(10, 10, np.random.default_rng(0)) is None
    assert erasing(a, np.random.default_rng(0)) is a


# --- mixup / cutmix ---------------------------------------------------------------------------------------------
def test_smoothed_targets_are_timms_and_every_row_sums_to_one():
    y = torch.tensor([0, 2, 1, 4, 3, 2])
    for s in (0.0, 0.1, 0.3):
        one = mix_target(y, 5, 1.0, s)
        off, on = s / 5, 1 - s + s / 5
        want = torch.full((6, 5), off)
        want[torch.arange(6), y] = on
        assert torch.equal(one, want)
        for lam in (0.0, 0.3, 0.77):
            soft = mix_target(y, 5, lam, s)
            assert torch.allclose(soft.sum(1), torch.ones(6), atol=1e-6)
            assert torch.allclose(soft, lam * want + (1 - lam) * want.flip(0))


def test_mixup_blends_each_image_with_its_partner_in_the_reversed_batch():
    x, y = torch.rand(6, 3, 8, 8), torch.arange(6)
    mix = Mixup(6, mixup_alpha=0.4, label_smoothing=0.1)
    for seed in range(10):
        lam, cutmix = mix.params(np.random.default_rng(seed))
        got, soft = mix(x, y, np.random.default_rng(seed))
        assert not cutmix and 0 < lam < 1
        assert torch.equal(got, x * lam + x.flip(0) * (1 - lam))
        assert torch.allclose(soft, mix_target(y, 6, lam, 0.1)) and torch.allclose(soft.sum(1), torch.ones(6))


def test_cutmix_lambda_is_the_share_of_pixels_really_kept():
    h, w = 20, 28
    x = torch.arange(6, dtype=torch.float32).view(6, 1, 1, 1).expand(6, 2, h, w).contiguous()  # image i = i
    y = torch.arange(6)
    mix = Mixup(6, cutmix_alpha=1.0)
    clipped = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)  # the draws Mixup makes, in its order: lam, then the box
        lam0, cutmix = mix.params(rng)
        (y0, y1, x0, x1), lam = cutmix_box(h, w, lam0, rng)
        got, soft = mix(x, y, np.random.default_rng(seed))
        pasted = got[0, 0] == 5  # image 0's partner in the reversed batch is image 5
        assert cutmix and int(pasted.sum()) == (y1 - y0) * (x1 - x0) and bool(pasted[y0:y1, x0:x1].all())
        assert ((got[0, 0] == 0) | pasted).all() and torch.equal(got[:, 1], got[:, 0])
        assert lam == 1.0 - int(pasted.sum()) / float(h * w)  # exactly the share kept
        assert float(soft[0, 0]) == pytest.approx(lam, abs=1e-7) and float(soft[0, 5]) == pytest.approx(1 - lam, abs=1e-7)
        cut_h, cut_w = int(h * math.sqrt(1 - lam0)), int(w * math.sqrt(1 - lam0))
        clipped += (y1 - y0) < 2 * (cut_h // 2) or (x1 - x0) < 2 * (cut_w // 2)
    assert clipped > 0  # boxes cut at the border happened, and lam followed them


def test_switch_and_mix_probabilities_and_lambdas_follow_the_definitions():
    mix, rng, n = Mixup(10, mixup_alpha=0.5, cutmix_alpha=1.0, prob=0.8, switch_prob=0.3), np.random.default_rng(5), 8000
    params = [mix.params(rng) for _ in range(n)]
    mixed = [(lam, c) for lam, c in params if lam != 1.0]
    assert within_binomial(len(mixed), n, 0.8)
    cut = [lam for lam, c in mixed if c]
    assert within_binomial(len(cut), len(mixed), 0.3)
    up = np.array([lam for lam, c in mixed if not c])  # Beta(0.5, 0.5): mean 1/2, variance 1/8
    assert abs(up.mean() - 0.5) < 4 * math.sqrt(1 / 8 / len(up)) and abs(up.var() - 1 / 8) < 0.01
    assert abs(np.mean(cut) - 0.5) < 4 * math.sqrt(1 / 12 / len(cut))  # Beta(1, 1): uniform


def test_uint8_batches_are_mixed_in_float_and_rounded():
    x = torch.randint(0, 256, (4, 3, 6, 6), dtype=torch.uint8)
    got, _ = Mixup(3, mixup_alpha=1.0)(x, torch.tensor([0, 1, 2, 0]), np.random.default_rng(0))
    lam, _ = Mixup(3, mixup_alpha=1.0).params(np.random.default_rng(0))
    assert got.dtype == torch.uint8
    assert torch.equal(got, (x.float() * lam + x.flip(0).float() * (1 - lam)).round().to(torch.uint8))


def test_batches_draw_from_seed_epoch_and_their_indices_whatever_the_workers():
    g = torch.Generator().manual_seed(0)
    ds = TensorImageDataset(torch.randint(0, 256, (24, 3, 8, 8), generator=g, dtype=torch.uint8),
                            torch.arange(24) % 3, ["a", "b", "c"], (0.5,) * 3, (0.25,) * 3)
    mixed = MixedBatches(ds, Mixup(3, mixup_alpha=0.4, cutmix_alpha=1.0))
    assert mixed.classes == ["a", "b", "c"] and len(mixed) == 24
    idx = [SampleIndex(i, 3, 1) for i in (5, 2, 9, 11)]
    a, b = mixed.__getitems__(idx), mixed.__getitems__(list(idx))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    other = batch_rng([SampleIndex(i, 3, 2) for i in (5, 2, 9, 11)]).random()
    assert batch_rng(idx).random() != other
    runs = []
    for workers in (0, 2):
        loader = build_loader(mixed, 4, True, seed=3, workers=workers, persistent_workers=False)
        runs.append([b for _ in range(2) for b in loader])  # two epochs
    for (xa, ya), (xb, yb) in zip(*runs):
        assert torch.equal(xa, xb) and torch.equal(ya, yb) and ya.shape == (4, 3)


# --- soft targets through the loss and the step --------------------------------------------------------------
def test_the_loss_takes_soft_targets_as_they_are_and_the_step_counts_their_argmax():
    logits = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    soft = mix_target(torch.tensor([0, 1, 2, 3, 1]), 4, 0.7, 0.1)
    for sparse in (True, False):
        loss = CrossEntropySmooth(sparse=sparse, smooth_factor=0.2, num_classes=4)(logits, soft)
        assert torch.allclose(loss, F.cross_entropy(logits, soft))  # not smoothed a second time
    net = torch.nn.Linear(4, 4, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.eye(4))
    step = TrainStep(net, CrossEntropySmooth(num_classes=4), torch.optim.SGD(net.parameters(), lr=0.0),
                     compute_accuracy=True)
    out = step([(logits, soft)], 0)
    assert int(out.correct) == int((logits.argmax(1) == soft.argmax(1)).sum())


# --- the recipe keys ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, says", [("data.auto_augment=trivialaugment", "does not apply to data.dataset=mnist5k"),
                                       ("data.random_erasing=0.25", "does not apply to data.dataset=mnist5k"),
                                       ("data.randaugment_magnitude=12", "but data.auto_augment=none"),
                                       ("data.mixup_prob=0.5", "mixup and cutmix are off")])
def test_augmentations_where_they_do_not_apply_are_one_line_errors(key, says, capsys):
    assert main(["train", "--set", key]) == 2  # the default data: MNIST in memory
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {key}") and says in err and " — " in err and "\n" not in err, err


# --- a run resumed mid-epoch with everything on ends as the uninterrupted one ----------------------------------
def photo_folder(root: Path, n: int = 16, size: int = 32) -> Path:
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:size, 0:size]
    for split, count in (("train", n), ("val", n // 4)):
        for k in range(3):
            (root / split / f"c{k}").mkdir(parents=True)
            for i in range(count):
                colour = rng.uniform(40, 215, 3)
                stripes = 40 * np.sin((xx if k == 0 else yy if k == 1 else xx + yy) * 0.8 + rng.uniform(0, 6))
                a = colour + stripes[..., None] + rng.normal(0, 15, (size, size, 3))
                Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(root / split / f"c{k}" / f"{i}.png")
    return root


@pytest.mark.parametrize("policy", ["randaugment", "trivialaugment"])
@pytest.mark.slow
def test_a_run_with_every_augmentation_resumed_mid_epoch_equals_the_uninterrupted_one(policy, tmp_path, one_thread):
    from torchboost.recipe.load import load_config
    from torchboost.recipe.run import train_from_config
    from torchboost.train.checkpoint import load_checkpoint

    data = photo_folder(tmp_path / "data")
    sets = ["data.dataset=folder", f"data.path={data}", "data.batch_size=8", "train.epochs=2", "data.workers=1",
            f"data.auto_augment={policy}", "data.random_erasing=0.5", "data.mixup_alpha=0.4", "data.cutmix_alpha=1.0",
            "train.label_smoothing=0.1", "checkpoint.save_every_steps=2", "checkpoint.keep_max=50",
            "train.progress_bar=false", "train.loggers=[]"]
    straight = train_from_config(load_config("mnist-lenet", sets), output=str(tmp_path / "a"), log=lambda m: None)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    ckpts = sorted((tmp_path / "b" / "ckpt").glob("mnist_cnn-2_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    mid = ckpts[0]  # epoch 2, update 2 of 6
    assert mid.stem.endswith("-2_2")
    for later in ckpts[1:]:
        later.unlink()
    # resumed with no loader worker: the draws do not depend on who builds the batch
    resumed = train_from_config(load_config("mnist-lenet", [*sets, "data.workers=0"]), resume=str(mid),
                                output=str(tmp_path / "b"), log=lambda m: None)
    a, b = load_checkpoint(straight.last_checkpoint), load_checkpoint(resumed.last_checkpoint)
    assert straight.last_checkpoint.name == resumed.last_checkpoint.name
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert straight.eval_results["val_top_1_accuracy"] == resumed.eval_results["val_top_1_accuracy"]
    assert 0 <= straight.eval_results["train_top_1_accuracy"] <= 1
