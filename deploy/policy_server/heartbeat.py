"""What this policy server process serves, told to Redis: a heartbeat key per process.

`arloop:serving:<instance>` (name from `agents.events.serving_key`) holds JSON: the process,
the version each alias serves and the digest of each loaded version's checkpoint, refreshed
by the follower thread and expiring when the process stops. The dashboard compares it with
the registry: a champion no live server reports was never delivered.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from pathlib import Path

import redis

from agents.events import serving_key
from learner.policy.models import CheckpointError, checkpoint_path
from learner.policy.registry import PolicyVersion
from learner.policy.storage import is_remote

WEIGHT_SUFFIXES = (".safetensors", ".bin")


def checkpoint_digest(record: PolicyVersion) -> str:
    """`sha256:<16 hex>` over the checkpoint's weight files (names and bytes); the base model
    is named instead (`base:<model>`): its weights are the model cache's, not a checkpoint.
    A checkpoint that loaded but cannot be read again says so (`unreadable: <why>`). An
    `s3://` one gives the registry's digest (over every file), shortened alike: its fetched
    copy loads only after it matched (`learner.policy.storage.fetch_checkpoint`)."""
    if record.checkpoint_uri.startswith("base:"):
        return record.checkpoint_uri
    if is_remote(record.checkpoint_uri):
        return (record.checkpoint_digest or "unreadable: no digest")[: len("sha256:") + 16]
    try:
        return _files_digest(checkpoint_path(record.checkpoint_uri))
    except (OSError, CheckpointError) as exc:
        return f"unreadable: {type(exc).__name__}"


def _files_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.suffix in WEIGHT_SUFFIXES):
        digest.update(path.relative_to(folder).as_posix().encode())
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return f"sha256:{digest.hexdigest()[:16]}"


class Heartbeat:
    """Writes this process's serving report under its key, with a time to live."""

    def __init__(self, client: redis.Redis, url: str, ttl_s: float) -> None:
        self.client, self.url, self.ttl_s = client, url, ttl_s
        self.instance = f"{socket.gethostname()}:{os.getpid()}"
        self.started_at = time.time()

    def beat(self, serving: dict[str, str], digests: dict[str, str]) -> None:
        report = {
            "instance": self.instance,
            "url": self.url,
            "pid": os.getpid(),
            "started_at": self.started_at,
            "updated_at": time.time(),
            "serving": serving,
            "digests": digests,
        }
        self.client.set(serving_key(self.instance), json.dumps(report), px=int(self.ttl_s * 1000))

    def stop(self) -> None:
        try:
            self.client.delete(serving_key(self.instance))
        except redis.RedisError:
            pass  # it expires by itself
