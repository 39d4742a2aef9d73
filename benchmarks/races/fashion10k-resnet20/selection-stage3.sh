#!/bin/bash
# Stage 3 of the Fashion-MNIST ResNet-20 selection: epoch budgets 5 and 12 at each finalist's chosen lr (stages 1
# and 2 pooled). Finalists, decided on the held-out split: the best THOR-family racer and the best three others by
# the selection's own rule (the highest target reached soonest at 8 epochs, `race_report.reach_key`): successive
# halving, since a 5- or 12-epoch budget of a racer that trails at 8 decides nothing the confirmation compares.
cd /work/main
.venv/bin/torchboost race --report runs/fashion-sel1-a/race.json runs/fashion-sel1-b/race.json \
  runs/fashion-sel2-a/race.json runs/fashion-sel2-b/race.json -o runs/fashion-sel12 > runs/fashion-sel12.report 2>&1
mapfile -t PICKS < <(.venv/bin/python - <<'PY'
import json
from torchboost.recipe.race_report import is_thor, reach_key
d = json.load(open("runs/fashion-sel12/race.json"))
s = d["summary"]
key = {n: reach_key({float(t): rows[n] for t, rows in s["targets"].items()}) for n in s["chosen_lr"]}
thor = sorted((n for n in key if is_thor(n)), key=key.get)[:1]
others = sorted((n for n in key if not is_thor(n)), key=key.get)[:3]
for n in thor + others:
    print(f"{n}={s['chosen_lr'][n]:g}")
PY
)
echo "stage 3 finalists: ${PICKS[*]}"
run() {  # $1 = a|b, then NAME=LR items, each raced at 5 and 12 epochs
  part=$1; shift
  names=(); args=()
  for e in "$@"; do names+=("${e%=*}"); args+=(--lr "$e" --budget "${e%=*}=5,12"); done
  .venv/bin/torchboost race -c resnet20-fashion10k-thor --holdout 2000 --seeds 1 --first-seed 0 --epochs 8 \
    --full-budget --evals-per-epoch 2 --threads 1 --targets 0.85 0.88 0.90 --optimizers "${names[@]}" "${args[@]}" \
    -o runs/fashion-sel3-$part > runs/fashion-sel3-$part.log 2>&1
}
run a "${PICKS[0]}" "${PICKS[3]}" &
run b "${PICKS[1]}" "${PICKS[2]}" &
wait
