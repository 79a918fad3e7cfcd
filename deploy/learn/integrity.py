"""What keeps the learner's view of the world true: one learner at a time (the lease), the
registry held against the store (a Redis rewind), and a champion that can load. (Under a
multi-process launch only rank 0 gets here: `deploy/learn/ranks.py`.)"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from deploy.learn.lease import LearnerLease, LeaseHeld
from learner import reconcile
from learner.policy.registry import CHAMPION, PolicyRegistry, UnknownVersion
from learner.store import Store


def take_lease(
    lease: LearnerLease,
    registry: PolicyRegistry,
    stopping: threading.Event,
    say: Callable[[str], None],
    wait: bool,
    lease_s: float,
) -> bool:
    """Hold the lease and fence the registry with it; while another learner holds it, wait
    (saying so once) or raise LeaseHeld when not `wait`. False: stopped while waiting."""
    said = False
    while True:
        try:
            registry.fence = lease.acquire()
            break
        except LeaseHeld as exc:
            if not wait:
                raise
            if not said:
                say(f"[yellow]{exc}: waiting to take over[/]")
                said = True
            if stopping.wait(min(5.0, lease_s / 3)):
                return False
    say(f"holding the learner lease (fencing token {registry.fence.value.split('|')[0]})")
    return True


def reconcile_rewind(
    store: Store, registry: PolicyRegistry, checkpoints_dir: Path, actor: str
) -> list[str] | None:
    """Find and undo a rewound registry (`learner.reconcile`); the lines that say what
    happened, or None when the registry and the store agree."""
    rewind = reconcile.find(store, registry)
    if rewind is None:
        return None
    reopened = reconcile.reconcile(store, registry, checkpoints_dir, rewind, actor)
    return [
        rewind.message(),
        f"{len(reopened)} events of {', '.join(rewind.lost)} are trainable again; their "
        f"checkpoints moved aside to {reconcile.lost_dir(checkpoints_dir)}",
    ]


def champion_problem(registry: PolicyRegistry) -> str | None:
    """Why the champion cannot load, from the registry and the disk (no loading), or None."""
    from learner.policy.models import checkpoint_problem  # torch: only when asked

    champion = registry.aliases().get(CHAMPION)
    if champion is None:
        return "no champion in the registry"
    try:
        return checkpoint_problem(registry.get(champion))
    except UnknownVersion:
        return f"the champion alias names {champion}, which is not in the registry"
