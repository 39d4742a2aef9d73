"""Throughput fast paths keep correctness, and `torchboost bench` reports coherent numbers."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
import torch
from PIL import Image

from torchboost.bench import WAIT_WARN, BenchOptions, add_arguments, build_model, diagnose, run_bench
from torchboost.data import (IMAGENET_MEAN, IMAGENET_STD, SyntheticImages, build_loader, normalize_batch,
                             train_transform)
from torchboost.data.builtin import load_builtin
from torchboost.data.folder import ImageFolder
from torchboost.recipe.data import folder_train_transform
from torchboost.recipe.load import load_resolved
from torchboost.errors import ConfigError
from torchboost.models import create_model
from torchboost.train.model import Model
from torchboost.train.step import prepare_input


def test_bf16_channels_last_uint8_training_converges_on_mnist5k():
    torch.manual_seed(0)
    train, test = load_builtin("mnist5k", "train"), load_builtin("mnist5k", "test")
    train.uint8 = test.uint8 = True  # every fast path at once: uint8 batches normalized by the step
    net = create_model("mnist_cnn", num_classes=10, in_chans=1)
    seen = []
    net.conv2.register_forward_hook(lambda m, i, o: seen.append((o.dtype, o.is_contiguous(
        memory_format=torch.channels_last))))
    opt = torch.optim.Adam(net.parameters(), lr=2e-3, foreach=True)
    model = Model(net, torch.nn.CrossEntropyLoss(), opt, amp_dtype=torch.bfloat16,
                  channels_last=True, input_norm=(train.mean, train.std), device="cpu")
    model.train(1, build_loader(train, 32, True, seed=0))  # 125 updates
    assert seen[0] == (torch.bfloat16, True)  # the fast paths really ran
    acc = model.eval(build_loader(test, 500, False))["top_1_accuracy"]
    assert acc > 0.92, acc  # fp32 NCHW reaches 0.95 with these settings


def test_uint8_on_device_normalization_equals_float_path():
    uint8 = SyntheticImages(16, 10, 3, 32, seed=3, uint8=True)
    floats = SyntheticImages(16, 10, 3, 32, seed=3)
    uint8.set_stats(IMAGENET_MEAN, IMAGENET_STD)
    floats.set_stats(IMAGENET_MEAN, IMAGENET_STD)
    xu, _ = next(iter(build_loader(uint8, 16, False)))
    xf, _ = next(iter(build_loader(floats, 16, False)))
    assert xu.dtype == torch.uint8 and xu.element_size() * 4 == xf.element_size()
    on_device = prepare_input(xu, torch.device("cpu"), True, (IMAGENET_MEAN, IMAGENET_STD))
    m = torch.tensor(IMAGENET_MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    s = torch.tensor(IMAGENET_STD, dtype=torch.float64).view(1, 3, 1, 1)
    reference = (xu.double() / 255 - m) / s  # the formula, in float64
    assert on_device.is_contiguous(memory_format=torch.channels_last)
    assert (on_device.double() - reference).abs().max() <= 1e-6
    assert (on_device - xf).abs().max() <= 1e-6


def test_uint8_transform_then_device_normalization_equals_float_transform():
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
    as_uint8 = train_transform(24, IMAGENET_MEAN, IMAGENET_STD, uint8=True)(img, np.random.default_rng(5))
    as_float = train_transform(24, IMAGENET_MEAN, IMAGENET_STD)(img, np.random.default_rng(5))
    assert as_uint8.dtype == torch.uint8
    assert (normalize_batch(as_uint8[None], IMAGENET_MEAN, IMAGENET_STD)[0] - as_float).abs().max() <= 1e-6


@pytest.fixture(scope="module")
def jpeg_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_images")
    rng = np.random.default_rng(0)
    for c in range(2):
        (root / f"class{c}").mkdir()
        for i in range(10):
            pixels = rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"class{c}" / f"{i}.jpg", quality=90)
    return root


def test_run_bench_both_modes_on_a_tiny_model(jpeg_folder):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", "mnist_cnn", "--image-size", "28", "--batch-size", "8", "--steps", "3",
                              "--warmup", "1", "--num-classes", "10", "--data", str(jpeg_folder),
                              "--workers", "0,1", "--device", "cpu", "--precision", "bf16", "--channels-last"])
    result, table = run_bench(args)
    assert result["options"]["mode"] == "both"  # the default once a folder is given
    train = result["train"]
    assert len(train["step_s"]) == 3 and all(t > 0 for t in train["step_s"])
    assert math.isclose(train["images_per_s"], 8 / float(np.median(train["step_s"])))
    assert [row["workers"] for row in result["data"]] == [0, 1]
    assert all(0 < row["images_per_s"] < math.inf for row in result["data"])
    assert result["both"]["workers"] == 1  # the only count that overlaps loading with the step
    assert 0 <= result["both"]["data_wait_share"] <= 1 and result["both"]["images_per_s"] > 0
    # The verdict from the measured numbers (diagnose()'s rule itself is tested with known rates below): data
    # when the best worker count, over all measured ones, delivers fewer images/s than the step takes; the advice
    # names that count and its rate, and a step-bound run that waited for data says so (1 worker: not 0).
    rates = {row["workers"]: row["images_per_s"] for row in result["data"]}
    best_w = max(rates, key=rates.get)
    step_ips, best, waited = train["images_per_s"], rates[best_w], result["both"]["data_wait_share"]
    if best < step_ips:
        assert result["limiter"] == "data", result
        assert f"delivers {best:.1f} img/s at {best_w} workers" in result["advice"], result["advice"]
    else:
        assert result["limiter"] == "step", result
        assert f"{best / step_ips:.1f}x headroom at {best_w} workers" in result["advice"], result["advice"]
        assert (f"waited {waited:.0%}" in result["advice"]) == (waited > WAIT_WARN), result["advice"]
        assert ("own cores" in result["advice"]) == (waited > WAIT_WARN), result["advice"]
    assert f"limiter: {result['limiter']} — {result['advice']}" in table
    for row in result["data"]:  # every measured rate is printed in its own row
        assert f"data, {row['workers']} workers" in table and f"{row['images_per_s']:>10.1f} img/s" in table
    assert "train step" in table and table.count("data, ") == 2


def test_bench_options_refuse_data_modes_without_a_folder():
    with pytest.raises(ConfigError, match="needs an image folder"):
        run_bench({"mode": "data", "model": "mnist_cnn"})
    with pytest.raises(ConfigError, match="precision"):
        BenchOptions.from_params({"precision": "int8"})


def test_diagnose_names_the_slower_side():
    limiter, advice = diagnose(step_ips=300.0, data_ips={0: 50.0, 2: 100.0})
    assert limiter == "data"
    assert "about 6 workers" in advice  # 100 img/s from 2 workers = 50 per worker; 300 / 50 = 6
    limiter, advice = diagnose(step_ips=300.0, data_ips={0: 80.0})
    assert limiter == "data" and "about 4 workers" in advice  # the main process counts as one worker
    limiter, advice = diagnose(step_ips=100.0, data_ips={0: 60.0, 4: 250.0})
    assert limiter == "step" and "2.5x headroom at 4 workers" in advice and "waited" not in advice
    limiter, advice = diagnose(step_ips=100.0, data_ips={4: 250.0}, wait_share=0.2, e2e_workers=4)
    assert limiter == "step" and "waited 20%" in advice and "own cores" in advice
    limiter, advice = diagnose(step_ips=100.0, data_ips={0: 250.0}, wait_share=0.3, e2e_workers=0)
    assert "loading runs between steps" in advice


@pytest.mark.slow
def test_bench_reads_small_images_as_train_does(tmp_path):
    """28-px grayscale PNGs with a ResNet: native size, 1 channel, the small-input stem and the +-2 px shift a
    run would use — not 224-px ImageNet crops (minutes per step on such data)."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in range(2):
            (tmp_path / split / str(c)).mkdir(parents=True)
            for i in range(8):
                pixels = rng.integers(0, 256, (28, 28), dtype=np.uint8)
                Image.fromarray(pixels, "L").save(tmp_path / split / str(c) / f"{i}.png")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", "resnet18", "--batch-size", "4", "--steps", "2", "--warmup", "1",
                              "--num-classes", "2", "--data", str(tmp_path), "--workers", "0", "--device", "cpu"])
    result, table = run_bench(args)
    assert result["data_config"] == {"path": str(tmp_path / "train"), "image_size": 28, "channels": 1,
                                     "augment": "shift", "random_shift": 2}
    assert result["options"]["image_size"] == 28 and result["options"]["channels"] == 1 and result["small_input"]
    assert "resnet18 (small-input stem) 28px" in table and "28 px, 1 channel(s), augment shift by up to 2 px" in table
    cfg, train_ds, _ = load_resolved(None, ["data.dataset=folder", f"data.path={tmp_path}", "model.name=resnet18"])
    assert (cfg.data.image_size, cfg.data.channels, cfg.data.augment, cfg.data.random_shift, cfg.model.small_input) \
        == (28, 1, "shift", 2, True)  # what `train` resolves for the same folder
    x, _ = ImageFolder(tmp_path / "train", folder_train_transform(cfg.data, "resnet18"))[0]
    assert x.shape == (1, 28, 28)
    model = build_model(BenchOptions(model="resnet18", image_size=28, channels=1, num_classes=2), torch.device("cpu"))
    assert model.network.conv1.stride == (1, 1)  # the 3x3 stride-1 stem, as train builds it
