"""Bounded waits on the processes of a job (ranks started by hand, torchrun and its workers).

`proc.communicate(timeout=N)` raises on a hang but leaves the job running: its ranks go on holding the cores
and ports that the next tests need, and nothing says where they hung. `finish` waits for every process up to one
deadline; past it, each process of each job's tree (torchrun's workers included) gets SIGABRT, which Python's
faulthandler (PYTHONFAULTHANDLER=1, set by `job_env`) answers with every thread's stack on stderr, then
SIGKILL, and the test fails with each process's last output.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest


def job_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with faulthandler on, so that a process stopped by `finish` prints its stacks."""
    return {**env, "PYTHONFAULTHANDLER": "1"}


def _descendants(pid: int) -> list[int]:
    """`pid`'s children, grandchildren, ... (from /proc; empty where there is none)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _signal_tree(proc: subprocess.Popen, sig: int) -> None:
    for pid in [*_descendants(proc.pid), proc.pid]:  # the workers first: torchrun would restart them
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def finish(procs: list[subprocess.Popen], timeout: float) -> list[tuple[str, str]]:
    """Every process's (stdout, stderr) once all ended within `timeout` seconds in all; else a failed test naming
    the processes still running, with their stacks and output, and nothing left running."""
    deadline = time.monotonic() + timeout
    outs: dict[int, tuple[str, str]] = {}
    hung = []
    for i, p in enumerate(procs):
        try:
            outs[i] = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung.append(i)
        except BaseException:  # Ctrl-C, or pytest stopped: the jobs (their own sessions) must not outlive the test
            for q in procs:
                _signal_tree(q, signal.SIGKILL)
            raise
    if not hung:
        return [outs[i] for i in range(len(procs))]
    for i in hung:
        _signal_tree(procs[i], signal.SIGABRT)
    time.sleep(2)  # time to write the stacks
    said = []
    for i in hung:
        _signal_tree(procs[i], signal.SIGKILL)
        out, err = procs[i].communicate()
        said.append(f"--- process {i} (pid {procs[i].pid}) stdout:\n{(out or '')[-3000:]}\n"
                    f"--- process {i} stderr:\n{(err or '')[-6000:]}")
    pytest.fail(f"processes {hung} still ran after {timeout:g} s (a hang); their stacks and output:\n"
                + "\n".join(said))
