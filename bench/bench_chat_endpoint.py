"""The chat endpoint's overhead: one call through the agent API's `/v1/chat/completions` against
the same call straight to the policy server's, interleaved in one run.

Three processes on a fresh Redis, started as `arloop serve` starts them: the policy server
(`python -m deploy.policy_server.app`, the tiny test model built on the fly, or `--model
smollm2`, the default model, from its local cache; no network, no model hub) and the agent API
pointed at it with an API key. One client (httpx, one keep-alive connection per server) sends
the same request (one user message, `max_tokens` 4, temperature 0, a fixed seed) three ways:

    straight  the client's body to the policy server, as it is
    upstream  the body the agent API sends on (`model: arloop@champion`, logprobs and token ids
              asked for, as it always does): the model's own share of the extra cost
    through   the client's body to the agent API, with `X-Arloop-Run` and `X-Arloop-Agent`;
              each run is ended (`POST /v1/runs/{id}/end`, not timed) so its trajectory is
              written, and the trajectories in Redis are counted at the end

Each round runs the three in a rotating order, so drift and the machine's other load hit every
arm alike; rounds after `--warmup` are timed (wall clock, request sent to body read). Reported:
p50, p95 and p99 of each arm, through minus straight (the endpoint's overhead; goal at most
+3 ms at p50, issue 32), through over straight, the median of paired differences, the agent
API's CPU per run, and whether every arm answered the same text. The scrubber runs as deployed
(ARLOOP_SCRUB_PHI on; `--no-scrub` turns it off).

    .venv/bin/python bench/bench_chat_endpoint.py [--calls 200] [--warmup 20] [--model tiny]
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx
import redis
from rich.console import Console
from rich.table import Table

from agents.events import STREAM_TRAJECTORIES, decode
from deploy.embedded_redis import free_port, start_redis

API_KEY = "bench-key-" + "k" * 24
SECRET = "bench-secret-" + "s" * 32
ARMS = ("straight", "upstream", "through")
GOAL_MS = 3.0


def body(prompt: str, max_tokens: int, seed: int) -> dict:
    """The client's request: what a team's agent sends to either server."""
    return {
        "model": "arloop",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": seed,
    }


def upstream(request: dict) -> dict:
    """`request` as the agent API forwards it (agents.policy_client: the champion's arm named,
    logprobs and token ids always asked for)."""
    return request | {"model": "arloop@champion", "logprobs": True, "return_token_ids": True}


def start(
    args: list[str], env: dict[str, str], log: Path, ready: str, procs: list[subprocess.Popen]
) -> None:
    """A server process, added to `procs` at once (to be stopped whatever happens) and returned
    from once `ready` answers 200; its stderr goes to `log`."""
    with open(log, "wb") as out:  # the child keeps its own handle
        proc = subprocess.Popen(
            args, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=out
        )
    procs.append(proc)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{args[-1]} exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(ready, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{ready} did not answer in 300 s: {log.read_text()[-2000:]}")


def policy_env(opts: argparse.Namespace, work: Path, redis_url: str, port: int) -> dict[str, str]:
    env = {
        "ARLOOP_REDIS_URL": redis_url,
        "ARLOOP_BASE_MODEL": opts.model,
        "ARLOOP_DATA_DIR": str(work),
        "ARLOOP_POLICY_PORT": str(port),
        "ARLOOP_POLICY_ENGINE": opts.engine,
        "ARLOOP_THREADS": str(opts.threads),
        "ARLOOP_LOG_LEVEL": "WARNING",
    }
    if opts.model == "tiny":  # built in a second; smollm2 comes from the usual cache
        env["ARLOOP_MODEL_CACHE"] = str(work / "models")
        env["ARLOOP_TOOL_FORMAT"] = "line"  # the served pack's agents fit its 512 tokens
    return env


def agent_api_env(opts: argparse.Namespace, redis_url: str, policy: str, port: int) -> dict:
    return {
        "ARLOOP_REDIS_URL": redis_url,
        "ARLOOP_AGENTS_PORT": str(port),
        "ARLOOP_POLICY_API_BASE": f"{policy}/v1",
        "ARLOOP_POLICY_API_KEY": "none",
        "ARLOOP_POLICY_RETRIES": "0",
        "ARLOOP_API_KEYS": f'["{API_KEY}"]',
        "ARLOOP_SECRET_KEY": SECRET,
        "ARLOOP_PACKS": '["tutoring"]',
        "ARLOOP_POLICY_MAX_TOKENS": "64",  # its agents' calls fit the tiny model (the bench's
        # own body says max_tokens, so this changes nothing it times)
        "ARLOOP_SCRUB_PHI": str(opts.scrub).lower(),
        "ARLOOP_RUN_RATE_PER_MINUTE": "1000000",  # the bench's calls are not a user's
        "ARLOOP_KEY_RATE_PER_MINUTE": "1000000",
        "ARLOOP_CHAT_TOKENS_PER_MINUTE": "100000000",
        "ARLOOP_LOG_LEVEL": "WARNING",
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Client:
    """The bench's client: one keep-alive connection to each server; each arm a timed call."""

    def __init__(self, policy: str, api: str, opts: argparse.Namespace) -> None:
        self.policy = httpx.Client(base_url=policy, timeout=120)
        self.api = httpx.Client(
            base_url=api, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120
        )
        self.request = body(opts.prompt, opts.max_tokens, opts.seed)
        self.calls_per_run = opts.calls_per_run
        self.texts: dict[str, set[str]] = {arm: set() for arm in ARMS}
        self.runs_ended = 0
        self._run = 0
        self._calls_in_run = 0

    def arm(self, name: str) -> Callable[[], httpx.Response]:
        return {"straight": self.straight, "upstream": self.upstream, "through": self.through}[name]

    def straight(self) -> httpx.Response:
        return self.policy.post("/v1/chat/completions", json=self.request)

    def upstream(self) -> httpx.Response:
        return self.policy.post("/v1/chat/completions", json=upstream(self.request))

    def through(self) -> httpx.Response:
        run = {"X-Arloop-Run": f"bench-{self._run}", "X-Arloop-Agent": "bench"}
        return self.api.post("/v1/chat/completions", json=self.request, headers=run)

    def timed(self, name: str) -> float:
        """One call of arm `name`: its wall milliseconds (checked, then its run ended if due)."""
        started = time.perf_counter()
        reply = self.arm(name)()
        elapsed = (time.perf_counter() - started) * 1000
        if reply.status_code != 200:
            raise RuntimeError(f"{name}: {reply.status_code} {reply.text[:500]}")
        text = reply.json()["choices"][0]["message"]["content"] or ""
        self.texts[name].add(text)
        if name == "through":
            self._calls_in_run += 1
            if self._calls_in_run == self.calls_per_run:
                self.end(reply.headers["X-Arloop-Trajectory"], text)
        return elapsed

    def end(self, trajectory_id: str, output: str) -> None:
        ended = self.api.post(f"/v1/runs/{trajectory_id}/end", json={"output": output})
        if ended.status_code != 200:
            raise RuntimeError(f"ending run {trajectory_id}: {ended.status_code} {ended.text}")
        self.runs_ended += 1
        self._run, self._calls_in_run = self._run + 1, 0

    def close(self) -> None:
        self.policy.close()
        self.api.close()


