"""The vLLM sync tests' pieces: a fake vLLM over real HTTP, real LoRA checkpoints of the tiny
model, a registry on the test's Redis, and a sync whose clock the test moves."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from deploy.policy_server.heartbeat import checkpoint_digest
from deploy.vllm_sync.record import adapter_name
from deploy.vllm_sync.sync import VllmSync
from deploy.vllm_sync.vllm_api import VllmApi
from learner.policy.registry import CHAMPION, PolicyRegistry, PolicyVersion
from tests.deploy.policy_server.support import make_lora
from tests.fakes.fake_vllm import FakeVllm
from tests.fakes.servers import ServerThread
from tests.s3_server import s3_bucket, s3_endpoint  # noqa: F401 - fixtures (test_object_storage)

DRAIN_S = 60.0


@dataclass
class Clock:
    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class World:
    """Everything one test drives: the fake vLLM and its server, the registry, the sync."""

    fake: FakeVllm
    server: ServerThread
    registry: PolicyRegistry
    sync: VllmSync
    clock: Clock
    folders: Path
    made: dict[str, Path] = field(default_factory=dict)

    def publish(self, seed: int, *, kind: str = "lora", champion: bool = True) -> str:
        """A new LoRA version (a real peft adapter of the tiny model), champion by default."""
        version = self.registry.next_version()
        folder = self.folders / version
        make_lora(folder, seed) if kind == "lora" else folder.mkdir()
        if kind == "full":
            (folder / "config.json").write_text("{}")
            (folder / "model.safetensors").write_bytes(b"not loaded by the sync")
        self.registry.publish(PolicyVersion(version, None, "tiny", folder.resolve().as_uri(), kind))
        if champion:
            expect = self.registry.aliases().get(CHAMPION)
            self.registry.promote(version, expect=expect, reason="test", actor="test")
        self.made[version] = folder
        return version

    def adapter(self, version: str) -> str:
        """The adapter name the sync must use for a version's files as they are now."""
        return adapter_name(version, checkpoint_digest(self.registry.get(version)))

    def restart_server(self) -> None:
        """vLLM back on the same port (the fake's state kept, as a network blip leaves it)."""
        self.server = ServerThread(self.fake.app, port=self.server.port).start()


@contextmanager
def world_on(client: redis.Redis, folders: Path) -> Iterator[World]:
    """A world on `client` (a plain Redis or a cluster client), stopped on leaving."""
    fake = FakeVllm(base_name="smollm2")
    server = ServerThread(fake.app).start()
    registry = PolicyRegistry(client)
    registry.ensure_base("tiny")
    clock = Clock()
    sync = VllmSync(
        client,
        VllmApi(server.url, timeout_s=10),
        route_name="arloop",
        drain_s=DRAIN_S,
        clock=clock,
    )
    try:
        yield World(fake, server, registry, sync, clock, folders)
    finally:
        sync.vllm.close()
        server.stop()


def loads_at_the_notice(world: World, settings) -> None:
    """Run the sync's loop; after its first pass, publish v1: its adapter must load within 20 s
    of the registry's notice (the loop's poll being 60 s), and the loop stop on its event."""
    import threading
    import time

    from deploy.vllm_sync.app import run
    from deploy.vllm_sync.record import read_record

    stop = threading.Event()
    loop = threading.Thread(target=run, args=(settings, stop), daemon=True)
    loop.start()
    deadline = time.monotonic() + 20
    while read_record(world.sync.client, "arloop") is None:  # the first pass, at start
        assert time.monotonic() < deadline and loop.is_alive()
        time.sleep(0.05)
    v1 = world.publish(seed=1)  # its promote publishes the notice
    while world.adapter(v1) not in world.fake.loras:
        assert time.monotonic() < deadline, "no pass within 20 s of the notice (poll: 60 s)"
        time.sleep(0.05)
    stop.set()
    loop.join(timeout=5)
    assert not loop.is_alive(), "the loop did not stop within 5 s of its stop event"


@pytest.fixture
def world(redis_client: redis.Redis, tmp_path) -> Iterator[World]:
    with world_on(redis_client, tmp_path) as w:
        yield w
