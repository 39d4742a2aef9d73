#!/bin/bash
# Stage 3b of the Fashion-MNIST ResNet-20 selection. Pooled with stage 3, the targets the confirmation will race
# rose to 90.65% / 91.85% (the best rival soap@12's 92.15% less 1.5 / 0.3 points), and ranked at those, SOAP's
# grid is won at its top edge (0.0333, 8 epochs) and Muon's 8-epoch lr is 0.05 (stage 3 raced its budgets at
# 0.125). So: SOAP at the next lr out (0.111, 8 epochs), SOAP's budgets 5 and 12 at 0.0333 and Muon's at 0.05,
# split over two processes of about the same length. Same split, seed 0 and settings as every stage.
cd /work/main
R=(.venv/bin/torchboost race -c resnet20-fashion10k-thor --holdout 2000 --seeds 1 --first-seed 0 --epochs 8
   --full-budget --evals-per-epoch 2 --threads 1 --targets 0.85 0.88 0.90)
"${R[@]}" --optimizers soap muon --lr 'soap=0.111' --lr 'muon=0.05' --budget 'muon=12' \
  -o runs/fashion-sel3b-a > runs/fashion-sel3b-a.log 2>&1 &
"${R[@]}" --optimizers soap muon --lr 'soap=0.0333' --lr 'muon=0.05' --budget 'soap=5,12' --budget 'muon=5' \
  -o runs/fashion-sel3b-b > runs/fashion-sel3b-b.log 2>&1 &
wait
