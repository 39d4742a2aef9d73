"""Crash-and-resume soak (issue 15): SIGKILL `torchboost train` again and again, resume each time from the
newest checkpoint, and check the finished run is bit-identical to one that was never interrupted.

    .venv/bin/python benchmarks/soak_resume.py                      # 20 kills on digits-lenet, 80 epochs
    .venv/bin/python benchmarks/soak_resume.py --kills 30 --epochs 12 --save-every 7 --seed 1

Opt-in (not part of `make test`): it takes minutes. Every process runs with one torch thread. Kills alternate
between two kinds so both are covered:
  - "random": at a random moment of training (an update, evaluation, a history/plot write), timed from the
    process's first write (config.yaml; the very first kill is during start-up instead);
  - "write":  the moment a temp file (`.NAME.PID.tmp`) of a checkpoint, history, plot or config write shows
    up under the run folder (the write is in flight: torch.save, fsync, before the rename).
After each kill the run continues with `--resume` from the newest checkpoint in ckpt/ (a fresh start with
--overwrite when none exists yet). When enough kills were made the run is left to finish. Then the final
checkpoint's weights and optimizer state and the per-epoch numeric history fields (timings aside) must be
bit-identical to the uninterrupted run's. Prints one row per process and a final summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from torchboost.train.checkpoint import list_checkpoints  # noqa: E402

TIMING = ("train_time_s", "data_wait_ms", "step_ms", "data_wait_share")
PREFIX = "mnist_cnn"


def command(args: argparse.Namespace, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torchboost", "train", "-c", args.recipe, "--epochs", str(args.epochs),
            "--set", "train.progress_bar=false", "--set", f"checkpoint.save_every_steps={args.save_every}",
            "--set", f"checkpoint.keep_max={args.keep}", "-o", str(out), *extra]


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def newest_checkpoint(out: Path) -> Path | None:
    found = list_checkpoints(out / "ckpt", PREFIX) if (out / "ckpt").is_dir() else []
    return found[-1] if found else None


def temp_files(out: Path, pid: int | None = None) -> list[Path]:
    """Temp files under the run folder (of process `pid` only, when given: a killed run's stay until the
    next run starts training)."""
    end = f".{pid}.tmp" if pid is not None else ".tmp"
    try:
        return [p for d in (out, out / "ckpt") if d.is_dir() for p in d.iterdir() if p.name.endswith(end)]
    except FileNotFoundError:  # a folder replaced under us (--overwrite)
        return []


def history(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines() if line.strip()]


def same_tensors(a, b, where: str, diffs: list[str]) -> None:
    if isinstance(a, torch.Tensor):
        if not (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)):
            diffs.append(where)
    elif isinstance(a, dict):
        if not isinstance(b, dict) or set(a) != set(b):
            diffs.append(f"{where} (keys)")
            return
        for k in a:
            same_tensors(a[k], b[k], f"{where}.{k}", diffs)
    elif isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            diffs.append(f"{where} (length)")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            same_tensors(x, y, f"{where}[{i}]", diffs)
    elif a != b:
        diffs.append(where)


def wait_for_first_write(proc: subprocess.Popen, out: Path, limit_s: float) -> bool:
    """Wait until this process writes its first file (config.yaml, right before training starts): start-up
    (imports, data) takes seconds on a loaded machine and kills there would teach nothing. False: it exited."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if temp_files(out, proc.pid) or ((out / "config.yaml").exists()
                                         and (out / "config.yaml").stat().st_mtime > proc.started):
            return True
        time.sleep(0.0005)
    return True


