"""The versions a policy server holds: follow the registry's aliases, swap with no failed request.

A new champion is loaded beside the old one (on the follower thread), the alias switches under
a lock, requests already running keep their lease on the old version, and the old version is
freed when its last lease is released. A checkpoint that fails to load leaves serving as it
was, and is marked BROKEN in the registry with the error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from agents.events import POLICY_CHANNEL
from deploy.policy_server.heartbeat import checkpoint_digest
from deploy.policy_server.metrics import PolicyMetrics
from learner.policy.models import load_version
from learner.policy.registry import (
    BASE_VERSION,
    CANDIDATE,
    CHAMPION,
    PolicyRegistry,
    PolicyVersion,
    UnknownVersion,
    VersionStatus,
)
from learner.policy.storage import FetchFailed

log = logging.getLogger(__name__)
ALIASES = (CHAMPION, CANDIDATE)


class VersionUnavailable(LookupError):
    """The version exists but cannot be served now; the message says why."""


@dataclass(eq=False)
class LoadedPolicy:
    """One version in memory, with the requests that currently hold it."""

    version: str
    model: Any
    tokenizer: Any
    context: int
    in_flight: int = 0
    retired: bool = False
    on_demand: bool = False  # loaded because a request named it (`@v7`), not for an alias
    last_used: float = field(default_factory=time.monotonic)


Loader = Callable[[PolicyVersion], tuple[Any, Any]]


class VersionManager:
    """Loaded versions, the alias map being served, and the thread that follows the registry."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        base_model: str,
        model_cache: Path,
        device: str = "cpu",
        max_loaded: int = 4,
        poll_s: float = 5.0,
        context_length: int | None = None,
        metrics: PolicyMetrics | None = None,
        loader: Loader | None = None,
        on_beat: Callable[[dict[str, str], dict[str, str]], None] | None = None,
    ) -> None:
        self.client, self.registry = client, PolicyRegistry(client)
        self.base_model, self.device, self.max_loaded = base_model, device, max_loaded
        self.poll_s, self.context_length = poll_s, context_length
        self.metrics = metrics or PolicyMetrics()
        self.loader = loader or (
            lambda record: load_version(record, cache_dir=model_cache, device=device)
        )
        self._loaded: dict[str, LoadedPolicy] = {}
        self._aliases: dict[str, str] = {}
        self._digests: dict[str, str] = {}  # version -> digest of the checkpoint it loaded
        self.on_beat = on_beat
        """Hears (aliases served, digest per loaded version) after every sync: the heartbeat."""
        self._failed: set[str] = set()
        self._unfetched: dict[str, str] = {}  # version -> why object storage did not give it
        self._problems: dict[str, str] = {}  # alias -> why the registry's target is not served
        self.notices: list[str] = []  # what an operator should know (a rewound registry)
        self._in_memory: set[int] = set()  # ids of policies whose weights are held, retired too
        self._lock = threading.RLock()
        self._load_locks: dict[str, threading.Lock] = {}
        self._stop = threading.Event()
        self._follower = threading.Thread(target=self._follow, name="policy-follower", daemon=True)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Register the base, load what the aliases name (the base if that fails), follow."""
        self.registry.ensure_base(self.base_model)
        self.sync()
        if CHAMPION not in self._aliases:
            log.error("champion could not be loaded; serving the base model %s", BASE_VERSION)
            policy = self._ensure_loaded(BASE_VERSION, on_demand=False)
            if policy is None:
                raise RuntimeError(f"the base model {self.base_model!r} does not load either")
            self._switch(CHAMPION, BASE_VERSION)
            self.sync()  # records why the registry's champion is not the one served
        self._beat()
        self._follower.start()

    def stop(self) -> None:
        self._stop.set()
        if self._follower.is_alive():
            self._follower.join(timeout=10)

    # -- requests --------------------------------------------------------------------------

    def pin_loaded(self, name: str) -> LoadedPolicy | None:
        """`name` (alias or version) pinned in memory for one request if it is loaded now, else
        None (`unpin` when the request ends)."""
        with self._lock:
            version = self._aliases.get(name, name)
            policy = self._loaded.get(version)
            if policy is None:
                return None
            policy.in_flight += 1
            policy.last_used = time.monotonic()
            return policy

    def pin(self, name: str) -> LoadedPolicy:
        """`name` pinned, loading a registered version on demand (blocking: call in a thread)."""
        policy = self.pin_loaded(name)
        if policy is not None:
            return policy
        if name in ALIASES:
            raise UnknownVersion(f"no version is {name} now")
        record = self.registry.get(name)  # UnknownVersion for a name the registry lacks
        if record.status is VersionStatus.BROKEN:
            raise VersionUnavailable(f"version {name} is broken: {record.error}")
        if self._ensure_loaded(name, on_demand=True) is None:
            raise VersionUnavailable(f"version {name} failed to load: {self._error_of(name)}")
        policy = self.pin_loaded(name)
        if policy is None:
            raise VersionUnavailable(f"version {name} was unloaded while loading; retry")
        return policy

    def unpin(self, policy: LoadedPolicy) -> None:
        """A request is done with `policy`; the last pin on a retired version frees it."""
        with self._lock:
            policy.in_flight -= 1
            free = policy.retired and policy.in_flight == 0
        if free:
            self._free(policy)

    def serving(self) -> dict[str, str]:
        with self._lock:
            return dict(self._aliases)

    def loaded(self) -> list[str]:
        with self._lock:
            return [v for v, p in self._loaded.items() if not p.retired]

    def digests(self) -> dict[str, str]:
        """Version -> digest of the checkpoint in memory (`heartbeat.checkpoint_digest`)."""
        with self._lock:
            return {v: self._digests[v] for v in self._loaded if v in self._digests}

    def problems(self) -> list[str]:
        """Why the champion served is not the registry's (it cannot load); [] when it is."""
        with self._lock:
            return [why for alias, why in self._problems.items() if alias == CHAMPION]

    def _beat(self) -> None:
        if self.on_beat is not None:
            self.on_beat(self.serving(), self.digests())

    # -- following the registry ------------------------------------------------------------

    def sync(self) -> None:
        """Make the served aliases match the registry's, loading new targets first."""
        wanted = self.registry.aliases()
        for alias in ALIASES:
            target, current = wanted.get(alias), self._aliases.get(alias)
            if target == current:
                self._problems.pop(alias, None)
                continue
            if alias == CHAMPION and current and target:
                self._check_rewind(current, target)
            if target is None or self._ensure_loaded(target, on_demand=False) is not None:
                self._switch(alias, target)
                self._problems.pop(alias, None)
            else:
                self._problems[alias] = (
                    f"the registry's {alias} {target} cannot load "
                    f"({self._error_of(target)}); serving {current or 'nothing'} instead"
                )

    def _check_rewind(self, current: str, target: str) -> None:
        """A champion replaced by an older version while the one served left the registry:
        Redis was rolled back (a restore, a failover to a lagging replica). Said, not hidden."""
        if _number(target) >= _number(current) or self.registry.exists(current):
            return
        notice = (
            f"the registry was rewound: champion {current} is no longer in it and the champion "
            f"is now {target} (Redis restored from an older state?); serving {target}. The "
            "learner reconciles its store at its next round (`arloop policy list`)."
        )
        log.error(notice)
        self.notices = (self.notices + [notice])[-5:]

    def _error_of(self, version: str) -> str:
        if version in self._unfetched:
            return self._unfetched[version]
        try:
            return self.registry.get(version).error or "load failed"
        except (UnknownVersion, redis.RedisError):
            return "not in the registry"

    def _follow(self) -> None:
        """Sync on every registry notice, and every `poll_s` in case a notice was missed."""
        pubsub = None
        while not self._stop.is_set():
            try:
                if pubsub is None:
                    pubsub = self.client.pubsub(ignore_subscribe_messages=True)
                    pubsub.subscribe(POLICY_CHANNEL)
                pubsub.get_message(timeout=self.poll_s)
                while pubsub.get_message(timeout=0.01):  # a burst of notices: one sync
                    pass
                if not self._stop.is_set():
                    self.sync()
                    self._beat()
            except redis.RedisError as exc:
                log.warning("registry unreachable (%s); retrying", exc)
                pubsub = None
                self._stop.wait(min(self.poll_s, 1.0))
            except Exception:  # never let the follower die: serving continues on what it has
                log.exception("policy sync failed")
                self._stop.wait(min(self.poll_s, 1.0))
        if pubsub is not None:
            pubsub.close()

    def _switch(self, alias: str, version: str | None) -> None:
        with self._lock:
            previous = self._aliases.get(alias)
            if version is None:
                self._aliases.pop(alias, None)
            else:
                self._aliases[alias] = version
            self._retire_unused()
            self.metrics.set_serving(self._aliases)
        log.info("%s: %s -> %s", alias, previous, version)

    def _ensure_loaded(self, version: str, *, on_demand: bool) -> LoadedPolicy | None:
        """The version in memory (loading it now if needed); None if its checkpoint is broken."""
        with self._lock:
            lock = self._load_locks.setdefault(version, threading.Lock())
        with lock:
            with self._lock:
                policy = self._loaded.get(version)
                if policy is not None and not policy.retired:
                    policy.on_demand = policy.on_demand or on_demand
                    return policy
            if version in self._failed:
                return None
            return self._load(version, on_demand)

    def _load(self, version: str, on_demand: bool) -> LoadedPolicy | None:
        try:
            record = self.registry.get(version)
            if record.status is VersionStatus.BROKEN:
                raise RuntimeError(f"marked broken in the registry: {record.error}")
            started = time.monotonic()
            model, tokenizer = in_own_thread(self.loader, record)
            digest = checkpoint_digest(record)
        except FetchFailed as exc:  # object storage down or denied: nothing known against it
            log.warning("version %s not fetched, tried again at the next sync: %s", version, exc)
            self._unfetched[version] = str(exc)
            return None
        except Exception as exc:  # noqa: BLE001 - any bad checkpoint must leave serving as it was
            self._mark_broken(version, exc)
            return None
        policy = LoadedPolicy(version, model, tokenizer, self._context(model), on_demand=on_demand)
        self._unfetched.pop(version, None)
        with self._lock:
            self._loaded[version] = policy
            self._digests[version] = digest
            self._in_memory.add(id(policy))
            self._evict_on_demand()
            self.metrics.loaded_versions.set(len(self._in_memory))
        self.metrics.loads.inc()
        log.info("loaded %s in %.1f s", version, time.monotonic() - started)
        return policy

    def _mark_broken(self, version: str, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        log.error("version %s failed to load, still serving %s: %s", version, self._aliases, error)
        self._failed.add(version)
        self.metrics.load_failures.inc()
        try:
            if self.registry.exists(version):
                self.registry.mark_broken(version, error[:2000])
        except redis.RedisError:
            log.warning("could not mark %s broken in the registry", version)

    def _context(self, model: Any) -> int:
        own = getattr(model, "context", None)  # an engine's own limit per sequence (llama.cpp)
        if isinstance(own, int):
            return own
        if self.context_length:
            return self.context_length
        return int(getattr(model.config, "max_position_embeddings", 2048))

    def _retire_unused(self) -> None:
        """Retire versions no alias names and no request asked for; free the idle ones now."""
        targets = set(self._aliases.values())
        for policy in list(self._loaded.values()):
            if policy.version not in targets and not policy.on_demand:
                self._retire(policy)

    def _evict_on_demand(self) -> None:
        """Keep at most `max_loaded` versions: retire least recently used on-demand ones."""
        targets = set(self._aliases.values())
        spare = [p for p in self._loaded.values() if p.on_demand and p.version not in targets]
        for policy in sorted(spare, key=lambda p: p.last_used):
            if len(self._loaded) <= self.max_loaded:
                break
            self._retire(policy)

    def _retire(self, policy: LoadedPolicy) -> None:
        policy.retired = True
        self._loaded.pop(policy.version, None)
        if policy.in_flight == 0:
            self._free(policy)

    def _free(self, policy: LoadedPolicy) -> None:
        policy.model = None  # the last reference: refcounting frees the weights now
        with self._lock:
            self._in_memory.discard(id(policy))
            self.metrics.loaded_versions.set(len(self._in_memory))
        log.info("freed %s", policy.version)


def in_own_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` on a new thread that ends when it returns: its result, or its exception.

    A load runs torch (a checkpoint's weights, a LoRA merged for the llama.cpp export), whose
    OpenMP keeps a team of threads for every thread that ever ran a parallel region, for that
    thread's life; torch and llama.cpp share one libgomp. With such a team kept on a thread
    that stayed (a request's), llama.cpp decoded at 1.25 cores instead of 1.9 for the rest of
    the server's life, and one gate's sampled runs took 84 s instead of 54 s
    (`bench/bench_gate.py --export`): as we read libgomp, it cuts its spin before a wait
    short once it manages more threads than there are cores, so llama.cpp's barriers (one
    after each operation of a decoding step) sleep. A thread that ends takes its team with it.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy-load") as pool:
        return pool.submit(fn, *args).result()  # leaving the block joins the worker


def _number(version: str) -> int:
    """7 for `v7`; -1 for a name that is not `v<N>`."""
    return int(version[1:]) if version[:1] == "v" and version[1:].isdigit() else -1
