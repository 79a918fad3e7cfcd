"""Agent API memory over many runs: its RSS and Redis' bytes per run, with feedback on every
run while the dashboard and the report card are polled.

A real agent API process (`arloop serve agents`, uvicorn) on a fresh redis-server, real HTTP,
a scripted OpenAI-compatible model (`tests/fakes/scripted_llm.py`: `--tool-steps` calculator
calls, none by default, then an answer, as policy version v0) that keeps no log. Two tenants' keys take turns; every run
gets a thumbs, every fourth a rating too; users keep a thread for `--turns` runs. The dashboard
and the report card are read every `--poll-every` runs, each tenant in turn. Printed: the API
process' RSS at the start (after a warm-up), every tenth of the runs and at the end; Redis
`used_memory` per run; and the dashboard's live traffic against what the client sent.

Arms, side by side (the same load on the machine), each on its own Redis and API process:
- `bounded`: the code as it is;
- `legacy`: the same code with the live tallies as they were before they were bounded
  (`bench/legacy_tally.py`: every rated run id kept, batches of 1,000 entries a read, all
  tenants together).

    .venv/bin/python bench/bench_agent_api_memory.py [--runs 100000] [--arms bounded,legacy]
        [--tool-steps 0] [--trace]  # --trace: tracemalloc in the API, the sites that grew most

100,000 runs take about 20 minutes on 2 cores (both arms side by side, 90 runs/s each).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx
import redis

from deploy.embedded_redis import RedisProcess, free_port, start_redis

QUESTION = "What is 17 + 25? Show the sum."
TENANTS = {"acme": "bench-key-acme-" + "a" * 24, "globex": "bench-key-globex-" + "g" * 24}
VERSION = "v0"
TRACE_PATH = "/bench/tracemalloc"


# -- the processes --------------------------------------------------------------------------


def serve_llm(port: int, tool_steps: int) -> None:
    """The scripted model: calculator calls, then an answer; no request log (it would grow)."""
    from collections import deque

    import uvicorn

    from tests.fakes.scripted_llm import ScriptedLLM, tool_loop_responder

    loop = tool_loop_responder("calculator", '{"expression": "17+25"}', tool_steps)

    def respond(request: dict) -> object:
        reply = loop(request)
        reply.fingerprint = VERSION
        return reply

    llm = ScriptedLLM(responder=respond)
    llm.requests, llm.responses = deque(maxlen=0), deque(maxlen=0)
    uvicorn.run(
        llm.app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
    )


def serve_api(arm: str, trace: bool) -> None:
    """`arloop serve agents`, with the legacy tallies or tracemalloc when asked."""
    if trace:
        import tracemalloc

        tracemalloc.start(3)  # deeper traces slow the API tenfold
    if arm == "legacy":
        from bench.legacy_tally import install

        install()
    from deploy.agent_api import app as api

    if trace:
        made = api.create_app

        def create_app(*args, **kwargs):
            app = made(*args, **kwargs)

            @app.get(TRACE_PATH, include_in_schema=False)
            def dump(path: str) -> dict:
                import gc
                import tracemalloc

                gc.collect()
                tracemalloc.take_snapshot().dump(path)
                return {"dumped": path}

            return app

        api.create_app = create_app
    api.serve()


def spawn(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env={**os.environ, **(env or {})})


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the process for {url} exited ({proc.returncode})")
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    sys.exit(f"{url} did not answer in {timeout:.0f} s")


def rss_mb(pid: int) -> float:
    """The process' resident set (Linux /proc), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    """User + system CPU time a process has used (Linux /proc), s."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the load -------------------------------------------------------------------------------