def kill_when(proc: subprocess.Popen, out: Path, kind: str, rng: random.Random, args: argparse.Namespace
              ) -> tuple[bool, str]:
    """Wait for the moment of `kind` and SIGKILL; (killed, what was in flight). (False, "") if it finished."""
    if kind == "startup":  # once: before anything is written
        delay = rng.uniform(0.5, 2.0)
    else:
        if not wait_for_first_write(proc, out, 120):
            return False, ""
        delay = rng.uniform(0.0, args.max_delay)
    start = time.monotonic()
    if kind in ("random", "startup"):
        while time.monotonic() < start + delay:
            if proc.poll() is not None:
                return False, ""
            time.sleep(0.002)
    else:  # "write": after skipping some writes (so the run moves on), kill when the next one is in flight
        skip, seen = rng.randint(0, args.skip_writes), set()
        while time.monotonic() < start + 10 * args.max_delay:
            if proc.poll() is not None:
                return False, ""
            tmps = [p for p in temp_files(out, proc.pid) if p not in seen]
            if tmps and len(seen) >= skip:
                break
            seen.update(tmps)
            time.sleep(0.0002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    in_flight = ", ".join(sorted(m[1] for p in temp_files(out, proc.pid)
                                 if (m := re.match(r"^\.(.+)\.\d+\.tmp$", p.name))))
    return True, in_flight or "-"


def soak(args: argparse.Namespace, out: Path, rng: random.Random) -> tuple[int, int, list[tuple]]:
    kills = resumes = 0
    rows = []
    while True:
        ckpt = newest_checkpoint(out)
        if ckpt is not None:
            extra, start_from = ["--resume", str(ckpt)], ckpt.name
            resumes += 1
        else:
            extra, start_from = (["--overwrite"] if out.exists() else []), "fresh"
        t0 = time.monotonic()
        proc = subprocess.Popen(command(args, out, *extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env(), cwd=REPO)
        proc.started = time.time() - 0.01  # type: ignore[attr-defined]
        if kills < args.kills:
            kind = "startup" if kills == 0 else "write" if kills % 2 else "random"
            killed, in_flight = kill_when(proc, out, kind, rng, args)
        else:
            kind, killed, in_flight = "finish", False, ""
        if not killed:
            stdout, stderr = proc.communicate()
            if proc.returncode != 0:
                sys.exit(f"run failed (exit {proc.returncode}) after {kills} kills:\n{stderr.decode()[-3000:]}")
            rows.append((len(rows) + 1, start_from, kind, "finished", "-", time.monotonic() - t0))
            return kills, resumes, rows
        kills += 1
        proc.stdout.close()
        proc.stderr.close()
        after = newest_checkpoint(out)
        rows.append((len(rows) + 1, start_from, kind, after.name if after else "-", in_flight, time.monotonic() - t0))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="digits-lenet")
    p.add_argument("--epochs", type=int, default=80)
    p.add_argument("--save-every", type=int, default=5, help="checkpoint.save_every_steps")
    p.add_argument("--keep", type=int, default=3, help="checkpoint.keep_max")
    p.add_argument("--kills", type=int, default=20, help="SIGKILLs before the run may finish")
    p.add_argument("--max-delay", type=float, default=3.0, help="random kills: up to this many seconds into training")
    p.add_argument("--skip-writes", type=int, default=30, help="write kills: skip up to this many writes first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default="runs/soak-resume")
    args = p.parse_args()

    rng = random.Random(args.seed)
    work = REPO / args.workdir
    ref, out = work / "uninterrupted", work / "killed"
    t0 = time.monotonic()
    subprocess.run(command(args, ref, "--overwrite"), check=True, env=env(), cwd=REPO, capture_output=True)
    t_ref = time.monotonic() - t0
    if out.exists():
        subprocess.run(["rm", "-rf", str(out)], check=True)
    t0 = time.monotonic()
    kills, resumes, rows = soak(args, out, rng)
    t_soak = time.monotonic() - t0

    print(f"{'#':>3} | {'started from':<22} | {'kill':<7} | {'newest checkpoint after':<23} | {'write in flight':<28} | s")
    print("-" * 104)
    for n, start, kind, after, in_flight, secs in rows:
        print(f"{n:>3} | {start:<22} | {kind:<7} | {after:<23} | {in_flight[:28]:<28} | {secs:.1f}")

    a_path = newest_checkpoint(ref)
    b_path = out / "ckpt" / a_path.name
    for p in (out / "ckpt").iterdir():  # every checkpoint the kills left behind is whole
        torch.load(p, weights_only=True)
    diffs: list[str] = []
    a, b = torch.load(a_path, weights_only=True), torch.load(b_path, weights_only=True)
    for key in ("model", "optimizer", "global_step", "epoch"):
        same_tensors(a[key], b[key], key, diffs)
    ha, hb = history(ref), history(out)
    strip = [{k: v for k, v in r.items() if k not in TIMING} for r in ha]
    strip_b = [{k: v for k, v in r.items() if k not in TIMING} for r in hb]
    if strip != strip_b:
        diffs.append(f"history ({len(ha)} vs {len(hb)} rows; epochs {[r['epoch'] for r in hb]})")
        for ra, rb in zip(strip, strip_b):
            if ra != rb:
                diffs.append(f"  epoch {ra['epoch']}: " + ", ".join(f"{k} {ra[k]!r} != {rb.get(k)!r}" for k in ra
                                                                    if ra[k] != rb.get(k)))
    leftovers = temp_files(out)
    exact = not diffs
    print(f"\nuninterrupted run {t_ref:.1f} s; killed-and-resumed run {t_soak:.1f} s over {len(rows)} processes; "
          f"{args.epochs} epochs, checkpoint every {args.save_every} updates, keep {args.keep}")
    print(f"compared {a_path.name}: model {len(a['model'])} tensors, optimizer state of "
          f"{len(a['optimizer'].get('state', {}))} parameters; history {len(ha)} rows x "
          f"{len(strip[0]) if strip else 0} numeric fields")
    for d in diffs:
        print(f"DIFF {d}")
    if leftovers:
        print(f"temp files left: {[p.name for p in leftovers]}")
    write_kills = sum(1 for r in rows if r[2] == "write" and r[4] not in ("", "-"))
    print(f"kills {kills} (during a write: {write_kills}), resumes {resumes}, bit-exact: {'yes' if exact else 'no'}")
    if kills < args.kills:
        print(f"the run finished after {kills} of {args.kills} kills: raise --epochs or lower --max-delay/--skip-writes")
    sys.exit(0 if exact and kills >= args.kills else 1)


if __name__ == "__main__":
    main()
