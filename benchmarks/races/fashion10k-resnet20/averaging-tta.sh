#!/bin/bash
# Issue 45's measurement: do flip test-time augmentation, SWA or Lookahead pay on the race task? THOR at the lr
# the selection chose for its 8-epoch budget (0.05), on the held-out split (2,000 training images: the test split is
# not read, so nothing here touches the confirmation's ledger), seeds 0 and 1, against the confirmation's targets
# ($1 $2). One race per setting (--set applies to every racer), two processes (one per core), each running its
# two in turn: plain then flip-TTA (the same training, evaluated with the mirror too); SWA (train.average=swa, from
# 75% of training, BatchNorm recomputed at the average) then Lookahead (k 5, alpha 0.5). Compared by epochs to
# target and final top-1 (seconds differ by process load, epochs do not).
cd /work/main
T1=$1 T2=$2
race() {  # $1 = output name, then --set items
  out=$1; shift
  .venv/bin/torchboost race -c resnet20-fashion10k-thor --holdout 2000 --seeds 2 --first-seed 0 --epochs 8 \
    --full-budget --evals-per-epoch 2 --threads 1 --targets $T1 $T2 --optimizers thor --lr thor=0.05 "$@" \
    -o runs/$out > runs/$out.log 2>&1
}
(race fashion-avg-none; race fashion-avg-tta --set eval.tta=flip) &
(race fashion-avg-swa --set train.average=swa; race fashion-avg-lookahead --set train.average=lookahead) &
wait
