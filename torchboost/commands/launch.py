"""`torchboost launch`: train on several processes and machines under torchrun's agent: restarts resume by
themselves, a node that never arrives ends the job after dist.timeout_s with one line."""

from __future__ import annotations

import argparse

from torchboost.commands.args import whole_number

NAME = "launch"
HELP = ("train on several processes and machines under torchrun's agent: restarts resume by themselves, a "
        "node that never arrives ends the job after dist.timeout_s with one line")


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nnodes", default="1", help="machines in the job: N, or MIN:MAX for an elastic job")
    p.add_argument("--nproc-per-node", type=whole_number, default=1, help="training processes on this machine")
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="where the machines meet (one of them, the same "
                                                                 "on all); unset: this machine alone")
    p.add_argument("--rdzv-id", default="torchboost", help="the job's name at the endpoint (the same on all)")
    p.add_argument("--max-restarts", type=whole_number, default=0,
                   help="restart the processes this many times after a failure; each restart resumes from the newest "
                        "checkpoint")
    p.add_argument("train", nargs=argparse.REMAINDER, help="train and its arguments, as for torchboost train "
                                                            "(--resume auto is added unless --resume/--overwrite is given)")


def run(args: argparse.Namespace) -> int:
    from ..cli import build_parser
    from .train import train_plan
    from ..distributed.agent import run_agent
    from ..errors import ConfigError
    from ..recipe.run import check_epochs_left, output_dir
    from ..train.checkpoint import load_checkpoint

    if args.train[:1] != ["train"]:
        raise ConfigError("torchboost launch runs `train ...` on every process",
                          "end the command with train and its arguments: torchboost launch --nproc-per-node 2 "
                          "train -c RECIPE")
    if args.nproc_per_node < 1 or args.max_restarts < 0:
        raise ConfigError(f"--nproc-per-node {args.nproc_per_node} --max-restarts {args.max_restarts}",
                          "use at least 1 process per node and 0 or more restarts")
    if args.nnodes != "1" and args.rdzv_endpoint is None:
        raise ConfigError(f"--nnodes {args.nnodes} needs the rendezvous address", "add --rdzv-endpoint HOST:PORT "
                          "(one node's address, the same on every node)")
    host, _, port = (args.rdzv_endpoint or "").rpartition(":")
    if args.rdzv_endpoint is not None and not (host and port.isdigit() and 0 < int(port) < 65536):
        raise ConfigError(f"--rdzv-endpoint {args.rdzv_endpoint} is not HOST:PORT", "give one node's address and a "
                          "free port, e.g. --rdzv-endpoint 10.0.0.1:29500")
    train = build_parser().parse_args(args.train)
    command = list(args.train)
    if train.resume is None and not train.overwrite:  # the same command, run again, continues the run
        command += ["--resume", "auto"]
        train.resume = "auto"
    # what every process will do, checked once here: a run that cannot start is refused before any process
    # starts (torchrun would restart its failing processes --max-restarts times for nothing)
    cfg, output, _, resume = train_plan(train, log=lambda _: None)
    if resume:
        check_epochs_left(load_checkpoint(resume), resume, cfg.train.epochs)
    run_agent(command, nnodes=args.nnodes, nproc_per_node=args.nproc_per_node, rdzv_endpoint=args.rdzv_endpoint,
              rdzv_id=args.rdzv_id, max_restarts=args.max_restarts, join_timeout_s=cfg.dist.timeout_s,
              worklogs=output_dir(cfg, output) / "log")  # a failure names the real worklog.<rank>
    return 0
