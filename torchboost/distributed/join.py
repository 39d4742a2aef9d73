"""Forming a job, bounded by a short join timeout (not the training one): reach the store, then every rank
shows the others what it is about to run, and all of them go on together or stop with the same line.

Under torchrun every rank starts within seconds of the others, so a rank missing after the join timeout
failed before joining (its own error is in its own output) or was never started; waiting the training
timeout for it, as a process group does, only delays the message. Ranks exchange through the store, before
any process group exists: a rank that disagrees or is missing never leaves another rank inside a collective.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import re
import socket
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from typing import NamedTuple, Optional

import torch.distributed as dist

from torchboost.distributed.env import TorchrunEnv
from torchboost.errors import DistributedError

log = logging.getLogger("torchboost.distributed")

_ARRIVED, _VERDICT, _LEFT = "arrived", "verdict", "left"
_CLOSED = 1 << 32  # added to the arrival count by the rank that gives up waiting (ranks <= 2**31 - 1)
_SETTLE_S = 10.0  # how long a verdict may take to appear, and the store's host waits for the others to read it
_FIX_MISSING = ("a rank that failed before joining printed its own error: fix that one; otherwise start every "
                "rank (WORLD_SIZE counts them) or raise dist.join_timeout_s")
# c10d's own log lines (a failed connect is logged with its C++ stack trace): `[W1126 14:05:42.9 socket.cpp:469]`
_CPP_LOG = re.compile(r"\[[WEIF]\d{4} \d\d:\d\d:\d\d|frame #\d+: |Exception raised from |<omitting python frames>|\s*$")


class Described(NamedTuple):
    """A job value ranks compare (`value`) with what a disagreement says of a rank holding it (`text`): e.g. a
    checkpoint's content digest, shown as 'resumes from runs/a/ckpt/x-1_44.pt'."""

    value: object
    text: str


def first_line(e: BaseException) -> str:
    """torch's message without the C++ frames TORCH_SHOW_CPP_STACKTRACES appends."""
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:200]


