"""`torchboost align`: run a few training steps on two implementations and report the first divergence."""

from __future__ import annotations

import argparse

from torchboost.commands.args import DIAGNOSTIC_BATCH, add_recipe, add_threads, int_between, whole_number
from torchboost.errors import printable

NAME = "align"
HELP = "run a few training steps on two implementations and report the first divergence"
THREADS = True  # main applies --threads before run()


def arguments(p: argparse.ArgumentParser) -> None:
    add_recipe(p, what="our side: recipe name or YAML path")
    ref = p.add_mutually_exclusive_group(required=True)
    ref.add_argument("--reference", metavar="MODULE:CALLABLE", help="a torch model factory, e.g. pkg.mod:make")
    ref.add_argument("--reference-config", metavar="RECIPE", help="another torchboost recipe")
    ref.add_argument("--reference-dump", metavar="DIR", help="per-layer tensors dumped by another framework")
    ref.add_argument("--dump-ours", metavar="DIR", help="write our step in the dump layout and stop")
    p.add_argument("--reference-set", action="append", metavar="KEY=VALUE",
                   help="override a key of --reference-config (repeatable): network, loss and optimizer keys all apply")
    p.add_argument("--steps", type=int_between(1, 100), default=3,
                   help="training steps on the one batch (default 3: optimizer state such as momentum shows only "
                        "from the 2nd)")
    p.add_argument("--single-step", action="store_true", help="feed each reference layer our layer's inputs")
    p.add_argument("--name-map", metavar="FILE.json|mindspore", help="map our names to the reference's")
    p.add_argument("--batch-size", type=DIAGNOSTIC_BATCH, default=8, help="images in the one batch both sides run")
    p.add_argument("--batch", choices=["random", "data"], default="random", help="seeded noise or real images")
    p.add_argument("--report", metavar="OUT.json", help="write the JSON report")
    p.add_argument("--rows", type=whole_number, default=40, help="table rows to print")
    p.add_argument("--failures-only", action="store_true", help="print only the rows that fail the tolerance")
    add_threads(p)


def run(args: argparse.Namespace) -> int:
    from ..recipe.align import align_from_config

    result = align_from_config(
        args.config, reference=args.reference, reference_config=args.reference_config,
        reference_dump=args.reference_dump, dump_ours=args.dump_ours, overrides=args.set or [],
        reference_overrides=args.reference_set or [], batch_size=args.batch_size, batch_source=args.batch,
        single_step=args.single_step, name_map=args.name_map, steps=args.steps)
    if args.dump_ours:
        print(f"wrote our {args.steps} training step(s)' tensors to {printable(result)}")
        return 0
    print(result.table(limit=args.rows, failures_only=args.failures_only))  # ends with the verdict line
    if args.report:
        result.save(args.report)
        print(f"report: {args.report}")
    return 0 if result.passed else 1  # 1 = a divergence was found (usable as a CI gate)
