"""Serving overhead: a 3-tool-step ReAct run through arloop vs the same graph bare, in one run.

arloop = the runtime: thread record and canary arm, memory recall, the graph with the Redis
checkpointer, the trajectory built and XADDed. bare = the same compiled graph with no
checkpointer, no thread record, no memory and no sink. Both call the same scripted
OpenAI-compatible endpoint (its own process) through litellm, and run interleaved so noise
hits both alike. Also shown: the same run through the HTTP API (uvicorn in its own process).
Target: arloop adds at most 5 ms at p50 per run.

    .venv/bin/python bench/bench_serving.py [--runs 150]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.fakes (the scripted endpoint)
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx
import redis.asyncio as aioredis

from agents.packs import tutor
from agents.policy_client import PolicyClient, PolicyConfig
from agents.react import build_react, run_input
from agents.run_context import RunContext
from agents.runtime import AgentRuntime
from deploy.embedded_redis import free_port, start_redis
from tools.registry import ToolRegistry

QUESTION = "What is 2+3, checked three times?"
TOOL_STEPS = 3


def spawn(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        args,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} died: {proc.stderr.read().decode()[-2000:]}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def bench(llm_url: str, redis_url: str, api_url: str, runs: int, warmup: int) -> dict:
    # the tutor's tools and prompt, a budget for the 3 tool steps, no worked example or scrubber
    # (the bare graph has neither; the API arm below runs the pack's agent as deployed)
    spec = replace(tutor(), max_steps=6, examples=(), input_filter=None)
    policy = PolicyConfig(model="openai/arloop", api_base=llm_url, api_key="k", retries=0)
    client = aioredis.from_url(redis_url)
    runtime = AgentRuntime.on_redis(client, [spec], policy)
    bare_graph, registry = build_react(), ToolRegistry(spec.tools)
    bare_policy = PolicyClient(policy)
    http = httpx.AsyncClient(
        base_url=api_url, headers={"Authorization": "Bearer bench-key"}, timeout=120
    )  # the first call imports litellm over there

    async def arloop_run() -> None:
        event = await runtime.run(spec.name, QUESTION, "bench-user")
        assert len(event.tool_steps) == TOOL_STEPS, event.output

    async def bare_run() -> None:
        ctx = RunContext(
            policy=bare_policy,
            tools=registry,
            system_prompt=spec.system_prompt,
            user_id="bench-user",
            arm="champion",
            max_steps=spec.max_steps,
        )
        await bare_graph.ainvoke(run_input(QUESTION, spec.max_steps), context=ctx)
        assert sum(1 for s in ctx.steps if s.kind == "tool") == TOOL_STEPS

    async def api_run() -> None:
        reply = await http.post(
            "/v1/agents/tutor/runs", json={"input": QUESTION, "user_id": "bench-user"}
        )
        assert reply.status_code == 200, reply.text

    arms = {"bare": bare_run, "arloop": arloop_run, "api": api_run}
    times: dict[str, list[float]] = {name: [] for name in arms}
    cpu: dict[str, float] = dict.fromkeys(arms, 0.0)
    for i in range(warmup + runs):
        for name, run in arms.items():  # interleaved: the same noise for every arm
            start, start_cpu = time.perf_counter(), time.process_time()
            await run()
            if i >= warmup:
                times[name].append((time.perf_counter() - start) * 1000)
                cpu[name] += (time.process_time() - start_cpu) * 1000 / runs
    await http.aclose()
    await client.aclose()
    return times, cpu


def report(times: dict[str, list[float]], cpu: dict[str, float]) -> None:
    print(
        f"{'arm':<8}{'p50 ms':>10}{'p95 ms':>10}{'mean ms':>10}   "
        f"({len(times['bare'])} runs each, {TOOL_STEPS} tool steps = 4 model calls per run)"
    )
    for name, values in times.items():
        print(
            f"{name:<8}{percentile(values, 0.5):>10.2f}{percentile(values, 0.95):>10.2f}"
            f"{statistics.fmean(values):>10.2f}"
        )
    bare50, arloop50 = percentile(times["bare"], 0.5), percentile(times["arloop"], 0.5)
    paired = [a - b for a, b in zip(times["arloop"], times["bare"], strict=True)]
    print(
        f"arloop / bare at p50: {arloop50 / bare50:.3f}x; "
        f"added at p50: {arloop50 - bare50:+.2f} ms"
        f" (median of paired differences {statistics.median(paired):+.2f} ms; target <= 5 ms)"
    )
    print(
        f"CPU of this process per run: bare {cpu['bare']:.2f} ms, arloop {cpu['arloop']:.2f} ms "
        f"({cpu['arloop'] - cpu['bare']:+.2f} ms; less sensitive to other load than wall time)"
    )
    api50 = percentile(times["api"], 0.5)
    print(
        f"through the HTTP API (the tutor as deployed: at most 3 model calls, so 2 tool steps): "
        f"p50 {api50:.2f} ms, {api50 - bare50:+.2f} ms over bare"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=15)
    opts = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="arloop-bench-"))
    redis_server = start_redis(tmp / "redis")
    llm_port, api_port = free_port(), free_port()
    llm = spawn(
        [
            sys.executable,
            "-m",
            "tests.fakes.scripted_llm",
            "--port",
            str(llm_port),
            "--tool",
            "calculator",
            "--tool-steps",
            str(TOOL_STEPS),
        ]
    )
    llm_url = f"http://127.0.0.1:{llm_port}/v1"
    api = spawn(
        [sys.executable, "-c", "from deploy.agent_api.app import serve; serve()"],
        {
            "ARLOOP_REDIS_URL": redis_server.url,
            "ARLOOP_AGENTS_PORT": str(api_port),
            "ARLOOP_POLICY_API_BASE": llm_url,
            "ARLOOP_POLICY_RETRIES": "0",
            "ARLOOP_PACKS": '["tutoring"]',
            "ARLOOP_SCRUB_PHI": "false",
            "ARLOOP_API_KEYS": '["bench-key"]',
            "ARLOOP_RUN_RATE_PER_MINUTE": "1000000",
            "ARLOOP_LOG_LEVEL": "WARNING",
        },
    )
    try:
        wait_http(f"http://127.0.0.1:{llm_port}/", llm)
        wait_http(f"http://127.0.0.1:{api_port}/healthz", api)
        print(
            f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}; "
            "scrubber off in both arms; durability=exit"
        )
        times, cpu = asyncio.run(
            bench(llm_url, redis_server.url, f"http://127.0.0.1:{api_port}", opts.runs, opts.warmup)
        )
        report(times, cpu)
    finally:
        for proc in (api, llm):
            proc.terminate()
            proc.wait(timeout=10)
        redis_server.stop()


if __name__ == "__main__":
    main()
