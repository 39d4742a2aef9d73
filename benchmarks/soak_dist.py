"""Soak the distributed tests beside a CPU hog: ROUNDS runs of `pytest -m dist`, each bounded, while HOGS processes
spin on the cores. Every launch inside the tests is bounded and a stopped rank prints its stacks (tests/ranks.py,
torchboost.distributed.launch), so a hang shows as a failed test naming where it hung; a round that overruns its
own bound counts as a hang too. Prints one line per round and the totals; writes JSON with --out.

    python benchmarks/soak_dist.py --rounds 20 --hogs 2 --out benchmarks/results/soak_dist.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HANG_MARKS = ("a hang", "were stopped", "still ran after", "hung")


def hog() -> subprocess.Popen:
    """One process that spins a core until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def one_round(marker: str, workers: int, bound_s: float, log: Path) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", marker, "-p", "no:cacheprovider", "-n", str(workers),
           "-o", "addopts=", "tests"]
    start = time.monotonic()
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(bound_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            code = None
    seconds = time.monotonic() - start
    text = log.read_text(errors="replace")
    summary = (re.findall(r"^=*\s*(\d+ (?:passed|failed).*?) in [\d.]+s", text, re.M) or ["no summary"])[-1]
    hangs = code is None or any(m in line for line in text.splitlines() if line.startswith(("FAILED", "ERROR"))
                                for m in HANG_MARKS)
    return {"seconds": round(seconds, 1), "exit": code, "summary": summary, "hang": bool(hangs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="spinning processes beside the tests")
    ap.add_argument("--workers", type=int, default=1, help="pytest-xdist workers per round")
    ap.add_argument("--marker", default="dist", help="pytest -m expression")
    ap.add_argument("--bound", type=float, default=1800, help="seconds a round may take before it counts as a hang")
    ap.add_argument("--out", help="JSON file for the rounds and totals, written after every round; an existing one is "
                                  "continued (its rounds count towards --rounds)")
    ap.add_argument("--logs", default="/tmp/soak_dist", help="folder for each round's pytest output")
    args = ap.parse_args()
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if args.out else None
    rounds = json.loads(out.read_text())["rounds"] if out and out.exists() else []
    hogs = [hog() for _ in range(args.hogs)]
    try:
        for i in range(len(rounds), args.rounds):
            r = one_round(args.marker, args.workers, args.bound, logs / f"round{i:02d}.log")
            rounds.append(r)
            print(f"round {i + 1}/{args.rounds}: {r['seconds']:7.1f} s  exit {r['exit']}  {r['summary']}"
                  f"{'  HANG' if r['hang'] else ''}", flush=True)
            if out:
                write(out, args, rounds)
    finally:
        for h in hogs:
            h.kill()
    failed, hangs = totals(rounds)
    print(f"{len(rounds)} rounds of `pytest -m {args.marker}` beside {args.hogs} CPU hog(s) on {os.cpu_count()} "
          f"cores: {hangs} hang(s), {failed} round(s) with a failure; median "
          f"{sorted(r['seconds'] for r in rounds)[len(rounds) // 2]:.0f} s a round")
    return 1 if hangs or failed else 0


def totals(rounds: list[dict]) -> tuple[int, int]:
    """(rounds with a failure, rounds with a hang)."""
    return sum(r["exit"] != 0 for r in rounds), sum(r["hang"] for r in rounds)


def write(out: Path, args: argparse.Namespace, rounds: list[dict]) -> None:
    failed, hangs = totals(rounds)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine()) if Path("/proc/cpuinfo").exists() else ""
    out.write_text(json.dumps({
        "command": f"python benchmarks/soak_dist.py --rounds {args.rounds} --hogs {args.hogs} --workers {args.workers}",
        "cpu": cpu, "cores": os.cpu_count(), "hogs": args.hogs, "workers": args.workers, "rounds": rounds,
        "hangs": hangs, "failed_rounds": failed}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
