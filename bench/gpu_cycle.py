"""The vLLM half of bench/gpu_check.sh (one NVIDIA GPU): publish -> load -> route -> generate,
and vLLM against arloop's embedded policy server on the same version.

Expects, already running: a Redis holding a registry with at least one LoRA version (the
learner round of gpu_check.sh), `vllm serve <SmolLM2 HF folder> --enable-lora` with
VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, `arloop serve vllm-sync` on that vLLM, and
`arloop serve policy` on CUDA (transformers engine). Then:

1. publish: the newest LoRA version's checkpoint is copied as a new version and promoted to
   champion; the clock runs from the promote until the agents' client (litellm,
   `hosted_vllm/<adapter>` resolved through the sync's routes) gets a response that the new
   version produced: publish-to-first-response.
2. tokens/s: the same requests (prompts, seeds, max tokens) to vLLM and to the embedded server,
   through the agents' policy client, at concurrency 1 and --concurrency; completion tokens
   (as returned) over wall seconds, best of --rounds, alternating servers.
3. the logprob gap: vLLM's logprobs of its own sampled tokens against the learner's fp32
   recomputation with the version's weights (what `behaviour/engine_gap` reports in training).

Usage: python bench/gpu_cycle.py --redis-url URL --vllm-url http://127.0.0.1:8100
       --policy-url http://127.0.0.1:8001/v1 [--route arloop] [--requests 32] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import time
from pathlib import Path

import redis
import redis.asyncio as aioredis

from agents.adapter_routes import AdapterRoutes, RoutedPolicyClient
from agents.policy_client import Generation, PolicyClient, PolicyConfig, warm_up
from learner.policy.models import checkpoint_path
from learner.policy.registry import CHAMPION, PolicyRegistry, PolicyVersion

PROMPTS = [
    "A baker has 47 cakes and sells 38. How many cakes are left?",
    "Tom reads 12 pages a day for 9 days. How many pages does he read?",
    "84 apples are shared equally by 7 children. How many does each child get?",
    "A bus has 26 people; 19 more get on. How many people are on the bus?",
]


def messages(i: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a maths tutor. Answer step by step."},
        {"role": "user", "content": PROMPTS[i % len(PROMPTS)]},
    ]


def newest_lora(registry: PolicyRegistry) -> PolicyVersion:
    loras = [v for v in registry.versions() if v.checkpoint_kind == "lora"]
    if not loras:
        raise SystemExit("no LoRA version in the registry: did the learner round publish one?")
    return loras[-1]


def publish_copy(registry: PolicyRegistry, source: PolicyVersion) -> str:
    """A new version with the files of `source` (a new adapter name for vLLM), not promoted."""
    version = registry.next_version()
    folder = checkpoint_path(source.checkpoint_uri)
    target = folder.parent / f"{version}-gpu-check"
    shutil.copytree(folder, target)
    record = PolicyVersion(version, source.version, source.base_model, target.as_uri(), "lora")
    registry.publish(record)
    return version


async def first_response_s(registry: PolicyRegistry, routed: RoutedPolicyClient, version: str):
    """Seconds from the promote of `version` to the first agent call it answers."""
    short = Generation(max_tokens=4)
    await routed.complete(messages(0), arm=CHAMPION, sampling=short)  # litellm's first call
    expect = registry.aliases().get(CHAMPION)
    started = time.perf_counter()
    registry.promote(version, expect=expect, reason="gpu check", actor="gpu_check")
    while time.perf_counter() - started < 180:
        try:
            step = await routed.complete(messages(0), arm=CHAMPION, sampling=short)
        except Exception:  # the route may name an adapter mid-swap: try again
            step = None
        if step is not None and step.policy_version == version:
            return time.perf_counter() - started, step.model
        await asyncio.sleep(0.05)
    raise SystemExit(f"{version} never answered within 180 s: see `arloop serve vllm-sync --check`")


async def throughput(client: PolicyClient, n: int, concurrency: int, max_tokens: int):
    """(completion tokens per second, steps) for n requests, `concurrency` in flight."""
    gate = asyncio.Semaphore(concurrency)
    sampling = Generation(temperature=1.0, max_tokens=max_tokens)

    async def one(i: int):
        async with gate:
            return await client.complete(messages(i), arm=CHAMPION, sampling=sampling)

    started = time.perf_counter()
    steps = await asyncio.gather(*(one(i) for i in range(n)))
    seconds = time.perf_counter() - started
    tokens = sum(len(s.completion_token_ids or []) for s in steps)
    return tokens / seconds, steps


def logprob_gap(steps, record: PolicyVersion, cache_dir: Path, device: str) -> tuple[float, int]:
    """Mean |served - learner's fp32| logprob per token over the steps, and the token count."""
    import torch

    from learner.logprobs import completion_logprobs
    from learner.policy.models import load_version

    model, tokenizer = load_version(record, cache_dir=cache_dir, device=device)
    diffs = []
    for step in steps:
        if not (step.prompt_token_ids and step.completion_token_ids and step.logprobs):
            continue
        ours = completion_logprobs(
            model, step.prompt_token_ids, step.completion_token_ids, tokenizer.pad_token_id
        )
        served = torch.tensor(step.logprobs, device=ours.device)
        diffs += (served - ours).abs().tolist()
    return (statistics.fmean(diffs) if diffs else float("nan")), len(diffs)


