"""One pass of `arloop serve vllm-sync`: make a running vLLM serve what the registry's aliases
name, and write down what it really serves.

For each alias (champion first, then candidate) the version's LoRA checkpoint is loaded under
a new adapter name (`record.adapter_name`: version and checkpoint digest), unless vLLM lists
it already; the base version is vLLM's base model. When vLLM refuses a load (400, 404, 500)
or cannot be reached, the alias keeps the adapter it had (the last good one), a new candidate
with none rides on the champion's, and the record's status and problems say so. Adapters that
no alias uses any more are unloaded after `drain_s` (requests already sent to them finish);
only adapters this process loaded are ever unloaded. Full checkpoints cannot be loaded at run
time: vLLM takes them at start (a rolling restart, or a second vLLM); the record says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import redis

from deploy.policy_server.heartbeat import checkpoint_digest
from deploy.vllm_sync.record import (
    Adapter,
    VllmRecord,
    adapter_name,
    read_record,
    write_record,
)
from deploy.vllm_sync.vllm_api import Card, VllmApi, VllmDown, VllmRefused
from learner.policy.models import CheckpointError, checkpoint_problem
from learner.policy.registry import (
    CANDIDATE,
    CHAMPION,
    PolicyRegistry,
    PolicyVersion,
    UnknownVersion,
)
from learner.policy.storage import fetch_checkpoint

log = logging.getLogger("arloop.vllm_sync")
ALIASES = (CHAMPION, CANDIDATE)


class Undeliverable(RuntimeError):
    """A version this vLLM cannot serve now; the message says why and what to do."""


class VllmSync:
    """Reconciles one vLLM with the registry; `step()` is one pass."""

    def __init__(
        self,
        client: redis.Redis,
        vllm: VllmApi,
        *,
        route_name: str,
        base_name: str | None = None,
        path_map: dict[str, str] | None = None,
        drain_s: float = 120.0,
        clock: Callable[[], float] = time.time,
        cache_dir: Path | None = None,
    ) -> None:
        self.client, self.vllm, self.route_name = client, vllm, route_name
        self.cache_dir = cache_dir or Path(".arloop") / "vllm-sync"
        """Where `s3://` checkpoints are fetched (and their digest checked) for vLLM to read."""
        self.registry = PolicyRegistry(client)
        self.base_name, self.path_map = base_name, dict(path_map or {})
        self.drain_s, self.clock = drain_s, clock

    def step(self) -> VllmRecord:
        """One pass: load, route, retire, record. Never raises for vLLM's sake."""
        previous = read_record(self.client, self.route_name)
        record = VllmRecord(instance=f"vllm:{self.route_name}", url=self.vllm.url)
        try:
            listed = self.vllm.models()
        except (VllmDown, VllmRefused) as exc:
            return self._unreachable(previous, record, exc)
        record.adapters = self._still_loaded(previous, listed, record)
        self._route(previous, listed, record)
        self._retire(previous, record)
        record.versions = {n: a.version for n, a in record.adapters.items()}
        record.versions |= {record.routes[a]: record.serving[a] for a in record.routes}
        record.status = "degraded" if record.problems else "ok"
        record.updated_at = self.clock()
        write_record(self.client, self.route_name, record)
        return record

    # -- the pass's parts ------------------------------------------------------------------

    def _unreachable(
        self, previous: VllmRecord | None, record: VllmRecord, exc: Exception
    ) -> VllmRecord:
        """vLLM did not answer its model list: keep every route, say it is down."""
        if previous is not None:
            record = previous
        record.status, record.updated_at = "down", self.clock()
        record.problems = [f"{exc}: routes kept as they were ({_routes(record)})"]
        log.warning("vLLM unreachable: %s", exc)
        write_record(self.client, self.route_name, record)
        return record

    def _still_loaded(
        self, previous: VllmRecord | None, listed: dict[str, Card], record: VllmRecord
    ) -> dict[str, Adapter]:
        """The adapters of the last pass that vLLM still lists (a restarted vLLM forgets
        runtime adapters: they are loaded again below, and the loss is reported)."""
        kept = {}
        for name, adapter in (previous.adapters if previous else {}).items():
            if name in listed:
                kept[name] = adapter
            else:
                record.problems.append(
                    f"{name} ({adapter.version}) is no longer loaded in vLLM (restarted?)"
                )
        return kept

    def _route(
        self, previous: VllmRecord | None, listed: dict[str, Card], record: VllmRecord
    ) -> None:
        aliases = self.registry.aliases()
        for alias in ALIASES:
            version = aliases.get(alias)
            if version is None:
                continue
            try:
                name, digest = self._deliver(self.registry.get(version), listed, record)
            except (Undeliverable, UnknownVersion, VllmDown, VllmRefused) as exc:
                record.problems.append(f"{alias} {version} not delivered: {exc}")
                self._keep_last_good(alias, previous, listed, record)
                continue
            record.routes[alias], record.serving[alias] = name, version
            record.digests[version] = digest

    def _deliver(
        self, version: PolicyVersion, listed: dict[str, Card], record: VllmRecord
    ) -> tuple[str, str]:
        """(the model name that serves `version`, its digest), loading it when needed."""
        if version.checkpoint_uri.startswith("base:"):
            return self._base(listed), version.checkpoint_uri
        if version.checkpoint_kind != "lora":
            raise Undeliverable(
                f"a {version.checkpoint_kind} checkpoint: vLLM loads those only at start "
                "(`vllm serve <checkpoint folder>`: a rolling restart, or a second vLLM)"
            )
        problem = checkpoint_problem(version)
        if problem:
            raise Undeliverable(problem)
        digest = checkpoint_digest(version)
        if digest.startswith("unreadable"):
            raise Undeliverable(f"checkpoint {digest}")
        try:
            path = self._vllm_path(version)
        except CheckpointError as exc:  # not fetched, or not the registry's digest: not served
            raise Undeliverable(str(exc)) from exc
        name = adapter_name(version.version, digest)
        if name in listed and listed[name].root not in (None, path):
            raise Undeliverable(f"vLLM serves {name} from another path, {listed[name].root}")
        if name not in listed:
            self.vllm.load(name, path)
            listed[name] = Card(path, parent=self.base_name or "?")  # an adapter, not a base
            log.info("loaded %s (%s) into vLLM from %s", name, version.version, path)
        record.adapters.setdefault(name, Adapter(version.version, digest, path, self.clock()))
        return name, digest

    def _base(self, listed: dict[str, Card]) -> str:
        """vLLM's name for its base model (the configured one, else the one non-adapter)."""
        if self.base_name is not None:
            if self.base_name not in listed:
                raise Undeliverable(
                    f"vLLM does not list the base model {self.base_name!r} "
                    f"(ARLOOP_VLLM_BASE_NAME); it lists {sorted(listed)}"
                )
            return self.base_name
        bases = [n for n, card in listed.items() if card.parent is None]
        if len(bases) != 1:
            raise Undeliverable(f"set ARLOOP_VLLM_BASE_NAME: vLLM lists {sorted(listed)}")
        return bases[0]

    def _keep_last_good(
        self,
        alias: str,
        previous: VllmRecord | None,
        listed: dict[str, Card],
        record: VllmRecord,
    ) -> None:
        """The alias stays on what it had, if vLLM still serves it; a candidate with nothing
        to keep rides on the champion's model (its trajectories say which version ran)."""
        old = previous.routes.get(alias) if previous else None
        if old is not None and old in listed:
            record.routes[alias], record.serving[alias] = old, previous.serving[alias]
            version = previous.serving[alias]
            record.digests[version] = previous.digests.get(version, "?")
            if old in previous.adapters:
                record.adapters.setdefault(old, previous.adapters[old])
        elif alias != CHAMPION and CHAMPION in record.routes:
            record.routes[alias] = record.routes[CHAMPION]
            record.serving[alias] = record.serving[CHAMPION]

    def _retire(self, previous: VllmRecord | None, record: VllmRecord) -> None:
        """Unload this process's adapters that no alias uses, after the drain grace."""
        now, used = self.clock(), set(record.routes.values())
        for name in [n for n in record.adapters if n not in used]:
            since = (previous.retiring.get(name) if previous else None) or now
            if now - since < self.drain_s:
                record.retiring[name] = since
                continue
            try:
                self.vllm.unload(name)
            except VllmRefused as exc:
                if exc.status != 404:  # 404: vLLM has it no more, which is what we wanted
                    record.problems.append(f"unload of {name} refused: {exc}")
                    record.retiring[name] = since
                    continue
            except VllmDown as exc:
                record.problems.append(f"unload of {name} failed: {exc}")
                record.retiring[name] = since
                continue
            log.info("unloaded %s (%s) from vLLM", name, record.adapters[name].version)
            del record.adapters[name]

    def _vllm_path(self, version: PolicyVersion) -> str:
        """The checkpoint folder as vLLM's filesystem names it (ARLOOP_VLLM_PATH_MAP)."""
        path = str(fetch_checkpoint(version, self.cache_dir).resolve())
        for prefix, replacement in self.path_map.items():
            if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                return replacement.rstrip("/") + path[len(prefix.rstrip("/")) :]
        return path


def _routes(record: VllmRecord) -> str:
    return ", ".join(f"{a} -> {m}" for a, m in sorted(record.routes.items())) or "none"
