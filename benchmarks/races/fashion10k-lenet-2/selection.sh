#!/bin/bash
# The Fashion-MNIST CNN race, second round (issue 54 item 6): recipe fashion10k-lenet-thor (the MNIST CNN, no
# BatchNorm, batch 256, the recipe's 10,000 training images), every choice made on 10,000 other training images
# held out (the test split's size), seeds 0-2, --full-budget, one evaluation an epoch, one process per core.
# The racers: the four rivals users pick (SGD, AdamW, Muon, SOAP) and THOR's family with the mechanisms of items
# 2-4 as variants, each one change from thor[damping_mode=trace], whose damping is a tenth of each factor's mean
# eigenvalue: THOR's health report on this recipe has both its sides active there (damping dominates 48-61% of A's
# eigen-directions, 0-20% of G's), where pi damping at 0.1 (round 1's confirmed THOR) dominates all of G's and most of
# A's, so a variant of it would race as a rescaled gradient. The variants: a factor moving average, decoupled weight
# decay, Nesterov, SGD's step size (graft=sgd_step, lr on SGD's scale), and that graft on the hidden layer only (the
# input conv and classifier on their plain SGD step); beside them MindSpore's absolute damping (thor), round 1's pi
# damping, and thor_soap (SOAP's Adam in the eigenbasis of THOR's factors, relative epsilon). The CNN recipe builds
# its factors from the whole batch.
# Stage 1: every racer over its lr grid at 8 epochs. Stage 2: each grid whose winner sits at an edge
# (`race.select.grid_edges`) extended by one lr. Stage 3: the four finalists (`race --finalists 4`'s rule: the best
# THOR-family racer and the best three others, ranked on the held-out split) at every other budget from 5 to 12
# epochs at their chosen lr. Then every stage pooled into one selection, which fixes the confirmation's targets.
# Every stage runs seed by seed, each unit's race.json kept here as it ends, so a unit already kept is not run again:
# the script continues where an earlier session stopped. A unit starts only while /tmp/race-pause is absent.
cd "$(dirname "$0")/../../.."
S=runs
K=benchmarks/races/fashion10k-lenet-2
R=(.venv/bin/torchboost race -c fashion10k-lenet-thor --holdout 10000 --seeds 1 --epochs 8 --full-budget
   --evals-per-epoch 1 --threads 1 --targets 0.86 0.87 0.88 0.89)
TR='thor[damping_mode=trace'
L=0.0006,0.0013,0.0026  # trace damping's lrs without a graft (round 1: 0.00128 won; above 0.02 it diverged)
GRIDS=(sgd=0.02,0.05,0.1 adamw=0.001,0.002,0.005 muon=0.02,0.05,0.1 soap=0.005,0.01,0.02
  thor=0.1,0.2,0.4 "thor[damping_mode=pi]=0.02,0.05,0.1" "$TR]=$L" "thor_soap[damping_mode=trace]=0.001,0.003,0.01"
  "$TR,factor_decay=0.95]=$L" "$TR,decoupled_decay=true]=$L" "$TR,nesterov=true]=$L"
  "$TR,graft=sgd_step]=0.02,0.05,0.1" "$TR,graft=sgd_step,graft_layers=hidden]=0.02,0.05,0.1")
SEEDS=(0 1 2)
gate() { while [ -e /tmp/race-pause ]; do sleep 10; done; echo "$(date -u +%H:%M) $*"; }
unit() {  # $1 = unit name, $2 = seed, then race arguments: run unless kept, then keep its race.json
  name=$1; seed=$2; shift 2
  [ -f $K/$name.json ] && return
  "${R[@]}" --first-seed $seed "$@" -o $S/lenet2-$name > $S/lenet2-$name.log 2>&1 && cp $S/lenet2-$name/race.json $K/$name.json
}
stage1() {  # $1 = a|b, $2 = 0|1 (the alternate lrs of every grid this process races), $3 = seed
  names=(); lrs=(); k=$2
  for g in "${GRIDS[@]}"; do
    name=${g%=*}; IFS=, read -ra grid <<< "${g##*=}"
    pick=(); for i in "${!grid[@]}"; do (( (i + k) % 2 == 0 )) && pick+=("${grid[$i]}"); done
    k=$(( (k + ${#grid[@]}) % 2 ))  # odd grids alternate which process takes their extra lr
    [ ${#pick[@]} -gt 0 ] && { names+=("$name"); lrs+=(--lr "$name=$(IFS=,; echo "${pick[*]}")"); }
  done
  unit sel1-s$3-$1 $3 --optimizers "${names[@]}" "${lrs[@]}"
}
split_run() {  # $1 = stage name, $2 = seed, then NAME=LR items dealt alternately to two processes
  stage=$1; seed=$2; shift 2
  A=(); B=(); i=0
  for e in "$@"; do if (( i % 2 == 0 )); then A+=("$e"); else B+=("$e"); fi; i=$((i+1)); done
  for half in a b; do
    [ $half = a ] && items=("${A[@]}") || items=("${B[@]}")
    [ ${#items[@]} -eq 0 ] && continue
    names=(); args=()
    for e in "${items[@]}"; do names+=("${e%=*}"); args+=(--lr "$e"); [ -n "$BUDGETS" ] && args+=(--budget "${e%=*}=$BUDGETS"); done
    unit $stage-s$seed-$half $seed --optimizers "${names[@]}" "${args[@]}" &
  done
  wait
}
pool() {  # $1 = output name, then race.json files
  out=$1; shift
  .venv/bin/torchboost race --report "$@" -o $S/lenet2-$out > $S/lenet2-$out.report 2>&1
}
for s in "${SEEDS[@]}"; do gate stage 1 seed $s; stage1 a 0 $s & stage1 b 1 $s & wait; done
pool sel1 $K/sel1-*.json
mapfile -t EDGES < <(grep -o "race --lr '[^']*'" $S/lenet2-sel1.report | sed "s/race --lr '//; s/'$//")
echo "stage 2: ${EDGES[*]}"
if [ ${#EDGES[@]} -gt 0 ]; then
  for s in "${SEEDS[@]}"; do gate stage 2 seed $s; split_run sel2 $s "${EDGES[@]}"; done
fi
pool sel12 $K/sel[12]-*.json
mapfile -t FINAL < <(.venv/bin/python -c "
from pathlib import Path
from torchboost.race.select import finalists, read_race, selections
for s in finalists(selections(read_race(Path('$S/lenet2-sel12/race.json')), 'pool'), 4):
    print(f'{s.optimizer}={s.lr:g}')")
echo "stage 3: ${FINAL[*]}"
for s in "${SEEDS[@]}"; do gate stage 3 seed $s; BUDGETS=5,6,7,9,10,11,12 split_run sel3 $s "${FINAL[@]}"; done
pool selection $K/sel[123]-*.json
cp $S/lenet2-selection/race.json $K/selection.json; cp $S/lenet2-selection.report $K/selection.txt
gate done
