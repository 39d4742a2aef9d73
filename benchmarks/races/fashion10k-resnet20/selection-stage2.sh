#!/bin/bash
# Stage 2 of the Fashion-MNIST ResNet-20 selection: each grid whose winner sat at its edge, extended by one lr
# (the step its grid took there), at the same 8 epochs, holdout 2000, seed 0; the racers split over two processes
# (one per core), both running for the stage's whole length. Pooled with stage 1 by `race --report`.
cd /work/main
.venv/bin/torchboost race --report runs/fashion-sel1-a/race.json runs/fashion-sel1-b/race.json -o runs/fashion-sel1 \
  > runs/fashion-sel1.report 2>&1
mapfile -t EDGES < <(grep -o "race --lr '[^']*'" runs/fashion-sel1.report | sed "s/race --lr '//; s/'$//")
A=(); B=(); i=0
for e in "${EDGES[@]}"; do if (( i % 2 == 0 )); then A+=("$e"); else B+=("$e"); fi; i=$((i+1)); done
run() {  # $1 = a|b, then NAME=LR items
  part=$1; shift
  names=(); lrs=()
  for e in "$@"; do names+=("${e%=*}"); lrs+=(--lr "$e"); done
  .venv/bin/torchboost race -c resnet20-fashion10k-thor --holdout 2000 --seeds 1 --first-seed 0 --epochs 8 \
    --full-budget --evals-per-epoch 2 --threads 1 --targets 0.85 0.88 0.90 --optimizers "${names[@]}" "${lrs[@]}" \
    -o runs/fashion-sel2-$part > runs/fashion-sel2-$part.log 2>&1
}
echo "stage 2: ${EDGES[*]}"
[ ${#A[@]} -gt 0 ] && run a "${A[@]}" &
[ ${#B[@]} -gt 0 ] && run b "${B[@]}" &
wait
