"""Is what vLLM serves what the registry published? `arloop serve vllm-sync --check`.

Per alias it compares three sources that can each be wrong on their own: the registry (the
version and the digest of its checkpoint files now), the sync's record (which model it routes
the alias to, and the digest of the files that model was loaded from), and vLLM's own model
list (whether that model is loaded at all). A LoRA that was never delivered (a refused load,
a vLLM restarted since, files rewritten after the load) is reported by name, never taken for
a policy that simply did not improve.
"""

from __future__ import annotations

from dataclasses import dataclass

from deploy.policy_server.heartbeat import checkpoint_digest
from deploy.vllm_sync.record import VllmRecord
from deploy.vllm_sync.sync import ALIASES
from deploy.vllm_sync.vllm_api import Card
from learner.policy.registry import PolicyRegistry, UnknownVersion


@dataclass(frozen=True)
class Finding:
    """One alias: what was published, what vLLM serves for it, and whether they agree."""

    alias: str
    version: str
    published_digest: str
    served_version: str | None
    model: str | None
    served_digest: str | None
    listed: bool | None
    """Whether vLLM lists the model (None: vLLM did not answer)."""
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def delivery_check(
    registry: PolicyRegistry, record: VllmRecord | None, listed: dict[str, Card] | None
) -> list[Finding]:
    """One finding per alias the registry sets (`listed`: vLLM's model list, None if down)."""
    aliases = registry.aliases()
    return [_finding(registry, a, aliases[a], record, listed) for a in ALIASES if a in aliases]


def _finding(
    registry: PolicyRegistry,
    alias: str,
    version: str,
    record: VllmRecord | None,
    listed: dict[str, Card] | None,
) -> Finding:
    try:
        published = checkpoint_digest(registry.get(version))
    except UnknownVersion:
        published = "unknown version"
    model = record.routes.get(alias) if record else None
    served = record.serving.get(alias) if record else None
    adapter = record.adapters.get(model) if record and model else None
    digest = adapter.digest if adapter else (record.digests.get(served) if record else None)
    present = None if listed is None else (model in listed)
    problems = []
    if record is None:
        problems.append("no vllm-sync record: nothing was ever delivered to this vLLM")
    elif served != version:
        problems.append(
            f"the registry's {alias} is {version} but vLLM serves {served or 'nothing'} for it: "
            f"{version} was never delivered"
        )
    elif digest != published:
        problems.append(
            f"{model} was loaded from files with digest {digest}, the published checkpoint "
            f"of {version} has {published} now"
        )
    if listed is None:
        problems.append("vLLM did not answer its model list")
    elif model is not None and not present:
        problems.append(f"vLLM does not list {model} (restarted since it was loaded?)")
    if record is not None and record.status != "ok":
        problems.extend(f"last sync pass: {p}" for p in record.problems)
    return Finding(alias, version, published, served, model, digest, present, tuple(problems))
