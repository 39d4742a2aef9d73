"""A bound against a hang that fails while the call still hangs.

`assert time.monotonic() - start < N` after a call only runs once the call has returned: a call that hangs
never gets there, and the suite hangs with it. `within(N, what)` arms SIGALRM around the call instead: after N
seconds `Hang` is raised inside it (a blocking read is interrupted too). `Hang` is a BaseException, so neither
the CLI's `except OSError` (which would print a TimeoutError as a one-line error and exit 2, the very outcome
the hostile-input tests expect) nor an `except Exception` in the library can swallow it; should anything
catch it anyway, the alarm fires again a second later. Main thread only (pytest's), POSIX only.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator


class Hang(BaseException):
    """The bounded call did not return in time."""


@contextlib.contextmanager
def within(seconds: int, what: object = "the call") -> Iterator[None]:
    def hang(*_) -> None:
        signal.alarm(1)  # again, in case something catches this one and goes on waiting
        raise Hang(f"no answer in {seconds} s (a hang): {what}")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