class Load:
    """What the client sent (per tenant) and the API's RSS as it went."""

    def __init__(self, api: httpx.AsyncClient, pid: int, opts: argparse.Namespace, name: str):
        self.api, self.pid, self.opts, self.name = api, pid, opts, name
        self.sent: dict[str, Counter] = {t: Counter() for t in TENANTS}
        self.rss: list[tuple[int, float]] = []
        self.done = 0
        self.next_i = 0
        self.poll_s: list[float] = []

    async def worker(self, w: int, total: int) -> None:
        """Runs one after the other; a thread (one tenant's user) lasts `turns` runs."""
        thread, turn, tenant, user = None, 0, "", ""
        while self.next_i < total:
            i = self.next_i
            self.next_i += 1
            if turn % self.opts.turns == 0:
                k = i // self.opts.turns
                thread, tenant, user = None, list(TENANTS)[k % len(TENANTS)], f"w{w}-{k % 50}"
            thread = await self.one_run(tenant, user, thread, i)
            turn += 1
            self.done += 1
            if self.done % self.opts.poll_every == 0:
                await self.poll(list(TENANTS)[(self.done // self.opts.poll_every) % 2])

    async def one_run(self, tenant: str, user: str, thread: str | None, i: int) -> str:
        """A run, its thumbs (and every fourth a rating); the run's thread."""
        headers = {"Authorization": f"Bearer {TENANTS[tenant]}"}
        body = {"input": QUESTION, "user_id": user} | ({"thread_id": thread} if thread else {})
        reply = await self.api.post("/v1/agents/tutor/runs", json=body, headers=headers)
        if reply.status_code != 200:
            raise SystemExit(f"run {i}: {reply.status_code} {reply.text[:300]}")
        run = reply.json()
        sent = self.sent[tenant]
        sent["runs"] += 1
        up = i % 3 != 0
        posts = [{"kind": "thumbs", "value": 1 if up else -1}]
        if i % 4 == 0:
            posts.append({"kind": "rating", "value": 4})
        for post in posts:
            fb = {"trajectory_id": run["trajectory_id"], "feedback_token": run["feedback_token"]}
            answer = await self.api.post("/v1/feedback", json=fb | post, headers=headers)
            if answer.status_code != 202:
                raise SystemExit(f"feedback {i}: {answer.status_code} {answer.text[:300]}")
            sent["feedback"] += 1
        sent["rated"] += 1
        sent["thumbs_up" if up else "thumbs_down"] += 1
        return run["thread_id"]

    async def poll(self, tenant: str) -> dict:
        headers = {"Authorization": f"Bearer {TENANTS[tenant]}"}
        start = time.perf_counter()
        board = await self.api.get("/v1/dashboard", headers=headers)
        card = await self.api.get("/v1/report-card", headers=headers)
        self.poll_s.append(time.perf_counter() - start)
        if board.status_code != 200 or card.status_code != 200:
            raise SystemExit(f"dashboard {board.status_code}, report card {card.status_code}")
        return board.json()

    async def sample(self, total: int, every: int) -> None:
        """RSS at every `every` runs done (the workers run meanwhile)."""
        mark = every
        while mark <= total:
            if self.done >= mark:
                self.rss.append((mark, rss_mb(self.pid)))
                if total == self.opts.runs:  # not the warm-up's
                    print(f"  {self.name}: {mark} runs, RSS {self.rss[-1][1]:.1f} MB", flush=True)
                mark += every
            else:
                await asyncio.sleep(0.05)

    async def run(self, total: int) -> None:
        self.next_i, self.done, self.rss = 0, 0, []
        every = max(1, total // 10)
        workers = [self.worker(w, total) for w in range(self.opts.concurrency)]
        await asyncio.gather(self.sample(total, every), *workers)


async def drive(arm: Arm, opts: argparse.Namespace) -> dict:
    """Warm up, then the measured runs; RSS and Redis memory before, during and after."""
    pid, pids = arm.api.pid, {"api": arm.api.pid, "redis": arm.redis.process.pid}
    r = redis.Redis.from_url(arm.redis.url)
    async with httpx.AsyncClient(base_url=arm.url, timeout=120) as api:
        load = Load(api, pid, opts, arm.name)
        await load.run(opts.warmup)
        await load.poll("acme")
        await asyncio.sleep(1)
        start_rss, start_mem = rss_mb(pid), r.info("memory")["used_memory"]
        series = [await _series(api)]
        trace = opts.trace and f"{tempfile.gettempdir()}/arloop-bench-trace-{pid}"
        if trace:
            await api.get(TRACE_PATH, params={"path": trace + "-0"})
        began, cpu = time.perf_counter(), {k: cpu_s(p) for k, p in pids.items()}
        await load.run(opts.runs)
        seconds = time.perf_counter() - began
        cpu = {k: (cpu_s(p) - cpu[k]) * 1000 / opts.runs for k, p in pids.items()}
        boards = {t: await load.poll(t) for t in TENANTS}
        end_rss, end_mem = rss_mb(pid), r.info("memory")["used_memory"]
        series.append(await _series(api))
        if trace:
            await api.get(TRACE_PATH, params={"path": trace + "-1"})
    r.close()
    return {
        "start_rss": start_rss,
        "rss": load.rss,
        "end_rss": end_rss,
        "redis_per_run": (end_mem - start_mem) / opts.runs,
        "redis_mb": end_mem / 2**20,
        "seconds": seconds,
        "cpu_ms": cpu,
        "poll_ms": sorted(load.poll_s)[len(load.poll_s) // 2] * 1000 if load.poll_s else 0.0,
        "sent": load.sent,
        "boards": boards,
        "trace": trace,
        "series": series,
    }


async def _series(api: httpx.AsyncClient) -> int:
    """Samples on the API's /metrics (label sets: what would grow with ids in labels)."""
    text = (await api.get("/metrics")).text
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


@dataclass
class Arm:
    """One arm's Redis and API process."""

    name: str
    redis: RedisProcess
    api: subprocess.Popen
    url: str

    def stop(self) -> None:
        self.api.terminate()
        try:
            self.api.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.api.kill()
        self.redis.stop()


def start_arm(name: str, llm_url: str, opts: argparse.Namespace) -> Arm:
    """A fresh Redis (the registry holding v0) and an agent API process on it."""
    tmp = Path(tempfile.mkdtemp(prefix=f"arloop-bench-{name}-"))
    server = start_redis(tmp / "redis", extra=("--appendonly", "no"))
    _register(server.url)
    port = free_port()
    keys = [{"key": k, "name": t, "tenant": t} for t, k in TENANTS.items()]
    env = {
        "ARLOOP_REDIS_URL": server.url,
        "ARLOOP_AGENTS_PORT": str(port),
        "ARLOOP_POLICY_API_BASE": llm_url,
        "ARLOOP_POLICY_RETRIES": "0",
        "ARLOOP_PACKS": '["tutoring"]',
        "ARLOOP_SCRUB_PHI": "false",
        "ARLOOP_API_KEYS": json.dumps(keys),
        "ARLOOP_SECRET_KEY": "bench-secret-" + "s" * 32,
        "ARLOOP_RUN_RATE_PER_MINUTE": "10000000",
        "ARLOOP_KEY_RATE_PER_MINUTE": "10000000",
        "ARLOOP_FEEDBACK_RATE_PER_MINUTE": "10000000",
        "ARLOOP_LOG_LEVEL": "WARNING",
        "ARLOOP_STREAM_MAX_ENTRIES": str(opts.stream_max_entries),
        "ARLOOP_THREAD_TTL_S": str(opts.thread_ttl_s),
        "ARLOOP_DATA_DIR": str(tmp / "data"),
    }
    args = [__file__, "--serve-api", name] + (["--trace"] if opts.trace else [])
    arm = Arm(name, server, spawn(args, env), f"http://127.0.0.1:{port}")
    try:
        wait_http(f"{arm.url}/healthz", arm.api)
    except BaseException:
        arm.stop()
        raise
    return arm


def _register(redis_url: str) -> None:
    """The version the scripted model reports, in the registry (the dashboard's rows)."""
    from learner.policy.registry import PolicyRegistry

    with redis.Redis.from_url(redis_url) as client:
        PolicyRegistry(client).ensure_base("scripted")


# -- the report -----------------------------------------------------------------------------


def report(results: dict[str, dict], opts: argparse.Namespace) -> None:
    arms = list(results)
    print(
        f"\n{opts.runs} runs (+{opts.warmup} warm-up), concurrency {opts.concurrency}, "
        f"dashboard and report card every {opts.poll_every} runs; cpus {os.cpu_count()}, "
        f"load average {os.getloadavg()[0]:.2f}; {time.strftime('%Y-%m-%d %H:%M')}; retention: "
        f"streams {opts.stream_max_entries} entries, threads {opts.thread_ttl_s} s"
    )
    print("API RSS, MB      " + "".join(f"{a:>12}" for a in arms))
    print("  start          " + "".join(f"{results[a]['start_rss']:12.1f}" for a in arms))
    for k, (mark, _) in enumerate(results[arms[0]]["rss"]):
        row = "".join(f"{results[a]['rss'][k][1]:12.1f}" for a in arms)
        print(f"  {mark:>8} runs  " + row)
    print("  end            " + "".join(f"{results[a]['end_rss']:12.1f}" for a in arms))
    growth = "".join(f"{results[a]['end_rss'] - results[a]['start_rss']:+12.1f}" for a in arms)
    print("  growth         " + growth)
    per_run = "".join(
        f"{(results[a]['end_rss'] - results[a]['start_rss']) * 2**20 / opts.runs:12.0f}"
        for a in arms
    )
    print("  bytes per run  " + per_run)
    print("Redis used_memory")
    print("  bytes per run  " + "".join(f"{results[a]['redis_per_run']:12.0f}" for a in arms))
    print("  at end, MB     " + "".join(f"{results[a]['redis_mb']:12.1f}" for a in arms))
    print("runs/s           " + "".join(f"{opts.runs / results[a]['seconds']:12.1f}" for a in arms))
    for name in results[arms[0]]["cpu_ms"]:
        cpu = "".join(f"{results[a]['cpu_ms'][name]:12.2f}" for a in arms)
        print(f"CPU ms/run {name:<6}" + cpu)
    series = "".join(f"{'{} -> {}'.format(*results[a]['series']):>12}" for a in arms)
    print("/metrics samples " + series)
    print("poll p50, ms     " + "".join(f"{results[a]['poll_ms']:12.1f}" for a in arms))
    for arm in arms:
        print(f"{arm}: dashboard traffic of {VERSION} against what was sent, per tenant")
        for tenant, board in results[arm]["boards"].items():
            row = next((r for r in board["versions"] if r["version"] == VERSION), {})
            shown = row.get("traffic") or {}
            sent = results[arm]["sent"][tenant]
            fields = ("runs", "rated", "feedback", "thumbs_up", "thumbs_down")
            pairs = ", ".join(f"{f} {shown.get(f)}/{sent[f]}" for f in fields)
            print(f"  {tenant}: {pairs} (shown/sent, warm-up included)")
        if results[arm]["trace"]:
            _top_growth(results[arm]["trace"])


def _top_growth(prefix: str, n: int = 15) -> None:
    import tracemalloc

    before = tracemalloc.Snapshot.load(prefix + "-0")
    after = tracemalloc.Snapshot.load(prefix + "-1")
    print("  tracemalloc, the sites that grew most:")
    for stat in after.compare_to(before, "traceback")[:n]:
        frames = " < ".join(f"{Path(f.filename).name}:{f.lineno}" for f in stat.traceback[:4])
        print(f"    {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks  {frames}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--poll-every", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=4, help="runs a thread takes before a new one")
    parser.add_argument("--tool-steps", type=int, default=0, help="calculator calls a run")
    parser.add_argument("--arms", default="bounded,legacy")
    parser.add_argument("--trace", action="store_true", help="tracemalloc in the API (slower)")
    parser.add_argument(
        "--stream-max-entries",
        type=int,
        default=200_000,
        help="retention: ARLOOP_STREAM_MAX_ENTRIES (runs, and apart feedback, kept)",
    )
    parser.add_argument(
        "--thread-ttl-s",
        type=int,
        default=30 * 24 * 3600,
        help="retention: ARLOOP_THREAD_TTL_S (an idle thread's life)",
    )
    parser.add_argument("--serve-api", help=argparse.SUPPRESS)
    parser.add_argument("--serve-llm", type=int, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.serve_api:
        return serve_api(opts.serve_api, opts.trace)
    if opts.serve_llm:
        return serve_llm(opts.serve_llm, opts.tool_steps)
    llm_port = free_port()
    llm = spawn([__file__, "--serve-llm", str(llm_port), "--tool-steps", str(opts.tool_steps)])
    arms: list[Arm] = []
    try:
        wait_http(f"http://127.0.0.1:{llm_port}/", llm)
        for name in opts.arms.split(","):
            arms.append(start_arm(name, f"http://127.0.0.1:{llm_port}/v1", opts))
        results = asyncio.run(_drive_all(arms, opts))
        report(results, opts)
    finally:
        for arm in arms:
            arm.stop()
        llm.terminate()
        llm.wait(timeout=10)


async def _drive_all(arms: list[Arm], opts: argparse.Namespace) -> dict[str, dict]:
    """The arms side by side (the same load on the machine for each)."""
    done = await asyncio.gather(*(drive(arm, opts) for arm in arms))
    return {arm.name: result for arm, result in zip(arms, done, strict=True)}


if __name__ == "__main__":
    main()
