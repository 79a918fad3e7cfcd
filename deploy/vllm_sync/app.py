"""`arloop serve vllm-sync`: the loop around `VllmSync.step`, and its `--check`."""

from __future__ import annotations

import logging
import threading
import time

import redis

from agents.events import POLICY_CHANNEL
from deploy import redis_conn
from deploy.embedded_redis import ensure_redis
from deploy.logs import setup_logging
from deploy.vllm_sync.check import Finding, delivery_check
from deploy.vllm_sync.record import VllmRecord, read_record
from deploy.vllm_sync.settings import VllmSyncSettings
from deploy.vllm_sync.sync import VllmSync
from deploy.vllm_sync.vllm_api import VllmApi, VllmDown, VllmRefused
from learner.policy.registry import PolicyRegistry

log = logging.getLogger("arloop.vllm_sync")


def connect(settings: VllmSyncSettings) -> tuple[redis.Redis, VllmApi]:
    url = ensure_redis(settings.redis_url, settings.data_dir)
    key = settings.vllm_api_key.get_secret_value() if settings.vllm_api_key else None
    return redis_conn.sync_client(url, settings), VllmApi(
        settings.vllm_url, key, settings.vllm_timeout_s
    )


def make_sync(settings: VllmSyncSettings, client: redis.Redis, vllm: VllmApi) -> VllmSync:
    return VllmSync(
        client,
        vllm,
        route_name=settings.vllm_route_name,
        base_name=settings.vllm_base_name,
        path_map=settings.vllm_path_map,
        drain_s=settings.vllm_drain_s,
        cache_dir=settings.data_dir / "vllm-sync",
    )


def run(settings: VllmSyncSettings, stop: threading.Event, *, once: bool = False) -> None:
    """Pass after pass until `stop`: at once on a registry notice, else every poll interval."""
    client, vllm = connect(settings)
    sync = make_sync(settings, client, vllm)
    notices = client.pubsub(ignore_subscribe_messages=True)
    last = None
    try:
        while not stop.is_set():
            try:
                if notices.connection is None:
                    notices.subscribe(POLICY_CHANNEL)
                record = sync.step()
                line = _summary(record)
                if line != last:
                    (log.info if record.status == "ok" else log.warning)("%s", line)
                    last = line
                if once:
                    return
                _wait(notices, stop, settings.vllm_poll_s)
            except redis.RedisError as exc:
                log.warning("Redis unavailable (%s): retrying in %.0f s", exc, settings.vllm_poll_s)
                notices = client.pubsub(ignore_subscribe_messages=True)
                stop.wait(settings.vllm_poll_s)
    finally:
        notices.close()
        vllm.close()


def _wait(notices: redis.client.PubSub, stop: threading.Event, poll_s: float) -> None:
    """Until a registry notice, `stop`, or `poll_s` seconds (checking `stop` every second)."""
    deadline = time.monotonic() + poll_s
    while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
        if notices.get_message(timeout=min(1.0, left)) is not None:
            return


def check(settings: VllmSyncSettings) -> list[Finding]:
    """The delivery check against the live vLLM and the registry."""
    client, vllm = connect(settings)
    try:
        listed = vllm.models()
    except (VllmDown, VllmRefused):
        listed = None
    finally:
        vllm.close()
    record = read_record(client, settings.vllm_route_name)
    return delivery_check(PolicyRegistry(client), record, listed)


def check_command() -> None:
    """Print the delivery check; exit 1 when an alias is not served as published."""
    import typer

    findings = check(VllmSyncSettings())
    for f in findings:
        state = "ok" if f.ok else "NOT DELIVERED"
        typer.echo(
            f"{f.alias}: {f.version} published {f.published_digest}; vLLM serves "
            f"{f.served_version or '-'} as {f.model or '-'} ({f.served_digest or '-'}): {state}"
        )
        for problem in f.problems:
            typer.echo(f"  - {problem}")
    if not findings:
        typer.echo("the registry names no champion yet")
    if not all(f.ok for f in findings):
        raise typer.Exit(1)


def serve(*, once: bool = False) -> None:
    settings = VllmSyncSettings()
    setup_logging("vllm_sync", settings.log_level, settings.log_format)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request: polls are many
    stop = threading.Event()
    try:
        run(settings, stop, once=once)
    except KeyboardInterrupt:
        stop.set()


def _summary(record: VllmRecord) -> str:
    routes = ", ".join(
        f"{alias} {record.serving[alias]} -> {model}"
        for alias, model in sorted(record.routes.items())
    )
    problems = f"; problems: {' | '.join(record.problems)}" if record.problems else ""
    return f"vLLM {record.status}: {routes or 'no routes'}{problems}"
