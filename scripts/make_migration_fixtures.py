"""Real-client migration checks against MindSpore 2.10 and PaddlePaddle 3.3.1, and the small fixtures
tests/test_migrate_real_clients.py checks in CI without either framework.

    python3 -m venv /work/venvs/ms && /work/venvs/ms/bin/pip install 'numpy<2' mindspore==2.10.0
    python3 -m venv /work/venvs/paddle && /work/venvs/paddle/bin/pip install paddlepaddle==3.3.1
    .venv/bin/python scripts/make_migration_fixtures.py --ms-python /work/venvs/ms/bin/python \\
        --paddle-python /work/venvs/paddle/bin/python [--fixtures tests/fixtures] [--quick]

Each comparison runs the framework in its own venv (scripts/real_clients/*_side.py: build the network,
randomise weights and BN statistics, save with the framework's own saver, run it) and the torch side here
through `torchboost convert`'s code and the create_model call its report names. Both directions: framework
file -> torchboost logits, and torchboost weights -> framework file -> framework logits. The figure is
max|torch - framework| / max|framework|.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

from torchboost.migrate import MappingReport, convert, load_torch_state
from torchboost.models import create_model

HERE = Path(__file__).resolve().parent / "real_clients"


def run(cmd: list[str]) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{res.stderr[-3000:]}")


def convert_as_cli(src: Path, dst: Path, arch: str) -> MappingReport:
    """What `torchboost convert SRC DST --arch ARCH` does (printed as such)."""
    print(f"  $ torchboost convert {src.name} {dst.name} --arch {arch}")
    return convert(src, dst, arch=arch)


def model_from_report(report: MappingReport) -> torch.nn.Module:
    """The torch network the conversion reports as computing what the source network computes."""
    kw = dict(report.model)
    return create_model(kw.pop("name"), **kw)


def torch_outputs(model: torch.nn.Module, weights: Path, x: np.ndarray, softmax: bool = False) -> np.ndarray:
    model.load_state_dict(load_torch_state(weights), strict=True)
    with torch.no_grad():
        out = model.eval()(torch.from_numpy(x))
    return (out.softmax(1) if softmax else out).numpy()


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def randomized(name: str, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    m = create_model(name, **kw)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.1, 0.1); mod.running_var.uniform_(0.5, 1.5)
                mod.weight.uniform_(0.5, 1.0); mod.bias.uniform_(-0.1, 0.1)
    return m.eval()


def mindspore_checks(py: str, work: Path, quick: bool) -> list[tuple[str, float]]:
    rows = []
    for arch, size, classes in ([("resnet18", 64, 10)] if quick else [("resnet18", 224, 10), ("resnet50", 224, 10)]):
        d = work / f"ms_{arch}"
        d.mkdir()
        run([py, str(HERE / "mindspore_side.py"), "export", arch, str(classes), str(size), str(d)])
        x, want = np.load(d / "x.npy"), np.load(d / "logits.npy")
        report = convert_as_cli(d / "net.ckpt", d / "net.pt", arch)
        rows.append((f"MindSpore zoo-style {arch} .ckpt -> torchboost", rel(torch_outputs(model_from_report(report),
                                                                                          d / "net.pt", x), want)))
        if arch == "resnet50":  # what a user got before padding="same": the same weights, torch padding
            plain = create_model(arch, num_classes=classes, init="mindspore")
            rows.append(("  (same weights, padding='torch')", rel(torch_outputs(plain, d / "net.pt", x), want)))
        # reverse: a torchboost model -> .ckpt -> the zoo network
        kw = {"padding": "same"} if arch == "resnet50" else {}
        m = randomized(arch, num_classes=classes, init="mindspore", **kw)
        torch.save(m.state_dict(), d / "ours.pt")
        convert_as_cli(d / "ours.pt", d / "ours.ckpt", arch)
        run([py, str(HERE / "mindspore_side.py"), "logits", arch, str(classes), str(d / "ours.ckpt"),
             str(d / "x.npy"), str(d / "ms_logits.npy")])
        with torch.no_grad():
            ours = m(torch.from_numpy(x)).numpy()
        rows.append((f"torchboost {arch}{' padding=same' if kw else ''} -> .ckpt -> MindSpore zoo-style",
                     rel(ours, np.load(d / "ms_logits.npy"))))
    return rows


def paddle_checks(py: str, work: Path, quick: bool) -> list[tuple[str, float]]:
    rows = []
    cases = [("mnist_cnn", 28, 10, 4), ("mnist_cnn", 28, 10, 2)]
    cases += [] if quick else [("resnet18", 224, 10, 4), ("resnet50", 224, 10, 4)]
    for arch, size, classes, protocol in cases:
        d = work / f"pd_{arch}_p{protocol}"
        d.mkdir()
        run([py, str(HERE / "paddle_side.py"), "export", arch, str(classes), str(size), str(protocol), str(d)])
        x, want = np.load(d / "x.npy"), np.load(d / "out.npy")
        softmax = arch == "mnist_cnn"  # the tutorial model returns probabilities
        report = convert_as_cli(d / "net.pdparams", d / "net.pt", arch)
        got = torch_outputs(model_from_report(report), d / "net.pt", x, softmax)
        rows.append((f"Paddle {arch} .pdparams (protocol {protocol}) -> torchboost", rel(got, want)))
        if protocol == 2:
            continue
        m = randomized(arch, num_classes=classes, **({"in_chans": 1} if arch == "mnist_cnn" else {}))
        torch.save(m.state_dict(), d / "ours.pt")
        convert_as_cli(d / "ours.pt", d / "ours.pdparams", arch)
        run([py, str(HERE / "paddle_side.py"), "outputs", arch, str(classes), str(d / "ours.pdparams"),
             str(d / "x.npy"), str(d / "pd_out.npy")])
        with torch.no_grad():
            ours = m(torch.from_numpy(x))
        ours = (ours.softmax(1) if softmax else ours).numpy()
        rows.append((f"torchboost {arch} -> .pdparams -> Paddle", rel(ours, np.load(d / "pd_out.npy"))))
    return rows


def write_fixtures(ms_py: str, pd_py: str, out: Path, work: Path) -> None:
    """Small files written by the real frameworks, for CI (tests/test_migrate_real_clients.py)."""
    out.mkdir(parents=True, exist_ok=True)
    d = work / "fx_ms"
    d.mkdir()
    run([ms_py, str(HERE / "mindspore_side.py"), "export", "tiny", "3", "32x29", str(d)])
    for src, dst in (("net.ckpt", "mindspore_tiny_same.ckpt"), ("x.npy", "mindspore_tiny_same_x.npy"),
                     ("logits.npy", "mindspore_tiny_same_logits.npy")):
        shutil.copyfile(d / src, out / dst)
    for protocol in (4, 2):
        d = work / f"fx_pd{protocol}"
        d.mkdir()
        run([pd_py, str(HERE / "paddle_side.py"), "export", "mnist_cnn", "10", "28", str(protocol), str(d)])
        shutil.copyfile(d / "net.pdparams", out / f"paddle_mnist_cnn_p{protocol}.pdparams")
    # the same seeds give the same weights and input for both protocols; keep one copy of x and outputs
    shutil.copyfile(d / "x.npy", out / "paddle_mnist_cnn_x.npy")
    shutil.copyfile(d / "out.npy", out / "paddle_mnist_cnn_probs.npy")
    run([pd_py, str(HERE / "paddle_side.py"), "keys", str(out / "paddle_vision_resnet_keys.json")])
    print(f"fixtures written to {out}: {sum(f.stat().st_size for f in out.iterdir()) / 1e3:.0f} kB")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ms-python", required=True)
    p.add_argument("--paddle-python", required=True)
    p.add_argument("--fixtures", type=Path, help="also (re)write the CI fixtures into this folder")
    p.add_argument("--quick", action="store_true", help="small models only")
    a = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if a.fixtures:
            write_fixtures(a.ms_python, a.paddle_python, a.fixtures, work)
        rows = mindspore_checks(a.ms_python, work, a.quick) + paddle_checks(a.paddle_python, work, a.quick)
    print("\n| conversion | max abs error / max abs output |\n| --- | --- |")
    for label, err in rows:
        print(f"| {label} | {err:.1e} |")


if __name__ == "__main__":
    main()
