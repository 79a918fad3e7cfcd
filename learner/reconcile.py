"""Registry, checkpoints and ledger held against each other: a Redis rewind found and undone.

The learner's store is the source of exactly-once; the registry lives in Redis. When Redis is
restored from an older snapshot (or fails over to a replica that lagged), the registry forgets
versions the learner committed and registered: serving falls back to an older champion with no
move recorded, the version counter hands out names whose checkpoint folders exist, and the
events the ledger says were trained into the lost versions are in no served policy. `find`
names that disagreement; `reconcile` undoes it on the learner's side:
1. the lost versions' checkpoint folders move aside (`checkpoints-lost/<time>/` beside the
   checkpoints), so their names can be used again and nothing is deleted;
2. one store transaction drops their version rows and ledger and opens their events again
   (the next rounds train on them);
3. a `RegistryRewound` event on the policy stream says what happened, beside the champion
   serving now: the fallback is no longer silent.
A crash between the steps is finished by running `reconcile` again at the next start.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from agents.events import RegistryRewound, new_id
from learner.policy.registry import CHAMPION, PolicyRegistry
from learner.store import Store


@dataclass(frozen=True)
class Rewind:
    """What the registry lost: versions this store committed and registered, and their events."""

    lost: list[str]
    events: int
    champion: str | None
    counter: int

    def message(self) -> str:
        return (
            f"Redis was rewound: the registry no longer has {', '.join(self.lost)}, which this "
            f"learner committed and registered ({self.events} trained events), and its version "
            f"counter stands at v{self.counter}. Redis was restored from an older snapshot or "
            f"failed over to a lagging replica; serving fell back to {self.champion or 'nothing'}"
            ". Reconciling: their checkpoints move aside and their events become trainable again"
        )


def find(store: Store, registry: PolicyRegistry) -> Rewind | None:
    """The rewind, when the registry lacks versions the store has registered; else None."""
    known = registry.names()
    committed = [c for c in store.committed_versions() if c.registered]
    lost = [c.version for c in committed if c.version not in known]
    if not lost:
        return None
    ledger = store.ledger()
    events = sum(1 for v in ledger.values() if v in lost)
    return Rewind(lost, events, registry.aliases().get(CHAMPION), registry.counter())


def lost_dir(checkpoints_dir: Path) -> Path:
    """Where lost versions' checkpoints go: beside the checkpoints, which hold committed ones only."""
    return checkpoints_dir.with_name(checkpoints_dir.name + "-lost")


def reconcile(
    store: Store, registry: PolicyRegistry, checkpoints_dir: Path, rewind: Rewind, actor: str
) -> list[str]:
    """Undo the rewind on the learner's side (see the module docstring); the reopened event ids."""
    aside = lost_dir(checkpoints_dir) / time.strftime("%Y%m%d-%H%M%S")
    for version in rewind.lost:
        folder = checkpoints_dir / version
        if folder.is_dir():
            aside.mkdir(parents=True, exist_ok=True)
            shutil.move(str(folder), str(aside / version))
    reopened = store.forget_versions(rewind.lost)
    registry.record(
        RegistryRewound(
            event_id=new_id("rewind"),
            lost_versions=rewind.lost,
            champion=rewind.champion,
            retrainable_events=len(reopened),
            reason=rewind.message(),
            actor=actor,
        )
    )
    return reopened
