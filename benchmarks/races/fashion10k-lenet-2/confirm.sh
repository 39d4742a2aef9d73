#!/bin/bash
# The Fashion-MNIST CNN confirmation, second round: the selection (selection.sh, every stage pooled into
# selection.json) fixes the targets; its four finalists (`--finalists 4`: the best THOR-family racer and the best
# three others, ranked on the held-out split) race on the test split (all 10,000 images) at exactly the lr and budget
# it chose, on the 5 fresh seeds registered here before the selection ended — 7, 8, 9, 10, 11 (the selection raced
# 0-2; round 1 confirmed on 1-6) — one process per core, every (configuration, seed) recorded in the test-split
# ledger beside the selection. Seed by seed, each unit's race.json kept here as it ends (a kept unit is not run
# again); a unit starts only while /tmp/race-pause is absent. Then the units pooled: the confirmed table.
cd "$(dirname "$0")/../../.."
S=runs
K=benchmarks/races/fashion10k-lenet-2
SEEDS=(7 8 9 10 11)
gate() { while [ -e /tmp/race-pause ]; do sleep 10; done; echo "$(date -u +%H:%M) $*"; }
unit() {  # $1 = seed: the finalists on the test split, this seed
  [ -f $K/confirm-s$1.json ] && return
  .venv/bin/torchboost race -c fashion10k-lenet-thor --frozen $K/selection.json --finalists 4 --first-seed $1 \
    --seeds 1 --full-budget --evals-per-epoch 1 --threads 1 --ledger $K/test-ledger.json -o $S/lenet2-confirm-s$1 \
    > $S/lenet2-confirm-s$1.log 2>&1 && cp $S/lenet2-confirm-s$1/race.json $K/confirm-s$1.json
}
for ((i = 0; i < ${#SEEDS[@]}; i += 2)); do
  gate confirm seeds ${SEEDS[$i]} ${SEEDS[$((i + 1))]}
  unit ${SEEDS[$i]} &
  [ -n "${SEEDS[$((i + 1))]}" ] && unit ${SEEDS[$((i + 1))]} &
  wait
done
.venv/bin/torchboost race --report $K/confirm-s*.json -o $S/lenet2-confirm > $S/lenet2-confirm.report 2>&1
cp $S/lenet2-confirm/race.json $K/confirm.json; cp $S/lenet2-confirm.report $K/confirm.txt
