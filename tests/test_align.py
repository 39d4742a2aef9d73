"""align: comparison metrics, pass rule, planted divergences, single-step mode, dump directories."""

import copy
import json

import numpy as np
import pytest
import torch
from torch import nn

from torchboost.errors import ConfigError, DataError
from torchboost.migrate.align import NameMap, align_dump, align_modules, dump_step, load_reference
from torchboost.migrate.dump import read_dump_steps
from torchboost.recipe.align import align_from_config
from torchboost.migrate.compare import compare_tensors, judge
from torchboost.models import create_model


def mnist_cnn(seed=0):
    torch.manual_seed(seed)
    return create_model("mnist_cnn", num_classes=10, in_chans=1, image_size=16)


def batch(n=8, size=16, chans=1, classes=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, chans, size, size, generator=g), torch.randint(0, classes, (n,), generator=g)


class TinyBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.relu(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


def tiny_bn_low_variance():
    """Half of bn2's input channels have a tiny variance: exactly where BN eps matters."""
    torch.manual_seed(0)
    m = TinyBN()
    with torch.no_grad():
        m.conv2.weight[:4] *= 3e-3
    return m


def perturb_conv2(ref):
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        ref.conv2.weight.add_(1e-2 * torch.randn(ref.conv2.weight.shape, generator=g))


# --- metrics and pass rule -----------------------------------------------------------------------------

def test_metrics_match_numpy():
    rng = np.random.default_rng(0)
    b = rng.standard_normal(5000).astype(np.float32)
    a = (b + rng.standard_normal(5000) * 1e-3).astype(np.float32)
    a[:10] = b[:10] = 0.0  # 0/0 must count as relative error 0
    m = compare_tensors(torch.from_numpy(a), torch.from_numpy(b))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    diff = np.abs(a64 - b64)
    rel = np.divide(diff, np.abs(b64), out=np.zeros_like(diff), where=diff != 0)
    assert m.cosine == pytest.approx(a64 @ b64 / np.linalg.norm(a64) / np.linalg.norm(b64), abs=1e-12)
    assert m.max_abs == pytest.approx(diff.max(), rel=1e-12)
    assert m.max_rel == pytest.approx(rel.max(), rel=1e-12)
    assert m.rel_lt_1e3 == pytest.approx(np.mean(rel < 1e-3))
    assert m.rel_lt_5e3 == pytest.approx(np.mean(rel < 5e-3))
    assert m.allclose == pytest.approx(np.mean(np.isclose(a64, b64, rtol=1e-4, atol=1e-4)))


def test_pass_rule():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, generator=g, dtype=torch.float64)
    noise = torch.randn(1000, generator=g, dtype=torch.float64)
    cases = {
        "identical": (x, x.clone(), True),
        "tiny noise": (x + 1e-6 * noise, x, True),
        "cosine < 0.9": (x + 0.6 * noise, x, False),
        "max abs > 1 with cosine ~1": (x + torch.nn.functional.one_hot(torch.tensor(3), 1000) * 1.5, x, False),
        # cosine ~0.96 but every difference is tiny in absolute terms: passes ...
        "small cos, small abs": (1e-5 * (x + 0.3 * noise), 1e-5 * x, True),
        # ... and the same shapes at a larger scale fail (cos < 0.99 and max abs > 1e-3)
        "small cos, large abs": (1e-2 * (x + 0.3 * noise), 1e-2 * x, False),
        "shape": (x[:10], x[:11], False),
    }
    for name, (a, b, expected) in cases.items():
        assert judge(compare_tensors(a, b))[0] is expected, name
    nan_one = x.clone()
    nan_one[7] = float("nan")
    assert judge(compare_tensors(nan_one, x)) == (False, "NaN/inf on one side only")
    assert judge(compare_tensors(nan_one, nan_one.clone()))[0]  # NaN at the same place on both sides
    inf_pos, inf_neg = x.clone(), x.clone()
    inf_pos[0], inf_neg[0] = float("inf"), float("-inf")
    assert not judge(compare_tensors(inf_pos, inf_neg))[0]


