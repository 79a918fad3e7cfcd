"""What `arloop serve vllm-sync` writes to Redis about one vLLM, and how adapters are named.

The record (`agents.events.vllm_routes_key(<route name>)`, JSON, no expiry: vLLM keeps serving
its adapters when this process stops) is shaped like a policy server's heartbeat (`serving`:
alias -> version served, `digests`: version -> checkpoint digest), so the dashboard's
delivery check reads it too, plus what the agents route by: `routes` (alias -> the model
name to call), `versions` (model name -> version, for the trajectory), the adapters this
process loaded, those draining before their unload, and the problems of the last pass.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import redis

from agents.events import vllm_routes_key

Status = Literal["ok", "degraded", "down"]


def adapter_name(version: str, digest: str) -> str:
    """A new name per version and checkpoint (`v3-1a2b3c4d`): vLLM never sees one name with
    two weights, whose prefix-cache entries it could mix (vllm #42125)."""
    return f"{version}-{digest.removeprefix('sha256:')[:8]}"


@dataclass
class Adapter:
    """One LoRA adapter this process loaded into vLLM."""

    version: str
    digest: str
    """The checkpoint digest of the files it was loaded from (`sha256:<16 hex>`)."""
    path: str
    """The folder as vLLM was told it."""
    loaded_at: float = field(default_factory=time.time)


@dataclass
class VllmRecord:
    """The last pass of the sync over one vLLM (see the module docstring)."""

    instance: str
    url: str
    status: Status = "ok"
    updated_at: float = field(default_factory=time.time)
    serving: dict[str, str] = field(default_factory=dict)
    """alias -> the version vLLM serves for it (the last good one when a load failed)."""
    digests: dict[str, str] = field(default_factory=dict)
    """version -> digest of what vLLM serves for it."""
    routes: dict[str, str] = field(default_factory=dict)
    """alias -> the vLLM model name agents call (an adapter, or the base model for v0)."""
    versions: dict[str, str] = field(default_factory=dict)
    """vLLM model name -> version, draining adapters included."""
    adapters: dict[str, Adapter] = field(default_factory=dict)
    retiring: dict[str, float] = field(default_factory=dict)
    """adapter -> when no alias used it any more (unloaded after the drain grace)."""
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> VllmRecord:
        data: dict[str, Any] = json.loads(text)
        data["adapters"] = {n: Adapter(**a) for n, a in data.get("adapters", {}).items()}
        return cls(**data)


def read_record(client: redis.Redis, route_name: str) -> VllmRecord | None:
    raw = client.get(vllm_routes_key(route_name))
    return VllmRecord.from_json(raw) if raw else None


def write_record(client: redis.Redis, route_name: str, record: VllmRecord) -> None:
    client.set(vllm_routes_key(route_name), record.to_json())
