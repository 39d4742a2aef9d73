"""Run a function on N local processes the way torchrun runs a script (for notebooks, tests, benchmarks).

Each child gets the torchrun environment (MASTER_ADDR=127.0.0.1, MASTER_PORT, RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, OMP_NUM_THREADS=1), so `fn` calls `init_distributed()` exactly as a
script under torchrun would. Results come back through torch.save bytes loaded with weights_only=True,
so they must be tensors, numbers, strings and containers of those.

The parent hosts the job's store, as torchrun's agent does (TORCHELASTIC_USE_AGENT_STORE): it binds a port the
OS picks and holds it until the children are done. A port chosen first and bound later by rank 0 can be taken
in between — by another job's gloo connection, or by another job's store, whose clients would then wait on the
wrong server until a timeout — and several jobs run at once under pytest-xdist. A rank still running at the
deadline is asked for its Python stacks (faulthandler, SIGUSR1) before it is killed, so a hang says where it hung:
that is how the suite's one stall was found (a rank forked while the caller's tqdm monitor thread held tqdm's
lock waited for it forever; tests/test_dist.py), and why "fork" is refused from a caller with other threads.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import importlib
import io
import os
import queue
import random
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from torchboost.distributed.group import shutdown
from torchboost.errors import DistributedError

_GRACE_S = 5.0  # how long the other ranks may still run after one rank failed


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out to outgoing connections and to bind(0) (Linux's default otherwise)."""
    try:
        low, high = (int(x) for x in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, for a job whose rank 0 binds it later (torchrun, or
    processes started by hand). Drawn below the kernel's ephemeral range: a port from bind(0) is an ephemeral one,
    which any outgoing connection (gloo's between ranks of another job) may take before rank 0 binds it."""
    low, _ = _ephemeral_range()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), max(1025, low))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise DistributedError(f"no free TCP port found below the ephemeral range (from {low})",
                           "free some ports, or give MASTER_PORT yourself")


def _child(fn: Callable[..., Any], rank: int, nprocs: int, port: int, args: tuple, results: Any,
           stacks: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(nprocs), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nprocs),
                      TORCHELASTIC_USE_AGENT_STORE=str(True))  # the parent hosts the store
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun: N ranks must not oversubscribe cores
    # the parent asks a straggler where it hangs (SIGUSR1); the file stays open for the process's life
    faulthandler.register(signal.SIGUSR1, file=open(stacks, "w"), all_threads=True)  # noqa: SIM115
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    try:
        out = fn(*args)
        buf = io.BytesIO()
        torch.save(out, buf)
        results.put((rank, True, buf.getvalue()))
    except BaseException:  # report everything, including SystemExit, to the parent
        tb = traceback.format_exc()
        print(f"[rank {rank}] {tb}", file=sys.stderr, flush=True)
        results.put((rank, False, tb))
    finally:
        shutdown(timeout_s=10)


def _where(stacks: Path, rank: int) -> str:
    """Where a stopped rank was: its stacks printed to stderr, and its innermost Python frame in words."""
    try:
        text = stacks.read_text(errors="replace")
    except OSError:
        return "stopped before it could say where"
    if text.strip():
        print(f"[rank {rank}] stopped; its Python stacks:\n{text}", file=sys.stderr, flush=True)
    current = text.split("Current thread", 1)[-1].splitlines()[1:2]  # the signalled (main) thread, innermost
    frame = re.match(r'\s*File "(.*)", line (\d+) in (\S+)', current[0]) if current else None
    if frame is None:
        return "in no Python frame it could name"
    return f"in {frame[3]} ({Path(frame[1]).name}:{frame[2]})"


