"""get_thor_lr / get_thor_damping against MindSpore's model-zoo formulas written out as plain loops."""

import numpy as np
import pytest

from torchboost.errors import ConfigError
from torchboost.optim.thor.schedules import get_thor_damping, get_thor_lr


def zoo_lr(lr_init, decay, total_epochs, steps_per_epoch, decay_epochs):
    out = []
    for i in range(total_epochs * steps_per_epoch):
        e = (i + 1) / steps_per_epoch
        lr = lr_init * (1.0 - e / total_epochs) ** decay
        lr = lr * 0.5 if e >= decay_epochs else lr
        lr = lr * 0.5 if e >= decay_epochs + 1 else lr
        out.append(lr)
    return np.array(out).astype(np.float32)


def test_lr_matches_formula_gpu_recipe():
    # resnet50 GPU THOR recipe: lr_init 0.05672, lr_decay 4.9687, lr_end_epoch 50, decay_epochs 39
    lr = get_thor_lr(0, 0.05672, 4.9687, 50, 20, decay_epochs=39)
    assert lr.dtype == np.float32 and lr.shape == (1000,)
    np.testing.assert_array_equal(lr, zoo_lr(0.05672, 4.9687, 50, 20, 39))
    # spot values: the first update (e = 1/20), and both halvings (e = 39 then 40) on top of the decay
    assert lr[0] == np.float32(0.05672 * (1 - 1 / 20 / 50) ** 4.9687)
    i39, i40 = 39 * 20 - 1, 40 * 20 - 1
    assert lr[i39] == np.float32(0.05672 * (1 - 39 / 50) ** 4.9687 * 0.5)
    assert lr[i40] == np.float32(0.05672 * (1 - 40 / 50) ** 4.9687 * 0.25)
    assert lr[-1] == 0.0  # decays to exactly 0 at total_epochs


def test_lr_global_step_returns_the_tail_and_default_decay_epochs():
    full = get_thor_lr(0, 0.1, 2.0, 5, 7)
    np.testing.assert_array_equal(get_thor_lr(12, 0.1, 2.0, 5, 7), full[12:])
    np.testing.assert_array_equal(full, zoo_lr(0.1, 2.0, 5, 7, 100))  # decay_epochs=100: no halving


def test_damping_matches_formula():
    d = get_thor_damping(0, 0.02345, 0.5467, 70, 13)
    ref = np.array([0.02345 * 0.5467 ** (((i + 1) / 13) / 10) for i in range(70 * 13)]).astype(np.float32)
    assert d.dtype == np.float32
    np.testing.assert_array_equal(d, ref)
    np.testing.assert_array_equal(get_thor_damping(5, 0.02345, 0.5467, 70, 13), ref[5:])
    assert d[10 * 13 - 1] == np.float32(0.02345 * 0.5467)  # one decay_rate factor per 10 epochs


def test_bad_arguments_raise_config_error():
    with pytest.raises(ConfigError):
        get_thor_lr(0, 0.1, 2.0, 0, 10)
    with pytest.raises(ConfigError):
        get_thor_damping(0, 0.1, 0.5, 10, 0)
