"""Elastic-restart soak (issue 21): under `torchrun --max-restarts=N`, kill a random worker at a random moment
(during an update, during a checkpoint write, during evaluation) N times; the job must finish on its own and
its final weights, optimizer state and history must be bit-identical to an uninterrupted run's.

    .venv/bin/python benchmarks/soak_restarts.py                         # 12 kills, 2 processes, digits-lenet
    .venv/bin/python benchmarks/soak_restarts.py --kills 30 --epochs 12 --seed 1

Moments are events, not timers: every worker runs through this file (`torchrun ... soak_restarts.py --worker
PLAN train ...`), which arms the faults PLAN gives its (restart attempt, rank) before handing over to the
torchboost CLI:
  - "step":       the AT-th optimizer update of this process, after backward (gradients all-reduced), before
                  the weights change (a global optimizer step pre-hook);
  - "checkpoint": the AT-th checkpoint write of rank 0, with half the bytes of torch.save in the temp file
                  the atomic write renames from (the half-written file a resume must never pick);
  - "eval":       the AT-th evaluation batch of this process (its peers wait in the metric all-reduce).
The dying worker appends what it was doing to PLAN's kill log, then SIGKILLs itself. torchrun sees the
failure, stops the others and restarts the group, which resumes from the newest complete checkpoint by itself
(TORCHELASTIC_RESTART_COUNT > 0 means `--resume auto`). Prints one row per kill and a summary line.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]

from soak_resume import TIMING, history, same_tensors, temp_files  # noqa: E402

PREFIX = "mnist_cnn"
MOMENTS = ("step", "checkpoint", "eval")
_TEMP_CKPT = re.compile(r"^\..+-(\d+_\d+|best)\.pt\.\d+\.tmp$")  # atomic_path's temp name of a checkpoint


# --- the worker side: arm the faults, then run the CLI ---------------------------------------------------
def _die(fault: dict, kill_log: Path, detail: str) -> None:
    """Record what this worker was doing, then die as a crash would: SIGKILL, no cleanup, no flush."""
    line = json.dumps({**fault, "detail": detail}) + "\n"
    fd = os.open(kill_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, line.encode())
    os.fsync(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def _arm(fault: dict, kill_log: Path) -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    import torchboost.train.model as model_module

    count = [0]

    def reached() -> bool:
        count[0] += 1
        return count[0] == fault["at"]

    if fault["moment"] == "step":
        def before_update(optimizer, args, kwargs):  # noqa: ARG001 (torch's hook signature)
            if reached():
                _die(fault, kill_log, f"update {count[0]} of this process, before optimizer.step")
        register_optimizer_step_pre_hook(before_update)
    elif fault["moment"] == "eval":
        prepare = model_module.prepare_input  # Model.eval's per-batch call (training uses step.py's own)

        def eval_batch(*args, **kwargs):
            if reached():
                _die(fault, kill_log, f"evaluation batch {count[0]} of this process")
            return prepare(*args, **kwargs)
        model_module.prepare_input = eval_batch
    else:
        save = torch.save

        def half_save(obj, f, *args, **kwargs):
            name = Path(getattr(f, "name", "") or "").name
            if not _TEMP_CKPT.match(name) or not reached():
                return save(obj, f, *args, **kwargs)
            buf = io.BytesIO()
            save(obj, buf, *args, **kwargs)
            f.write(buf.getvalue()[: buf.tell() // 2])
            f.flush()
            os.fsync(f.fileno())
            _die(fault, kill_log, f"checkpoint write {count[0]}: {name} half written")
        torch.save = half_save


def worker(plan_path: str, argv: list[str]) -> int:
    plan = json.loads(Path(plan_path).read_text())
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank = int(os.environ.get("RANK", "0"))
    for fault in plan["faults"]:
        if fault["attempt"] == attempt and fault["rank"] == rank:
            _arm(fault, Path(plan["kill_log"]))
    from torchboost.cli import main as cli

    return cli(argv)


# --- the driver side: plan, launch, compare --------------------------------------------------------------
def train_args(epochs: int, save_every: int, out: Path) -> list[str]:
    return ["train", "-c", "digits-lenet", "--epochs", str(epochs), "--set", "train.progress_bar=false",
            "--set", "train.log_every=1000", "--set", f"checkpoint.save_every_steps={save_every}",
            "--set", "checkpoint.keep_max=3", "--set", "data.eval_batch_size=60", "-o", str(out)]


def env() -> dict:
    # faulthandler: a worker stopped at a hang (tests/ranks.py) prints its stacks
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
            "PYTHONFAULTHANDLER": "1"}


def launch(out: Path, epochs: int, save_every: int, nproc: int, plan: dict | None = None,
           restarts: int = 0) -> subprocess.Popen:
    """torchrun with `nproc` workers; with a plan, through this file's worker side and a restart per fault; without
    one, `restarts` restarts allowed (for a fault from outside)."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                "--monitor-interval=0.1", f"--max-restarts={len(plan['faults']) if plan else restarts}"]
    if plan is None:
        entry = ["-m", "torchboost"]
    else:
        plan_path = out.parent / f"{out.name}.plan.json"
        plan_path.write_text(json.dumps(plan))
        entry = [str(Path(__file__).resolve()), "--worker", str(plan_path)]
    return subprocess.Popen([*torchrun, *entry, *train_args(epochs, save_every, out)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env(), cwd=REPO, start_new_session=True)


def random_plan(rng: random.Random, kills: int, nproc: int, steps_per_epoch: int, eval_batches: int,
                kill_log: Path) -> dict:
    """One fault per restart attempt: a random moment, a random rank (checkpoints are rank 0's to write)."""
    faults = []
    for attempt in range(kills):
        moment = rng.choice(MOMENTS)
        rank = 0 if moment == "checkpoint" else rng.randrange(nproc)
        at = {"step": rng.randint(1, 2 * steps_per_epoch), "checkpoint": rng.randint(1, 4),
              "eval": rng.randint(1, 2 * eval_batches)}[moment]
        faults.append({"attempt": attempt, "rank": rank, "moment": moment, "at": at})
    return {"faults": faults, "kill_log": str(kill_log)}


def kills_done(plan: dict) -> list[dict]:
    path = Path(plan["kill_log"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def newest(out: Path) -> Path:
    from torchboost.train.checkpoint import list_checkpoints

    return list_checkpoints(out / "ckpt", PREFIX)[-1]


def compare(ref: Path, out: Path) -> list[str]:
    """What differs between the two runs' final checkpoints (model, optimizer, position) and histories
    (timings aside); every checkpoint file left in `out` must load whole."""
    import torch

    diffs: list[str] = []
    a_path, b_path = newest(ref), newest(out)
    if a_path.name != b_path.name:
        diffs.append(f"final checkpoint {a_path.name} vs {b_path.name}")
    for p in (out / "ckpt").glob("*.pt"):
        torch.load(p, weights_only=True)
    a, b = torch.load(a_path, weights_only=True), torch.load(b_path, weights_only=True)
    for key in ("model", "optimizer", "global_step", "epoch", "epoch_complete"):
        same_tensors(a[key], b[key], key, diffs)
    rows = [[{k: v for k, v in r.items() if k not in TIMING} for r in history(p)] for p in (ref, out)]
    if rows[0] != rows[1]:
        diffs.append(f"history ({len(rows[0])} vs {len(rows[1])} rows)")
    return diffs


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(worker(sys.argv[2], sys.argv[3:]))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=12, help="faults planned (one per restart attempt)")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--save-every", type=int, default=5, help="checkpoint.save_every_steps")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default="runs/soak-restarts")
    args = p.parse_args()

    work = REPO / args.workdir
    subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True)
    # digits: 1,437 training images, 360 evaluation images; batch 32 per process, evaluation batch 60
    steps_per_epoch, eval_batches = 1437 // args.nproc // 32, -(-360 // args.nproc // 60)
    plan = random_plan(random.Random(args.seed), args.kills, args.nproc, steps_per_epoch, eval_batches,
                       work / "kills.jsonl")
    t0 = time.monotonic()
    ref_out = launch(work / "uninterrupted", args.epochs, args.save_every, args.nproc).communicate()[0]
    t_ref = time.monotonic() - t0
    t0 = time.monotonic()
    job = launch(work / "killed", args.epochs, args.save_every, args.nproc, plan)
    job_out = job.communicate()[0]
    t_job = time.monotonic() - t0
    if job.returncode != 0 or "final: top-1" not in ref_out:
        sys.exit(f"a job failed (exit {job.returncode}):\n{job_out[-3000:]}\n{ref_out[-2000:]}")

    done = kills_done(plan)
    print(f"{'attempt':>7} | {'rank':>4} | {'moment':<10} | what was in flight")
    print("-" * 80)
    for k in done:
        print(f"{k['attempt']:>7} | {k['rank']:>4} | {k['moment']:<10} | {k['detail']}")
    resumed = re.findall(r"resumed from \S+ \(epoch (\d+), step (\d+)", job_out)
    mid_epoch = sum(1 for _, step in resumed if int(step) > 0)
    diffs = compare(work / "uninterrupted", work / "killed")
    for d in diffs:
        print(f"DIFF {d}")
    counts = {m: sum(1 for k in done if k["moment"] == m) for m in MOMENTS}
    print(f"\nuninterrupted {t_ref:.1f} s; with kills {t_job:.1f} s; {args.epochs} epochs, {args.nproc} processes, "
          f"checkpoint every {args.save_every} updates; temp files left: {len(temp_files(work / 'killed'))}")
    print(f"kills {len(done)} of {args.kills} planned ({', '.join(f'{m} {n}' for m, n in counts.items())}), "
          f"restarts resumed {len(resumed)} (mid-epoch {mid_epoch}), bit-exact: {'no' if diffs else 'yes'}")
    sys.exit(1 if diffs else 0)


if __name__ == "__main__":
    main()
