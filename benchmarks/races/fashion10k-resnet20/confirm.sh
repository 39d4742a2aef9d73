#!/bin/bash
# The Fashion-MNIST ResNet-20 confirmation: every selection stage pooled into one selection (`race --report`,
# which fixes the targets), then its finalists (`--finalists 4`: the best THOR-family racer and the best three
# others, ranked on the held-out split) raced on the test split (all 10,000 images) at exactly the lr and budget
# the selection chose, on 5 fresh seeds (1-5; the selection used seed 0) split over two processes, one per core,
# each seed's runs recorded in the selection's test-split ledger. Then both processes pooled into one report.
cd /work/main
S=runs
.venv/bin/torchboost race --report $S/fashion-sel1-a/race.json $S/fashion-sel1-b/race.json \
  $S/fashion-sel2-a/race.json $S/fashion-sel2-b/race.json $S/fashion-sel2b-a/race.json $S/fashion-sel2b-b/race.json \
  $S/fashion-sel2c-a/race.json $S/fashion-sel3-a/race.json $S/fashion-sel3-b/race.json \
  $S/fashion-sel3b-a/race.json $S/fashion-sel3b-b/race.json \
  -o $S/fashion-selection > $S/fashion-selection.report 2>&1 || exit 1
confirm() {  # $1 = a|b, $2 = first seed, $3 = seeds
  .venv/bin/torchboost race -c resnet20-fashion10k-thor --frozen $S/fashion-selection/race.json --finalists 4 \
    --first-seed $2 --seeds $3 --full-budget --evals-per-epoch 2 --threads 1 -o $S/fashion-confirm-$1 \
    > $S/fashion-confirm-$1.log 2>&1
}
confirm a 1 3 &
confirm b 4 2 &
wait
.venv/bin/torchboost race --report $S/fashion-confirm-a/race.json $S/fashion-confirm-b/race.json \
  -o $S/fashion-confirm > $S/fashion-confirm.report 2>&1
