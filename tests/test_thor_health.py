"""THOR's health report (`optim.thor.health`): its numbers against float64 numpy eigenvalues of the dense factors
(`thor_nets.dense_factors`) and the damping formulas, the measured fact it exists for (MindSpore's absolute damping
leaves G inert on a small BatchNorm CNN; trace damping does not), EKFAC's dominated divisor, and where it is
written (the training callback's line and file, race --trace's rows)."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from test_thor_variants import LAM, data, make_net
from thor_nets import bn_convnet, dense_factors, run_updates
from torchboost.optim.registry import OptimizerArgs, build_optimizer
from torchboost.optim.thor import THOR, ThorOptions
from torchboost.optim.thor.health import health_summary, health_warning, thor_health
from torchboost.race.trace import layer_trace, traced_weights
from torchboost.train.thor_health import HEALTH_FILE, ThorHealthMonitor


@pytest.mark.parametrize("mode", ["absolute", "trace"])
def test_the_report_is_the_dense_factors_eigenvalues_against_the_damping(mode):
    net = make_net()
    x, y = data(0)
    want = dense_factors(net, x, y)
    opt = THOR(net, 0.0, damping=LAM, damping_mode=mode, split_dim=None)
    F.cross_entropy(net(x), y).backward()
    opt.step()
    report = {r.name: r for r in thor_health(opt)}
    assert set(report) == {"0", "4"}
    for name, (A, G, t, _) in want.items():
        for side, f in zip(report[name].sides, (A, G)):
            evals = np.clip(np.linalg.eigvalsh(f), 0, None)
            d = math.sqrt(LAM / t) if mode == "absolute" else LAM * np.trace(f) / len(f)
            np.testing.assert_allclose([side.eig_min, side.eig_mean, side.eig_max],
                                       [evals.min(), evals.mean(), evals.max()], rtol=1e-9, atol=1e-15)
            np.testing.assert_allclose(side.damping, d, rtol=1e-9)
            np.testing.assert_allclose(side.ratio, d / evals.mean(), rtol=1e-9)
            assert side.dominated == np.mean(evals < d)
        assert report[name].divisor is None


def test_mindspores_absolute_damping_leaves_the_convs_g_inert_and_trace_damping_does_not():
    """DESIGN's measured fact (ResNet-20) at small scale: at THOR's default damping (0.03, absolute sqrt(damping/T))
    each conv's G is below the damping in every direction while its A is not, and only the classifier's G
    preconditions; damping relative to each factor leaves no side inert."""
    shares = {}
    for mode in ("absolute", "trace"):
        net = bn_convnet()
        opt = THOR(net, 0.05, ThorOptions(damping_mode=mode))
        run_updates(net, opt, 2)
        report = thor_health(opt)
        shares[mode] = [(r.sides[0].dominated, r.sides[1].dominated) for r in report]
        if mode == "absolute":
            convs, classifier = report[:2], report[2]
            assert all(r.inert() == ["G"] for r in convs) and classifier.inert() == [], shares
            assert all(r.sides[1].ratio > 100 for r in convs)  # G's damping over its mean eigenvalue
            warning = health_warning(report)
            assert warning.startswith("warning: THOR's damping dominates more than 95% of G's eigen-directions in "
                                      "2/3 layers (0, 3)")
            assert "inert in 2/3 layers" in health_summary(report).split("G:")[1]
        else:
            assert not any(r.inert() for r in report), shares
            assert health_warning(report) is None
            assert all(r.sides[1].dominated <= 0.2 for r in report)


def test_ekfacs_absolute_epsilon_dominates_its_moment_and_the_relative_one_does_not():
    """thor_ekfac's divisor s + 0.1 (absolute) against s + 0.1 mean(s) (trace), after 6 updates of the moment."""
    report = {}
    for mode in ("absolute", "trace"):
        net = bn_convnet()
        opt = build_optimizer("thor_ekfac", net, OptimizerArgs(lr=0.01, options=ThorOptions(damping=0.1,
                                                                                           damping_mode=mode)))
        run_updates(net, opt, 6)
        report[mode] = thor_health(opt)
        for r in report[mode]:
            s = opt.layers[r.name].eigen.s.double()
            eps = 0.1 * s.mean() if mode == "trace" else 0.1
            assert r.divisor.kind == "s" and r.divisor.dominated == float((s < eps).double().mean())
            assert r.sides[0].dominated is None  # EKFAC damps no factor
    assert all(r.divisor.inert for r in report["absolute"][:2])  # the convs
    assert not any(r.divisor.inert for r in report["trace"])
    assert "the divisor's coordinates" in health_warning(report["absolute"])


def test_thor_soaps_divisor_is_reported():
    net = bn_convnet()
    opt = build_optimizer("thor_soap", net, OptimizerArgs(lr=0.01, options=ThorOptions(damping=1.0)))
    run_updates(net, opt, 3)
    report = thor_health(opt)
    assert [r.divisor.kind for r in report] == ["sqrt(v)"] * 3
    assert all(r.divisor.inert for r in report)  # Adam's epsilon of 1 swamps every root moment


def test_the_training_callback_logs_a_line_an_epoch_and_writes_the_file(tmp_path):
    net = bn_convnet()
    opt = THOR(net, 0.05)
    lines = []
    state = SimpleNamespace(model=SimpleNamespace(optimizer=opt), epoch=0, log=lines.append)
    monitor = ThorHealthMonitor(tmp_path)
    monitor.on_train_begin(state)
    for epoch in range(2):
        run_updates(net, opt, 1)
        state.epoch = epoch
        monitor.on_train_epoch_end(state)
    assert lines[0].startswith("THOR health: A: damping dominates") and lines[1].startswith("warning: THOR's")
    assert len(lines) == 4  # a summary and a warning each epoch
    rows = [json.loads(l) for l in (tmp_path / HEALTH_FILE).read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2] and rows[0]["layers"][0]["sides"][1]["inert"] is True
    state.epoch = 1  # a resume after epoch 1 keeps its row
    resumed = ThorHealthMonitor(tmp_path)
    resumed.on_train_begin(state)
    assert [r["epoch"] for r in resumed.records] == [1]
    path = tmp_path / HEALTH_FILE  # a line nested past the parser's stack ends what is kept, as damage does
    path.write_text(path.read_text().splitlines()[0] + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    again = ThorHealthMonitor(tmp_path)
    again.on_train_begin(state)
    assert [r["epoch"] for r in again.records] == [1]
    plain = SimpleNamespace(model=SimpleNamespace(optimizer=torch.optim.SGD(net.parameters(), 0.1)), epoch=0,
                            log=lines.append)
    ThorHealthMonitor(tmp_path / "sgd").on_train_epoch_end(plain)  # silent, no file, for other optimizers
    assert len(lines) == 4 and not (tmp_path / "sgd").exists()


def test_race_trace_rows_carry_the_report():
    net = bn_convnet()
    opt = THOR(net, 0.05)
    run_updates(net, opt, 1)
    row = layer_trace(net, traced_weights(net), opt)
    assert row["health_summary"].startswith("THOR health:") and len(row["health"]) == 3
    json.dumps(row)
    sgd = torch.optim.SGD(net.parameters(), 0.1)
    assert "health" not in layer_trace(net, traced_weights(net), sgd)
