"""Policy server throughput vs in-process `model.generate`, and publish-to-first-response time.

    .venv/bin/python bench/bench_policy_server.py [--max-tokens 48] [--threads 2]

Same model (SmolLM2-135M-Instruct, CPU, fp32), same prompts, greedy, same max_tokens, same
torch threads. The server runs as its own process (`python -m deploy.policy_server.app`, i.e.
`serve()`) on an embedded Redis in a temp dir; the peer runs in this process while the
server idles. Targets: one client >= 0.9x the peer; 8 clients' aggregate > one client.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import httpx
import redis
import torch

from deploy.embedded_redis import free_port, start_redis
from deploy.settings import ModelSettings
from learner.policy.chat_format import prompt_token_ids
from learner.policy.models import load_base
from learner.policy.registry import CHAMPION, PolicyRegistry, PolicyVersion

MODEL_CACHE = ModelSettings().model_cache  # ARLOOP_MODEL_CACHE, as the processes read it

QUESTIONS = [
    "Explain photosynthesis to a ten-year-old.",
    "Write a short story about a lighthouse keeper.",
    "What are three tips for learning a new language?",
    "Describe how a bicycle works.",
    "Why is the sky blue? Answer in detail.",
    "List some healthy breakfast ideas and explain each.",
    "How do vaccines train the immune system?",
    "Give advice to someone starting their first job.",
]


def peer_generate(model, tok, max_tokens: int) -> tuple[float, int, list[list[int]]]:
    """(seconds, generated tokens, outputs) of sequential greedy `model.generate`."""
    outputs, started = [], time.perf_counter()
    for q in QUESTIONS:
        ids = torch.tensor([prompt_token_ids(tok, [{"role": "user", "content": q}])])
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_tokens,
                pad_token_id=tok.pad_token_id,
            )
        new = out[0, ids.shape[1] :].tolist()
        outputs.append(new[: new.index(tok.eos_token_id) + 1] if tok.eos_token_id in new else new)
    return time.perf_counter() - started, sum(map(len, outputs)), outputs


def ask(http: httpx.Client, base: str, question: str, max_tokens: int, model="arloop") -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
    }
    r = http.post(f"{base}/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()


def server_run(base: str, max_tokens: int, clients: int) -> tuple[float, int, list[list[int]]]:
    """(seconds, generated tokens, outputs): every question once, spread over `clients` threads."""

    def one(q: str) -> list[int]:
        with httpx.Client() as http:
            return ask(http, base, q, max_tokens)["choices"][0]["token_ids"]

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        outputs = list(pool.map(one, QUESTIONS))
    return time.perf_counter() - started, sum(map(len, outputs)), outputs


def start_server(
    redis_url: str, data_dir: Path, threads: int | None
) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {
        **os.environ,
        "ARLOOP_REDIS_URL": redis_url,
        "ARLOOP_BASE_MODEL": "smollm2",
        "ARLOOP_PORT": str(port),
        "ARLOOP_DATA_DIR": str(data_dir),
        "ARLOOP_LOG_LEVEL": "WARNING",
        "ARLOOP_RELOAD_POLL_S": "5",
        "ARLOOP_MAX_BATCH_SIZE": "8",
    }
    if threads:
        env["ARLOOP_THREADS"] = str(threads)
    with open(data_dir / "server.log", "wb") as log:  # the child keeps its own handle
        proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.policy_server.app"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    root = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        if proc.poll() is not None:
            raise RuntimeError((data_dir / "server.log").read_text()[-2000:])
        try:
            if httpx.get(f"{root}/healthz", timeout=1).status_code == 200:
                return proc, f"{root}/v1"
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("policy server did not start in 120 s")


def make_checkpoint(kind: str, folder: Path) -> None:
    """A small perturbation of SmolLM2: a LoRA adapter or a full checkpoint."""
    model, tok = load_base("smollm2", cache_dir=MODEL_CACHE)
    if kind == "lora":
        from peft import LoraConfig, get_peft_model

        peft_model = get_peft_model(
            model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        )
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.mul_(0.01)
        peft_model.save_pretrained(folder)
        return
    with torch.no_grad():
        model.model.norm.weight.mul_(1.01)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


def publish_to_first_response(
    registry: PolicyRegistry, base: str, kind: str, folder: Path
) -> float:
    """Seconds from the champion move to the first response the new version produced."""
    version = registry.next_version()
    registry.publish(
        PolicyVersion(
            version=version,
            parent="v0",
            base_model="smollm2",
            checkpoint_uri=folder.resolve().as_uri(),
            checkpoint_kind=kind,
        )
    )
    started = time.perf_counter()
    registry.promote(
        version, expect=registry.aliases().get(CHAMPION), reason="bench", actor="bench"
    )
    with httpx.Client() as http:
        while ask(http, base, "hi", 1)["system_fingerprint"] != version:
            if time.perf_counter() - started > 300:
                raise RuntimeError(f"{version} never served")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=None, help="torch threads, both sides")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="arloop-bench-"))
    redis_proc = start_redis(work / "redis")
    model, tok = load_base("smollm2", cache_dir=MODEL_CACHE)
    print(
        f"SmolLM2-135M-Instruct, CPU fp32, torch threads {torch.get_num_threads()}, "
        f"{len(QUESTIONS)} prompts, greedy, max_tokens {args.max_tokens}"
    )
    peer_generate(model, tok, 4)  # warm-up
    rows = {"generate (peer)": peer_generate(model, tok, args.max_tokens)}
    server, base = start_server(redis_proc.url, work, args.threads)
    try:
        server_run(base, 4, 1)  # warm-up
        rows["server, 1 client"] = server_run(base, args.max_tokens, 1)
        rows["server, 8 clients"] = server_run(base, args.max_tokens, 8)
        rows["generate (peer, again)"] = peer_generate(model, tok, args.max_tokens)
        del model
        registry = PolicyRegistry(redis.Redis.from_url(redis_proc.url))
        swaps = {}
        for kind in ("lora", "full"):
            make_checkpoint(kind, work / kind)
            swaps[kind] = publish_to_first_response(registry, base, kind, work / kind)
    finally:
        server.terminate()
        server.wait(timeout=30)
        redis_proc.stop()
    report(rows, swaps)


def report(rows: dict, swaps: dict) -> None:
    peer = min(rows["generate (peer)"][0], rows["generate (peer, again)"][0])
    peer_tps = rows["generate (peer)"][1] / peer
    print(f"\n{'run':<24}{'seconds':>9}{'tokens':>8}{'tok/s':>8}{'vs peer':>9}")
    for name, (secs, tokens, _) in rows.items():
        tps = tokens / secs
        print(f"{name:<24}{secs:>9.1f}{tokens:>8}{tps:>8.1f}{tps / peer_tps:>8.2f}x")
    one = rows["server, 1 client"][1] / rows["server, 1 client"][0]
    eight = rows["server, 8 clients"][1] / rows["server, 8 clients"][0]
    same = sum(
        a == b for a, b in zip(rows["generate (peer)"][2], rows["server, 1 client"][2], strict=True)
    )
    print(f"\none client vs peer (best of two peer runs): {one / peer_tps:.2f}x  (target >= 0.90)")
    print(f"8 clients vs 1 client aggregate:            {eight / one:.2f}x  (target > 1)")
    print(f"greedy outputs identical to generate:       {same}/{len(QUESTIONS)}")
    for kind, secs in swaps.items():
        print(f"publish -> first response ({kind:>4}):        {secs:.2f} s")


if __name__ == "__main__":
    main()
