"""`torchboost race`: race optimizers on a recipe: time to accuracy."""

from __future__ import annotations

import argparse

from torchboost.commands.args import int_between, positive_int, positive_float, accuracy_target


NAME = "race"
HELP = "race optimizers on a recipe: time to accuracy"


def arguments(p: argparse.ArgumentParser) -> None:
    pass


def later_arguments(rc: argparse.ArgumentParser) -> None:
    from ..optim.registry import OPTIMIZERS
    from ..recipe.optimizers import default_racers

    rc.add_argument("--config", "-c", default="mnist-lenet-thor", help="recipe name or YAML path")
    rc.add_argument("--set", "-s", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    rc.add_argument("--data", help="data folder/file, as for train (sets data.path; with a built-in data set, races "
                                   "on the image folder instead)")
    rc.add_argument("--batch-size", "-b", type=positive_int, help="shortcut for --set data.batch_size=N (aim at 10 or "
                                                                   "more updates per epoch)")
    racers = default_racers()
    rc.add_argument("--optimizers", nargs="+", metavar="NAME",
                    help=f"any of {' '.join(OPTIMIZERS)} (default: {' '.join(racers)}), or a variant with some "
                         "options changed: 'thor[graft=muon_step]', 'muon[weight_norm=pin]'")
    rc.add_argument("--lr", action="append", metavar="NAME=LR,LR",
                    help="lr grid of one optimizer, e.g. sgd=0.01,0.02,0.05 (repeatable; defaults per optimizer)")
    rc.add_argument("--targets", nargs="+", type=accuracy_target, help="validation top-1 targets (default 0.975 0.98; with "
                                                              "--report: the saved race's; refused with --frozen, "
                                                              "whose targets are the best rival's median final less "
                                                              "1.5 and 0.3 points on the test split)")
    rc.add_argument("--seeds", type=int_between(1, 100), default=3, help="seeds FIRST..FIRST+N-1 (each racer the "
                                                                        "same inits and batch orders)")
    rc.add_argument("--first-seed", type=int_between(0, 2**31 - 1), default=0,
                    help="the first seed (fresh seeds confirm what a race on others selected)")
    rc.add_argument("--epochs", type=int_between(1, 100_000), help="epoch budget and schedule length (default train.epochs)")
    rc.add_argument("--budget", action="append", metavar="NAME=EPOCHS,EPOCHS",
                    help="one optimizer's own epoch budgets, each raced as NAME@EPOCHS with its schedule over "
                         "them, e.g. thor=6,8 (repeatable; default --epochs)")
    rc.add_argument("--time-budget", type=positive_float, help="stop a run after this many training seconds")
    rc.add_argument("--full-budget", action="store_true", help="keep training after the last target is reached")
    rc.add_argument("--evals-per-epoch", type=int_between(1, 100), default=4,
                    help="evaluations (untimed) per epoch: time to a target is read to this fraction of an epoch")
    rc.add_argument("--trace", action="store_true", help="also record each layer's |dW|/|W|, |W|, the lr and THOR's "
                                                        "effective damping every epoch (race.json, race-trace.png)")
    rc.add_argument("--lr-find", action="store_true", help="centre each optimizer's lr grid (unless --lr gives "
                                                          "it) on its lr-find suggestion (torchboost lr-find)")
    rc.add_argument("--threads", type=int_between(1, 1024), default=1, help="torch threads (fixed for fair timing)")
    rc.add_argument("--output", "-o", help="folder for race.json and race.png (default runs/race-<recipe name>)")
    rc.add_argument("--holdout", type=int_between(1, 10**9), default=0, metavar="N",
                    help="select on N training samples held out as a validation split (stratified, not augmented; "
                         "outside data.train_subset when set; the test split is not read): each optimizer's lr and "
                         "budget by median seconds to the lower target, then confirm with --frozen")
    rc.add_argument("--frozen", metavar="RACE_JSON",
                    help="race each optimizer at the lr and budget a --holdout race chose (its race.json), on the test "
                         "split and fresh seeds (--first-seed past the selection's), every run its whole budget, "
                         "trained on the selection's training images")
    rc.add_argument("--finalists", type=int_between(2, 1000), metavar="K",
                    help="with --frozen: confirm only the selection's best THOR-family racer and its K-1 best others "
                         "(ranked on its held-out split), when confirming every racer costs too much")
    rc.add_argument("--ledger", metavar="FILE",
                    help="the test-split ledger: every (configuration, seed) a race evaluates on the test split, per "
                         "task; a seed already there, or a configuration outside the task's first confirmed selection, "
                         "is refused (default with --frozen: test-ledger.json beside the selection)")
    rc.add_argument("--report", nargs="+", metavar="RACE_JSON",
                    help="only report saved races, pooled (each must have raced the same racers; a repeated run "
                         "counts once); with --output also their pooled race.json and race.png")


def run(args: argparse.Namespace) -> int:
    from ..race.run import RaceRequest, race

    race(RaceRequest.of(args))  # the flow is the library's: select, confirm or report (race.run)
    return 0
