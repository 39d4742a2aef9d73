"""LR generators against their closed-form formulas, written independently here."""

import math

import numpy as np
import pytest

from torchboost.optim.schedules import build_lr_schedule, poly_lr, seed_cosine_lr, step_lr, warmup_cosine_lr


def test_seed_cosine_matches_formula():
    total, warm, lr_init, lr_max = 50, 5, 0.01, 0.4
    lrs = seed_cosine_lr(lr_init, lr_max, total, warm)
    for i in range(total):
        if i < warm:
            expect = lr_init + (lr_max - lr_init) / warm * (i + 1)
        else:
            d = total - warm
            expect = lr_max * ((total - i) / d * 0.5 * (1 + math.cos(math.pi * 2 * 0.47 * i / d)) + 1e-5)
        assert lrs[i] == pytest.approx(expect, rel=1e-12)


def test_warmup_cosine_endpoints():
    lrs = warmup_cosine_lr(0.0, 1.0, 0.1, 100, 10)
    assert lrs[9] == pytest.approx(1.0)  # warmup ends exactly at lr_max
    assert lrs[10] == pytest.approx(1.0)
    assert lrs[55] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.5)))
    assert np.all(np.diff(lrs[10:]) <= 1e-12)


def test_step_and_poly():
    lrs = step_lr(1.0, 10, [3, 6], 0.1)
    np.testing.assert_allclose(lrs, [1, 1, 1, 0.1, 0.1, 0.1, 0.01, 0.01, 0.01, 0.01])
    p = poly_lr(0.0, 2.0, 0.0, 10, 0, power=2.0)
    np.testing.assert_allclose(p, [2.0 * (1 - i / 10) ** 2 for i in range(10)])


def test_build_in_epochs():
    lrs = build_lr_schedule("step", 0.5, 40, 10, milestones=[2, 3])
    assert lrs[19] == 0.5 and lrs[20] == pytest.approx(0.05) and lrs[30] == pytest.approx(0.005)
    assert len(build_lr_schedule("constant", 0.1, 7, 7)) == 7