# --- module vs module ----------------------------------------------------------------------------------

def test_identical_models_pass_cleanly():
    ours = mnist_cnn(0)
    report = align_modules(ours, mnist_cnn(1), batch())  # different init: the weight copy must equalise them
    assert report.passed and report.first_failure is None
    assert all(it.metrics.max_abs == 0 for it in report.items)
    stages = [(it.step, it.stage) for it in report.items]
    # per training step (3 by default): conv1 relu pool conv2 relu#2 pool#2 fc (root), loss, 6 gradients, 6 updates
    one = ["forward"] * 8 + ["loss"] + ["backward"] * 6 + ["update"] * 6
    assert report.steps == 3 and stages == [(k, stage) for k in (1, 2, 3) for stage in one]
    assert [it.ours for it in report.items[:8]] == ["conv1", "relu", "pool", "conv2", "relu#2", "pool#2", "fc", "(root)"]
    assert [it.ours for it in report.items[9:11]] == ["fc.weight", "fc.bias"]  # backward runs last layer first
    assert "PASS" in report.table()
    # the caller's modules are untouched (align works on copies)
    assert not torch.equal(ours.conv1.weight, mnist_cnn(1).conv1.weight)


def test_planted_conv_perturbation_names_the_module():
    report = align_modules(mnist_cnn(), mnist_cnn(), batch(), prepare_reference=perturb_conv2)
    first = report.first_failure
    assert (first.stage, first.ours, first.ref) == ("forward", "conv2", "conv2")
    assert all(it.passed for it in report.items[:3])  # conv1, relu, pool before it
    data = json.loads(json.dumps(report.to_dict()))  # standard JSON (inf written as a string)
    assert data["passed"] is False and data["first_failure"]["ours"] == "conv2"