async def main_async(args: argparse.Namespace) -> None:
    sync_client = redis.Redis.from_url(args.redis_url)
    registry = PolicyRegistry(sync_client)
    routes_client = aioredis.from_url(args.redis_url)
    vllm_config = PolicyConfig(
        model=f"hosted_vllm/{args.route}",
        api_base=args.vllm_url.rstrip("/") + "/v1",
        api_key="none",
        timeout_s=120,
        retries=0,
    )
    routed = RoutedPolicyClient(vllm_config, AdapterRoutes(routes_client, args.route, ttl_s=0))
    embedded = PolicyClient(
        PolicyConfig(model="openai/arloop", api_base=args.policy_url, api_key="none", timeout_s=120)
    )
    source = newest_lora(registry)
    version = publish_copy(registry, source)
    warm_up()  # litellm's import (seconds) is not part of publish-to-first-response
    seconds, model = await first_response_s(registry, routed, version)
    print(f"publish -> first response through vLLM: {seconds:.2f} s ({version} as {model})")
    while (await embedded.complete(messages(0), arm=CHAMPION)).policy_version != version:
        await asyncio.sleep(0.5)  # the embedded server hot-reloads the same champion
    best: dict[tuple[str, int], float] = {}
    vllm_steps = []
    for _ in range(args.rounds):
        for concurrency in (1, args.concurrency):
            n = args.requests if concurrency > 1 else max(4, args.requests // 8)
            for name, client in (("vllm", routed), ("embedded", embedded)):
                rate, steps = await throughput(client, n, concurrency, args.max_tokens)
                best[name, concurrency] = max(best.get((name, concurrency), 0.0), rate)
                vllm_steps += steps if name == "vllm" else []
    for concurrency in (1, args.concurrency):
        v, e = best["vllm", concurrency], best["embedded", concurrency]
        print(
            f"completion tokens/s at concurrency {concurrency:>2}: vLLM {v:8.1f}  "
            f"embedded (transformers) {e:8.1f}  ratio {v / e:5.2f}x"
        )
    record = registry.get(version)
    try:
        gap, tokens = logprob_gap(vllm_steps[:64], record, args.model_cache, args.device)
        print(f"vLLM logprob gap vs the learner's fp32: {gap:.4f} per token over {tokens} tokens")
    except (RuntimeError, IndexError, ValueError) as exc:  # figures above stay printed
        print(f"vLLM logprob gap not measured: {type(exc).__name__}: {exc}")
    await routes_client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument(
        "--vllm-url", required=True, help="vLLM's server, e.g. http://127.0.0.1:8100"
    )
    parser.add_argument("--policy-url", required=True, help="the embedded server's /v1 URL")
    parser.add_argument("--route", default="arloop", help="ARLOOP_VLLM_ROUTE_NAME of the sync")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model-cache", type=Path, default=Path.home() / ".cache" / "arloop")
    parser.add_argument("--device", default="cuda", help="where the learner's recomputation runs")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