def launch(fn: Callable[..., Any], nprocs: int, *args: Any, timeout_s: float = 300,
           start_method: str = "forkserver") -> list[Any]:
    """Run `fn(*args)` on `nprocs` fresh local processes; returns the per-rank results in rank order.

    `fn` must be importable (module level). Raises DistributedError when a rank fails, dies or the
    whole run exceeds `timeout_s` (stragglers are killed, so a hang never blocks the caller).
    start_method "forkserver" (default): one server imports torch once and forks every child from it,
    so only the first launch pays the imports; children never inherit the caller's threads.
    "fork" starts instantly (the caller's imports are inherited) and is safe only from a caller with one
    thread and no process group, which is checked: a child forked while another thread holds a lock (an I/O
    buffer's, a logger's, pytest-xdist's channel) waits for it forever.
    """
    ctx = mp.get_context(start_method)
    # torch._dynamo is what the first optimizer construction imports lazily (~800 modules, seconds):
    # import it once before forking rather than once per rank.
    preload = ["torch", "torch._dynamo", "torch.distributed", "torchboost.distributed"]
    if start_method == "forkserver":
        ctx.set_forkserver_preload(preload)
    elif start_method == "fork":
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            raise DistributedError("launch(start_method='fork') from a process already in a process group",
                                   "use start_method='forkserver', or launch before init_distributed")
        if threading.active_count() > 1:
            raise DistributedError(f"launch(start_method='fork') from a process running {threading.active_count()} "
                                   "threads: a forked child can wait forever on a lock another thread held",
                                   "use start_method='forkserver' (the default)")
        for name in preload:
            importlib.import_module(name)
    results = ctx.Queue()
    store = torch.distributed.TCPStore("127.0.0.1", 0, nprocs, is_master=True, wait_for_workers=False,
                                       timeout=datetime.timedelta(seconds=timeout_s))
    stacks = tempfile.mkdtemp(prefix="torchboost-launch-")
    try:
        return _run(ctx, store.port, fn, nprocs, args, results, timeout_s, Path(stacks))
    finally:
        del store  # closes the port: every child has ended by now
        shutil.rmtree(stacks, ignore_errors=True)


def _run(ctx: Any, port: int, fn: Callable[..., Any], nprocs: int, args: tuple, results: Any,
         timeout_s: float, stacks: Path) -> list[Any]:
    procs = [ctx.Process(target=_child, args=(fn, r, nprocs, port, args, results, str(stacks / f"rank{r}")),
                         daemon=False) for r in range(nprocs)]
    for p in procs:
        p.start()
    outs: dict[int, Any] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    while len(outs) + len(errors) < nprocs and time.monotonic() < deadline:
        try:
            rank, ok, payload = results.get(timeout=0.2)
        except queue.Empty:
            dead = [r for r, p in enumerate(procs) if p.exitcode is not None
                    and r not in outs and r not in errors]
            for r in dead:  # died without reporting (os._exit, signal, abort)
                errors[r] = f"exited with code {procs[r].exitcode} without reporting"
                deadline = min(deadline, time.monotonic() + _GRACE_S)
            continue
        if ok:
            outs[rank] = torch.load(io.BytesIO(payload), weights_only=True)
        else:
            errors[rank] = payload
            # the others are likely stuck in a collective with the failed rank: give them a moment to
            # fail on their own (their messages help), then stop waiting
            deadline = min(deadline, time.monotonic() + _GRACE_S)
    for p in procs:
        p.join(timeout=max(1.0, deadline - time.monotonic()))
    stuck = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in stuck:  # each writes its threads' Python stacks (registered in _child)
        with contextlib.suppress(OSError):
            os.kill(procs[r].pid, signal.SIGUSR1)
    where = {}
    for r in stuck:
        procs[r].join(timeout=2.0)  # time to write the stacks; the rank itself goes on hanging
        procs[r].kill()
        procs[r].join()
        where[r] = _where(stacks / f"rank{r}", r)
    missing = [r for r in range(nprocs) if r not in outs and r not in errors]
    if errors or missing:
        parts = [f"rank {r}: {msg.strip().splitlines()[-1]}" for r, msg in sorted(errors.items())]
        if missing:
            parts.append(f"ranks {missing} were stopped, still running " + (
                f"{_GRACE_S:.0f} s after the first failure" if errors else f"after {timeout_s:.0f} s"))
            parts += [f"rank {r} was {where[r]}" for r in missing if r in where]
        raise DistributedError(f"launch of {nprocs} processes failed: {'; '.join(parts)}",
                               "each failing rank printed its full traceback to stderr, and each stopped one its "
                               "Python stacks; fix the first one")
    return [outs[r] for r in range(nprocs)]
