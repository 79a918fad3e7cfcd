"""Named crash points for the kill -9 tests: `ARLOOP_CRASH_AT=<name>` SIGKILLs the process there.

Points: after_read (read from Redis, not persisted), after_persist (persisted, not acked),
during_subround (a verified
sub-round updated the weights, more to come), during_train (trained, no checkpoint),
after_checkpoint (checkpoint renamed, ledger not
committed), after_commit (ledger committed, registry not told); under a multi-process launch,
rank<k>_pg|kto|dpo (rank k got a batch, before it trains it). Unset in production.
"""

from __future__ import annotations

import os
import signal

ENV = "ARLOOP_CRASH_AT"


def crash_point(name: str) -> None:
    """Die like `kill -9` (no cleanup, no flush) when the environment names this point."""
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
