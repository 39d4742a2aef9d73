#!/bin/bash
# The Fashion-MNIST CNN confirmation: the selection (selection.sh, every stage pooled) fixes the targets; its
# finalists (`--finalists 4`: the best THOR-family racer and the best three others, ranked on the held-out split)
# race on the test split (all 10,000 images) at exactly the lr and budget it chose, on 6 fresh seeds (1-6), one
# process per core, every (configuration, seed) recorded in the task's test-split ledger beside the selection.
cd /work/main
S=runs
confirm() {  # $1 = process name, $2 = first seed, $3 = seeds
  .venv/bin/torchboost race -c fashion10k-lenet-thor --frozen $S/lenet-selection/race.json --finalists 4 \
    --first-seed $2 --seeds $3 --full-budget --evals-per-epoch 2 --threads 1 -o $S/lenet-confirm-$1 \
    > $S/lenet-confirm-$1.log 2>&1
}
confirm a 1 3 &
confirm b 4 3 &
wait
.venv/bin/torchboost race --report $S/lenet-confirm-a/race.json $S/lenet-confirm-b/race.json \
  -o $S/lenet-confirm > $S/lenet-confirm.report 2>&1