@contextlib.contextmanager
def cpp_logs_held() -> Iterator[None]:
    """Hold what reaches stderr meanwhile and pass on all but c10d's log lines, which go to the debug log: c10d
    logs every failed connect with a C++ stack trace, and the error it describes is raised as one line anyway.
    (TORCH_CPP_LOG_LEVEL would do it, but c10 reads it once, when torch is imported.)"""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to hold
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().decode("utf-8", "replace").splitlines(keepends=True)
            kept = [line for line in lines if not _CPP_LOG.match(line)]
            if len(kept) < len(lines):
                log.debug("c10d while joining: %s", "".join(line for line in lines if _CPP_LOG.match(line)).strip())
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def _reach(env: TorchrunEnv, timeout_s: float, deadline: float) -> None:
    """Wait until the store's port accepts connections. Probing from Python keeps c10d's client from logging
    every refused try, and a host name that does not resolve is said as such."""
    last = ""
    while True:
        try:
            with socket.create_connection((env.master_addr, env.master_port),
                                          timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                return
        except (OSError, UnicodeError) as e:  # refused, unreachable, not resolved (socket.gaierror), timed out
            last = getattr(e, "strerror", None) or str(e) or type(e).__name__
        if time.monotonic() >= deadline:
            who = "torchrun's agent" if env.agent_store else "rank 0"
            raise DistributedError(f"rank {env.rank} could not reach the job's store at {env.master_addr}:"
                                   f"{env.master_port} within {timeout_s:g} s ({last})",
                                   f"start {who} (it hosts the store), check MASTER_ADDR and MASTER_PORT, or raise "
                                   "dist.join_timeout_s")
        time.sleep(0.25)


def open_store(env: TorchrunEnv, timeout_s: float) -> dist.Store:
    """The job's TCPStore, hosted by rank 0 (or by torchrun's agent) and reached by the others within
    `timeout_s` (its operations also time out after `timeout_s` until the caller sets another)."""
    deadline = time.monotonic() + timeout_s
    host = env.rank == 0 and not env.agent_store
    if not host:
        _reach(env, timeout_s, deadline)
    try:
        return dist.TCPStore(env.master_addr, env.master_port, env.world_size, is_master=host,
                             timeout=datetime.timedelta(seconds=max(1.0, deadline - time.monotonic())),
                             wait_for_workers=False)  # waiting for the others is join()'s, with a message
    except Exception as e:  # DistNetworkError, DistStoreError, RuntimeError: the same one line for each
        if host:
            raise DistributedError(f"rank 0 cannot host the job's store on port {env.master_port}: {first_line(e)}",
                                   "choose a free MASTER_PORT (another job, or a second rank 0, holds this one)"
                                   ) from None
        raise DistributedError(f"rank {env.rank} cannot use the job's store at {env.master_addr}:{env.master_port}: "
                               f"{first_line(e)}", "check MASTER_ADDR and MASTER_PORT: they must name rank 0's "
                                                   "machine and port") from None


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _payload(job: Mapping[str, object]) -> list[list[str]]:
    """[[key, digest of its value, what a disagreement says], ...] in the job's order."""
    rows = []
    for key, value in job.items():
        compared, text = (value.value, value.text) if isinstance(value, Described) else \
            (value, f"has {key}={_short(value)}")
        rows.append([key, hashlib.sha256(repr(compared).encode()).hexdigest()[:16], text[:200]])
    return rows


def _digest(rows: list[list[str]]) -> str:
    """The job's digest: its keys and their values' digests, in any order. The texts are left out: the same
    checkpoint reached by two paths is the same job."""
    return hashlib.sha256(json.dumps(sorted([key, digest] for key, digest, _ in rows)).encode()).hexdigest()[:32]


def _ranks(ranks: list[int], limit: int = 4) -> str:
    shown = ", ".join(map(str, ranks[:limit]))
    return shown + (f" and {len(ranks) - limit} more" if len(ranks) > limit else "")


def _who(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"each of ranks {_ranks(ranks)}"


def disagreement(digests: list[str], payloads: dict[int, list[list[str]]]) -> Optional[str]:
    """The one line every rank says when ranks hold different jobs (None when all hold the same): the keys
    that differ, the ranks that differ from rank 0, and what each group of ranks holds for the first key.
    `digests`: every rank's job digest; `payloads`: the rows of the first rank of each distinct digest."""
    groups: dict[str, list[int]] = {}
    for rank, digest in enumerate(digests):
        groups.setdefault(digest, []).append(rank)
    if len(groups) == 1:
        return None
    firsts = [ranks[0] for ranks in groups.values() if ranks[0] in payloads]
    rows = {r: {key: (digest, text) for key, digest, text in payloads[r]} for r in firsts}
    keys = list(dict.fromkeys(key for r in firsts for key, _, _ in payloads[r]))  # first-seen order
    differ = [k for k in keys if len({rows[r].get(k, ("", ""))[0] for r in firsts}) > 1]
    by_value: dict[str, tuple[list[int], str]] = {}
    for r in firsts:
        digest, text = rows[r].get(differ[0], ("", f"lacks {differ[0]}"))
        by_value.setdefault(digest, ([], text))[0].extend(groups[digests[r]])
    detail = ", ".join(f"{_who(sorted(ranks))} {text}" for ranks, text in list(by_value.values())[:3])
    others = [r for r, d in enumerate(digests) if d != digests[0]]
    keys_text = ", ".join(differ[:6]) + (f" and {len(differ) - 6} more" if len(differ) > 6 else "")
    shown = str(others[:8])[:-1] + (f" and {len(others) - 8} more]" if len(others) > 8 else "]")
    return f"ranks disagree on {keys_text} (ranks {shown} differ from rank 0): {detail}"


def _missing(world: int, joined: str) -> list[int]:
    """The first few ranks absent from `joined` ('0,2,'), without walking a huge WORLD_SIZE."""
    have = {int(r) for r in joined.split(",") if r}
    missing: list[int] = []
    rank = 0
    while len(missing) < 4 and rank < world:
        if rank not in have:
            missing.append(rank)
        rank += 1
    return missing


def _verdict(store: dist.Store) -> Optional[list]:
    """The closing rank's verdict: None (everyone had arrived) or [what, fix, ranks that joined]."""
    end = time.monotonic() + _SETTLE_S
    while not store.check([_VERDICT]):
        if time.monotonic() > end:
            return ["the job did not form: the rank that stopped waiting for the others left no verdict",
                    "see every rank's output for the first error", 0]
        time.sleep(0.05)
    text = store.get(_VERDICT).decode()
    return json.loads(text) if text else None


def _wait_all(store: dist.Store, world: int, timeout_s: float, deadline: float) -> Optional[list]:
    """None once every rank arrived; else the failure every rank that joined says (the first rank whose time
    ran out closes the join by adding _CLOSED to the count, atomically: a rank that saw the count complete and
    a rank that closed it can never both exist, so no rank goes on while another stops)."""
    pause = 0.01
    while (count := store.add(_ARRIVED, 0)) < world and time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(0.25, pause * 1.5)
    if count == world:
        return None
    if count > world:  # another rank closed the join
        return _verdict(store)
    count = store.add(_ARRIVED, _CLOSED)
    if count >= 2 * _CLOSED:  # two closed at once: the first one's verdict stands
        return _verdict(store)
    arrived = count - _CLOSED
    if arrived == world:
        store.set(_VERDICT, "")
        return None
    missing = _missing(world, store.get("who").decode())
    shown = _ranks(missing) + (f" and {world - arrived - len(missing)} more" if world - arrived > len(missing) else "")
    failure = [f"{world - arrived} of the job's {world} processes did not join within {timeout_s:g} s "
               f"({'rank' if world - arrived == 1 else 'ranks'} {shown})", _FIX_MISSING, arrived]
    store.set(_VERDICT, json.dumps(failure))
    return failure


def _leave(store: dist.Store, host: bool, readers: int) -> None:
    """Say this rank read the outcome; the store's host waits (briefly) until `readers` ranks did, so none of
    them loses the store mid-read (c10d would log that with a C++ stack trace)."""
    store.add(_LEFT, 1)
    end = time.monotonic() + _SETTLE_S
    while host and store.add(_LEFT, 0) < readers and time.monotonic() < end:
        time.sleep(0.05)


def join(store: dist.Store, env: TorchrunEnv, job: Mapping[str, object], timeout_s: float) -> None:
    """Wait until every rank of the job arrived, then check they all hold the same `job` (values compared by
    a digest of their repr; a `Described` value by its `value`, shown by its `text`). DistributedError, the
    same line on every rank, when a rank did not arrive within `timeout_s` or holds another job."""
    rank, world = env.rank, env.world_size
    deadline = time.monotonic() + timeout_s
    s = dist.PrefixStore("join", store)
    if s.add(f"r/{rank}", 1) > 1:  # this process is the duplicate: the first one with this rank stays in the job
        raise DistributedError(f"another process already joined this job as rank {rank}",
                               "give every process its own RANK (torchrun does)")
    rows = _payload(job)
    s.set(f"p/{rank}", json.dumps(rows))
    s.set(f"d/{rank}", _digest(rows))
    s.append("who", f"{rank},")
    s.add(_ARRIVED, 1)
    failure = _wait_all(s, world, timeout_s, deadline)
    if failure is None:
        digests = [d.decode() for d in s.multi_get([f"d/{r}" for r in range(world)])]
        firsts = list(dict.fromkeys(digests))[:4]
        payloads = {digests.index(d): json.loads(s.get(f"p/{digests.index(d)}")) for d in firsts}
        what = disagreement(digests, payloads)
        if what is None:
            return
        failure = [what, "start every rank with the same command line, config and files", world]
    _leave(s, rank == 0 and not env.agent_store, int(failure[2]))
    raise DistributedError(failure[0], failure[1])
