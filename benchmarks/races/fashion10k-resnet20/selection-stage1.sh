#!/bin/bash
# Stage 1 of the Fashion-MNIST ResNet-20 selection: every racer over a 4-lr grid at 8 epochs, holdout 2000.
# Two processes (one per core) race the same racers on alternate lrs of each grid: poolable, same load.
cd /work/main
R="sgd adamw muon sgd_schedulefree adamw_schedulefree soap thor thor[damping_mode=trace] thor[damping_mode=pi] thor[inverse_root=2] thor[project_radial=true] thor_muon[ekfac_decay=0.95,inverse_root=2,graft=none]"
run() { # $1 = a|b, $2.. = lr args
  part=$1; shift
  .venv/bin/torchboost race -c resnet20-fashion10k-thor --holdout 2000 --seeds 1 --first-seed 0 --epochs 8 \
    --full-budget --evals-per-epoch 2 --threads 1 --targets 0.85 0.88 0.90 --optimizers $R "$@" \
    -o runs/fashion-sel1-$part > runs/fashion-sel1-$part.log 2>&1
}
T='thor'; 
run a --lr sgd=0.02,0.1 --lr adamw=0.0005,0.002 --lr muon=0.005,0.02 --lr sgd_schedulefree=0.25,1.0 \
  --lr adamw_schedulefree=0.001,0.005 --lr soap=0.0003,0.003 --lr thor=0.005,0.02 \
  --lr 'thor[damping_mode=trace]=0.005,0.02' --lr 'thor[damping_mode=pi]=0.005,0.02' --lr 'thor[inverse_root=2]=0.005,0.02' \
  --lr 'thor[project_radial=true]=0.005,0.02' --lr 'thor_muon[ekfac_decay=0.95,inverse_root=2,graft=none]=0.005,0.02' &
run b --lr sgd=0.05,0.2 --lr adamw=0.001,0.005 --lr muon=0.01,0.05 --lr sgd_schedulefree=0.5,2.0 \
  --lr adamw_schedulefree=0.002,0.01 --lr soap=0.001,0.01 --lr thor=0.01,0.05 \
  --lr 'thor[damping_mode=trace]=0.01,0.05' --lr 'thor[damping_mode=pi]=0.01,0.05' --lr 'thor[inverse_root=2]=0.01,0.05' \
  --lr 'thor[project_radial=true]=0.01,0.05' --lr 'thor_muon[ekfac_decay=0.95,inverse_root=2,graft=none]=0.01,0.05' &
wait
