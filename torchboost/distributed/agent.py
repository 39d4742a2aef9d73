"""torchrun's elastic agent, started in this process with a bounded rendezvous (`torchboost launch`).

Under plain torchrun a node that never arrives keeps the others waiting for the rendezvous join timeout
(600 s by default) and then ends in a traceback: the training processes, whose timeout is `dist.timeout_s`,
do not exist yet. Here the join timeout is the run's own `dist.timeout_s`, and the two ways a job ends badly
(a node missing, a training process failing after its restarts) each become one DistributedError line; the
latter tells a refusal (every failed process exited 2, torchboost's one-line error: restarting cannot help) from
a crash (running the command again continues from the newest checkpoint), and names the real worklog.
"""

from __future__ import annotations

import math
import signal
import socket
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from torchboost.errors import DistributedError


def run_agent(command: Sequence[str], *, nnodes: str = "1", nproc_per_node: int = 1,
              rdzv_endpoint: Optional[str] = None, rdzv_id: str = "torchboost", max_restarts: int = 0,
              join_timeout_s: float = 300.0, worklogs: Optional[Path] = None) -> None:
    """Run `python -m torchboost COMMAND...` on `nproc_per_node` processes of this node under torchrun's agent
    until they finish: c10d rendezvous at `rdzv_endpoint` (host:port of one node, the same on all; None: a job
    on this machine alone). DistributedError when not every node joined within `join_timeout_s`, or when a
    process still fails once `max_restarts` restarts are spent (naming its worklog in `worklogs`, the run's
    log folder, when it wrote one)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError, RendezvousTimeoutError
    from torch.distributed.run import get_args_parser, run

    if rdzv_endpoint is not None:
        _resolves(rdzv_endpoint)
    where = ["--standalone"] if rdzv_endpoint is None else [
        "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id}"]
    args = [f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}", *where, f"--max-restarts={max_restarts}",
            # read_timeout bounds reaching the endpoint's store (60 s by default, and torch tries twice)
            f"--rdzv-conf=join_timeout={join_timeout_s:g},read_timeout={max(1, math.ceil(join_timeout_s))}",
            "-m", "torchboost", *command]
    try:
        run(get_args_parser().parse_args(args))
    except RendezvousTimeoutError:
        raise DistributedError(f"not every node joined the rendezvous at {rdzv_endpoint} within {join_timeout_s:g} s "
                               f"(dist.timeout_s): {nnodes} node(s) expected",
                               "start the same command on every node (--nnodes counts them), check that the "
                               "endpoint is reachable from each, or raise dist.timeout_s") from None
    except RendezvousError as e:  # the endpoint cannot be reached or hosted (after the timeout, a subclass)
        why = e.__cause__ or e  # torch's own message only says "see inner exception"
        first = str(why).strip().splitlines()[0] if str(why).strip() else type(why).__name__
        raise DistributedError(f"cannot reach the rendezvous at {rdzv_endpoint}: {first[:160]}",
                               "check the host name and port: every node must reach it") from None
    except ChildFailedError as e:
        raise DistributedError(*child_failure(e.failures, max_restarts, worklogs)) from None


def _resolves(endpoint: str) -> None:
    """A host name that does not resolve, said at once: torch's store client retries it until its timeout."""
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError) as e:
        raise DistributedError(f"cannot reach the rendezvous at {endpoint}: the host name {host!r} does not resolve "
                               f"({getattr(e, 'strerror', None) or e})",
                               "check the host name and port: every node must reach it") from None


def child_failure(failures: Mapping[int, Any], max_restarts: int, worklogs: Optional[Path]) -> tuple[str, str]:
    """(what, fix) for training processes that failed (torchrun's {rank: ProcessFailure}). Exit code 2 on every
    failed process is torchboost's refusal (a config, data or checkpoint error, printed as one `error:` line):
    it fails every restart the same way, so the fix is the config, not running the command again."""
    rank = min(failures, key=lambda r: failures[r].timestamp)  # the first to fail, as torchrun reports it
    code = failures[rank].exitcode
    how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
    log = worklogs / f"worklog.{rank}" if worklogs is not None else None
    kept = f" and kept in {log}" if log is not None and log.is_file() else ""
    what = f"training process rank {rank} {how} after {max_restarts} restart(s)"
    if all(f.exitcode == 2 for f in failures.values()):
        return what, (f"its `error:` line printed above{kept} says what to fix: fix the config (or the data or "
                      "checkpoint it names) and start the job again; a restart would fail the same way")
    return what, (f"its own error is printed above{kept}; run the same command again to continue from the newest "
                  "checkpoint")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a number no signal has
        return f"signal {number}"
