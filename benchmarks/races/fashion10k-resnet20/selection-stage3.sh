#!/bin/bash
# Stages 2c and 3 of the Fashion-MNIST ResNet-20 selection (holdout 2000, seed 0, --full-budget, 2 evaluations an
# epoch, one process per core).
# Finalists, decided on the held-out split (stages 1, 2, 2b pooled) by the rule `race --frozen --finalists 4`
# applies (`race.select.finalists`): the best THOR-family racer and the best three others, ranked at the
# confirmation's fixed targets (`race.select.selections`): thor, soap, muon, adamw_schedulefree. Ranked so,
# Muon's grid is won at its top edge (0.125), so stage 2c races muon=0.312 at 8 epochs first.
# Stage 3: epoch budgets 5 and 12 for each finalist at its chosen lr — successive halving, since a 5- or 12-epoch
# budget of a racer that trails at 8 decides nothing the confirmation compares. THOR's and SOAP's lrs do not
# depend on stage 2c, so process b races them at once; process a races Muon's extension, then Muon's and
# schedule-free AdamW's budgets at the lrs the pool of stages 1-2c chooses.
cd /work/main
R=(.venv/bin/torchboost race -c resnet20-fashion10k-thor --holdout 2000 --seeds 1 --first-seed 0 --epochs 8
   --full-budget --evals-per-epoch 2 --threads 1 --targets 0.85 0.88 0.90)
STAGES="runs/fashion-sel1-a/race.json runs/fashion-sel1-b/race.json runs/fashion-sel2-a/race.json
  runs/fashion-sel2-b/race.json runs/fashion-sel2b-a/race.json runs/fashion-sel2b-b/race.json"
lr_of() {  # the lr the pooled selection in $1 chooses for racer $2
  .venv/bin/python -c "
from pathlib import Path
from torchboost.race.select import read_race, selections
print(next(f'{s.lr:g}' for s in selections(read_race(Path('$1')), 'pool') if s.optimizer == '$2'))"
}
budgets() {  # $1 = output name, then NAME=LR items, each raced at 5 and 12 epochs
  out=$1; shift
  names=(); args=()
  for e in "$@"; do names+=("${e%=*}"); args+=(--lr "$e" --budget "${e%=*}=5,12"); done
  "${R[@]}" --optimizers "${names[@]}" "${args[@]}" -o runs/$out > runs/$out.log 2>&1
}
(
  "${R[@]}" --optimizers muon --lr 'muon=0.312' -o runs/fashion-sel2c-a > runs/fashion-sel2c-a.log 2>&1
  .venv/bin/torchboost race --report $STAGES runs/fashion-sel2c-a/race.json -o runs/fashion-sel12c \
    > runs/fashion-sel12c.report 2>&1
  budgets fashion-sel3-a "muon=$(lr_of runs/fashion-sel12c/race.json muon)" \
    "adamw_schedulefree=$(lr_of runs/fashion-sel12c/race.json adamw_schedulefree)"
) &
budgets fashion-sel3-b "thor=$(lr_of runs/fashion-sel12b/race.json thor)" "soap=$(lr_of runs/fashion-sel12b/race.json soap)" &
wait
