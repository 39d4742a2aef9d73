#!/bin/bash
# The Fashion-MNIST CNN selection (recipe fashion10k-lenet-thor: the MNIST CNN, no BatchNorm, batch 256, 10,000
# training images), every choice made on 2,000 of them held out (seed 0, --full-budget, 2 evaluations an epoch, one
# process per core, both running for each stage's whole length). The test split is not read.
# Stage 1: every racer over a 4-lr grid at 8 epochs. `thor[project_radial=true]` is not raced: the CNN has no
#   BatchNorm, so no conv is scale-invariant and the option leaves THOR's update unchanged.
# Stage 2: each grid whose winner sits at an edge (at the confirmation's fixed targets: `race.select.grid_edges`)
#   extended by one lr, the step its grid took there; stage 2b once more where the new lr wins at the new edge.
# Stage 3: budgets 5 and 12 epochs for the four finalists (`race --finalists 4`'s rule on stages 1-2 pooled) at
#   their chosen lrs — successive halving, as on the ResNet task.
# Stages 2c, 2d (one process, alone on the machine): trace damping's grid, still won at its low edge after 2b,
#   extended twice more (0.00128 wins; 0.000512 loses). Stage 3b: the pool of 1-3 moved the fixed targets (SOAP@12's
#   final became the best rival's), at which π-damping's 8-epoch lr became 0.05 (stage 3 raced its budgets at
#   0.02): its budgets 5 and 12 at 0.05 too, one budget per process.
# Then every stage pooled into one selection, which fixes the confirmation's targets. As run on 2026-11-28.
cd /work/main
S=runs
R=(.venv/bin/torchboost race -c fashion10k-lenet-thor --holdout 2000 --seeds 1 --first-seed 0 --epochs 8
   --full-budget --evals-per-epoch 2 --threads 1 --targets 0.84 0.86 0.88)
T='0.02,0.05,0.1,0.2'
GRIDS=(sgd=0.02,0.05,0.1,0.2 adamw=0.0005,0.001,0.002,0.005 muon=0.01,0.02,0.05,0.1
  sgd_schedulefree=0.25,0.5,1.0,2.0 adamw_schedulefree=0.001,0.002,0.005,0.01 soap=0.0003,0.001,0.003,0.01
  "thor=$T" "thor[damping_mode=trace]=$T" "thor[damping_mode=pi]=$T" "thor[inverse_root=2]=$T"
  "thor_muon[ekfac_decay=0.95,inverse_root=2,graft=none]=$T")
stage1() {  # $1 = a|b, $2 = 0|1: the alternate lrs of every grid this process races
  names=(); lrs=()
  for g in "${GRIDS[@]}"; do
    name=${g%=*}; IFS=, read -ra grid <<< "${g##*=}"
    pick=(); for i in "${!grid[@]}"; do (( i % 2 == $2 )) && pick+=("${grid[$i]}"); done
    names+=("$name"); lrs+=(--lr "$name=$(IFS=,; echo "${pick[*]}")")
  done
  "${R[@]}" --optimizers "${names[@]}" "${lrs[@]}" -o $S/lenet-sel1-$1 > $S/lenet-sel1-$1.log 2>&1
}
race_items() {  # $1 = output name, then NAME=LR items; --budget NAME=5,12 with $BUDGETS set
  out=$1; shift
  names=(); args=()
  for e in "$@"; do names+=("${e%=*}"); args+=(--lr "$e"); [ -n "$BUDGETS" ] && args+=(--budget "${e%=*}=5,12"); done
  "${R[@]}" --optimizers "${names[@]}" "${args[@]}" -o $S/$out > $S/$out.log 2>&1
}
split_run() {  # $1 = stage name, then NAME=LR items, dealt alternately to two processes
  stage=$1; shift
  A=(); B=(); i=0
  for e in "$@"; do if (( i % 2 == 0 )); then A+=("$e"); else B+=("$e"); fi; i=$((i+1)); done
  [ ${#A[@]} -gt 0 ] && race_items lenet-$stage-a "${A[@]}" &
  [ ${#B[@]} -gt 0 ] && race_items lenet-$stage-b "${B[@]}" &
  wait
}
pool() {  # $1 = output name, then race.json files
  out=$1; shift
  .venv/bin/torchboost race --report "$@" -o $S/$out > $S/$out.report 2>&1
}
stage1 a 0 & stage1 b 1 & wait
pool lenet-sel1 $S/lenet-sel1-{a,b}/race.json
STAGES=($S/lenet-sel1-{a,b}/race.json)
REPORT=$S/lenet-sel1.report
for round in 2 2b; do  # a grid extended at an edge may win at its new edge: one more round, then stop
  mapfile -t EDGES < <(grep -o "race --lr '[^']*'" $REPORT | sed "s/race --lr '//; s/'$//")
  echo "stage $round: ${EDGES[*]}"
  [ ${#EDGES[@]} -eq 0 ] && break
  split_run sel$round "${EDGES[@]}"
  for p in a b; do [ -f $S/lenet-sel$round-$p/race.json ] && STAGES+=($S/lenet-sel$round-$p/race.json); done
  pool lenet-sel$round-pool "${STAGES[@]}"
  REPORT=$S/lenet-sel$round-pool.report
done
pool lenet-sel12 "${STAGES[@]}"
mapfile -t FINAL < <(.venv/bin/python -c "
from pathlib import Path
from torchboost.race.select import finalists, read_race, selections
for s in finalists(selections(read_race(Path('$S/lenet-sel12/race.json')), 'pool'), 4):
    print(f'{s.optimizer}={s.lr:g}')")
echo "stage 3: ${FINAL[*]}"
BUDGETS=1 split_run sel3 "${FINAL[@]}"
one() {  # $1 = output name, then race arguments
  out=$1; shift
  "${R[@]}" "$@" -o $S/$out > $S/$out.log 2>&1
}
TR='thor[damping_mode=trace]'; PI='thor[damping_mode=pi]'
one lenet-sel2c-a --optimizers "$TR" --lr "$TR=0.00128"
one lenet-sel3b-a --optimizers "$PI" --lr "$PI=0.05" --budget "$PI=5" &
one lenet-sel3b-b --optimizers "$PI" --lr "$PI=0.05" --budget "$PI=12" &
wait
one lenet-sel2d-a --optimizers "$TR" --lr "$TR=0.000512"
pool lenet-selection "${STAGES[@]}" $S/lenet-sel2c-a/race.json $S/lenet-sel2d-a/race.json $S/lenet-sel3-{a,b}/race.json \
  $S/lenet-sel3b-{a,b}/race.json
