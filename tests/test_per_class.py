"""What every run shows (issue: per-class results, the test split at the end, --threads): per-class figures
against scikit-learn on a fixed prediction set, the confusion picture read back at 120 classes, the test split
evaluated once at the end without touching any choice (and equal to `eval --split test`), and --threads
reaching torch and config.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from torchboost.cli import main
from torchboost.recipe.per_class import per_class_report, write_per_class
from torchboost.train.per_class import ClassTally

QUIET = ["--set", "train.progress_bar=false", "--set", "train.log_every=1000"]


def fixed_predictions(k: int = 5, n: int = 400, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    logits = rng.normal(0, 1, (n, k))
    logits[np.arange(n), y] += rng.uniform(0, 3, n)  # mostly right, some wrong, class 4 never predicted
    logits[:, 4] -= 10
    return torch.tensor(logits), torch.tensor(y)


def test_per_class_figures_match_scikit_learn():
    from sklearn.metrics import confusion_matrix, precision_recall_fscore_support

    logits, y = fixed_predictions()
    tally = ClassTally(5)
    for i in range(0, len(y), 64):  # batches, as an evaluation feeds it
        tally.update(logits[i:i + 64], y[i:i + 64])
    pred = logits.argmax(1).numpy()
    assert (tally.confusion() == confusion_matrix(y.numpy(), pred, labels=range(5))).all()
    p, r, f, s = precision_recall_fscore_support(y.numpy(), pred, labels=range(5), zero_division=0)
    got = tally.scores()
    assert np.allclose([g.precision for g in got], p) and np.allclose([g.recall for g in got], r)
    assert np.allclose([g.f1 for g in got], f) and [g.support for g in got] == s.tolist()
    off = confusion_matrix(y.numpy(), pred, labels=range(5))
    np.fill_diagonal(off, 0)
    (t, q, c), *_ = tally.confused_pairs(3)
    assert c == off.max() and off[t, q] == c
    probs = torch.softmax(logits, 1).max(1).values.numpy()
    worst = tally.worst(5)
    wrong = np.flatnonzero(pred != y.numpy())
    assert [w[0] for w in worst] == wrong[np.argsort(-probs[wrong], kind="stable")][:5].tolist()


def test_the_confusion_picture_stays_readable_at_120_classes(tmp_path):
    k = 120
    rng = np.random.default_rng(1)
    y = torch.tensor(rng.integers(0, k, 3000))
    logits = torch.tensor(rng.normal(0, 1, (3000, k)))
    logits[torch.arange(3000), y] += 2.5
    tally = ClassTally(k)
    tally.update(logits, y)
    classes = [f"class_{i:03d}" for i in range(k)]
    files = write_per_class(per_class_report(tally, classes), tmp_path, "120 classes", pytest.fail)
    with Image.open(tmp_path / "confusion.png") as img:
        assert img.format == "PNG" and 1000 <= img.width <= 2500 and img.height == img.width
    rows = (tmp_path / "confusion.csv").read_text().splitlines()
    assert len(rows) == k + 1 and rows[0].split(",")[1] == "class_000"
    report = json.loads((tmp_path / "per_class.json").read_text())
    assert np.asarray(report["confusion"]).sum() == 3000 and len(files) == 4


def folder(root: Path, n: int = 10) -> Path:
    rng = np.random.default_rng(0)
    for split, count in (("train", n), ("val", 4), ("test", 6)):
        for k in range(3):
            (root / split / f"c{k}").mkdir(parents=True, exist_ok=True)
            for i in range(count):
                a = rng.normal(40 + 80 * k, 20, (12, 12)).clip(0, 255).astype(np.uint8)
                Image.fromarray(a, "L").save(root / split / f"c{k}" / f"{i}.png")
    return root


@pytest.mark.slow
def test_the_test_split_is_evaluated_once_at_the_end_and_chooses_nothing(tmp_path, capsys):
    data = folder(tmp_path / "d")
    runs = {}
    for flag in ("true", "false"):
        out = tmp_path / f"run-{flag}"
        assert main(["train", "--data", str(data), "--epochs", "3", "-o", str(out), "--set",
                     f"train.test_at_end={flag}", *QUIET]) == 0
        runs[flag] = (out, capsys.readouterr().out)
    (on, said), (off, _) = runs["true"], runs["false"]
    rows_on = [json.loads(r) for r in (on / "history.jsonl").read_text().splitlines()]
    rows_off = [json.loads(r) for r in (off / "history.jsonl").read_text().splitlines()]
    strip = lambda r: {k: v for k, v in r.items() if not k.startswith("test_") and k not in  # noqa: E731
                       ("train_time_s", "data_wait_ms", "step_ms", "data_wait_share")}
    assert [strip(r) for r in rows_on] == [strip(r) for r in rows_off]  # the epochs saw nothing of it
    assert (on / "ckpt" / "resnet20-best.pt").read_bytes() != b"" and "test_top_1_accuracy" in rows_on[-1]
    assert all("test_top_1_accuracy" not in r for r in rows_on[:-1]) and not (off / "test").exists()
    best_on = torch.load(on / "ckpt" / "resnet20-best.pt", weights_only=True)["model"]
    best_off = torch.load(off / "ckpt" / "resnet20-best.pt", weights_only=True)["model"]
    assert all(torch.equal(best_on[k], best_off[k]) for k in best_on)
    assert "test (never used for any choice): top-1" in said
    assert main(["eval", "--checkpoint", str(on / "ckpt" / "resnet20-best.pt"), "--split", "test",
                 "--format", "json"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert rows_on[-1]["test_top_1_accuracy"] == pytest.approx(evaluated["top_1_accuracy"], abs=1e-12)
    report = json.loads((on / "test" / "per_class.json").read_text())
    assert report["per_class"] == evaluated["per_class"]["per_class"]
    assert sum(r["support"] for r in report["per_class"]) == 18


def test_threads_reach_torch_and_the_resolved_config(tmp_path, capsys):
    before = torch.get_num_threads()
    try:
        out = tmp_path / "run"
        assert main(["train", "-c", "digits-lenet", "--epochs", "1", "-b", "512", "--threads", "1", "-o", str(out),
                     *QUIET]) == 0
        assert yaml.safe_load((out / "config.yaml").read_text())["train"]["threads"] == 1
        torch.set_num_threads(2)
        assert main(["eval", "--checkpoint", str(out / "ckpt" / "mnist_cnn-best.pt"), "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