def test_name_map_reports_both_paths():
    """Reference with other names (an unrolled Sequential): the map pairs modules and copies weights."""
    torch.manual_seed(3)
    ref = nn.Sequential(nn.Conv2d(1, 20, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(20, 20, 5, padding=2),
                        nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(320, 10))
    tensors = {f"{ours}.{leaf}": f"{theirs}.{leaf}" for ours, theirs in (("conv1", "0"), ("conv2", "3"), ("fc", "7"))
               for leaf in ("weight", "bias")}
    nm = NameMap(tensors, modules={"relu": "1", "pool": "2", "relu#2": "4", "pool#2": "5"})

    def perturb(r):
        with torch.no_grad():
            r[3].weight.add_(1e-2)

    assert align_modules(mnist_cnn(), ref, batch(), name_map=nm).passed
    report = align_modules(mnist_cnn(), ref, batch(), name_map=nm, prepare_reference=perturb)
    assert (report.first_failure.ours, report.first_failure.ref) == ("conv2", "3")
    assert [it.ref for it in report.items if it.stage == "forward" and it.step == 1] == ["0", "1", "2", "3", "4", "5",
                                                                                         "7", "(root)"]
    with pytest.raises(ConfigError, match="name map"):
        align_modules(mnist_cnn(), ref, batch())  # no map: the reference's weights have no source


def test_bn_eps_change_names_the_bn():
    def mindspore_eps(ref):
        ref.bn2.eps = 1e-4  # MindSpore's zoo BN eps instead of torch's 1e-5
    report = align_modules(tiny_bn_low_variance(), TinyBN(), batch(chans=3, classes=5, size=8),
                           prepare_reference=mindspore_eps)
    assert (report.first_failure.stage, report.first_failure.ours) == ("forward", "bn2")


def test_single_step_localises_the_divergence():
    x = batch()
    full = align_modules(mnist_cnn(), mnist_cnn(), x, prepare_reference=perturb_conv2)
    single = align_modules(mnist_cnn(), mnist_cnn(), x, prepare_reference=perturb_conv2, single_step=True)
    failing = lambda r: [it.ours for it in r.items if it.stage == "forward" and not it.passed]  # noqa: E731
    assert failing(full)[0] == "conv2" and len(failing(full)) > 1  # the error propagates downstream ...
    assert failing(single) == ["conv2"] * 3  # ... unless each module is fed our module's inputs (at every step)
    assert single.first_failure.ours == "conv2"
    assert [it.passed for it in single.items if it.stage == "loss"] == [True] * 3


def test_name_map_for_mindspore_resnet():
    nm = NameMap.mindspore_resnet("resnet50")
    assert nm.tensor("bn1.weight") == "bn1.gamma" and nm.tensor("fc.weight") == "end_point.weight"
    assert nm.module("fc") == "end_point"
    assert nm.module("layer1.0.downsample.1#2") == "layer1.0.down_sample_layer.1#2"


def sgd(momentum):
    return lambda m: torch.optim.SGD(m.parameters(), lr=0.01, momentum=momentum, weight_decay=1e-4)


def test_a_momentum_difference_fails_from_the_second_step():
    """Momentum 0.9 against 0.5, all else equal: SGD's buffer starts as the first gradient whatever the momentum,
    so step 1 agrees exactly and step 2's updates differ by lr * (0.9 - 0.5) * the first step's buffer
    (computed here by hand); one step alone would pass it."""
    x = batch()
    report = align_modules(mnist_cnn(), mnist_cnn(), x, optimizer=sgd(0.9), reference_optimizer=sgd(0.5))
    assert not report.passed and report.steps == 3
    assert all(it.passed for it in report.items if it.step == 1)
    first = report.first_failure
    assert (first.step, first.stage) == (2, "update")
    assert "step 2 update" in report.summary()
    # by hand: the two runs' 2nd updates differ by lr * 0.4 * buf1, buf1 = g1 + wd * w0 (the weights are equal
    # before step 2, so its gradient is the same on both sides)
    m = mnist_cnn()
    w0 = m.fc.weight.detach().clone()
    torch.nn.functional.cross_entropy(m(x[0]), x[1]).backward()
    buf1 = m.fc.weight.grad + 1e-4 * w0
    ours_m, ref_m = copy.deepcopy(mnist_cnn()), copy.deepcopy(mnist_cnn())
    from torchboost.migrate.align import record_steps
    a = record_steps(ours_m, x, nn.CrossEntropyLoss(), sgd(0.9)(ours_m), 2, 0)
    b = record_steps(ref_m, x, nn.CrossEntropyLoss(), sgd(0.5)(ref_m), 2, 0)
    assert torch.equal(a[0].updates["fc.weight"], b[0].updates["fc.weight"])
    torch.testing.assert_close(b[1].updates["fc.weight"] - a[1].updates["fc.weight"], 0.01 * 0.4 * buf1,
                               rtol=1e-3, atol=5e-8)  # w_after - w_before in fp32
    assert align_modules(mnist_cnn(), mnist_cnn(), x, optimizer=sgd(0.9), reference_optimizer=sgd(0.5),
                         steps=1).passed  # what one step alone said: why align runs several
    assert align_modules(mnist_cnn(), mnist_cnn(), x, optimizer=sgd(0.9), reference_optimizer=sgd(0.9)).passed


@pytest.mark.slow
def test_align_from_recipes_fails_a_planted_momentum_by_default():
    """`torchboost align --reference-config R --reference-set optim.momentum=0.5` (R's momentum 0.9): exit 1 by
    default, naming step 2's update; the same recipe on both sides passes."""
    from torchboost.cli import main

    assert main(["align", "-c", "digits-lenet", "--reference-config", "digits-lenet", "--failures-only"]) == 0
    assert main(["align", "-c", "digits-lenet", "--reference-config", "digits-lenet", "--reference-set",
                 "optim.momentum=0.5", "--failures-only"]) == 1
    report = align_from_config("digits-lenet", reference_config="digits-lenet",
                               reference_overrides=["optim.momentum=0.5"], batch_size=4)
    assert not report.passed and (report.first_failure.step, report.first_failure.stage) == (2, "update")
    assert align_from_config("digits-lenet", reference_config="digits-lenet",
                             reference_overrides=["optim.momentum=0.5"], batch_size=4, steps=1).passed


# --- dump directories ----------------------------------------------------------------------------------

def test_dump_layout_holds_the_step(tmp_path):
    model, (x, y) = mnist_cnn(), batch()
    out = dump_step(model, (x, y), tmp_path / "ours")
    # independent one-step computation: SGD(lr 0.01, momentum 0.9, wd 1e-4), first step buf = g + wd*w
    m = copy.deepcopy(model)
    torch.nn.functional.cross_entropy(m(x), y).backward()
    g = np.load(out / "grad" / "conv1.weight.npy")
    np.testing.assert_allclose(g, m.conv1.weight.grad.numpy(), rtol=1e-5, atol=1e-7)
    upd = np.load(out / "update" / "fc.bias.npy")
    expected = -0.01 * (m.fc.bias.grad + 1e-4 * m.fc.bias.detach())
    np.testing.assert_allclose(upd, expected.numpy(), rtol=1e-4, atol=1e-9)
    with np.load(out / "forward" / "conv1.npz") as f:
        np.testing.assert_allclose(f["output"], model.conv1(x).detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(f["input_0"], x.numpy())
    with np.load(out / "batch.npz") as f:
        np.testing.assert_array_equal(f["y"], y.numpy())
    meta = json.loads((out / "meta.json").read_text())
    assert meta["forward_order"][:2] == ["conv1", "relu"] and meta["loss"] > 0


@pytest.mark.parametrize("meta, says", [(b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
                                         (b"{", "not a dump's meta.json"), (b"[1]", "not a JSON object"),
                                         (b'{"forward_order": 3}', "forward_order of the wrong kind"),
                                         (b'{"forward_order": [1]}', "forward_order of the wrong kind"),
                                         (b'{"loss": "x", "steps": true}', "loss, steps of the wrong kind")])
def test_a_damaged_meta_json_is_one_line(tmp_path, meta, says):
    (tmp_path / "meta.json").write_bytes(meta)
    with pytest.raises(DataError, match=says):
        read_dump_steps(tmp_path, 1)


def test_dump_round_trip(tmp_path):
    x = batch(chans=3, classes=5, size=8)
    dump_step(tiny_bn_low_variance(), x, tmp_path / "same")
    assert align_dump(tiny_bn_low_variance(), tmp_path / "same").passed
    # "another framework": the same weights (weights.npz) but MindSpore's BN eps in bn2
    other = tiny_bn_low_variance()
    other.bn2.eps = 1e-4
    dump_step(other, x, tmp_path / "other")
    ours = TinyBN()  # its own init: the dump's weights.npz is loaded into it
    report = align_dump(ours, tmp_path / "other")
    assert (report.first_failure.stage, report.first_failure.ours) == ("forward", "bn2")
    single = align_dump(ours, tmp_path / "other", single_step=True)
    assert [it.ours for it in single.items if it.stage == "forward" and not it.passed and it.step == 1] == ["bn2"]


def test_a_dump_holds_several_steps_and_a_momentum_difference_shows(tmp_path):
    """dump_step writes steps 2 and 3 in step2/ and step3/; a dump of the same network with momentum 0.5
    fails at step 2's update; a one-step dump is compared over its one step and says so."""
    x = batch()
    out = dump_step(mnist_cnn(), x, tmp_path / "same", optimizer=sgd(0.9))
    assert (out / "step2" / "update" / "fc.weight.npy").is_file() and (out / "step3" / "meta.json").is_file()
    assert json.loads((out / "meta.json").read_text())["steps"] == 3
    same = align_dump(mnist_cnn(), out, optimizer=sgd(0.9))
    assert same.passed and same.steps == 3
    slow = align_dump(mnist_cnn(), dump_step(mnist_cnn(), x, tmp_path / "m05", optimizer=sgd(0.5)), optimizer=sgd(0.9))
    assert not slow.passed and (slow.first_failure.step, slow.first_failure.stage) == (2, "update")
    one = align_dump(mnist_cnn(), dump_step(mnist_cnn(), x, tmp_path / "one", optimizer=sgd(0.5), steps=1),
                     optimizer=sgd(0.9))
    assert one.passed and one.steps == 1 and "shows only from the 2nd" in one.summary()
    assert any("holds 1 of the 3 training steps" in n for n in one.notes)
    dump_step(mnist_cnn(), x, tmp_path / "same", optimizer=sgd(0.9), steps=2)  # step3/ of the old dump stays
    assert align_dump(mnist_cnn(), out, optimizer=sgd(0.9)).steps == 2  # ... and is not read


# --- from recipes ----------------------------------------------------------------------------------------

def test_align_from_config_and_reference_callable(tmp_path):
    ref_file = tmp_path / "refnet.py"
    ref_file.write_text("from torchboost.models import create_model\n"
                        "def build():\n    return create_model('mnist_cnn', num_classes=10, in_chans=1, image_size=8)\n")
    report = align_from_config("digits-lenet", reference=f"{ref_file}:build", batch_size=4)
    assert report.passed
    assert align_from_config("digits-lenet", reference_config="digits-lenet", batch_size=4).passed
    dump = align_from_config("digits-lenet", dump_ours=str(tmp_path / "d"), batch_size=4)
    assert align_from_config("digits-lenet", reference_dump=str(dump)).passed
    with pytest.raises(ConfigError, match="exactly one"):
        align_from_config("digits-lenet")
    # The negative case: a reference whose conv2 output is shifted must fail, naming conv2 first.
    bad_file = tmp_path / "badnet.py"
    bad_file.write_text("from torchboost.models import create_model\n"
                        "def build():\n    net = create_model('mnist_cnn', num_classes=10, in_chans=1, image_size=8)\n"
                        "    net.conv2.register_forward_hook(lambda m, i, o: o + 0.5)\n    return net\n")
    bad = align_from_config("digits-lenet", reference=f"{bad_file}:build", batch_size=4)
    assert not bad.passed and bad.first_failure.ours == "conv2"
    with pytest.raises(ConfigError, match="cannot load reference"):
        load_reference("no_such_module_xyz:build")


# --- diff-config ---------------------------------------------------------------------------------------

def test_diff_config_recipes_match_their_yaml(tmp_path):
    import yaml

    from torchboost.recipe.config import Config, dump_config
    from torchboost.recipe.files import RECIPES_DIR
    from torchboost.recipe.load import load_config
    from torchboost.recipe.diff import diff_configs, flatten

    diff = diff_configs("digits-lenet", "mnist-lenet")
    # independent: both recipes start from the dataclass defaults, so a key differs exactly when the two
    # YAML files give it different values (a key absent from a file keeps its default)
    defaults = flatten(Config().to_dict())
    ya, yb = (flatten(yaml.safe_load((RECIPES_DIR / f"{n}.yaml").read_text())) for n in ("digits-lenet", "mnist-lenet"))
    expected = {k for k in defaults if ya.get(k, defaults[k]) != yb.get(k, defaults[k])}
    assert {k for k, _, _ in diff.differences} == expected and "data.dataset" in expected
    assert dict((k, (a, b)) for k, a, b in diff.rows)["data.batch_size"] == (32, 64)
    table = diff.table()
    assert "data.batch_size" in table and "optim.lr" not in table  # same lr: only differences by default
    assert "optim.lr" in diff.table(all_keys=True)
    # a checkpoint's saved config and a run folder's config.yaml resolve like recipes
    ckpt = tmp_path / "run-3_10.pt"
    torch.save({"config": load_config("digits-lenet", ["train.epochs=7"]).to_dict(), "model": {}}, ckpt)
    assert [(k, a, b) for k, a, b in diff_configs("digits-lenet", str(ckpt)).differences] == [("train.epochs", 20, 7)]
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(load_config("digits-lenet", ["optim.lr=0.1"])))
    assert [k for k, _, _ in diff_configs(str(run), "digits-lenet").differences] == ["optim.lr"]
    assert json.loads(json.dumps(diff_configs("digits-lenet", "digits-lenet").to_dict()))["n_differences"] == 0
