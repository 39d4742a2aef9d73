"""Run a function on N local processes the way torchrun runs a script (for notebooks, tests, benchmarks).

Each child gets the torchrun environment (MASTER_ADDR=127.0.0.1, a free MASTER_PORT, RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, OMP_NUM_THREADS=1), so `fn` calls `init_distributed()` exactly as a
script under torchrun would. Results come back through torch.save bytes loaded with weights_only=True,
so they must be tensors, numbers, strings and containers of those.
"""

from __future__ import annotations

import importlib
import io
import os
import queue
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

from torchboost.distributed.group import shutdown
from torchboost.errors import DistributedError

_GRACE_S = 5.0  # how long the other ranks may still run after one rank failed


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(fn: Callable[..., Any], rank: int, nprocs: int, port: int, args: tuple, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(nprocs), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nprocs))
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun: N ranks must not oversubscribe cores
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


def launch(fn: Callable[..., Any], nprocs: int, *args: Any, timeout_s: float = 300,
           start_method: str = "forkserver") -> list[Any]:
    """Run `fn(*args)` on `nprocs` fresh local processes; returns the per-rank results in rank order.

    `fn` must be importable (module level). Raises DistributedError when a rank fails, dies or the
    whole run exceeds `timeout_s` (stragglers are killed, so a hang never blocks the caller).
    start_method "forkserver" (default): one server imports torch once and forks every child from it,
    so only the first launch pays the imports; children never inherit the caller's threads.
    "fork" starts instantly (the caller's imports are inherited; tests and benchmarks use it) and is
    safe as long as the caller holds no process group, which is checked.
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
        for name in preload:
            importlib.import_module(name)
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(fn, r, nprocs, port, args, results), daemon=False)
             for r in range(nprocs)]
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
        if p.is_alive():
            p.kill()
            p.join()
    missing = [r for r in range(nprocs) if r not in outs and r not in errors]
    if errors or missing:
        detail = "; ".join(f"rank {r}: {msg.strip().splitlines()[-1]}" for r, msg in sorted(errors.items()))
        if missing:
            detail += f"; ranks {missing} were stopped, still running " + (
                f"{_GRACE_S:.0f} s after the first failure" if errors else f"after {timeout_s:.0f} s")
        raise DistributedError(f"launch of {nprocs} processes failed: {detail}",
                               "each failing rank printed its full traceback to stderr; fix the first one")
    return [outs[r] for r in range(nprocs)]
