#!/bin/bash
# Stage 2b of the Fashion-MNIST ResNet-20 selection: the two grids that stage 2 moved to a new edge
# (schedule-free AdamW at 0.02, THOR with trace damping at 0.125), extended by one more lr each, at the same
# 8 epochs, holdout 2000, seed 0; one racer per process (one per core). Pooled with stages 1-2 by `race --report`.
cd /work/main
run() {  # $1 = a|b, $2 = NAME=LR
  .venv/bin/torchboost race -c resnet20-fashion10k-thor --holdout 2000 --seeds 1 --first-seed 0 --epochs 8 \
    --full-budget --evals-per-epoch 2 --threads 1 --targets 0.85 0.88 0.90 --optimizers "${2%=*}" --lr "$2" \
    -o runs/fashion-sel2b-$1 > runs/fashion-sel2b-$1.log 2>&1
}
run a 'adamw_schedulefree=0.04' &
run b 'thor[damping_mode=trace]=0.312' &
wait
