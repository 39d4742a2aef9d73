"""Framework overhead: `Model.train` vs a hand-written PyTorch loop, same model, data and optimizer.

Run: .venv/bin/python benchmarks/overhead.py [--epochs-per-trial 1 --trials 7 --batch 100]
The two are interleaved trial by trial (so machine noise hits both alike); medians and the ratio are printed.
Target: Model.train / hand loop <= 1.03 on the MNIST CNN, where framework overhead shows most. A third row,
"Model.train undo", runs the skip policy with deferred checks (check_every=50) the way an accelerator does: every
update is applied and undone on the device when its loss is not finite (train/undo.py), so the cost of its
snapshot shows (the reason the CPU keeps the host's decision by default: TrainStep.undo_on_cpu).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from torchboost.data import build_loader
from torchboost.data.builtin import load_builtin
from torchboost.losses import CrossEntropySmooth
from torchboost.models import create_model
from torchboost.train.callbacks import LossMonitor, TimeMonitor
from torchboost.train.model import Model
from torchboost.train.step import TrainStep


def hand_loop(model, opt, loader, epochs):
    model.train()
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--epochs-per-trial", type=int, default=1)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--record", action="store_true", help="write the ratio into docs/results.json (and both tables)")
    args = ap.parse_args()
    torch.manual_seed(0)
    ds = load_builtin("mnist5k", "train")
    loader = build_loader(ds, args.batch, True, seed=0)

    times = {"hand loop": [], "Model.train": [], "Model.train undo": []}
    for trial in range(args.trials + 1):  # trial 0 warms up both paths and is discarded
        for name in times:
            net = create_model("mnist_cnn", num_classes=10, in_chans=1)
            opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
            t0 = time.perf_counter()
            if name == "hand loop":
                hand_loop(net, opt, loader, args.epochs_per_trial)
            else:
                TrainStep.undo_on_cpu = "undo" in name
                skip = dict(nonfinite="skip", max_nonfinite_steps=10, check_every=50) if "undo" in name else {}
                model = Model(net, CrossEntropySmooth(num_classes=10), opt, device="cpu", **skip)
                cbs = [LossMonitor(10**9), TimeMonitor()]
                model.train(args.epochs_per_trial, loader, callbacks=cbs)
            if trial:
                times[name].append(time.perf_counter() - t0)

    steps = len(loader) * args.epochs_per_trial
    print(f"MNIST CNN, mnist5k train ({len(ds)} images), batch {args.batch}, {steps} steps/trial, "
          f"{args.trials} trials, {torch.get_num_threads()} threads")
    print(f"{'loop':<18}{'median s':>10}{'ms/step':>10}{'img/s':>10}{'/ hand loop (min..max of trials)':>36}")
    for name, ts in times.items():
        t = statistics.median(ts)
        ratios = [a / b for a, b in zip(ts, times["hand loop"])]  # per trial: the pair ran back to back
        print(f"{name:<18}{t:>10.3f}{1000 * t / steps:>10.3f}{steps * args.batch / t:>10.0f}"
              f"{statistics.median(ratios):>14.3f}x ({min(ratios):.3f}..{max(ratios):.3f})")
    ours = statistics.median(a / b for a, b in zip(times["Model.train"], times["hand loop"]))
    print(f"overhead ratio Model.train / hand loop: {ours:.3f}x (target <= 1.03)")
    if args.record:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
        from results_page import record

        threads = torch.get_num_threads()
        record("framework overhead: `Model.train` vs a hand-written loop", f"{ours:.3f}× (target ≤ 1.03)",
               f"{os.cpu_count()} CPU cores, {threads} thread{'s' if threads > 1 else ''}",
               f"`OMP_NUM_THREADS={threads} python benchmarks/overhead.py --trials {args.trials} --record`")


if __name__ == "__main__":
    main()