def measure(client: Client, rounds: int, warmup: int, api_pid: int) -> tuple[dict, float]:
    """Interleaved rounds, the arms' order rotating; (times per arm, agent API CPU ms per run)."""
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    cpu_start = runs_start = 0.0
    for i in range(warmup + rounds):
        if i == warmup:
            cpu_start, runs_start = cpu_seconds(api_pid), client.runs_ended
        for k in range(len(ARMS)):
            name = ARMS[(i + k) % len(ARMS)]
            elapsed = client.timed(name)
            if i >= warmup:
                times[name].append(elapsed)
    runs = max(1, client.runs_ended - runs_start)
    return times, (cpu_seconds(api_pid) - cpu_start) * 1000 / runs


def trajectories(redis_url: str) -> tuple[int, int]:
    """(trajectories in the stream, those whose every step has token ids: trainable)."""
    with redis.Redis.from_url(redis_url) as client:
        events = [decode(fields) for _, fields in client.xrange(STREAM_TRAJECTORIES)]
    trainable = sum(
        bool(e.model_steps)
        and all(s.prompt_token_ids and s.completion_token_ids for s in e.model_steps)
        for e in events
    )
    return len(events), trainable


def report(console: Console, times: dict, cpu_ms: float, opts, recorded, expected, load) -> None:
    table = Table(title=f"{opts.calls} calls per arm after {opts.warmup} warm-up rounds (ms)")
    for column in ("arm", "p50", "p95", "p99", "mean", "min"):
        table.add_column(column, justify="left" if column == "arm" else "right")
    for arm, values in times.items():
        figures = [percentile(values, q) for q in (0.5, 0.95, 0.99)]
        figures += [statistics.fmean(values), min(values)]
        table.add_row(arm, *(f"{v:.2f}" for v in figures))
    for other in ("straight", "upstream"):
        diffs = [
            percentile(times["through"], q) - percentile(times[other], q) for q in (0.5, 0.95, 0.99)
        ]
        mean = statistics.fmean(times["through"]) - statistics.fmean(times[other])
        table.add_row(f"through - {other}", *(f"{d:+.2f}" for d in diffs), f"{mean:+.2f}", "")
    console.print(table)
    straight50, through50 = percentile(times["straight"], 0.5), percentile(times["through"], 0.5)
    paired = [t - s for t, s in zip(times["through"], times["straight"], strict=True)]
    verdict = "met" if through50 - straight50 <= GOAL_MS else "missed"
    console.print(
        f"overhead at p50: {through50 - straight50:+.2f} ms (goal <= +{GOAL_MS:g} ms: {verdict}); "
        f"through / straight at p50: {through50 / straight50:.2f}x, at p99: "
        f"{percentile(times['through'], 0.99) / percentile(times['straight'], 0.99):.2f}x; "
        f"median of paired differences {statistics.median(paired):+.2f} ms"
    )
    console.print(f"agent API CPU per run (its call and its end): {cpu_ms:.2f} ms")
    total, trainable = recorded
    console.print(
        f"trajectories in Redis: {total} (expected {expected}: every run, warm-up included), "
        f"{trainable} with token ids on every step"
    )
    console.print(f"load average before {load[0]}, after {load[1]} ({os.cpu_count()} cpus)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--calls", type=int, default=200, help="timed calls per arm (200)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed rounds first (20)")
    parser.add_argument(
        "--model",
        default="tiny",
        help="the policy's base: `tiny` (the test model, built on the fly; default), `smollm2` "
        "(the default model, from ARLOOP_MODEL_CACHE), or a local path",
    )
    parser.add_argument(
        "--engine",
        default="transformers",
        choices=["auto", "transformers", "llamacpp"],
        help="the policy server's engine (transformers)",
    )
    parser.add_argument("--threads", type=int, default=1, help="the policy server's threads (1)")
    parser.add_argument("--max-tokens", type=int, default=4, help="completion tokens a call (4)")
    parser.add_argument("--seed", type=int, default=7, help="the request's sampling seed (7)")
    parser.add_argument("--prompt", default="What is 12 plus 30?", help="the user message")
    parser.add_argument(
        "--calls-per-run",
        type=int,
        default=1,
        help="through-calls sharing one X-Arloop-Run before it is ended (1: a run per call)",
    )
    parser.add_argument(
        "--scrub",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the agent API's PHI scrubber, on as deployed (--no-scrub: off)",
    )
    opts = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `finally` stops the servers
    console = Console(soft_wrap=True)  # long lines stay whole in a log
    load_before = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    with tempfile.TemporaryDirectory(prefix="arloop-bench-chat-") as tmp:
        work = Path(tmp)
        redis_server = start_redis(work / "redis")
        procs: list[subprocess.Popen] = []
        client = None
        try:
            policy_port, api_port = free_port(), free_port()
            policy = f"http://127.0.0.1:{policy_port}"
            api = f"http://127.0.0.1:{api_port}"
            env = policy_env(opts, work, redis_server.url, policy_port)
            server = [sys.executable, "-m", "deploy.policy_server.app"]
            start(server, env, work / "policy.log", f"{policy}/healthz", procs)
            env = agent_api_env(opts, redis_server.url, policy, api_port)
            server = [sys.executable, "-c", "from deploy.agent_api.app import serve; serve()"]
            start(server, env, work / "agent_api.log", f"{api}/healthz", procs)
            client = Client(policy, api, opts)
            times, cpu_ms = measure(client, opts.calls, opts.warmup, procs[1].pid)
            recorded = trajectories(redis_server.url)
            expected = math.floor((opts.calls + opts.warmup) / opts.calls_per_run)
            load_after = " ".join(Path("/proc/loadavg").read_text().split()[:3])
            report(console, times, cpu_ms, opts, recorded, expected, (load_before, load_after))
            answers = {arm: sorted(texts) for arm, texts in client.texts.items()}
            same = len(set().union(*client.texts.values())) == 1
            console.print(f"same answer from every arm: {same} {answers if not same else ''}")
        finally:
            if client is not None:
                client.close()
            for proc in reversed(procs):
                stop(proc)
            redis_server.stop()


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 15 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
