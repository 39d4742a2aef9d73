#!/bin/bash
# The Fashion-MNIST CNN race, second round (issue 54 item 6): recipe fashion10k-lenet-thor (the MNIST CNN, no
# BatchNorm, batch 256, the recipe's 10,000 training images), every choice made on 10,000 other training images
# held out (the test split's size), on 3 seeds (0-2), --full-budget, 2 evaluations an epoch, one process per core.
# The racers: the four rivals users pick (SGD, AdamW, Muon, SOAP) and THOR's family with the mechanisms of items
# 2-4 as variants, each one change from thor[damping_mode=pi] (round 1's confirmed THOR): a factor moving average,
# decoupled weight decay, Nesterov, preconditioning the hidden layers only (input conv and classifier on their plain
# gradient); beside them MindSpore's absolute damping (thor), scale-free trace damping and thor_soap (SOAP's Adam in
# the eigenbasis of THOR's factors, relative epsilon). The CNN recipe builds its factors from the whole batch.
# Stage 1: every racer over its lr grid at 8 epochs, 3 seeds. Stage 2: each grid whose winner sits at an edge
# (`race.select.grid_edges`) extended by one lr. Stage 3: the four finalists (`race --finalists 4`'s rule: the best
# THOR-family racer and the best three others, ranked on the held-out split) at every budget from 5 to 12 epochs at
# their chosen lr, 3 seeds. Then every stage pooled into one selection, which fixes the confirmation's targets.
# A stage starts only while /tmp/race-pause is absent (the suite's timing runs alone between stages).
cd "$(dirname "$0")/../../.."
S=runs
R=(.venv/bin/torchboost race -c fashion10k-lenet-thor --holdout 10000 --seeds 3 --first-seed 0 --epochs 8
   --full-budget --evals-per-epoch 2 --threads 1 --targets 0.86 0.87 0.88 0.89)
PI='thor[damping_mode=pi]'
P=0.02,0.05,0.1
GRIDS=(sgd=0.01,0.02,0.05,0.1 adamw=0.0005,0.001,0.002,0.005 muon=0.01,0.02,0.05,0.1 soap=0.003,0.006,0.01,0.02
  thor=0.1,0.2,0.4 "$PI=$P" "thor[damping_mode=trace]=0.0006,0.0013,0.0026" "thor_soap[damping_mode=trace]=0.001,0.003,0.01"
  "thor[damping_mode=pi,factor_decay=0.95]=$P" "thor[damping_mode=pi,decoupled_decay=true]=$P"
  "thor[damping_mode=pi,nesterov=true]=0.01,0.02,0.05" "thor[damping_mode=pi,graft_layers=hidden]=$P")
gate() { while [ -e /tmp/race-pause ]; do sleep 10; done; echo "$(date -u +%H:%M) $*"; }
stage1() {  # $1 = a|b, $2 = 0|1: the alternate lrs of every grid this process races
  names=(); lrs=(); k=$2
  for g in "${GRIDS[@]}"; do
    name=${g%=*}; IFS=, read -ra grid <<< "${g##*=}"
    pick=(); for i in "${!grid[@]}"; do (( (i + k) % 2 == 0 )) && pick+=("${grid[$i]}"); done
    k=$(( (k + ${#grid[@]}) % 2 ))  # odd grids alternate which process takes their extra lr
    [ ${#pick[@]} -gt 0 ] && { names+=("$name"); lrs+=(--lr "$name=$(IFS=,; echo "${pick[*]}")"); }
  done
  "${R[@]}" --optimizers "${names[@]}" "${lrs[@]}" -o $S/lenet2-sel1-$1 > $S/lenet2-sel1-$1.log 2>&1
}
race_items() {  # $1 = output name, then NAME=LR items; --budget NAME=$BUDGETS when set
  out=$1; shift
  names=(); args=()
  for e in "$@"; do names+=("${e%=*}"); args+=(--lr "$e"); [ -n "$BUDGETS" ] && args+=(--budget "${e%=*}=$BUDGETS"); done
  "${R[@]}" --optimizers "${names[@]}" "${args[@]}" -o $S/$out > $S/$out.log 2>&1
}
split_run() {  # $1 = stage name, then NAME=LR items, dealt alternately to two processes
  stage=$1; shift
  A=(); B=(); i=0
  for e in "$@"; do if (( i % 2 == 0 )); then A+=("$e"); else B+=("$e"); fi; i=$((i+1)); done
  [ ${#A[@]} -gt 0 ] && race_items lenet2-$stage-a "${A[@]}" &
  [ ${#B[@]} -gt 0 ] && race_items lenet2-$stage-b "${B[@]}" &
  wait
}
pool() {  # $1 = output name, then race.json files
  out=$1; shift
  .venv/bin/torchboost race --report "$@" -o $S/$out > $S/$out.report 2>&1
}
gate stage 1
stage1 a 0 & stage1 b 1 & wait
pool lenet2-sel1 $S/lenet2-sel1-{a,b}/race.json
STAGES=($S/lenet2-sel1-{a,b}/race.json)
mapfile -t EDGES < <(grep -o "race --lr '[^']*'" $S/lenet2-sel1.report | sed "s/race --lr '//; s/'$//")
gate "stage 2: ${EDGES[*]}"
if [ ${#EDGES[@]} -gt 0 ]; then
  split_run sel2 "${EDGES[@]}"
  for p in a b; do [ -f $S/lenet2-sel2-$p/race.json ] && STAGES+=($S/lenet2-sel2-$p/race.json); done
fi
pool lenet2-sel12 "${STAGES[@]}"
mapfile -t FINAL < <(.venv/bin/python -c "
from pathlib import Path
from torchboost.race.select import finalists, read_race, selections
for s in finalists(selections(read_race(Path('$S/lenet2-sel12/race.json')), 'pool'), 4):
    print(f'{s.optimizer}={s.lr:g}')")
gate "stage 3: ${FINAL[*]}"
BUDGETS=5,6,7,9,10,11,12 split_run sel3 "${FINAL[@]}"
pool lenet2-selection "${STAGES[@]}" $S/lenet2-sel3-{a,b}/race.json
gate done
