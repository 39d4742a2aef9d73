"""torchrun's elastic agent, started in this process with a bounded rendezvous (`torchboost launch`).

Under plain torchrun a node that never arrives keeps the others waiting for the rendezvous join timeout
(600 s by default) and then ends in a traceback: the training processes, whose timeout is `dist.timeout_s`,
do not exist yet. Here the join timeout is the run's own `dist.timeout_s`, and the two ways a job ends badly
(a node missing, a training process failing after its restarts) each become one DistributedError line.
"""

from __future__ import annotations

import math
import signal
from typing import Optional, Sequence

from torchboost.errors import DistributedError


def run_agent(command: Sequence[str], *, nnodes: str = "1", nproc_per_node: int = 1,
              rdzv_endpoint: Optional[str] = None, rdzv_id: str = "torchboost", max_restarts: int = 0,
              join_timeout_s: float = 300.0) -> None:
    """Run `python -m torchboost COMMAND...` on `nproc_per_node` processes of this node under torchrun's agent
    until they finish: c10d rendezvous at `rdzv_endpoint` (host:port of one node, the same on all; None: a job
    on this machine alone). DistributedError when not every node joined within `join_timeout_s`, or when a
    process still fails once `max_restarts` restarts are spent."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError, RendezvousTimeoutError
    from torch.distributed.run import get_args_parser, run

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
        rank, failure = e.get_first_failure()
        how = (f"was killed by {signal.Signals(-failure.exitcode).name}" if failure.exitcode < 0
               else f"exited with code {failure.exitcode}")
        raise DistributedError(f"training process rank {rank} {how} after {max_restarts} restart(s)",
                               "its own error is printed above and kept in OUTPUT/log/worklog.<rank>; run the same "
                               "command again to continue from the newest checkpoint") from None
