"""The torchrun environment, parsed and range-checked before anything connects anywhere.

torchrun (and `torchboost launch`, `dist.launch`) sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
GROUP_RANK, MASTER_ADDR/PORT and TORCHELASTIC_RESTART_COUNT; a user starting processes by hand sets them
too, and any of them may hold any string. Each is read here once, as a whole number written in digits within
its range (or a plain host name), and anything else is one DistributedError naming the variable: torch would
otherwise fail inside C++ with a stack trace, or wait for minutes on a rank that can never exist.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from torchboost.errors import DistributedError

MAX_INT = 2**31 - 1  # c10d takes ranks, sizes and counts as C ints
_BY_HAND = "torchrun sets it (or torchboost launch); starting processes by hand, set it on each"


@dataclass(frozen=True)
class TorchrunEnv:
    """Where this process sits in the job, as its environment says (every field checked)."""

    rank: int
    world_size: int
    local_rank: int = 0
    local_world_size: int = 1
    group_rank: int = 0  # torchrun's node index
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    restart_count: int = 0  # TORCHELASTIC_RESTART_COUNT: how often torchrun restarted the worker group
    agent_store: bool = False  # torchrun's agent hosts the store (every rank is a client)


def _shown(text: str) -> str:
    """A value from the environment, quoted and cut short for a one-line message."""
    return repr(text if len(text) <= 40 else text[:37] + "...")


def whole_number(name: str, text: str, low: int, high: int, fix: str = _BY_HAND, bound_by: str = "") -> int:
    """Environment variable `name`'s value `text` as an int in [low, high] (surrounding blanks allowed), else
    DistributedError; `bound_by` names the variable that set the range (e.g. 'WORLD_SIZE=2')."""
    value = text.strip()
    significant = value.lstrip("0") or "0"  # int() refuses over 4300 digits: a padded value must not reach it
    # ASCII digits only: int() also reads '٣', '1_000' and '+1'
    if not (value.isascii() and value.isdigit()) or len(significant) > 10 or not low <= int(significant) <= high:
        raise DistributedError(f"environment variable {name}={_shown(text)} is not a whole number from {low} to "
                               f"{high}" + (f" ({bound_by})" if bound_by else ""), fix)
    return int(significant)


def host_name(name: str, text: str) -> str:
    """A host name or IP address: printable ASCII without blanks, as a resolver would take it."""
    if not text or len(text) > 253 or not text.isascii() or not text.isprintable() or any(c.isspace() for c in text):
        raise DistributedError(f"environment variable {name}={_shown(text)} is not a host name or IP address",
                               "set it to the address of the machine running rank 0, e.g. 10.0.0.1 (torchrun "
                               "sets it from --master-addr or --rdzv-endpoint)")
    return text


def _number(env: Mapping[str, str], name: str, low: int, high: int, default: Optional[int],
            fix: str = _BY_HAND, bound_by: str = "") -> int:
    if name not in env:
        if default is None:
            raise DistributedError(f"environment variable {name} is not set", fix)
        return default
    return whole_number(name, env[name], low, high, fix, bound_by)


def restart_count(environ: Optional[Mapping[str, str]] = None) -> int:
    """TORCHELASTIC_RESTART_COUNT (0 when unset): how many times torchrun restarted this worker group."""
    env = os.environ if environ is None else environ
    return _number(env, "TORCHELASTIC_RESTART_COUNT", 0, MAX_INT, 0,
                   "torchrun sets it when it restarts a job; unset it when starting processes by hand")


def read_env(environ: Optional[Mapping[str, str]] = None) -> Optional[TorchrunEnv]:
    """The checked torchrun environment of this process, or None when neither RANK nor WORLD_SIZE is set
    (one process, no job). DistributedError for a value out of range, not a whole number, or one of RANK /
    WORLD_SIZE without the other (that process would otherwise train alone, silently)."""
    env = os.environ if environ is None else environ
    if "RANK" not in env and "WORLD_SIZE" not in env:
        return None
    if "RANK" not in env or "WORLD_SIZE" not in env:
        have, lack = ("RANK", "WORLD_SIZE") if "RANK" in env else ("WORLD_SIZE", "RANK")
        raise DistributedError(f"environment variable {have} is set but {lack} is not",
                               "set both (torchrun does) to join a job, or neither to train in one process")
    world = _number(env, "WORLD_SIZE", 1, MAX_INT, None)
    of_world = f"WORLD_SIZE={world}"
    rank = _number(env, "RANK", 0, world - 1, None, f"each process needs its own RANK from 0 to WORLD_SIZE-1; "
                                                     f"{_BY_HAND}", of_world)
    local_world = _number(env, "LOCAL_WORLD_SIZE", 1, world, world, "the processes on this machine: from 1 to "
                                                                     f"WORLD_SIZE; {_BY_HAND}", of_world)
    local_rank = _number(env, "LOCAL_RANK", 0, local_world - 1, 0, "each process on a machine needs its own "
                         f"LOCAL_RANK from 0 to LOCAL_WORLD_SIZE-1; {_BY_HAND}", f"LOCAL_WORLD_SIZE={local_world}")
    return TorchrunEnv(
        rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
        group_rank=_number(env, "GROUP_RANK", 0, world - 1, 0, bound_by=of_world),
        master_addr=host_name("MASTER_ADDR", env["MASTER_ADDR"]) if "MASTER_ADDR" in env else "127.0.0.1",
        master_port=_number(env, "MASTER_PORT", 1, 65535, None, "set MASTER_PORT to a free TCP port (1-65535) on "
                            "rank 0's machine, the same for every rank (torchrun sets it)"),
        restart_count=restart_count(env),
        agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == str(True))
