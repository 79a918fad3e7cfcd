"""The policy server overloaded: 256 concurrent requests (`n` 16, `max_tokens` 480) on the tiny
model, then SIGTERM under a second wave.

    .venv/bin/python bench/bench_policy_admission.py [--engine transformers|llamacpp]
        [--clients 256] [--client-timeout 60] [--shutdown-wave 64] [--queue-tokens N]

One server process (`python -m deploy.policy_server.app`, tiny base, its own embedded Redis).
Wave 1: `--clients` requests at once, each client giving up after `--client-timeout` s (it
closes its connection). Reported: served (200), refused (429/503, with their reasons), client
timeouts and other errors, the latency of the served ones (p50, p99, max), `/healthz` latency
during the wave (polled every 0.25 s), and the forward passes the engine ran in the 5 s after
every client had its answer or had left (generation for nobody). Wave 2: `--shutdown-wave`
requests at once, SIGTERM 2 s later; reported: seconds from SIGTERM to the process's exit
(SIGKILL after `--kill-after` s, reported as such) and what those clients got. The server's
settings are its defaults (`--queue-tokens` sets ARLOOP_POLICY_QUEUE_TOKENS).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import httpx

from deploy.embedded_redis import free_port, start_redis

BODY = {
    "model": "arloop",
    "messages": [{"role": "user", "content": "Tell me a story."}],
    "n": 16,
    "max_tokens": 480,
}


@dataclass
class Outcome:
    """What one client got: an HTTP status (0: none) or why not, and when."""

    status: int
    seconds: float
    why: str = ""


def ask(base: str, timeout: float) -> Outcome:
    started = time.perf_counter()
    try:
        with httpx.Client(timeout=timeout) as http:
            r = http.post(f"{base}/v1/chat/completions", json=BODY)
    except httpx.TimeoutException:
        return Outcome(0, time.perf_counter() - started, "client timeout")
    except httpx.HTTPError as exc:
        return Outcome(0, time.perf_counter() - started, type(exc).__name__)
    why = ""
    if r.status_code != 200:
        try:
            why = r.json()["error"].get("code") or r.json()["error"]["message"][:60]
        except (ValueError, KeyError, TypeError):
            why = r.text[:60]
    return Outcome(r.status_code, time.perf_counter() - started, why)


def wave(base: str, clients: int, timeout: float) -> list[Outcome]:
    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(lambda _: ask(base, timeout), range(clients)))


def forward_passes(base: str) -> int:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    found = re.search(r"^arloop_policy_batch_rows_count (\S+)$", text, re.M)
    return int(float(found.group(1))) if found else -1


class HealthPoller:
    """`/healthz` every 0.25 s on its own thread; each answer's latency."""

    def __init__(self, base: str) -> None:
        self.base, self.seconds, self.failures = base, [], 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=10) as http:
            while not self._stop.wait(0.25):
                started = time.perf_counter()
                try:
                    http.get(f"{self.base}/healthz").raise_for_status()
                    self.seconds.append(time.perf_counter() - started)
                except httpx.HTTPError:
                    self.failures += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def start_server(work: Path, args, redis_url: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    extra = {"ARLOOP_POLICY_QUEUE_TOKENS": str(args.queue_tokens)} if args.queue_tokens else {}
    env = {
        **os.environ,
        "ARLOOP_REDIS_URL": redis_url,
        "ARLOOP_BASE_MODEL": "tiny",
        "ARLOOP_MODEL_CACHE": str(work / "models"),
        "ARLOOP_DATA_DIR": str(work),
        "ARLOOP_POLICY_PORT": str(port),
        "ARLOOP_POLICY_ENGINE": args.engine,
        "ARLOOP_LOG_LEVEL": "WARNING",
        "ARLOOP_THREADS": "1",
        **extra,
    }
    with open(work / "server.log", "wb") as log:  # the child keeps its own handle
        proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.policy_server.app"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((work / "server.log").read_text()[-2000:])
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("policy server did not start in 300 s")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(outcomes: list[Outcome]) -> dict:
    served = [o.seconds for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status in (429, 503)]
    return {
        "served": len(served),
        "refused": len(refused),
        "refused_by": dict(Counter(f"{o.status} {o.why}" for o in refused)),
        "other": dict(
            Counter(o.why or str(o.status) for o in outcomes if o.status not in (200, 429, 503))
        ),
        "served_p50_s": round(percentile(served, 0.50), 2),
        "served_p99_s": round(percentile(served, 0.99), 2),
        "served_max_s": round(max(served, default=float("nan")), 2),
        "refused_max_s": round(max((o.seconds for o in refused), default=float("nan")), 2),
    }


def shutdown_seconds(proc: subprocess.Popen, kill_after: float) -> tuple[float, bool]:
    """Seconds from SIGTERM to exit, and whether it needed SIGKILL."""
    started = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=kill_after)
        return time.perf_counter() - started, False
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return time.perf_counter() - started, True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="transformers", choices=["transformers", "llamacpp"])
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--client-timeout", type=float, default=60.0)
    parser.add_argument("--shutdown-wave", type=int, default=64)
    parser.add_argument("--kill-after", type=float, default=60.0)
    parser.add_argument("--queue-tokens", type=int, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="arloop-bench-admission-") as tmp:
        work = Path(tmp)
        redis_proc = start_redis(work / "redis")
        proc, base = start_server(work, args, redis_proc.url)
        try:
            result = run(proc, base, args)
        finally:
            if proc.poll() is None:
                proc.kill()
            redis_proc.stop()
    print(json.dumps(result, indent=2))


def run(proc: subprocess.Popen, base: str, args) -> dict:
    health = HealthPoller(base)
    started = time.perf_counter()
    first = wave(base, args.clients, args.client_timeout)
    wave_s = time.perf_counter() - started
    health.stop()
    passes = forward_passes(base)
    time.sleep(5)
    after = forward_passes(base) - passes
    with ThreadPoolExecutor(1) as pool:
        passes = forward_passes(base)
        second = pool.submit(wave, base, args.shutdown_wave, args.client_timeout)
        time.sleep(2)
        busy = forward_passes(base) - passes
        seconds, killed = shutdown_seconds(proc, args.kill_after)
        late = second.result()
    return {
        "engine": args.engine,
        "queue_tokens": args.queue_tokens or "default",
        "wave": {"clients": args.clients, "seconds": round(wave_s, 1), **summary(first)},
        "healthz": {
            "polls": len(health.seconds),
            "failures": health.failures,
            "p99_ms": round(1000 * percentile(health.seconds, 0.99), 1),
            "max_ms": round(1000 * max(health.seconds, default=float("nan")), 1),
        },
        "forward_passes_5s_after_clients_left": after,
        "shutdown": {
            "clients": args.shutdown_wave,
            "forward_passes_in_2s_before_sigterm": busy,
            "sigterm_to_exit_s": round(seconds, 1),
            "needed_sigkill": killed,
            **summary(late),
        },
    }


if __name__ == "__main__":
    main()
