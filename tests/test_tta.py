"""Test-time augmentation (flip, flip_translate) against float64 computations by hand, through eval and an ONNX
export."""

from __future__ import annotations

import pytest
import torch

from torchboost.models import create_model
from torchboost.train.tta import FlipTTA, FlipTranslateTTA, with_tta


def test_flip_tta_is_the_mean_of_the_image_and_its_mirror_in_float64():
    torch.manual_seed(0)
    net = create_model("resnet20", num_classes=5).double().eval()
    x = torch.randn(3, 3, 16, 16, dtype=torch.float64)
    mirrored = torch.stack([img[:, :, torch.arange(15, -1, -1)] for img in x])  # columns reversed, by index
    with torch.no_grad():
        want = (net(x) + net(mirrored)) / 2
        got = FlipTTA(net)(x)
    assert torch.allclose(got, want, rtol=0, atol=1e-12)
    assert with_tta(net, "none") is net
    with pytest.raises(ValueError, match="unknown test-time augmentation"):
        with_tta(net, "crop")


def test_flip_translate_is_airbenchs_six_views_by_index_in_float64():
    torch.manual_seed(0)
    net = create_model("airbench", num_classes=4, in_chans=1).double().eval()
    x = torch.randn(2, 1, 17, 19, dtype=torch.float64)

    def moved(img: torch.Tensor, d: int) -> torch.Tensor:  # row r, column c of the image moved by d: x[r - d, c - d]
        h, w = img.shape[-2:]  # reflected at the border: index -1 is 1, index h is h - 2
        rows = torch.tensor([abs(r) if r < h else 2 * (h - 1) - r for r in range(-d, h - d)])
        cols = torch.tensor([abs(c) if c < w else 2 * (w - 1) - c for c in range(-d, w - d)])
        return img[..., rows[:, None], cols[None, :]]

    def flip_mean(v: torch.Tensor) -> torch.Tensor:
        return (net(v) + net(v[..., torch.arange(v.shape[-1] - 1, -1, -1)])) / 2

    with torch.no_grad():
        want = flip_mean(x) / 2 + (flip_mean(moved(x, 1)) + flip_mean(moved(x, -1))) / 4
        got = with_tta(net, "flip_translate")(x)
    assert isinstance(with_tta(net, "flip_translate"), FlipTranslateTTA)
    assert torch.allclose(got, want, rtol=0, atol=1e-12)
    assert not torch.allclose(got, FlipTTA(net)(x), atol=1e-6)  # the translated views change the logits


@pytest.mark.slow
def test_eval_tta_reaches_validation_eval_predict_and_the_export(tmp_path, capsys):
    """flip_translate, whose six views hold flip's two: the mode through train, eval, predict and an ONNX export (its
    reflect padding included); flip itself against float64 above."""
    mode = "flip_translate"
    import json

    from PIL import Image

    from torchboost.cli import main
    from torchboost.data import load_builtin
    from torchboost.recipe.build import build_model
    from torchboost.recipe.config import build_config

    out = tmp_path / "run"
    assert main(["train", "-c", "digits-lenet", "--epochs", "1", "-b", "256", "-o", str(out), "--set",
                 f"eval.tta={mode}", "--set", "train.progress_bar=false"]) == 0
    ckpt = out / "ckpt" / "mnist_cnn-best.pt"
    state = torch.load(ckpt, weights_only=True)
    net = build_model(build_config(state["config"]))
    net.load_state_dict(state["model"])
    net.eval()
    test = load_builtin("digits", "test")
    x = (test.images.float() / 255 - torch.tensor(test.mean).view(1, -1, 1, 1)) / torch.tensor(test.std).view(1, -1, 1, 1)
    with torch.no_grad():
        plain, averaged = net(x), with_tta(net, mode)(x)
    want = int(averaged.argmax(1).eq(test.labels).sum()) / len(test.labels)
    assert want != int(plain.argmax(1).eq(test.labels).sum()) / len(test.labels)  # the views change the count
    history = [json.loads(r) for r in (out / "history.jsonl").read_text().splitlines()]
    assert history[-1]["val_top_1_accuracy"] == pytest.approx(want, abs=1e-12)
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(ckpt), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["top_1_accuracy"] == pytest.approx(want, abs=1e-12)
    png = tmp_path / "7.png"
    Image.fromarray(test.images[0, 0].numpy()).save(png)
    onnx = tmp_path / "m.onnx"
    assert main(["export", str(ckpt), str(onnx)]) == 0
    probs = {}
    for source in (ckpt, onnx):
        capsys.readouterr()
        assert main(["predict", "--checkpoint", str(source), str(png), "--format", "json", "--topk", "10"]) == 0
        probs[source] = {t["class"]: t["probability"] for t in json.loads(capsys.readouterr().out)[0]["top"]}
    p = torch.softmax(averaged[0], 0)
    for k in range(10):
        assert probs[ckpt][str(k)] == pytest.approx(float(p[k]), abs=1e-5)
        assert probs[onnx][str(k)] == pytest.approx(probs[ckpt][str(k)], abs=1e-4)


def test_a_race_evaluates_with_the_recipes_tta():
    """`race --set eval.tta=flip`: every lane's evaluation counts the flip-averaged logits' top-1, as eval does."""
    import torch
    from torch import nn

    from torchboost.race.lanes import Lane

    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(2 * 5 * 5, 3))  # not mirror-symmetric: the two counts differ
    x, y = torch.randn(64, 2, 5, 5), torch.randint(0, 3, (64,))
    with torch.no_grad():
        plain = (net(x).argmax(1) == y).float().mean().item()
        flipped = ((net(x) + net(x.flip(-1))).argmax(1) == y).float().mean().item()
    assert plain != flipped
    lanes = {mode: Lane("sgd", 0.1, 0, net, None, None, tta=mode) for mode in ("none", "flip")}
    assert lanes["none"].evaluate([(x, y)]) == plain and lanes["flip"].evaluate([(x, y)]) == flipped
