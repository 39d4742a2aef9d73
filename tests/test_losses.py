import torch

from torchboost.losses import CrossEntropySmooth


def test_mindspore_smoothing_target():
    torch.manual_seed(0)
    logits, y = torch.randn(6, 5, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 4, 0])
    s, k = 0.1, 5
    # MindSpore: on = 1 - s, off = s / (k - 1)
    target = torch.full((6, k), s / (k - 1), dtype=torch.float64)
    target[torch.arange(6), y] = 1 - s
    expect = -(target * torch.log_softmax(logits, 1)).sum(1).mean()
    got = CrossEntropySmooth(smooth_factor=s, num_classes=k)(logits, y)
    assert torch.allclose(got.double(), expect, rtol=1e-6)


def test_no_smoothing_is_cross_entropy_and_reductions():
    logits, y = torch.randn(4, 3), torch.tensor([2, 0, 1, 1])
    ce = torch.nn.functional.cross_entropy(logits, y, reduction="none")
    assert torch.allclose(CrossEntropySmooth(num_classes=3, reduction="none")(logits, y), ce)
    assert torch.allclose(CrossEntropySmooth(num_classes=3, reduction="sum")(logits, y), ce.sum())
